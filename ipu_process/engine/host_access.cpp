// Engine host access between runs: reading and writing a tensor's bytes or float values,
// gathered from and scattered to its pieces in tile memory.
#include <cstring>

#include "float16/half.hpp"
#include "ipu_process/engine.hpp"

namespace ipupod::ipu {

void Engine::check_host_access(const Tensor& t) const {
  if (!options_.executable)
    throw std::logic_error("the host cannot access " + graph_.describe(t) +
                           ": the engine was built to plan only and holds no tile memory");
  if (memory_.tiles_over() > 0)
    throw std::logic_error("the host cannot access " + graph_.describe(t) +
                           ": the graph was compiled with allow-out-of-memory and does not fit "
                           "on the IPU, so no tile memory backs it (see the memory report)");
  const Variable& v = graph_.variable(t.variable());
  if (!v.host_access && !always_live(v.category))
    throw std::logic_error("the host cannot access " + graph_.describe(t) +
                           ": its bytes are shared with other tensors when it is not live; "
                           "call Graph::set_host_access on it before building the engine");
}

void Engine::gather_pieces(const std::vector<Piece>& pieces, std::size_t element_bytes,
                           std::span<std::byte> out) {
  std::size_t off = 0;
  for (const auto& piece : pieces) {
    std::memcpy(out.data() + off, piece.data, piece.elements * element_bytes);
    off += piece.elements * element_bytes;
  }
}

void Engine::scatter_pieces(const std::vector<Piece>& pieces, std::size_t element_bytes,
                            std::span<const std::byte> in) {
  std::size_t off = 0;
  for (const auto& piece : pieces) {
    std::memcpy(piece.data, in.data() + off, piece.elements * element_bytes);
    off += piece.elements * element_bytes;
  }
}

void Engine::write(const Tensor& t, std::span<const std::byte> bytes) {
  check_host_access(t);
  const std::size_t esize = dtype_size(t.dtype());
  if (bytes.size() != t.elements() * esize)
    throw std::invalid_argument("write of " + std::to_string(bytes.size()) + " bytes to " +
                                graph_.describe(t) + " of " + std::to_string(t.elements() * esize) +
                                " bytes");
  scatter_pieces(resolve(t), esize, bytes);
}

std::vector<std::byte> Engine::read(const Tensor& t) const {
  check_host_access(t);
  const std::size_t esize = dtype_size(t.dtype());
  std::vector<std::byte> out(t.elements() * esize);
  gather_pieces(resolve(t), esize, out);
  return out;
}

namespace {
void check_float(const Graph& graph, const Tensor& t, const char* what) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::f16)
    throw std::invalid_argument(std::string(what) + " of " + graph.describe(t) +
                                ": float32 values for a tensor of " + dtype_name(t.dtype()) +
                                "; use write/read with its bytes");
}
}  // namespace

void Engine::write_values(const Tensor& t, std::span<const float> values) {
  check_float(graph_, t, "write_values");
  if (t.dtype() == DType::f32) return write(t, std::as_bytes(values));
  std::vector<float16::Half> halves(values.size());
  float16::narrow(values, halves);
  write(t, std::as_bytes(std::span(halves)));
}

std::vector<float> Engine::read_values(const Tensor& t) const {
  check_float(graph_, t, "read_values");
  const std::vector<std::byte> bytes = read(t);
  std::vector<float> out(t.elements());
  if (t.dtype() == DType::f32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    std::vector<float16::Half> halves(t.elements());
    std::memcpy(halves.data(), bytes.data(), bytes.size());
    float16::widen(halves, out);
  }
  return out;
}

}  // namespace ipupod::ipu
