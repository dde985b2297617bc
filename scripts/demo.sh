#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, cut the real climate fields of
# Debian's ferret-datasets and libncarg-data (netCDF) into standardised patches with their
# land/missing masks (HDF5), and train the hierarchical vector-quantised autoencoder that
# compresses them on an emulated pod of four MK2 IPUs: 2 replicas x 2 pipeline stages (encoder |
# decoder), Adam applied on the tiles, a host rank streaming the patches over TCP. Reduced size
# so that it finishes in minutes on 2 cores: 32x32 patches, channel width x0.125.
# Each epoch reports the test PSNR over the valid cells and the compression ratio of the codes.
# Then scripts/plot_run.py draws loss.png and each IPU's tile memory map beside the run.
#   IPUPOD_DEMO_EPOCHS=N    epochs to train (default 4)
#   IPUPOD_RUN_DIR=DIR      where summary.json, metrics.csv, memory.json, trace.json and the
#                           plots (loss.png, memory-ipu<N>.png) go (default runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

build=build/release
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIPUPOD_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target ipupod
ipupod="$build/pod/ipupod"

mkdir -p data
if [[ ! -f data/climate32.h5 ]]; then
  "$ipupod" data climate --out data/climate32.h5 --patch 32 --stride 28
fi

run_dir=${IPUPOD_RUN_DIR:-runs/demo}
mpirun_flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpirun_flags+=(--allow-run-as-root); fi
python=python3
[[ -x /usr/bin/python3 ]] && python=/usr/bin/python3  # Debian's, which sees Debian's packages
set -x
mpirun -n 5 "${mpirun_flags[@]}" "$ipupod" train --model hae --width 0.125 \
  --data data/climate32.h5 --replicas 2 --stages 2 --micro-batch 4 --gradient-accumulation 2 \
  --device-iterations 1 --epochs "${IPUPOD_DEMO_EPOCHS:-4}" --optimizer adam \
  --learning-rate 0.001 --arch mk2 --topology m2000 --timeout 600 --run-dir "$run_dir"
"$python" scripts/plot_run.py "$run_dir"
