#!/usr/bin/env bash
# `cmake --install` of the build tree into a temporary prefix, then what a user does with it:
# a program of their own built with find_package(ipupod) against the exported targets (a
# matmul on an emulated IPU, checked), the installed command, launcher, Slurm scripts and man
# page.
#   install_test.sh SOURCE_DIR BUILD_DIR [EXTRA_CXX_FLAGS]
set -euo pipefail
source_dir=$1 build_dir=$2 flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.txt"
check "installs the ipupod command" test -x "$prefix/bin/ipupod"
check "installs the launcher" test -x "$prefix/bin/ipupod-run"
check "installs the Slurm scripts" test -f "$prefix/share/ipupod/slurm/ipupod-train.sbatch"
check "installs the CMake package" test -f "$prefix/lib/cmake/ipupod/ipupodConfig.cmake"
check "installs the headers by layer" test -f "$prefix/include/ipu_process/engine.hpp"
check "installed ipupod runs" "$prefix/bin/ipupod" --version
check "the installed launcher finds the installed ipupod on PATH" \
  env PATH="$prefix/bin:$PATH" "$prefix/bin/ipupod-run" --replicas 2 --dry-run -- ipupod train
if command -v help2man >/dev/null; then
  check "installs the man page" test -s "$prefix/share/man/man1/ipupod.1"
  check "the man page names the subcommands" grep -q 'estimate' "$prefix/share/man/man1/ipupod.1"
fi

# The consumer: configured and built against the install tree only.
code=0
cmake -S "$source_dir/tests/install/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release ${flags:+"-DCMAKE_CXX_FLAGS=$flags"} \
  ${flags:+"-DCMAKE_EXE_LINKER_FLAGS=$flags"} >"$work/configure.txt" 2>&1 || code=$?
if [[ $code -ne 0 ]]; then cat "$work/configure.txt"; fi
check "find_package(ipupod) configures a consumer" test "$code" -eq 0
code=0
cmake --build "$work/consumer" >"$work/build.txt" 2>&1 || code=$?
if [[ $code -ne 0 ]]; then cat "$work/build.txt"; fi
check "the consumer builds against ipupod::pod" test "$code" -eq 0
if [[ -x "$work/consumer/consumer" ]]; then
  code=0
  "$work/consumer/consumer" >"$work/run.txt" 2>&1 || code=$?
  cat "$work/run.txt"
  check "the consumer's matmul on an emulated IPU is right (exit $code)" test "$code" -eq 0
  check "the consumer reports its predicted cycles" grep -q 'cycles$' "$work/run.txt"
fi
# The headers came from the install tree, not the sources.
check "the consumer compiled against the installed headers" \
  bash -c "! grep -rq -- '-I$source_dir' '$work/consumer/build.ninja'"

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all install checks passed"
