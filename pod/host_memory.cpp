// Resident memory of this process from /proc/self/status.
#include "pod/host_memory.hpp"

#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ipupod::pod {
namespace {

// The value of a "Name:   1234 kB" line of /proc/self/status, in bytes.
std::size_t status_kib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(key + ":", 0) == 0) {
      try {
        return std::stoull(line.substr(key.size() + 1)) * 1024;
      } catch (const std::exception&) {
        return 0;
      }
    }
  return 0;
}

}  // namespace

std::size_t resident_bytes() {
  return status_kib("VmRSS");
}

std::size_t peak_resident_bytes() {
  return status_kib("VmHWM");
}

bool reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

void release_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace ipupod::pod
