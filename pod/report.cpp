// JSON forms of the device reports and atomic file output.
#include "pod/report.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace ipupod::pod {

nlohmann::json memory_report_json(const ipu::MemoryReport& report, const ipu::ArchPreset& arch) {
  nlohmann::json tiles = nlohmann::json::array();
  for (const auto& t : report.tiles) {
    nlohmann::json by_category = nlohmann::json::object();
    for (const auto& [category, bytes] : t.by_category)
      by_category[ipu::category_name(category)] = bytes;
    const auto named = [](const std::vector<ipu::TensorMemory>& tensors) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& tensor : tensors)
        out.push_back({{"name", tensor.name},
                       {"category", ipu::category_name(tensor.category)},
                       {"bytes", tensor.bytes}});
      return out;
    };
    nlohmann::json at_peak = nlohmann::json::object();
    for (const auto& [category, bytes] : t.peak_by_category)
      at_peak[ipu::category_name(category)] = bytes;
    tiles.push_back({{"tile", t.tile},
                     {"total", t.total()},
                     {"always_live", t.always_live},
                     {"not_always_live", t.not_always_live},
                     {"peak_live", t.peak_live},
                     {"gaps", t.gaps()},
                     {"vertex_state", t.vertex_state},
                     {"code", t.code},
                     {"by_category", by_category},
                     {"largest", named(t.largest)},
                     {"peak_by_category", at_peak},
                     {"live_at_peak", named(t.live_at_peak)}});
  }
  const auto& busiest = report.busiest();
  return {{"arch", report.arch},
          {"tiles", arch.tiles},
          {"bytes_per_tile", report.bytes_per_tile},
          {"total_bytes", report.total_bytes()},
          {"capacity_bytes", arch.bytes_per_ipu()},
          {"busiest_tile", busiest.tile},
          {"busiest_tile_bytes", busiest.total()},
          {"tiles_over_capacity", report.tiles_over()},
          {"per_tile", tiles}};
}

namespace {
// The trace's threads of an IPU, one per kind of work, in this order (tid = index + 1).
constexpr const char* kTraceThreads[] = {"compute", "exchange", "sync", "host", "fabric"};

int trace_thread(const char* category) {
  for (std::size_t i = 0; i < std::size(kTraceThreads); ++i)
    if (std::string_view(category) == kTraceThreads[i]) return static_cast<int>(i) + 1;
  return static_cast<int>(std::size(kTraceThreads)) + 1;  // an unknown kind: its own thread
}
}  // namespace

nlohmann::json trace_json(const std::vector<ipu::TraceEvent>& events, const ipu::ArchPreset& arch) {
  nlohmann::json out = nlohmann::json::array();
  const double us_per_cycle = 1e6 / arch.clock_hz;
  for (const auto& e : events)
    out.push_back({{"name", e.name},
                   {"cat", e.category},
                   {"ph", "X"},
                   {"ts", static_cast<double>(e.start_cycles) * us_per_cycle},
                   {"dur", static_cast<double>(e.cycles) * us_per_cycle},
                   {"tid", trace_thread(e.category)}});
  return out;
}

void append_ipu_trace(nlohmann::json& trace_events, nlohmann::json events, std::size_t ipu,
                      const std::string& label) {
  const auto metadata = [&](const char* name, int tid, nlohmann::json args) {
    nlohmann::json m = {{"name", name}, {"ph", "M"}, {"pid", ipu}, {"args", std::move(args)}};
    if (tid > 0) m["tid"] = tid;
    trace_events.push_back(std::move(m));
  };
  metadata("process_name", 0, {{"name", label}});
  metadata("process_sort_index", 0, {{"sort_index", ipu}});
  for (std::size_t i = 0; i < std::size(kTraceThreads); ++i) {
    metadata("thread_name", static_cast<int>(i) + 1, {{"name", kTraceThreads[i]}});
    metadata("thread_sort_index", static_cast<int>(i) + 1, {{"sort_index", i}});
  }
  for (auto& event : events) {
    event["pid"] = ipu;
    trace_events.push_back(std::move(event));
  }
}

void write_file_atomically(const std::string& dir, const std::string& name,
                           const std::string& text) {
  const std::filesystem::path final_path = std::filesystem::path(dir) / name;
  const std::filesystem::path tmp = final_path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out)
      throw std::runtime_error("cannot write " + tmp.string() + ": check the run directory");
  }
  std::filesystem::rename(tmp, final_path);
}

}  // namespace ipupod::pod
