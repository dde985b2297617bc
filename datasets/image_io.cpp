// stb_image decoding (Debian's libstb provides the implementation) and the separable resampler.
#include "datasets/image_io.hpp"

#include <stb_image.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

constexpr double kByteScale = 255.0;
constexpr double kCubicA = -0.5;       // Keys (1981): the choice that is third-order accurate
constexpr double kCubicSupport = 2.0;  // the kernel is zero beyond |x| = 2 input pixels

// One output index's input taps and normalised weights along one axis.
struct Taps {
  std::vector<std::size_t> index;
  std::vector<double> weight;
};

std::vector<Taps> plan_axis(std::size_t in_size, std::size_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double stretch = std::max(1.0, scale);  // widen the kernel only when shrinking
  const double support = kCubicSupport * stretch;
  std::vector<Taps> plan(out_size);
  for (std::size_t o = 0; o < out_size; ++o) {
    const double centre = (static_cast<double>(o) + 0.5) * scale - 0.5;
    const auto first = static_cast<long>(std::floor(centre - support)) + 1;
    const auto last = static_cast<long>(std::floor(centre + support));
    double total = 0;
    for (long i = first; i <= last; ++i) {
      const double w = cubic_kernel((static_cast<double>(i) - centre) / stretch);
      if (w == 0) continue;
      const long clamped = std::clamp<long>(i, 0, static_cast<long>(in_size) - 1);
      plan[o].index.push_back(static_cast<std::size_t>(clamped));
      plan[o].weight.push_back(w);
      total += w;
    }
    for (double& w : plan[o].weight) w /= total;
  }
  return plan;
}

}  // namespace

double cubic_kernel(double x) {
  const double t = std::abs(x);
  if (t <= 1) return ((kCubicA + 2) * t - (kCubicA + 3)) * t * t + 1;
  if (t < 2) return ((kCubicA * t - 5 * kCubicA) * t + 8 * kCubicA) * t - 4 * kCubicA;
  return 0;
}

Image load_image(const std::string& path, int channels) {
  int width = 0, height = 0, stored = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> data(
      stbi_load(path.c_str(), &width, &height, &stored, channels), stbi_image_free);
  if (!data) {
    const char* reason = stbi_failure_reason();
    throw host::DatasetError("cannot decode image '" + path + "' (" +
                             (reason ? reason : "unknown reason") +
                             "); expected a readable JPEG or PNG file");
  }
  Image image;
  image.channels = static_cast<std::size_t>(channels);
  image.height = static_cast<std::size_t>(height);
  image.width = static_cast<std::size_t>(width);
  image.pixels.resize(image.channels * image.height * image.width);
  const unsigned char* interleaved = data.get();
  for (std::size_t y = 0; y < image.height; ++y) {
    for (std::size_t x = 0; x < image.width; ++x) {
      for (std::size_t c = 0; c < image.channels; ++c) {
        image.at(c, y, x) = static_cast<float>(
            interleaved[(y * image.width + x) * image.channels + c] / kByteScale);
      }
    }
  }
  return image;
}

bool image_size(const std::string& path, std::size_t& width, std::size_t& height) {
  int w = 0, h = 0, c = 0;
  if (!stbi_info(path.c_str(), &w, &h, &c)) return false;
  width = static_cast<std::size_t>(w);
  height = static_cast<std::size_t>(h);
  return true;
}

Image crop(const Image& image, std::size_t y, std::size_t x, std::size_t height,
           std::size_t width) {
  Image out{image.channels, height, width, std::vector<float>(image.channels * height * width)};
  for (std::size_t c = 0; c < image.channels; ++c) {
    for (std::size_t r = 0; r < height; ++r) {
      const float* row = &image.pixels[(c * image.height + y + r) * image.width + x];
      std::copy(row, row + width, &out.at(c, r, 0));
    }
  }
  return out;
}

Image resize_bicubic(const Image& image, std::size_t height, std::size_t width) {
  const std::vector<Taps> rows = plan_axis(image.height, height);
  const std::vector<Taps> cols = plan_axis(image.width, width);
  // Columns first (into a height x width-out buffer), then rows.
  std::vector<double> horizontal(image.height * width);
  Image out{image.channels, height, width, std::vector<float>(image.channels * height * width)};
  for (std::size_t c = 0; c < image.channels; ++c) {
    for (std::size_t y = 0; y < image.height; ++y) {
      for (std::size_t x = 0; x < width; ++x) {
        double sum = 0;
        for (std::size_t k = 0; k < cols[x].index.size(); ++k) {
          sum += cols[x].weight[k] * image.at(c, y, cols[x].index[k]);
        }
        horizontal[y * width + x] = sum;
      }
    }
    for (std::size_t y = 0; y < height; ++y) {
      for (std::size_t x = 0; x < width; ++x) {
        double sum = 0;
        for (std::size_t k = 0; k < rows[y].index.size(); ++k) {
          sum += rows[y].weight[k] * horizontal[rows[y].index[k] * width + x];
        }
        out.at(c, y, x) = static_cast<float>(std::clamp(sum, 0.0, 1.0));
      }
    }
  }
  return out;
}

void save_rgb8(const std::string& path, const std::vector<unsigned char>& rgb, std::size_t height,
               std::size_t width, const std::string& format) {
  const int w = static_cast<int>(width), h = static_cast<int>(height);
  if (rgb.size() != height * width * 3)
    throw host::DatasetError("save_rgb8: " + std::to_string(rgb.size()) + " bytes for " +
                             std::to_string(width) + "x" + std::to_string(height) + " RGB");
  const int ok = format == "jpeg" ? stbi_write_jpg(path.c_str(), w, h, 3, rgb.data(), 90)
                                  : stbi_write_png(path.c_str(), w, h, 3, rgb.data(), w * 3);
  if (!ok) throw host::DatasetError("cannot write the image '" + path + "'");
}

}  // namespace ipupod::datasets
