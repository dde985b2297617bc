// The built-in architecture presets (MK1, MK2, Bow and a tiny test IPU) and their sources.
#include "ipu_process/arch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "json_text/json_text.hpp"

namespace ipupod::ipu {
namespace {

// Where each figure comes from: "<fields>: <source>", one line per group of fields (a test
// checks that every figure of every built-in preset is named and none is unsourced). Figures
// with no public value are the parameters scripts/calibration/fit.py fits against the public
// throughput measurements, one value for every model.
constexpr const char* kSourceFitted =
    "exchange_latency_cycles, sync_cycles_internal, vertex_overhead_cycles: no public figure; "
    "the parameters scripts/calibration/fit.py fits to the public measurements, one value for "
    "every model (docs/calibration.md: the fit's state and its errors). PopLibs' own "
    "estimators (graphcore/poplibs popops and poplin PerformanceEstimation) charge ~26-50 worker "
    "cycles (x6 workers) of fixed cost per vertex and no start-up cost per exchange";
constexpr const char* kSourceVertexState =
    "vertex_state_bytes_per_region: 8 bytes, Poplar user guide 'Vertex vector types': a SPAN "
    "field is a pointer and a 32-bit count";
constexpr const char* kSourceCode =
    "codelet_code_bytes: no public per-codelet code size, and no cycles depend on it (memory "
    "only); PopVision reports code per tile as its own category, which this figure stands for";
constexpr const char* kSourceVector =
    "fp32_vector_width, amp_pipeline_depth: PopLibs' 64-bit data path (2 float32 or 4 float16 per "
    "instruction: f32v2/f16v4 codelets; CONV_UNIT_INPUT_LOAD_ELEMS 2/4 in poplibs_support/"
    "TileConstants.hpp) and AMP pipeline depth 4 (convUnitPipelineDepth of PopLibs' early "
    "popnn/Net.hpp): an engine sums 16 float16 or 8 float32 inputs per output";
constexpr const char* kSourceExternalSync =
    "sync_cycles_external: globalSyncCycles 500 of an early Poplar IPUModel preset (PopLibs "
    "popnn/Net.cpp); the least a cross-IPU sync costs, topologies give wider scopes more";

std::vector<ArchPreset> make_presets() {
  std::vector<ArchPreset> p;
  ArchPreset mk2;
  mk2.name = "mk2";
  mk2.description = "Colossus MK2 GC200 (IPU-M2000)";
  mk2.tiles = 1472;
  mk2.bytes_per_tile = 624 * 1024;
  mk2.clock_hz = 1.33e9;
  mk2.workers_per_tile = 6;
  mk2.fp32_flops_per_cycle_per_tile = 32;
  mk2.fp16_flops_per_cycle_per_tile = 128;
  mk2.fp16_fp32_partials_flops_per_cycle_per_tile = 64;
  mk2.amp_pipeline_depth = 4;
  mk2.fp32_vector_width = 2;
  mk2.exchange_bytes_per_cycle_per_tile = 4;
  mk2.exchange_latency_cycles = 30;
  mk2.sync_cycles_internal = 150;
  mk2.sync_cycles_external = 500;
  mk2.vertex_overhead_cycles = 60;
  mk2.vertex_state_bytes_per_region = 8;
  mk2.codelet_code_bytes = 2048;
  mk2.host_link_bytes_per_s = 15.75e9;
  mk2.sources = {
      "tiles, bytes_per_tile, clock_hz, workers_per_tile: Graphcore GC200 specification (1,472 "
      "tiles, 900 MB In-Processor-Memory, 1.33 GHz, 6 worker threads per tile)",
      "fp32_flops_per_cycle_per_tile, fp16_flops_per_cycle_per_tile: IPU-M2000 and IPU-POD128 "
      "datasheets (62.5 TFLOPS FP32 and 250 TFLOPS FP16.16 per IPU = 32 and 128 FLOP per cycle "
      "per tile at 1,472 tiles x 1.33 GHz)",
      "fp16_fp32_partials_flops_per_cycle_per_tile: half the FP16.16 rate, derived: PopLibs' MK2 "
      "AMP codelets run float16 products into float16 partials on 16 engines and into float32 "
      "partials on 8 (poplin conv_partial_1x1 'half_half_16' and 'half_float_8' variants); no "
      "datasheet quotes FP16.32",
      kSourceVector,
      "exchange_bytes_per_cycle_per_tile: 4, PopLibs' IPU model (ipuExchangeBandwidth 4 in "
      "popnn/Net.hpp; Poplar IPUModel exchangeBytesPerCycle) = 7.8 TB/s on an MK2, its quoted "
      "~8 TB/s exchange",
      kSourceExternalSync,
      kSourceVertexState,
      "host_link_bytes_per_s: PCIe Gen4 x8 per IPU to the IPU-Gateway (16 GT/s x 8 lanes, "
      "128b/130b; IPU-M2000 block diagram)",
      kSourceFitted,
      kSourceCode};
  p.push_back(mk2);

  ArchPreset mk1 = mk2;
  mk1.name = "mk1";
  mk1.description = "Colossus MK1 GC2 (C2 card)";
  mk1.tiles = 1216;
  mk1.bytes_per_tile = 256 * 1024;
  mk1.clock_hz = 1.6e9;
  mk1.fp32_flops_per_cycle_per_tile = 16;
  mk1.fp16_flops_per_cycle_per_tile = 64;
  mk1.fp16_fp32_partials_flops_per_cycle_per_tile = 64;
  mk1.sources = {
      "tiles, bytes_per_tile, clock_hz, workers_per_tile: Jia et al., arXiv 1912.03413 (1,216 "
      "tiles x 256 KiB, 1.6 GHz, 6 workers)",
      "fp32_flops_per_cycle_per_tile, fp16_flops_per_cycle_per_tile, "
      "fp16_fp32_partials_flops_per_cycle_per_tile: 31.1 TFLOPS FP32 and 124.5 TFLOPS mixed "
      "precision (Jia et al.) / 1,216 tiles / 1.6 GHz; PopLibs' early MK1 model gives float16 "
      "products 8 AMP engines with either partials type (popnn/Net.hpp)",
      kSourceVector,
      "exchange_bytes_per_cycle_per_tile: 4, PopLibs' MK1 IPU model (popnn/Net.hpp) and Jia et "
      "al.",
      kSourceExternalSync,
      kSourceVertexState,
      "host_link_bytes_per_s: as MK2 (PCIe Gen4 x8); the C2 card's own PCIe link, not measured",
      kSourceFitted,
      kSourceCode};
  p.push_back(mk1);

  ArchPreset bow = mk2;
  bow.name = "bow";
  bow.description = "Bow IPU (Bow-2000)";
  bow.clock_hz = 1.85e9;
  bow.sources = {
      "tiles, bytes_per_tile, workers_per_tile: as GC200 (Bow-2000 datasheet: the same "
      "Colossus MK2 tiles on a wafer-on-wafer die)",
      "clock_hz, fp16_flops_per_cycle_per_tile: Bow-2000 datasheet (1.4 petaFLOPS FP16.16 per "
      "4 IPUs = 350 TFLOPS = 128 FLOP per cycle per tile at 1.85 GHz)",
      "fp32_flops_per_cycle_per_tile: Bow Pod256 datasheet (22.31 petaFLOPS FP32 / 256 IPUs = "
      "87 TFLOPS = 32 FLOP per cycle per tile)",
      "fp16_fp32_partials_flops_per_cycle_per_tile: as MK2 (the same AMP)",
      kSourceVector,
      "exchange_bytes_per_cycle_per_tile, host_link_bytes_per_s: as MK2 (the same tile "
      "exchange and gateway)",
      kSourceExternalSync,
      kSourceVertexState,
      kSourceFitted,
      kSourceCode};
  p.push_back(bow);

  ArchPreset tiny = mk2;
  tiny.name = "tiny";
  tiny.description = "test IPU: 32 tiles x 128 KiB with MK2 timing, for fast end-to-end tests";
  tiny.tiles = 32;
  tiny.bytes_per_tile = 128 * 1024;
  tiny.sources = {"not hardware: MK2 figures with few tiles and small memory"};
  p.push_back(tiny);
  return p;
}

}  // namespace

const std::vector<std::string>& ArchPreset::figures() {
  static const std::vector<std::string> names = {"tiles",
                                                 "bytes_per_tile",
                                                 "clock_hz",
                                                 "workers_per_tile",
                                                 "fp32_flops_per_cycle_per_tile",
                                                 "fp16_flops_per_cycle_per_tile",
                                                 "fp16_fp32_partials_flops_per_cycle_per_tile",
                                                 "amp_pipeline_depth",
                                                 "fp32_vector_width",
                                                 "exchange_bytes_per_cycle_per_tile",
                                                 "exchange_latency_cycles",
                                                 "sync_cycles_internal",
                                                 "sync_cycles_external",
                                                 "vertex_overhead_cycles",
                                                 "vertex_state_bytes_per_region",
                                                 "codelet_code_bytes",
                                                 "host_link_bytes_per_s"};
  return names;
}

const std::vector<ArchPreset>& ArchPreset::all() {
  static const std::vector<ArchPreset> presets = make_presets();
  return presets;
}

namespace {

// The bounds of a preset file's figures, far beyond any IPU's (MK2: 1,472 tiles of 624 KiB, 6
// workers, 2 float lanes) but small enough that no product of them overflows: the memory plan
// places a tile's bytes at 32-bit offsets, and the cycle counters add event costs per step.
constexpr std::uint64_t kMaxTiles = 1 << 20;
constexpr std::uint64_t kMaxBytesPerTile = UINT32_MAX;
constexpr std::uint64_t kMaxLanes = 1024;
constexpr std::uint64_t kMaxEventCycles = UINT32_MAX;
// The largest real figure (a clock, a rate): far beyond any IPU's (MK2: 1.33e9 Hz, 15.75e9 B/s)
// and small enough that products of figures (peak FLOP/s) stay finite.
constexpr double kMaxRealFigure = 1e15;

const ArchPreset* find_builtin(std::string_view name) {
  for (const auto& p : ArchPreset::all())
    if (p.name == name) return &p;
  return nullptr;
}

using json_text::brief;
using json_text::shown;

// Reads a preset file; every field must be known and of the right type.
ArchPreset load_preset_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::invalid_argument("architecture file '" + path +
                                "' cannot be opened; check the path (or give a preset name: "
                                "see `ipupod info`)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("architecture file '" + path +
                                "' is not valid JSON: " + brief(e.what()));
  }
  if (!j.is_object())
    throw std::invalid_argument("architecture file '" + path + "' must hold a JSON object");
  const std::string where = "architecture file '" + path + "': ";
  const auto string_at = [&](const char* key) {
    const nlohmann::json& v = j.at(key);
    if (!v.is_string())
      throw std::invalid_argument(where + "field '" + key + "' must be a string, got " + shown(v));
    return v.get<std::string>();
  };
  ArchPreset p;
  if (j.contains("base")) {
    const std::string base_name = string_at("base");
    const ArchPreset* base = find_builtin(base_name);
    if (!base) {
      std::string known;
      for (const auto& b : ArchPreset::all()) known += (known.empty() ? "" : ", ") + b.name;
      throw std::invalid_argument(where + "unknown base preset '" + base_name +
                                  "'; known presets: " + known);
    }
    p = *base;
    p.sources.insert(p.sources.begin(), "based on the built-in preset " + base->name);
  }
  p.name = path;
  // Each figure is checked for its type, sign and range before it is converted: JSON's -1 read
  // into an unsigned size would wrap to 1.8e19 bytes and silence every memory check.
  const auto whole = [&](const char* key, auto& value, std::uint64_t min, std::uint64_t max) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j.at(key);
    // JSON reads 7 as unsigned and -7 as signed; 7.0 is neither.
    const bool unsigned_integer =
        v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
    const std::uint64_t n = unsigned_integer ? v.get<std::uint64_t>() : 0;
    const bool in_range = unsigned_integer && n >= min && n <= max;
    if (!in_range)
      throw std::invalid_argument(where + "field '" + key + "' must be a whole number in [" +
                                  std::to_string(min) + ", " + std::to_string(max) + "], got " +
                                  shown(v) + "; fix it, or drop it to keep the base preset's");
    value = static_cast<std::remove_reference_t<decltype(value)>>(n);
  };
  const auto real = [&](const char* key, double& value, bool zero_allowed) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j.at(key);
    const double x = v.is_number() ? v.get<double>() : 0;
    if (v.is_number() && x > kMaxRealFigure && std::isfinite(x))
      throw std::invalid_argument(
          where + "field '" + key + "' is " + shown(v) +
          ", more than the largest figure a preset takes (1e15); fix it, or "
          "drop it to keep the base preset's");
    if (!v.is_number() || !std::isfinite(x) || x < 0 || (x == 0 && !zero_allowed))
      throw std::invalid_argument(where + "field '" + key + "' must be a finite number " +
                                  (zero_allowed ? ">= 0" : "> 0") + ", got " + shown(v) +
                                  "; fix it, or drop it to keep the base preset's");
    value = x;
  };
  const auto& figures = ArchPreset::figures();
  const auto known = [&](const std::string& key) {
    return key == "base" || key == "name" || key == "description" || key == "sources" ||
           std::find(figures.begin(), figures.end(), key) != figures.end();
  };
  for (const auto& [key, value] : j.items())
    if (!known(key)) throw std::invalid_argument(where + "unknown field '" + key + "'");
  if (j.contains("name")) p.name = string_at("name");
  if (j.contains("description")) p.description = string_at("description");
  whole("tiles", p.tiles, 1, kMaxTiles);
  whole("bytes_per_tile", p.bytes_per_tile, 1, kMaxBytesPerTile);
  real("clock_hz", p.clock_hz, false);
  whole("workers_per_tile", p.workers_per_tile, 1, kMaxLanes);
  real("fp32_flops_per_cycle_per_tile", p.fp32_flops_per_cycle_per_tile, false);
  real("fp16_flops_per_cycle_per_tile", p.fp16_flops_per_cycle_per_tile, true);
  real("fp16_fp32_partials_flops_per_cycle_per_tile", p.fp16_fp32_partials_flops_per_cycle_per_tile,
       true);
  whole("amp_pipeline_depth", p.amp_pipeline_depth, 0, kMaxLanes);
  whole("fp32_vector_width", p.fp32_vector_width, 1, kMaxLanes);
  real("exchange_bytes_per_cycle_per_tile", p.exchange_bytes_per_cycle_per_tile, false);
  whole("exchange_latency_cycles", p.exchange_latency_cycles, 0, kMaxEventCycles);
  whole("sync_cycles_internal", p.sync_cycles_internal, 0, kMaxEventCycles);
  whole("sync_cycles_external", p.sync_cycles_external, 0, kMaxEventCycles);
  whole("vertex_overhead_cycles", p.vertex_overhead_cycles, 0, kMaxEventCycles);
  whole("vertex_state_bytes_per_region", p.vertex_state_bytes_per_region, 0, kMaxBytesPerTile);
  whole("codelet_code_bytes", p.codelet_code_bytes, 0, kMaxBytesPerTile);
  real("host_link_bytes_per_s", p.host_link_bytes_per_s, false);
  if (j.contains("sources")) {
    const nlohmann::json& v = j.at("sources");
    if (!v.is_array() ||
        !std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_string(); }))
      throw std::invalid_argument(where + "field 'sources' must be a list of strings, got " +
                                  shown(v));
    for (const auto& e : v) p.sources.push_back(e.get<std::string>());
  }
  if (p.tiles == 0 || p.bytes_per_tile == 0 || !(p.clock_hz > 0) || p.workers_per_tile == 0 ||
      !(p.fp32_flops_per_cycle_per_tile > 0) || p.fp32_vector_width == 0 ||
      !(p.exchange_bytes_per_cycle_per_tile > 0) || !(p.host_link_bytes_per_s > 0))
    throw std::invalid_argument(
        "architecture file '" + path +
        "' leaves a required figure zero (tiles, bytes_per_tile, clock_hz, workers_per_tile, "
        "fp32_flops_per_cycle_per_tile, fp32_vector_width, exchange_bytes_per_cycle_per_tile, "
        "host_link_bytes_per_s); give a \"base\" preset or set them");
  return p;
}

}  // namespace

const ArchPreset& ArchPreset::get(std::string_view name) {
  if (const ArchPreset* p = find_builtin(name)) return *p;
  if (name.size() > 5 && name.substr(name.size() - 5) == ".json") {
    // Presets loaded from files live as long as the process; a deque keeps references stable.
    static std::mutex mutex;
    static std::deque<std::pair<std::string, ArchPreset>> loaded;
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [path, preset] : loaded)
      if (path == name) return preset;
    ArchPreset preset = load_preset_file(std::string(name));
    return loaded.emplace_back(std::string(name), std::move(preset)).second;
  }
  std::string known;
  for (const auto& p : all()) known += (known.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown architecture '" + std::string(name) +
                              "'; known architectures: " + known +
                              ", or the path of a .json preset file (see `ipupod info`)");
}

}  // namespace ipupod::ipu
