// Benchmarks and long runs of the reference interpreter, kept out of the test suite:
//   ipupod_models_bench step --model cnn|hae [--repeats N]   median seconds per training step
//   ipupod_models_bench train-cnn --data DIR [--epochs 2]    small CNN on Fashion-MNIST
// scripts/bench_interpreter_vs_torch.py runs `step` next to the same step in PyTorch.
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>

#include "models/interpreter.hpp"
#include "models/zoo.hpp"

namespace ipupod::models {
namespace {

// The configurations shared with the PyTorch peer (keep in sync with the script).
ModelOptions bench_options(const std::string& model) {
  ModelOptions o;
  o.optimizer.kind = OptimizerKind::adamw;
  o.learning_rate = 1e-3;
  if (model == "cnn") {
    o.micro_batch = 16;
    o.sample_shape = {1, 28, 28};
  } else if (model == "hae") {
    o.micro_batch = 2;
    o.sample_shape = {1, 64, 64};
    o.width = 0.25;
  } else {
    throw std::invalid_argument("bench step: --model must be cnn or hae, got '" + model + "'");
  }
  return o;
}

Buffer random_buffer(const TensorInfo& info, std::uint32_t seed) {
  Buffer b = Buffer::zeros(info);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(0.f, 1.f);
  for (auto& v : b.f) v = d(gen);
  for (std::size_t i = 0; i < b.i.size(); ++i) b.i[i] = static_cast<std::int32_t>(i % 10);
  return b;
}

int bench_step(const std::string& model, int repeats) {
  const Model m = build_model(model, bench_options(model));
  Interpreter in(m.graph, 1);
  in.set(m.input, random_buffer(m.graph.info(m.input), 1));
  Buffer labels = random_buffer(m.graph.info(m.labels), 2);
  if (model == "hae") std::fill(labels.f.begin(), labels.f.end(), 1.f);  // the mask
  in.set(m.labels, labels);
  in.run();  // warm-up
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    in.run();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  std::printf("model=%s micro_batch=%zu parameters=%zu median_step_s=%.6f loss=%.6f\n",
              model.c_str(), bench_options(model).micro_batch, m.parameter_count(),
              seconds[seconds.size() / 2], static_cast<double>(in.get(m.loss).f[0]));
  return 0;
}

// Reads a gzip-compressed IDX file (magic, dims, bytes).
std::vector<std::uint8_t> read_idx(const std::string& path, std::size_t header_dims) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<std::uint8_t> all;
  std::uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) all.insert(all.end(), buf, buf + n);
  gzclose(f);
  const std::size_t header = 4 + 4 * header_dims;
  if (all.size() < header) throw std::runtime_error(path + " is too short for an IDX file");
  return {all.begin() + static_cast<std::ptrdiff_t>(header), all.end()};
}

int train_cnn(const std::string& dir, int epochs, std::size_t batch, double lr) {
  const auto train_x = read_idx(dir + "/train-images-idx3-ubyte.gz", 3);
  const auto train_y = read_idx(dir + "/train-labels-idx1-ubyte.gz", 1);
  const auto test_x = read_idx(dir + "/t10k-images-idx3-ubyte.gz", 3);
  const auto test_y = read_idx(dir + "/t10k-labels-idx1-ubyte.gz", 1);
  ModelOptions o;
  o.micro_batch = batch;
  o.sample_shape = {1, 28, 28};
  o.learning_rate = lr;
  o.optimizer.kind = OptimizerKind::adam;
  const Model train = build_model("cnn", o);
  o.training = false;
  const Model eval = build_model("cnn", o);
  Interpreter tin(train.graph, 7);
  const auto fill = [&](const std::vector<std::uint8_t>& xs, const std::vector<std::uint8_t>& ys,
                        const std::vector<std::size_t>& order, std::size_t first, Buffer& x,
                        Buffer& y) {
    for (std::size_t s = 0; s < batch; ++s) {
      const std::size_t k = order[first + s];
      for (std::size_t p = 0; p < 784; ++p)
        x.f[s * 784 + p] = static_cast<float>(xs[k * 784 + p]) / 255.f;
      y.i[s] = ys[k];
    }
  };
  Buffer x = Buffer::zeros(train.graph.info(train.input)),
         y = Buffer::zeros(train.graph.info(train.labels));
  std::vector<std::size_t> order(train_y.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 gen(1);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), gen);
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    const std::size_t steps = order.size() / batch;
    for (std::size_t step = 0; step < steps; ++step) {
      fill(train_x, train_y, order, step * batch, x, y);
      tin.set(train.input, x);
      tin.set(train.labels, y);
      tin.run();
      loss += tin.get(train.loss).f[0];
    }
    // Evaluate with the trained weights and running statistics, matched by name.
    Interpreter ein(eval.graph, 7);
    for (const auto& v : eval.graph.values()) (void)v;
    for (ValueId id : eval.graph.parameters())
      for (ValueId t : train.graph.parameters())
        if (train.graph.value(t).name == eval.graph.value(id).name) ein.set(id, tin.get(t));
    for (ValueId id : eval.graph.states())
      for (ValueId t : train.graph.states())
        if (train.graph.value(t).name == eval.graph.value(id).name) ein.set(id, tin.get(t));
    std::vector<std::size_t> test_order(test_y.size());
    for (std::size_t i = 0; i < test_order.size(); ++i) test_order[i] = i;
    std::size_t correct = 0, seen = 0;
    for (std::size_t first = 0; first + batch <= test_order.size(); first += batch) {
      fill(test_x, test_y, test_order, first, x, y);
      ein.set(eval.input, x);
      ein.set(eval.labels, y);
      ein.run({Phase::forward});
      const Buffer& logits = ein.get(eval.logits);
      for (std::size_t s = 0; s < batch; ++s, ++seen) {
        const float* row = &logits.f[s * 10];
        correct += static_cast<std::size_t>(std::max_element(row, row + 10) - row) ==
                   static_cast<std::size_t>(y.i[s]);
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch %d  train loss %.4f  test accuracy %.4f  (%.0f s)\n", epoch + 1,
                loss / static_cast<double>(steps),
                static_cast<double>(correct) / static_cast<double>(seen), secs);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace ipupod::models

int main(int argc, char** argv) {
  using namespace ipupod::models;
  try {
    if (argc < 2)
      throw std::invalid_argument("usage: ipupod_models_bench step|train-cnn [options]");
    const std::string mode = argv[1];
    std::string model = "cnn", data = "/usr/share/datasets/fashion-mnist";
    int repeats = 5, epochs = 2;
    std::size_t batch = 32;
    double lr = 1e-3;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--model")
        model = v;
      else if (k == "--repeats")
        repeats = std::stoi(v);
      else if (k == "--data")
        data = v;
      else if (k == "--epochs")
        epochs = std::stoi(v);
      else if (k == "--batch")
        batch = std::stoul(v);
      else if (k == "--lr")
        lr = std::stod(v);
      else
        throw std::invalid_argument("unknown option " + k);
    }
    if (mode == "step") return bench_step(model, std::max(1, repeats));
    if (mode == "train-cnn") return train_cnn(data, epochs, batch, lr);
    throw std::invalid_argument("unknown mode '" + mode + "' (step, train-cnn)");
  } catch (const std::exception& e) {
    std::cerr << "ipupod_models_bench: " << e.what() << "\n";
    return 2;
  }
}
