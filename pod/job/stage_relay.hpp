// What the later stages of a pipelined replica exchange with its first stage besides the
// pipeline's transfers: the first stage alone talks to the host, so it gathers the later stages'
// checkpoint manifests, checkpointed tensors and memory reports, and hands them their tensors
// when a run resumes. Over the replica's pipeline transport (DeviceFabric::pipeline).
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fabric/transport.hpp"
#include "ipu_process/graph.hpp"

namespace ipupod::pod {

class StageRelay {
 public:
  explicit StageRelay(fabric::Transport& pipeline) : pipeline_(pipeline) {}

  int stage() const { return pipeline_.rank(); }
  int stages() const { return pipeline_.size(); }

  // A stage's checkpointed tensors as JSON: [[name, shape, dtype], ...].
  static nlohmann::json manifest(const std::vector<std::pair<std::string, ipu::Tensor>>& tensors);
  // Every stage calls it with its own manifest; the first stage gets each stage's (its own
  // entry empty), the later ones an empty list.
  std::vector<nlohmann::json> gather_manifests(const nlohmann::json& mine);
  // Every stage calls it with its memory report; the first stage gets the later stages'.
  std::vector<nlohmann::json> gather_reports(const nlohmann::json& mine);

  // Checkpointed tensor bytes, later stage -> first stage (a checkpoint is due) ...
  void send_to_first(std::span<const std::byte> bytes);
  void receive_from(int stage, std::span<std::byte> bytes);
  // ... and first stage -> later stage (resuming).
  void send_resume_to(int stage, std::span<const std::byte> bytes);
  void receive_resume(std::span<std::byte> bytes);

 private:
  void send_text(const std::string& text, int to, int tag);
  std::string receive_text(int from, int tag);
  void send_bytes(int to, std::span<const std::byte> bytes, int tag);
  void receive_bytes(int from, std::span<std::byte> bytes, int tag);

  fabric::Transport& pipeline_;
};

}  // namespace ipupod::pod
