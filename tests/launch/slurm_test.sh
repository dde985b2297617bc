#!/usr/bin/env bash
# The Slurm batch scripts on a real single-node Slurm: this test starts its own munged,
# slurmctld and slurmd (configuration, key, sockets, state and logs in a temporary directory,
# daemons on 127.0.0.1 at free ports), submits scripts/slurm/ipupod-train.sbatch and the job
# array of scripts/slurm/ipupod-sweep.sbatch with a tiny configuration, waits for them, checks
# their states and run directories, collects the sweep's CSV, and stops what it started.
# Exits 77 (ctest: skipped) only when Slurm cannot be installed or started here.
#   slurm_test.sh SOURCE_DIR IPUPOD_BINARY
set -euo pipefail
source_dir=$1 ipupod=$2
skip() { echo "SKIPPED: $*"; exit 77; }
deadline_s=${IPUPOD_SLURM_TEST_TIMEOUT:-150}

if [[ $(id -u) -ne 0 ]]; then
  skip "starting slurmd and munged needs root (slurmd runs jobs as their users)"
fi
tools=(munged mungekey slurmctld slurmd sbatch squeue scontrol scancel sinfo srun)
missing() { local t; for t in "${tools[@]}"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done; }
if [[ -n "$(missing)" ]]; then
  echo "Slurm tools missing ($(missing | tr '\n' ' ')); installing with scripts/install-deps.sh"
  "$source_dir/scripts/install-deps.sh" || skip "cannot install slurm-wlm and munge"
  [[ -z "$(missing)" ]] || skip "still missing after install: $(missing | tr '\n' ' ')"
fi

work=$(mktemp -d)
chmod 755 "$work"  # munged (as user munge) must reach its socket directory
export SLURM_CONF=$work/slurm/slurm.conf
unset SLURM_JOB_ID SLURM_JOBID  # submit to this test's cluster, not to one around ctest
daemon_pids=()  # the daemons this test started, run in the foreground as its own children
cleanup() {
  set +e
  if ((${#daemon_pids[@]} > 1)); then scancel --quiet --user=root >/dev/null 2>&1; sleep 1; fi
  # slurmd and slurmctld first, then munged (by its pid: it runs under runuser, which then ends)
  local i
  for ((i = ${#daemon_pids[@]} - 1; i >= 1; i--)); do
    kill "${daemon_pids[i]}" 2>/dev/null
    wait "${daemon_pids[i]}" 2>/dev/null
  done
  [[ -f "$work/munge/munged.pid" ]] && kill "$(cat "$work/munge/munged.pid" 2>/dev/null)" 2>/dev/null
  ((${#daemon_pids[@]})) && wait "${daemon_pids[0]}" 2>/dev/null
  if [[ -n "${IPUPOD_KEEP_TEST_DIR:-}" ]]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
show_logs() {
  local f
  for f in "$work"/slurm/log/*.log "$work"/munge/munged.log; do
    [[ -f "$f" ]] && { echo "--- $f (last lines)"; tail -n 15 "$f"; }
  done
}

# munge: a key of its own, the daemon as the munge user (it refuses root), its own socket.
mkdir -p "$work/munge"
mungekey --create --keyfile="$work/munge/munge.key" >/dev/null
chown -R munge:munge "$work/munge"
chmod 400 "$work/munge/munge.key"
runuser -u munge -- munged --foreground --socket="$work/munge/munge.socket" \
  --key-file="$work/munge/munge.key" --pid-file="$work/munge/munged.pid" \
  --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" &
daemon_pids+=($!)
for _ in $(seq 50); do
  [[ -S "$work/munge/munge.socket" ]] && break
  sleep 0.1
done
if ! munge -n -S "$work/munge/munge.socket" | unmunge -S "$work/munge/munge.socket" >/dev/null; then
  show_logs
  skip "munged does not start here"
fi

free_port() {  # a TCP port nothing on 127.0.0.1 listens on, other than $1
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 30000))
    [[ "$port" == "${1:-}" ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
  done
  echo "no free port found" >&2
  return 1
}
ctld_port=$(free_port)
slurmd_port=$(free_port "$ctld_port")
node=$(hostname -s)
node_line=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=... RealMemory=... as slurmd sees it
mkdir -p "$work/slurm/state" "$work/slurm/spool" "$work/slurm/log" "$work/jobs"
cat >"$SLURM_CONF" <<CONF
ClusterName=ipupodtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.socket
StateSaveLocation=$work/slurm/state
SlurmdSpoolDir=$work/slurm/spool
SlurmctldPidFile=$work/slurm/slurmctld.pid
SlurmdPidFile=$work/slurm/slurmd.pid
SlurmctldLogFile=$work/slurm/log/slurmctld.log
SlurmdLogFile=$work/slurm/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=600
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -D -f "$SLURM_CONF" &
daemon_pids+=($!)
slurmd -D -f "$SLURM_CONF" &
daemon_pids+=($!)
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
  [[ "$state" == idle ]] && break
  sleep 0.5
done
if [[ "$state" != idle ]]; then
  show_logs
  skip "slurmctld and slurmd did not bring the node up (state '$state')"
fi
echo "Slurm up: munged, slurmctld, slurmd; node $node idle; slurmctld :$ctld_port, slurmd :$slurmd_port"

# From here on a problem is a failure, not a skip.
"$ipupod" data fashion-mnist --out "$work/jobs/fmnist.h5" --limit-train 256 --limit-test 64 >/dev/null
export IPUPOD_ROOT=$source_dir IPUPOD_BINARY=$ipupod IPUPOD_DATA=$work/jobs/fmnist.h5
export IPUPOD_ARCH=tiny IPUPOD_MICRO_BATCH=8 IPUPOD_TRAIN_ARGS="--hidden 16" IPUPOD_EPOCHS=1
cd "$work/jobs"
train_job=$(IPUPOD_REPLICAS=2 IPUPOD_RUN_DIR=train-run sbatch --parsable --ntasks=3 \
  "$source_dir/scripts/slurm/ipupod-train.sbatch")
sweep_job=$(IPUPOD_SWEEP_REPLICAS="1 2" IPUPOD_SWEEP_DIR=sweep sbatch --parsable --array=0-1 \
  --ntasks=3 "$source_dir/scripts/slurm/ipupod-sweep.sbatch")
echo "submitted train job $train_job and sweep array $sweep_job"

waited=0
while [[ -n "$(squeue -h -j "$train_job,$sweep_job" 2>/dev/null)" ]]; do
  if ((waited >= deadline_s)); then
    squeue
    show_logs
    echo "FAILED: jobs still queued or running after ${deadline_s}s"
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done
echo "jobs finished after ~${waited}s"

failures=0
check() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
job_states() { scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | sort | uniq -c | xargs; }
for f in ipupod-train-*.out ipupod-sweep-*.out; do echo "--- $f"; cat "$f"; done
check "train job $train_job COMPLETED" test "$(job_states "$train_job")" == "1 COMPLETED"
check "sweep array $sweep_job: 2 tasks COMPLETED" test "$(job_states "$sweep_job")" == "2 COMPLETED"
check "train job launched through srun --mpi=pmix" grep -q 'srun --mpi=pmix -n 3' ipupod-train-"$train_job".out
check_summary() {  # check_summary RUN_DIR REPLICAS
  /usr/bin/env python3 - "$1/summary.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
replicas = int(sys.argv[2])
problems = []
if s["config"]["replicas"] != replicas: problems.append(f"replicas {s['config']['replicas']}")
if s["config"]["arch"] != "tiny": problems.append(f"arch {s['config']['arch']}")
if s["samples_trained"] != 256: problems.append(f"samples_trained {s['samples_trained']}")
if not s["measured_samples_per_s"] > 0: problems.append("measured_samples_per_s not > 0")
if not s["predicted_ipu_samples_per_s"] > 0: problems.append("predicted not > 0")
if not s["replica_weights_identical"]: problems.append("replicas' weights differ")
if not 0 <= s["test_accuracy"] <= 1: problems.append(f"test_accuracy {s['test_accuracy']}")
if len(s["replica_weight_checksums"]) != replicas: problems.append("checksum count")
print("; ".join(problems) if problems else f"{sys.argv[1]}: sensible")
sys.exit(1 if problems else 0)
PY
}
check "train run's summary.json sensible" check_summary train-run 2
check "sweep r1 summary.json sensible" check_summary sweep/r1-s1 1
check "sweep r2 summary.json sensible" check_summary sweep/r2-s1 2
if "$source_dir/scripts/scaling/sweep.sh" --collect sweep/r1-s1 sweep/r2-s1 --csv sweep.csv; then
  cat sweep.csv
  check "sweep CSV has a header and 2 rows" test "$(wc -l <sweep.csv)" -eq 3
  check "sweep CSV rows are 1 and 2 IPUs" test "$(cut -d, -f8 sweep.csv | tail -n +2 | xargs)" == "1 2"
else
  check "sweep.sh --collect succeeds" false
fi
# What Slurm sends before a time limit (#SBATCH --signal=USR1@120), sent now with scancel: the
# ranks of the srun step stop at a step boundary with a final checkpoint and say where.
signal_job=$(IPUPOD_REPLICAS=2 IPUPOD_RUN_DIR=signal-run IPUPOD_EPOCHS=100000 \
  IPUPOD_TRAIN_ARGS="--hidden 16 --checkpoint-every 50" sbatch --parsable --ntasks=3 \
  "$source_dir/scripts/slurm/ipupod-train.sbatch")
waited=0
until compgen -G "signal-run/checkpoint-*.h5" >/dev/null; do
  if ((waited >= deadline_s * 5)) || [[ -z "$(squeue -h -j "$signal_job" 2>/dev/null)" ]]; then
    break
  fi
  sleep 0.2
  waited=$((waited + 1))
done
scancel --signal=USR1 "$signal_job"
waited=0
while [[ -n "$(squeue -h -j "$signal_job" 2>/dev/null)" ]] && ((waited < deadline_s)); do
  sleep 1
  waited=$((waited + 1))
done
echo "--- ipupod-train-$signal_job.out (signalled)"
tail -n 5 "ipupod-train-$signal_job.out"
check "signalled job ended" test -z "$(squeue -h -j "$signal_job" 2>/dev/null)"
check "signalled job stopped by SIGUSR1 with its checkpoint named" \
  grep -q "stopped by SIGUSR1 after host step .*its checkpoint is signal-run/checkpoint-" \
  signal-run/stopped.txt
check "signalled job did not train to the end" test ! -f signal-run/summary.json
if [[ -f signal-run/stopped.txt ]]; then
  last=$(sed -n 's/.*its checkpoint is \([^ ]*\.h5\)\..*/\1/p' signal-run/stopped.txt)
  check "its final checkpoint $last exists" test -f "$last"
fi
((failures == 0)) || show_logs
echo "$failures failed"
((failures == 0))
