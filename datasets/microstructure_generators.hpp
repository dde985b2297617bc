// Two-phase microstructure images: random particle packings, thresholded Gaussian random fields
// and thresholded crops of a real texture. 1 = the conducting phase (pores), 0 = the solid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "datasets/image_io.hpp"
#include "datasets/random.hpp"

namespace ipupod::datasets {

// A size x size phase map, row-major, values 0 or 1.
using PhaseMap = std::vector<std::uint8_t>;

// Disks of random radii (size/40 .. size/10) dropped at random until the solid share reaches
// 1 - conducting_fraction; each disk first tries to keep clear of the others (a loose packing)
// and overlaps only when no free place turns up.
PhaseMap particle_packing(std::size_t size, double conducting_fraction, Random& random);

// White noise smoothed by a Gaussian of random correlation length (size/64 .. size/12), the
// conducting phase being the highest conducting_fraction of the values.
PhaseMap gaussian_random_field(std::size_t size, double conducting_fraction, Random& random);

// A random square crop (side between size and the texture's shorter side) of a grey texture,
// resampled to size x size, randomly flipped, with the darkest conducting_fraction of the
// pixels conducting (for gravel: the gaps between the stones).
PhaseMap texture_crop(const Image& grey_texture, std::size_t size, double conducting_fraction,
                      Random& random);

// The value below which `fraction` of `values` lie (by partial sorting a copy).
double quantile(std::vector<double> values, double fraction);

}  // namespace ipupod::datasets
