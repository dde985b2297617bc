#!/usr/bin/env bash
# Installs what ipupod needs, builds it with warnings as errors, and runs every test; then
# builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs the suite again.
#   IPUPOD_SKIP_SANITIZE=1   skip the sanitizer pass
#   IPUPOD_BUILD_DIR=DIR     where the normal build goes (default build/test)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs=$(nproc)
build_and_test() {
  local dir=$1
  shift
  echo "== configure $dir ($*)"
  cmake -S . -B "$dir" -G Ninja -DIPUPOD_WERROR=ON "$@" >/dev/null
  echo "== build $dir"
  cmake --build "$dir" -j "$jobs"
  echo "== test $dir"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs"
}

build_and_test "${IPUPOD_BUILD_DIR:-build/test}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [[ "${IPUPOD_SKIP_SANITIZE:-0}" != 1 ]]; then
  # -O1 and line tables only: what the sanitizers need for exact reports, at a fraction of the
  # compile time of a full optimised debug build.
  build_and_test build/sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIPUPOD_SANITIZE=ON \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
fi
echo "== all tests passed"
