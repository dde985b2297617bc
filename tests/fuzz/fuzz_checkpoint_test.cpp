// Fuzz test of the checkpoint reader at both of its levels: the file's bytes damaged (bits
// flipped, truncated, spliced with another checkpoint, blocks overwritten) for load_checkpoint,
// and the records a resume reads (configuration, state, data order, metrics file, tensors)
// mutated field by field and saved with valid checksums for load_resume. Every input either
// loads exactly what was saved or is refused with CheckpointError or UsageError (exit code 2)
// and a message; nothing else may happen.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "host/checkpoint.hpp"
#include "host/stream_protocol.hpp"
#include "pod/job/host_checkpoints.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/host/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using ipupod::fuzz::Bytes;
using ipupod::fuzz::pick;
using ipupod::fuzz::Rng;
using ipupod::host::Checkpoint;
using ipupod::host::CheckpointError;
using ipupod::host::DType;
using ipupod::host::HostArray;

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

bool same(const Checkpoint& a, const Checkpoint& b) {
  if (a.step != b.step || a.config_json != b.config_json || a.state_json != b.state_json ||
      a.rng_states != b.rng_states || a.tensors.size() != b.tensors.size())
    return false;
  for (const auto& [name, array] : a.tensors) {
    const auto other = b.tensors.find(name);
    if (other == b.tensors.end() || other->second.dtype != array.dtype ||
        other->second.shape != array.shape || other->second.bytes != array.bytes)
      return false;
  }
  return true;
}

Checkpoint small_checkpoint(std::uint64_t step, float scale) {
  Checkpoint c;
  c.step = step;
  c.config_json = R"({"model":"mlp","hidden":[4]})";
  c.state_json = R"({"epoch":1,"step":0,"host_step":)" + std::to_string(step) + "}";
  c.tensors["fc0.weight"] =
      HostArray::from_values<float>({2, 3}, {scale, 2 * scale, 3, 4, 5, 6 * scale});
  c.tensors["fc0.weight/momentum"] = HostArray::from_values<float>({2, 3}, {0, 0, 1, 0, 0, -1});
  c.tensors["scale%"] = HostArray::zeros(DType::f16, {5});
  c.tensors["optimizer/step"] = HostArray::from_values<std::uint32_t>({1}, {7});
  c.rng_states["loader_shuffle"] = R"({"seed":1,"epoch":1})";
  return c;
}

TEST(FuzzCheckpoint, DamagedFilesLoadIntactOrAreRefusedWithAReason) {
  const ipupod::testing::TempDir dir;
  const Checkpoint first = small_checkpoint(15, 1), second = small_checkpoint(30, -2);
  ipupod::host::save_checkpoint(dir.file("a.h5"), first);
  ipupod::host::save_checkpoint(dir.file("b.h5"), second);
  const Bytes a = read_bytes(dir.file("a.h5")), b = read_bytes(dir.file("b.h5"));
  const std::string path = dir.file("fuzzed.h5");
  std::size_t refused = 0;
  const std::size_t runs =
      ipupod::fuzz::fuzz_loop("checkpoint files", 20000, 2000, [&](std::size_t, Rng& rng) {
        write_bytes(path, ipupod::fuzz::mutate_bytes(a, b, rng));
        try {
          const Checkpoint loaded = ipupod::host::load_checkpoint(path);
          EXPECT_TRUE(same(loaded, first) || same(loaded, second))
              << "a damaged checkpoint loaded with different contents";
        } catch (const CheckpointError& e) {
          ++refused;
          EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "not a CheckpointError: " << e.what();
        }
      });
  if (!ipupod::fuzz::replaying()) {
    EXPECT_GT(refused, runs / 2);  // most damage is found
  }
}

// A resume's inputs as write_checkpoint makes them, for a run of 15 host steps per epoch stopped
// after its first epoch.
struct ResumeSeed {
  ipupod::pod::TrainConfig config;
  ipupod::pod::Startup startup;
  nlohmann::json config_json, state, order, metrics;
  Checkpoint checkpoint;
};

ResumeSeed resume_seed(const std::string& checkpoint_path) {
  ResumeSeed s;
  s.config.model = "mlp";
  s.config.hidden = {4};
  s.config.epochs = 3;
  s.config.data = "data.h5";
  s.config.resume = checkpoint_path;
  s.startup.train_steps = 15;
  s.startup.test_steps = 2;
  s.startup.sample_shape = {3};
  s.startup.classes = 2;
  s.config_json = ipupod::pod::checkpoint_config(s.config, s.startup);
  s.metrics = {{"epochs",
                {{{"epoch", 1},
                  {"train_loss", 0.5},
                  {"test_loss", 0.25},
                  {"test_samples", 20},
                  {"measured_samples_per_s", 1000.0},
                  {"predicted_samples_per_s", 9000.0},
                  {"test_accuracy", 0.75}}}},
               {"metrics_csv", "0,0,0.7,10\n"}};
  s.state = {{"epoch", 1},           {"step", 0},
             {"host_step", 15},      {"epoch_loss", 0.0},
             {"train_seconds", 1.5}, {"metrics_file", "checkpoint-000015.metrics.json"},
             {"metrics_crc32c", 0},  {"cycles", {100, 20, 3}}};
  s.order = {{"generator", "mt19937_64 Fisher-Yates, seeded from (seed, epoch)"},
             {"seed", 1},
             {"shuffle", true},
             {"shuffle_window", 0},
             {"epoch", 1}};
  s.checkpoint.step = 15;
  s.checkpoint.tensors["fc0.weight"] =
      HostArray::from_values<float>({4, 3}, std::vector<float>(12, 0.5f));
  s.checkpoint.tensors["fc0.bias"] = HostArray::from_values<float>({4}, {0, 1, 2, 3});
  return s;
}

std::uint64_t text_crc(const std::string& text) {
  return ipupod::host::crc32c(std::as_bytes(std::span(text.data(), text.size())));
}

TEST(FuzzCheckpoint, MutatedResumeRecordsResumeOrAreRefusedWithAReason) {
  const ipupod::testing::TempDir dir;
  const std::string path = dir.file("checkpoint-000015.h5");
  const std::string metrics_path = dir.file("checkpoint-000015.metrics.json");
  const ResumeSeed seed = resume_seed(path);
  // load_resume says where it resumes from on stdout; the fuzz loop would print it thousands of
  // times.
  std::ostringstream quiet;
  std::streambuf* const stdout_buffer = std::cout.rdbuf(quiet.rdbuf());
  std::size_t resumed = 0;
  ipupod::fuzz::fuzz_loop("resume records", 20000, 500, [&](std::size_t i, Rng& rng) {
    nlohmann::json config = seed.config_json, state = seed.state, order = seed.order,
                   metrics = seed.metrics;
    Checkpoint checkpoint = seed.checkpoint;
    const std::size_t part = i == 0 ? 99 : pick(rng, 5);  // input 0: the seed itself
    if (part == 0) config = ipupod::fuzz::mutate_json(config, rng);
    if (part == 1) state = ipupod::fuzz::mutate_json(state, rng);
    if (part == 2) order = ipupod::fuzz::mutate_json(order, rng);
    if (part == 3) metrics = ipupod::fuzz::mutate_json(metrics, rng);
    if (part == 4) {
      HostArray& weight = checkpoint.tensors.at("fc0.weight");
      switch (pick(rng, 3)) {
        case 0:
          weight.as<float>()[pick(rng, 12)] = std::numeric_limits<float>::quiet_NaN();
          break;
        case 1:
          weight.as<float>()[pick(rng, 12)] = -std::numeric_limits<float>::infinity();
          break;
        default:
          weight = HostArray::zeros(DType::f32, {3, 4});
          break;
      }
    }
    const std::string other = seed.state.dump();
    const std::string metrics_text = ipupod::fuzz::json_text(metrics, other, rng);
    { std::ofstream(metrics_path, std::ios::binary | std::ios::trunc) << metrics_text; }
    if (state.is_object() && (part != 1 || pick(rng, 2) == 0))
      state["metrics_crc32c"] = text_crc(metrics_text);
    checkpoint.config_json = ipupod::fuzz::json_text(config, other, rng);
    checkpoint.state_json = ipupod::fuzz::json_text(state, other, rng);
    checkpoint.rng_states["loader_shuffle"] = ipupod::fuzz::json_text(order, other, rng);
    ipupod::host::save_checkpoint(path, checkpoint);
    ipupod::pod::Startup startup = seed.startup;
    ipupod::pod::Progress progress;
    try {
      ipupod::pod::load_resume(seed.config, startup, progress);
      ++resumed;
      EXPECT_TRUE(startup.resume);
      EXPECT_LT(progress.epoch, seed.config.epochs);
      EXPECT_LT(progress.step, seed.startup.train_steps);
      EXPECT_EQ(progress.host_step, progress.epoch * seed.startup.train_steps + progress.step);
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
    } catch (const ipupod::pod::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "neither CheckpointError nor UsageError: " << e.what();
    }
  });
  std::cout.rdbuf(stdout_buffer);
  if (!ipupod::fuzz::replaying()) {
    EXPECT_GE(resumed, 1u);  // the seed itself resumes
  }
}

}  // namespace
