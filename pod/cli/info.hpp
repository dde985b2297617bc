// `ipupod info`: architecture presets, topologies, codelets and models, like gc-info.
#pragma once

#include <ostream>
#include <string>

namespace ipupod::pod {

struct InfoRequest {
  std::string arch;      // details of one preset, with sources
  std::string topology;  // layout of one topology
  std::string model;     // layer summary of one model
  bool codelets = false;
  bool models = false;
};

// Prints what was asked (everything in brief when nothing was); throws std::invalid_argument
// for an unknown name.
void print_info(const InfoRequest& request, std::ostream& out);

}  // namespace ipupod::pod
