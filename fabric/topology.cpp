// Topology presets (numbers with their sources), user topology files, and the link cost
// model of the ring all-reduce and the cross-IPU sync.
#include "fabric/topology.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "json_text/json_text.hpp"

namespace ipupod::fabric {
namespace {

// IPU-Link numbers: GC200 specification, 10 IPU-Links per IPU, 320 GB/s, i.e. 32 GB/s per link;
// a ring edge uses one link. No public figure gives a link's latency: it is an
// order-of-magnitude figure that moves no public configuration's prediction by more than 1%
// (an all-reduce of megabytes is bandwidth-bound), so it is neither sourced nor fitted.
constexpr const char* kLinkLatency =
    "latency: no public figure; bandwidth-bound collectives make it immaterial (under 1% on "
    "every configuration of docs/calibration.md)";
LinkClass ipu_link_within_machine() {
  return {"IPU-Link (within machine)", 32e9, 1e-6,
          std::string("GC200 specification: 10 IPU-Links, 320 GB/s -> 32 GB/s per link, one link "
                      "per ring edge; ") +
              kLinkLatency};
}

LinkClass ipu_link_between_machines() {
  return {"IPU-Link (between machines)", 32e9, 2e-6,
          std::string("the same IPU-Links over cables between IPU-M2000s (IPU-POD64 reference "
                      "design: 2-D torus of IPU-Links); ") +
              kLinkLatency};
}

// GW-Link: IPU-M2000 datasheet, 2 x 100 Gbps GW-Links to other machines.
LinkClass gw_link() {
  return {"GW-Link (between pods)", 100e9 / 8.0, 10e-6,
          std::string("IPU-M2000 datasheet: 2 x 100 Gbps GW-Links -> 12.5 GB/s per link, one link "
                      "per ring edge; ") +
              kLinkLatency};
}

// Bow-2000 datasheet: IPU-Link 512 Gbps; Graphcore's C600 documentation says an IPU-Link cable
// carries 2 IPU-Links, so 256 Gbps = 32 GB/s per link, as on the MK2.
LinkClass bow(LinkClass link) {
  link.source =
      "Bow-2000 datasheet: 512 Gbps per IPU-Link cable, which carries 2 links (Graphcore C600 "
      "documentation) = 32 GB/s per link, as MK2. MK2: " +
      link.source;
  return link;
}

// Syncs: within a machine, globalSyncCycles 500 of an early Poplar IPUModel preset at the IPU
// clock; wider scopes by the sync model of PopLibs' 2018 tools (single_conv_layer's
// setGlobalSyncLatency: 15 ns per hop each way over 1 + IPUs / 4 hops), for the pod's IPUs
// and for all the pods' IPUs (a POD64 0.51 us, a POD256 1.95 us), at least the machine's.
constexpr double kGlobalSyncCycles = 500.0;
constexpr double kSyncSecondsPerHop = 15e-9;
double hop_sync_seconds(int ipus) {
  return 2.0 * kSyncSecondsPerHop * (1 + ipus / 4);
}
SyncCosts sync_costs(double clock_hz, const char* chip, int ipus_per_pod, int ipus) {
  const double machine = kGlobalSyncCycles / clock_hz;
  return {machine, std::max(machine, hop_sync_seconds(ipus_per_pod)),
          std::max(machine, hop_sync_seconds(ipus)),
          std::string("within a machine: globalSyncCycles 500 of an early Poplar IPUModel preset "
                      "at the ") +
              chip +
              " clock; within a pod and between pods: PopLibs' 2018 sync model (15 ns per hop "
              "each way, 1 + IPUs/4 hops) for the pod's and all pods' IPUs, at least the "
              "machine's"};
}
constexpr double kMk2ClockHz = 1.33e9;
constexpr double kBowClockHz = 1.85e9;

// IPU-M2000 = 4 IPUs; POD16 = 4 M2000; POD64 = 16 M2000 on a 2-D torus of IPU-Links; POD128 =
// 2 x POD64 over GW-Links (all REFERENCES.md); POD256 = 4 x POD64 the same way. Bow-2000 and
// Bow Pods have the same shapes.
struct PresetShape {
  const char* name;
  bool is_bow;
  int pods;
  int machines_per_pod;
  int ipus_per_machine;
  const char* layout;
};
constexpr const char* kMachine = "4 IPUs joined by IPU-Links inside one machine";
constexpr const char* kPod16 = "4 machines joined by IPU-Links, one host server";
constexpr const char* kPod64 =
    "16 machines, 2-D torus of IPU-Links (the model gives each ring edge one full link)";
constexpr const char* kPod128 = "2 x POD64 joined by GW-Links";
constexpr const char* kPod256 = "4 x POD64 joined by GW-Links";
constexpr PresetShape kPresets[] = {
    {"m2000", false, 1, 1, 4, kMachine},     {"pod16", false, 1, 4, 4, kPod16},
    {"pod64", false, 1, 16, 4, kPod64},      {"pod128", false, 2, 16, 4, kPod128},
    {"pod256", false, 4, 16, 4, kPod256},    {"bow-2000", true, 1, 1, 4, kMachine},
    {"bow-pod16", true, 1, 4, 4, kPod16},    {"bow-pod64", true, 1, 16, 4, kPod64},
    {"bow-pod128", true, 2, 16, 4, kPod128}, {"bow-pod256", true, 4, 16, 4, kPod256},
};

TopologySpec preset_spec(const PresetShape& preset) {
  TopologySpec spec;
  spec.name = preset.name;
  spec.pods = preset.pods;
  spec.machines_per_pod = preset.machines_per_pod;
  spec.ipus_per_machine = preset.ipus_per_machine;
  spec.within_machine = ipu_link_within_machine();
  spec.between_machines = ipu_link_between_machines();
  spec.between_pods = gw_link();
  const int ipus_per_pod = preset.machines_per_pod * preset.ipus_per_machine;
  spec.sync = sync_costs(kMk2ClockHz, "MK2 GC200", ipus_per_pod, preset.pods * ipus_per_pod);
  if (preset.is_bow) {
    spec.within_machine = bow(spec.within_machine);
    spec.between_machines = bow(spec.between_machines);
    spec.between_pods = bow(spec.between_pods);
    spec.sync = sync_costs(kBowClockHz, "Bow", ipus_per_pod, preset.pods * ipus_per_pod);
  }
  spec.layout = preset.layout;
  return spec;
}

std::string format_rate(double bytes_per_s) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f GB/s", bytes_per_s / 1e9);
  return text;
}

std::string format_time(double seconds) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f us", seconds * 1e6);
  return text;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// --- topology files -------------------------------------------------------------------------

using Json = nlohmann::json;

// The most pods, machines per pod or IPUs per machine a file may give (a Graphcore pod has at
// most 256 IPUs); their product is checked against int as well.
constexpr std::int64_t kMaxTopologyCount = 1 << 16;

using json_text::brief;
using json_text::shown;

[[noreturn]] void file_error(const std::string& origin, const std::string& what) {
  throw FabricError("topology file " + origin + ": " + what);
}

void reject_unknown_keys(const Json& object, std::initializer_list<const char*> known,
                         const std::string& origin, const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    (void)value;
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      file_error(origin, "unknown key '" + key + "' in " + where + "; expected one of: " + list);
    }
  }
}

const Json& object_at(const Json& parent, const char* key, const std::string& origin,
                      const std::string& where) {
  const Json& value = parent.at(key);
  if (!value.is_object()) file_error(origin, where + "." + key + " must be a JSON object");
  return value;
}

double number_at(const Json& parent, const char* key, const std::string& origin,
                 const std::string& where) {
  const Json& value = parent.at(key);
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
    file_error(origin, where + "." + key + " must be a finite number >= 0, got " + shown(value));
  }
  return value.get<double>();
}

std::string string_at(const Json& parent, const char* key, const std::string& origin,
                      const std::string& where) {
  const Json& value = parent.at(key);
  if (!value.is_string())
    file_error(origin,
               (where.empty() ? "" : where + ".") + key + " must be a string, got " + shown(value));
  return value.get<std::string>();
}

int count_at(const Json& parent, const char* key, const std::string& origin) {
  const Json& value = parent.at(key);
  // Checked before the conversion to int, which would wrap 2^32 + 1 to 1.
  if (!value.is_number_integer() || value.get<std::int64_t>() < 1 ||
      value.get<std::int64_t>() > kMaxTopologyCount) {
    file_error(origin, std::string(key) + " must be a whole number in [1, " +
                           std::to_string(kMaxTopologyCount) + "], got " + shown(value));
  }
  return static_cast<int>(value.get<std::int64_t>());
}

void read_link(const Json& links, const char* key, LinkClass& link, bool required,
               const std::string& origin) {
  if (!links.contains(key)) {
    if (required)
      file_error(origin, std::string("links.") + key + " is missing (or give a \"base\" preset)");
    return;
  }
  const std::string where = std::string("links.") + key;
  const Json& entry = object_at(links, key, origin, "links");
  reject_unknown_keys(entry, {"name", "bandwidth_gbytes_per_s", "latency_us", "source"}, origin,
                      where);
  if (entry.contains("name")) link.name = string_at(entry, "name", origin, where);
  if (entry.contains("bandwidth_gbytes_per_s")) {
    link.bandwidth_bytes_per_s = number_at(entry, "bandwidth_gbytes_per_s", origin, where) * 1e9;
  } else if (required) {
    file_error(origin, where + ".bandwidth_gbytes_per_s is missing");
  }
  if (entry.contains("latency_us")) {
    link.latency_s = number_at(entry, "latency_us", origin, where) * 1e-6;
  } else if (required) {
    file_error(origin, where + ".latency_us is missing");
  }
  link.source = entry.contains("source") ? string_at(entry, "source", origin, where)
                                         : "user topology file " + origin;
}

TopologySpec parse_topology(const Json& root, const std::string& origin) {
  if (!root.is_object()) file_error(origin, "the top level must be a JSON object");
  reject_unknown_keys(root,
                      {"name", "base", "pods", "machines_per_pod", "ipus_per_machine", "links",
                       "sync_us", "layout"},
                      origin, "the top level");
  TopologySpec spec;
  const bool has_base = root.contains("base");
  if (has_base) {
    // A built-in preset only: a file as the base could name itself (or a cycle of files) and
    // be followed for ever.
    const std::string base = string_at(root, "base", origin, "");
    const auto names = Topology::preset_names();
    if (std::find(names.begin(), names.end(), base) == names.end()) {
      std::string known;
      for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
      file_error(origin, "base '" + base.substr(0, 64) +
                             "' is not a built-in preset; known presets: " + known +
                             " (a topology file cannot be the base of another)");
    }
    spec = Topology::preset(base).spec();
  }
  spec.name = root.contains("name") ? string_at(root, "name", origin, "") : origin;
  for (const char* key : {"pods", "machines_per_pod", "ipus_per_machine"}) {
    if (!root.contains(key)) file_error(origin, std::string(key) + " is missing");
  }
  spec.pods = count_at(root, "pods", origin);
  spec.machines_per_pod = count_at(root, "machines_per_pod", origin);
  spec.ipus_per_machine = count_at(root, "ipus_per_machine", origin);
  spec.layout = root.contains("layout") ? string_at(root, "layout", origin, "")
                                        : "from topology file " + origin;

  if (!root.contains("links") && !has_base)
    file_error(origin, "links is missing (or give a \"base\" preset)");
  if (root.contains("links")) {
    const Json& links = object_at(root, "links", origin, "the top level");
    reject_unknown_keys(links, {"within_machine", "between_machines", "between_pods"}, origin,
                        "links");
    if (!has_base) {
      spec.within_machine.name = "IPU-Link (within machine)";
      spec.between_machines.name = "IPU-Link (between machines)";
      spec.between_pods.name = "GW-Link (between pods)";
    }
    read_link(links, "within_machine", spec.within_machine, !has_base, origin);
    read_link(links, "between_machines", spec.between_machines, !has_base, origin);
    read_link(links, "between_pods", spec.between_pods, !has_base, origin);
  }

  if (!root.contains("sync_us") && !has_base)
    file_error(origin, "sync_us is missing (or give a \"base\" preset)");
  if (root.contains("sync_us")) {
    const Json& sync = object_at(root, "sync_us", origin, "the top level");
    reject_unknown_keys(sync, {"within_machine", "within_pod", "between_pods", "source"}, origin,
                        "sync_us");
    const std::pair<const char*, double*> fields[] = {
        {"within_machine", &spec.sync.within_machine_s},
        {"within_pod", &spec.sync.within_pod_s},
        {"between_pods", &spec.sync.between_pods_s}};
    for (const auto& [key, target] : fields) {
      if (sync.contains(key)) {
        *target = number_at(sync, key, origin, "sync_us") * 1e-6;
      } else if (!has_base) {
        file_error(origin, std::string("sync_us.") + key + " is missing");
      }
    }
    spec.sync.source = sync.contains("source") ? string_at(sync, "source", origin, "sync_us")
                                               : "user topology file " + origin;
  }
  return spec;
}

}  // namespace

Topology::Topology(TopologySpec spec) : spec_(std::move(spec)) {
  if (spec_.pods < 1 || spec_.machines_per_pod < 1 || spec_.ipus_per_machine < 1) {
    throw FabricError("Topology '" + spec_.name +
                      "': pods, machines per pod and IPUs per machine must all be at least 1, "
                      "got " +
                      std::to_string(spec_.pods) + ", " + std::to_string(spec_.machines_per_pod) +
                      ", " + std::to_string(spec_.ipus_per_machine));
  }
  // ipus() multiplies them as int.
  if (static_cast<std::int64_t>(spec_.pods) * spec_.machines_per_pod * spec_.ipus_per_machine >
      std::numeric_limits<int>::max()) {
    throw FabricError("Topology '" + spec_.name + "': " + std::to_string(spec_.pods) + " pods x " +
                      std::to_string(spec_.machines_per_pod) + " machines x " +
                      std::to_string(spec_.ipus_per_machine) +
                      " IPUs is more IPUs than an MPI job can number; lower one of them");
  }
  for (const LinkClass* link :
       {&spec_.within_machine, &spec_.between_machines, &spec_.between_pods}) {
    if (!(link->bandwidth_bytes_per_s > 0.0) || !std::isfinite(link->bandwidth_bytes_per_s) ||
        !(link->latency_s >= 0.0) || !std::isfinite(link->latency_s)) {
      throw FabricError("Topology '" + spec_.name + "': link class '" + link->name +
                        "' needs a finite bandwidth > 0 and latency >= 0, got " +
                        std::to_string(link->bandwidth_bytes_per_s) + " B/s and " +
                        std::to_string(link->latency_s) + " s");
    }
  }
  const SyncCosts& sync = spec_.sync;
  if (!(sync.within_machine_s >= 0.0) || !(sync.within_pod_s >= 0.0) ||
      !(sync.between_pods_s >= 0.0)) {
    throw FabricError("Topology '" + spec_.name + "': sync costs must be >= 0 seconds");
  }
}

Topology::Topology(std::string name, int pods, int machines_per_pod, int ipus_per_machine,
                   LinkClass within_machine, LinkClass between_machines, LinkClass between_pods)
    : Topology(TopologySpec{std::move(name), pods, machines_per_pod, ipus_per_machine,
                            std::move(within_machine), std::move(between_machines),
                            std::move(between_pods), SyncCosts{}, ""}) {}

std::vector<std::string> Topology::preset_names() {
  std::vector<std::string> names;
  for (const PresetShape& preset : kPresets) names.emplace_back(preset.name);
  return names;
}

Topology Topology::preset(std::string_view name) {
  for (const PresetShape& preset : kPresets) {
    if (name == preset.name) return Topology(preset_spec(preset));
  }
  if (ends_with(name, ".json")) return from_json_file(std::string(name));
  std::string known;
  for (const std::string& preset : preset_names()) known += (known.empty() ? "" : ", ") + preset;
  throw FabricError("unknown topology preset '" + std::string(name) + "'; known presets: " + known +
                    " (or the path of a JSON topology file ending in .json)");
}

Topology Topology::from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw FabricError("topology file " + path +
                      ": cannot be opened; check the path (relative paths start at the "
                      "working directory)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

Topology Topology::from_json_text(std::string_view text, const std::string& origin) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& error) {
    file_error(origin, "is not valid JSON: " + brief(error.what()));
  }
  try {
    return Topology(parse_topology(root, origin));
  } catch (const FabricError& error) {
    // Topology's own checks (a bandwidth of 0, say) name the topology: say which file it is.
    const std::string what = error.what();
    if (what.starts_with("topology file ")) throw;
    file_error(origin, what);
  } catch (const Json::exception& error) {
    file_error(origin, "has a value of the wrong type: " + brief(error.what()));
  }
}

void Topology::check_ipu(int ipu, const char* what) const {
  if (ipu < 0 || ipu >= ipus()) {
    throw FabricError(std::string(what) + ": IPU " + std::to_string(ipu) +
                      " is out of range for topology '" + spec_.name + "', expected 0.." +
                      std::to_string(ipus() - 1) + "; pick a larger preset or fewer IPUs");
  }
}

IpuLocation Topology::location(int ipu) const {
  check_ipu(ipu, "Topology::location");
  const int per_pod = spec_.machines_per_pod * spec_.ipus_per_machine;
  return {ipu / per_pod, (ipu % per_pod) / spec_.ipus_per_machine, ipu % spec_.ipus_per_machine};
}

int Topology::machine_of(int ipu) const {
  check_ipu(ipu, "Topology::machine_of");
  return ipu / spec_.ipus_per_machine;
}

const LinkClass& Topology::link(int a, int b) const {
  check_ipu(a, "Topology::link");
  check_ipu(b, "Topology::link");
  if (a == b) {
    throw FabricError("Topology::link: IPU " + std::to_string(a) +
                      " has no link to itself; a ring must list distinct IPUs");
  }
  const IpuLocation la = location(a);
  const IpuLocation lb = location(b);
  if (la.pod != lb.pod) return spec_.between_pods;
  if (la.machine != lb.machine) return spec_.between_machines;
  return spec_.within_machine;
}

std::vector<LinkClass> Topology::link_classes() const {
  return {spec_.within_machine, spec_.between_machines, spec_.between_pods};
}

std::string Topology::describe() const {
  std::ostringstream out;
  out << "Topology " << spec_.name << ": " << spec_.pods << " pod(s) x " << spec_.machines_per_pod
      << " machine(s) x " << spec_.ipus_per_machine << " IPU(s) = " << ipus() << " IPUs\n";
  if (!spec_.layout.empty()) out << "  " << spec_.layout << "\n";
  out << "  pod  machine  IPUs\n";
  for (int pod = 0; pod < spec_.pods; ++pod) {
    for (int machine = 0; machine < spec_.machines_per_pod; ++machine) {
      const int first = (pod * spec_.machines_per_pod + machine) * spec_.ipus_per_machine;
      char row[96];
      std::snprintf(row, sizeof row, "  %3d  %7d  %d..%d\n", pod, machine, first,
                    first + spec_.ipus_per_machine - 1);
      out << row;
    }
  }
  out << "Link classes:\n";
  for (const LinkClass& link : link_classes()) {
    out << "  " << link.name << ": " << format_rate(link.bandwidth_bytes_per_s) << ", "
        << format_time(link.latency_s) << "  [" << link.source << "]\n";
  }
  const SyncCosts& sync = spec_.sync;
  out << "Cross-IPU sync: within a machine " << format_time(sync.within_machine_s)
      << ", across machines " << format_time(sync.within_pod_s) << ", across pods "
      << format_time(sync.between_pods_s) << "  [" << sync.source << "]\n";
  return out.str();
}

void check_ipu_group(const Topology& topo, std::span<const int> ipus, const char* what) {
  std::set<int> seen;
  for (int ipu : ipus) {
    if (ipu < 0 || ipu >= topo.ipus()) {
      throw FabricError(std::string(what) + ": IPU " + std::to_string(ipu) +
                        " is out of range for topology '" + topo.name() + "', expected 0.." +
                        std::to_string(topo.ipus() - 1));
    }
    if (!seen.insert(ipu).second) {
      throw FabricError(std::string(what) + ": IPU " + std::to_string(ipu) +
                        " appears twice in the group; list each IPU once");
    }
  }
}

double predict_all_reduce_seconds(const Topology& topo, std::span<const int> ipus,
                                  std::size_t bytes) {
  check_ipu_group(topo, ipus, "predict_all_reduce_seconds");
  const std::size_t n = ipus.size();
  if (n < 2 || bytes == 0) return 0.0;
  const double chunk_bytes = static_cast<double>(bytes) / static_cast<double>(n);
  double slowest_step = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const LinkClass& edge = topo.link(ipus[i], ipus[(i + 1) % n]);
    slowest_step =
        std::max(slowest_step, edge.latency_s + chunk_bytes / edge.bandwidth_bytes_per_s);
  }
  return 2.0 * static_cast<double>(n - 1) * slowest_step;
}

double predict_barrier_seconds(const Topology& topo, std::span<const int> ipus) {
  check_ipu_group(topo, ipus, "predict_barrier_seconds");
  if (ipus.size() < 2) return 0.0;
  std::set<int> pods;
  std::set<int> machines;
  for (int ipu : ipus) {
    pods.insert(topo.location(ipu).pod);
    machines.insert(topo.machine_of(ipu));
  }
  if (pods.size() > 1) return topo.sync().between_pods_s;
  if (machines.size() > 1) return topo.sync().within_pod_s;
  return topo.sync().within_machine_s;
}

}  // namespace ipupod::fabric
