// Images for the converters: decoding JPEG/PNG files with stb_image into planar float [0,1]
// pixels, crops, and a separable bicubic resampler that antialiases when it shrinks.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ipupod::datasets {

// Planar (channel, row, column) pixels in [0,1], the NCHW order of the training data.
struct Image {
  std::size_t channels = 0, height = 0, width = 0;
  std::vector<float> pixels;

  float& at(std::size_t c, std::size_t y, std::size_t x) {
    return pixels[(c * height + y) * width + x];
  }
  float at(std::size_t c, std::size_t y, std::size_t x) const {
    return pixels[(c * height + y) * width + x];
  }
};

// Decodes `path` with `channels` = 3 (RGB; grey is replicated, alpha dropped) or 1 (luma).
// Throws host::DatasetError naming the file and stb's reason if it cannot be decoded.
Image load_image(const std::string& path, int channels);

// The width and height stored in an image file's header, without decoding the pixels.
bool image_size(const std::string& path, std::size_t& width, std::size_t& height);

// Writes 8-bit interleaved RGB pixels (row by row) as a PNG or, with format "jpeg", a JPEG of
// quality 90; throws host::DatasetError if the file cannot be written.
void save_rgb8(const std::string& path, const std::vector<unsigned char>& rgb, std::size_t height,
               std::size_t width, const std::string& format);

Image crop(const Image& image, std::size_t y, std::size_t x, std::size_t height, std::size_t width);

// Bicubic resampling (Keys' cubic convolution, a = -0.5) with pixel centres aligned and edges
// replicated. When shrinking, the kernel is widened by the scale factor so that it averages
// over every input pixel it covers (antialiasing, as MATLAB's imresize does: the usual way the
// low-resolution images of super-resolution benchmarks are made). Results are clamped to [0,1].
Image resize_bicubic(const Image& image, std::size_t height, std::size_t width);

// Keys' cubic convolution kernel with a = -0.5 (exported for tests).
double cubic_kernel(double x);

}  // namespace ipupod::datasets
