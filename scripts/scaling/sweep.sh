#!/usr/bin/env bash
# A scaling sweep of `ipupod train`: every combination of replicas x stages x gradient
# accumulation x device iterations for one model and data set, each run REPEATS times through
# scripts/ipupod-run (mpirun, or srun inside a Slurm allocation), one after another so runs do
# not share the CPUs; then one CSV row per configuration (scripts/scaling/collect.py): measured
# emulator samples/s (median of the repeats), predicted IPU samples/s, memory peak per IPU and
# the predicted time per host step split into compute, exchange, sync, fabric and host.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
prog=sweep.sh
usage() {
  cat <<'USAGE'
Usage: sweep.sh --data FILE.h5 [OPTIONS]
       sweep.sh --collect RUN_DIR... --csv FILE.csv

  --data FILE.h5                 training data (ipupod data ...)
  --model NAME                   model of the zoo (default mlp)
  --replicas "1 2 4 8"           replica counts (default "1 2 4 8")
  --stages "1"                   IPUs per replica / pipeline stages (default "1")
  --gradient-accumulation "1"    gradient accumulation factors (default "1")
  --device-iterations "1"        device iterations (default "1")
  --arch NAME                    IPU architecture (default mk2)
  --topology NAME                pod topology (default: ipupod's)
  --micro-batch N                micro-batch per replica (default 16)
  --epochs N                     epochs per run (default 1)
  --repeats N                    runs per configuration, the CSV has their median (default 3)
  --train-args "ARGS"            further train options, e.g. "--hidden 256"
  --mpi-args "ARGS"              passed to ipupod-run --mpi-args
  --binary PATH                  the ipupod binary (default: ipupod on PATH, else $IPUPOD_BINARY)
  --out-dir DIR                  run directories go to DIR/<configuration>/rep<k> (default runs/sweep)
  --csv FILE                     the CSV (default OUT_DIR/sweep.csv)
  --keep-going                   a failed configuration is reported and skipped (default: stop)
  --collect RUN_DIR...           only make the CSV from finished run directories (e.g. of
                                 scripts/slurm/ipupod-sweep.sbatch); needs --csv

Plot the CSV with: /usr/bin/python3 scripts/scaling/plot.py FILE.csv --out-dir DIR
USAGE
}
fail() { echo "$prog: error: $*" >&2; exit 2; }
python=python3
[[ -x /usr/bin/python3 ]] && python=/usr/bin/python3  # Debian's, which sees Debian's packages

data="" model=mlp replicas_list="1 2 4 8" stages_list=1 ga_list=1 di_list=1 arch=mk2
topology="" micro_batch=16 epochs=1 repeats=3 train_args="" mpi_args="" binary=""
out_dir=runs/sweep csv="" keep_going=0 collect=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --data | --model | --replicas | --stages | --gradient-accumulation | --device-iterations | \
      --arch | --topology | --micro-batch | --epochs | --repeats | --train-args | --mpi-args | \
      --binary | --out-dir | --csv)
      (($# >= 2)) || fail "$1 needs a value"
      case "$1" in
        --data) data=$2 ;; --model) model=$2 ;; --replicas) replicas_list=$2 ;;
        --stages) stages_list=$2 ;; --gradient-accumulation) ga_list=$2 ;;
        --device-iterations) di_list=$2 ;; --arch) arch=$2 ;; --topology) topology=$2 ;;
        --micro-batch) micro_batch=$2 ;; --epochs) epochs=$2 ;; --repeats) repeats=$2 ;;
        --train-args) train_args=$2 ;; --mpi-args) mpi_args=$2 ;; --binary) binary=$2 ;;
        --out-dir) out_dir=$2 ;; --csv) csv=$2 ;;
      esac
      shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --collect) shift; while (($#)) && [[ "$1" != --* ]]; do collect+=("$1"); shift; done ;;
    *) fail "unknown argument '$1' (see $prog --help)" ;;
  esac
done

if ((${#collect[@]})); then
  [[ -n "$csv" ]] || fail "--collect needs --csv FILE"
  exec "$python" "$here/collect.py" "${collect[@]}" --csv "$csv"
fi
[[ -n "$data" ]] || fail "--data FILE.h5 is required (make one with: ipupod data fashion-mnist --out FILE.h5)"
[[ -f "$data" ]] || fail "--data $data: no such file"
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || fail "--repeats expects a positive integer, got '$repeats'"
for list in "$replicas_list" "$stages_list" "$ga_list" "$di_list"; do
  [[ "$list" =~ ^[[:space:]]*[1-9][0-9]*([[:space:]]+[1-9][0-9]*)*[[:space:]]*$ ]] ||
    fail "a sweep list expects positive integers separated by spaces, got '$list'"
done
if [[ -z "$binary" ]]; then
  binary=$(command -v ipupod || true)
  binary=${binary:-${IPUPOD_BINARY:-}}
  [[ -n "$binary" ]] || fail "no ipupod binary: put it on PATH, set IPUPOD_BINARY or give --binary"
fi
csv=${csv:-$out_dir/sweep.csv}
read -r -a extra <<<"$train_args"

run_dirs=() failed=()
for stages in $stages_list; do
  for ga in $ga_list; do
    for di in $di_list; do
      for replicas in $replicas_list; do
        name="$model-r$replicas-s$stages-ga$ga-di$di"
        for ((k = 1; k <= repeats; k++)); do
          dir="$out_dir/$name/rep$k"
          echo "$prog: $name, run $k of $repeats -> $dir"
          launch=("$here/../ipupod-run" --replicas "$replicas" --ipus-per-replica "$stages")
          [[ -n "$mpi_args" ]] && launch+=(--mpi-args "$mpi_args")
          train=("$binary" train --model "$model" --data "$data" --arch "$arch"
            --micro-batch "$micro_batch" --gradient-accumulation "$ga"
            --device-iterations "$di" --epochs "$epochs" --run-dir "$dir" "${extra[@]}")
          [[ -n "$topology" ]] && train+=(--topology "$topology")
          mkdir -p "$out_dir/$name"
          if "${launch[@]}" -- "${train[@]}" >"$dir.log" 2>&1; then
            run_dirs+=("$dir")
          else
            echo "$prog: $name failed; its output is in $dir.log:" >&2
            tail -n 5 "$dir.log" >&2
            failed+=("$name")
            ((keep_going)) || fail "stopping (use --keep-going to skip failed configurations)"
            break
          fi
        done
      done
    done
  done
done
((${#run_dirs[@]})) || fail "no configuration finished; see the logs under $out_dir"
"$python" "$here/collect.py" "${run_dirs[@]}" --csv "$csv"
if ((${#failed[@]})); then
  echo "$prog: ${#failed[@]} configuration(s) failed: ${failed[*]}" >&2
  exit 1
fi
