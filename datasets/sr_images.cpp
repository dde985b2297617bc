// Super-resolution pairs: resolve the photograph list, split it by photograph with a seeded
// shuffle, take seeded random crops of each and reduce them with the bicubic resampler.
#include "datasets/sr_images.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "datasets/image_io.hpp"
#include "datasets/random.hpp"
#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

namespace fs = std::filesystem;
using host::DatasetError;
using host::DType;
using host::HostArray;

constexpr const char* kWallpapers = "/usr/share/wallpapers/";
constexpr const char* kPhotographs[] = {"BytheWater",   "ColdRipple", "ColorfulCups", "DarkestHour",
                                        "EveningGlow",  "FallenLeaf", "Grey",         "Kite",
                                        "OneStandsOut", "Path",       "summer_1am"};
constexpr const char* kSkimageData = "/usr/lib/python3/dist-packages/skimage/data/";
constexpr const char* kSkimagePhotographs[] = {"astronaut.png", "chelsea.png", "coffee.png",
                                               "rocket.png", "hubble_deep_field.jpg"};
constexpr int kRgb = 3;
constexpr std::size_t kOriginColumns = 3;  // image, row, column
// Streams of derive_seed: the photograph order uses one stream, image i's crops stream 1 + i.
constexpr std::uint64_t kOrderStream = 0;

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The largest image (by pixel count from its header) of a wallpaper package directory. Many of
// a package's sizes are symbolic links to one file, so links are resolved first.
std::string largest_image(const fs::path& images_dir) {
  std::string best;
  std::size_t best_pixels = 0;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(images_dir)) {
    files.push_back(fs::weakly_canonical(entry.path()));
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::size_t width = 0, height = 0;
    if (!is_image_file(file) || !image_size(file.string(), width, height)) continue;
    if (width * height > best_pixels) {
      best_pixels = width * height;
      best = file.string();
    }
  }
  return best;
}

// "Path" for /usr/share/wallpapers/Path/contents/images/2560x1600.jpg, else the file name.
std::string display_name(const std::string& file) {
  const fs::path path(file);
  if (path.parent_path().filename() == "images" &&
      path.parent_path().parent_path().filename() == "contents") {
    return path.parent_path().parent_path().parent_path().filename().string();
  }
  return path.filename().string();
}

}  // namespace

std::vector<std::string> resolve_images(const SrImagesOptions& options) {
  std::vector<std::string> requested =
      options.images.empty() ? default_sr_images() : options.images;
  if (options.skimage) {
    const std::vector<std::string> extra = skimage_photographs();
    if (extra.empty()) {
      throw DatasetError(std::string("--skimage: no photographs under ") + kSkimageData +
                         "; install the Debian package python3-skimage or drop --skimage");
    }
    requested.insert(requested.end(), extra.begin(), extra.end());
  }
  std::vector<std::string> files;
  for (const std::string& item : requested) {
    std::error_code ec;
    const fs::path path(item);
    if (fs::is_regular_file(path, ec)) {
      files.push_back(fs::weakly_canonical(path).string());
    } else if (fs::is_directory(path / "contents" / "images", ec)) {
      const std::string best = largest_image(path / "contents" / "images");
      if (best.empty()) throw DatasetError("wallpaper '" + item + "' holds no JPEG/PNG image");
      files.push_back(best);
    } else if (fs::is_directory(path, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.is_regular_file() && is_image_file(entry.path())) found.push_back(entry.path());
      }
      if (found.empty()) throw DatasetError("folder '" + item + "' holds no .jpg or .png file");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      throw DatasetError("image source '" + item +
                         "' does not exist; install the Debian package "
                         "plasma-workspace-wallpapers or pass existing files/folders with --image");
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  if (options.max_images != 0 && files.size() > options.max_images)
    files.resize(options.max_images);
  if (files.size() < 2) {
    throw DatasetError(
        "super-resolution pairs need at least 2 photographs (one for each split), "
        "got " +
        std::to_string(files.size()) + "; pass more with --image");
  }
  return files;
}

void check_options(const SrImagesOptions& options) {
  if (options.scale < 2 || options.crop == 0 || options.crop % options.scale != 0) {
    throw DatasetError("--crop " + std::to_string(options.crop) +
                       " must be a positive multiple of "
                       "--scale " +
                       std::to_string(options.scale) + " (at least 2)");
  }
  if (options.crops_per_image == 0) throw DatasetError("--crops-per-image must be at least 1");
  if (!(options.test_fraction > 0 && options.test_fraction < 1)) {
    throw DatasetError("--test-fraction must lie strictly between 0 and 1, got " +
                       to_text(options.test_fraction));
  }
}

struct SplitArrays {
  HostArray inputs, targets, lr_small, origin;
  std::size_t next = 0;
  double sum = 0;  // of high-resolution pixel values, for the mean attribute
};

SplitArrays make_split(std::size_t samples, const SrImagesOptions& options) {
  const std::size_t lr = options.crop / options.scale;
  const std::size_t input_side = options.lr_upsampled ? options.crop : lr;
  SplitArrays split;
  split.inputs = HostArray::zeros(DType::f32, {samples, kRgb, input_side, input_side});
  split.targets = HostArray::zeros(DType::f32, {samples, kRgb, options.crop, options.crop});
  if (options.lr_upsampled) split.lr_small = HostArray::zeros(DType::f32, {samples, kRgb, lr, lr});
  split.origin = HostArray::zeros(DType::i32, {samples, kOriginColumns});
  return split;
}

void put(std::span<float> out, std::size_t sample, const Image& image) {
  std::copy(image.pixels.begin(), image.pixels.end(), out.begin() + sample * image.pixels.size());
}

std::vector<std::string> default_sr_images() {
  std::vector<std::string> dirs;
  for (const char* name : kPhotographs) dirs.push_back(std::string(kWallpapers) + name);
  return dirs;
}

std::vector<std::string> skimage_photographs() {
  std::vector<std::string> files;
  for (const char* name : kSkimagePhotographs) {
    const std::string path = std::string(kSkimageData) + name;
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) files.push_back(path);
  }
  return files;
}

ConversionSummary convert_sr_images(const SrImagesOptions& options) {
  check_options(options);
  DatasetOutput output(options.out, options.overwrite);
  const std::vector<std::string> files = resolve_images(options);

  // Seeded shuffle of the photographs; the last test_fraction of them are the test set.
  std::vector<std::size_t> order(files.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  Random order_random(derive_seed(options.seed, kOrderStream));
  for (std::size_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[order_random.below(i + 1)]);
  const auto test_images = std::clamp<std::size_t>(
      static_cast<std::size_t>(
          std::ceil(options.test_fraction * static_cast<double>(files.size()))),
      1, files.size() - 1);
  const std::size_t train_images = files.size() - test_images;

  const std::size_t lr = options.crop / options.scale;
  SplitArrays splits[2] = {make_split(train_images * options.crops_per_image, options),
                           make_split(test_images * options.crops_per_image, options)};
  std::vector<std::string> split_names[2];
  for (std::size_t rank = 0; rank < order.size(); ++rank) {
    const std::size_t index = order[rank];
    SplitArrays& split = splits[rank < train_images ? 0 : 1];
    split_names[rank < train_images ? 0 : 1].push_back(display_name(files[index]));
    const Image photo = load_image(files[index], kRgb);
    if (photo.height < options.crop || photo.width < options.crop) {
      throw DatasetError("image '" + files[index] + "' is " + std::to_string(photo.width) + "x" +
                         std::to_string(photo.height) + ", smaller than a " +
                         std::to_string(options.crop) + "-pixel crop; drop it or lower --crop");
    }
    Random random(derive_seed(options.seed, 1 + index));
    for (std::size_t k = 0; k < options.crops_per_image; ++k) {
      const std::size_t y = random.below(photo.height - options.crop + 1);
      const std::size_t x = random.below(photo.width - options.crop + 1);
      const Image high = crop(photo, y, x, options.crop, options.crop);
      const Image low = resize_bicubic(high, lr, lr);
      const std::size_t sample = split.next++;
      put(split.targets.as<float>(), sample, high);
      if (options.lr_upsampled) {
        put(split.inputs.as<float>(), sample, resize_bicubic(low, options.crop, options.crop));
        put(split.lr_small.as<float>(), sample, low);
      } else {
        put(split.inputs.as<float>(), sample, low);
      }
      for (float v : high.pixels) split.sum += v;
      const std::int32_t origin[kOriginColumns] = {static_cast<std::int32_t>(index),
                                                   static_cast<std::int32_t>(y),
                                                   static_cast<std::int32_t>(x)};
      std::copy(origin, origin + kOriginColumns,
                split.origin.as<std::int32_t>().begin() + sample * kOriginColumns);
    }
  }

  const char* names[2] = {"train", "test"};
  for (int s = 0; s < 2; ++s) {
    SplitArrays& split = splits[s];
    output.set_attribute(names[s], "pixel_mean",
                         split.sum / static_cast<double>(split.targets.elements()));
    output.set_attribute(names[s], "images", static_cast<double>(split_names[s].size()));
    output.set_split(names[s], std::move(split.inputs), std::move(split.targets));
    if (options.lr_upsampled) output.add_extra(names[s], "lr_small", std::move(split.lr_small));
    output.add_extra(names[s], "origin", std::move(split.origin));
    output.add_note(std::string(names[s]) + " photographs: " + join(split_names[s]));
  }
  output.set_attribute("images", join(files));
  output.set_attribute("source", "photographs: " + join(files));
  output.set_attribute("license",
                       "plasma-workspace-wallpapers: GPL-2+ (KDE Visual Design Group); "
                       "skimage photographs: see /usr/share/doc/python3-skimage/copyright");
  output.set_attribute("description",
                       "Super-resolution pairs: " + std::to_string(options.crop) + "x" +
                           std::to_string(options.crop) +
                           " RGB crops of real photographs "
                           "(targets) and their bicubic x" +
                           std::to_string(options.scale) + " reductions (inputs" +
                           (options.lr_upsampled ? ", upsampled back by bicubic)" : ")"));
  output.set_attribute("units", "RGB intensity in [0,1], NCHW");
  output.set_attribute("normalisation", "pixel/255; resampled values clamped to [0,1]");
  output.set_attribute("resampling",
                       "separable bicubic (Keys a=-0.5), kernel widened by the scale when "
                       "shrinking (antialiased, like MATLAB imresize), edges replicated");
  output.set_attribute("split", "by photograph, seeded shuffle: train " + join(split_names[0]) +
                                    "; test " + join(split_names[1]));
  output.set_attribute("seed", std::to_string(options.seed));
  return output.finish();
}

}  // namespace ipupod::datasets
