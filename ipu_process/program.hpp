// Programs that run on one IPU: a tree of Sequence, Execute, Copy, Repeat, Sync, host stream
// copies and cross-replica collectives, like Poplar's program classes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/graph.hpp"

namespace ipupod::ipu {

enum class SyncKind : std::uint8_t { internal, external };
enum class CollectiveOp : std::uint8_t { sum, mean };

class Program {
 public:
  enum class Kind : std::uint8_t {
    sequence,
    execute,
    copy,
    repeat,
    sync,
    stream_to_device,
    stream_from_device,
    all_reduce
  };

  Program() = default;  // an empty sequence
  static Program sequence(std::vector<Program> children = {});
  static Program execute(ComputeSetId cs);
  // All pairs move in one exchange phase; each pair is (source, destination), same size.
  static Program copy(std::vector<std::pair<Tensor, Tensor>> pairs);
  static Program copy(const Tensor& src, const Tensor& dst) { return copy({{src, dst}}); }
  static Program repeat(std::uint64_t count, Program body);
  static Program sync(SyncKind kind);
  static Program stream_to_device(std::string stream, Tensor dst);
  static Program stream_from_device(std::string stream, Tensor src);
  // Reduce float32 tensors across the replicas bound to the engine (through the fabric).
  static Program all_reduce(std::vector<Tensor> tensors, CollectiveOp op);

  void add(Program p);  // append to a sequence
  Kind kind() const { return kind_; }
  const std::vector<Program>& children() const { return children_; }
  ComputeSetId compute_set() const { return cs_; }
  const std::vector<std::pair<Tensor, Tensor>>& pairs() const { return pairs_; }
  std::uint64_t count() const { return count_; }
  SyncKind sync_kind() const { return sync_; }
  CollectiveOp collective_op() const { return op_; }
  const std::string& stream() const { return stream_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  Kind kind_ = Kind::sequence;
  std::vector<Program> children_;
  ComputeSetId cs_ = 0;
  std::vector<std::pair<Tensor, Tensor>> pairs_;
  std::uint64_t count_ = 0;
  SyncKind sync_ = SyncKind::internal;
  CollectiveOp op_ = CollectiveOp::sum;
  std::string stream_;
  std::vector<Tensor> tensors_;
};

}  // namespace ipupod::ipu
