// Subcommands of `ipupod data`, one per converter.
#include "datasets/cli.hpp"

#include <iostream>
#include <memory>

#include "cli_checks/option_checks.hpp"
#include "datasets/climate.hpp"
#include "datasets/fashion_mnist.hpp"
#include "datasets/microstructure.hpp"
#include "datasets/sr_images.hpp"
#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

// Runs a converter and maps its failures to exit codes with a message on stderr.
template <class Convert>
int run_converter(const Convert& convert) {
  try {
    std::cout << convert().summary() << std::endl;
    return 0;
  } catch (const host::DatasetError& e) {
    std::cerr << "ipupod data: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "ipupod data: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ipupod data: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

// Bounds of the converters' counts, checked on the option's text (CLI11 would wrap -1 into a
// huge unsigned); the converters check what depends on the data.
constexpr std::uint64_t kMaxCount = 2147483647;  // samples, crops, slices, photographs
constexpr std::uint64_t kMaxSide = 65536;        // pixels or grid cells of a side
constexpr std::uint64_t kMaxScale = 64;
constexpr std::uint64_t kMaxThreads = 4096;

void add_data_commands(CLI::App& data, int& exit_code) {
  using cli::finite_number;
  using cli::whole_number;
  auto fmnist = std::make_shared<FashionMnistOptions>();
  CLI::App* fm =
      data.add_subcommand("fashion-mnist", "Fashion-MNIST from Debian's dataset-fashion-mnist");
  fm->add_option("--out", fmnist->out, "Output HDF5 file")->required();
  fm->add_option("--source", fmnist->source_dir, "Folder of the four IDX .gz files")
      ->capture_default_str();
  fm->add_flag("--force", fmnist->overwrite, "Overwrite an existing output file");
  fm->add_option("--limit-train", fmnist->limit_train, "Keep the first N training samples (0: all)")
      ->check(whole_number(0, kMaxCount));
  fm->add_option("--limit-test", fmnist->limit_test, "Keep the first N test samples (0: all)")
      ->check(whole_number(0, kMaxCount));
  fm->callback([fmnist, &exit_code] {
    exit_code = run_converter([&] { return convert_fashion_mnist(*fmnist); });
  });

  auto climate = std::make_shared<ClimateOptions>();
  CLI::App* cl = data.add_subcommand(
      "climate", "64x64 standardised patches of netCDF climate fields (hierarchical autoencoder)");
  cl->add_option("--out", climate->out, "Output HDF5 file")->required();
  cl->add_flag("--force", climate->overwrite, "Overwrite an existing output file");
  cl->add_option("--field", climate->fields,
                 "FILE:VARIABLE of a gridded netCDF field, repeatable (default: " +
                     join(default_climate_fields(), ", ") + ")");
  cl->add_option("--patch", climate->patch, "Patch side in grid cells")
      ->check(whole_number(1, kMaxSide))
      ->capture_default_str();
  cl->add_option("--stride", climate->stride, "Distance between patch starts")
      ->check(whole_number(1, kMaxSide))
      ->capture_default_str();
  cl->add_option("--test-fraction", climate->test_fraction,
                 "Share of each field's outermost (time) dimension held out for testing")
      ->check(finite_number({.min = 0, .max = 1, .min_open = true, .max_open = true}))
      ->capture_default_str();
  cl->add_option("--min-valid", climate->min_valid_fraction,
                 "Drop patches with a smaller share of real (not land/missing) cells")
      ->check(finite_number({.min = 0, .max = 1}))
      ->capture_default_str();
  cl->add_option("--max-slices", climate->max_slices,
                 "Read at most N entries of each field's outermost dimension (0: all)")
      ->check(whole_number(0, kMaxCount));
  cl->callback([climate, &exit_code] {
    exit_code = run_converter([&] { return convert_climate(*climate); });
  });

  auto sr = std::make_shared<SrImagesOptions>();
  CLI::App* si = data.add_subcommand(
      "sr-images", "High-resolution RGB crops of real photographs and their bicubic x4 versions");
  si->add_option("--out", sr->out, "Output HDF5 file")->required();
  si->add_flag("--force", sr->overwrite, "Overwrite an existing output file");
  si->add_option("--image", sr->images,
                 "Image file, wallpaper package folder or folder of .jpg/.png, repeatable "
                 "(default: the 11 photographs of plasma-workspace-wallpapers)");
  si->add_flag("--skimage", sr->skimage, "Add scikit-image's photographs (python3-skimage)");
  si->add_option("--crop", sr->crop, "High-resolution crop side in pixels")
      ->check(whole_number(1, kMaxSide))
      ->capture_default_str();
  si->add_option("--scale", sr->scale, "Reduction factor of the low-resolution version")
      ->check(whole_number(1, kMaxScale))
      ->capture_default_str();
  si->add_option("--crops-per-image", sr->crops_per_image, "Random crops from each photograph")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  si->add_option("--test-fraction", sr->test_fraction, "Share of the photographs held out")
      ->check(finite_number({.min = 0, .max = 1, .min_open = true, .max_open = true}))
      ->capture_default_str();
  si->add_flag("!--lr-native", sr->lr_upsampled,
               "Store the low-resolution inputs at crop/scale instead of upsampled to the crop");
  si->add_option("--seed", sr->seed, "Seed of the split and the crop positions")
      ->check(whole_number(0))
      ->capture_default_str();
  si->add_option("--max-images", sr->max_images, "Use the first N photographs by name (0: all)")
      ->check(whole_number(0, kMaxCount));
  si->callback(
      [sr, &exit_code] { exit_code = run_converter([&] { return convert_sr_images(*sr); }); });

  auto micro = std::make_shared<MicrostructureOptions>();
  CLI::App* mi = data.add_subcommand(
      "microstructure", "Two-phase microstructures labelled with their effective conductivity");
  mi->add_option("--out", micro->out, "Output HDF5 file")->required();
  mi->add_flag("--force", micro->overwrite, "Overwrite an existing output file");
  mi->add_option("--size", micro->size, "Image side in cells")
      ->check(whole_number(1, kMaxSide))
      ->capture_default_str();
  mi->add_option("--train", micro->train, "Training samples")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  mi->add_option("--test", micro->test, "Test samples")
      ->check(whole_number(1, kMaxCount))
      ->capture_default_str();
  mi->add_option("--kind", micro->kinds,
                 "Generator, repeatable: particles, grf, texture (default: particles, grf, and "
                 "texture when a texture image is available)");
  mi->add_option("--texture", micro->texture,
                 "Grey-scale texture image for --kind texture (default: scikit-image's gravel)");
  mi->add_option("--contrast", micro->contrast,
                 "Conductivity of the solid relative to the conducting phase")
      ->check(finite_number({.min = 0, .min_open = true}))
      ->capture_default_str();
  mi->add_option("--min-fraction", micro->min_fraction, "Smallest conducting share")
      ->check(finite_number({.min = 0, .max = 1, .min_open = true, .max_open = true}))
      ->capture_default_str();
  mi->add_option("--max-fraction", micro->max_fraction, "Largest conducting share")
      ->check(finite_number({.min = 0, .max = 1, .min_open = true, .max_open = true}))
      ->capture_default_str();
  mi->add_option("--tolerance", micro->tolerance, "Relative residual of the CG solve")
      ->check(finite_number({.min = 0, .max = 1, .min_open = true, .max_open = true}))
      ->capture_default_str();
  mi->add_option("--seed", micro->seed, "Seed of the generators")
      ->check(whole_number(0))
      ->capture_default_str();
  mi->add_option("--threads", micro->threads, "Worker threads (0: one per core)")
      ->check(whole_number(0, kMaxThreads));
  mi->callback([micro, &exit_code] {
    exit_code = run_converter([&] { return convert_microstructure(*micro); });
  });
}

}  // namespace ipupod::datasets
