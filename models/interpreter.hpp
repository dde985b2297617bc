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

// Deterministic initial value of a parameter: uniform in [-bound, bound] from a counter-based
// generator keyed by (seed, parameter index), so every process computes the same weights.
Buffer initial_parameter(const Graph& graph, ValueId param, std::uint64_t seed);

class Interpreter {
 public:
  explicit Interpreter(const Graph& graph, std::uint64_t seed = 0);
  void set(ValueId id, Buffer buffer);   // inputs (and parameters, to override)
  const Buffer& get(ValueId id) const;
  // Runs every op whose phase is in `phases`, in graph order.
  void run(std::vector<Phase> phases = {Phase::forward, Phase::backward, Phase::optimizer});

 private:
  const Graph& graph_;
  std::map<ValueId, Buffer> values_;
};

}  // namespace ipupod::models
