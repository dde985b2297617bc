// `ipupod bench input`: how many samples per second one host can decode and augment from a real
// image format, the figure `ipupod estimate --host-input-rate` takes. Real photographs
// (plasma-workspace-wallpapers) are cut into SIZE x SIZE crops and written as PNG or JPEG files,
// as an image data set is stored; each round decodes every file on N threads into planar float
// [0,1] pixels (stb_image), normalises each channel and flips half of them at random, as a
// PyTorch DataLoader's workers do with ToTensor, Normalize and RandomHorizontalFlip. The peer,
// scripts/bench_input_pil.py, does the same with Pillow and NumPy in N processes; rounds
// alternate so both see the same load of a shared machine.
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "datasets/image_io.hpp"
#include "datasets/sr_images.hpp"
#include "host/dataset.hpp"
#include "pod/cli/bench.hpp"

namespace ipupod::pod {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct InputBenchOptions {
  std::string format = "png";
  std::size_t size = 256;
  std::size_t images = 64;
  std::size_t threads = 1;
  std::size_t repeats = 5;
  std::vector<std::string> sources;  // photographs to crop (default: the wallpapers)
  bool peer = true;
  std::string python = "/usr/bin/python3";  // Debian's, with python3-pil and python3-numpy
  std::string pil_script;                   // empty: found next to the sources
};

// A temporary folder removed with the object.
class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "ipupod-bench-input-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("cannot create a temporary folder");
    path_ = pattern;
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The data set: `images` crops, SIZE x SIZE, taken at seeded random places of the photographs in
// turn, written as 8-bit RGB files of the format.
std::vector<std::string> write_images(const InputBenchOptions& o, const fs::path& folder) {
  std::vector<std::string> sources = o.sources;
  if (sources.empty()) {
    try {
      sources = datasets::resolve_images({});  // the wallpapers' photographs
    } catch (const host::DatasetError& e) {
      throw std::invalid_argument(std::string("no photographs to make the images from (") +
                                  e.what() + "); give --source FILE");
    }
  }
  std::mt19937_64 random(7);
  std::vector<std::string> files;
  std::vector<unsigned char> rgb(o.size * o.size * 3);
  for (std::size_t i = 0; i < sources.size() && files.size() < o.images; ++i) {
    datasets::Image photo;
    try {
      photo = datasets::load_image(sources[i], 3);
    } catch (const host::DatasetError& e) {  // a --source that is no photograph: bad input
      throw std::invalid_argument(std::string(e.what()) + " (--source)");
    }
    if (photo.height < o.size || photo.width < o.size)
      throw std::invalid_argument("--size " + std::to_string(o.size) + " is larger than '" +
                                  sources[i] + "' (" + std::to_string(photo.width) + "x" +
                                  std::to_string(photo.height) + "); choose a smaller --size");
    const std::size_t per_photo = (o.images - files.size() + sources.size() - i - 1) /
                                  (sources.size() - i);  // spread evenly over the rest
    for (std::size_t k = 0; k < per_photo; ++k) {
      const std::size_t y = random() % (photo.height - o.size + 1);
      const std::size_t x = random() % (photo.width - o.size + 1);
      for (std::size_t r = 0; r < o.size; ++r)
        for (std::size_t c = 0; c < o.size; ++c)
          for (std::size_t ch = 0; ch < 3; ++ch)
            rgb[(r * o.size + c) * 3 + ch] =
                static_cast<unsigned char>(photo.at(ch, y + r, x + c) * 255.f + 0.5f);
      const std::string file =
          (folder / ("image-" + std::to_string(files.size()) + "." + o.format)).string();
      datasets::save_rgb8(file, rgb, o.size, o.size, o.format);
      files.push_back(file);
    }
  }
  return files;
}

// One round: every file decoded, normalised and maybe flipped, on `threads` threads (each takes
// the next file); returns the seconds it took. `checksum` keeps the work from being skipped.
double ipupod_round(const std::vector<std::string>& files, std::size_t threads, double& checksum) {
  static constexpr float kMean[3] = {0.485f, 0.456f, 0.406f}, kStd[3] = {0.229f, 0.224f, 0.225f};
  std::atomic<std::size_t> next{0};
  std::vector<double> sums(threads, 0.0);
  std::vector<std::exception_ptr> errors(threads);
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      try {
        std::mt19937 random(static_cast<std::uint32_t>(t + 1));
        for (std::size_t i = next++; i < files.size(); i = next++) {
          datasets::Image image = datasets::load_image(files[i], 3);
          const bool flip = random() % 2 == 1;
          for (std::size_t c = 0; c < 3; ++c)
            for (std::size_t y = 0; y < image.height; ++y) {
              float* row = &image.at(c, y, 0);
              for (std::size_t x = 0; x < image.width; ++x) row[x] = (row[x] - kMean[c]) / kStd[c];
              if (flip) std::reverse(row, row + image.width);
            }
          sums[t] += image.pixels[image.pixels.size() / 2];
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  for (std::thread& w : workers) w.join();
  const double seconds = seconds_since(start);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (double s : sums) checksum += s;
  return seconds;
}

// One round of the peer: its own timing of the same files ("seconds S images N"), or why not.
double peer_round(const InputBenchOptions& o, const std::string& script, const fs::path& folder,
                  std::size_t images) {
  std::ostringstream command;
  command << "'" << o.python << "' '" << script << "' --folder '" << folder.string()
          << "' --threads " << o.threads << " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.str().c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot start " + o.python);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe.get())) output += buffer;
  const int status = pclose(pipe.release());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 127)
    throw std::invalid_argument("cannot run the peer's interpreter --python '" + o.python +
                                "'; install python3, or pass --no-peer");
  if (code == 3)
    throw std::invalid_argument("Pillow or NumPy is missing for " + o.python +
                                ": install python3-pil and python3-numpy "
                                "(scripts/install-deps.sh), or pass --no-peer");
  std::istringstream words(output);
  std::string word;
  double seconds = 0;
  std::size_t decoded = 0;
  while (words >> word) {
    if (word == "seconds") words >> seconds;
    if (word == "images") words >> decoded;
  }
  if (code != 0 || decoded != images || !(seconds > 0))
    throw std::runtime_error("the Pillow peer failed (exit status " + std::to_string(code) +
                             "): " + output);
  return seconds;
}

int run_input_bench(const InputBenchOptions& o) {
  if (o.format != "png" && o.format != "jpeg")
    throw std::invalid_argument("--format: expected png or jpeg, got '" + o.format + "'");
  const std::string script =
      o.peer ? find_peer_script("bench_input_pil.py", o.pil_script, "--pil-script") : "";
  const TempFolder folder;
  const auto made = Clock::now();
  const std::vector<std::string> files = write_images(o, folder.path());
  std::uintmax_t bytes = 0;
  for (const std::string& f : files) bytes += fs::file_size(f);
  std::cout << "ipupod bench input: " << files.size() << " " << o.format << " images of 3x"
            << o.size << "x" << o.size << " cut from real photographs (" << std::fixed
            << std::setprecision(1) << static_cast<double>(bytes) / files.size() / 1024
            << " KiB each, made in " << seconds_since(made) << " s); decode, normalise, random "
            << "flip on " << o.threads << " thread(s), " << o.repeats << " rounds" << std::endl;
  double checksum = 0;
  std::vector<double> ours, theirs;
  ipupod_round(files, o.threads, checksum);  // untimed: the files into the page cache
  for (std::size_t r = 0; r < o.repeats; ++r) {
    ours.push_back(static_cast<double>(files.size()) / ipupod_round(files, o.threads, checksum));
    if (o.peer)
      theirs.push_back(static_cast<double>(files.size()) /
                       peer_round(o, script, folder.path(), files.size()));
  }
  const double rate = median(ours);
  std::cout << std::setprecision(0) << "  ipupod (stb_image):  " << rate << " samples/s (median of "
            << o.repeats << ")" << std::endl;
  if (o.peer) {
    const double peer = median(theirs);
    std::cout << "  Pillow + NumPy:      " << peer << " samples/s (median, " << o.threads
              << " process(es))" << std::endl;
    std::cout << std::setprecision(2) << "  ratio ipupod / Pillow: " << rate / peer << std::endl;
  }
  std::cout << std::setprecision(0) << "  for an estimate: ipupod estimate ... --host-input-rate "
            << rate << "  (per host server with " << o.threads << " decoding thread(s))"
            << std::endl;
  return std::isfinite(checksum) ? 0 : 1;
}

}  // namespace

void add_input_bench(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<InputBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "input",
      "Host input rate of a real image format: PNG or JPEG files cut from real photographs, "
      "decoded, normalised and randomly flipped as a data loader's workers do, vs Pillow and "
      "NumPy in as many processes (scripts/bench_input_pil.py); the figure for `ipupod estimate "
      "--host-input-rate`");
  cmd->add_option("--format", o->format, "png or jpeg (quality 90)")->capture_default_str();
  cmd->add_option("--size", o->size, "Side of the square RGB images")
      ->check(whole_number(8, 8192))
      ->capture_default_str();
  cmd->add_option("--images", o->images, "Image files in the set each round decodes")
      ->check(whole_number(1, 100000))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Decoding threads (the peer: processes)")
      ->check(whole_number(1, kMaxBenchThreads))
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Timed rounds of each; medians reported")
      ->check(whole_number(1, kMaxBenchRounds))
      ->capture_default_str();
  cmd->add_option("--source", o->sources,
                  "Photographs to cut the images from (default: plasma-workspace-wallpapers')");
  cmd->add_flag("!--no-peer", o->peer, "Time ipupod only (no Python)");
  cmd->add_option("--python", o->python, "Interpreter for the Pillow peer")->capture_default_str();
  cmd->add_option("--pil-script", o->pil_script,
                  "The peer script (default: scripts/bench_input_pil.py of the sources)");
  cmd->callback([o, &exit_code] { exit_code = run_bench([&] { return run_input_bench(*o); }); });
}

}  // namespace ipupod::pod
