// The layer library (like torch.nn): layers and losses composed from IR ops, with PyTorch's
// parameter layouts and default initialisers, named like PyTorch's state_dict keys.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/ir.hpp"

namespace ipupod::models {

// Where layers put their ops: the graph, the mode, the name scope and the parameters by name
// (a layer built twice under the same name shares its weights).
class Builder {
 public:
  explicit Builder(Graph& graph, bool training = true, std::uint64_t seed = 0)
      : graph_(graph), training_(training), seed_(seed) {}
  Graph& graph() { return graph_; }
  bool training() const { return training_; }

  // Names opened by push are joined with '.': "features.3.block.0.weight".
  void push(const std::string& scope) { scopes_.push_back(scope); }
  void pop() { scopes_.pop_back(); }
  std::string name(const std::string& leaf) const;

  // A trained parameter; reused when the name exists. While frozen, parameters are read
  // through stop_gradient (a GAN's generator loss must not train the discriminator).
  ValueId param(const std::string& leaf, Shape shape, InitKind init, double value);
  ValueId state(const std::string& leaf, Shape shape, InitKind init, double value);
  void set_frozen(bool frozen) { frozen_ = frozen; }
  bool frozen() const { return frozen_; }
  std::uint64_t next_seed() { return seed_ * 1000003u + ++seeds_drawn_; }
  ValueId scalar(double value);  // a float32[] constant

 private:
  Graph& graph_;
  bool training_;
  bool frozen_ = false;
  std::uint64_t seed_, seeds_drawn_ = 0;
  std::vector<std::string> scopes_;
  std::map<std::string, ValueId> params_, states_;
};

// Opens a name scope for the lifetime of the object.
class Scope {
 public:
  Scope(Builder& b, const std::string& name) : b_(b) { b_.push(name); }
  ~Scope() { b_.pop(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Builder& b_;
};

namespace nn {

// Linear over the last axis: weight [out, in], bias [out].
ValueId linear(Builder& b, ValueId x, std::size_t out, bool bias = true,
               const std::string& name = "");

struct Conv2dOptions {
  std::size_t out_channels = 0;
  std::size_t kernel = 3;
  std::size_t stride = 1;
  std::size_t padding = 0;
  bool same = false;  // PyTorch padding="same" (stride 1 only)
  std::size_t dilation = 1;
  std::size_t groups = 1;
  bool bias = true;
};
ValueId conv2d(Builder& b, ValueId x, const Conv2dOptions& o, const std::string& name = "");
// weight [in, out/groups, k, k]; output_padding resolves the output size for stride > 1.
ValueId conv_transpose2d(Builder& b, ValueId x, std::size_t out_channels, std::size_t kernel,
                         std::size_t stride, std::size_t padding, std::size_t output_padding = 0,
                         bool bias = true, const std::string& name = "");

// Training: batch statistics and a running-statistics update; eval: running statistics.
ValueId batch_norm2d(Builder& b, ValueId x, double eps = 1e-5, double momentum = 0.1,
                     const std::string& name = "");
ValueId layer_norm(Builder& b, ValueId x, double eps = 1e-5, const std::string& name = "");
ValueId group_norm(Builder& b, ValueId x, std::size_t groups, double eps = 1e-5,
                   const std::string& name = "");
// Generalised divisive normalisation (Balle et al.): x / sqrt(beta + gamma * x^2) over channels;
// inverse multiplies instead. beta [c] starts at 1, gamma [c,c] at 0.1 I.
ValueId gdn(Builder& b, ValueId x, bool inverse = false, const std::string& name = "");

ValueId relu(Builder& b, ValueId x);
ValueId gelu(Builder& b, ValueId x);
ValueId silu(Builder& b, ValueId x);
ValueId sigmoid(Builder& b, ValueId x);
ValueId tanh(Builder& b, ValueId x);
ValueId leaky_relu(Builder& b, ValueId x, double slope = 0.01);

ValueId max_pool2d(Builder& b, ValueId x, std::size_t kernel, std::size_t stride,
                   std::size_t padding = 0);
ValueId avg_pool2d(Builder& b, ValueId x, std::size_t kernel, std::size_t stride,
                   std::size_t padding = 0, bool count_include_pad = true);
ValueId adaptive_avg_pool2d(Builder& b, ValueId x, std::size_t out_h, std::size_t out_w);

// Squeeze-and-excitation: global pool, 1x1 conv to `squeeze` + SiLU, 1x1 conv back + sigmoid gate.
ValueId squeeze_excitation(Builder& b, ValueId x, std::size_t squeeze,
                           const std::string& name = "");
// [n, c*r*r, h, w] -> [n, c, h*r, w*r], like torch.nn.PixelShuffle.
ValueId pixel_shuffle(Builder& b, ValueId x, std::size_t r);
// Self-attention on [n, t, d]: qkv Linear(d, 3d) (q, k, v blocks, heads contiguous), softmax
// of q k^T / sqrt(d/heads), Linear(d, d) out ("qkv", "proj").
ValueId multi_head_self_attention(Builder& b, ValueId x, std::size_t heads,
                                  const std::string& name = "");
// Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)) with GELU.
ValueId transformer_block(Builder& b, ValueId x, std::size_t heads, std::size_t mlp_ratio = 4,
                          const std::string& name = "");
ValueId embedding(Builder& b, ValueId indices, std::size_t rows, std::size_t dim,
                  const std::string& name = "");
ValueId dropout(Builder& b, ValueId x, double p);
// Drops whole samples of a residual branch with probability p (scales survivors by 1/(1-p)).
ValueId stochastic_depth(Builder& b, ValueId x, double p);

struct Quantized {
  ValueId quantized = -1;  // straight-through: forward = nearest codes, backward = identity
  ValueId loss = -1;       // commitment * mean((z - sg(codes))^2)
  ValueId indices = -1;    // int32 [n*h*w]
};
// Vector quantisation of [n, d, h, w] against `codes` codes of dimension d, with EMA codebook
// updates in training (decay, Laplace eps 1e-5).
Quantized vector_quantizer(Builder& b, ValueId z, std::size_t codes, double decay = 0.99,
                           double commitment = 0.25, const std::string& name = "");

// Losses, each a float32[] mean.
ValueId mse_loss(Builder& b, ValueId pred, ValueId target, ValueId mask = -1);  // mask: 1 = counted
ValueId l1_loss(Builder& b, ValueId pred, ValueId target, ValueId mask = -1);   // mask: 1 = counted
ValueId cross_entropy(Builder& b, ValueId logits, ValueId labels);
ValueId lsgan_loss(Builder& b, ValueId pred, double target);  // mean((pred - target)^2)

}  // namespace nn
}  // namespace ipupod::models
