# Sourced by the check_netns*.sh scripts: NP network namespaces, one per rank, joined by veth
# pairs to a bridge in one more namespace, and the checks of a training run in them. The
# caller sets tag (a prefix unique to the run), np, work (a scratch directory), pids=() and
# the functions fail MESSAGE and skip MESSAGE, and calls ns_remove on exit.

# ns_make SUBNET: namespaces ${tag}n0 .. ${tag}n$((np-1)); rank r's eth0 is SUBNET.(r+1)/24
# (SUBNET as "10.77.42").
ns_make() {
  local subnet=$1 r ns
  ip netns add "${tag}br" 2>/dev/null || skip "cannot create a network namespace"
  ip -n "${tag}br" link add br0 type bridge || skip "this kernel makes no bridge devices"
  ip -n "${tag}br" link set br0 up
  for ((r = 0; r < np; ++r)); do
    ns="${tag}n$r"
    ip netns add "$ns" || fail "ip netns add $ns"
    ip link add "${tag}h$r" netns "$ns" type veth peer name "p$r" netns "${tag}br" || skip "this kernel makes no veth pairs"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "${tag}h$r" name eth0
    ip -n "$ns" addr add "$subnet.$((r + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "${tag}br" link set "p$r" master br0
    ip -n "${tag}br" link set "p$r" up
  done
}

# Ends the ranks still running and removes the namespaces.
ns_remove() {
  local p r
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for ((r = 0; r < np; ++r)); do ip netns del "${tag}n$r" 2>/dev/null; done
  ip netns del "${tag}br" 2>/dev/null
}

# ns_wait NAME LIMIT: waits for the ranks in pids (at most LIMIT seconds in all); each must
# exit 0.
ns_wait() {
  local name=$1 limit=$2 r rc
  for ((r = 0; r < np; ++r)); do
    for _ in $(seq $((limit * 10))); do kill -0 "${pids[$r]}" 2>/dev/null || break; sleep 0.1; done
    kill -0 "${pids[$r]}" 2>/dev/null && fail "$name: rank $r still runs after $limit s"
    wait "${pids[$r]}"; rc=$?
    [[ $rc -eq 0 ]] || fail "$name: rank $r exited $rc"
  done
  pids=()
}

# ns_replicas NAME: rank 0's JSON ($work/NAME.0.out) says world_size np and comm ring, and
# every rank printed the same replica checksum ($work/NAME.<r>.err); prints the checksum.
ns_replicas() {
  local name=$1 sums
  grep -q '"world_size":'"$np" "$work/$name.0.out" || fail "$name: rank 0's JSON lacks world_size $np: $(cat "$work/$name.0.out")"
  grep -q '"comm":"ring"' "$work/$name.0.out" || fail "$name: comm is not ring"
  sums=$(cat "$work/$name".*.err | sed -n 's/.*replica checksum \([0-9a-f]*\).*/\1/p' | sort -u)
  [[ $(cat "$work/$name".*.err | grep -c "replica checksum") -eq $np ]] || fail "$name: not every rank printed its checksum"
  [[ $(echo "$sums" | wc -l) -eq 1 ]] || fail "$name: replicas differ: $sums"
  echo "$sums"
}
