// HostArray: a dense, row-major, typed array in host memory -- the unit the dataset reader,
// the loader and the host<->IPU streams pass around.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ipupod::host {

// Values are part of the stream wire format and must not change.
enum class DType : std::uint8_t { f32 = 1, i32 = 2, u8 = 3, f16 = 4, u32 = 5 };

// IEEE binary16 kept as its bit pattern; the host only moves half-precision data, never computes.
struct Half {
  std::uint16_t bits = 0;
};

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "float32", "int32", "uint8", "float16", "uint32"
bool is_valid_dtype(std::uint8_t raw);     // true for the values of DType

// The DType stored as C++ type T (compile error for other types).
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return DType::i32;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return DType::u8;
  else if constexpr (std::is_same_v<U, Half>)
    return DType::f16;
  else if constexpr (std::is_same_v<U, std::uint32_t>)
    return DType::u32;
  else
    static_assert(sizeof(U) == 0, "no ipupod DType for this C++ type");
}

// "[2,1,28,28]"; "[]" for a scalar.
std::string shape_string(std::span<const std::size_t> shape);
// Product of the extents (1 for rank 0); throws std::overflow_error if it does not fit.
std::size_t shape_elements(std::span<const std::size_t> shape);

struct HostArray {
  DType dtype = DType::f32;
  std::vector<std::size_t> shape;
  std::vector<std::byte> bytes;

  std::size_t elements() const { return shape_elements(shape); }
  std::size_t size_bytes() const { return bytes.size(); }

  // Typed views. Throw std::logic_error if T is not this array's dtype or if bytes.size()
  // disagrees with shape (an array assembled by hand with the wrong size).
  template <class T>
  std::span<T> as() {
    check_view(dtype_of<T>());
    return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
  template <class T>
  std::span<const T> as() const {
    check_view(dtype_of<T>());
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }

  static HostArray zeros(DType dtype, std::vector<std::size_t> shape);

  // A copy of `values` with the given shape; throws std::invalid_argument if the counts differ.
  template <class T>
  static HostArray from_values(std::vector<std::size_t> shape, std::span<const T> values) {
    HostArray array = zeros(dtype_of<T>(), std::move(shape));
    if (values.size() != array.elements()) {
      throw std::invalid_argument("HostArray::from_values: shape " + shape_string(array.shape) +
                                  " holds " + std::to_string(array.elements()) + " elements but " +
                                  std::to_string(values.size()) + " values were given");
    }
    std::span<T> out = array.as<T>();
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = values[i];
    return array;
  }
  template <class T>
  static HostArray from_values(std::vector<std::size_t> shape, const std::vector<T>& values) {
    return from_values<T>(std::move(shape), std::span<const T>(values));
  }

  // "float32[2,1,28,28]"
  std::string describe() const;

 private:
  void check_view(DType requested) const;
};

}  // namespace ipupod::host
