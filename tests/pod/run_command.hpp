// Runs a shell command as a test's user would, with a hard time limit, and keeps its exit
// code and combined output (the end-to-end tests of the ipupod command).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ipupod::testing_support {

struct Result {
  int exit_code = -1;
  std::string output;
};

inline Result run(const std::string& command, int timeout_s = 600) {
  Result r;
  const std::string full = "timeout " + std::to_string(timeout_s) + " " + command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) r.output += buffer;
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace ipupod::testing_support
