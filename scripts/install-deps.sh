#!/usr/bin/env bash
# Installs every Debian package ipupod needs to build, test and run its demo.
# Non-interactive and idempotent: packages already present are skipped, apt-get update runs once.
#   --bench   also the benchmarks' peers that the tests never need: Debian's PyTorch
#             (python3-torch, the peer of `ipupod bench step`, for /usr/bin/python3)
# IPUPOD_EXTRA_PACKAGES="a b" adds more Debian packages.
set -euo pipefail

bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    -h | --help)
      sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps: unknown option '$arg' (expected --bench or --help)" >&2
      exit 2
      ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev          # one MPI rank per emulated IPU
  libhdf5-dev hdf5-tools              # training data and checkpoints (HDF5 C API)
  libboost-dev                        # Boost.Asio: host -> IPU streaming over TCP
  libgtest-dev libgmock-dev           # unit and MPI tests
  libcli11-dev                        # command-line parsing (header-only, subcommands, --help)
  nlohmann-json3-dev                  # summary.json, memory.json, trace.json
  zlib1g-dev                          # reading the gzip-compressed IDX files of Fashion-MNIST
  dataset-fashion-mnist               # real images for the first end-to-end run
  libnetcdf-dev                       # netCDF C library: reading the climate fields
  netcdf-bin                          # ncdump/nccopy: checking the climate fields by hand
  ferret-datasets                     # real climate fields: COADS, Levitus, ETOPO (netCDF)
  libncarg-data                       # real climate fields: CMIP5 MPI-ESM-LR tas and more (netCDF)
  libstb-dev                          # stb_image: decoding the JPEG/PNG photographs
  libonnx-dev libprotobuf-dev         # reading ONNX models exported from PyTorch (--model F.onnx)
  plasma-workspace-wallpapers         # real photographs for the super-resolution pairs
  libopenblas-dev                     # OpenBLAS: the peer GEMM of `ipupod bench matmul`
  slurm-wlm munge                     # the Slurm test brings up a single-node Slurm cluster
  slurm-wlm-basic-plugins             # srun --mpi=pmix (mpi_pmix.so) for Open MPI jobs
  iproute2                            # ip netns: network namespaces as nodes (multi-node test)
  help2man                            # the ipupod(1) man page, made from --help at build time
  python3-matplotlib                  # scripts/scaling/plot.py: scaling plots
  python3-pil python3-numpy           # the peer of `ipupod bench input` (Pillow and NumPy)
)
if [[ $bench -eq 1 ]]; then
  packages+=(python3-torch)         # PyTorch: the peer of `ipupod bench step` (not the tests)
  packages+=(python3-torchvision)   # scripts/export_pytorch_model.py --torchvision
fi
if [[ "${IPUPOD_EXTRA_PACKAGES:-}" != "" ]]; then
  read -r -a extra <<<"$IPUPOD_EXTRA_PACKAGES"
  packages+=("${extra[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
