// The reference interpreter: runs any IR graph on plain CPU buffers, deterministically.
// It is the numerical truth the pod's compiled programs are checked against.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "models/ir.hpp"

namespace ipupod::models {

struct Buffer {
  TensorInfo info;
  std::vector<float> f;         // float32 data
  std::vector<std::int32_t> i;  // int32 data
  static Buffer zeros(const TensorInfo& info);
};

// Deterministic initial value of a parameter or state value from a counter-based generator keyed
// by (seed, value id), so every process computes the same weights: uniform in [-bound, bound]
// (the default), a fill, a normal(0, std) or a scaled identity, as the op's "init" attr says.
Buffer initial_parameter(const Graph& graph, ValueId param, std::uint64_t seed);

class Interpreter {
 public:
  // Parameters and state values start from initial_parameter(graph, id, seed).
  explicit Interpreter(const Graph& graph, std::uint64_t seed = 0);
  void set(ValueId id, Buffer buffer);  // inputs (and parameters, to override)
  const Buffer& get(ValueId id) const;
  // Runs every op whose phase is in `phases`, in graph order. Random masks draw anew on every
  // run (keyed by the op's seed and how often it ran), so runs are reproducible.
  void run(std::vector<Phase> phases = {Phase::forward, Phase::backward, Phase::optimizer});

 private:
  void run_op(std::size_t index, const Op& op);

  const Graph& graph_;
  std::map<ValueId, Buffer> values_;
  std::map<std::size_t, std::uint64_t> invocations_;  // per random op: draws so far
};

}  // namespace ipupod::models
