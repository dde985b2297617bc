// Converter that makes the conductivity model's regression set: two-phase microstructure images
// labelled with their effective conductivity from a finite-volume solve (see conductivity.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/dataset_output.hpp"

namespace ipupod::datasets {

// Layout written (N images per split, S = size):
//   inputs          float32 [N,3,S,S]  the phase map (1 conducting, 0 solid) in all three
//                                      channels: the 3-channel [0,1] image the model expects
//   targets         float32 [N,1]      effective conductivity / conductivity of the conducting
//                                      phase, for a potential drop along the columns (x)
//   volume_fraction float32 [N,1]      share of conducting cells
//   kind            uint8   [N]        generator: 0 particles, 1 grf, 2 texture
// Sample i of a split is a pure function of (seed, split, i): counts and threads do not change it.
struct MicrostructureOptions {
  std::string out;
  bool overwrite = false;
  std::size_t size = 256;                // image side, as the conductivity model's input
  std::size_t train = 1216, test = 152;  // the sizes of the paper's data set
  // Generators used in turn: "particles", "grf", "texture". Empty = particles and grf, plus
  // texture when a texture image is available (--texture or scikit-image's gravel).
  std::vector<std::string> kinds;
  std::string texture;     // grey-scale texture image; empty = default_texture() if installed
  double contrast = 1e-3;  // conductivity of the solid relative to the conducting phase
  double min_fraction = 0.3, max_fraction = 0.7;  // range of the conducting share
  double tolerance = 1e-7;                        // CG relative residual
  std::uint64_t seed = 0;
  std::size_t threads = 0;  // 0 = std::thread::hardware_concurrency()
};

// scikit-image's CC0 gravel photograph (Debian python3-skimage), which looks like packed grains.
std::string default_texture();

ConversionSummary convert_microstructure(const MicrostructureOptions& options);

}  // namespace ipupod::datasets
