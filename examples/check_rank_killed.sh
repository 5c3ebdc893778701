#!/usr/bin/env bash
# A rank killed mid-training: the other rank must stop with an error naming the dead peer
# (its rank) within LIMIT seconds — not hang until the 30 s collective timeout.
#   check_rank_killed.sh <example> <mnist dir> [LIMIT = 10] [extra options of both ranks...]
#   (e.g. --stages 2 --micro-batches 4: a pipeline's stage 1 killed; stage 0 must name it)
# SIGNAL=STOP stops rank 1 instead (a hung process: alive, silent), with the ranks'
# --comm-timeout COMM_TIMEOUT (default 30; its heartbeats are missed after COMM_TIMEOUT - 2 s,
# at least 3 s): rank 0 must name rank 1 as silent within LIMIT.
# Starts two ranks itself (torchrun's variables on 127.0.0.1, a free port), waits until
# rank 0 reports training progress, SIGKILLs rank 1, and times rank 0's exit. Every wait is
# bounded; both processes are ended by PID on the way out.
set -u
exe=$1 data=$2 limit=${3:-10}
extra=("${@:4}")
sig=${SIGNAL:-KILL} comm_timeout=${COMM_TIMEOUT:-30}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    rm -f /tmp/gradus-ring-"$p"-*  # the ipc socket a killed rank could not remove
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "check_rank_killed: $*" >&2; echo "--- rank 0 stderr:" >&2; cat "$work/r0.err" >&2; exit 1; }

port=$(python3 "$(dirname "${BASH_SOURCE[0]}")/../tests/support/free_port.py")  # below the ephemeral range
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
    "$exe" --data "$data" --epochs 20 --threads 1 --comm ring --comm-timeout "$comm_timeout" --log-every 10 "${extra[@]}" \
    >"$work/r$r.out" 2>"$work/r$r.err" </dev/null &
  pids+=($!)
done

# until rank 0 trains (at most 30 s)
for _ in $(seq 300); do
  grep -q "step" "$work/r0.err" 2>/dev/null && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "rank 0 exited before training"
  sleep 0.1
done
grep -q "step" "$work/r0.err" || fail "rank 0 did not start training within 30 s"

kill -"$sig" "${pids[1]}"
start=$(date +%s%3N)
for _ in $(seq $((limit * 20))); do
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.05
done
kill -0 "${pids[0]}" 2>/dev/null && fail "rank 0 still runs ${limit} s after rank 1 got SIG$sig"
wait "${pids[0]}"
rc=$?
elapsed=$(( $(date +%s%3N) - start ))
[[ $rc -ne 0 ]] || fail "rank 0 exited 0 after its peer died"
grep -Eq "rank 1" "$work/r0.err" || fail "rank 0's error does not name rank 1"
[[ $sig != STOP ]] || grep -q "silent" "$work/r0.err" || fail "rank 0's error does not call the stopped rank 1 silent"
echo "check_rank_killed: rank 0 exited $rc ${elapsed} ms after rank 1 got SIG$sig:"
grep -E "rank 1" "$work/r0.err" | tail -2
