// `ipupod compile`: each stage of a zoo model lowered and compiled on its own emulated IPU with
// out-of-memory allowed, the memory reports gathered, and a fit verdict with advice per stage.
#include "pod/compile.hpp"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "ipu_process/engine.hpp"
#include "pod/compiler.hpp"
#include "pod/report.hpp"
#include "pod/train.hpp"
#include "pod/wire.hpp"

namespace ipupod::pod {
namespace {

constexpr int kStageReportTag = 1;

models::ModelOptions model_options(const CompileConfig& c) {
  models::ModelOptions o;
  o.micro_batch = c.train.micro_batch;
  o.sample_shape = c.sample_shape;
  o.classes = c.classes;
  o.hidden = c.train.hidden;
  o.learning_rate = c.train.learning_rate;
  o.width = c.train.width;
  o.depth = c.train.depth;
  o.pipeline_stages = c.train.stages;
  o.seed = c.train.seed;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The parameterised layers of one stage (parameters grouped by name prefix, as in
// Model::summary), their parameter count, and the first and last of them.
nlohmann::json stage_layers(const models::Model& model, int stage) {
  std::vector<std::string> layers;
  std::size_t parameters = 0;
  for (const models::Op& op : model.graph.ops()) {
    if (op.kind != models::OpKind::parameter || op.pipeline_stage != stage) continue;
    const auto dot = op.name.rfind('.');
    const std::string layer = dot == std::string::npos ? op.name : op.name.substr(0, dot);
    if (layers.empty() || layers.back() != layer) layers.push_back(layer);
    parameters += model.graph.info(*op.output).elements();
  }
  return {{"count", layers.size()},
          {"first", layers.empty() ? "" : layers.front()},
          {"last", layers.empty() ? "" : layers.back()},
          {"parameters", parameters}};
}

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

std::string kib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  return text;
}

std::string percent(std::size_t part, std::size_t whole) {
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%",
                whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return text;
}

// s followed by spaces up to `width` columns, and at least one.
std::string pad(std::string s, std::size_t width) {
  s.append(s.size() < width ? width - s.size() : 1, ' ');
  return s;
}

[[noreturn]] void abort_compile(MPI_Comm world, const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::cerr << "ipupod compile: error on rank " << rank << ": " << what << std::endl;
  MPI_Abort(world, 1);
  std::abort();
}

}  // namespace

void validate(const CompileConfig& c) {
  const auto positive = [](std::size_t v, const char* option) {
    if (v == 0) throw UsageError(std::string(option) + " must be at least 1, got 0");
  };
  positive(c.train.stages, "--stages");
  positive(c.train.micro_batch, "--micro-batch");
  positive(c.train.gradient_accumulation, "--gradient-accumulation");
  positive(c.classes, "--classes");
  if (!(c.train.width > 0) || !(c.train.depth > 0))
    throw UsageError("--width and --depth must be positive");
  bool known_model = false;
  std::string names;
  for (const auto& e : models::zoo()) {
    known_model |= e.name == c.train.model;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  if (!known_model)
    throw UsageError("unknown model '" + c.train.model + "'; known models: " + names +
                     " (see `ipupod info --models`)");
  try {
    ipu::ArchPreset::get(c.train.arch);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--arch: ") + e.what());
  }
  validate_pipeline(c.train);
  for (std::size_t s : c.only_stages)
    if (s >= c.train.stages)
      throw UsageError("--stage " + std::to_string(s) + " does not exist: stages are 0 to " +
                       std::to_string(c.train.stages - 1));
  // The model itself: a sample shape it cannot take, or fewer split units than stages.
  models::Model model;
  try {
    models::ModelOptions options = model_options(c);
    use_automatic_split(c.train, options, nullptr);
    model = models::build_model(c.train.model, options);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const auto split = static_cast<std::size_t>(model.graph.max_stage() + 1);
  if (split != c.train.stages)
    throw UsageError("model '" + c.train.model + "' splits into at most " + std::to_string(split) +
                     " pipeline stages at this size, not " + std::to_string(c.train.stages) +
                     "; choose --stages " + std::to_string(split) + " or fewer");
}

nlohmann::json compile_stage(const CompileConfig& c, std::size_t stage) {
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(c.train.arch);
  const auto start = std::chrono::steady_clock::now();
  models::ModelOptions options = model_options(c);
  models::SplitPlan plan;
  use_automatic_split(c.train, options, &plan);
  const models::Model model = models::build_model(c.train.model, options);
  options = model_options(c);
  options.training = false;
  follow_automatic_split(c.train, model, options);
  const models::Model eval_model = models::build_model(c.train.model, options);
  CompiledModel compiled =
      compile_for_ipu(model, arch,
                      {.gradient_accumulation = c.train.gradient_accumulation,
                       .device_iterations = c.train.device_iterations,
                       .replicas = 1,
                       .stages = c.train.stages,
                       .stage = stage,
                       .grouped = c.train.pipeline_schedule == "grouped",
                       .recompute = c.train.recompute,
                       .float16 = c.train.precision == "fp16",
                       .available_memory_proportion = c.train.available_memory_proportion},
                      &eval_model);
  const double lower_seconds = seconds_since(start);
  const auto engine_start = std::chrono::steady_clock::now();
  // Out of memory allowed: the report of a stage that does not fit is the point.
  const ipu::Engine engine(*compiled.graph, compiled.programs, {.allow_out_of_memory = true});
  const double engine_seconds = seconds_since(engine_start);

  const ipu::Graph& g = *compiled.graph;
  std::size_t stash_bytes = 0, vertices = 0, regions = 0, intervals = 0;
  std::vector<std::size_t> per_tile(arch.tiles);
  for (const auto& v : g.variables()) {
    if (v.name.find("/stash") != std::string::npos) stash_bytes += v.elements * dtype_size(v.dtype);
    intervals += v.mapping.size();
    for (const auto& iv : v.mapping) ++per_tile[iv.tile];
  }
  for (const auto& cs : g.compute_sets()) {
    vertices += cs.vertices.size();
    for (const auto& v : cs.vertices)
      for (const auto& f : v.fields) regions += f.size();
  }

  nlohmann::json j = memory_report_json(engine.memory(), arch);
  j["stage"] = stage;
  j["layers"] = stage_layers(model, static_cast<int>(stage));
  j["stash_slots"] = compiled.stash_slots;
  j["stash_bytes"] = stash_bytes;
  j["parameter_tensors"] = compiled.parameters.size();
  j["fits"] = engine.memory().tiles_over() == 0;
  j["graph"] = {{"variables", g.variables().size()},
                {"compute_sets", g.compute_sets().size()},
                {"vertices", vertices},
                {"regions", regions},
                {"tile_intervals", intervals},
                {"max_intervals_per_tile", *std::max_element(per_tile.begin(), per_tile.end())}};
  j["compile_seconds"] = {{"lower", lower_seconds}, {"engine", engine_seconds}};
  if (!plan.stages.empty()) j["automatic_split"] = describe_split(plan);
  return j;
}

void print_compile_report(const CompileConfig& c, const std::vector<nlohmann::json>& stages,
                          std::ostream& out) {
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(c.train.arch);
  out << "ipupod compile: " << c.train.model << " in " << c.train.stages << " stage"
      << (c.train.stages == 1 ? "" : "s") << " on " << arch.name << " (" << arch.tiles
      << " tiles x " << kib(arch.bytes_per_tile) << " = " << mib(arch.bytes_per_ipu())
      << " per IPU), micro-batch " << c.train.micro_batch << ", gradient accumulation "
      << c.train.gradient_accumulation << ", " << c.train.pipeline_schedule << " schedule\n";
  if (!stages.empty() && stages.front().contains("automatic_split"))
    out << stages.front().at("automatic_split").get<std::string>() << "\n";
  out << pad("stage", 7) << pad("layers", 44) << pad("params", 11)
      << pad("peak tile (of " + kib(arch.bytes_per_tile) + ")", 28) << pad("tiles over", 12)
      << pad("total (of " + mib(arch.bytes_per_ipu()) + ")", 24) << pad("fits", 6) << "compile s\n";
  for (const auto& s : stages) {
    const auto& layers = s.at("layers");
    std::string names = layers.at("first").get<std::string>();
    if (layers.at("count") > 1) names += " .. " + layers.at("last").get<std::string>();
    names += " (" + std::to_string(layers.at("count").get<std::size_t>()) + ")";
    char params[32];
    std::snprintf(params, sizeof params, "%.2f M",
                  static_cast<double>(layers.at("parameters").get<std::size_t>()) / 1e6);
    const std::size_t peak = s.at("busiest_tile_bytes"), total = s.at("total_bytes");
    char compile_s[32];
    std::snprintf(compile_s, sizeof compile_s, "%.1f",
                  s.at("compile_seconds").at("lower").get<double>() +
                      s.at("compile_seconds").at("engine").get<double>());
    out << pad(std::to_string(s.at("stage").get<std::size_t>()), 7) << pad(names, 44)
        << pad(params, 11) << pad(kib(peak) + " (" + percent(peak, arch.bytes_per_tile) + ")", 28)
        << pad(std::to_string(s.at("tiles_over_capacity").get<std::size_t>()), 12)
        << pad(mib(total) + " (" + percent(total, arch.bytes_per_ipu()) + ")", 24)
        << pad(s.at("fits").get<bool>() ? "yes" : "no", 6) << compile_s << "\n";
  }

  bool all_fit = true;
  std::size_t total_all = 0;
  for (const auto& s : stages) {
    all_fit &= s.at("fits").get<bool>();
    total_all += s.at("total_bytes").get<std::size_t>();
  }
  if (all_fit) {
    out << "Every stage fits.\n";
    return;
  }
  for (const auto& s : stages) {
    if (s.at("fits").get<bool>()) continue;
    const std::size_t stage = s.at("stage"), total = s.at("total_bytes");
    const std::size_t over = s.at("tiles_over_capacity");
    out << "\nStage " << stage << " does not fit: " << over << " of " << arch.tiles
        << " tiles exceed " << kib(arch.bytes_per_tile) << ". Worst tiles:\n";
    std::vector<const nlohmann::json*> tiles;
    for (const auto& t : s.at("per_tile")) tiles.push_back(&t);
    std::stable_sort(tiles.begin(), tiles.end(), [](auto* a, auto* b) {
      return a->at("total").template get<std::size_t>() >
             b->at("total").template get<std::size_t>();
    });
    for (std::size_t i = 0; i < std::min<std::size_t>(3, tiles.size()); ++i) {
      const auto& t = *tiles[i];
      const std::size_t bytes = t.at("total");
      out << "  tile " << t.at("tile").get<unsigned>() << ": " << kib(bytes) << " ("
          << percent(bytes, arch.bytes_per_tile) << "; always-live "
          << kib(t.at("always_live").get<std::size_t>()) << ", not-always-live "
          << kib(t.at("not_always_live").get<std::size_t>()) << ", vertex state "
          << kib(t.at("vertex_state").get<std::size_t>()) << "); largest:";
      for (const auto& tensor : t.at("largest"))
        out << " '" << tensor.at("name").get<std::string>() << "' "
            << kib(tensor.at("bytes").get<std::size_t>()) << " ("
            << tensor.at("category").get<std::string>() << ")";
      out << "\n";
    }
    out << "  Advice:";
    if (total > arch.bytes_per_ipu()) {
      out << " the stage needs " << mib(total) << ", more than one " << arch.name
          << " holds in total: no tile mapping can fit it. Split the model over more stages"
          << " (the whole model needs at least "
          << (total_all + arch.bytes_per_ipu() - 1) / arch.bytes_per_ipu()
          << " IPUs' worth of memory at this micro-batch) or lower --micro-batch.";
    } else {
      out << " the stage uses " << percent(total, arch.bytes_per_ipu())
          << " of the IPU in total, but its busiest tiles overflow: lower --micro-batch,"
          << " or move layers to a stage with room (a different split).";
    }
    const std::size_t stash = s.at("stash_bytes");
    if (stash > 0)
      out << " Its " << s.at("stash_slots").get<std::size_t>() << " activation stash slots take "
          << mib(stash) << " (" << percent(stash, total)
          << "); more gradient accumulation does not change them, --pipeline-schedule"
          << " sequential keeps none"
          << (c.train.recompute ? "."
                                : ", and --recompute stashes only what the forward pass cannot"
                                  " make again (the stage's inputs).");
    out << "\n";
  }
}

int run_compile(const CompileConfig& c, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  try {
    validate(c);
  } catch (const UsageError& e) {
    if (rank == 0) std::cerr << "ipupod compile: " << e.what() << "\n";
    return 2;
  }
  std::vector<std::size_t> stages;
  for (std::size_t s = 0; s < c.train.stages; ++s)
    if (c.only_stages.empty() ||
        std::find(c.only_stages.begin(), c.only_stages.end(), s) != c.only_stages.end())
      stages.push_back(s);
  std::vector<nlohmann::json> reports(stages.size());
  try {
    if (rank == 0) std::filesystem::create_directories(c.train.run_dir);
    for (std::size_t i = static_cast<std::size_t>(rank); i < stages.size();
         i += static_cast<std::size_t>(size)) {
      const std::size_t s = stages[i];
      nlohmann::json report = compile_stage(c, s);
      malloc_trim(0);  // the stage's graph is gone: give its memory back before the next one
      const auto& seconds = report.at("compile_seconds");
      const auto& graph = report.at("graph");
      std::printf(
          "stage %zu compiled: lowered in %.1f s (%zu compute sets, %zu vertices), "
          "engine in %.1f s\n",
          s, seconds.at("lower").get<double>(), graph.at("compute_sets").get<std::size_t>(),
          graph.at("vertices").get<std::size_t>(), seconds.at("engine").get<double>());
      std::fflush(stdout);
      if (rank == 0) {
        reports[i] = std::move(report);
      } else {
        send_text(report.dump(), 0, kStageReportTag, world);
      }
    }
    if (rank != 0) return 0;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const int from = static_cast<int>(i % static_cast<std::size_t>(size));
      if (from == 0) continue;
      reports[i] = nlohmann::json::parse(receive_text(from, kStageReportTag, world));
    }
    nlohmann::json memory = nlohmann::json::array();
    nlohmann::json summary = {{"config", config_json(c.train)},
                              {"stages", nlohmann::json::array()}};
    summary["config"].erase("data");
    summary["config"]["sample_shape"] = c.sample_shape;
    summary["config"]["classes"] = c.classes;
    bool all_fit = true;
    for (const auto& r : reports) {
      all_fit &= r.at("fits").get<bool>();
      nlohmann::json row = r;
      row.erase("per_tile");
      summary["stages"].push_back(std::move(row));
      memory.push_back(r);
    }
    summary["fits"] = all_fit;
    write_file_atomically(c.train.run_dir, "memory.json", memory.dump(1) + "\n");
    write_file_atomically(c.train.run_dir, "compile.json", summary.dump(1) + "\n");
    print_compile_report(c, reports, std::cout);
    std::cout << "wrote " << c.train.run_dir << "/{memory.json,compile.json}" << std::endl;
    return all_fit ? 0 : 1;
  } catch (const std::exception& e) {
    if (size > 1) abort_compile(world, e.what());
    std::cerr << "ipupod compile: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ipupod::pod
