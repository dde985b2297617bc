#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, convert real Fashion-MNIST
# (Debian's dataset-fashion-mnist) to HDF5, and train an MLP on an emulated pod of two MK2 IPUs
# (data-parallel, 2 replicas) with a host rank streaming the data over TCP.
#   IPUPOD_DEMO_EPOCHS=N    epochs to train (default 3)
#   IPUPOD_RUN_DIR=DIR      where summary.json, metrics.csv and memory.json go (default runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

build=build/release
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIPUPOD_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target ipupod
ipupod="$build/pod/ipupod"

mkdir -p data
if [[ ! -f data/fashion-mnist.h5 ]]; then
  "$ipupod" data fashion-mnist --out data/fashion-mnist.h5
fi

run_dir=${IPUPOD_RUN_DIR:-runs/demo}
mpirun_flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpirun_flags+=(--allow-run-as-root); fi
set -x
mpirun -n 3 "${mpirun_flags[@]}" "$ipupod" train --model mlp --hidden 128 \
  --data data/fashion-mnist.h5 --replicas 2 --micro-batch 16 --gradient-accumulation 1 \
  --device-iterations 1 --epochs "${IPUPOD_DEMO_EPOCHS:-3}" --learning-rate 0.05 --arch mk2 \
  --topology m2000 --run-dir "$run_dir"
