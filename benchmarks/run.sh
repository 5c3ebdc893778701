#!/usr/bin/env bash
# Builds the benchmarks (Release, -O3 -march=native, OpenMP) in their own build directory
# and runs them all in one go with 2 OpenMP threads and 2 OpenBLAS threads, printing the
# tables that benchmarks/README.md records.
#
#   benchmarks/run.sh [build-dir = build-bench]
#
# Environment: ROUNDS (elementwise rounds, default 21), GEMM_ROUNDS (default 21),
# MLP_ROUNDS (default 15), MLP_STEPS (steps per MLP sample, default 200), THREADS
# (default 2), IDLE_WAIT (seconds to wait for idle cores first, default 120; 0 skips).
# The machine these numbers come from is shared: the script reports how idle the cores
# were just before each program, so a loaded run can be recognised and rerun.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build-bench}
threads=${THREADS:-2}

# Build quietly; show the build's output only if it fails.
quiet() {
  local log
  if ! log=$("$@" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
}
quiet cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADUS_BUILD_BENCHMARKS=ON \
  -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=OFF
quiet cmake --build "$build" --target bench_elementwise bench_gemm bench_mlp -j "$threads"

# Percentage of CPU time idle over one second, all cores.
idle_pct() {
  local a b
  read -r -a a </proc/stat
  sleep 1
  read -r -a b </proc/stat
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  echo $((100 * (b[4] + b[5] - a[4] - a[5]) / (total > 0 ? total : 1)))
}
# Waits (at most IDLE_WAIT seconds) for the cores to be at least 90% idle.
wait_idle() {
  local end=$((SECONDS + ${IDLE_WAIT:-120})) p
  p=$(idle_pct)
  while ((p < 90 && SECONDS < end)); do p=$(idle_pct); done
  echo "(cores ${p}% idle just before this run)"
}

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_PROC_BIND=${OMP_PROC_BIND:-close}
echo "# gradus benchmarks — $(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
  "$("$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")" --version | head -1); OMP_NUM_THREADS=$OMP_NUM_THREADS OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS"
echo
echo "## Elementwise, 2^25 floats"
wait_idle
"$build/benchmarks/bench_elementwise" 25 "${ROUNDS:-21}"
echo
echo "## sgemm"
wait_idle
"$build/benchmarks/bench_gemm" "${GEMM_ROUNDS:-21}" 256 512 1024 2048
echo
echo "## MLP training step"
wait_idle
"$build/benchmarks/bench_mlp" "${MLP_ROUNDS:-15}" "${MLP_STEPS:-200}"
