// netCDF reading for the climate converter: every nc_* return code is checked and turned into a
// host::DatasetError that names the file, the variable and netCDF's own message.
#include "datasets/netcdf_field.hpp"

#include <netcdf.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>

#include "datasets/dataset_output.hpp"
#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;

// Relative tolerance when comparing a value with its missing-value marker: markers stored as
// double (e.g. -1e34) are not exactly representable once the data are read as float.
constexpr double kMarkerTolerance = 1e-6;

void check(int status, const std::string& action, const std::string& path,
           const std::string& variable = "") {
  if (status == NC_NOERR) return;
  throw DatasetError("netCDF: cannot " + action + " '" + path + "'" +
                     (variable.empty() ? "" : " variable '" + variable + "'") + ": " +
                     nc_strerror(status));
}

class NcFile {
 public:
  explicit NcFile(const std::string& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw DatasetError("netCDF file '" + path +
                         "' does not exist; install the Debian package that ships it "
                         "(ferret-datasets: /usr/share/ferret-vis/data, libncarg-data: "
                         "/usr/share/ncarg/data) or pass another --field FILE:VARIABLE");
    }
    check(nc_open(path.c_str(), NC_NOWRITE, &id_), "open", path);
  }
  ~NcFile() { nc_close(id_); }
  NcFile(const NcFile&) = delete;
  NcFile& operator=(const NcFile&) = delete;
  int id() const { return id_; }

 private:
  std::string path_;
  int id_ = -1;
};

std::optional<double> numeric_attribute(int file, int variable, const char* name) {
  nc_type type = NC_NAT;
  std::size_t length = 0;
  if (nc_inq_att(file, variable, name, &type, &length) != NC_NOERR) return std::nullopt;
  if (type == NC_CHAR || type == NC_STRING || length == 0) return std::nullopt;
  std::vector<double> values(length);
  if (nc_get_att_double(file, variable, name, values.data()) != NC_NOERR) return std::nullopt;
  return values[0];
}

std::string text_attribute(int file, int variable, const char* name) {
  nc_type type = NC_NAT;
  std::size_t length = 0;
  if (nc_inq_att(file, variable, name, &type, &length) != NC_NOERR || type != NC_CHAR) return "";
  std::string text(length, '\0');
  if (nc_get_att_text(file, variable, name, text.data()) != NC_NOERR) return "";
  while (!text.empty() && (text.back() == '\0' || text.back() == ' ')) text.pop_back();
  return text;
}

bool matches(double value, double marker) {
  return std::abs(value - marker) <= kMarkerTolerance * std::abs(marker);
}

}  // namespace

std::size_t NetcdfField::slices() const {
  std::size_t count = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) count *= shape[i];
  return count;
}

std::vector<std::string> netcdf_gridded_variables(const std::string& path) {
  NcFile file(path);
  int count = 0;
  check(nc_inq_nvars(file.id(), &count), "list the variables of", path);
  std::vector<std::string> names;
  for (int v = 0; v < count; ++v) {
    char name[NC_MAX_NAME + 1] = {};
    int dims = 0;
    check(nc_inq_varname(file.id(), v, name), "read a variable name of", path);
    check(nc_inq_varndims(file.id(), v, &dims), "read the dimensions of", path, name);
    if (dims >= 2) names.emplace_back(name);
  }
  return names;
}

NetcdfField read_netcdf_field(const std::string& path, const std::string& variable,
                              std::size_t max_outer) {
  NcFile file(path);
  int var = -1;
  if (nc_inq_varid(file.id(), variable.c_str(), &var) != NC_NOERR) {
    throw DatasetError("netCDF file '" + path + "' has no variable '" + variable +
                       "'; gridded variables there: " + join(netcdf_gridded_variables(path)));
  }
  int rank = 0;
  check(nc_inq_varndims(file.id(), var, &rank), "read the dimensions of", path, variable);
  if (rank < 2) {
    throw DatasetError("variable '" + variable + "' of '" + path + "' has " + std::to_string(rank) +
                       " dimension(s); a gridded field needs at least two (rows, columns)");
  }
  nc_type type = NC_NAT;
  check(nc_inq_vartype(file.id(), var, &type), "read the type of", path, variable);
  if (type == NC_CHAR || type == NC_STRING) {
    throw DatasetError("variable '" + variable + "' of '" + path +
                       "' holds text; expected a numeric field");
  }
  std::vector<int> dim_ids(static_cast<std::size_t>(rank));
  check(nc_inq_vardimid(file.id(), var, dim_ids.data()), "read the dimensions of", path, variable);

  NetcdfField field;
  field.path = path;
  field.variable = variable;
  field.long_name = text_attribute(file.id(), var, "long_name");
  field.units = text_attribute(file.id(), var, "units");
  for (int dim : dim_ids) {
    char name[NC_MAX_NAME + 1] = {};
    std::size_t length = 0;
    check(nc_inq_dim(file.id(), dim, name, &length), "read a dimension of", path, variable);
    field.dimension_names.emplace_back(name);
    field.shape.push_back(length);
  }
  if (max_outer != 0 && field.shape.size() > 2) {
    field.shape[0] = std::min(field.shape[0], max_outer);
  }
  std::size_t total = 1;
  for (std::size_t extent : field.shape) total *= extent;
  if (total == 0) {
    throw DatasetError("variable '" + variable + "' of '" + path + "' is empty (a dimension is 0)");
  }

  // Read as double so that packed integers and their markers compare exactly, then unpack.
  std::vector<double> raw(total);
  const std::vector<std::size_t> start(field.shape.size(), 0);
  check(nc_get_vara_double(file.id(), var, start.data(), field.shape.data(), raw.data()), "read",
        path, variable);
  const std::optional<double> missing = numeric_attribute(file.id(), var, "missing_value");
  std::optional<double> fill = numeric_attribute(file.id(), var, "_FillValue");
  if (!fill && type == NC_FLOAT) fill = NC_FILL_FLOAT;  // netCDF's default for unwritten cells
  if (!fill && type == NC_DOUBLE) fill = NC_FILL_DOUBLE;
  const double scale = numeric_attribute(file.id(), var, "scale_factor").value_or(1.0);
  const double offset = numeric_attribute(file.id(), var, "add_offset").value_or(0.0);

  field.values.resize(total);
  field.valid.resize(total);
  for (std::size_t i = 0; i < total; ++i) {
    const double value = raw[i];
    const bool is_missing = !std::isfinite(value) || (missing && matches(value, *missing)) ||
                            (fill && matches(value, *fill));
    field.valid[i] = is_missing ? 0 : 1;
    field.values[i] = is_missing ? 0.0f : static_cast<float>(value * scale + offset);
  }
  return field;
}

}  // namespace ipupod::datasets
