// The one exception type the fabric throws: transport failures, bad collective arguments,
// unknown topology presets. Messages say what failed, where, expected vs got, and what to try.
#pragma once

#include <stdexcept>

namespace ipupod::fabric {

class FabricError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ipupod::fabric
