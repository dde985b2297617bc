// Programs that run on one IPU: a tree of Sequence, Execute, Copy, Repeat, RepeatWhileTrue, If,
// Sync, WriteUndef, host stream copies and cross-replica collectives, like Poplar's program
// classes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ipu_process/graph.hpp"

namespace ipupod::ipu {

enum class SyncKind : std::uint8_t { internal, external };
enum class CollectiveOp : std::uint8_t { sum, mean };

// One run of a copy, as a program keeps it: `rows` rows of `elements` elements of `dtype`, row r
// from element src_offset + r * src_stride of variable src to dst_offset + r * dst_stride of
// variable dst, rows in order (a block of channel planes, a tile's share of a matrix: one run).
// Offsets are within one variable, so under 2^32 (see Graph::add_variable): a full-size stage
// keeps millions of runs.
struct CopyRun {
  std::uint32_t src_offset = 0, dst_offset = 0;
  std::uint32_t elements = 0, rows = 1;
  std::uint32_t src_stride = 0, dst_stride = 0;  // elements from one row's start to the next's
  VariableId src = 0, dst = 0;
  DType dtype = DType::f32;
};
static_assert(sizeof(CopyRun) == 36);

// A copy's runs built pair by pair, each pair merged into the runs as it comes: an op that
// moves millions of small pieces (a convolution's channel planes onto every tile) never holds
// them as a list of tensor pairs. Program::copy(CopyRuns) makes the copy program.
class CopyRuns {
 public:
  // Copies src to dst (same element count and dtype, else std::invalid_argument).
  void add(const Tensor& src, const Tensor& dst);
  bool empty() const { return runs_.empty(); }

 private:
  friend class Program;
  std::vector<CopyRun> runs_;
};

// A program is a cheap handle on an immutable tree node: copying one shares the node, and
// Program::add copies the node first if it is shared (copy on write).
class Program {
 public:
  enum class Kind : std::uint8_t {
    sequence,
    execute,
    copy,
    repeat,
    repeat_while_true,
    if_else,
    sync,
    stream_to_device,
    stream_from_device,
    all_reduce,
    reduce_scatter,
    all_gather,
    send,
    receive,
    write_undef
  };

  Program();  // an empty sequence
  static Program sequence(std::vector<Program> children = {});
  static Program execute(ComputeSetId cs);
  // All pairs move in one exchange phase; each pair is (source, destination), same size.
  static Program copy(std::vector<std::pair<Tensor, Tensor>> pairs);
  static Program copy(const Tensor& src, const Tensor& dst) { return copy({{src, dst}}); }
  static Program copy(CopyRuns runs);
  // The same between views (transposed, broadcast, concatenated, ...): the exchange moves each
  // element of src to the same logical element of dst, so copying a transposed view into a
  // variable transposes through the exchange. dst must not name an element twice.
  static Program copy(const View& src, const View& dst) { return copy_views({{src, dst}}); }
  static Program copy_views(std::vector<std::pair<View, View>> pairs);
  // Poplar's WriteUndef: the tensor's current contents are dead (undefined) from here. It costs
  // nothing at run time; liveness ends the variables it covers whole here, so their bytes can
  // be shared until they are next written, and at the top of a loop body it says their value
  // does not carry from one iteration to the next.
  static Program write_undef(const View& t);
  static Program repeat(std::uint64_t count, Program body);
  // Runs condition, then body while the scalar predicate (int32, uint32 or float32) is non-zero.
  static Program repeat_while_true(Program condition, Tensor predicate, Program body);
  // Runs then_body if the scalar predicate is non-zero, else else_body.
  static Program if_else(Tensor predicate, Program then_body, Program else_body = Program());
  static Program sync(SyncKind kind);
  static Program stream_to_device(std::string stream, Tensor dst);
  static Program stream_from_device(std::string stream, Tensor src);
  // Reduce float32 tensors across the replicas bound to the engine (through the fabric).
  static Program all_reduce(std::vector<Tensor> tensors, CollectiveOp op);
  // Replicated tensor sharding: the float32 tensors `inputs`, concatenated, form one buffer cut
  // into one block per replica (the binding decides which is this replica's); reduce_scatter
  // leaves this replica's block of the reduction in `block` (concatenated), all_gather fills
  // `outputs` with every replica's `block`. Block sizes must match what the binding expects.
  static Program reduce_scatter(std::vector<Tensor> inputs, std::vector<Tensor> block,
                                CollectiveOp op);
  static Program all_gather(std::vector<Tensor> block, std::vector<Tensor> outputs);
  // Point-to-point transfers to and from another IPU of the pod through the fabric (pipeline
  // activations and gradients): the message on channel `tag` must have src's exact size.
  static Program send(Tensor src, unsigned peer, unsigned tag);
  static Program receive(Tensor dst, unsigned peer, unsigned tag);

  void add(Program p);  // append to a sequence
  Kind kind() const { return node_->kind; }
  // The same for every copy of this program (they share one node): compile each node once.
  const void* identity() const { return node_.get(); }
  const std::vector<Program>& children() const { return node_->children; }
  ComputeSetId compute_set() const { return node_->cs; }
  // A copy's tensor pairs as runs (between two different variables, a pair that continues the
  // run before it, or repeats its shape at the same strides, is merged into it).
  const std::vector<CopyRun>& runs() const { return node_->runs; }
  // A copy's pairs when given as views (copy_views or copy(View, View)), else empty.
  const std::vector<std::pair<View, View>>& view_pairs() const { return node_->view_pairs; }
  const std::vector<View>& views() const { return node_->views; }  // write_undef's view
  // Frees a copy's runs and view pairs in the node every copy of this program shares: for an
  // engine that was given the only copies of its programs (Engine's ReleaseGraphTables), once
  // it has compiled the exchange. The copy cannot be compiled again.
  void release_copy_data() const;
  std::uint64_t count() const { return node_->count; }
  SyncKind sync_kind() const { return node_->sync; }
  CollectiveOp collective_op() const { return node_->op; }
  const std::string& stream() const { return node_->stream; }
  const std::vector<Tensor>& tensors() const { return node_->tensors; }
  const std::vector<Tensor>& outputs() const { return node_->outputs; }  // of the collectives
  unsigned peer() const { return node_->peer; }
  unsigned tag() const { return node_->tag; }

 private:
  struct Node {
    Kind kind = Kind::sequence;
    std::vector<Program> children;
    ComputeSetId cs = 0;
    std::vector<CopyRun> runs;
    std::vector<std::pair<View, View>> view_pairs;
    std::vector<View> views;
    std::uint64_t count = 0;
    SyncKind sync = SyncKind::internal;
    CollectiveOp op = CollectiveOp::sum;
    std::string stream;
    std::vector<Tensor> tensors;  // stream data, collective data, or the predicate
    std::vector<Tensor> outputs;  // reduce_scatter's block, all_gather's result
    unsigned peer = 0, tag = 0;   // send and receive
  };
  explicit Program(Kind kind);
  Node& mutable_node();

  std::shared_ptr<Node> node_;
};

}  // namespace ipupod::ipu
