#!/usr/bin/env bash
# Multi-host data parallelism without other hosts: NP network namespaces (one per rank,
# each with its own address 10.77.<net>.<rank+1>/24) joined by veth pairs to a bridge in
# one more namespace — all created here, as root, and removed on exit. The ranks of an
# example run in them over tcp:// (--comm-transport tcp: the namespaces share the host
# name, so auto would pick ipc://). Checks rank 0's JSON (world, accuracy), that every rank
# printed the same replica checksum, and, in a second run, the same over links shaped by a
# token-bucket filter (tc tbf, a slow link: this kernel has no netem for a fixed delay).
#   check_netns.sh <example> <mnist dir> [NP = 3]
# Exits 77 (CTest: skipped) when not root or when network namespaces cannot be made.
set -u
exe=$1 data=$2 np=${3:-3}
[[ $(id -u) -eq 0 ]] || { echo "check_netns: needs root (ip netns)"; exit 77; }
command -v ip >/dev/null || { echo "check_netns: no ip(8) (Debian: iproute2)"; exit 77; }
tag="g$$"
net=$(( $$ % 200 + 20 ))
work=$(mktemp -d)
pids=()
source "$(dirname "$0")/netns_lib.sh"
cleanup() {
  ns_remove
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "check_netns: $*" >&2; for f in "$work"/*.err; do [[ -f $f ]] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done; exit 1; }
skip() { echo "check_netns: $* (skipped)"; exit 77; }
ns_make "10.77.$net"

# run NAME [shaping]: one training, rank r in namespace r, over tcp to 10.77.net.1
run() {
  local name=$1
  pids=()
  for ((r = 0; r < np; ++r)); do
    ip netns exec "${tag}n$r" env RANK=$r WORLD_SIZE=$np LOCAL_RANK=0 MASTER_ADDR=10.77.$net.1 MASTER_PORT=29400 \
      OMP_NUM_THREADS=1 "$exe" --data "$data" --train-limit 12000 --batch 32 --epochs 1 --threads 1 --seed 4 \
      --comm ring --comm-transport tcp --comm-timeout 20 --json --quiet \
      >"$work/$name.$r.out" 2>"$work/$name.$r.err" </dev/null &
    pids+=($!)
  done
  ns_wait "$name" 120  # bounded: the ranks' own timeouts are 20 s
  local sums acc
  sums=$(ns_replicas "$name") || exit 1
  acc=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$work/$name.0.out")
  [[ -n $acc && ${acc:2:2} -ge 88 ]] || fail "$name: test accuracy '$acc' below 0.88"
  echo "check_netns: $name: $np ranks in $np namespaces over tcp, test_accuracy $acc, checksum $sums"
}

run plain
# every rank's link limited to 200 Mbit/s by a token bucket (queueing delay up to 20 ms)
shaped=1
for ((r = 0; r < np; ++r)); do
  ip netns exec "${tag}n$r" tc qdisc add dev eth0 root tbf rate 200mbit burst 64kb latency 20ms || shaped=0
done
if ((shaped)); then run shaped; else echo "check_netns: no tc tbf here: the shaped run is left out"; fi
