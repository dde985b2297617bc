// `ipupod bench matmul`: one float32 GEMM on an emulated IPU (compiled once, run N times on the
// engine's thread pool) against OpenBLAS cblas_sgemm on the same threads in the same process,
// and the compile time (graph build + Engine construction) of ResNet-50's matmul layers.
// OpenBLAS is loaded here, when the benchmark runs, not linked: it starts idle threads in every
// process that loads it, and the `ipupod` of a training rank has no use for them.
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ipu_process/engine.hpp"
#include "ipu_process/ops/matmul.hpp"
#include "pod/cli/bench.hpp"

namespace ipupod::pod {
namespace {

using Clock = std::chrono::steady_clock;

// The OpenBLAS functions the peer needs, from the library loaded at run time.
struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_corename) corename = nullptr;
};

OpenBlas load_openblas() {
  void* library = nullptr;
  for (const char* name : {"libopenblas.so.0", "libopenblas.so"})
    if ((library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (library == nullptr)
    throw std::invalid_argument(std::string("bench matmul: cannot load OpenBLAS, its peer (") +
                                dlerror() +
                                "); install Debian's libopenblas0 (scripts/install-deps.sh does)");
  const auto symbol = [&](const char* name) {
    void* f = dlsym(library, name);
    if (f == nullptr)
      throw std::invalid_argument(std::string("bench matmul: the OpenBLAS library loaded has no ") +
                                  name);
    return f;
  };
  // Kept loaded for the life of the process (its threads outlive any one call).
  return {reinterpret_cast<decltype(&cblas_sgemm)>(symbol("cblas_sgemm")),
          reinterpret_cast<decltype(&openblas_set_num_threads)>(symbol("openblas_set_num_threads")),
          reinterpret_cast<decltype(&openblas_get_corename)>(symbol("openblas_get_corename"))};
}

struct MatMulBenchOptions {
  std::size_t m = 1024, k = 1024, n = 1024;
  std::string arch = "mk2";
  unsigned threads = 0;  // 0: the host's hardware threads
  std::size_t runs = 7;
  std::size_t batch = 1;  // samples of the ResNet-50 compile graph
  bool compile = true;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// One GEMM shape of a network layer: [m, k] x [k, n].
struct Layer {
  std::string name;
  std::size_t m, k, n;
};

// The 54 weight layers of ResNet-50 v1.5 (He et al. 2016; torchvision's layout, stride in the
// 3x3 convolution) on 224x224 images, each convolution as the GEMM of its im2col lowering:
// m = batch x output pixels, k = input channels x kernel area, n = output channels.
std::vector<Layer> resnet50_layers(std::size_t batch) {
  std::vector<Layer> layers;
  layers.push_back({"conv1", batch * 112 * 112, 3 * 7 * 7, 64});
  const std::size_t blocks[] = {3, 4, 6, 3};
  std::size_t in_channels = 64, side = 56;  // after the stem's max-pool
  for (std::size_t stage = 0; stage < 4; ++stage) {
    const std::size_t width = std::size_t{64} << stage, out_channels = 4 * width;
    for (std::size_t block = 0; block < blocks[stage]; ++block) {
      const std::string prefix =
          "layer" + std::to_string(stage + 1) + "." + std::to_string(block) + ".";
      const bool downsample = block == 0 && stage > 0;
      const std::size_t out_side = downsample ? side / 2 : side;
      layers.push_back({prefix + "conv1", batch * side * side, in_channels, width});
      layers.push_back({prefix + "conv2", batch * out_side * out_side, width * 9, width});
      layers.push_back({prefix + "conv3", batch * out_side * out_side, width, out_channels});
      if (block == 0)
        layers.push_back(
            {prefix + "downsample", batch * out_side * out_side, in_channels, out_channels});
      in_channels = out_channels;
      side = out_side;
    }
  }
  layers.push_back({"fc", batch, 2048, 1000});
  return layers;
}

struct CompileFigures {
  std::size_t layers = 0, tiles_used = 0;
  double build_seconds = 0, engine_seconds = 0;
};

// Graph build (tensors, plans, vertices, exchanges) and Engine construction (checks, memory
// layout, exchange plans) of one program holding every layer's matmul in turn.
CompileFigures compile_layers(const ipu::ArchPreset& arch, const std::vector<Layer>& layers,
                              unsigned threads) {
  CompileFigures f;
  f.layers = layers.size();
  const auto start = Clock::now();
  ipu::Graph g(arch);
  ipu::Program program;
  for (const Layer& l : layers) {
    ipu::Tensor x = g.add_variable(ipu::DType::f32, {l.m, l.k}, l.name + "/in");
    ipu::Tensor w = g.add_variable(ipu::DType::f32, {l.k, l.n}, l.name + "/weight",
                                   ipu::MemoryCategory::weight);
    g.map_linearly(x);
    g.map_linearly(w);
    ipu::ops::matmul(g, program, x, w, false, false, l.name);
  }
  f.build_seconds = seconds_since(start);
  const auto engine_start = Clock::now();
  ipu::Engine engine(g, {{"layers", program}}, {.allow_out_of_memory = true, .threads = threads});
  f.engine_seconds = seconds_since(engine_start);
  for (const auto& t : engine.memory().tiles) f.tiles_used += t.total() > 0 ? 1 : 0;
  return f;
}

int run_matmul_bench(const MatMulBenchOptions& o) {
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(o.arch);
  const unsigned threads =
      o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const std::size_t m = o.m, k = o.k, n = o.n;
  const double flops = 2.0 * static_cast<double>(m) * k * n;
  std::cout << "GEMM [" << m << "," << k << "] x [" << k << "," << n << "] float32, " << o.runs
            << " runs each, medians; " << threads << " threads for both (engine threads = "
            << "OpenBLAS threads, openblas_set_num_threads)\n";

  // The emulator: operands spread over the tiles as a previous layer would leave them.
  const auto build_start = Clock::now();
  ipu::Graph g(arch);
  ipu::Tensor a = g.add_variable(ipu::DType::f32, {m, k}, "a");
  ipu::Tensor b = g.add_variable(ipu::DType::f32, {k, n}, "b", ipu::MemoryCategory::weight);
  g.map_linearly(a);
  g.map_linearly(b);
  ipu::Program program;
  ipu::Tensor c = ipu::ops::matmul(g, program, a, b, false, false, "c");
  g.set_host_access(a);
  g.set_host_access(c);
  const double build_seconds = seconds_since(build_start);
  const auto engine_start = Clock::now();
  ipu::Engine engine(g, {{"matmul", program}}, {.threads = threads});
  const double engine_seconds = seconds_since(engine_start);
  const auto plan = ipu::ops::plan_matmul(arch, m, k, n);
  const auto av = random_floats(m * k, 1), bv = random_floats(k * n, 2);
  engine.write(a, std::as_bytes(std::span(av)));
  engine.write(b, std::as_bytes(std::span(bv)));
  // The peer: the same GEMM through OpenBLAS, on the same number of threads.
  const OpenBlas blas_library = load_openblas();
  blas_library.set_num_threads(static_cast<int>(threads));
  std::vector<float> blas_c(m * n);
  const auto sgemm = [&] {
    blas_library.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                       static_cast<int>(n), static_cast<int>(k), 1.f, av.data(),
                       static_cast<int>(k), bv.data(), static_cast<int>(n), 0.f, blas_c.data(),
                       static_cast<int>(n));
  };
  // Warm-up of both (first touch of the tile arenas, OpenBLAS's buffers), then the two timed
  // in turn, so that both see the same load of a shared machine.
  engine.run("matmul");
  sgemm();
  const ipu::CycleBreakdown before = engine.cycles();
  std::vector<double> emulator, blas;
  for (std::size_t r = 0; r < o.runs; ++r) {
    auto start = Clock::now();
    engine.run("matmul");
    emulator.push_back(seconds_since(start));
    start = Clock::now();
    sgemm();
    blas.push_back(seconds_since(start));
  }
  const ipu::CycleBreakdown per_run_cycles = [&] {
    ipu::CycleBreakdown d = engine.cycles() - before;
    for (auto* f : {&d.compute, &d.exchange, &d.sync, &d.host, &d.fabric}) *f /= o.runs;
    return d;
  }();
  std::vector<float> cv(m * n);
  {
    const auto bytes = engine.read(c);
    std::memcpy(cv.data(), bytes.data(), bytes.size());
  }
  double max_difference = 0, max_value = 0;
  for (std::size_t i = 0; i < cv.size(); ++i) {
    max_difference = std::max(max_difference, static_cast<double>(std::abs(cv[i] - blas_c[i])));
    max_value = std::max(max_value, static_cast<double>(std::abs(blas_c[i])));
  }

  const double emu = median(emulator), peer = median(blas);
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "plan on " << arch.name << ": " << plan.row_blocks << " x " << plan.col_blocks
            << " output blocks x " << plan.k_splits << " inner splits = " << plan.tiles() << " of "
            << arch.tiles << " tiles";
  if (plan.k_serial > 1) std::cout << ", inner dimension in " << plan.k_serial << " serial passes";
  std::cout << "\n";
  std::cout << "emulator compile: graph " << 1e3 * build_seconds << " ms, engine "
            << 1e3 * engine_seconds << " ms\n";
  std::cout << "emulator (ipupod, " << arch.name << "): " << 1e3 * emu << " ms per run, "
            << flops / emu * 1e-9 << " GFLOP/s\n";
  std::string version = OPENBLAS_VERSION;  // " OpenBLAS 0.3.21 " in Debian's build
  version.erase(0, version.find_first_not_of(' '));
  version.erase(version.find_last_not_of(' ') + 1);
  std::cout << "peer (" << version << " cblas_sgemm, core " << blas_library.corename()
            << "): " << 1e3 * peer << " ms per run, " << flops / peer * 1e-9 << " GFLOP/s\n";
  std::cout << "ratio emulator / OpenBLAS: " << emu / peer << " (target <= 1.5)\n";
  std::cout << std::setprecision(1) << "predicted " << arch.name
            << " time per run: " << 1e6 * engine.seconds(per_run_cycles) << " us (compute "
            << 1e6 * static_cast<double>(per_run_cycles.compute) / arch.clock_hz << ", exchange "
            << 1e6 * static_cast<double>(per_run_cycles.exchange) / arch.clock_hz << ", sync "
            << 1e6 * static_cast<double>(per_run_cycles.sync) / arch.clock_hz << "), "
            << flops / engine.seconds(per_run_cycles) * 1e-12 << " TFLOP/s of "
            << arch.peak_fp32_flops() * 1e-12 << " peak FP32\n";
  std::cout << std::scientific << std::setprecision(2)
            << "largest |emulator - OpenBLAS| = " << max_difference << " (largest |c| " << max_value
            << ")\n";
  const bool agree = max_difference <= 1e-4 * (1 + max_value);
  if (!agree) std::cerr << "error: the emulator's result differs from OpenBLAS's\n";

  if (o.compile) {
    const auto layers = resnet50_layers(o.batch);
    const CompileFigures f = compile_layers(arch, layers, threads);
    std::cout << std::fixed << std::setprecision(2) << "compile of ResNet-50's " << f.layers
              << " weight layers as matmuls (batch " << o.batch << ", im2col GEMM shapes, one "
              << "program) on " << arch.name << ": graph " << f.build_seconds << " s + engine "
              << f.engine_seconds << " s = " << f.build_seconds + f.engine_seconds << " s\n";
  }
  return agree ? 0 : 1;
}

}  // namespace

void add_matmul_bench(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<MatMulBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "matmul", "A float32 GEMM on one emulated IPU vs OpenBLAS cblas_sgemm on the same threads");
  cmd->add_option("--m", o->m, "Rows of a and c")
      ->check(whole_number(1, kMaxBenchCount))
      ->capture_default_str();
  cmd->add_option("--k", o->k, "Inner dimension")
      ->check(whole_number(1, kMaxBenchCount))
      ->capture_default_str();
  cmd->add_option("--n", o->n, "Columns of b and c")
      ->check(whole_number(1, kMaxBenchCount))
      ->capture_default_str();
  cmd->add_option("--arch", o->arch, "IPU architecture preset or .json file")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Engine and OpenBLAS threads (0: the host's hardware threads)")
      ->check(whole_number(0, kMaxBenchThreads))
      ->capture_default_str();
  cmd->add_option("--runs", o->runs, "Timed runs of each; medians are reported")
      ->check(whole_number(1, kMaxBenchRounds))
      ->capture_default_str();
  cmd->add_option("--batch", o->batch, "Batch of the ResNet-50 compile-time graph")
      ->check(whole_number(1, kMaxBenchCount))
      ->capture_default_str();
  cmd->add_flag("!--no-compile", o->compile, "Skip the ResNet-50 compile-time measurement");
  cmd->callback([o, &exit_code] { exit_code = run_bench([&] { return run_matmul_bench(*o); }); });
}

}  // namespace ipupod::pod
