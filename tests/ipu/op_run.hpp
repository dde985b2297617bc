// The op-library tests' harness: builds a graph on the tiny IPU, runs it with 1 and 2 engine
// threads requiring bitwise identical outputs, inputs laid out awkwardly over tiles, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ipu_process/engine.hpp"
#include "tests/ipu/device_data.hpp"

namespace ipupod::ipu {

using Floats = std::vector<float>;

// Builds a graph on the tiny IPU, writes the inputs (int32 inputs from int_values, the others
// from input_values, each in order), runs once and reads the outputs' bytes into Floats (int32
// outputs are read back with ints()), for a given number of engine threads.
struct OpRun {
  std::function<void(Graph&, Program&, std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>
      build;
  std::vector<Floats> input_values;
  std::vector<std::vector<std::int32_t>> int_values;

  std::vector<Floats> run(unsigned threads) const {
    Graph g(ArchPreset::get("tiny"));
    Program p;
    std::vector<Tensor> inputs, outputs;
    build(g, p, inputs, outputs);
    for (const Tensor& t : inputs) g.set_host_access(t);
    for (const Tensor& t : outputs) g.set_host_access(t);
    Engine e(g, {{"p", p}}, {.threads = threads});
    std::size_t next_float = 0, next_int = 0;
    for (const Tensor& t : inputs) {
      if (t.dtype() == DType::i32)
        e.write(t, std::as_bytes(std::span(int_values.at(next_int++))));
      else
        e.write(t, std::as_bytes(std::span(input_values.at(next_float++))));
    }
    e.run("p");
    EXPECT_GT(e.cycles().compute, 0u);
    std::vector<Floats> out;
    for (const Tensor& t : outputs) {
      const auto bytes = e.read(t);
      Floats v(bytes.size() / sizeof(float));
      std::memcpy(v.data(), bytes.data(), bytes.size());
      out.push_back(std::move(v));
    }
    return out;
  }
  // Runs with 1 and 2 threads, requires identical bits, returns the outputs.
  std::vector<Floats> run_checked() const {
    const auto one = run(1), two = run(2);
    EXPECT_EQ(one.size(), two.size());
    for (std::size_t i = 0; i < one.size() && i < two.size(); ++i)
      EXPECT_EQ(0, std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(float)))
          << "output " << i << " differs between 1 and 2 engine threads";
    return one;
  }
};

inline std::vector<std::int32_t> ints(const Floats& raw) {
  std::vector<std::int32_t> v(raw.size());
  std::memcpy(v.data(), raw.data(), raw.size() * sizeof(float));
  return v;
}

inline void expect_near_all(const Floats& got, const std::vector<double>& want, double tol,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

inline std::size_t product(const std::vector<std::size_t>& s) {
  std::size_t p = 1;
  for (auto d : s) p *= d;
  return p;
}

// A variable spread over the tiles: grain, first tile and tile count pick awkward layouts.
struct Layout {
  std::size_t grain = 1;
  unsigned first_tile = 0, tile_count = 0;
};

inline Tensor input(Graph& g, std::vector<std::size_t> shape, const std::string& name, Layout l) {
  Tensor t = g.add_variable(DType::f32, std::move(shape), name);
  g.map_linearly(t, l.grain, l.first_tile, l.tile_count);
  return t;
}

}  // namespace ipupod::ipu
