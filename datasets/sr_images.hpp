// Converter from real photographs (Debian plasma-workspace-wallpapers; optionally skimage's
// photos) to super-resolution pairs: high-resolution RGB crops and their bicubic x4 versions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/dataset_output.hpp"

namespace ipupod::datasets {

// Layout written (N crops per split, C = crop, S = scale), all float32 in [0,1], NCHW:
//   targets   [N,3,C,C]      high-resolution crops of the photographs
//   inputs    [N,3,C,C]      their bicubic x(1/S) reductions upsampled back to CxC (bicubic), the
//                            low-resolution domain of the CycleGAN; with lr_upsampled = false
//                            inputs are the [N,3,C/S,C/S] reductions themselves
//   lr_small  [N,3,C/S,C/S]  the reductions (only when inputs are upsampled)
//   origin    int32 [N,3]    image index (into the 'images' attribute), top row, left column
// Whole photographs go to one split (crops of one photograph never straddle train and test).
struct SrImagesOptions {
  // Image files, or directories: a wallpaper package (DIR/contents/images; its largest image is
  // used) or a folder whose .jpg/.png files are all used. Empty = default_sr_images().
  std::vector<std::string> images;
  bool skimage = false;  // add scikit-image's photographs (Debian python3-skimage)
  std::string out;
  bool overwrite = false;
  std::size_t crop = 64;              // high-resolution crop side (the generator's input)
  std::size_t scale = 4;              // reduction factor of the low-resolution version
  std::size_t crops_per_image = 256;  // random crops taken from every photograph
  double test_fraction = 0.2;         // share of the photographs held out (at least one)
  bool lr_upsampled = true;
  std::uint64_t seed = 0;
  std::size_t max_images = 0;  // use the first N photographs in name order (0 = all)
};

// The image files the options name (wallpaper packages: their largest image; folders: their
// .jpg/.png files; the defaults when none), sorted; DatasetError when one does not exist.
std::vector<std::string> resolve_images(const SrImagesOptions& options);

// The 11 photographs of plasma-workspace-wallpapers (the other wallpapers are renderings).
std::vector<std::string> default_sr_images();
// skimage's colour photographs, if python3-skimage is installed (empty otherwise).
std::vector<std::string> skimage_photographs();

// Throws host::DatasetError for bad options or inputs, naming the file and what to change.
ConversionSummary convert_sr_images(const SrImagesOptions& options);

}  // namespace ipupod::datasets
