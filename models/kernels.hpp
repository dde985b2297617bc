// CPU kernels of the reference interpreter, one function per op kind (internal to models/).
// Each reads its inputs and writes a pre-sized output; in-place ops take mutable state.
#pragma once

#include <cstdint>
#include <vector>

#include "models/interpreter.hpp"
#include "models/ir.hpp"

namespace ipupod::models::kernels {

// Row-major strides of a shape.
std::vector<std::size_t> strides_of(const Shape& shape);

// Elementwise, reductions, shapes (kernels_tensor.cpp).
void unary(const Op& op, const Buffer& x, Buffer& out);
void unary_grad(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out);
void binary(const Op& op, const Buffer& a, const Buffer& b, Buffer& out);
void reduce_sum(const Op& op, const Buffer& x, Buffer& out);
void broadcast_to(const Op& op, const Buffer& x, Buffer& out);
void permute(const Op& op, const Buffer& x, Buffer& out);
void slice(const Op& op, const Buffer& x, Buffer& out);
void slice_grad(const Op& op, const Buffer& dy, Buffer& out);
void concat(const Op& op, const std::vector<const Buffer*>& xs, Buffer& out);
void batch_matmul(const Op& op, const Buffer& a, const Buffer& b, Buffer& out);
void softmax(const Buffer& x, Buffer& out);
void softmax_grad(const Buffer& dy, const Buffer& y, Buffer& out);
void gather_rows(const Op& op, const Buffer& table, const Buffer& indices, Buffer& out);
void scatter_add_rows(const Op& op, const Buffer& dy, const Buffer& indices, Buffer& out);

// Convolution, pooling, normalisation (kernels_image.cpp).
void conv2d(const Op& op, const Buffer& x, const Buffer& w, Buffer& out);
void conv2d_grad_input(const Op& op, const Buffer& dy, const Buffer& w, Buffer& out);
void conv2d_grad_weight(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out);
void max_pool2d(const Op& op, const Buffer& x, Buffer& out);
void max_pool2d_grad(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out);
void avg_pool2d(const Op& op, const Buffer& x, Buffer& out);
void avg_pool2d_grad(const Op& op, const Buffer& dy, Buffer& out);
void normalize(const Op& op, const Buffer& x, Buffer& out);
void normalize_grad(const Op& op, const Buffer& dy, const Buffer& x, Buffer& out);
void batch_norm_inference(const Op& op, const Buffer& x, const Buffer& mean, const Buffer& var,
                          Buffer& out);
void batch_norm_stats_update(const Op& op, const Buffer& x, Buffer& mean, Buffer& var);

// Randomness, quantisation, optimizers (kernels_state.cpp).
void random_mask(const Op& op, std::uint64_t invocation, Buffer& out);
void vq_nearest(const Buffer& z, const Buffer& codebook, Buffer& out);
void vq_ema_update(const Op& op, const Buffer& z, const Buffer& indices, Buffer& codebook,
                   Buffer& cluster_size, Buffer& embed_sum);
void lr_schedule(const Op& op, const Buffer& step, Buffer& out);
void global_norm(const std::vector<const Buffer*>& grads, Buffer& out);
void clip_factor(const Op& op, const Buffer& norm, Buffer& out);
void sgd_momentum_step(const Op& op, Buffer& param, const Buffer& grad, Buffer& velocity,
                       const Buffer& lr);
void adam_step(const Op& op, Buffer& param, const Buffer& grad, Buffer& m, Buffer& v,
               const Buffer& lr, const Buffer& step);
void lamb_step(const Op& op, Buffer& param, const Buffer& grad, Buffer& m, Buffer& v,
               const Buffer& lr, const Buffer& step);

}  // namespace ipupod::models::kernels
