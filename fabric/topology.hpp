// Where IPUs sit in a pod (pod, machine, IPU in machine) and which link class joins two of
// them, with presets for real systems and a cost model of the collectives on those links.
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

struct IpuLocation {
  int pod = 0;
  int machine = 0;  // within the pod
  int ipu = 0;      // within the machine
};

// A regular system: pods x machines per pod x IPUs per machine, IPUs numbered in that order.
class Topology {
 public:
  Topology(std::string name, int pods, int machines_per_pod, int ipus_per_machine,
           LinkClass within_machine, LinkClass between_machines, LinkClass between_pods);

  // "m2000", "pod16", "pod64", "pod128"; an unknown name throws FabricError listing these.
  static Topology preset(std::string_view name);
  static std::vector<std::string> preset_names();

  const std::string& name() const { return name_; }
  int ipus() const { return pods_ * machines_per_pod_ * ipus_per_machine_; }
  int pods() const { return pods_; }
  int machines_per_pod() const { return machines_per_pod_; }
  int ipus_per_machine() const { return ipus_per_machine_; }

  IpuLocation location(int ipu) const;  // FabricError if out of range
  // IPU-Link inside a machine, IPU-Link between machines of a pod, GW-Link between pods.
  // FabricError if either IPU is out of range or a == b.
  const LinkClass& link(int a, int b) const;
  std::vector<LinkClass> link_classes() const;
  // Human-readable table of the IPUs and link classes, like poprun --print-topology.
  std::string describe() const;

 private:
  void check_ipu(int ipu, const char* what) const;

  std::string name_;
  int pods_;
  int machines_per_pod_;
  int ipus_per_machine_;
  LinkClass within_machine_;
  LinkClass between_machines_;
  LinkClass between_pods_;
};

// Predicted time on the real links of the ring all-reduce over `ipus` (ring order = the given
// order): 2(n-1) steps, each moving bytes/n over every ring edge at once, so each step costs
// the slowest edge's latency + (bytes/n)/bandwidth. 0 for fewer than 2 IPUs or 0 bytes.
double predict_all_reduce_seconds(const Topology& topo, std::span<const int> ipus,
                                  std::size_t bytes);
// Predicted time of the dissemination barrier: ceil(log2 n) rounds of tiny messages, each
// round costing the slowest latency among the links used in that round.
double predict_barrier_seconds(const Topology& topo, std::span<const int> ipus);

}  // namespace ipupod::fabric
