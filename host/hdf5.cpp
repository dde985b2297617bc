// Implementation of the HDF5 RAII layer: checked calls, error-stack capture, type mapping,
// attribute helpers. All HDF5 calls of the project go through here.
#include "host/hdf5.hpp"

#include <algorithm>
#include <filesystem>
#include <numeric>

namespace ipupod::host {
namespace {

std::string compose(const std::string& action, const std::string& file, const std::string& object,
                    const std::string& detail) {
  std::string message = "HDF5: cannot " + action;
  if (!object.empty()) message += " '" + object + "'";
  if (!file.empty()) message += (object.empty() ? " '" : " in file '") + file + "'";
  if (!detail.empty()) message += ": " + detail;
  return message;
}

herr_t collect_error(unsigned depth, const H5E_error2_t* error, void* data) {
  auto* text = static_cast<std::string*>(data);
  // The innermost two entries say what went wrong; the outer ones only repeat the API call.
  if (depth < 2 && error->desc != nullptr && error->desc[0] != '\0') {
    if (!text->empty()) *text += "; ";
    *text += error->desc;
  }
  return 0;
}

// Reads and clears HDF5's error stack of this thread.
std::string take_error_stack() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "HDF5 gave no further detail" : text;
}

template <class Id>
Id check(Id result, const std::string& action, const std::string& file, const std::string& object) {
  if (result < 0) throw Hdf5Error(action, file, object, take_error_stack());
  return result;
}

std::vector<hsize_t> to_hsize(std::span<const std::size_t> dims) {
  return {dims.begin(), dims.end()};
}

}  // namespace

Hdf5Error::Hdf5Error(const std::string& action, const std::string& file, const std::string& object,
                     const std::string& detail)
    : std::runtime_error(compose(action, file, object, detail)), file_(file), object_(object) {}

namespace h5 {

std::unique_lock<std::recursive_mutex> lock() {
  static std::recursive_mutex mutex;
  return std::unique_lock<std::recursive_mutex>(mutex);
}

void silence_error_printing() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto guard = lock();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

bool is_hdf5_file(const std::string& path) {
  silence_error_printing();
  auto guard = lock();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  const htri_t result = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  return result > 0;
}

// ---- Handle ----

Handle::Handle(hid_t id, Closer closer, std::string file, std::string object)
    : id_(id), closer_(closer), file_(std::move(file)), object_(std::move(object)) {}

Handle::Handle(Handle&& other) noexcept
    : id_(other.id_),
      closer_(other.closer_),
      file_(std::move(other.file_)),
      object_(std::move(other.object_)) {
  other.id_ = H5I_INVALID_HID;
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    release();
    id_ = other.id_;
    closer_ = other.closer_;
    file_ = std::move(other.file_);
    object_ = std::move(other.object_);
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

Handle::~Handle() {
  release();
}

void Handle::release() noexcept {
  if (id_ >= 0 && closer_ != nullptr) {
    auto guard = lock();
    if (closer_(id_) < 0) H5Eclear2(H5E_DEFAULT);
  }
  id_ = H5I_INVALID_HID;
}

void Handle::close() {
  if (id_ < 0) return;
  auto guard = lock();
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  if (closer_ != nullptr) check(closer_(id), "close", file_, object_);
}

// ---- Datatype ----

Datatype Datatype::memory_type(DType dtype) {
  auto guard = lock();
  const std::string what = "create the in-memory type for " + std::string(dtype_name(dtype));
  hid_t base = H5I_INVALID_HID;
  switch (dtype) {
    case DType::f32:
      base = H5T_NATIVE_FLOAT;
      break;
    case DType::i32:
      base = H5T_NATIVE_INT32;
      break;
    case DType::u8:
      base = H5T_NATIVE_UINT8;
      break;
    case DType::u32:
      base = H5T_NATIVE_UINT32;
      break;
    case DType::f16:
      base = H5T_IEEE_F32LE;
      break;
  }
  Datatype type(check(H5Tcopy(base), what, "", ""), H5Tclose, "", "");
  if (dtype == DType::f16) {
    // IEEE binary16: sign bit 15, exponent bits 10..14, mantissa bits 0..9, bias 15.
    check(H5Tset_fields(type.id(), 15, 10, 5, 0, 10), what, "", "");
    check(H5Tset_precision(type.id(), 16), what, "", "");
    check(H5Tset_size(type.id(), 2), what, "", "");
    check(H5Tset_ebias(type.id(), 15), what, "", "");
  }
  return type;
}

// ---- Dataspace ----

Dataspace Dataspace::simple(std::span<const std::size_t> dims, const std::string& file,
                            const std::string& object) {
  auto guard = lock();
  const std::vector<hsize_t> h = to_hsize(dims);
  const hid_t id = dims.empty() ? H5Screate(H5S_SCALAR)
                                : H5Screate_simple(static_cast<int>(h.size()), h.data(), nullptr);
  return Dataspace(
      check(id, "create a dataspace of shape " + shape_string(dims) + " for", file, object),
      H5Sclose, file, object);
}

std::vector<std::size_t> Dataspace::dims() const {
  auto guard = lock();
  const int rank = check(H5Sget_simple_extent_ndims(id()), "read the rank of", file(), object());
  std::vector<hsize_t> h(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(id(), h.data(), nullptr), "read the shape of", file(), object());
  return {h.begin(), h.end()};
}

void Dataspace::select_rows(std::size_t first, std::size_t count) {
  auto guard = lock();
  std::vector<hsize_t> start(dims().size(), 0);
  std::vector<hsize_t> extent = to_hsize(dims());
  if (extent.empty()) throw Hdf5Error("select rows of scalar", file(), object(), "it has no rows");
  start[0] = first;
  extent[0] = count;
  check(H5Sselect_hyperslab(id(), H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr),
        "select rows " + std::to_string(first) + ".." + std::to_string(first + count) + " of",
        file(), object());
}

// ---- Dataset ----

std::vector<std::size_t> Dataset::dims() const {
  auto guard = lock();
  Dataspace space(check(H5Dget_space(id()), "read the dataspace of", file(), object()), H5Sclose,
                  file(), object());
  return space.dims();
}

bool Dataset::stored_dtype(DType& dtype) const {
  auto guard = lock();
  Datatype type(check(H5Dget_type(id()), "read the type of", file(), object()), H5Tclose, file(),
                object());
  const H5T_class_t type_class = H5Tget_class(type.id());
  const std::size_t size = H5Tget_size(type.id());
  if (type_class == H5T_FLOAT && size == 4) return dtype = DType::f32, true;
  if (type_class == H5T_FLOAT && size == 2) return dtype = DType::f16, true;
  if (type_class == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type.id()) == H5T_SGN_2;
    if (is_signed && size == 4) return dtype = DType::i32, true;
    if (!is_signed && size == 4) return dtype = DType::u32, true;
    if (!is_signed && size == 1) return dtype = DType::u8, true;
  }
  return false;
}

std::string Dataset::type_description() const {
  auto guard = lock();
  Datatype type(check(H5Dget_type(id()), "read the type of", file(), object()), H5Tclose, file(),
                object());
  const std::string bits = std::to_string(8 * H5Tget_size(type.id())) + "-bit ";
  switch (H5Tget_class(type.id())) {
    case H5T_FLOAT:
      return bits + "float";
    case H5T_INTEGER:
      return bits + (H5Tget_sign(type.id()) == H5T_SGN_2 ? "signed" : "unsigned") + " integer";
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    default:
      return "non-numeric type";
  }
}

void Dataset::read_rows(std::size_t first, std::size_t count, DType dtype, void* out) const {
  auto guard = lock();
  const std::string action =
      "read rows " + std::to_string(first) + ".." + std::to_string(first + count) + " of";
  Dataspace file_space(check(H5Dget_space(id()), action, file(), object()), H5Sclose, file(),
                       object());
  std::vector<std::size_t> shape = file_space.dims();
  if (shape.empty() || first + count > shape[0]) {
    throw Hdf5Error(action, file(), object(), "the dataset has shape " + shape_string(shape));
  }
  if (count == 0) return;
  file_space.select_rows(first, count);
  shape[0] = count;
  Dataspace memory_space = Dataspace::simple(shape, file(), object());
  Datatype memory = Datatype::memory_type(dtype);
  check(H5Dread(id(), memory.id(), memory_space.id(), file_space.id(), H5P_DEFAULT, out), action,
        file(), object());
}

void Dataset::read_row_runs(std::span<const std::pair<std::size_t, std::size_t>> runs, DType dtype,
                            void* out) const {
  auto guard = lock();
  const std::size_t row_bytes = [&] {
    const std::vector<std::size_t> shape = dims();
    return shape.empty() ? 0 : shape_elements(shape) / std::max<std::size_t>(shape[0], 1);
  }() * dtype_size(dtype);
  auto* at = static_cast<std::byte*>(out);
  for (const auto& [first, count] : runs) {
    read_rows(first, count, dtype, at);
    at += count * row_bytes;
  }
}

void Dataset::write(const HostArray& array) {
  auto guard = lock();
  const std::vector<std::size_t> shape = dims();
  if (shape_elements(shape) != array.elements()) {
    throw Hdf5Error(
        "write", file(), object(),
        "the dataset has shape " + shape_string(shape) + " but the array is " + array.describe());
  }
  Datatype memory = Datatype::memory_type(array.dtype);
  check(H5Dwrite(id(), memory.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, array.bytes.data()), "write",
        file(), object());
}

void Dataset::read_all(DType dtype, void* out) const {
  auto guard = lock();
  Datatype memory = Datatype::memory_type(dtype);
  check(H5Dread(id(), memory.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out), "read", file(), object());
}

bool Dataset::direct_row_layout(DType dtype, RowLayout& layout) const {
  auto guard = lock();
  const std::string action = "inspect the storage of";
  const std::vector<std::size_t> shape = dims();
  if (shape.empty() || shape[0] == 0) return false;
  {
    // Addresses inside the file are relative to the user block; only plain files qualify.
    Handle file_id(check(H5Iget_file_id(id()), action, file(), object()), H5Fclose, file(),
                   object());
    Handle create(check(H5Fget_create_plist(file_id.id()), action, file(), object()), H5Pclose,
                  file(), object());
    hsize_t user_block = 0;
    check(H5Pget_userblock(create.id(), &user_block), action, file(), object());
    if (user_block != 0) return false;
  }
  {
    Datatype stored(check(H5Dget_type(id()), action, file(), object()), H5Tclose, file(), object());
    Datatype memory = Datatype::memory_type(dtype);
    if (check(H5Tequal(stored.id(), memory.id()), action, file(), object()) <= 0) return false;
  }
  Handle create(check(H5Dget_create_plist(id()), action, file(), object()), H5Pclose, file(),
                object());
  if (check(H5Pget_external_count(create.id()), action, file(), object()) != 0) return false;
  layout.row_bytes = shape_elements(shape) / shape[0] * dtype_size(dtype);
  layout.block_offsets.clear();
  const H5D_layout_t kind = H5Pget_layout(create.id());
  if (kind == H5D_CONTIGUOUS) {
    const haddr_t address = H5Dget_offset(id());
    if (address == HADDR_UNDEF) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    layout.rows_per_block = shape[0];
    layout.block_offsets.push_back(address);
    return true;
  }
#if H5_VERSION_GE(1, 10, 5)
  if (kind != H5D_CHUNKED) return false;
  if (check(H5Pget_nfilters(create.id()), action, file(), object()) != 0) return false;
  std::vector<hsize_t> chunk(shape.size());
  check(H5Pget_chunk(create.id(), static_cast<int>(chunk.size()), chunk.data()), action, file(),
        object());
  for (std::size_t d = 1; d < shape.size(); ++d) {
    if (chunk[d] != shape[d]) return false;  // a chunk holds part of a row
  }
  layout.rows_per_block = chunk[0];
  std::vector<hsize_t> coordinate(shape.size(), 0);
  for (std::size_t first = 0; first < shape[0]; first += layout.rows_per_block) {
    coordinate[0] = first;
    unsigned filter_mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t size = 0;
    check(H5Dget_chunk_info_by_coord(id(), coordinate.data(), &filter_mask, &address, &size),
          action, file(), object());
    if (address == HADDR_UNDEF) return false;  // never written: HDF5 supplies the fill value
    layout.block_offsets.push_back(address);
  }
  return true;
#else
  return false;
#endif
}

// ---- Group ----

std::string Group::child_path(const std::string& name) const {
  if (object().empty() || object() == "/") return "/" + name;
  return object() + "/" + name;
}

bool Group::has_link(const std::string& name) const {
  auto guard = lock();
  return check(H5Lexists(id(), name.c_str(), H5P_DEFAULT), "look up", file(), child_path(name)) > 0;
}

namespace {
// H5Iget_type on an opened object works the same in HDF5 1.10 and 1.12 (H5Oget_info does not).
H5I_type_t object_type(hid_t location, const std::string& name, const std::string& file,
                       const std::string& path) {
  Handle object(check(H5Oopen(location, name.c_str(), H5P_DEFAULT), "inspect", file, path),
                H5Oclose, file, path);
  return H5Iget_type(object.id());
}
}  // namespace

bool Group::has_group(const std::string& name) const {
  auto guard = lock();
  return has_link(name) && object_type(id(), name, file(), child_path(name)) == H5I_GROUP;
}

bool Group::has_dataset(const std::string& name) const {
  auto guard = lock();
  return has_link(name) && object_type(id(), name, file(), child_path(name)) == H5I_DATASET;
}

Group Group::open_group(const std::string& name) const {
  auto guard = lock();
  const std::string path = child_path(name);
  return Group(check(H5Gopen2(id(), name.c_str(), H5P_DEFAULT), "open group", file(), path),
               H5Gclose, file(), path);
}

std::vector<std::string> Group::link_names() const {
  auto guard = lock();
  std::vector<std::string> names;
  hsize_t position = 0;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    try {
      static_cast<std::vector<std::string>*>(data)->emplace_back(name);
      return 0;
    } catch (...) {
      return -1;  // exceptions must not cross the C iteration
    }
  };
  check(H5Literate(id(), H5_INDEX_NAME, H5_ITER_INC, &position, collect, &names),
        "list the members of", file(), object());
  return names;
}

Group Group::create_group(const std::string& name) {
  auto guard = lock();
  const std::string path = child_path(name);
  return Group(check(H5Gcreate2(id(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     "create group", file(), path),
               H5Gclose, file(), path);
}

Dataset Group::open_dataset(const std::string& name, std::size_t chunk_cache_bytes) const {
  auto guard = lock();
  const std::string path = child_path(name);
  Handle access(check(H5Pcreate(H5P_DATASET_ACCESS), "open dataset", file(), path), H5Pclose,
                file(), path);
  if (chunk_cache_bytes != SIZE_MAX) {
    check(H5Pset_chunk_cache(access.id(), H5D_CHUNK_CACHE_NSLOTS_DEFAULT, chunk_cache_bytes,
                             H5D_CHUNK_CACHE_W0_DEFAULT),
          "open dataset", file(), path);
  }
  return Dataset(check(H5Dopen2(id(), name.c_str(), access.id()), "open dataset", file(), path),
                 H5Dclose, file(), path);
}

Dataset Group::create_dataset(const std::string& name, DType dtype,
                              std::span<const std::size_t> dims, std::span<const std::size_t> chunk,
                              int deflate_level) {
  auto guard = lock();
  const std::string path = child_path(name);
  const std::string action = "create dataset";
  if (!chunk.empty() && chunk.size() != dims.size()) {
    throw Hdf5Error(
        action, file(), path,
        "chunk " + shape_string(chunk) + " and shape " + shape_string(dims) + " differ in rank");
  }
  Dataspace space = Dataspace::simple(dims, file(), path);
  Handle properties(check(H5Pcreate(H5P_DATASET_CREATE), action, file(), path), H5Pclose, file(),
                    path);
  if (!dims.empty() && !chunk.empty()) {
    const std::vector<hsize_t> h = to_hsize(chunk);
    check(H5Pset_chunk(properties.id(), static_cast<int>(h.size()), h.data()), action, file(),
          path);
    if (deflate_level > 0) {
      check(H5Pset_deflate(properties.id(), static_cast<unsigned>(deflate_level)), action, file(),
            path);
    }
  }
  // The file stores the little-endian IEEE/integer type of the same width.
  hid_t file_base = H5T_IEEE_F32LE;
  switch (dtype) {
    case DType::f32:
      file_base = H5T_IEEE_F32LE;
      break;
    case DType::i32:
      file_base = H5T_STD_I32LE;
      break;
    case DType::u8:
      file_base = H5T_STD_U8LE;
      break;
    case DType::u32:
      file_base = H5T_STD_U32LE;
      break;
    case DType::f16:
      file_base = H5I_INVALID_HID;
      break;
  }
  Datatype file_type =
      dtype == DType::f16
          ? Datatype::memory_type(DType::f16)
          : Datatype(check(H5Tcopy(file_base), action, file(), path), H5Tclose, file(), path);
  return Dataset(check(H5Dcreate2(id(), name.c_str(), file_type.id(), space.id(), H5P_DEFAULT,
                                  properties.id(), H5P_DEFAULT),
                       action, file(), path),
                 H5Dclose, file(), path);
}

void Group::set_string_attribute(const std::string& name, const std::string& value) {
  auto guard = lock();
  const std::string where = object() + " attribute '" + name + "'";
  if (check(H5Aexists(id(), name.c_str()), "look up", file(), where) > 0) {
    check(H5Adelete(id(), name.c_str()), "replace", file(), where);
  }
  Datatype type(check(H5Tcopy(H5T_C_S1), "write", file(), where), H5Tclose, file(), where);
  check(H5Tset_size(type.id(), value.empty() ? 1 : value.size()), "write", file(), where);
  check(H5Tset_strpad(type.id(), H5T_STR_NULLPAD), "write", file(), where);
  check(H5Tset_cset(type.id(), H5T_CSET_UTF8), "write", file(), where);
  Dataspace space(check(H5Screate(H5S_SCALAR), "write", file(), where), H5Sclose, file(), where);
  Handle attribute(
      check(H5Acreate2(id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
            "create", file(), where),
      H5Aclose, file(), where);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(attribute.id(), type.id(), padded.data()), "write", file(), where);
  attribute.close();
}

void Group::set_double_attribute(const std::string& name, double value) {
  auto guard = lock();
  const std::string where = object() + " attribute '" + name + "'";
  if (check(H5Aexists(id(), name.c_str()), "look up", file(), where) > 0) {
    check(H5Adelete(id(), name.c_str()), "replace", file(), where);
  }
  Dataspace space(check(H5Screate(H5S_SCALAR), "write", file(), where), H5Sclose, file(), where);
  Handle attribute(
      check(H5Acreate2(id(), name.c_str(), H5T_IEEE_F64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT),
            "create", file(), where),
      H5Aclose, file(), where);
  check(H5Awrite(attribute.id(), H5T_NATIVE_DOUBLE, &value), "write", file(), where);
  attribute.close();
}

void Group::set_uint64_attribute(const std::string& name, std::uint64_t value) {
  auto guard = lock();
  const std::string where = object() + " attribute '" + name + "'";
  if (check(H5Aexists(id(), name.c_str()), "look up", file(), where) > 0) {
    check(H5Adelete(id(), name.c_str()), "replace", file(), where);
  }
  Dataspace space(check(H5Screate(H5S_SCALAR), "write", file(), where), H5Sclose, file(), where);
  Handle attribute(
      check(H5Acreate2(id(), name.c_str(), H5T_STD_U64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT),
            "create", file(), where),
      H5Aclose, file(), where);
  check(H5Awrite(attribute.id(), H5T_NATIVE_UINT64, &value), "write", file(), where);
  attribute.close();
}

std::uint64_t Group::uint64_attribute(const std::string& name) const {
  auto guard = lock();
  const std::string where = object() + " attribute '" + name + "'";
  if (check(H5Aexists(id(), name.c_str()), "look up", file(), where) <= 0) {
    throw Hdf5Error("read", file(), where, "the attribute does not exist");
  }
  Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), "open", file(), where), H5Aclose,
                   file(), where);
  Datatype type(check(H5Aget_type(attribute.id()), "read the type of", file(), where), H5Tclose,
                file(), where);
  Dataspace space(check(H5Aget_space(attribute.id()), "read the shape of", file(), where), H5Sclose,
                  file(), where);
  if (H5Tget_class(type.id()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.id()) != 1) {
    throw Hdf5Error("read", file(), where, "expected one integer");
  }
  std::uint64_t value = 0;
  check(H5Aread(attribute.id(), H5T_NATIVE_UINT64, &value), "read", file(), where);
  return value;
}

namespace {

struct AttributeVisit {
  const Group* group;
  std::map<std::string, std::string>* strings = nullptr;
  std::map<std::string, double>* numbers = nullptr;
};

herr_t visit_attribute(hid_t location, const char* name, const H5A_info_t*, void* data) {
  auto* visit = static_cast<AttributeVisit*>(data);
  const std::string& file = visit->group->file();
  const std::string where = visit->group->object() + " attribute '" + name + "'";
  Handle attribute(check(H5Aopen(location, name, H5P_DEFAULT), "open", file, where), H5Aclose, file,
                   where);
  Datatype type(check(H5Aget_type(attribute.id()), "read the type of", file, where), H5Tclose, file,
                where);
  Dataspace space(check(H5Aget_space(attribute.id()), "read the shape of", file, where), H5Sclose,
                  file, where);
  if (H5Sget_simple_extent_npoints(space.id()) != 1) return 0;  // arrays are not ours to read
  const H5T_class_t type_class = H5Tget_class(type.id());
  if (type_class == H5T_STRING && visit->strings != nullptr) {
    if (H5Tis_variable_str(type.id()) > 0) {
      Datatype memory(check(H5Tcopy(H5T_C_S1), "read", file, where), H5Tclose, file, where);
      check(H5Tset_size(memory.id(), H5T_VARIABLE), "read", file, where);
      check(H5Tset_cset(memory.id(), H5Tget_cset(type.id())), "read", file, where);
      char* text = nullptr;
      check(H5Aread(attribute.id(), memory.id(), &text), "read", file, where);
      (*visit->strings)[name] = text != nullptr ? text : "";
      H5free_memory(text);
    } else {
      std::string text(H5Tget_size(type.id()), '\0');
      check(H5Aread(attribute.id(), type.id(), text.data()), "read", file, where);
      text.erase(text.find_last_not_of(std::string("\0 ", 2)) + 1);
      (*visit->strings)[name] = text;
    }
  } else if ((type_class == H5T_FLOAT || type_class == H5T_INTEGER) && visit->numbers != nullptr) {
    double value = 0;
    check(H5Aread(attribute.id(), H5T_NATIVE_DOUBLE, &value), "read", file, where);
    (*visit->numbers)[name] = value;
  }
  return 0;
}

void visit_attributes(const Group& group, AttributeVisit& visit) {
  auto guard = lock();
  hsize_t position = 0;
  // Exceptions must not cross the C iteration: collect them and rethrow afterwards.
  std::exception_ptr failure;
  struct Context {
    AttributeVisit* visit;
    std::exception_ptr* failure;
  } context{&visit, &failure};
  auto trampoline = [](hid_t location, const char* name, const H5A_info_t* info,
                       void* data) -> herr_t {
    auto* ctx = static_cast<Context*>(data);
    try {
      return visit_attribute(location, name, info, ctx->visit);
    } catch (...) {
      *ctx->failure = std::current_exception();
      return -1;
    }
  };
  const herr_t status =
      H5Aiterate2(group.id(), H5_INDEX_NAME, H5_ITER_INC, &position, trampoline, &context);
  if (failure) std::rethrow_exception(failure);
  check(status, "list the attributes of", group.file(), group.object());
}

}  // namespace

std::map<std::string, std::string> Group::string_attributes() const {
  std::map<std::string, std::string> result;
  AttributeVisit visit{this, &result, nullptr};
  visit_attributes(*this, visit);
  return result;
}

std::map<std::string, double> Group::numeric_attributes() const {
  std::map<std::string, double> result;
  AttributeVisit visit{this, nullptr, &result};
  visit_attributes(*this, visit);
  return result;
}

// ---- File ----

File File::open(const std::string& path, bool read_only) {
  silence_error_printing();
  auto guard = lock();
  const hid_t id = H5Fopen(path.c_str(), read_only ? H5F_ACC_RDONLY : H5F_ACC_RDWR, H5P_DEFAULT);
  return File(check(id, "open file", path, ""), H5Fclose, path, "/");
}

File File::create(const std::string& path, bool checksummed_metadata) {
  silence_error_printing();
  auto guard = lock();
  Handle access(check(H5Pcreate(H5P_FILE_ACCESS), "create file access list", path, ""), H5Pclose,
                path, "");
  if (checksummed_metadata)
    check(H5Pset_libver_bounds(access.id(), H5F_LIBVER_V110, H5F_LIBVER_LATEST),
          "choose the file format", path, "");
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.id());
  return File(check(id, "create file", path, ""), H5Fclose, path, "/");
}

void File::flush() {
  auto guard = lock();
  check(H5Fflush(id(), H5F_SCOPE_GLOBAL), "flush", file(), "/");
}

}  // namespace h5
}  // namespace ipupod::host
