// Subcommands of `ipupod data`, one per converter.
#include "datasets/cli.hpp"

#include <iostream>
#include <memory>

#include "datasets/fashion_mnist.hpp"
#include "host/dataset.hpp"

namespace ipupod::datasets {
namespace {

// Runs a converter and maps its failures to exit codes with a message on stderr.
template <class Convert>
int run_converter(const Convert& convert) {
  try {
    std::cout << convert().summary() << std::endl;
    return 0;
  } catch (const host::DatasetError& e) {
    std::cerr << "ipupod data: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "ipupod data: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ipupod data: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

void add_data_commands(CLI::App& data, int& exit_code) {
  auto fmnist = std::make_shared<FashionMnistOptions>();
  CLI::App* fm = data.add_subcommand("fashion-mnist", "Fashion-MNIST from Debian's dataset-fashion-mnist");
  fm->add_option("--out", fmnist->out, "Output HDF5 file")->required();
  fm->add_option("--source", fmnist->source_dir, "Folder of the four IDX .gz files")->capture_default_str();
  fm->add_flag("--force", fmnist->overwrite, "Overwrite an existing output file");
  fm->add_option("--limit-train", fmnist->limit_train, "Keep the first N training samples (0: all)");
  fm->add_option("--limit-test", fmnist->limit_test, "Keep the first N test samples (0: all)");
  fm->callback([fmnist, &exit_code] {
    exit_code = run_converter([&] { return convert_fashion_mnist(*fmnist); });
  });
}

}  // namespace ipupod::datasets
