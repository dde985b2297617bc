// The built-in architecture presets (MK1, MK2, Bow and a tiny test IPU) and their sources.
// Figures marked "assumed" have no public source yet and are the first to calibrate.
#include "ipu_process/arch.hpp"

#include <stdexcept>

namespace ipupod::ipu {
namespace {

// Shared by every preset until a measurement says otherwise.
constexpr const char* kAssumedOverheads =
    "exchange latency, internal sync, per-vertex overhead, vertex state and code size: "
    "assumed, to be calibrated";

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
      "tiles, SRAM per tile, clock, workers, FP32/FP16 FLOP per cycle per tile: Graphcore GC200 "
      "datasheet (62.5 TFLOPS FP32, ~250 TFLOPS FP16 at 1472 tiles x 1.33 GHz)",
      "exchange 4 bytes/cycle/tile: ~8 TB/s on-chip exchange / 1472 tiles / 1.33 GHz; Jia et al. "
      "arXiv 1912.03413",
      "vector width 2 x float32 (64-bit SIMD): Jia et al. arXiv 1912.03413",
      "external sync 500 cycles: globalSyncCycles of an early Poplar IPUModel preset",
      "host link: PCIe Gen4 x8 per IPU to the IPU-Gateway (16 GT/s x 8 lanes, 128b/130b)",
      kAssumedOverheads};
  p.push_back(mk2);

  ArchPreset mk1 = mk2;
  mk1.name = "mk1";
  mk1.description = "Colossus MK1 GC2 (C2 card)";
  mk1.tiles = 1216;
  mk1.bytes_per_tile = 256 * 1024;
  mk1.clock_hz = 1.6e9;
  mk1.fp32_flops_per_cycle_per_tile = 16;
  mk1.fp16_flops_per_cycle_per_tile = 64;
  mk1.sources = {
      "tiles, SRAM per tile, clock: Jia et al. arXiv 1912.03413",
      "FLOP per cycle per tile: 31.1 TFLOPS FP32 and 124.5 TFLOPS FP16 / 1216 tiles / 1.6 GHz",
      "exchange 4 bytes/cycle/tile, vector width: Jia et al. arXiv 1912.03413",
      "external sync 500 cycles: globalSyncCycles of an early Poplar IPUModel preset",
      "host link: as MK2 (assumed)",
      kAssumedOverheads};
  p.push_back(mk1);

  ArchPreset bow = mk2;
  bow.name = "bow";
  bow.description = "Bow IPU (Bow-2000)";
  bow.clock_hz = 1.85e9;
  bow.sources = {"tiles, SRAM per tile: as GC200 (Graphcore Bow-2000 datasheet)",
                 "clock 1.85 GHz and 350 TFLOPS FP16 (= 128 FLOP/cycle/tile): Bow-2000 datasheet",
                 "FP32 32 FLOP/cycle/tile: same ratio as GC200, unverified",
                 "exchange, vector width, sync, host link: as MK2", kAssumedOverheads};
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

const std::vector<ArchPreset>& ArchPreset::all() {
  static const std::vector<ArchPreset> presets = make_presets();
  return presets;
}

const ArchPreset& ArchPreset::get(std::string_view name) {
  std::string known;
  for (const auto& p : all()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw std::invalid_argument("unknown architecture '" + std::string(name) +
                              "'; known architectures: " + known + " (see `ipupod info`)");
}

}  // namespace ipupod::ipu
