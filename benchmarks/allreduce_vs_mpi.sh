#!/usr/bin/env bash
# gradus' ring all-reduce against OpenMPI's MPI_Allreduce, side by side: float buffers of
# 4 KiB ... 64 MiB on N local processes, over each data path and its OpenMPI peer:
#   gradus shm (shared memory)         against OpenMPI --mca btl self,vader (its shared memory)
#   gradus tcp (direct sockets)        against OpenMPI --mca btl self,tcp
#   gradus zmq-tcp (ZeroMQ, the old path), for reference
# (N copies of allreduce_bench, forked here with RANK / WORLD_SIZE / GRADUS_RENDEZVOUS /
# GRADUS_TRANSPORT), then a summary per pair: latency (median us) and busbw, and the
# ratios gradus / OpenMPI (busbw: higher is better; latency: lower is better).
#
#   benchmarks/allreduce_vs_mpi.sh [build-dir = build-bench]
#
# Environment: NS (world sizes, default "2 4"), SEGMENT (gradus segment_bytes, default
# 1 MiB), SMALL (gradus small_bytes: the all-gather path's limit, default the library's;
# 0: always the ring), PATHS (default "shm tcp zmq-tcp"), MPIRUN_ARGS (extra mpirun arguments). Prints
# the load average before each table: the machine is shared, and a loaded run should be
# rerun. Unset OPENBLAS_CORETYPE and close other work first.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build-bench}
ns=${NS:-2 4}
segment=${SEGMENT:-1048576}
if [[ -n ${SMALL:-} ]]; then export GRADUS_SMALL_BYTES=$SMALL; fi

quiet() {
  local log
  if ! log=$("$@" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
}
quiet cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADUS_BUILD_BENCHMARKS=ON \
  -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=OFF
quiet cmake --build "$build" --target allreduce_bench mpi_allreduce_bench -j 2
ring=$build/benchmarks/allreduce_bench
mpi=$build/benchmarks/mpi_allreduce_bench

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradus-allreduce-bench.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

load() { echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"; }

# run_ring N transport: N processes of allreduce_bench; rank 0's table on stdout.
run_ring() {
  local n=$1 transport=$2 rdv
  if [[ $transport == zmq-ipc ]]; then rdv=ipc://$tmp/rdv-$n; else rdv=tcp://127.0.0.1:$(free_port); fi
  pids=()
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n GRADUS_RENDEZVOUS=$rdv GRADUS_TRANSPORT=$transport GRADUS_SEGMENT_BYTES=$segment \
      "$ring" >"$tmp/out-$r" 2>"$tmp/err-$r" &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  pids=()
  cat "$tmp/out-0"
  if ((failed)); then
    cat "$tmp"/err-* >&2
    echo "allreduce_vs_mpi: a gradus rank failed" >&2
    exit 1
  fi
}

run_mpi() {
  local n=$1 btl=$2
  # shellcheck disable=SC2086
  mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl "$btl" ${MPIRUN_ARGS:-} "$mpi" "btl $btl"
}

paths=${PATHS:-shm tcp zmq-tcp}
peer_of() { case $1 in shm) echo self,vader ;; tcp) echo self,tcp ;; *) echo "" ;; esac; }

# summary N path: gradus' table against its OpenMPI peer's, row by row (same sizes).
summary() {
  local n=$1 path=$2 btl
  btl=$(peer_of "$path")
  [[ -n $btl ]] || return 0
  echo "# N=$n: gradus $path vs OpenMPI btl $btl (ratio: gradus / OpenMPI)"
  printf '%12s %12s %12s %10s %12s %12s %10s\n' bytes gradus_us mpi_us lat_ratio gradus_busbw mpi_busbw bw_ratio
  join <(grep -v '^#' "$tmp/ring-$n-$path" | awk 'NR>1 {print $1, $4, $6}' | sort -k1,1) \
       <(grep -v '^#' "$tmp/mpi-$n-$btl" | awk 'NR>1 {print $1, $4, $6}' | sort -k1,1) |
    sort -n | awk '{ printf "%12d %12.1f %12.1f %10.2f %12.3f %12.3f %10.2f\n", $1, $2, $4, $2 / $4, $3, $5, ($5 > 0 ? $3 / $5 : 0) }'
  echo
}

for n in $ns; do
  for path in $paths; do
    load; run_ring "$n" "$path" | tee "$tmp/ring-$n-$path"; echo
    btl=$(peer_of "$path")
    if [[ -n $btl ]]; then load; run_mpi "$n" "$btl" | tee "$tmp/mpi-$n-$btl"; echo; fi
  done
done
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for n in $ns; do
  for path in $paths; do summary "$n" "$path"; done
done
