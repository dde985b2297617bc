// A device tensor's dimensions held inline (no heap allocation): a full-size model's graph has
// tens of millions of tensor references (vertex fields, exchange pairs), and a heap-allocated
// shape each was a large share of the compiling process's memory and time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace ipupod::ipu {

class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;
  using value_type = std::size_t;
  using const_iterator = const std::uint32_t*;

  Shape() = default;
  Shape(std::initializer_list<std::size_t> dims) { assign(dims.begin(), dims.end()); }
  Shape(const std::vector<std::size_t>& dims) {  // NOLINT(google-explicit-constructor)
    assign(dims.begin(), dims.end());
  }
  template <class It>
  Shape(It begin, It end) {
    assign(begin, end);
  }
  operator std::vector<std::size_t>() const {  // NOLINT(google-explicit-constructor)
    return {begin(), end()};
  }

  std::size_t size() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  std::size_t operator[](std::size_t i) const { return dims_[i]; }
  std::size_t at(std::size_t i) const {
    if (i >= rank_)
      throw std::out_of_range("dimension " + std::to_string(i) + " of a rank-" +
                              std::to_string(rank_) + " shape");
    return dims_[i];
  }
  std::size_t front() const { return dims_[0]; }
  // This shape with its first dimension d (rank >= 1), and without its first dimension: no
  // checks beyond d's, for the views taken many times over while lowering (Tensor::rows, row).
  Shape with_front(std::size_t d) const {
    if (d > UINT32_MAX)
      throw std::invalid_argument("a device tensor dimension of " + std::to_string(d) +
                                  " elements is larger than an IPU can hold");
    Shape out = *this;
    out.dims_[0] = static_cast<std::uint32_t>(d);
    return out;
  }
  Shape without_front() const {
    Shape out;
    for (std::size_t i = 1; i < rank_; ++i) out.dims_[i - 1] = dims_[i];
    out.rank_ = static_cast<std::uint8_t>(rank_ - 1);
    return out;
  }
  std::size_t back() const { return dims_[rank_ - 1]; }
  const_iterator begin() const { return dims_.data(); }
  const_iterator end() const { return dims_.data() + rank_; }

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (std::size_t i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }
  friend bool operator==(const Shape& a, const std::vector<std::size_t>& b) {
    if (a.rank_ != b.size()) return false;
    for (std::size_t i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b[i]) return false;
    return true;
  }

 private:
  template <class It>
  void assign(It begin, It end) {
    for (It it = begin; it != end; ++it) {
      if (rank_ == kMaxRank)
        throw std::invalid_argument("a device tensor has at most " + std::to_string(kMaxRank) +
                                    " dimensions");
      const auto d = static_cast<std::size_t>(*it);
      if (d > UINT32_MAX)
        throw std::invalid_argument("a device tensor dimension of " + std::to_string(d) +
                                    " elements is larger than an IPU can hold");
      dims_[rank_++] = static_cast<std::uint32_t>(d);
    }
  }

  std::array<std::uint32_t, kMaxRank> dims_{};
  std::uint8_t rank_ = 0;
};

}  // namespace ipupod::ipu
