// Converter from gridded netCDF climate fields (Debian ferret-datasets, libncarg-data) to 64x64
// standardised patches for the hierarchical autoencoder, with land/missing cells masked.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "datasets/dataset_output.hpp"

namespace ipupod::datasets {

// Layout written (N patches per split, P = patch):
//   inputs  float32 [N,1,P,P]  the field standardised with its training mean and std;
//                              missing cells (land, _FillValue) hold 0, i.e. the mean
//   targets float32 [N,2,P,P]  channel 0: the patch itself (the reconstruction target),
//                              channel 1: the mask (1 real value, 0 missing), so the last
//                              pipeline stage has all it needs for the masked MSE
//   mask    uint8   [N,1,P,P]  the mask again, for tools that do not read targets
//   origin  int32   [N,4]      field index, slice (outer dimensions flattened), row, column
// The split runs along each field's outermost dimension (time for time series): its last
// test_fraction entries are the test set. A field with one slice is split along its columns
// instead (test = the eastern test_fraction). Patches start every `stride` cells; one more is
// aligned to the far edge when the stride leaves cells uncovered.
struct ClimateOptions {
  std::vector<std::string> fields;  // "FILE:VARIABLE"; empty = default_climate_fields()
  std::string out;
  bool overwrite = false;
  std::size_t patch = 64;           // patch side in grid cells (the autoencoder's input)
  std::size_t stride = 56;          // overlap of 8 cells, as in the autoencoder's paper
  double test_fraction = 0.25;      // share of each field's outer dimension held out
  double min_valid_fraction = 0.5;  // patches with fewer real cells are dropped
  std::size_t max_slices = 0;       // outer-dimension entries read per field (0 = all)
};

// coads SST (12 months), levitus TEMP (20 depths) and CMIP5 MPI-ESM-LR tas (12 months).
std::vector<std::string> default_climate_fields();

// Throws host::DatasetError for bad options or input (missing file or variable, a field smaller
// than a patch, no patch left after masking), naming the field and what to change.
ConversionSummary convert_climate(const ClimateOptions& options);

}  // namespace ipupod::datasets
