// A user's program on the installed library: a float32 matmul on one emulated IPU, checked
// against a plain loop, and the predicted cycles it took. Exit 0 when they agree.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/matmul.hpp"

int main() {
  using namespace ipupod;
  const ipu::ArchPreset& arch = ipu::ArchPreset::get("tiny");
  const std::size_t m = 12, k = 20, n = 8;
  ipu::Graph g(arch);
  ipu::Tensor a = g.add_variable(ipu::DType::f32, {m, k}, "a");
  ipu::Tensor b = g.add_variable(ipu::DType::f32, {k, n}, "b");
  g.map_linearly(a);
  g.map_linearly(b);
  ipu::Program program;
  ipu::Tensor c = ipu::ops::matmul(g, program, a, b, false, false, "c");
  g.set_host_access(a);
  g.set_host_access(b);
  g.set_host_access(c);
  ipu::Engine engine(g, {{"matmul", program}}, {});
  std::vector<float> av(m * k), bv(k * n);
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = static_cast<float>(i % 7) - 3.f;
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<float>(i % 5) * 0.5f;
  engine.write(a, std::as_bytes(std::span(av)));
  engine.write(b, std::as_bytes(std::span(bv)));
  engine.run("matmul");
  const auto bytes = engine.read(c);
  std::vector<float> cv(m * n);
  std::memcpy(cv.data(), bytes.data(), bytes.size());
  double worst = 0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::size_t p = 0; p < k; ++p) want += double(av[i * k + p]) * bv[p * n + j];
      worst = std::max(worst, std::abs(want - cv[i * n + j]));
    }
  std::printf("consumer: [%zu,%zu] x [%zu,%zu] on %s, largest error %g, %llu cycles\n", m, k, k, n,
              arch.name.c_str(), worst, static_cast<unsigned long long>(engine.cycles().compute));
  return worst < 1e-4 ? 0 : 1;
}
