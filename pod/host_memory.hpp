// The emulator's own memory on the host (Linux /proc/self/status): what a rank holds resident,
// its peak, and a reset of the peak so that each compiled stage can be measured on its own.
#pragma once

#include <cstddef>

namespace ipupod::pod {

std::size_t resident_bytes();       // VmRSS; 0 where /proc cannot tell
std::size_t peak_resident_bytes();  // VmHWM since the start or the last reset; 0 if unknown
// Starts a new peak from the current resident size (writes 5 to /proc/self/clear_refs);
// returns false where the kernel does not allow it (the peak then spans the whole process).
bool reset_peak_resident();
// Gives the pages of freed heap memory back to the system (glibc's malloc_trim), where a long
// phase freed much of what it built; a no-op elsewhere.
void release_free_heap();

}  // namespace ipupod::pod
