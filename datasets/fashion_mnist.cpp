// Fashion-MNIST converter: gzip IDX parsing with zlib (big-endian headers, checked against the
// format) and the scaling to float32 [0,1] that the models expect.
#include "datasets/fashion_mnist.hpp"

#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

using host::DatasetError;
using host::DType;
using host::HostArray;

constexpr std::uint32_t kIdxImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr std::uint32_t kIdxLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dimension
constexpr double kPixelScale = 255.0;
constexpr const char* kClassNames =
    "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot";

struct GzClose {
  void operator()(gzFile_s* file) const { gzclose(file); }
};

class GzReader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_, ec)) {
      throw DatasetError("Fashion-MNIST file '" + path_ +
                         "' is missing; install the Debian package dataset-fashion-mnist or pass "
                         "the directory holding the four *-ubyte.gz files");
    }
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) throw DatasetError("cannot open '" + path_ + "' for reading");
  }

  // Reads exactly `size` bytes; DatasetError naming `what` if the file ends early or is corrupt.
  void read(void* out, std::size_t size, const std::string& what) {
    auto* bytes = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < size) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(size - done, 1U << 30));
      const int got = gzread(file_.get(), bytes + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_.get(), &code);
        throw DatasetError("'" + path_ + "' is not a readable gzip file (" +
                           std::string(message ? message : "zlib error") +
                           "); re-install the data or check the download");
      }
      if (got == 0) {
        throw DatasetError("'" + path_ + "' is truncated: expected " + std::to_string(size) +
                           " bytes of " + what + ", got " + std::to_string(done));
      }
      done += static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_u32_be(const std::string& what) {
    unsigned char raw[4];
    read(raw, 4, what);
    return (std::uint32_t{raw[0]} << 24) | (std::uint32_t{raw[1]} << 16) |
           (std::uint32_t{raw[2]} << 8) | std::uint32_t{raw[3]};
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<gzFile_s, GzClose> file_;
};

std::size_t effective_count(std::size_t available, std::size_t limit) {
  return limit == 0 ? available : std::min(available, limit);
}

struct Split {
  HostArray inputs;   // float32 [N,1,28,28]
  HostArray targets;  // int32 [N]
  double pixel_mean = 0, pixel_std = 0;
};

Split read_split(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                 std::size_t limit) {
  GzReader images(images_path.string());
  GzReader labels(labels_path.string());

  const std::uint32_t image_magic = images.read_u32_be("the IDX header");
  if (image_magic != kIdxImagesMagic) {
    throw DatasetError("'" + images.path() + "' has IDX magic number " +
                       std::to_string(image_magic) + ", expected " +
                       std::to_string(kIdxImagesMagic) + " (an images file); is it a labels file?");
  }
  const std::size_t image_count = images.read_u32_be("the IDX header");
  const std::size_t rows = images.read_u32_be("the IDX header");
  const std::size_t cols = images.read_u32_be("the IDX header");
  if (rows != kFashionMnistRows || cols != kFashionMnistCols) {
    throw DatasetError("'" + images.path() + "' holds " + std::to_string(rows) + "x" +
                       std::to_string(cols) + " images, expected " +
                       std::to_string(kFashionMnistRows) + "x" + std::to_string(kFashionMnistCols));
  }
  const std::uint32_t label_magic = labels.read_u32_be("the IDX header");
  if (label_magic != kIdxLabelsMagic) {
    throw DatasetError("'" + labels.path() + "' has IDX magic number " +
                       std::to_string(label_magic) + ", expected " +
                       std::to_string(kIdxLabelsMagic) + " (a labels file); is it an images file?");
  }
  const std::size_t label_count = labels.read_u32_be("the IDX header");
  if (image_count != label_count) {
    throw DatasetError("'" + images.path() + "' holds " + std::to_string(image_count) +
                       " images but '" + labels.path() + "' holds " + std::to_string(label_count) +
                       " labels; the files must come from the same split");
  }
  if (image_count == 0) throw DatasetError("'" + images.path() + "' holds no images");

  const std::size_t count = effective_count(image_count, limit);
  const std::size_t pixels = rows * cols;
  std::vector<std::uint8_t> raw_pixels(count * pixels);
  images.read(raw_pixels.data(), raw_pixels.size(), "pixel data");
  std::vector<std::uint8_t> raw_labels(count);
  labels.read(raw_labels.data(), raw_labels.size(), "labels");

  Split split;
  split.inputs = HostArray::zeros(DType::f32, {count, 1, rows, cols});
  split.targets = HostArray::zeros(DType::i32, {count});
  auto inputs = split.inputs.as<float>();
  double sum = 0, sum_squares = 0;
  for (std::size_t i = 0; i < raw_pixels.size(); ++i) {
    const double value = raw_pixels[i] / kPixelScale;
    inputs[i] = static_cast<float>(value);
    sum += value;
    sum_squares += value * value;
  }
  split.pixel_mean = sum / static_cast<double>(raw_pixels.size());
  split.pixel_std = std::sqrt(std::max(0.0, sum_squares / static_cast<double>(raw_pixels.size()) -
                                                split.pixel_mean * split.pixel_mean));
  auto targets = split.targets.as<std::int32_t>();
  for (std::size_t i = 0; i < count; ++i) {
    if (raw_labels[i] >= kFashionMnistClasses) {
      throw DatasetError("'" + labels.path() + "': label " + std::to_string(raw_labels[i]) +
                         " of sample " + std::to_string(i) + " is outside 0.." +
                         std::to_string(kFashionMnistClasses - 1));
    }
    targets[i] = raw_labels[i];
  }
  return split;
}

std::string split_line(const char* name, std::size_t samples) {
  const std::size_t input_bytes = samples * kFashionMnistRows * kFashionMnistCols * sizeof(float);
  const std::size_t target_bytes = samples * sizeof(std::int32_t);
  return std::string(name) + ": " + std::to_string(samples) + " samples, inputs float32 [" +
         std::to_string(samples) + ",1," + std::to_string(kFashionMnistRows) + "," +
         std::to_string(kFashionMnistCols) + "] (" + std::to_string(input_bytes) +
         " bytes), targets int32 [" + std::to_string(samples) + "] (" +
         std::to_string(target_bytes) + " bytes)";
}

}  // namespace

std::string ConvertReport::summary() const {
  return split_line("train", train_samples) + "\n" + split_line("test", test_samples) + "\n" +
         "wrote " + out + " (" + std::to_string(bytes) + " bytes)";
}

ConvertReport convert_fashion_mnist(const FashionMnistOptions& options) {
  if (options.out.empty()) {
    throw DatasetError("Fashion-MNIST conversion: no output path given (--out FILE.h5)");
  }
  const std::filesystem::path source(options.source_dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(source, ec)) {
    throw DatasetError("Fashion-MNIST source directory '" + options.source_dir +
                       "' does not exist; install the Debian package dataset-fashion-mnist or pass "
                       "the directory holding the four *-ubyte.gz files");
  }
  // Open the writer first: refusing to overwrite should not cost a full decode.
  host::DatasetWriter writer(options.out, {.overwrite = options.overwrite});
  const Split train = read_split(source / kFashionMnistTrainImages,
                                 source / kFashionMnistTrainLabels, options.limit_train);
  const Split test = read_split(source / kFashionMnistTestImages, source / kFashionMnistTestLabels,
                                options.limit_test);
  writer.write_split("train", train.inputs, train.targets);
  writer.write_split("test", test.inputs, test.targets);
  writer.set_attribute("source",
                       "Fashion-MNIST (Zalando Research), from the Debian package "
                       "dataset-fashion-mnist: " +
                           options.source_dir);
  writer.set_attribute("license", "MIT");
  writer.set_attribute("description",
                       "Fashion-MNIST: 28x28 greyscale images of clothing in 10 classes");
  writer.set_attribute("units", "inputs: pixel intensity in [0,1]; targets: class index 0..9");
  writer.set_attribute("normalisation", "pixel/255");
  writer.set_attribute("classes", kClassNames);
  for (const auto& [name, split] : {std::pair<const char*, const Split*>{"train", &train},
                                    std::pair<const char*, const Split*>{"test", &test}}) {
    writer.set_attribute(name, "pixel_mean", split->pixel_mean);
    writer.set_attribute(name, "pixel_std", split->pixel_std);
    // The class count the trainer checks every label against (the names above list them).
    writer.set_attribute(name, "classes", static_cast<double>(kFashionMnistClasses));
  }
  writer.finish();

  ConvertReport report;
  report.out = options.out;
  report.train_samples = train.targets.shape[0];
  report.test_samples = test.targets.shape[0];
  report.bytes = std::filesystem::file_size(options.out);
  return report;
}

}  // namespace ipupod::datasets
