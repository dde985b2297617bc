// Run reports: the memory report of an IPU as JSON (memory.json) and the helpers that write
// the run directory's files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "ipu_process/arch.hpp"
#include "ipu_process/engine.hpp"

namespace ipupod::pod {

nlohmann::json memory_report_json(const ipu::MemoryReport& report, const ipu::ArchPreset& arch);
// Events of one IPU's predicted timeline as Chrome trace-event objects (microseconds on the
// architecture's clock); the host adds the IPU as "pid".
nlohmann::json trace_json(const std::vector<ipu::TraceEvent>& events, const ipu::ArchPreset& arch);
// Appends one IPU's events (from trace_json) to a trace's "traceEvents" as process `ipu`, named
// `label`, with one named thread per kind of work (integer tids, as Perfetto's importer wants).
void append_ipu_trace(nlohmann::json& trace_events, nlohmann::json events, std::size_t ipu,
                      const std::string& label);
// Writes text to dir/name through a temporary file and a rename, so a reader never sees half.
void write_file_atomically(const std::string& dir, const std::string& name,
                           const std::string& text);

}  // namespace ipupod::pod
