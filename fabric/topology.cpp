// Topology presets (numbers with their sources) and the link cost model of the collectives.
#include "fabric/topology.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

namespace ipupod::fabric {
namespace {

// IPU-Link numbers. REFERENCES.md: MK2 has 10 IPU-Links per IPU, ~320 GB/s aggregate
// (secondary source), i.e. 32 GB/s per link; a ring edge is assumed to use one link.
LinkClass ipu_link_within_machine() {
  return {"IPU-Link (within machine)", 32e9, 1e-6,
          "MK2: 10 IPU-Links/IPU, ~320 GB/s aggregate (REFERENCES.md, secondary source) -> "
          "32 GB/s per link; one link per ring edge and 1 us latency assumed, to be calibrated"};
}

LinkClass ipu_link_between_machines() {
  return {"IPU-Link (between machines)", 32e9, 2e-6,
          "same IPU-Link as within a machine (REFERENCES.md); 2 us latency over the cable "
          "assumed, to be calibrated"};
}

// GW-Link: REFERENCES.md: IPU-M2000 has 2 x 100 Gbps GW-Links to other machines.
LinkClass gw_link() {
  return {"GW-Link (between pods)", 100e9 / 8.0, 10e-6,
          "IPU-M2000: 2 x 100 Gbps GW-Links (REFERENCES.md) -> 12.5 GB/s per link; one link "
          "per ring edge and 10 us latency assumed, to be calibrated"};
}

// IPU-M2000 = 4 IPUs; POD16 = 4 M2000; POD64 = 16 M2000; POD128 = 2 x POD64 over GW-Links
// (all REFERENCES.md).
struct PresetShape {
  const char* name;
  int pods;
  int machines_per_pod;
  int ipus_per_machine;
};
constexpr PresetShape kPresets[] = {
    {"m2000", 1, 1, 4},
    {"pod16", 1, 4, 4},
    {"pod64", 1, 16, 4},
    {"pod128", 2, 16, 4},
};

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

}  // namespace

Topology::Topology(std::string name, int pods, int machines_per_pod, int ipus_per_machine,
                   LinkClass within_machine, LinkClass between_machines, LinkClass between_pods)
    : name_(std::move(name)),
      pods_(pods),
      machines_per_pod_(machines_per_pod),
      ipus_per_machine_(ipus_per_machine),
      within_machine_(std::move(within_machine)),
      between_machines_(std::move(between_machines)),
      between_pods_(std::move(between_pods)) {
  if (pods < 1 || machines_per_pod < 1 || ipus_per_machine < 1) {
    throw FabricError("Topology '" + name_ + "': pods, machines per pod and IPUs per machine " +
                      "must all be at least 1, got " + std::to_string(pods) + ", " +
                      std::to_string(machines_per_pod) + ", " + std::to_string(ipus_per_machine));
  }
  for (const LinkClass* link : {&within_machine_, &between_machines_, &between_pods_}) {
    if (!(link->bandwidth_bytes_per_s > 0.0) || !(link->latency_s >= 0.0)) {
      throw FabricError("Topology '" + name_ + "': link class '" + link->name +
                        "' needs bandwidth > 0 and latency >= 0, got " +
                        std::to_string(link->bandwidth_bytes_per_s) + " B/s and " +
                        std::to_string(link->latency_s) + " s");
    }
  }
}

std::vector<std::string> Topology::preset_names() {
  std::vector<std::string> names;
  for (const PresetShape& preset : kPresets) names.emplace_back(preset.name);
  return names;
}

Topology Topology::preset(std::string_view name) {
  for (const PresetShape& preset : kPresets) {
    if (name == preset.name) {
      return Topology(preset.name, preset.pods, preset.machines_per_pod, preset.ipus_per_machine,
                      ipu_link_within_machine(), ipu_link_between_machines(), gw_link());
    }
  }
  std::string known;
  for (const std::string& preset : preset_names()) known += (known.empty() ? "" : ", ") + preset;
  throw FabricError("unknown topology preset '" + std::string(name) + "'; known presets: " + known);
}

void Topology::check_ipu(int ipu, const char* what) const {
  if (ipu < 0 || ipu >= ipus()) {
    throw FabricError(std::string(what) + ": IPU " + std::to_string(ipu) +
                      " is out of range for topology '" + name_ + "', expected 0.." +
                      std::to_string(ipus() - 1) + "; pick a larger preset or fewer IPUs");
  }
}

IpuLocation Topology::location(int ipu) const {
  check_ipu(ipu, "Topology::location");
  const int per_pod = machines_per_pod_ * ipus_per_machine_;
  return {ipu / per_pod, (ipu % per_pod) / ipus_per_machine_, ipu % ipus_per_machine_};
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
  if (la.pod != lb.pod) return between_pods_;
  if (la.machine != lb.machine) return between_machines_;
  return within_machine_;
}

std::vector<LinkClass> Topology::link_classes() const {
  return {within_machine_, between_machines_, between_pods_};
}

std::string Topology::describe() const {
  std::ostringstream out;
  out << "Topology " << name_ << ": " << pods_ << " pod(s) x " << machines_per_pod_
      << " machine(s) x " << ipus_per_machine_ << " IPU(s) = " << ipus() << " IPUs\n";
  out << "  pod  machine  IPUs\n";
  for (int pod = 0; pod < pods_; ++pod) {
    for (int machine = 0; machine < machines_per_pod_; ++machine) {
      const int first = (pod * machines_per_pod_ + machine) * ipus_per_machine_;
      char row[96];
      std::snprintf(row, sizeof row, "  %3d  %7d  %d..%d\n", pod, machine, first,
                    first + ipus_per_machine_ - 1);
      out << row;
    }
  }
  out << "Link classes:\n";
  for (const LinkClass& link : link_classes()) {
    out << "  " << link.name << ": " << format_rate(link.bandwidth_bytes_per_s) << ", "
        << format_time(link.latency_s) << "  [" << link.source << "]\n";
  }
  return out.str();
}

namespace {

void check_ring(const Topology& topo, std::span<const int> ipus, const char* what) {
  std::set<int> seen;
  for (int ipu : ipus) {
    if (ipu < 0 || ipu >= topo.ipus()) {
      throw FabricError(std::string(what) + ": IPU " + std::to_string(ipu) +
                        " is out of range for topology '" + topo.name() + "', expected 0.." +
                        std::to_string(topo.ipus() - 1));
    }
    if (!seen.insert(ipu).second) {
      throw FabricError(std::string(what) + ": IPU " + std::to_string(ipu) +
                        " appears twice in the ring; list each IPU once");
    }
  }
}

}  // namespace

double predict_all_reduce_seconds(const Topology& topo, std::span<const int> ipus,
                                  std::size_t bytes) {
  check_ring(topo, ipus, "predict_all_reduce_seconds");
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
  check_ring(topo, ipus, "predict_barrier_seconds");
  const std::size_t n = ipus.size();
  double total = 0.0;
  for (std::size_t distance = 1; distance < n; distance <<= 1) {
    double slowest = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      slowest = std::max(slowest, topo.link(ipus[i], ipus[(i + distance) % n]).latency_s);
    }
    total += slowest;
  }
  return total;
}

}  // namespace ipupod::fabric
