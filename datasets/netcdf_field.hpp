// Reading one variable of a netCDF file (classic or netCDF-4) with the netCDF C library: values
// as float with packing undone, and a validity mask from missing_value/_FillValue and NaNs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ipupod::datasets {

struct NetcdfField {
  std::string path, variable;
  std::string long_name, units;              // attributes, empty when absent
  std::vector<std::string> dimension_names;  // outermost first
  std::vector<std::size_t> shape;            // outermost first; the last two are rows, columns
  std::vector<float> values;                 // row-major; missing cells hold 0
  std::vector<std::uint8_t> valid;           // 1 = a real value, 0 = missing (land, no data)

  std::size_t rows() const { return shape[shape.size() - 2]; }
  std::size_t cols() const { return shape.back(); }
  std::size_t slices() const;  // product of all but the last two dimensions
};

// Reads `variable` of `path`; it needs at least two dimensions. At most `max_outer` entries of
// the outermost dimension are read (0 = all) so that tests can take a small slice.
// Throws host::DatasetError (missing file or variable, netCDF failure) naming file and variable.
NetcdfField read_netcdf_field(const std::string& path, const std::string& variable,
                              std::size_t max_outer = 0);

// The names of the variables in `path` with two or more dimensions (for error messages).
std::vector<std::string> netcdf_gridded_variables(const std::string& path);

}  // namespace ipupod::datasets
