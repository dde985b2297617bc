// Where IPUs sit in a pod (pod, machine, IPU in machine) and which link class joins two of
// them, with presets for real systems, user topology files, and the cost of a cross-IPU sync.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/error.hpp"

namespace ipupod::fabric {

struct LinkClass {
  std::string name;
  double bandwidth_bytes_per_s = 0.0;  // per direction, for one ring edge
  double latency_s = 0.0;
  std::string source;  // where the numbers come from, or "assumed, to be calibrated"
};

// Cost of one cross-IPU sync (all IPUs of a group reach the sync point and are released),
// by the widest part of the system the group spans.
struct SyncCosts {
  double within_machine_s = 0.0;
  double within_pod_s = 0.0;  // the group spans machines of one pod
  double between_pods_s = 0.0;
  std::string source;
};

struct IpuLocation {
  int pod = 0;
  int machine = 0;  // within the pod
  int ipu = 0;      // within the machine
};

// Everything a Topology is made from; presets and topology files fill one of these.
struct TopologySpec {
  std::string name;
  int pods = 1;
  int machines_per_pod = 1;
  int ipus_per_machine = 1;
  LinkClass within_machine;
  LinkClass between_machines;
  LinkClass between_pods;
  SyncCosts sync;
  std::string layout;  // how the links are wired, for describe(); may be empty
};

// A regular system: pods x machines per pod x IPUs per machine, IPUs numbered in that order.
class Topology {
 public:
  explicit Topology(TopologySpec spec);  // FabricError on counts < 1 or bad link numbers
  Topology(std::string name, int pods, int machines_per_pod, int ipus_per_machine,
           LinkClass within_machine, LinkClass between_machines, LinkClass between_pods);

  // A preset name ("m2000", "pod16", "pod64", "pod128", "pod256" and the Bow equivalents
  // "bow-2000", "bow-pod16", ...), or the path of a JSON topology file (a name ending in
  // ".json", see from_json). An unknown name throws FabricError listing the presets.
  static Topology preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // A user topology, JSON:
  //   { "name": "two-m2000",                 optional, default: the file name
  //     "base": "pod16",                     optional preset: links and sync default to its
  //     "pods": 1, "machines_per_pod": 2, "ipus_per_machine": 4,
  //     "links": { "within_machine":   { "bandwidth_gbytes_per_s": 32, "latency_us": 1,
  //                                      "source": "our measurement" },
  //                "between_machines": { ... }, "between_pods": { ... } },
  //     "sync_us": { "within_machine": 0.4, "within_pod": 1, "between_pods": 10 } }
  // "base" names a built-in preset, not another file. Without "base", all three links and all
  // three sync costs must be given. Unknown keys are errors (they are usually typos).
  // FabricError names the file and the offending key.
  static Topology from_json_file(const std::string& path);
  static Topology from_json_text(std::string_view text, const std::string& origin);

  const std::string& name() const { return spec_.name; }
  int ipus() const { return spec_.pods * spec_.machines_per_pod * spec_.ipus_per_machine; }
  int pods() const { return spec_.pods; }
  int machines_per_pod() const { return spec_.machines_per_pod; }
  int ipus_per_machine() const { return spec_.ipus_per_machine; }
  const SyncCosts& sync() const { return spec_.sync; }
  const TopologySpec& spec() const { return spec_; }

  IpuLocation location(int ipu) const;  // FabricError if out of range
  // Machine number across the whole system (pod * machines_per_pod + machine).
  int machine_of(int ipu) const;
  // IPU-Link inside a machine, IPU-Link between machines of a pod, GW-Link between pods.
  // FabricError if either IPU is out of range or a == b.
  const LinkClass& link(int a, int b) const;
  std::vector<LinkClass> link_classes() const;
  // Human-readable table of the IPUs and link classes, like poprun --print-topology.
  std::string describe() const;

 private:
  void check_ipu(int ipu, const char* what) const;

  TopologySpec spec_;
};

// Throws FabricError unless every IPU is on the topology and listed once.
void check_ipu_group(const Topology& topo, std::span<const int> ipus, const char* what);

// Predicted time on the real links of the ring all-reduce over `ipus` (ring order = the given
// order): 2(n-1) steps, each moving bytes/n over every ring edge at once, so each step costs
// the slowest edge's latency + (bytes/n)/bandwidth. 0 for fewer than 2 IPUs or 0 bytes.
// (fabric::predict in collectives.hpp covers every collective and algorithm.)
double predict_all_reduce_seconds(const Topology& topo, std::span<const int> ipus,
                                  std::size_t bytes);
// Predicted time of a cross-IPU sync among `ipus`: the topology's sync cost for the widest
// scope they span (one machine, several machines of a pod, several pods); 0 for one IPU.
double predict_barrier_seconds(const Topology& topo, std::span<const int> ipus);

}  // namespace ipupod::fabric
