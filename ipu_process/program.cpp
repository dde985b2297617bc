// Program tree constructors.
#include "ipu_process/program.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace ipupod::ipu {

namespace {
// Appends the copy of n elements from (src, s) to (dst, d) to the runs, merged into the last
// run when it continues it: its single row grows, or it is the next row at the same strides
// (the destination's rows never overlapping). Only between two different variables: within
// one, a pair may read what the one before wrote, which one run would not.
void add_copy_run(std::vector<CopyRun>& runs, VariableId src, std::uint64_t s, VariableId dst,
                  std::uint64_t d, std::size_t n, DType dtype) {
  if (!runs.empty() && src != dst) {
    CopyRun& last = runs.back();
    if (last.src == src && last.dst == dst) {
      if (last.rows == 1 && last.src_offset + last.elements == s &&
          last.dst_offset + last.elements == d && last.elements + n <= UINT32_MAX) {
        last.elements += static_cast<std::uint32_t>(n);
        return;
      }
      const auto fits = [](std::uint64_t stride) { return stride <= UINT32_MAX; };
      if (n == last.elements && last.rows == 1 && s >= last.src_offset &&
          d >= last.dst_offset + n && fits(s - last.src_offset) && fits(d - last.dst_offset)) {
        last.src_stride = static_cast<std::uint32_t>(s - last.src_offset);
        last.dst_stride = static_cast<std::uint32_t>(d - last.dst_offset);
        last.rows = 2;
        return;
      }
      if (n == last.elements && last.rows > 1 && last.rows < UINT32_MAX &&
          s == last.src_offset + std::uint64_t{last.rows} * last.src_stride &&
          d == last.dst_offset + std::uint64_t{last.rows} * last.dst_stride) {
        ++last.rows;
        return;
      }
    }
  }
  if (s + n > UINT32_MAX || d + n > UINT32_MAX)
    throw std::logic_error("a copy run past element 2^32 - 1 of a variable");
  runs.push_back({.src_offset = static_cast<std::uint32_t>(s),
                  .dst_offset = static_cast<std::uint32_t>(d),
                  .elements = static_cast<std::uint32_t>(n),
                  .src = src,
                  .dst = dst,
                  .dtype = dtype});
}
}  // namespace

Program::Program() : Program(Kind::sequence) {}

Program::Program(Kind kind) : node_(std::make_shared<Node>()) {
  node_->kind = kind;
}

Program::Node& Program::mutable_node() {
  if (node_.use_count() > 1) node_ = std::make_shared<Node>(*node_);
  return *node_;
}

Program Program::sequence(std::vector<Program> children) {
  Program p;
  p.node_->children = std::move(children);
  return p;
}

Program Program::execute(ComputeSetId cs) {
  Program p(Kind::execute);
  p.node_->cs = cs;
  return p;
}

void CopyRuns::add(const Tensor& src, const Tensor& dst) {
  if (src.elements() != dst.elements() || src.dtype() != dst.dtype())
    throw std::invalid_argument("copy between tensors of " + std::to_string(src.elements()) + " " +
                                dtype_name(src.dtype()) + " and " + std::to_string(dst.elements()) +
                                " " + dtype_name(dst.dtype()) + " elements: sizes or types differ");
  for (std::size_t done = 0; done < src.elements();) {
    // A run's row holds at most 2^32 - 1 elements: a longer pair becomes several rows.
    const std::size_t n = std::min<std::size_t>(src.elements() - done, UINT32_MAX);
    add_copy_run(runs_, src.variable(), src.offset() + done, dst.variable(), dst.offset() + done, n,
                 src.dtype());
    done += n;
  }
}

Program Program::copy(std::vector<std::pair<Tensor, Tensor>> pairs) {
  CopyRuns runs;
  for (const auto& [src, dst] : pairs) runs.add(src, dst);
  return copy(std::move(runs));
}

void Program::release_copy_data() const {
  std::vector<CopyRun>().swap(node_->runs);
  std::vector<std::pair<View, View>>().swap(node_->view_pairs);
}

Program Program::copy(CopyRuns runs) {
  Program p(Kind::copy);
  p.node_->runs = std::move(runs.runs_);
  p.node_->runs.shrink_to_fit();
  return p;
}

Program Program::copy_views(std::vector<std::pair<View, View>> pairs) {
  for (const auto& [src, dst] : pairs) {
    if (src.elements() != dst.elements() || src.dtype() != dst.dtype())
      throw std::invalid_argument("copy between views of " + std::to_string(src.elements()) + " " +
                                  dtype_name(src.dtype()) + " and " +
                                  std::to_string(dst.elements()) + " " + dtype_name(dst.dtype()) +
                                  " elements: sizes or types differ");
    if (dst.has_repeats())
      throw std::invalid_argument(
          "copy to a view that names some elements more than once (a broadcast?): the result "
          "would depend on the order of the transfers");
  }
  Program p(Kind::copy);
  p.node_->view_pairs = std::move(pairs);
  return p;
}

Program Program::write_undef(const View& t) {
  Program p(Kind::write_undef);
  p.node_->views = {t};
  return p;
}

Program Program::repeat(std::uint64_t count, Program body) {
  Program p(Kind::repeat);
  p.node_->count = count;
  p.node_->children.push_back(std::move(body));
  return p;
}

namespace {
void check_predicate(const Tensor& predicate, const char* program) {
  if (predicate.elements() != 1 || predicate.dtype() == DType::f16 ||
      predicate.dtype() == DType::u8)
    throw std::invalid_argument(
        std::string(program) +
        ": the predicate must be one int32, uint32 or float32 element, got " +
        std::to_string(predicate.elements()) + " " + dtype_name(predicate.dtype()) + " elements");
}
}  // namespace

Program Program::repeat_while_true(Program condition, Tensor predicate, Program body) {
  check_predicate(predicate, "repeat_while_true");
  Program p(Kind::repeat_while_true);
  p.node_->children = {std::move(condition), std::move(body)};
  p.node_->tensors = {std::move(predicate)};
  return p;
}

Program Program::if_else(Tensor predicate, Program then_body, Program else_body) {
  check_predicate(predicate, "if_else");
  Program p(Kind::if_else);
  p.node_->children = {std::move(then_body), std::move(else_body)};
  p.node_->tensors = {std::move(predicate)};
  return p;
}

Program Program::sync(SyncKind kind) {
  Program p(Kind::sync);
  p.node_->sync = kind;
  return p;
}

Program Program::stream_to_device(std::string stream, Tensor dst) {
  Program p(Kind::stream_to_device);
  p.node_->stream = std::move(stream);
  p.node_->tensors = {std::move(dst)};
  return p;
}

Program Program::stream_from_device(std::string stream, Tensor src) {
  Program p(Kind::stream_from_device);
  p.node_->stream = std::move(stream);
  p.node_->tensors = {std::move(src)};
  return p;
}

Program Program::all_reduce(std::vector<Tensor> tensors, CollectiveOp op) {
  for (const auto& t : tensors)
    if (t.dtype() != DType::f32)
      throw std::invalid_argument("all_reduce supports float32 tensors only, got " +
                                  std::string(dtype_name(t.dtype())));
  Program p(Kind::all_reduce);
  p.node_->tensors = std::move(tensors);
  p.node_->op = op;
  return p;
}

namespace {
void check_f32(const std::vector<Tensor>& tensors, const char* what) {
  for (const auto& t : tensors)
    if (t.dtype() != DType::f32)
      throw std::invalid_argument(std::string(what) + " supports float32 tensors only, got " +
                                  dtype_name(t.dtype()));
}
}  // namespace

Program Program::reduce_scatter(std::vector<Tensor> inputs, std::vector<Tensor> block,
                                CollectiveOp op) {
  check_f32(inputs, "reduce_scatter");
  check_f32(block, "reduce_scatter");
  Program p(Kind::reduce_scatter);
  p.node_->tensors = std::move(inputs);
  p.node_->outputs = std::move(block);
  p.node_->op = op;
  return p;
}

Program Program::all_gather(std::vector<Tensor> block, std::vector<Tensor> outputs) {
  check_f32(block, "all_gather");
  check_f32(outputs, "all_gather");
  Program p(Kind::all_gather);
  p.node_->tensors = std::move(block);
  p.node_->outputs = std::move(outputs);
  return p;
}

Program Program::send(Tensor src, unsigned peer, unsigned tag) {
  Program p(Kind::send);
  p.node_->tensors = {std::move(src)};
  p.node_->peer = peer;
  p.node_->tag = tag;
  return p;
}

Program Program::receive(Tensor dst, unsigned peer, unsigned tag) {
  Program p(Kind::receive);
  p.node_->tensors = {std::move(dst)};
  p.node_->peer = peer;
  p.node_->tag = tag;
  return p;
}

void Program::add(Program p) {
  if (kind() != Kind::sequence) throw std::logic_error("Program::add on a non-sequence program");
  mutable_node().children.push_back(std::move(p));
}

}  // namespace ipupod::ipu
