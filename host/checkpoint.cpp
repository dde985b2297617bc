// Checkpoint writer and reader on the HDF5 layer, with the POSIX steps (fsync of the file and its
// directory, rename) that make a save atomic on a crash or power loss.
#include "host/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "host/hdf5.hpp"
#include "host/stream_protocol.hpp"

namespace ipupod::host {
namespace {

constexpr const char* kFormat = "ipupod-checkpoint";
// Version 2 added the checksum record; version 1 files cannot be verified and are refused.
constexpr std::uint64_t kVersion = 2;

void check_name(const std::string& name, const std::string& kind) {
  const bool control = std::any_of(name.begin(), name.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 32; });
  if (name.empty() || name == "." || control) {
    throw CheckpointError("cannot save " + kind + " '" + name +
                          "': a checkpoint name must be non-empty, not '.' and free of control "
                          "characters");
  }
}

// HDF5 link names cannot hold '/': escape it (and the escape character).
std::string link_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

std::string from_link_name(const std::string& link, const std::string& path) {
  std::string out;
  for (std::size_t i = 0; i < link.size(); ++i) {
    if (link[i] != '%') {
      out += link[i];
    } else if (link.compare(i, 3, "%25") == 0) {
      out += '%';
      i += 2;
    } else if (link.compare(i, 3, "%2F") == 0) {
      out += '/';
      i += 2;
    } else {
      throw CheckpointError("checkpoint '" + path + "' holds an entry named '" + link +
                            "' with a stray '%'; it was not written by ipupod");
    }
  }
  return out;
}

HostArray bytes_of(const std::string& text) {
  HostArray array = HostArray::zeros(DType::u8, {text.size()});
  if (!text.empty()) std::memcpy(array.bytes.data(), text.data(), text.size());
  return array;
}

void write_array(h5::Group& group, const std::string& name, const HostArray& array) {
  if (array.bytes.size() != array.elements() * dtype_size(array.dtype)) {
    throw CheckpointError("cannot save tensor '" + name + "' " + array.describe() + ": it holds " +
                          std::to_string(array.bytes.size()) + " bytes, its shape needs " +
                          std::to_string(array.elements() * dtype_size(array.dtype)));
  }
  h5::Dataset dataset = group.create_dataset(name, array.dtype, array.shape, {});
  if (!array.bytes.empty()) dataset.write(array);
}

// `file_bytes`: the size of the file, which holds every tensor whole (uncompressed, contiguous):
// a shape that needs more is damage, refused before anything is allocated for it.
HostArray read_array(const h5::Group& group, const std::string& name, std::uintmax_t file_bytes) {
  h5::Dataset dataset = group.open_dataset(name);
  HostArray array;
  if (!dataset.stored_dtype(array.dtype)) {
    throw CheckpointError("'" + dataset.object() + "' in '" + dataset.file() + "' is stored as " +
                          dataset.type_description() + ", not a type ipupod writes");
  }
  const std::vector<std::size_t> dims = dataset.dims();
  std::uintmax_t bytes = dtype_size(array.dtype);
  for (const std::size_t extent : dims) {
    if (extent != 0 && bytes > file_bytes / extent) {
      throw CheckpointError("'" + dataset.object() + "' in '" + dataset.file() + "' has shape " +
                            shape_string(dims) + ", more than the file's " +
                            std::to_string(file_bytes) +
                            " bytes can hold: the file is damaged; resume from another checkpoint");
    }
    bytes *= extent;
  }
  array = HostArray::zeros(array.dtype, dims);
  if (!array.bytes.empty()) dataset.read_all(array.dtype, array.bytes.data());
  return array;
}

std::string read_text(const h5::Group& group, const std::string& name, std::uintmax_t file_bytes) {
  const HostArray array = read_array(group, name, file_bytes);
  if (array.dtype != DType::u8 || array.shape.size() != 1) {
    throw CheckpointError("'" + name + "' in checkpoint '" + group.file() +
                          "' should be uint8 text, got " + array.describe());
  }
  return std::string(reinterpret_cast<const char*>(array.bytes.data()), array.bytes.size());
}

std::span<const std::byte> text_bytes(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// A tensor's checksum covers its dtype and shape as well as its bytes.
std::uint32_t tensor_checksum(const HostArray& array) {
  return crc32c(array.bytes, crc32c(text_bytes(array.describe())));
}

// The checksum record: one line per part ("<kind> <crc32c> <link name>"), the step first. Its own
// CRC32C is the root attribute "checksum", so an edit anywhere in the file is found.
std::string checksum_record(const Checkpoint& checkpoint) {
  std::ostringstream out;
  out << "step " << checkpoint.step << "\n";
  out << "config_json " << crc32c(text_bytes(checkpoint.config_json)) << "\n";
  out << "state_json " << crc32c(text_bytes(checkpoint.state_json)) << "\n";
  for (const auto& [name, state] : checkpoint.rng_states)
    out << "rng " << crc32c(text_bytes(state)) << " " << link_name(name) << "\n";
  for (const auto& [name, array] : checkpoint.tensors)
    out << "tensor " << tensor_checksum(array) << " " << link_name(name) << "\n";
  return out.str();
}

// Compares the loaded parts with the record written beside them; names the first part that
// differs.
void verify_checksums(const Checkpoint& checkpoint, const std::string& stored,
                      const std::string& path) {
  const std::string computed = checksum_record(checkpoint);
  if (computed == stored) return;
  const auto lines = [&path](const std::string& text) {
    std::map<std::string, std::string> by_part;  // "tensor fc0.weight" -> crc
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const std::size_t first = line.find(' ');
      if (first == std::string::npos) continue;
      std::string kind = line.substr(0, first), crc = line.substr(first + 1);
      if (kind == "rng" || kind == "tensor") {
        const std::size_t second = crc.find(' ');  // names may hold spaces: the rest is the name
        if (second == std::string::npos) continue;
        kind += " '" + from_link_name(crc.substr(second + 1), path) + "'";
        crc.resize(second);
      }
      by_part[kind] = crc;
    }
    return by_part;
  };
  const auto want = lines(stored), got = lines(computed);
  const std::string advice =
      ": the file was changed or damaged after it was written; resume from another checkpoint "
      "(an earlier one, or a copy)";
  for (const auto& [part, crc] : got) {
    const auto found = want.find(part);
    if (found == want.end()) {
      throw CheckpointError("checkpoint '" + path + "': " + part +
                            " is not in its checksum record" + advice);
    }
    if (found->second != crc) {
      const bool step = part == "step";
      throw CheckpointError("checkpoint '" + path + "': " + part +
                            (step ? " is " + crc + " but the checksum record says " + found->second
                                  : " fails its CRC32C check (computed " + crc + ", recorded " +
                                        found->second + ")") +
                            advice);
    }
  }
  for (const auto& [part, crc] : want) {
    if (!got.contains(part))
      throw CheckpointError("checkpoint '" + path + "': " + part +
                            " is in its checksum record but missing from the file" + advice);
  }
  throw CheckpointError("checkpoint '" + path + "': its checksum record does not match" + advice);
}

// Weights and optimizer state must be finite: a NaN or infinity would train to nonsense.
void check_finite(const std::string& name, const HostArray& array, const std::string& path) {
  std::size_t bad = array.elements();
  std::string value;
  if (array.dtype == DType::f32) {
    const auto values = array.as<const float>();
    const auto it =
        std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
    if (it != values.end()) {
      bad = static_cast<std::size_t>(it - values.begin());
      value = std::isnan(*it) ? "nan" : (*it > 0 ? "inf" : "-inf");
    }
  } else if (array.dtype == DType::f16) {
    const auto values = array.as<const Half>();
    const auto it = std::find_if(values.begin(), values.end(), [](Half h) {
      return (h.bits & 0x7C00U) == 0x7C00U;
    });  // exponent all ones
    if (it != values.end()) {
      bad = static_cast<std::size_t>(it - values.begin());
      value = (it->bits & 0x03FFU) ? "nan" : ((it->bits & 0x8000U) ? "-inf" : "inf");
    }
  }
  if (bad == array.elements()) return;
  throw CheckpointError("checkpoint '" + path + "': tensor '" + name + "' " + array.describe() +
                        " holds " + value + " at element " + std::to_string(bad) +
                        "; expected finite values (the run it came from had diverged, or the file "
                        "was edited); resume from an earlier checkpoint");
}

// fsync of a file or directory by path; `what` names it in the error.
void sync_path(const std::string& path, int flags, const std::string& what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError("cannot open " + what + " '" + path +
                          "' to sync it: " + std::strerror(errno));
  }
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0) {
    throw CheckpointError("cannot sync " + what + " '" + path +
                          "' to disk: " + std::strerror(error) + " (is the disk full or failing?)");
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     const CheckpointProgress& progress) {
  for (const auto& [name, array] : checkpoint.tensors) check_name(name, "tensor");
  for (const auto& [name, state] : checkpoint.rng_states) check_name(name, "RNG state");
  const std::filesystem::path target(path);
  const std::filesystem::path directory =
      target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(directory, ec)) {
    throw CheckpointError("cannot save checkpoint '" + path + "': directory '" +
                          directory.string() + "' does not exist; create it first");
  }
  const std::string temporary = path + ".tmp";
  try {
    {
      // Checksummed metadata: a damaged file must fail a check, not crash the HDF5 library.
      h5::File file = h5::File::create(temporary, true);
      file.set_string_attribute("format", kFormat);
      file.set_uint64_attribute("version", kVersion);
      file.set_uint64_attribute("step", checkpoint.step);
      const std::string record = checksum_record(checkpoint);
      file.set_uint64_attribute("checksum", crc32c(text_bytes(record)));
      write_array(file, "checksums", bytes_of(record));
      write_array(file, "config_json", bytes_of(checkpoint.config_json));
      write_array(file, "state_json", bytes_of(checkpoint.state_json));
      h5::Group rng = file.create_group("rng");
      for (const auto& [name, state] : checkpoint.rng_states) {
        write_array(rng, link_name(name), bytes_of(state));
      }
      h5::Group tensors = file.create_group("tensors");
      std::size_t written = 0;
      for (const auto& [name, array] : checkpoint.tensors) {
        write_array(tensors, link_name(name), array);
        if (progress) progress(++written, checkpoint.tensors.size());
      }
      tensors.close();
      rng.close();
      file.flush();
      file.close();
    }
    sync_path(temporary, O_RDONLY, "checkpoint file");
    std::filesystem::rename(temporary, target, ec);
    if (ec) {
      throw CheckpointError("cannot move '" + temporary + "' to '" + path + "': " + ec.message());
    }
    sync_path(directory.string(), O_RDONLY | O_DIRECTORY, "directory");
  } catch (const Hdf5Error& error) {
    std::filesystem::remove(temporary, ec);
    throw CheckpointError("cannot save checkpoint '" + path + "': " + error.what() +
                          " (check free space and that the directory is writable)");
  } catch (...) {
    std::filesystem::remove(temporary, ec);
    throw;
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw CheckpointError("checkpoint '" + path + "' does not exist or is not a file");
  }
  if (!h5::is_hdf5_file(path)) {
    throw CheckpointError("'" + path + "' is not an HDF5 file, so not an ipupod checkpoint");
  }
  try {
    const std::uintmax_t file_bytes = std::filesystem::file_size(path, ec);
    if (ec) throw CheckpointError("cannot read checkpoint '" + path + "': " + ec.message());
    const h5::File file = h5::File::open(path, true);
    const auto strings = file.string_attributes();
    const auto format = strings.find("format");
    if (format == strings.end() || format->second != kFormat) {
      throw CheckpointError("'" + path + "' is an HDF5 file but not an ipupod checkpoint (no '" +
                            kFormat + "' format attribute)");
    }
    const std::uint64_t version = file.uint64_attribute("version");
    if (version != kVersion) {
      throw CheckpointError("checkpoint '" + path + "' has format version " +
                            std::to_string(version) + "; this build reads version " +
                            std::to_string(kVersion) +
                            (version < kVersion ? " (older checkpoints carry no checksums and "
                                                  "cannot be verified; start the run afresh)"
                                                : " (use the ipupod build that wrote it)"));
    }
    for (const char* part : {"checksums", "config_json", "state_json", "rng", "tensors"}) {
      if (!file.has_link(part)) {
        throw CheckpointError("checkpoint '" + path + "' lacks '/" + part +
                              "'; it is damaged or was not written by ipupod");
      }
    }
    const std::string record = read_text(file, "checksums", file_bytes);
    const std::uint64_t record_checksum = file.uint64_attribute("checksum");
    if (record_checksum != crc32c(text_bytes(record))) {
      throw CheckpointError("checkpoint '" + path +
                            "': its checksum record fails its CRC32C check "
                            "(computed " +
                            std::to_string(crc32c(text_bytes(record))) + ", recorded " +
                            std::to_string(record_checksum) +
                            "): the file was changed or damaged after it was written; resume "
                            "from another checkpoint (an earlier one, or a copy)");
    }
    Checkpoint checkpoint;
    checkpoint.step = file.uint64_attribute("step");
    checkpoint.config_json = read_text(file, "config_json", file_bytes);
    checkpoint.state_json = read_text(file, "state_json", file_bytes);
    const h5::Group rng = file.open_group("rng");
    for (const std::string& name : rng.link_names()) {
      checkpoint.rng_states[from_link_name(name, path)] = read_text(rng, name, file_bytes);
    }
    const h5::Group tensors = file.open_group("tensors");
    for (const std::string& name : tensors.link_names()) {
      checkpoint.tensors[from_link_name(name, path)] = read_array(tensors, name, file_bytes);
    }
    verify_checksums(checkpoint, record, path);
    for (const auto& [name, array] : checkpoint.tensors) check_finite(name, array, path);
    return checkpoint;
  } catch (const Hdf5Error& error) {
    throw CheckpointError("cannot read checkpoint '" + path + "': " + error.what());
  }
}

void check_compatible(const Checkpoint& checkpoint,
                      const std::map<std::string, std::vector<std::size_t>>& expected_shapes) {
  std::map<std::string, std::vector<std::size_t>> saved;
  for (const auto& [name, array] : checkpoint.tensors) saved[name] = array.shape;
  check_compatible(saved, checkpoint.step, expected_shapes);
}

void check_compatible(const std::map<std::string, std::vector<std::size_t>>& saved_shapes,
                      std::uint64_t step,
                      const std::map<std::string, std::vector<std::size_t>>& expected_shapes) {
  std::string missing, unexpected, shapes;
  const auto append = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  for (const auto& [name, shape] : expected_shapes) {
    const auto found = saved_shapes.find(name);
    if (found == saved_shapes.end()) {
      append(missing, "'" + name + "' " + shape_string(shape));
    } else if (found->second != shape) {
      append(shapes, "'" + name + "' is " + shape_string(found->second) +
                         " in the checkpoint but " + shape_string(shape) + " in the model");
    }
  }
  for (const auto& [name, shape] : saved_shapes) {
    if (expected_shapes.count(name) == 0)
      append(unexpected, "'" + name + "' " + shape_string(shape));
  }
  if (missing.empty() && unexpected.empty() && shapes.empty()) return;
  std::string message =
      "the checkpoint (step " + std::to_string(step) + ") does not fit the model:";
  if (!missing.empty()) message += " missing tensors: " + missing + ";";
  if (!unexpected.empty()) message += " tensors the model does not have: " + unexpected + ";";
  if (!shapes.empty()) message += " different shapes: " + shapes + ";";
  message += " was it saved from another model or configuration?";
  throw CheckpointError(message);
}

}  // namespace ipupod::host
