#!/usr/bin/env bash
# The launcher end to end: scripts/ipupod-run trains a 2-replica MLP through mpirun on real
# (small) Fashion-MNIST data, prints the layout, and refuses impossible layouts with exit 2
# and a message before any process starts.
#   launch_test.sh SOURCE_DIR IPUPOD_BINARY
set -euo pipefail
source_dir=$1 ipupod=$2
run=$source_dir/scripts/ipupod-run
unset SLURM_JOB_ID  # the mpirun path, even when ctest itself runs inside a Slurm job
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

"$ipupod" data fashion-mnist --out "$work/fmnist.h5" --limit-train 256 --limit-test 64 >/dev/null

# A real 2-replica run through the launcher.
set +e
"$run" --replicas 2 -- "$ipupod" train --model mlp --hidden 16 --arch tiny --micro-batch 8 \
  --data "$work/fmnist.h5" --epochs 1 --run-dir "$work/run" >"$work/out.txt" 2>&1
code=$?
set -e
cat "$work/out.txt"
check "2-replica run exits 0" test "$code" -eq 0
check "layout names 3 ranks" grep -q '= 3 ranks; topology pod16' "$work/out.txt"
check "layout places replica 1 on rank 2" grep -q 'replica 1: rank 2 = IPU 1' "$work/out.txt"
# The mpirun flags are added exactly when needed, with the reason.
if [[ $(id -u) -eq 0 ]]; then
  check "adds --allow-run-as-root as root" grep -q 'adding --allow-run-as-root: running as root' "$work/out.txt"
else
  check "no --allow-run-as-root when not root" bash -c "! grep -q -- --allow-run-as-root '$work/out.txt'"
fi
cores=$(lscpu -p=SOCKET,CORE | grep -v '^#' | sort -u | wc -l)
if ((3 > cores)); then
  check "adds --oversubscribe for 3 ranks on $cores cores" grep -q "adding --oversubscribe: 3 ranks > $cores cores" "$work/out.txt"
else
  check "no --oversubscribe for 3 ranks on $cores cores" bash -c "! grep -q -- --oversubscribe '$work/out.txt'"
fi
summary=$work/run/summary.json
check "summary.json written" test -f "$summary"
if [[ -f "$summary" ]]; then
  check "summary says 2 replicas, 1 stage" grep -q -E '"replicas": 2,' "$summary"
  check "replicas' weights identical" grep -q '"replica_weights_identical": true' "$summary"
  check "all 256 samples trained" grep -q '"samples_trained": 256,' "$summary"
fi

# A 2 x 2 pod: the layout.
"$run" --replicas 2 --ipus-per-replica 2 --dry-run -- "$ipupod" train --data "$work/fmnist.h5" \
  --gradient-accumulation 4 >"$work/dry.txt"
cat "$work/dry.txt"
check "2x2 dry run: 5 ranks" grep -q '= 5 ranks' "$work/dry.txt"
check "2x2 dry run: replica 1 stage 1 is rank 4" grep -q 'rank 4 = IPU 3 .* stage 1' "$work/dry.txt"
check "2x2 dry run: passes --replicas 2 --stages 2" grep -q -- '--replicas 2 --stages 2' "$work/dry.txt"
check "2x2 dry run: mpirun -n 5" grep -q 'mpirun -n 5' "$work/dry.txt"

# The same 2 x 2 pod for real, one command: two replicas of a two-stage pipeline.
set +e
"$run" --replicas 2 --ipus-per-replica 2 -- "$ipupod" train --model mlp --hidden 16 --arch tiny \
  --micro-batch 8 --gradient-accumulation 2 --data "$work/fmnist.h5" --epochs 1 \
  --run-dir "$work/run22" >"$work/out22.txt" 2>&1
code=$?
set -e
cat "$work/out22.txt"
check "2x2 run exits 0" test "$code" -eq 0
check "2x2 run: 2 replicas x 2 stages" grep -q '2 replica(s) x 2 stage(s)' "$work/out22.txt"
check "2x2 run: replicas' weights identical" \
  grep -q '"replica_weights_identical": true' "$work/run22/summary.json"

# Impossible layouts: exit 2, a message naming the problem, and nothing launched.
expect_error() {  # expect_error PATTERN LAUNCHER-ARGS... -- TRAIN-ARGS...
  local pattern=$1 code=0
  shift
  "$run" "$@" >"$work/err.txt" 2>&1 || code=$?
  if [[ $code -eq 2 ]] && grep -q -- "$pattern" "$work/err.txt" &&
    ! grep -q 'mpirun -n' "$work/err.txt"; then
    echo "ok: rejects $* ($(head -c 120 "$work/err.txt"))"
  else
    echo "FAILED: '$*' should exit 2 with '$pattern', got exit $code:"
    cat "$work/err.txt"
    failures=$((failures + 1))
  fi
}
train=(-- "$ipupod" train --data "$work/fmnist.h5")
expect_error '--replicas must be at least 1, got 0' --replicas 0 "${train[@]}"
expect_error 'expects a positive integer' --replicas two "${train[@]}"
expect_error 'is not a multiple of --ipus-per-replica 4' --ipus 6 --ipus-per-replica 4 "${train[@]}"
expect_error 'need --gradient-accumulation >= 2' --replicas 2 --ipus-per-replica 2 "${train[@]}"
expect_error 'topology m2000 has 4' --replicas 8 "${train[@]}" --topology m2000
expect_error 'the train options say --replicas 3' --replicas 2 "${train[@]}" --replicas 3
expect_error 'hostfile' --replicas 4 --hostfile <(echo "localhost slots=2") "${train[@]}"
# A pretend 3-task allocation: the check happens before srun would run.
SLURM_JOB_ID=1 SLURM_NTASKS=3 expect_error 'Slurm job 1 has 3 tasks' --replicas 4 "${train[@]}"
expect_error '--launcher srun needs a Slurm allocation' --replicas 1 --launcher srun "${train[@]}"
expect_error 'unknown option' --replicas 1 --bogus "${train[@]}"

echo "$failures failed"
((failures == 0))
