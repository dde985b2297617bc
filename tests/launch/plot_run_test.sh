#!/usr/bin/env bash
# scripts/plot_run.py on real runs: a 2-replica run and a 2-replica x 2-stage pipelined run of a
# small MLP get loss.png and one memory-ipu<N>.png per IPU (every stage), the paths it prints
# are the files it wrote, and bad input (a missing directory, a truncated memory.json, an empty
# metrics.csv) exits 2 with one error line and no traceback. Skipped (exit 77) without Python's
# matplotlib.
#   plot_run_test.sh SOURCE_DIR IPUPOD_BINARY
set -euo pipefail
source_dir=$1 ipupod=$2
run=$source_dir/scripts/ipupod-run
plot=$source_dir/scripts/plot_run.py
python=python3
[[ -x /usr/bin/python3 ]] && python=/usr/bin/python3  # Debian's, which sees Debian's packages
if ! "$python" -c 'import matplotlib' 2>/dev/null; then
  echo "SKIPPED: $python cannot import matplotlib (install python3-matplotlib)"
  exit 77
fi
unset SLURM_JOB_ID  # the mpirun path, even when ctest itself runs inside a Slurm job
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
is_png() {  # is_png FILE MIN_BYTES: the PNG signature and a plausible size
  [[ -f $1 && $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] &&
    (($(stat -c %s "$1") >= $2))
}

"$ipupod" data fashion-mnist --out "$work/fmnist.h5" --limit-train 128 --limit-test 32 >/dev/null
train=(train --model mlp --hidden 16 --arch tiny --micro-batch 8 --data "$work/fmnist.h5")
"$run" --replicas 2 -- "$ipupod" "${train[@]}" --epochs 2 --run-dir "$work/run" \
  >"$work/train.txt" 2>&1 || { cat "$work/train.txt"; exit 1; }
"$run" --replicas 2 --ipus-per-replica 2 -- "$ipupod" "${train[@]}" --epochs 1 \
  --gradient-accumulation 2 --run-dir "$work/run22" >"$work/train22.txt" 2>&1 ||
  { cat "$work/train22.txt"; exit 1; }

plots() {  # plots OUT_DIR EXPECTED_PNG... -- PLOT_RUN_ARGS...: runs it, checks what it wrote
  local out_dir=$1 code=0 png expected=() pngs=()
  shift
  while [[ $1 != -- ]]; do pngs+=("$1") && shift; done
  shift
  "$python" "$plot" "$@" >"$work/plot.txt" 2>"$work/plot.err" || code=$?
  cat "$work/plot.txt" "$work/plot.err"
  check "plot_run.py $*: exits 0" test "$code" -eq 0
  check "plot_run.py $*: no warnings or errors" test ! -s "$work/plot.err"
  for png in "${pngs[@]}"; do
    check "$out_dir/$png is a PNG of 10 kB or more" is_png "$out_dir/$png" 10000
    expected+=("plot_run.py: wrote $out_dir/$png")
  done
  check "plot_run.py $*: prints exactly the paths written" \
    diff <(printf '%s\n' "${expected[@]}") <(grep -v skipped "$work/plot.txt")
  check "plot_run.py $*: writes no other PNG" diff <(printf '%s\n' "${pngs[@]}" | sort) \
    <(find "$out_dir" -maxdepth 1 -name '*.png' -printf '%f\n' | sort)
}
# Beside the run by default; pipelined: every stage of every replica is an IPU of its own.
plots "$work/run" loss.png memory-ipu{0,1}.png -- "$work/run"
plots "$work/plots22" loss.png memory-ipu{0,1,2,3}.png -- "$work/run22" --out-dir "$work/plots22"
# Which IPU each map shows: its title, also stored as the PNG's Title text.
title() { grep -a -q -- "Title.*$2" "$1"; }
check "IPU 1's map: replica 1, arch tiny, 32 tiles" \
  title "$work/run/memory-ipu1.png" 'IPU 1, replica 1 - arch tiny, 32 tiles'
check "pipelined IPU 2's map: replica 1, stage 0" \
  title "$work/plots22/memory-ipu2.png" 'IPU 2, replica 1, pipeline stage 0 (of 2)'
check "pipelined IPU 3's map: replica 1, stage 1" \
  title "$work/plots22/memory-ipu3.png" 'IPU 3, replica 1, pipeline stage 1 (of 2)'
check "loss.png names the model and layout" \
  title "$work/plots22/loss.png" 'mlp, tiny, 2 replica(s) x 2 stage(s)'
# --max-ipus: the first N IPUs, and which were skipped.
"$python" "$plot" "$work/run22" --out-dir "$work/max" --max-ipus 3 >"$work/max.txt"
check "--max-ipus 3 draws IPUs 0-2 only" \
  diff <(find "$work/max" -mindepth 1 -printf '%f\n' | sort) \
  <(printf '%s\n' loss.png memory-ipu{0,1,2}.png)
check "--max-ipus 3 names the skipped IPU" \
  grep -q 'skipped the memory maps of 1 of 4 IPUs (IPU 3)' "$work/max.txt"

# Bad input: exit 2, one line on stderr saying what, nothing on stdout, never a traceback.
expect_error() {  # expect_error DESCRIPTION PATTERN RUN_DIR
  local what=$1 pattern=$2 dir=$3 code=0
  "$python" "$plot" "$dir" --out-dir "$work/bad-plots" >"$work/err.out" 2>"$work/err.txt" ||
    code=$?
  echo "$what: exit $code: $(cat "$work/err.txt")"
  check "$what: exit 2" test "$code" -eq 2
  check "$what: one line" test "$(wc -l <"$work/err.txt")" -eq 1
  check "$what: says '$pattern'" grep -q -- "$pattern" "$work/err.txt"
  check "$what: no traceback" bash -c "! grep -q Traceback '$work/err.txt'"
  check "$what: nothing on stdout, no PNG" bash -c "test ! -s '$work/err.out' &&
    ! ls '$work/bad-plots'/*.png 2>/dev/null"
}
expect_error "missing directory" "$work/nowhere: no such directory" "$work/nowhere"
mkdir "$work/truncated" "$work/empty"
cp "$work/run/metrics.csv" "$work/truncated/"
head -c 1000 "$work/run/memory.json" >"$work/truncated/memory.json"
expect_error "truncated memory.json" "memory.json: expected a JSON list .* invalid JSON" \
  "$work/truncated"
: >"$work/empty/metrics.csv"
cp "$work/run/memory.json" "$work/empty/"
expect_error "empty metrics.csv" "metrics.csv is empty" "$work/empty"

if ((failures > 0)); then
  echo "$failures check(s) FAILED"
  exit 1
fi
echo "all checks passed"
