// `ipupod info`: architecture presets, topologies, codelets and models, like gc-info.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace ipupod::pod {

struct InfoRequest {
  std::string arch;           // details of one preset, with sources
  std::string topology;       // layout of one topology
  std::string model;          // layer summary of one model
  std::string loss = "auto";  // an ONNX model's --loss (an image or field output needs one)
  bool codelets = false;
  bool models = false;
  bool json = false;        // all of it as one JSON object (for scripts such as ipupod-run)
  nlohmann::json defaults;  // with json: each command's option defaults, from the CLI
};

// Prints what was asked (everything in brief when nothing was); throws std::invalid_argument
// for an unknown name.
void print_info(const InfoRequest& request, std::ostream& out);
// The same as one JSON object: "architectures" (every field and its sources), "topologies"
// (sizes, and which IPUs each machine holds), "models", "codelets", "defaults"; with --topology
// only that topology (a preset or a file).
nlohmann::json info_json(const InfoRequest& request);

}  // namespace ipupod::pod
