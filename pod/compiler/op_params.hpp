// The IR's op attributes in the device op libraries' terms (convolution, pooling, norm and
// elementwise parameters, device types), and which ops compute on float16 under --precision fp16.
#pragma once

#include <cstdint>
#include <vector>

#include "ipu_process/graph.hpp"
#include "ipu_process/ops/conv.hpp"
#include "ipu_process/ops/norm.hpp"
#include "ipu_process/ops/pool.hpp"
#include "ipu_process/ops/tensor_ops.hpp"
#include "models/ir.hpp"

namespace ipupod::pod {

ipu::DType device_dtype(models::DType d);
std::vector<std::size_t> sizes(const std::vector<std::int64_t>& list);

ipu::ops::ConvParams conv_params(const models::Op& op);
ipu::ops::PoolParams pool_params(const models::Op& op);
ipu::ops::NormParams norm_params(const models::Op& op);
ipu::ops::UnaryOp unary_op(const models::Op& op);
ipu::ops::BinaryOp binary_op(const models::Op& op);

// The stateful optimizer updates (moments or velocity in place), as opposed to plain sgd_step.
bool is_update(models::OpKind kind);
// The ops that make float16 results under --precision fp16 (every float input cast to
// float16), and those that also read float16 but make float32 (bias gradients, summed in
// float32); reshapes and stop_gradient are views of their input.
bool makes_float16(models::OpKind kind);
bool reads_float16(models::OpKind kind);

}  // namespace ipupod::pod
