// Read-only access to the golden fixture file written by scripts/make_golden_fixtures.py:
// cases (groups), their attributes and float / int datasets, through the HDF5 C API.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ipupod::models::testing {

struct GoldenArray {
  std::vector<std::size_t> dims;
  std::vector<float> f;
  std::vector<std::int32_t> i;
};

class GoldenFile {
 public:
  explicit GoldenFile(const std::string& path) : path_(path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file_ < 0)
      throw std::runtime_error("cannot open golden fixtures '" + path +
                               "'; regenerate them with scripts/make_golden_fixtures.py");
  }
  ~GoldenFile() {
    if (file_ >= 0) H5Fclose(file_);
  }
  GoldenFile(const GoldenFile&) = delete;
  GoldenFile& operator=(const GoldenFile&) = delete;

  // Names of the top-level groups (cases), in name order.
  std::vector<std::string> groups(const std::string& under = "/") const {
    std::vector<std::string> out;
    hid_t g = H5Gopen2(file_, under.c_str(), H5P_DEFAULT);
    if (g < 0) return out;
    H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, &collect, &out);
    H5Gclose(g);
    return out;
  }

  bool has(const std::string& path) const {
    // Checks each component, as H5Lexists requires the intermediate links to exist.
    std::size_t pos = 1;
    while (true) {
      const std::size_t next = path.find('/', pos);
      const std::string prefix = path.substr(0, next);
      if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (next == std::string::npos) return true;
      pos = next + 1;
    }
  }

  GoldenArray read(const std::string& path) const {
    hid_t d = H5Dopen2(file_, path.c_str(), H5P_DEFAULT);
    if (d < 0) throw std::runtime_error("golden fixture '" + path_ + "' has no dataset " + path);
    hid_t space = H5Dget_space(d);
    const int rank = H5Sget_simple_extent_ndims(space);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    H5Sclose(space);
    GoldenArray a;
    std::size_t n = 1;
    for (hsize_t x : dims)
      a.dims.push_back(static_cast<std::size_t>(x)), n *= static_cast<std::size_t>(x);
    hid_t type = H5Dget_type(d);
    const bool is_int = H5Tget_class(type) == H5T_INTEGER;
    H5Tclose(type);
    herr_t status;
    if (is_int) {
      a.i.resize(n);
      status = H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.i.data());
    } else {
      a.f.resize(n);
      status = H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.f.data());
    }
    H5Dclose(d);
    if (status < 0) throw std::runtime_error("cannot read " + path + " from " + path_);
    return a;
  }

  // Numeric attributes of a group, as doubles; string attributes separately.
  std::map<std::string, double> numbers(const std::string& group) const {
    Attrs a = attributes(group);
    return a.numbers;
  }
  std::map<std::string, std::string> strings(const std::string& group) const {
    Attrs a = attributes(group);
    return a.strings;
  }

 private:
  struct Attrs {
    std::map<std::string, double> numbers;
    std::map<std::string, std::string> strings;
  };

  static herr_t collect(hid_t, const char* name, const H5L_info_t*, void* data) {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  }

  static herr_t read_attr(hid_t loc, const char* name, const H5A_info_t*, void* data) {
    auto* out = static_cast<Attrs*>(data);
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t type = H5Aget_type(attr);
    const H5T_class_t cls = H5Tget_class(type);
    if (cls == H5T_INTEGER || cls == H5T_FLOAT) {
      double v = 0;
      H5Aread(attr, H5T_NATIVE_DOUBLE, &v);
      out->numbers[name] = v;
    } else if (cls == H5T_STRING) {
      if (H5Tis_variable_str(type) > 0) {
        char* s = nullptr;
        hid_t mem = H5Tcopy(H5T_C_S1);
        H5Tset_size(mem, H5T_VARIABLE);
        H5Tset_cset(mem, H5Tget_cset(type));
        H5Aread(attr, mem, &s);
        out->strings[name] = s ? s : "";
        H5free_memory(s);
        H5Tclose(mem);
      } else {
        std::string s(H5Tget_size(type), '\0');
        H5Aread(attr, type, s.data());
        out->strings[name] = s.c_str();
      }
    }
    H5Tclose(type);
    H5Aclose(attr);
    return 0;
  }

  Attrs attributes(const std::string& group) const {
    Attrs a;
    hid_t g = H5Gopen2(file_, group.c_str(), H5P_DEFAULT);
    if (g < 0) throw std::runtime_error("golden fixture '" + path_ + "' has no group " + group);
    hsize_t idx = 0;
    H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, &idx, &read_attr, &a);
    H5Gclose(g);
    return a;
  }

  std::string path_;
  hid_t file_ = -1;
};

}  // namespace ipupod::models::testing
