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
br="${tag}br"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for ((r = 0; r < np; ++r)); do ip netns del "${tag}n$r" 2>/dev/null; done
  ip netns del "$br" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "check_netns: $*" >&2; for f in "$work"/*.err; do [[ -f $f ]] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done; exit 1; }

ip netns add "$br" 2>/dev/null || { echo "check_netns: cannot create a network namespace"; exit 77; }
skip() { echo "check_netns: $* (skipped)"; exit 77; }
ip -n "$br" link add br0 type bridge || skip "this kernel makes no bridge devices"
ip -n "$br" link set br0 up
for ((r = 0; r < np; ++r)); do
  ns="${tag}n$r"
  ip netns add "$ns" || fail "ip netns add $ns"
  ip link add "${tag}h$r" netns "$ns" type veth peer name "p$r" netns "$br" || skip "this kernel makes no veth pairs"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${tag}h$r" name eth0
  ip -n "$ns" addr add "10.77.$net.$((r + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$br" link set "p$r" master br0
  ip -n "$br" link set "p$r" up
done

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
  local r rc
  for ((r = 0; r < np; ++r)); do
    # bounded: the ranks' own timeouts are 20 s; 120 s in all
    for _ in $(seq 1200); do kill -0 "${pids[$r]}" 2>/dev/null || break; sleep 0.1; done
    kill -0 "${pids[$r]}" 2>/dev/null && fail "$name: rank $r still runs after 120 s"
    wait "${pids[$r]}"; rc=$?
    [[ $rc -eq 0 ]] || fail "$name: rank $r exited $rc"
  done
  pids=()
  grep -q '"world_size":'"$np" "$work/$name.0.out" || fail "$name: rank 0's JSON lacks world_size $np: $(cat "$work/$name.0.out")"
  grep -q '"comm":"ring"' "$work/$name.0.out" || fail "$name: comm is not ring"
  local acc
  acc=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$work/$name.0.out")
  [[ -n $acc && ${acc:2:2} -ge 88 ]] || fail "$name: test accuracy '$acc' below 0.88"
  local sums
  sums=$(cat "$work/$name".*.err | sed -n 's/.*replica checksum \([0-9a-f]*\).*/\1/p' | sort -u)
  [[ $(cat "$work/$name".*.err | grep -c "replica checksum") -eq $np ]] || fail "$name: not every rank printed its checksum"
  [[ $(echo "$sums" | wc -l) -eq 1 ]] || fail "$name: replicas differ: $sums"
  echo "check_netns: $name: $np ranks in $np namespaces over tcp, test_accuracy $acc, checksum $sums"
}

run plain
# every rank's link limited to 200 Mbit/s by a token bucket (queueing delay up to 20 ms)
shaped=1
for ((r = 0; r < np; ++r)); do
  ip netns exec "${tag}n$r" tc qdisc add dev eth0 root tbf rate 200mbit burst 64kb latency 20ms || shaped=0
done
if ((shaped)); then run shaped; else echo "check_netns: no tc tbf here: the shaped run is left out"; fi
