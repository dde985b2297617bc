// Microstructure converter: samples are generated and solved on worker threads, each into its
// own slot, so the output is the same for any thread count.
#include "datasets/microstructure.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <tuple>

#include "datasets/conductivity.hpp"
#include "datasets/image_io.hpp"
#include "datasets/microstructure_generators.hpp"
#include "datasets/random.hpp"
#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;
using host::DType;
using host::HostArray;

constexpr const char* kGravel = "/usr/lib/python3/dist-packages/skimage/data/gravel.png";
constexpr const char* kKindNames[] = {"particles", "grf", "texture"};
constexpr std::size_t kChannels = 3;
constexpr std::size_t kMinSize = 8;  // smaller images hold too few cells for a random medium
// Test samples draw from seed streams above every train index.
constexpr std::uint64_t kTestStreamOffset = std::uint64_t{1} << 40;

struct Sample {
  PhaseMap phase;
  double fraction = 0, effective = 0;
  std::size_t iterations = 0;
  bool within_hs = false;
};

std::vector<std::uint8_t> resolve_kinds(const MicrostructureOptions& options, bool have_texture) {
  std::vector<std::uint8_t> kinds;
  if (options.kinds.empty()) {
    kinds = {0, 1};
    if (have_texture) kinds.push_back(2);
    return kinds;
  }
  for (const std::string& name : options.kinds) {
    const auto* found = std::find(std::begin(kKindNames), std::end(kKindNames), name);
    if (found == std::end(kKindNames)) {
      throw DatasetError("--kind '" + name + "': expected particles, grf or texture");
    }
    const auto kind = static_cast<std::uint8_t>(found - std::begin(kKindNames));
    if (kind == 2 && !have_texture) {
      throw DatasetError(
          "--kind texture needs a texture image: pass --texture FILE, or install "
          "the Debian package python3-skimage for its gravel photograph");
    }
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  return kinds;
}

void check_options(const MicrostructureOptions& options) {
  if (options.size < kMinSize) {
    throw DatasetError("--size " + std::to_string(options.size) + " is too small; use at least " +
                       std::to_string(kMinSize));
  }
  if (options.train == 0 || options.test == 0) {
    throw DatasetError("--train and --test must be at least 1 (got " +
                       std::to_string(options.train) + " and " + std::to_string(options.test) +
                       ")");
  }
  if (!(options.contrast > 0 && options.contrast < 1)) {
    throw DatasetError(
        "--contrast must lie strictly between 0 and 1 (the solid's conductivity "
        "relative to the conducting phase), got " +
        to_text(options.contrast));
  }
  if (!(options.min_fraction > 0 && options.min_fraction <= options.max_fraction &&
        options.max_fraction < 1)) {
    throw DatasetError("conducting fractions need 0 < --min-fraction <= --max-fraction < 1, got " +
                       to_text(options.min_fraction) + " and " + to_text(options.max_fraction));
  }
  if (!(options.tolerance > 0 && options.tolerance < 1)) {
    throw DatasetError("--tolerance must lie strictly between 0 and 1, got " +
                       to_text(options.tolerance));
  }
}

Sample make_sample(std::uint8_t kind, std::uint64_t seed, const Image* texture,
                   const MicrostructureOptions& options) {
  Random random(seed);
  const double target = random.uniform(options.min_fraction, options.max_fraction);
  Sample sample;
  switch (kind) {
    case 0:
      sample.phase = particle_packing(options.size, target, random);
      break;
    case 1:
      sample.phase = gaussian_random_field(options.size, target, random);
      break;
    default:
      sample.phase = texture_crop(*texture, options.size, target, random);
      break;
  }
  std::vector<double> k(sample.phase.size());
  std::size_t conducting = 0;
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = sample.phase[i] ? 1.0 : options.contrast;
    conducting += sample.phase[i];
  }
  sample.fraction = static_cast<double>(conducting) / static_cast<double>(k.size());
  const ConductivitySolution solution =
      solve_effective_conductivity(k, options.size, options.size, {.tolerance = options.tolerance});
  sample.effective = solution.effective;
  sample.iterations = solution.iterations;
  const ConductivityBounds hs = hashin_shtrikman_bounds_2d(1.0, options.contrast, sample.fraction);
  sample.within_hs = sample.effective >= hs.lower && sample.effective <= hs.upper;
  return sample;
}

// Runs make_sample for every index on `threads` workers; the first failure is rethrown.
std::vector<Sample> make_split(std::size_t count, std::uint64_t stream_offset,
                               const std::vector<std::uint8_t>& kinds, const Image* texture,
                               const MicrostructureOptions& options, std::size_t threads) {
  std::vector<Sample> samples(count);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    for (std::size_t i = next++; i < count && !failed; i = next++) {
      try {
        samples[i] = make_sample(kinds[i % kinds.size()],
                                 derive_seed(options.seed, stream_offset + i), texture, options);
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failed.exchange(true)) failure = std::current_exception();
      }
    }
  };
  std::vector<std::jthread> workers;
  for (std::size_t t = 1; t < threads; ++t) workers.emplace_back(work);
  work();
  for (auto& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
  return samples;
}

}  // namespace

std::string default_texture() {
  std::error_code ec;
  return std::filesystem::is_regular_file(kGravel, ec) ? kGravel : "";
}

ConversionSummary convert_microstructure(const MicrostructureOptions& options) {
  check_options(options);
  DatasetOutput output(options.out, options.overwrite);
  const std::string texture_path = options.texture.empty() ? default_texture() : options.texture;
  if (!options.texture.empty() && !std::filesystem::exists(options.texture)) {
    throw DatasetError("--texture '" + options.texture + "' does not exist; pass a JPEG/PNG file");
  }
  const std::vector<std::uint8_t> kinds = resolve_kinds(options, !texture_path.empty());
  Image texture;
  const bool uses_texture = std::find(kinds.begin(), kinds.end(), 2) != kinds.end();
  if (uses_texture) {
    texture = load_image(texture_path, 1);
    if (std::min(texture.height, texture.width) < kMinSize) {
      throw DatasetError("texture '" + texture_path + "' is too small (" +
                         std::to_string(texture.width) + "x" + std::to_string(texture.height) +
                         ")");
    }
  } else if (options.kinds.empty()) {
    output.add_note(
        "no texture image (install python3-skimage for its gravel or pass --texture): "
        "generators particles and grf only");
  }
  const std::size_t threads =
      options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());

  std::vector<std::string> kind_names;
  for (std::uint8_t kind : kinds) kind_names.push_back(kKindNames[kind]);
  const std::size_t size = options.size, cells = size * size;
  for (const auto& [name, count, offset] : {std::tuple{"train", options.train, std::uint64_t{0}},
                                            std::tuple{"test", options.test, kTestStreamOffset}}) {
    const std::vector<Sample> samples =
        make_split(count, offset, kinds, uses_texture ? &texture : nullptr, options, threads);
    HostArray inputs = HostArray::zeros(DType::f32, {count, kChannels, size, size});
    HostArray targets = HostArray::zeros(DType::f32, {count, 1});
    HostArray fractions = HostArray::zeros(DType::f32, {count, 1});
    HostArray kind_array = HostArray::zeros(DType::u8, {count});
    auto in = inputs.as<float>();
    std::size_t max_iterations = 0, within_hs = 0;
    double sum = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const Sample& sample = samples[i];
      for (std::size_t c = 0; c < kChannels; ++c) {
        std::transform(sample.phase.begin(), sample.phase.end(),
                       in.begin() + static_cast<long>((i * kChannels + c) * cells),
                       [](std::uint8_t p) { return static_cast<float>(p); });
      }
      targets.as<float>()[i] = static_cast<float>(sample.effective);
      fractions.as<float>()[i] = static_cast<float>(sample.fraction);
      kind_array.as<std::uint8_t>()[i] = kinds[i % kinds.size()];
      max_iterations = std::max(max_iterations, sample.iterations);
      within_hs += sample.within_hs;
      sum += sample.effective;
    }
    output.set_attribute(name, "target_mean", sum / static_cast<double>(count));
    output.set_attribute(name, "within_hashin_shtrikman", static_cast<double>(within_hs));
    output.set_split(name, std::move(inputs), std::move(targets));
    output.add_extra(name, "volume_fraction", std::move(fractions));
    output.add_extra(name, "kind", std::move(kind_array));
    output.add_note(std::string(name) + ": mean effective conductivity " +
                    to_text(sum / static_cast<double>(count)) + ", " + std::to_string(within_hs) +
                    "/" + std::to_string(count) +
                    " inside the 2-D Hashin-Shtrikman bounds, at most " +
                    std::to_string(max_iterations) + " CG iterations");
  }
  output.set_attribute("source", "generated: " + join(kind_names) +
                                     (uses_texture ? " (texture: " + texture_path + ")" : ""));
  output.set_attribute("license", uses_texture
                                      ? "generated data; texture: see the copyright of its package"
                                      : "generated data, no third-party content");
  output.set_attribute("description",
                       "Two-phase microstructures labelled with their effective conductivity "
                       "(finite volumes, potential drop across the columns, no flux through the "
                       "rows' ends, MIC(0)-preconditioned conjugate gradients)");
  output.set_attribute("units",
                       "inputs: phase (1 conducting, 0 solid) in 3 channels; targets: "
                       "effective conductivity relative to the conducting phase");
  output.set_attribute("normalisation", "none: inputs are 0/1, targets lie in [contrast, 1]");
  output.set_attribute("kinds", "0 particles, 1 grf, 2 texture; used: " + join(kind_names));
  output.set_attribute("contrast", to_text(options.contrast));
  output.set_attribute("tolerance", to_text(options.tolerance));
  output.set_attribute("seed", std::to_string(options.seed));
  return output.finish();
}

}  // namespace ipupod::datasets
