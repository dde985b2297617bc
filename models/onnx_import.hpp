// Models from ONNX files (torch.onnx.export), read with Debian's ONNX library: the exported
// graph's operators mapped onto the IR, its initializers kept as the starting weights, a loss
// added for training. `ipupod train|compile|estimate --model FILE.onnx`.
#pragma once

#include <string>

#include "models/layers.hpp"
#include "models/zoo.hpp"

namespace ipupod::models {

// Whether a --model names an ONNX file (ends in ".onnx") rather than a zoo model.
bool is_onnx_model(const std::string& name);

// Builds the forward ops of the ONNX model at `path` into m (input, labels, logits, loss):
// - one data input [N, ...]: N becomes the micro-batch, the rest the sample shape (a different
//   --sample-shape is an error);
// - initializers read by Conv, ConvTranspose, Gemm, MatMul and BatchNormalization's scale and
//   bias become parameters with the exported values, BatchNormalization's running mean and
//   variance model state (updated in training as PyTorch does), other initializers constants;
// - the single output is a classifier's logits [N, classes], the loss softmax cross
//   entropy against int32 labels [N]; or a regressor's value [N, 1], the loss the mean
//   absolute error against float32 targets [N, 1] (Task::regression).
// An operator or attribute it cannot map is a std::invalid_argument naming the node, its
// operator and its inputs' shapes.
void build_onnx(Model& m, Builder& b, const ModelOptions& o, const std::string& path);

}  // namespace ipupod::models
