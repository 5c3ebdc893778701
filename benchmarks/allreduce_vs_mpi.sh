#!/usr/bin/env bash
# gradus' ring all-reduce against OpenMPI's MPI_Allreduce, side by side: float buffers of
# 4 KiB ... 64 MiB on N local processes, over
#   gradus tcp://127.0.0.1 and ipc://      (N copies of allreduce_bench, forked here with
#                                           RANK / WORLD_SIZE / GRADUS_RENDEZVOUS)
#   OpenMPI --mca btl self,tcp and self,vader (its shared-memory transport, the default)
#
#   benchmarks/allreduce_vs_mpi.sh [build-dir = build-bench]
#
# Environment: NS (world sizes, default "2 4"), SEGMENT (gradus segment_bytes, default
# 1 MiB), MPIRUN_ARGS (extra mpirun arguments). Prints the load average before each
# table: the machine is shared, and a loaded run should be rerun.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build-bench}
ns=${NS:-2 4}
segment=${SEGMENT:-1048576}

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
  if [[ $transport == tcp ]]; then rdv=tcp://127.0.0.1:$(free_port); else rdv=ipc://$tmp/rdv-$n; fi
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

for n in $ns; do
  load; run_ring "$n" tcp; echo
  load; run_mpi "$n" self,tcp; echo
  load; run_ring "$n" ipc; echo
  load; run_mpi "$n" self,vader; echo
done
