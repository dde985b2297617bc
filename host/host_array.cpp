// HostArray helpers: dtype tables, shape arithmetic with overflow checks, typed-view checks.
// Kept out of the header so the error text lives in one place.
#include "host/host_array.hpp"

#include <limits>

namespace ipupod::host {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::i32:
      return 4;
    case DType::u8:
      return 1;
    case DType::f16:
      return 2;
    case DType::u32:
      return 4;
  }
  throw std::invalid_argument("dtype_size: unknown DType value " +
                              std::to_string(static_cast<int>(dtype)));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::i32:
      return "int32";
    case DType::u8:
      return "uint8";
    case DType::f16:
      return "float16";
    case DType::u32:
      return "uint32";
  }
  return "unknown";
}

bool is_valid_dtype(std::uint8_t raw) {
  return raw >= static_cast<std::uint8_t>(DType::f32) &&
         raw <= static_cast<std::uint8_t>(DType::u32);
}

std::string shape_string(std::span<const std::size_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ",";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::size_t shape_elements(std::span<const std::size_t> shape) {
  std::size_t product = 1;
  for (std::size_t extent : shape) {
    if (extent != 0 && product > std::numeric_limits<std::size_t>::max() / extent) {
      throw std::overflow_error("shape " + shape_string(shape) +
                                " has more elements than fit in "
                                "a size_t");
    }
    product *= extent;
  }
  return product;
}

HostArray HostArray::zeros(DType dtype, std::vector<std::size_t> shape) {
  HostArray array;
  array.dtype = dtype;
  array.shape = std::move(shape);
  const std::size_t count = array.elements();
  if (count > std::numeric_limits<std::size_t>::max() / dtype_size(dtype)) {
    throw std::overflow_error("HostArray::zeros: " + array.describe() + " is too large");
  }
  array.bytes.assign(count * dtype_size(dtype), std::byte{0});
  return array;
}

std::string HostArray::describe() const {
  return std::string(dtype_name(dtype)) + shape_string(shape);
}

void HostArray::check_view(DType requested) const {
  if (requested != dtype) {
    throw std::logic_error("HostArray::as: the array is " + describe() + " but was viewed as " +
                           std::string(dtype_name(requested)));
  }
  const std::size_t expected = elements() * dtype_size(dtype);
  if (bytes.size() != expected) {
    throw std::logic_error("HostArray::as: " + describe() + " needs " + std::to_string(expected) +
                           " bytes but holds " + std::to_string(bytes.size()));
  }
}

}  // namespace ipupod::host
