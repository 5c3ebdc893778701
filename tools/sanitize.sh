#!/bin/bash
# Builds one test translation unit at -O1 under a sanitizer and runs it.
#   tools/sanitize.sh asan tests/parallel/test_data_parallel.cpp [test args...]
#   tools/sanitize.sh tsan tests/parallel/test_data_parallel.cpp
#   tools/sanitize.sh archer tests/graph/test_conv.cpp
#   tools/sanitize.sh asan tests/cuda_omp/test_cuda_omp.cpp   (Thrust's OpenMP system)
#   NP=3 tools/sanitize.sh asan tests/comm/mpi/test_mpi_allreduce.cpp
#   GRADUS_SAN_DEBUG=-g1 tools/sanitize.sh asan tests/cuda_omp/test_cuda_omp.cpp
#     (line tables only: with full -g, g++ -O1 with ASan+UBSan on that unit passes 24 GB)
# asan = AddressSanitizer + UndefinedBehaviorSanitizer (leaks included, UB fatal);
# tsan = ThreadSanitizer with tests/sanitizers/tsan.supp (libzmq is not instrumented).
# archer = ThreadSanitizer on OpenMP code: clang++-14 with LLVM's libomp and its Archer tool
#   (OMP_TOOL_LIBRARIES=libarcher.so), which tells TSan about OpenMP's barriers, so the
#   parallel loops run with OMP_NUM_THREADS (default 2) and are checked; races inside
#   uninstrumented libraries (OpenBLAS, oneDNN) are not reported.
# The binary goes to build/sanitize/<name>-<kind>; it runs from build/ci when that exists
# (tests that start example programs find them there). A test under tests/comm/mpi/ is built
# with MPI (mpicxx --showme) and runs under mpirun -np $NP (default 2), with
# tests/sanitizers/lsan_mpi.supp for what Open MPI keeps past MPI_Finalize.
set -euo pipefail
kind=$1 src=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
[[ $src = /* ]] || src=$PWD/$src
out=$root/build/sanitize/$(basename "${src%.cpp}")-$kind
mkdir -p "$root/build/sanitize"
case $kind in
  asan) san="-fsanitize=address,undefined -fno-sanitize-recover=undefined" ;;
  tsan) san="-fsanitize=thread" ;;
  archer) san="-fsanitize=thread" CXX=${CXX:-clang++-14} ;;
  *) echo "sanitize.sh: kind '$kind' is not asan, tsan or archer" >&2; exit 2 ;;
esac
inc=()
for d in "$root"/include "$root"/backends/*/*/include "$root"/tests; do inc+=("-I$d"); done
mpi_cflags=() mpi_libs=() launch=()
if [[ $src == */tests/comm/mpi/* ]]; then
  for f in $(mpicxx --showme:compile); do mpi_cflags+=("${f/#-I/-isystem}"); done
  read -ra mpi_libs <<<"$(mpicxx --showme:link)"
  launch=(mpirun --allow-run-as-root --oversubscribe -np "${NP:-2}")
  # the frame-pointer unwinder stops inside Open MPI's libraries: the suppressions need whole stacks
  export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan_mpi.supp:fast_unwind_on_malloc=0 ${LSAN_OPTIONS:-}"
fi
# tests/cuda_omp: the CUDA backend on Thrust's OpenMP system (CCCL headers, as gradus::cuda_omp)
# Thrust binds references to null system pointers on purpose ("Avoid default-constructing
# systems; instead, just use a null pointer for dispatch", thrust/detail/reference.h, in
# every reduction's temporary array), which UBSan's null check reports: that one check is off
# there (ASan still catches any real null dereference).
thrust=()
[[ $src == */tests/cuda_omp/* ]] && thrust=(-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem /usr/local/cuda/include/cccl)
[[ $src == */tests/cuda_omp/* && $kind == asan ]] && san+=" -fno-sanitize=null"
# oneDNN where it is installed, as CMake's GRADUS_DNNL=AUTO does (cpu_simd/dnnl.hpp)
dnnl=()
[[ -f /usr/include/oneapi/dnnl/dnnl.hpp ]] && dnnl=(-DGRADUS_HAVE_DNNL=1 -ldnnl)
# shellcheck disable=SC2086
${CXX:-g++} -std=gnu++20 -O1 ${GRADUS_SAN_DEBUG:--g} -fno-omit-frame-pointer -march=native -ffp-contract=off -fopenmp $san \
  -DBOOST_TEST_DYN_LINK -DGRADUS_SOURCE_DIR="\"$root\"" "${inc[@]}" "${mpi_cflags[@]}" "${thrust[@]}" -isystem /usr/include/x86_64-linux-gnu/openblas-openmp \
  "$src" -o "$out" "${dnnl[@]}" -lboost_unit_test_framework -lopenblas -lzip -lzmq "${mpi_libs[@]}"
cd "$root/build/ci" 2>/dev/null || cd "$root"
export TSAN_OPTIONS="suppressions=$root/tests/sanitizers/tsan.supp ${TSAN_OPTIONS:-}"
# libgomp is not instrumented either: the barrier ending an OpenMP parallel loop is invisible
# to TSan, so one loop's team races the next in its eyes. One OpenMP thread under TSan: the
# program's own threads are what it checks (the loops themselves share nothing across
# iterations; exec_test_* run them with 2 threads).
[[ $kind == tsan ]] && export OMP_NUM_THREADS=1
if [[ $kind == archer ]]; then
  export OMP_TOOL_LIBRARIES=/usr/lib/llvm-14/lib/libarcher.so OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
  export TSAN_OPTIONS="ignore_noninstrumented_modules=1 $TSAN_OPTIONS"
fi
exec "${launch[@]}" "$out" "$@"
