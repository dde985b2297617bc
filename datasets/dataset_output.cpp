// DatasetOutput: host::DatasetWriter writes the schema to a staging file, the extra datasets are
// added to it with the HDF5 layer, and a rename publishes the result.
#include "datasets/dataset_output.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "host/dataset.hpp"
#include "host/hdf5.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;
using host::HostArray;

constexpr std::size_t kChunkSamples = 256;  // as host::DatasetWriterOptions' default
// Chunks of at most 1 MiB fit HDF5's default per-dataset chunk cache (as in host/dataset.cpp).
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 20;

std::vector<std::size_t> chunk_of(const HostArray& array) {
  std::vector<std::size_t> chunk = array.shape;
  const std::size_t row_bytes =
      std::max<std::size_t>(1, array.elements() / std::max<std::size_t>(1, array.shape[0]) *
                                   host::dtype_size(array.dtype));
  chunk[0] = std::max<std::size_t>(
      1, std::min({kChunkSamples, array.shape[0], kMaxChunkBytes / row_bytes}));
  return chunk;
}

// Removes the staging files unless released (a failed conversion leaves nothing behind).
struct StagingGuard {
  std::string path;
  bool released = false;
  ~StagingGuard() {
    if (released) return;
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
    std::filesystem::remove(path + ".tmp", ignored);
  }
};

}  // namespace

std::string to_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

std::string ConversionSummary::summary() const {
  std::ostringstream text;
  // Train first: std::map would list test before train.
  std::vector<std::pair<std::string, std::size_t>> ordered(samples.begin(), samples.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return a.first == "train" && b.first != "train";
  });
  for (const auto& [split, count] : ordered) {
    text << split << ": " << count << " samples";
    for (const ArrayLine& line : arrays) {
      if (line.split != split) continue;
      text << "\n  " << line.name << " " << line.description << " (" << line.bytes << " bytes)";
    }
    text << "\n";
  }
  for (const std::string& note : notes) text << note << "\n";
  text.precision(3);
  text << "wrote " << out << " (" << file_bytes << " bytes) in " << std::fixed << seconds << " s";
  return text.str();
}

DatasetOutput::DatasetOutput(std::string out, bool overwrite) : out_(std::move(out)) {
  if (out_.empty()) throw DatasetError("no output path given; pass --out FILE.h5");
  std::error_code ec;
  if (std::filesystem::exists(out_, ec) && !overwrite) {
    throw DatasetError("output '" + out_ +
                       "' already exists; pass --force to overwrite it, or choose another path");
  }
  const std::filesystem::path parent = std::filesystem::path(out_).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    throw DatasetError("cannot write '" + out_ + "': directory '" + parent.string() +
                       "' does not exist; create it first");
  }
}

void DatasetOutput::set_split(const std::string& split, HostArray inputs, HostArray targets) {
  splits_[split].inputs = std::move(inputs);
  splits_[split].targets = std::move(targets);
}

void DatasetOutput::add_extra(const std::string& split, const std::string& name, HostArray array) {
  splits_[split].extras.emplace_back(name, std::move(array));
}

void DatasetOutput::set_attribute(const std::string& name, const std::string& value) {
  attributes_.emplace_back(name, value);
}

void DatasetOutput::set_attribute(const std::string& split, const std::string& name, double value) {
  splits_[split].attributes.emplace_back(name, value);
}

ConversionSummary DatasetOutput::finish() {
  ConversionSummary summary;
  summary.out = out_;
  summary.notes = notes_;
  StagingGuard staging{out_ + ".partial"};
  {
    host::DatasetWriter writer(staging.path, {.overwrite = true});
    for (const auto& [name, split] : splits_) {
      writer.write_split(name, split.inputs, split.targets);
      for (const auto& [attribute, value] : split.attributes)
        writer.set_attribute(name, attribute, value);
      summary.samples[name] = split.inputs.shape.at(0);
      summary.arrays.push_back(
          {name, "inputs", split.inputs.describe(), split.inputs.size_bytes()});
      summary.arrays.push_back(
          {name, "targets", split.targets.describe(), split.targets.size_bytes()});
    }
    for (const auto& [name, value] : attributes_) writer.set_attribute(name, value);
    writer.finish();
  }
  {
    host::h5::File file = host::h5::File::open(staging.path, /*read_only=*/false);
    for (const auto& [name, split] : splits_) {
      host::h5::Group group = file.open_group(name);
      for (const auto& [extra, array] : split.extras) {
        if (array.shape.empty() || array.shape[0] != split.inputs.shape.at(0)) {
          throw std::logic_error("extra dataset '/" + name + "/" + extra + "' " + array.describe() +
                                 " must have one row per sample (" +
                                 std::to_string(split.inputs.shape.at(0)) + ")");
        }
        const std::vector<std::size_t> chunk = chunk_of(array);
        group.create_dataset(extra, array.dtype, array.shape, chunk).write(array);
        summary.arrays.push_back({name, extra, array.describe(), array.size_bytes()});
      }
    }
    file.flush();
    file.close();
  }
  std::error_code ec;
  std::filesystem::rename(staging.path, out_, ec);
  if (ec) {
    throw std::runtime_error("cannot move '" + staging.path + "' to '" + out_ +
                             "': " + ec.message());
  }
  staging.released = true;
  summary.file_bytes = std::filesystem::file_size(out_);
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return summary;
}

}  // namespace ipupod::datasets
