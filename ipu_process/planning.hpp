// Planning defaults shared by the op libraries' planners and the pod's configuration: how much
// of a tile's memory a plan may use.
#pragma once

namespace ipupod::ipu {

// The share of a tile's memory an op's plan may use: the default of Poplar's
// availableMemoryProportion option, 0.6.
inline constexpr double kDefaultAvailableMemoryProportion = 0.6;

}  // namespace ipupod::ipu
