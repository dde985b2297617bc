#!/usr/bin/env bash
# Multi-node for real on one machine: two network namespaces are the nodes ("nodea", "nodeb"),
# joined by a veth pair with their own addresses, each with its own loopback and hostname. Open
# MPI launches across them through its rsh agent (a script that enters the named node's
# namespace where a cluster would use ssh), and a 2-replica training job runs with its host
# rank on nodea and both IPU ranks on nodeb: once with mpirun directly, once through
# scripts/ipupod-run --hostfile. A host pinned to loopback cannot be reached from the other
# node: that job ends with one message. Every packet stays inside the test's namespaces.
# Needs root (to create namespaces); exits 77 (skipped) and says why when it cannot.
#   multinode_test.sh SOURCE_DIR IPUPOD_BINARY
set -euo pipefail
source_dir=$1 ipupod=$2
run=$source_dir/scripts/ipupod-run
unset SLURM_JOB_ID

skip() {
  echo "SKIPPED: $*"
  exit 77
}
[[ $(id -u) -eq 0 ]] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "no 'ip' command (Debian package iproute2)"
command -v unshare >/dev/null || skip "no 'unshare' command (Debian package util-linux)"

# Names unique to this run: namespaces, and veth ends (at most 15 characters).
tag=$$
ns_a=ipupod-mn-$tag-a ns_b=ipupod-mn-$tag-b
veth_a=ipmn${tag}a veth_b=ipmn${tag}b
addr_a=10.77.0.1 addr_b=10.77.0.2
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true  # deleting a namespace deletes its veth end
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns_a" 2>"$work/netns.err" || skip "cannot create a network namespace here: $(cat "$work/netns.err")"
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# The rsh agent: `agent NODE COMMAND...` runs COMMAND in NODE's namespace with NODE's hostname,
# as `ssh NODE COMMAND...` would on a cluster.
cat >"$work/agent" <<EOF
#!/bin/sh
node=\$1
shift
case "\$node" in
  nodea | $addr_a) ns=$ns_a name=nodea ;;
  nodeb | $addr_b) ns=$ns_b name=nodeb ;;
  *) echo "agent: unknown node '\$node'" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$1"; shift; exec sh -c "\$*"' sh "\$name" "\$@"
EOF
chmod +x "$work/agent"
# Node names resolve inside both namespaces (ip netns exec reads /etc/netns/NS/hosts).
for ns in "$ns_a" "$ns_b"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s nodea\n%s nodeb\n' "$addr_a" "$addr_b" >"/etc/netns/$ns/hosts"
done
cleanup_hosts() { rm -rf "/etc/netns/$ns_a" "/etc/netns/$ns_b"; }
trap 'cleanup_hosts; cleanup' EXIT
printf 'nodea slots=1\nnodeb slots=2\n' >"$work/hostfile"
# Open MPI between the nodes: launch through the agent, control and data over the veth only.
mca=(--mca plm_rsh_agent "$work/agent" --mca oob_tcp_if_include 10.77.0.0/24
  --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24)
on_nodea() { "$work/agent" nodea "$(printf '%q ' "$@")"; }

failures=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

check "nodea has its own hostname" test "$(on_nodea hostname)" = nodea
check "nodeb has its own hostname" test "$("$work/agent" nodeb hostname)" = nodeb

"$ipupod" data fashion-mnist --out "$work/fmnist.h5" --limit-train 256 --limit-test 64 >/dev/null
train=("$ipupod" train --model mlp --hidden 16 --arch tiny --micro-batch 8 --data "$work/fmnist.h5"
  --epochs 1)

# Ranks on their nodes: rank 0 (host) fills nodea's one slot, ranks 1-2 (the IPUs) go to nodeb.
placed_as_expected() {  # placed_as_expected SUMMARY: host on nodea, both IPU ranks on nodeb
  python3 - "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
nodes = [r["node"] for r in s["ipu_ranks_host_memory"]]
print("host on", s["host_node"], "- IPUs on", nodes)
sys.exit(0 if s["host_node"] == "nodea" and nodes == ["nodeb", "nodeb"] else 1)
EOF
}
job_ok() {  # job_ok NAME EXIT_CODE OUTPUT RUN_DIR
  local name=$1 code=$2 out=$3 dir=$4
  cat "$out"
  check "$name: exits 0" test "$code" -eq 0
  check "$name: summary.json written" test -f "$dir/summary.json"
  if [[ -f "$dir/summary.json" ]]; then
    check "$name: host rank on nodea, IPU ranks on nodeb" placed_as_expected "$dir/summary.json"
    check "$name: replicas' weights identical" \
      grep -q '"replica_weights_identical": true' "$dir/summary.json"
    check "$name: all 256 samples trained" grep -q '"samples_trained": 256,' "$dir/summary.json"
  fi
}

# 1. mpirun started on nodea, with a hostfile, as on a cluster's login or first node.
code=0
on_nodea mpirun --allow-run-as-root -n 3 --hostfile "$work/hostfile" "${mca[@]}" \
  "${train[@]}" --replicas 2 --timeout 20 --run-dir "$work/run-mpirun" >"$work/mpirun.txt" 2>&1 || code=$?
job_ok "mpirun across nodes" "$code" "$work/mpirun.txt" "$work/run-mpirun"

# 2. The same job through the launcher, one command.
code=0
on_nodea "$run" --replicas 2 --hostfile "$work/hostfile" --mpi-args "${mca[*]}" -- \
  "${train[@]}" --timeout 20 --run-dir "$work/run-launcher" >"$work/launcher.txt" 2>&1 || code=$?
job_ok "ipupod-run --hostfile across nodes" "$code" "$work/launcher.txt" "$work/run-launcher"
check "launcher: layout printed" grep -q '= 3 ranks' "$work/launcher.txt"

# 3. Two host instances, PopRun-style, one per node: each node's host feeds the replica on its
# own node, and the job ends with the weights of the one-host job, bit for bit.
printf 'nodea slots=2\nnodeb slots=2\n' >"$work/hostfile-two"
code=0
on_nodea "$run" --replicas 2 --num-instances 2 --hostfile "$work/hostfile-two" \
  --mpi-args "${mca[*]}" -- "${train[@]}" --timeout 20 --run-dir "$work/run-instances" \
  >"$work/instances.txt" 2>&1 || code=$?
cat "$work/instances.txt"
check "two host instances: exits 0" test "$code" -eq 0
instances_placed() {  # host instance i and replica i's IPU both on node i
  python3 - "$1" "$2" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
one_host = json.load(open(sys.argv[2]))
hosts = [i["node"] for i in s["host_instances"]]
ipus = [r["node"] for r in s["ipu_ranks_host_memory"]]
print("host instances on", hosts, "- IPUs on", ipus)
print("weights", s["replica_weight_checksums"], "one host:", one_host["replica_weight_checksums"])
sys.exit(0 if hosts == ["nodea", "nodeb"] and ipus == ["nodea", "nodeb"] and
         s["replica_weight_checksums"] == one_host["replica_weight_checksums"] else 1)
EOF
}
check "two host instances: one per node with its replica, weights bitwise as one host's" \
  instances_placed "$work/run-instances/summary.json" "$work/run-mpirun/summary.json"
check "two host instances: launcher printed the blocks" \
  grep -q 'rank 2: host instance 1' "$work/instances.txt"

# 4. A host that listens on loopback only cannot be reached from nodeb: the job ends, within its
# timeout and mpirun's teardown, with one message naming what to change.
code=0
start=$(date +%s)
timeout 120 "$work/agent" nodea "$(printf '%q ' mpirun --allow-run-as-root -n 3 --hostfile \
  "$work/hostfile" "${mca[@]}" "${train[@]}" --replicas 2 --timeout 5 --bind-address 127.0.0.1 \
  --run-dir "$work/run-loopback")" >"$work/loopback.txt" 2>&1 || code=$?
elapsed=$(($(date +%s) - start))
cat "$work/loopback.txt"
check "loopback-only host: job fails (exit $code)" test "$code" -ne 0 -a "$code" -ne 124
check "loopback-only host: ended in ${elapsed} s (< 60)" test "$elapsed" -lt 60
check "loopback-only host: the message names --bind-address" \
  grep -q -- '--bind-address' "$work/loopback.txt"
check "loopback-only host: one message, not one per rank" \
  test "$(grep -c 'cannot connect to the host' "$work/loopback.txt")" -le 1

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all multi-node checks passed"
