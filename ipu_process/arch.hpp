// Architecture presets: every hardware number the device model uses, with its source.
// A preset is data, listed by `ipupod info`; code never hard-codes these figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ipupod::ipu {

struct ArchPreset {
  std::string name;
  std::string description;
  unsigned tiles = 0;
  std::size_t bytes_per_tile = 0;
  double clock_hz = 0;
  unsigned workers_per_tile = 0;             // hardware worker contexts, barrel-scheduled
  double fp32_flops_per_cycle_per_tile = 0;  // accumulating matrix product (AMP) rate
  double fp16_flops_per_cycle_per_tile = 0;  // float16 operands, float16 partials ("FP16.16")
  double fp16_fp32_partials_flops_per_cycle_per_tile = 0;  // float16 operands, float32 partials
  unsigned amp_pipeline_depth = 0;  // vector loads an AMP engine sums into one output
  unsigned fp32_vector_width = 0;   // float lanes of one vector ALU instruction
  double exchange_bytes_per_cycle_per_tile = 0;
  std::uint64_t exchange_latency_cycles = 0;
  std::uint64_t sync_cycles_internal = 0;         // sync of the tiles of one IPU
  std::uint64_t sync_cycles_external = 0;         // sync across IPUs
  std::uint64_t vertex_overhead_cycles = 0;       // per-vertex call and loop set-up (worker cycles)
  std::size_t vertex_state_bytes_per_region = 0;  // pointer + size per connected region
  std::size_t codelet_code_bytes = 0;             // code of one codelet kind on a tile
  double host_link_bytes_per_s = 0;               // IPU <-> host (PCIe to the gateway)
  std::vector<std::string> sources;               // where each figure comes from

  double peak_fp32_flops() const { return fp32_flops_per_cycle_per_tile * tiles * clock_hz; }
  std::size_t bytes_per_ipu() const { return bytes_per_tile * tiles; }

  // A built-in name, or the path of a JSON file (ending in .json) describing a preset: an
  // optional "base" preset name, then any fields to override, e.g.
  //   {"name": "mk2-half", "base": "mk2", "tiles": 736, "sources": ["half an MK2, hypothetical"]}
  // Throws std::invalid_argument for an unknown name, a bad file or an unknown field.
  static const ArchPreset& get(std::string_view name_or_file);
  static const std::vector<ArchPreset>& all();  // the built-in presets
  // The names of the figures above, as preset files and source lines spell them.
  static const std::vector<std::string>& figures();
};

}  // namespace ipupod::ipu
