// Models from ONNX files (torch.onnx.export), read with Debian's ONNX library: the exported
// graph's operators mapped onto the IR, its initializers kept as the starting weights, a loss
// added for training. `ipupod train|compile|estimate --model FILE.onnx`.
#pragma once

#include <string>
#include <vector>

#include "models/layers.hpp"
#include "models/zoo.hpp"

namespace ipupod::models {

// Whether a --model names an ONNX file (ends in ".onnx") rather than a zoo model.
bool is_onnx_model(const std::string& name);

// The losses an ONNX model can be given (ModelOptions::loss, --loss): auto, cross-entropy, mse,
// l1.
const std::vector<std::string>& onnx_losses();

// Builds the forward ops of the ONNX model at `path` into m (input, labels, logits, loss):
// - one data input [N, ...]: N becomes the micro-batch, the rest the sample shape (a different
//   --sample-shape is an error);
// - initializers read by Conv, ConvTranspose, Gemm, MatMul and BatchNormalization's scale and
//   bias become parameters with the exported values, BatchNormalization's running mean and
//   variance model state (updated in training as PyTorch does), other initializers constants;
// - the single output is scored by ModelOptions::loss against labels shaped as the data's
//   targets (ModelOptions::target_shape): a classifier's [N, classes] by softmax cross entropy
//   against int32 labels [N]; [N, values] by the mean absolute or squared error (auto: [N, 1]
//   by the mean absolute error, Task::regression); [N, C, ...] against images
//   (Task::image_to_image), or against a field where its mask is 1 when the targets are the
//   field and its mask [2C, ...] (Task::reconstruction);
// - Mul(x, Sigmoid(x)) is one SiLU op; shape arithmetic (Shape and the Slice, Concat, Gather,
//   Squeeze, Unsqueeze of shapes) is folded to constants.
// An operator or attribute it cannot map is a std::invalid_argument naming the node, its
// operator and its inputs' shapes.
void build_onnx(Model& m, Builder& b, const ModelOptions& o, const std::string& path);

}  // namespace ipupod::models
