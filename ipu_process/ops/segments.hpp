// Statistics over sets of a tensor's elements (softmax rows, normalisation groups, batch-norm
// channels), computed where the data lives: partials per worker piece, a reduction compute set.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ipu_process/codelets.hpp"
#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// How the elements of a flat tensor fall into sets: contiguous runs of `run` elements; run r
// belongs to set r % modulo, or to set r when modulo is 0.
struct SetLayout {
  std::size_t sets = 0;
  std::size_t count = 0;  // elements per set
  std::size_t run = 1;
  std::size_t modulo = 0;
  // `sets` rows of `length` contiguous elements (softmax, layer and group normalisation).
  static SetLayout rows(std::size_t sets, std::size_t length);
  // x [n, c, spatial...]: one set per channel, strided over samples (batch normalisation).
  static SetLayout channels(std::size_t n, std::size_t c, std::size_t spatial);
  std::size_t set_of(std::size_t element) const;
};

// What the reduction does with the combined partials of a set.
enum class SetCombine : std::uint8_t { sum, max };
enum class SetFinish : std::uint8_t {
  scale,  // out = scale * combined
  rsqrt   // out = 1 / sqrt(scale * combined + eps)
};

// A piece of x on one tile, handled by one worker, and the window [lo, hi) of sets it touches.
struct SetPiece {
  unsigned tile = 0;
  std::size_t begin = 0, end = 0;  // elements of x
  std::size_t lo = 0, hi = 0;
};

// The plan for one tensor: worker pieces, the tile that reduces each set, and the programs
// that compute statistics and apply them. Vertices of the partial and apply passes receive the
// parameters [first element, run, modulo, lo] followed by their own (see for_each_set_run).
class SetPlan {
 public:
  SetPlan(Graph& graph, const Tensor& x, SetLayout layout, std::string name);
  const SetLayout& layout() const { return layout_; }
  const std::vector<SetPiece>& pieces() const { return pieces_; }

  // Per piece, `codelet` reads `operands` (laid out like x, sliced to the piece) and the windows
  // of `stats` (each [sets * k_i], copied to the piece's tile), and writes k partials per set of
  // its window into its last field; a reduction compute set then combines them in a fixed
  // order and finishes them. Returns the statistics, [sets * k].
  Tensor reduce(Program& prog, const std::string& codelet, std::size_t k,
                const std::vector<Tensor>& operands, const std::vector<Tensor>& stats,
                const std::vector<std::size_t>& stats_k, SetCombine combine, SetFinish finish,
                double scale, double eps, const std::string& name,
                const std::vector<double>& extra_params = {});
  // Per piece, `codelet` reads the operands and stats windows and writes its slice of out
  // (laid out like x).
  void apply(Program& prog, const std::string& codelet, const std::vector<Tensor>& operands,
             const std::vector<Tensor>& stats, const std::vector<std::size_t>& stats_k,
             const Tensor& out, const std::string& name,
             const std::vector<double>& extra_params = {});

 private:
  // Copies each piece's window of every stats tensor onto its tile (one exchange).
  std::vector<std::vector<Tensor>> windows(Program& prog, const std::vector<Tensor>& stats,
                                           const std::vector<std::size_t>& stats_k,
                                           const std::string& name);
  std::vector<double> piece_params(const SetPiece& p, const std::vector<double>& extra) const;
  // Adds the pieces' vertices to cs: piece i connects the operands sliced to it, its windows
  // wins[i] and last_field[i].
  void add_piece_vertices(ComputeSetId cs, const std::string& codelet,
                          const std::vector<Tensor>& operands,
                          const std::vector<std::vector<Tensor>>& wins,
                          const std::vector<Tensor>& last_field,
                          const std::vector<double>& extra_params);

  Graph& graph_;
  Tensor x_;
  SetLayout layout_;
  std::string name_;
  std::vector<SetPiece> pieces_;
  struct ReducerRun {
    unsigned tile;
    std::size_t a, b;  // sets
  };
  std::vector<ReducerRun> reducers_;
};

// A partial or apply codelet as SetPlan connects it: one vertex per tile, a worker slice per
// piece, whose every field is sliced, with the piece's first element and window as slice
// parameters (see Vertex::slices).
inline Codelet set_piece_codelet(Codelet codelet) {
  codelet.sliced = codelet.fields;
  codelet.slice_params = {0, 3};
  return codelet;
}

// Inside a partial or apply codelet: walks the piece's n elements in stretches that stay in
// one set, calling fn(w, i0, i1) with w the set's index in the piece's window.
template <class Fn>
void for_each_set_run(const VertexContext& c, std::size_t n, Fn&& fn) {
  const std::size_t first = c.size_param(0), run = c.size_param(1), modulo = c.size_param(2),
                    lo = c.size_param(3);
  std::size_t i = 0;
  while (i < n) {
    const std::size_t e = first + i, r = e / run;
    const std::size_t stop = std::min(n, (r + 1) * run - first);
    fn((modulo ? r % modulo : r) - lo, i, stop);
    i = stop;
  }
}

}  // namespace ipupod::ipu::ops
