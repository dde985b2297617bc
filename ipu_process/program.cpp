// Program tree constructors.
#include "ipu_process/program.hpp"

#include <stdexcept>

namespace ipupod::ipu {

Program Program::sequence(std::vector<Program> children) {
  Program p;
  p.children_ = std::move(children);
  return p;
}

Program Program::execute(ComputeSetId cs) {
  Program p;
  p.kind_ = Kind::execute;
  p.cs_ = cs;
  return p;
}

Program Program::copy(std::vector<std::pair<Tensor, Tensor>> pairs) {
  for (const auto& [src, dst] : pairs)
    if (src.elements() != dst.elements() || src.dtype() != dst.dtype())
      throw std::invalid_argument("copy between tensors of " + std::to_string(src.elements()) +
                                  " " + dtype_name(src.dtype()) + " and " +
                                  std::to_string(dst.elements()) + " " +
                                  dtype_name(dst.dtype()) + " elements: sizes or types differ");
  Program p;
  p.kind_ = Kind::copy;
  p.pairs_ = std::move(pairs);
  return p;
}

Program Program::repeat(std::uint64_t count, Program body) {
  Program p;
  p.kind_ = Kind::repeat;
  p.count_ = count;
  p.children_.push_back(std::move(body));
  return p;
}

Program Program::sync(SyncKind kind) {
  Program p;
  p.kind_ = Kind::sync;
  p.sync_ = kind;
  return p;
}

Program Program::stream_to_device(std::string stream, Tensor dst) {
  Program p;
  p.kind_ = Kind::stream_to_device;
  p.stream_ = std::move(stream);
  p.tensors_ = {std::move(dst)};
  return p;
}

Program Program::stream_from_device(std::string stream, Tensor src) {
  Program p;
  p.kind_ = Kind::stream_from_device;
  p.stream_ = std::move(stream);
  p.tensors_ = {std::move(src)};
  return p;
}

Program Program::all_reduce(std::vector<Tensor> tensors, CollectiveOp op) {
  for (const auto& t : tensors)
    if (t.dtype() != DType::f32)
      throw std::invalid_argument("all_reduce supports float32 tensors only, got " +
                                  std::string(dtype_name(t.dtype())));
  Program p;
  p.kind_ = Kind::all_reduce;
  p.tensors_ = std::move(tensors);
  p.op_ = op;
  return p;
}

void Program::add(Program p) {
  if (kind_ != Kind::sequence) throw std::logic_error("Program::add on a non-sequence program");
  children_.push_back(std::move(p));
}

}  // namespace ipupod::ipu
