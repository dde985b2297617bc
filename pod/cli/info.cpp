// Listings for `ipupod info`.
#include "pod/cli/info.hpp"

#include <iomanip>

#include "fabric/topology.hpp"
#include "ipu_process/arch.hpp"
#include "ipu_process/codelets.hpp"
#include "models/zoo.hpp"

namespace ipupod::pod {
namespace {

void print_arch_table(std::ostream& out) {
  out << "Architectures:\n"
      << "  name  tiles  KiB/tile  MiB/IPU  clock GHz  workers  FP32 TFLOPS  FP16 TFLOPS\n";
  for (const auto& a : ipu::ArchPreset::all())
    out << "  " << std::left << std::setw(6) << a.name << std::right << std::setw(5) << a.tiles
        << std::setw(10) << a.bytes_per_tile / 1024 << std::setw(9) << std::fixed
        << std::setprecision(1) << a.bytes_per_ipu() / 1048576.0 << std::setw(11)
        << std::setprecision(2) << a.clock_hz / 1e9 << std::setw(9) << a.workers_per_tile
        << std::setw(13) << std::setprecision(1) << a.peak_fp32_flops() / 1e12 << std::setw(13)
        << a.fp16_flops_per_cycle_per_tile * a.tiles * a.clock_hz / 1e12 << "\n";
}

void print_arch(const ipu::ArchPreset& a, std::ostream& out) {
  out << a.name << ": " << a.description << "\n"
      << "  tiles                          " << a.tiles << "\n"
      << "  bytes per tile                 " << a.bytes_per_tile << "\n"
      << "  clock                          " << a.clock_hz / 1e9 << " GHz\n"
      << "  worker contexts per tile       " << a.workers_per_tile << "\n"
      << "  FP32 / FP16 FLOP/cycle/tile    " << a.fp32_flops_per_cycle_per_tile << " / "
      << a.fp16_flops_per_cycle_per_tile << " (float32 partials "
      << a.fp16_fp32_partials_flops_per_cycle_per_tile << ")\n"
      << "  AMP pipeline depth             " << a.amp_pipeline_depth << "\n"
      << "  float32 vector width           " << a.fp32_vector_width << "\n"
      << "  exchange bytes/cycle/tile      " << a.exchange_bytes_per_cycle_per_tile << "\n"
      << "  exchange latency cycles        " << a.exchange_latency_cycles << "\n"
      << "  sync cycles internal/external  " << a.sync_cycles_internal << " / "
      << a.sync_cycles_external << "\n"
      << "  vertex overhead cycles         " << a.vertex_overhead_cycles << "\n"
      << "  vertex state bytes per region  " << a.vertex_state_bytes_per_region << "\n"
      << "  code bytes per codelet         " << a.codelet_code_bytes << "\n"
      << "  host link                      " << a.host_link_bytes_per_s / 1e9 << " GB/s\n"
      << "  sources:\n";
  for (const auto& s : a.sources) out << "    - " << s << "\n";
}

nlohmann::json arch_json(const ipu::ArchPreset& a) {
  return {{"description", a.description},
          {"tiles", a.tiles},
          {"bytes_per_tile", a.bytes_per_tile},
          {"bytes_per_ipu", a.bytes_per_ipu()},
          {"clock_hz", a.clock_hz},
          {"workers_per_tile", a.workers_per_tile},
          {"fp32_flops_per_cycle_per_tile", a.fp32_flops_per_cycle_per_tile},
          {"fp16_flops_per_cycle_per_tile", a.fp16_flops_per_cycle_per_tile},
          {"fp16_fp32_partials_flops_per_cycle_per_tile",
           a.fp16_fp32_partials_flops_per_cycle_per_tile},
          {"amp_pipeline_depth", a.amp_pipeline_depth},
          {"fp32_vector_width", a.fp32_vector_width},
          {"exchange_bytes_per_cycle_per_tile", a.exchange_bytes_per_cycle_per_tile},
          {"exchange_latency_cycles", a.exchange_latency_cycles},
          {"sync_cycles_internal", a.sync_cycles_internal},
          {"sync_cycles_external", a.sync_cycles_external},
          {"vertex_overhead_cycles", a.vertex_overhead_cycles},
          {"vertex_state_bytes_per_region", a.vertex_state_bytes_per_region},
          {"codelet_code_bytes", a.codelet_code_bytes},
          {"host_link_bytes_per_s", a.host_link_bytes_per_s},
          {"sources", a.sources}};
}

// Sizes, and the IPUs of each machine as ranges of consecutive IPU numbers.
nlohmann::json topology_json(const fabric::Topology& t) {
  nlohmann::json machines = nlohmann::json::array();
  for (int ipu = 0; ipu < t.ipus(); ++ipu) {
    const fabric::IpuLocation at = t.location(ipu);
    if (!machines.empty() && machines.back()["pod"] == at.pod &&
        machines.back()["machine"] == at.machine && machines.back()["last_ipu"] == ipu - 1) {
      machines.back()["last_ipu"] = ipu;
      continue;
    }
    machines.push_back(
        {{"pod", at.pod}, {"machine", at.machine}, {"first_ipu", ipu}, {"last_ipu", ipu}});
  }
  return {{"ipus", t.ipus()},
          {"pods", t.pods()},
          {"machines_per_pod", t.machines_per_pod()},
          {"ipus_per_machine", t.ipus_per_machine()},
          {"machines", machines}};
}

}  // namespace

nlohmann::json info_json(const InfoRequest& r) {
  nlohmann::json out;
  if (!r.topology.empty()) {
    out["topology"] = topology_json(fabric::Topology::preset(r.topology));
    out["topology"]["name"] = r.topology;
    return out;
  }
  for (const auto& a : ipu::ArchPreset::all()) out["architectures"][a.name] = arch_json(a);
  for (const auto& name : fabric::Topology::preset_names())
    out["topologies"][name] = topology_json(fabric::Topology::preset(name));
  out["models"] = nlohmann::json::object();
  for (const auto& e : models::zoo()) out["models"][e.name] = {{"description", e.description}};
  out["codelets"] = nlohmann::json::array();
  for (const auto& [name, c] : ipu::CodeletRegistry::builtin().all())
    out["codelets"].push_back({{"name", name}, {"fields", c.fields}});
  out["defaults"] = r.defaults;
  return out;
}

void print_info(const InfoRequest& r, std::ostream& out) {
  const bool brief =
      r.arch.empty() && r.topology.empty() && r.model.empty() && !r.codelets && !r.models;
  if (!r.arch.empty()) print_arch(ipu::ArchPreset::get(r.arch), out);
  if (!r.topology.empty()) out << fabric::Topology::preset(r.topology).describe();
  if (!r.model.empty()) {
    models::ModelOptions options;
    options.micro_batch = 1;  // each model's own default sample shape and full size
    options.loss = r.loss;
    out << models::build_model(r.model, options).summary() << "  (shown for micro-batch 1)\n";
  }
  if (brief) print_arch_table(out);
  if (brief || !r.topology.empty()) {
    out << "Topologies:";
    for (const auto& name : fabric::Topology::preset_names()) out << " " << name;
    out << "  (ipupod info --topology NAME)\n";
  }
  if (r.codelets) {
    out << "Codelets:\n";
    for (const auto& [name, c] : ipu::CodeletRegistry::builtin().all()) {
      out << "  " << name << "(";
      for (std::size_t i = 0; i < c.fields.size(); ++i) out << (i ? ", " : "") << c.fields[i];
      out << ")\n      " << c.doc << "\n";
    }
  } else if (brief) {
    out << "Codelets: " << ipu::CodeletRegistry::builtin().all().size()
        << "  (ipupod info --codelets)\n";
  }
  if (brief || r.models) {
    out << "Models:\n";
    for (const auto& e : models::zoo()) out << "  " << e.name << "  " << e.description << "\n";
  }
}

}  // namespace ipupod::pod
