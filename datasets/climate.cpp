// Climate converter: reads each field with netcdf_field, standardises it with statistics of its
// training part, cuts overlapping patches, drops mostly-missing ones and writes both splits.
#include "datasets/climate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>

#include "datasets/netcdf_field.hpp"
#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;
using host::DType;
using host::HostArray;

constexpr const char* kFerretData = "/usr/share/ferret-vis/data/";
constexpr const char* kNcargData = "/usr/share/ncarg/data/";
constexpr std::size_t kTargetChannels = 2;  // the patch and its mask
constexpr std::size_t kOriginColumns = 4;   // field, slice, row, column

struct Region {
  std::size_t first_slice = 0, end_slice = 0;  // flattened outer dimensions
  std::size_t first_col = 0, end_col = 0;
};

struct PatchRef {
  std::size_t field = 0, slice = 0, row = 0, col = 0;
};

struct FieldPlan {
  NetcdfField data;
  std::string name;  // "<file stem>.<variable>", used in attribute names
  Region train, test;
  double mean = 0, std = 1;
  std::size_t dropped = 0;
};

std::pair<std::string, std::string> parse_field(const std::string& text) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw DatasetError("--field '" + text + "': expected FILE:VARIABLE, e.g. " +
                       default_climate_fields().front());
  }
  return {text.substr(0, colon), text.substr(colon + 1)};
}

// Patch starts in [begin, end): every `stride` cells, plus one aligned to `end` if the stride
// leaves cells uncovered. Empty if the range is narrower than a patch.
std::vector<std::size_t> patch_starts(std::size_t begin, std::size_t end, std::size_t patch,
                                      std::size_t stride) {
  std::vector<std::size_t> starts;
  if (end < begin + patch) return starts;
  for (std::size_t start = begin; start + patch <= end; start += stride) starts.push_back(start);
  if (starts.back() + patch < end) starts.push_back(end - patch);
  return starts;
}

void plan_split(FieldPlan& plan, const ClimateOptions& options) {
  const NetcdfField& field = plan.data;
  const std::size_t outer = field.shape.size() > 2 ? field.shape[0] : 1;
  const std::size_t per_outer = field.slices() / outer;
  const std::string where = "field " + field.variable + " of '" + field.path + "'";
  if (field.rows() < options.patch || field.cols() < options.patch) {
    throw DatasetError(where + " is " + std::to_string(field.rows()) + "x" +
                       std::to_string(field.cols()) + " cells, smaller than a " +
                       std::to_string(options.patch) + "x" + std::to_string(options.patch) +
                       " patch; choose a larger field or a smaller --patch");
  }
  if (outer >= 2) {
    const auto test_outer = std::clamp<std::size_t>(
        static_cast<std::size_t>(std::ceil(options.test_fraction * static_cast<double>(outer))), 1,
        outer - 1);
    const std::size_t boundary = (outer - test_outer) * per_outer;
    plan.train = {0, boundary, 0, field.cols()};
    plan.test = {boundary, field.slices(), 0, field.cols()};
    return;
  }
  // One slice: hold out the eastern columns instead of a time range.
  const auto test_cols = static_cast<std::size_t>(
      std::lround(options.test_fraction * static_cast<double>(field.cols())));
  const std::size_t boundary = field.cols() - test_cols;
  if (boundary < options.patch || test_cols < options.patch) {
    throw DatasetError(where + " has a single slice, so it is split along its " +
                       std::to_string(field.cols()) + " columns, but --test-fraction " +
                       to_text(options.test_fraction) + " leaves " + std::to_string(boundary) +
                       " train and " + std::to_string(test_cols) +
                       " test columns; each needs at least " + std::to_string(options.patch) +
                       " (change --test-fraction or --patch, or use a field with a time axis)");
  }
  plan.train = {0, 1, 0, boundary};
  plan.test = {0, 1, boundary, field.cols()};
}

void standardisation(FieldPlan& plan) {
  const NetcdfField& field = plan.data;
  const std::size_t plane = field.rows() * field.cols();
  double sum = 0, sum_squares = 0;
  std::size_t count = 0;
  for (std::size_t s = plan.train.first_slice; s < plan.train.end_slice; ++s) {
    for (std::size_t r = 0; r < field.rows(); ++r) {
      for (std::size_t c = plan.train.first_col; c < plan.train.end_col; ++c) {
        const std::size_t i = s * plane + r * field.cols() + c;
        if (!field.valid[i]) continue;
        sum += field.values[i];
        sum_squares += static_cast<double>(field.values[i]) * field.values[i];
        ++count;
      }
    }
  }
  const std::string where = "field " + field.variable + " of '" + field.path + "'";
  if (count == 0) {
    throw DatasetError(where +
                       " has no valid cell in its training part (all missing); check the "
                       "variable's missing_value/_FillValue or choose another field");
  }
  plan.mean = sum / static_cast<double>(count);
  const double variance =
      std::max(0.0, sum_squares / static_cast<double>(count) - plan.mean * plan.mean);
  plan.std = std::sqrt(variance);
  if (!(plan.std > 0)) {
    throw DatasetError(where + " is constant (" + to_text(plan.mean) +
                       ") over its training part; it cannot be standardised");
  }
}

std::vector<PatchRef> select_patches(FieldPlan& plan, std::size_t field_index, const Region& region,
                                     const ClimateOptions& options) {
  const NetcdfField& field = plan.data;
  const std::size_t plane = field.rows() * field.cols();
  const std::size_t cells = options.patch * options.patch;
  const std::vector<std::size_t> rows =
      patch_starts(0, field.rows(), options.patch, options.stride);
  const std::vector<std::size_t> cols =
      patch_starts(region.first_col, region.end_col, options.patch, options.stride);
  std::vector<PatchRef> kept;
  for (std::size_t s = region.first_slice; s < region.end_slice; ++s) {
    for (std::size_t r : rows) {
      for (std::size_t c : cols) {
        std::size_t valid = 0;
        for (std::size_t y = 0; y < options.patch; ++y) {
          const std::uint8_t* line = &field.valid[s * plane + (r + y) * field.cols() + c];
          valid += static_cast<std::size_t>(std::count(line, line + options.patch, 1));
        }
        if (static_cast<double>(valid) < options.min_valid_fraction * static_cast<double>(cells)) {
          ++plan.dropped;
          continue;
        }
        kept.push_back({field_index, s, r, c});
      }
    }
  }
  return kept;
}

struct SplitArrays {
  HostArray inputs, targets, mask, origin;
  double valid_fraction = 0;
};

SplitArrays assemble(const std::vector<FieldPlan>& plans, const std::vector<PatchRef>& patches,
                     std::size_t patch) {
  const std::size_t n = patches.size(), cells = patch * patch;
  SplitArrays out;
  out.inputs = HostArray::zeros(DType::f32, {n, 1, patch, patch});
  out.targets = HostArray::zeros(DType::f32, {n, kTargetChannels, patch, patch});
  out.mask = HostArray::zeros(DType::u8, {n, 1, patch, patch});
  out.origin = HostArray::zeros(DType::i32, {n, kOriginColumns});
  auto inputs = out.inputs.as<float>();
  auto targets = out.targets.as<float>();
  auto mask = out.mask.as<std::uint8_t>();
  auto origin = out.origin.as<std::int32_t>();
  std::size_t valid_cells = 0;
  for (std::size_t p = 0; p < n; ++p) {
    const PatchRef& ref = patches[p];
    const FieldPlan& plan = plans[ref.field];
    const NetcdfField& field = plan.data;
    const std::size_t plane = field.rows() * field.cols();
    for (std::size_t y = 0; y < patch; ++y) {
      for (std::size_t x = 0; x < patch; ++x) {
        const std::size_t source = ref.slice * plane + (ref.row + y) * field.cols() + ref.col + x;
        const bool valid = field.valid[source] != 0;
        // Missing cells get the training mean, which is 0 after standardisation.
        const float value =
            valid ? static_cast<float>((field.values[source] - plan.mean) / plan.std) : 0.0f;
        const std::size_t cell = y * patch + x;
        inputs[p * cells + cell] = value;
        targets[(p * kTargetChannels) * cells + cell] = value;
        targets[(p * kTargetChannels + 1) * cells + cell] = valid ? 1.0f : 0.0f;
        mask[p * cells + cell] = valid ? 1 : 0;
        valid_cells += valid ? 1 : 0;
      }
    }
    const std::size_t values[kOriginColumns] = {ref.field, ref.slice, ref.row, ref.col};
    for (std::size_t k = 0; k < kOriginColumns; ++k) {
      origin[p * kOriginColumns + k] = static_cast<std::int32_t>(values[k]);
    }
  }
  out.valid_fraction = n ? static_cast<double>(valid_cells) / static_cast<double>(n * cells) : 0;
  return out;
}

void check_options(const ClimateOptions& options) {
  if (options.patch == 0 || options.stride == 0) {
    throw DatasetError("--patch and --stride must be at least 1 (got " +
                       std::to_string(options.patch) + " and " + std::to_string(options.stride) +
                       ")");
  }
  if (!(options.test_fraction > 0 && options.test_fraction < 1)) {
    throw DatasetError("--test-fraction must lie strictly between 0 and 1, got " +
                       to_text(options.test_fraction));
  }
  if (!(options.min_valid_fraction >= 0 && options.min_valid_fraction <= 1)) {
    throw DatasetError("--min-valid must lie in [0, 1], got " +
                       to_text(options.min_valid_fraction));
  }
}

}  // namespace

std::vector<std::string> default_climate_fields() {
  return {std::string(kFerretData) + "coads_climatology.cdf:SST",
          std::string(kFerretData) + "levitus_climatology.cdf:TEMP",
          std::string(kNcargData) + "nug/tas_rectilinear_grid_2D.nc:tas"};
}

ConversionSummary convert_climate(const ClimateOptions& options) {
  check_options(options);
  DatasetOutput output(options.out, options.overwrite);
  const std::vector<std::string> specs =
      options.fields.empty() ? default_climate_fields() : options.fields;

  std::vector<FieldPlan> plans;
  std::map<std::string, int> name_uses;
  for (const std::string& spec : specs) {
    const auto [path, variable] = parse_field(spec);
    FieldPlan plan;
    plan.data = read_netcdf_field(path, variable, options.max_slices);
    plan.name = std::filesystem::path(path).stem().string() + "." + variable;
    if (name_uses[plan.name]++ > 0) plan.name += "_" + std::to_string(name_uses[plan.name] - 1);
    plan_split(plan, options);
    standardisation(plan);
    plans.push_back(std::move(plan));
  }

  std::vector<PatchRef> train, test;
  for (std::size_t f = 0; f < plans.size(); ++f) {
    const auto train_patches = select_patches(plans[f], f, plans[f].train, options);
    const auto test_patches = select_patches(plans[f], f, plans[f].test, options);
    train.insert(train.end(), train_patches.begin(), train_patches.end());
    test.insert(test.end(), test_patches.begin(), test_patches.end());
    output.add_note(plans[f].name + " " + host::shape_string(plans[f].data.shape) + " (" +
                    join(plans[f].data.dimension_names) +
                    "): " + std::to_string(train_patches.size()) + " train + " +
                    std::to_string(test_patches.size()) + " test patches, " +
                    std::to_string(plans[f].dropped) + " dropped as mostly missing; mean " +
                    to_text(plans[f].mean) + ", std " + to_text(plans[f].std) +
                    (plans[f].data.units.empty() ? "" : " " + plans[f].data.units));
  }
  for (const auto& [split, patches] : {std::pair{"train", &train}, std::pair{"test", &test}}) {
    if (patches->empty()) {
      throw DatasetError(std::string("no ") + split + " patch has at least " +
                         to_text(options.min_valid_fraction * 100) +
                         "% valid cells; lower --min-valid, change --test-fraction or add fields");
    }
  }

  std::vector<std::string> names, sources, units;
  for (const FieldPlan& plan : plans) {
    names.push_back(plan.name);
    sources.push_back(plan.data.path + ":" + plan.data.variable +
                      (plan.data.long_name.empty() ? "" : " (" + plan.data.long_name + ")"));
    units.push_back(plan.name + ": " + (plan.data.units.empty() ? "unknown" : plan.data.units));
  }
  for (const auto& [split, patches] : {std::pair{"train", &train}, std::pair{"test", &test}}) {
    SplitArrays arrays = assemble(plans, *patches, options.patch);
    output.set_attribute(split, "valid_fraction", arrays.valid_fraction);
    output.set_attribute(split, "patch", static_cast<double>(options.patch));
    output.set_attribute(split, "stride", static_cast<double>(options.stride));
    for (const FieldPlan& plan : plans) {
      output.set_attribute(split, plan.name + ".mean", plan.mean);
      output.set_attribute(split, plan.name + ".std", plan.std);
    }
    output.set_split(split, std::move(arrays.inputs), std::move(arrays.targets));
    output.add_extra(split, "mask", std::move(arrays.mask));
    output.add_extra(split, "origin", std::move(arrays.origin));
  }
  output.set_attribute("source", "netCDF fields: " + join(sources, "; "));
  output.set_attribute(
      "license",
      "per source package: ferret-datasets (NOAA/PMEL, Ferret License Agreement), "
      "libncarg-data (UCAR, BSD-4-clause); see /usr/share/doc/<package>/copyright");
  output.set_attribute("description",
                       "Overlapping " + std::to_string(options.patch) + "x" +
                           std::to_string(options.patch) + " patches (stride " +
                           std::to_string(options.stride) +
                           ") of standardised climate fields, for the hierarchical autoencoder");
  output.set_attribute("fields", join(names));
  output.set_attribute("units",
                       "standardised (dimensionless); original units " + join(units, "; "));
  output.set_attribute("normalisation",
                       "(value - mean) / std per field, with the mean and std of the field's "
                       "training part (split attributes <field>.mean, <field>.std); missing "
                       "cells filled with the mean (0)");
  output.set_attribute("targets",
                       "channel 0: the standardised patch (reconstruction target); channel 1: "
                       "mask, 1 = real value, 0 = land/missing (use for the masked MSE)");
  output.set_attribute("origin",
                       "columns: field index (into 'fields'), slice (outer dimensions "
                       "flattened), first row, first column");
  output.set_attribute("split",
                       "along each field's outermost dimension (time where present): "
                       "the last " +
                           to_text(options.test_fraction) +
                           " of it is test; single-slice fields split by columns");
  return output.finish();
}

}  // namespace ipupod::datasets
