// One pipeline stage of a zoo model lowered and compiled on its own emulated IPU with
// out-of-memory allowed, its memory report, and the fit verdict with advice per stage.
#include "pod/compiler/stage_compile.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <utility>

#include "ipu_process/codelets.hpp"
#include "ipu_process/engine.hpp"
#include "pod/compiler/compiler.hpp"
#include "pod/compiler/model_options.hpp"
#include "pod/host_memory.hpp"
#include "pod/report.hpp"

namespace ipupod::pod {
namespace {

// What `ipupod compile` knows of the data: the sample shape and classes it was given.
DataShape compile_data(const CompileConfig& c) {
  return {c.sample_shape, c.classes, 1, {}};
}

// How often a compile says where it stands.
constexpr double kProgressSeconds = 5;

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

}  // namespace

void validate(const CompileConfig& c) {
  validate_counts(c.train);
  if (c.classes < 1 || c.classes > kMaxCount)
    throw UsageError("--classes must be a whole number in [1, " + std::to_string(kMaxCount) +
                     "], got " + std::to_string(c.classes));
  std::size_t sample_elements = 1;
  for (std::size_t d : c.sample_shape) {
    if (d < 1 || sample_elements > kMaxCount / d)
      throw UsageError(
          "--sample-shape: every dimension must be at least 1 and one sample at most " +
          std::to_string(kMaxCount) + " elements; lower the shape");
    sample_elements *= d;
  }
  for (const auto& [value, option] :
       {std::pair{c.train.width, "--width"}, {c.train.depth, "--depth"}})
    if (!(std::isfinite(value) && value > 0 && value <= kMaxModelMultiplier))
      throw UsageError(std::string(option) + " must be a finite number in (0, " +
                       std::to_string(static_cast<int>(kMaxModelMultiplier)) + "], got " +
                       std::to_string(value));
  validate_model_name(c.train.model);
  validate_loss(c.train);
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
    models::ModelOptions options = model_options(c.train, compile_data(c), true);
    use_automatic_split(c.train, options, nullptr);
    model = models::build_model(c.train.model, options);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  check_stage_count(c.train, model);
}

nlohmann::json compile_stage(const CompileConfig& c, std::size_t stage, std::ostream* progress,
                             const std::function<void(ipu::Engine&)>& use_engine) {
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(c.train.arch);
  const auto start = std::chrono::steady_clock::now();
  release_free_heap();  // what an earlier stage freed, so that this stage's peak is its own
  const bool peak_of_stage = reset_peak_resident();
  auto last_line = start;
  const auto say = [&](const std::string& what) {
    *progress << "stage " << stage << ": " << what << ", " << std::fixed << std::setprecision(1)
              << seconds_since(start) << " s, " << mib(resident_bytes()) << " resident"
              << std::endl;
    last_line = std::chrono::steady_clock::now();
  };
  CompileProgressFn lowered;
  if (progress)
    lowered = [&](const CompileProgress& p) {
      if (seconds_since(last_line) < kProgressSeconds && p.done != p.total) return;
      say("lowering the " + std::string(p.phase) + " pass, " + std::to_string(p.done) + "/" +
          std::to_string(p.total) + " ops (" + std::string(p.op) + ")");
    };
  models::SplitPlan plan;
  const JobModels models = build_job_models(c.train, compile_data(c), &plan);
  const models::Model& model = models.training;
  const models::Model& eval_model = models.eval;
  CompiledModel compiled =
      compile_for_ipu(model, arch,
                      {.gradient_accumulation = c.train.gradient_accumulation,
                       .device_iterations = c.train.device_iterations,
                       .replicas = c.train.replicas,
                       .stages = c.train.stages,
                       .stage = stage,
                       .grouped = c.train.pipeline_schedule == "grouped",
                       .recompute = c.train.recompute,
                       .float16 = c.train.precision == "fp16",
                       .replicated_tensor_sharding = c.train.replicated_tensor_sharding,
                       .available_memory_proportion = c.train.available_memory_proportion,
                       .half_partials = c.train.partials_type == "half",
                       .plan_only = true,
                       .timed_steps = c.timed_steps},
                      &eval_model, lowered);
  const double lower_seconds = seconds_since(start);
  // The lowering's temporaries are freed but their pages stay with the process: give them back
  // before the engine's tables take their own.
  release_free_heap();
  if (progress) say("building the engine (memory plan, liveness, programs)");
  const auto engine_start = std::chrono::steady_clock::now();
  // Out of memory allowed: the report of a stage that does not fit is the point. A plan: the
  // same memory layout and cycles as a training rank's engine, without its tile memory.
  std::function<void(std::size_t, std::size_t)> planned;
  if (progress)
    planned = [&](std::size_t done, std::size_t tiles) {
      if (seconds_since(last_line) < kProgressSeconds) return;
      say("building the engine: memory plan, " + std::to_string(done) + "/" +
          std::to_string(tiles) + " tiles laid out");
    };
  ipu::Engine engine(*compiled.graph, compiled.programs,
                     {.allow_out_of_memory = true,
                      .threads = std::max(1U, c.threads),
                      .executable = false,
                      .timing_only_programs = compiled.timing_only_programs,
                      .memory_plan_progress = planned});
  const double engine_seconds = seconds_since(engine_start);
  if (use_engine) use_engine(engine);

  const ipu::Graph& g = *compiled.graph;
  std::size_t stash_bytes = 0, vertices = 0, regions = 0, state_regions = 0, intervals = 0;
  std::vector<std::size_t> per_tile(arch.tiles);
  for (const auto& v : g.variables()) {
    if (v.name.find("/stash") != std::string::npos) stash_bytes += v.elements * dtype_size(v.dtype);
    intervals += v.mapping.size();
    for (const auto& iv : v.mapping) ++per_tile[iv.tile];
  }
  // Per codelet: vertices, and vertex-state regions in all and on the busiest tile.
  struct CodeletCounts {
    std::size_t vertices = 0, regions = 0, busiest_tile_regions = 0;
  };
  const unsigned busiest = engine.memory().busiest().tile;
  std::map<std::uint16_t, CodeletCounts> by_codelet;
  for (const auto& cs : g.compute_sets()) {
    vertices += cs.vertices.size();
    regions += cs.region_count;
    for (const auto& v : cs.vertices) {
      CodeletCounts& c = by_codelet[v.codelet];
      ++c.vertices;
      const std::size_t r = cs.regions_of(v);
      c.regions += r;
      state_regions += r;
      if (v.tile == busiest) c.busiest_tile_regions += r;
    }
  }
  nlohmann::json vertices_by_codelet = nlohmann::json::object();
  nlohmann::json regions_by_codelet = nlohmann::json::object();
  for (const auto& [codelet, c] : by_codelet) {
    const std::string& name = ipu::CodeletRegistry::builtin().at(codelet).name;
    vertices_by_codelet[name] = c.vertices;
    regions_by_codelet[name] = {{"all_tiles", c.regions}, {"busiest_tile", c.busiest_tile_regions}};
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
                {"vertices_by_codelet", vertices_by_codelet},
                {"regions", regions},
                {"state_regions", state_regions},
                {"regions_by_codelet", regions_by_codelet},
                {"tile_intervals", intervals},
                {"max_intervals_per_tile", *std::max_element(per_tile.begin(), per_tile.end())}};
  j["compile_seconds"] = {{"lower", lower_seconds}, {"engine", engine_seconds}};
  j["host_memory"] = {{"peak_resident_bytes", peak_resident_bytes()},
                      {"peak_of_this_stage_only", peak_of_stage}};
  if (!plan.stages.empty()) j["automatic_split"] = describe_split(plan);
  return j;
}

void print_compile_report(const CompileConfig& c, const std::vector<nlohmann::json>& stages,
                          std::ostream& out, const char* command) {
  const ipu::ArchPreset& arch = ipu::ArchPreset::get(c.train.arch);
  out << "ipupod " << command << ": " << c.train.model << " in " << c.train.stages << " stage"
      << (c.train.stages == 1 ? "" : "s") << " on " << arch.name << " (" << arch.tiles
      << " tiles x " << kib(arch.bytes_per_tile) << " = " << mib(arch.bytes_per_ipu())
      << " per IPU), micro-batch " << c.train.micro_batch << ", gradient accumulation "
      << c.train.gradient_accumulation << ", " << c.train.pipeline_schedule << " schedule\n";
  if (!stages.empty() && stages.front().contains("automatic_split"))
    out << stages.front().at("automatic_split").get<std::string>() << "\n";
  out << pad("stage", 7) << pad("layers", 44) << pad("params", 11)
      << pad("peak tile (of " + kib(arch.bytes_per_tile) + ")", 28) << pad("tiles over", 12)
      << pad("total (of " + mib(arch.bytes_per_ipu()) + ")", 24) << pad("fits", 6)
      << pad("compile s", 11) << "host peak\n";
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
        << pad(s.at("fits").get<bool>() ? "yes" : "no", 6) << pad(compile_s, 11)
        << mib(s.at("host_memory").at("peak_resident_bytes").get<std::size_t>()) << "\n";
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
          << kib(t.at("vertex_state").get<std::size_t>()) << ")\n    live at its busiest step:";
      const char* sep = " ";
      for (const auto& [category, bytes] : t.at("peak_by_category").items())
        out << std::exchange(sep, ", ") << category << " " << kib(bytes.get<std::size_t>());
      out << "; the largest then:";
      for (const auto& tensor : t.at("live_at_peak"))
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
                                : ", and --recompute stashes only the stage's inputs and a few"
                                  " checkpoints, running the forward pass again segment by"
                                  " segment during the backward pass.");
    out << "\n";
  }
}

}  // namespace ipupod::pod
