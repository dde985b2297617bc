// `ipupod bench step`: one training step of a zoo model (one micro-batch: forward, backward,
// AdamW) compiled for one emulated IPU (1 replica x 1 stage) and run by the engine on N host
// threads, against the same step in PyTorch on N threads (scripts/bench_step_torch.py, Debian's
// python3-torch), timed in alternating rounds so that both see the same load of a shared
// machine. The PyTorch peer is a child process that times its own steps when asked.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ipu_process/engine.hpp"
#include "models/interpreter.hpp"
#include "models/zoo.hpp"
#include "pod/cli/bench.hpp"
#include "pod/compiler/compiler.hpp"

namespace ipupod::pod {
namespace {

using Clock = std::chrono::steady_clock;

struct StepBenchOptions {
  std::string model = "cnn";
  unsigned threads = 1;
  std::size_t repeats = 7;
  std::size_t warmup = 1;
  std::size_t micro_batch = 0;  // 0: the model's benchmark configuration
  double width = 0;             // 0: the model's benchmark configuration
  std::string arch = "mk2";
  bool peer = true;
  std::string python = "/usr/bin/python3";  // Debian's python3-torch is installed for it
  std::string torch_script;                 // empty: found next to the sources
};

// The benchmark configuration of each model, the PyTorch peer given the same by its options.
struct StepConfig {
  std::size_t micro_batch;
  std::vector<std::size_t> sample_shape;
  double width;
};
const std::vector<std::pair<std::string, StepConfig>>& step_configs() {
  static const std::vector<std::pair<std::string, StepConfig>> configs = {
      {"cnn", {16, {1, 28, 28}, 1.0}},
      {"hae", {2, {1, 64, 64}, 0.125}},
      {"mlp", {16, {1, 28, 28}, 1.0}},  // hidden widths {128}: the zoo's default
  };
  return configs;
}

std::string decimal(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

StepConfig resolve_config(const StepBenchOptions& o) {
  std::string names;
  for (const auto& [name, config] : step_configs()) {
    names += (names.empty() ? "" : ", ") + name;
    if (name != o.model) continue;
    StepConfig c = config;
    if (o.width < 0 || !std::isfinite(o.width))
      throw std::invalid_argument("--width: expected a positive multiplier (or 0), got " +
                                  decimal(o.width));
    if (o.micro_batch > 0) c.micro_batch = o.micro_batch;
    if (o.width > 0) c.width = o.width;
    if (o.model == "cnn" && c.width != 1.0)
      throw std::invalid_argument("--width: the PyTorch CNN has width 1 only; expected 1, got " +
                                  decimal(o.width));
    return c;
  }
  throw std::invalid_argument("--model: expected one of " + names + ", got '" + o.model + "'");
}

std::string find_torch_script(const StepBenchOptions& o) {
  return find_peer_script("bench_step_torch.py", o.torch_script, "--torch-script");
}

// The PyTorch peer: a child process answering "run K" with "seconds S1 ... SK loss L".
class TorchPeer {
 public:
  explicit TorchPeer(const std::vector<std::string>& argv) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid_ == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      execvp(args[0], args.data());
      _exit(127);  // no such interpreter
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    // A peer that dies makes our next request fail with EPIPE rather than kill this process.
    std::signal(SIGPIPE, SIG_IGN);
  }
  ~TorchPeer() { finish(); }
  TorchPeer(const TorchPeer&) = delete;
  TorchPeer& operator=(const TorchPeer&) = delete;

  // The next line the peer prints, or nothing once it has exited.
  std::optional<std::string> read_line() {
    std::string line;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') line += static_cast<char>(c);
    if (c == EOF && line.empty()) return std::nullopt;
    return line;
  }
  bool request(const std::string& line) {
    return std::fputs((line + "\n").c_str(), to_) >= 0 && std::fflush(to_) == 0;
  }
  // Closes its input (it exits at the end of it) and returns its exit status (-1: a signal).
  int finish() {
    if (pid_ <= 0) return status_;
    if (to_) std::fclose(to_);
    if (from_) std::fclose(from_);
    to_ = from_ = nullptr;
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return status_;
  }

 private:
  pid_t pid_ = 0;
  int status_ = 0;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
};

// Why the peer stopped, with what to do about it.
[[noreturn]] void peer_failed(TorchPeer& peer, const StepBenchOptions& o) {
  const int status = peer.finish();
  if (status == 127)
    throw std::invalid_argument("cannot run the PyTorch peer's interpreter --python '" + o.python +
                                "': install python3 (and python3-torch: scripts/install-deps.sh "
                                "--bench), or pass --no-peer to time the emulator only");
  if (status == 3)
    throw std::invalid_argument("PyTorch is not installed for " + o.python +
                                ": run scripts/install-deps.sh --bench (Debian's python3-torch), "
                                "or pass --no-peer to time the emulator only");
  throw std::runtime_error("the PyTorch peer stopped (exit status " + std::to_string(status) +
                           "); its messages are above");
}

// Words of "key=value" pairs after the first word.
std::string field(const std::string& line, const std::string& key) {
  std::istringstream words(line);
  std::string w;
  while (words >> w)
    if (w.rfind(key + "=", 0) == 0) return w.substr(key.size() + 1);
  return "";
}

// One fixed micro-batch: inputs uniform in [0, 1), class labels cycling through the classes; the
// HAE's targets are the input itself (channel 0) and a mask of ones (channel 1), as the peer's.
models::Buffer bench_input(const models::Model& m) {
  models::Buffer x = models::Buffer::zeros(m.graph.info(m.input));
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> d(0.f, 1.f);
  for (auto& v : x.f) v = d(gen);
  return x;
}
models::Buffer bench_labels(const models::Model& m, const models::Buffer& x, std::size_t classes) {
  models::Buffer y = models::Buffer::zeros(m.graph.info(m.labels));
  for (std::size_t i = 0; i < y.i.size(); ++i) y.i[i] = static_cast<std::int32_t>(i % classes);
  if (!y.f.empty()) {  // [micro-batch, 2, h, w]: field, mask
    const std::size_t plane = x.f.size() / m.graph.info(m.labels).shape[0];
    for (std::size_t s = 0; s * 2 * plane < y.f.size(); ++s) {
      std::copy_n(x.f.begin() + static_cast<std::ptrdiff_t>(s * plane), plane,
                  y.f.begin() + static_cast<std::ptrdiff_t>(2 * s * plane));
      std::fill_n(y.f.begin() + static_cast<std::ptrdiff_t>((2 * s + 1) * plane), plane, 1.f);
    }
  }
  return y;
}

int run_step_bench(const StepBenchOptions& o) {
  const StepConfig config = resolve_config(o);
  if (o.threads == 0) throw std::invalid_argument("--threads: expected at least 1, got 0");
  if (o.repeats == 0) throw std::invalid_argument("--repeats: expected at least 1, got 0");
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(o.arch);
  const std::string width = decimal(config.width);

  models::ModelOptions mo;
  mo.micro_batch = config.micro_batch;
  mo.sample_shape = config.sample_shape;
  mo.width = config.width;
  mo.optimizer.kind = models::OptimizerKind::adamw;
  mo.learning_rate = 1e-3;
  const auto compile_start = Clock::now();
  const models::Model model = models::build_model(o.model, mo);

  // The peer next (the options checked): it imports torch and builds its model while the
  // emulator compiles, and it is forked before the engine starts its threads.
  std::unique_ptr<TorchPeer> peer;
  if (o.peer) {
    std::vector<std::string> argv = {o.python,
                                     find_torch_script(o),
                                     "--serve",
                                     "--model",
                                     o.model,
                                     "--micro-batch",
                                     std::to_string(config.micro_batch),
                                     "--width",
                                     width,
                                     "--threads",
                                     std::to_string(o.threads)};
    peer = std::make_unique<TorchPeer>(argv);
  }

  CompiledModel compiled = compile_for_ipu(model, arch, StepShape{});
  const double lower_seconds = seconds_since(compile_start);
  const auto engine_start = Clock::now();
  ipu::Engine engine(*compiled.graph, compiled.programs, {.threads = o.threads});
  const double engine_seconds = seconds_since(engine_start);
  for (const auto& [id, tensor] : compiled.initial_values)
    engine.write_values(tensor, models::initial_parameter(model.graph, id, 0).f);
  for (const auto& [tensor, value] : compiled.constants) {
    std::vector<float> fill(tensor.elements(), value);
    engine.write(tensor, std::as_bytes(std::span(fill)));
  }
  const models::Buffer x = bench_input(model), y = bench_labels(model, x, mo.classes);
  float emulator_loss = NAN;
  engine.connect_input_stream(kInputStream, [&](std::span<std::byte> dst) {
    std::memcpy(dst.data(), x.f.data(), dst.size());
  });
  engine.connect_input_stream(kLabelStream, [&](std::span<std::byte> dst) {
    std::memcpy(dst.data(), y.f.empty() ? static_cast<const void*>(y.i.data()) : y.f.data(),
                dst.size());
  });
  engine.connect_output_stream(kLossStream, [&](std::span<const std::byte> src) {
    std::memcpy(&emulator_loss, src.data(), sizeof emulator_loss);
  });

  std::string peer_version;
  std::size_t peer_parameters = 0;
  if (peer) {
    const auto ready = peer->read_line();
    if (!ready || ready->rfind("ready", 0) != 0) peer_failed(*peer, o);
    peer_version = field(*ready, "torch");
    peer_parameters = std::stoul(field(*ready, "parameters"));
  }
  float peer_loss = NAN;
  const auto peer_step = [&] {
    if (!peer->request("run 1")) peer_failed(*peer, o);
    const auto reply = peer->read_line();
    if (!reply || reply->rfind("seconds ", 0) != 0) peer_failed(*peer, o);
    std::istringstream words(*reply);
    std::string word;
    double seconds = 0;
    words >> word >> seconds >> word >> peer_loss;
    return seconds;
  };
  const auto emulator_step = [&] {
    const auto start = Clock::now();
    engine.run("train");
    return seconds_since(start);
  };

  std::cout << "step benchmark: " << o.model << ", micro-batch " << config.micro_batch
            << ", sample " << config.sample_shape[0] << "x" << config.sample_shape[1] << "x"
            << config.sample_shape[2] << (o.model == "hae" ? ", width " + width : "") << ", AdamW; "
            << o.threads << " thread(s) each; " << o.warmup << " warm-up and " << o.repeats
            << " timed rounds of one emulated step then one "
            << (peer ? "PyTorch step" : "(no peer)") << "; medians\n";
  std::cout << "parameters: " << model.parameter_count();
  if (peer) {
    std::cout << " (PyTorch peer: " << peer_parameters << ")";
    if (peer_parameters != model.parameter_count())
      std::cout << "  warning: the models differ in size";
  }
  std::cout << "\n" << std::fixed << std::setprecision(2);
  std::cout << "emulator compile (" << arch.name << ", 1 replica x 1 stage): model and lowering "
            << lower_seconds << " s, engine " << engine_seconds << " s\n"
            << std::flush;

  for (std::size_t r = 0; r < o.warmup; ++r) {
    emulator_step();
    if (peer) peer_step();
  }
  const ipu::CycleBreakdown before = engine.cycles();
  std::vector<double> emulator, torch;
  for (std::size_t r = 0; r < o.repeats; ++r) {
    emulator.push_back(emulator_step());
    if (peer) torch.push_back(peer_step());
  }
  ipu::CycleBreakdown per_step = engine.cycles() - before;
  for (auto* f : {&per_step.compute, &per_step.exchange, &per_step.sync, &per_step.host})
    *f /= o.repeats;
  if (peer && peer->finish() != 0) peer_failed(*peer, o);

  const double emu = median(emulator);
  const double samples = static_cast<double>(config.micro_batch);
  std::cout << std::setprecision(4) << "emulator (ipupod, " << arch.name << ", 1 IPU): " << emu
            << " s per step, " << std::setprecision(1) << samples / emu << " samples/s; loss "
            << std::setprecision(4) << emulator_loss << "\n";
  std::cout << std::setprecision(1) << "predicted " << arch.name
            << " time per step: " << 1e6 * engine.seconds(per_step) << " us (compute "
            << 1e6 * static_cast<double>(per_step.compute) / arch.clock_hz << ", exchange "
            << 1e6 * static_cast<double>(per_step.exchange) / arch.clock_hz << ", sync "
            << 1e6 * static_cast<double>(per_step.sync) / arch.clock_hz << ", host "
            << 1e6 * static_cast<double>(per_step.host) / arch.clock_hz << ")\n";
  std::cout << std::setprecision(4);
  if (peer) {
    const double pt = median(torch);
    std::cout << "peer (PyTorch " << peer_version << ", " << o.threads << " thread(s)): " << pt
              << " s per step, " << std::setprecision(1) << samples / pt << " samples/s; loss "
              << std::setprecision(4) << peer_loss << "\n";
    std::cout << std::setprecision(2) << "ratio emulator / PyTorch: " << emu / pt
              << " (target <= 1.5)\n";
    std::cout << std::setprecision(6) << "model=" << o.model << " threads=" << o.threads
              << " emulator_s=" << emu << " torch_s=" << pt << " ratio=" << std::setprecision(3)
              << emu / pt << "\n";
  } else {
    std::cout << std::setprecision(6) << "model=" << o.model << " threads=" << o.threads
              << " emulator_s=" << emu << "\n";
  }
  if (!std::isfinite(emulator_loss)) {
    std::cerr << "error: the emulated step's loss is not finite\n";
    return 1;
  }
  return 0;
}

}  // namespace

std::string find_peer_script(const std::string& file, const std::string& given,
                             const std::string& option) {
  namespace fs = std::filesystem;
  const fs::path relative = fs::path("scripts") / file;
  if (!given.empty()) {
    if (!fs::is_regular_file(given))
      throw std::invalid_argument(option + ": expected the path of " + file + ", got '" + given +
                                  "' (no such file)");
    return given;
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path())
      for (const fs::path& candidate : {dir / relative, dir / "share" / "ipupod" / file})
        if (fs::is_regular_file(candidate)) return candidate.string();
  const fs::path built_from = fs::path(IPUPOD_SOURCE_DIR) / relative;
  if (fs::is_regular_file(built_from)) return built_from.string();
  throw std::invalid_argument("cannot find scripts/" + file + " above " +
                              exe.parent_path().string() + " or in " + IPUPOD_SOURCE_DIR +
                              ": pass " + option + " PATH (or --no-peer to time ipupod only)");
}

void add_step_bench(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<StepBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "step",
      "One training step of a zoo model on one emulated IPU vs the same step in PyTorch on the "
      "same threads (scripts/bench_step_torch.py; install PyTorch with scripts/install-deps.sh "
      "--bench). Configurations: cnn micro-batch 16 of 1x28x28; hae micro-batch 2 of 1x64x64, "
      "width 0.125; mlp micro-batch 16 of 1x28x28, hidden 128; AdamW, learning rate 0.001");
  cmd->add_option("--model", o->model, "cnn, hae or mlp")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Engine threads and torch.set_num_threads")
      ->check(whole_number(1, kMaxBenchThreads))
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Timed rounds (one step of each); medians reported")
      ->check(whole_number(1, kMaxBenchRounds))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed rounds first")
      ->check(whole_number(0, kMaxBenchRounds))
      ->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "Samples per step (0: the model's above)")
      ->check(whole_number(0, kMaxBenchCount))
      ->capture_default_str();
  cmd->add_option("--width", o->width, "hae: channel width multiplier (0: the model's above)")
      ->check(finite_number({.min = 0, .max = 64}))
      ->capture_default_str();
  cmd->add_option("--arch", o->arch, "IPU architecture preset or .json file")
      ->capture_default_str();
  cmd->add_flag("!--no-peer", o->peer, "Time the emulator only (no Python, no PyTorch)");
  cmd->add_option("--python", o->python, "Interpreter for the PyTorch peer")->capture_default_str();
  cmd->add_option("--torch-script", o->torch_script,
                  "The peer script (default: scripts/bench_step_torch.py of the sources)");
  cmd->callback([o, &exit_code] { exit_code = run_bench([&] { return run_step_bench(*o); }); });
}

}  // namespace ipupod::pod
