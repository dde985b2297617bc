// The stage relay: manifests, checkpoints and reports between a replica's stages.
#include "pod/job/stage_relay.hpp"

#include <cstdint>

#include "pod/job/device_fabric.hpp"

namespace ipupod::pod {
namespace {

// Tags above the pipeline transfers' (kPipelineTagLimit) and below the collectives'.
constexpr int kReportTag = kPipelineTagLimit, kManifestTag = kPipelineTagLimit + 1,
              kCheckpointTag = kPipelineTagLimit + 2, kResumeTag = kPipelineTagLimit + 3;

}  // namespace

nlohmann::json StageRelay::manifest(
    const std::vector<std::pair<std::string, ipu::Tensor>>& tensors) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [name, tensor] : tensors)
    j.push_back({name, std::vector<std::size_t>(tensor.shape()), static_cast<int>(tensor.dtype())});
  return j;
}

std::vector<nlohmann::json> StageRelay::gather_manifests(const nlohmann::json& mine) {
  std::vector<nlohmann::json> all(static_cast<std::size_t>(stages()));
  if (stage() > 0) {
    send_text(mine.dump(), 0, kManifestTag);
    return {};
  }
  for (int s = 1; s < stages(); ++s)
    all[static_cast<std::size_t>(s)] = nlohmann::json::parse(receive_text(s, kManifestTag));
  return all;
}

std::vector<nlohmann::json> StageRelay::gather_reports(const nlohmann::json& mine) {
  std::vector<nlohmann::json> later;
  if (stage() > 0) {
    send_text(mine.dump(), 0, kReportTag);
    return later;
  }
  for (int s = 1; s < stages(); ++s)
    later.push_back(nlohmann::json::parse(receive_text(s, kReportTag)));
  return later;
}

void StageRelay::send_to_first(std::span<const std::byte> bytes) {
  send_bytes(0, bytes, kCheckpointTag);
}

void StageRelay::receive_from(int stage, std::span<std::byte> bytes) {
  receive_bytes(stage, bytes, kCheckpointTag);
}

void StageRelay::send_resume_to(int stage, std::span<const std::byte> bytes) {
  send_bytes(stage, bytes, kResumeTag);
}

void StageRelay::receive_resume(std::span<std::byte> bytes) {
  receive_bytes(0, bytes, kResumeTag);
}

// A text goes as its length, then its bytes (two messages of one tag keep their order).
void StageRelay::send_text(const std::string& text, int to, int tag) {
  const std::uint64_t length = text.size();
  send_bytes(to, std::as_bytes(std::span(&length, 1)), tag);
  send_bytes(to, std::as_bytes(std::span(text)), tag);
}

std::string StageRelay::receive_text(int from, int tag) {
  std::uint64_t length = 0;
  receive_bytes(from, std::as_writable_bytes(std::span(&length, 1)), tag);
  std::string text(static_cast<std::size_t>(length), '\0');
  receive_bytes(from, std::as_writable_bytes(std::span(text)), tag);
  return text;
}

void StageRelay::send_bytes(int to, std::span<const std::byte> bytes, int tag) {
  fabric::Request request = pipeline_.isend(to, bytes, tag);
  pipeline_.wait(request);
}

void StageRelay::receive_bytes(int from, std::span<std::byte> bytes, int tag) {
  fabric::Request request = pipeline_.irecv(from, bytes, tag);
  pipeline_.wait(request);
}

}  // namespace ipupod::pod
