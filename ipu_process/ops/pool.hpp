// Pooling op library: max and average pooling over NCHW float32 tensors and their gradients,
// including PyTorch's adaptive windows (global average pooling is adaptive 1x1).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// One pooling window with PyTorch's semantics: the fields of the model IR's Pool2dGeometry
// (which this layer may not include). Padding is symmetric; with `adaptive` the windows cover
// the input in out_h x out_w cells and kernel, stride and padding are ignored.
struct PoolParams {
  std::size_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling divides by the padded window
  bool adaptive = false;
  std::size_t out_h = 0, out_w = 0;
};

// [n, c, oh, ow] for input [n, c, h, w], after checking every field; throws
// std::invalid_argument naming `name`.
std::vector<std::size_t> pool2d_output_shape(const std::vector<std::size_t>& x_shape,
                                             const PoolParams& params, const std::string& name);

// The maximum of each window (NaN inputs are skipped, like the reference interpreter).
Tensor max_pool2d(Graph& graph, Program& prog, const Tensor& x, const PoolParams& params,
                  const std::string& name);
// dx: each window's gradient goes to the first maximum of the window in x.
Tensor max_pool2d_grad(Graph& graph, Program& prog, const Tensor& dy, const Tensor& x,
                       const PoolParams& params, const std::string& name);
Tensor avg_pool2d(Graph& graph, Program& prog, const Tensor& x, const PoolParams& params,
                  const std::string& name);
Tensor avg_pool2d_grad(Graph& graph, Program& prog, const Tensor& dy,
                       const std::vector<std::size_t>& input_shape, const PoolParams& params,
                       const std::string& name);

}  // namespace ipupod::ipu::ops
