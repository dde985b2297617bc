// Convolution op library (what PopLibs' convolutions are to Poplar): 2-D convolution, its input
// and weight gradients and transposed convolution, NCHW float32, planned over tiles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ipu_process/graph.hpp"
#include "ipu_process/program.hpp"

namespace ipupod::ipu::ops {

// One convolution's geometry with PyTorch's semantics: the fields of the model IR's
// Conv2dGeometry (which this layer may not include) plus conv_transpose2d's output padding.
struct ConvParams {
  std::size_t stride_h = 1, stride_w = 1;
  std::size_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  std::size_t dilation_h = 1, dilation_w = 1;
  std::size_t groups = 1;
  std::size_t output_padding_h = 0, output_padding_w = 0;  // conv_transpose2d only
};

// How one convolution is spread over tiles: its output (or, for weight gradients, the weight
// rows) cut into batch x channel x row blocks, one block per tile; weight gradients also cut
// the reduction over batch and output rows into `parts`, summed by a second compute set.
struct ConvPlan {
  std::size_t batch_block = 1, channel_block = 1, row_block = 1;
  std::size_t batch_blocks = 1, channel_blocks = 1, row_blocks = 1;
  std::size_t tile_bytes = 0;  // the planner's estimate for the busiest tile
  std::uint64_t estimated_cycles = 0;
  bool fits = true;  // tile_bytes within the available memory proportion
  // The blocks are not runs of the output (say 11 channels x 1 row of NCHW: 11 runs per
  // sample): the vertices write a piece per tile, and one exchange moves the pieces onto an
  // even mapping of whole rows over the same tiles, so that the ops after the convolution see
  // one run per tile instead of one per channel row.
  bool remap = false;
  std::size_t tiles() const { return batch_blocks * channel_blocks * row_blocks; }
};

// Output length of a strided, padded (pad_sum = both sides), dilated window; 0 if none fits.
std::size_t conv_output_size(std::size_t in, std::size_t pad_sum, std::size_t kernel,
                             std::size_t dilation, std::size_t stride);
// The output shapes, after checking every dimension; throw std::invalid_argument naming `name`.
std::vector<std::size_t> conv2d_output_shape(const std::vector<std::size_t>& x_shape,
                                             const std::vector<std::size_t>& w_shape,
                                             const ConvParams& params, const std::string& name);
std::vector<std::size_t> conv_transpose2d_output_shape(const std::vector<std::size_t>& x_shape,
                                                       const std::vector<std::size_t>& w_shape,
                                                       const ConvParams& params,
                                                       const std::string& name);

// y [n, co, oh, ow] = x [n, ci, h, w] (*) w [co, ci/groups, kh, kw].
Tensor conv2d(Graph& graph, Program& prog, const Tensor& x, const Tensor& w,
              const ConvParams& params, const std::string& name);
// dx of the given input shape [n, ci, h, w] from dy [n, co, oh, ow] and w [co, ci/groups, kh, kw].
Tensor conv2d_grad_input(Graph& graph, Program& prog, const Tensor& dy, const Tensor& w,
                         const std::vector<std::size_t>& input_shape, const ConvParams& params,
                         const std::string& name);
// dw of the given weight shape [co, ci/groups, kh, kw] from dy and x; summed over the batch.
Tensor conv2d_grad_weight(Graph& graph, Program& prog, const Tensor& dy, const Tensor& x,
                          const std::vector<std::size_t>& weight_shape, const ConvParams& params,
                          const std::string& name);
// y [n, co, oh, ow] from x [n, ci, h, w] and w [ci, co/groups, kh, kw], PyTorch's
// ConvTranspose2d: the input gradient of the convolution it transposes.
Tensor conv_transpose2d(Graph& graph, Program& prog, const Tensor& x, const Tensor& w,
                        const ConvParams& params, const std::string& name);

// Shares a tile's work of `items` planes x `rows` rows between its worker contexts: calls
// fn(item_begin, item_end, row_begin, row_end) for each piece (whole planes when there are at
// least as many planes as workers, else each plane cut into row ranges).
void for_each_work_split(
    std::size_t items, std::size_t rows, std::size_t workers,
    const std::function<void(std::size_t, std::size_t, std::size_t, std::size_t)>& fn);

// The plans the ops above use for float32 operands and partials, for reports and tests.
ConvPlan plan_conv2d(const ArchPreset& arch, const std::vector<std::size_t>& x_shape,
                     const std::vector<std::size_t>& w_shape, const ConvParams& params,
                     double proportion = kDefaultAvailableMemoryProportion);

}  // namespace ipupod::ipu::ops
