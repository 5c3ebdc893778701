#!/usr/bin/env bash
# Ranks that meet by host name, as on a real cluster: 3 network namespaces (one per rank,
# 10.78.<net>.<rank+1>/24, veth pairs to a bridge in a fourth, as check_netns.sh builds
# them), each with its own /etc/hosts (`ip netns exec` bind-mounts /etc/netns/<ns>/hosts over
# /etc/hosts) naming the three hosts, and MASTER_ADDR = rank 0's host name. Two trainings of
# an example with --comm ring --comm-transport auto, each checked for world size 3 and one
# replica checksum on every rank:
#   debian     rank 0 runs under its own host name (a UTS namespace), which its hosts file
#              maps to 127.0.1.1 as Debian does, while the others resolve it to 10.78.<net>.1:
#              rank 0 must listen on every interface, not on what its name resolves to there;
#   same-name  every rank keeps this machine's host name: only the network namespaces
#              differ, so auto must still pick tcp (ipc's abstract sockets do not cross
#              network namespaces);
#   late       rank 0's name is missing from the other ranks' hosts files when they start,
#              and added 3 s later (a Kubernetes headless service publishes a pod's record
#              once it runs): ranks 1 and 2 must ask again until it resolves, not fail.
#   check_netns_hosts.sh <example> <mnist dir>
# Exits 77 (CTest: skipped) when not root or when namespaces cannot be made. The namespaces
# and the /etc/netns/<ns> directories are removed on every way out.
set -u
exe=$1 data=$2 np=3
[[ $(id -u) -eq 0 ]] || { echo "check_netns_hosts: needs root (ip netns)"; exit 77; }
command -v ip >/dev/null || { echo "check_netns_hosts: no ip(8) (Debian: iproute2)"; exit 77; }
command -v unshare >/dev/null || { echo "check_netns_hosts: no unshare(1) (Debian: util-linux)"; exit 77; }
tag="h$$"
net=$(( $$ % 200 + 20 ))
work=$(mktemp -d)
made_etc_netns=0
[[ -d /etc/netns ]] || made_etc_netns=1
pids=()
source "$(dirname "$0")/netns_lib.sh"
cleanup() {
  ns_remove
  for ((r = 0; r < np; ++r)); do rm -rf "/etc/netns/${tag}n$r"; done
  ((made_etc_netns)) && rmdir /etc/netns 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "check_netns_hosts: $*" >&2; for f in "$work"/*.err; do [[ -f $f ]] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done; exit 1; }
skip() { echo "check_netns_hosts: $* (skipped)"; exit 77; }
name() { echo "gradus-$tag-r$1"; }
ns_make "10.78.$net"

# hosts_files MODE: every namespace's /etc/hosts names the three hosts; in "debian" mode
# rank 0's own file maps its own name to 127.0.1.1 instead.
hosts_files() {
  local r h
  for ((r = 0; r < np; ++r)); do
    mkdir -p "/etc/netns/${tag}n$r" || fail "cannot create /etc/netns/${tag}n$r"
    {
      echo "127.0.0.1 localhost"
      echo "::1 localhost ip6-localhost ip6-loopback"
      for ((h = 0; h < np; ++h)); do
        if [[ $1 == debian && $r -eq 0 && $h -eq 0 ]]; then echo "127.0.1.1 $(name 0)"
        elif [[ $1 == late && $r -ne 0 && $h -eq 0 ]]; then :  # published later (run)
        else echo "10.78.$net.$((h + 1)) $(name "$h")"; fi
      done
    } >"/etc/netns/${tag}n$r/hosts"
  done
}

# run NAME: one training; rank r in namespace r, meeting at $(name 0)
run() {
  local mode=$1 r
  hosts_files "$mode"
  pids=()
  for ((r = 0; r < np; ++r)); do
    local -a pre=()
    # debian: rank 0 under its own host name, as on its own machine
    [[ $mode == debian && $r -eq 0 ]] && pre=(unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(name 0)")
    ip netns exec "${tag}n$r" "${pre[@]}" env RANK=$r WORLD_SIZE=$np LOCAL_RANK=0 MASTER_ADDR="$(name 0)" MASTER_PORT=29410 \
      OMP_NUM_THREADS=1 "$exe" --data "$data" --train-limit 2400 --batch 32 --epochs 1 --threads 1 --seed 4 \
      --comm ring --comm-transport auto --comm-timeout 20 --json --quiet \
      >"$work/$mode.$r.out" 2>"$work/$mode.$r.err" </dev/null &
    pids+=($!)
  done
  if [[ $mode == late ]]; then
    sleep 3
    for ((r = 1; r < np; ++r)); do
      kill -0 "${pids[$r]}" 2>/dev/null || fail "late: rank $r did not wait for $(name 0) to resolve: $(tail -2 "$work/$mode.$r.err")"
      echo "10.78.$net.1 $(name 0)" >>"/etc/netns/${tag}n$r/hosts"  # appended: the bind mount sees it
    done
  fi
  ns_wait "$mode" 90  # bounded: the ranks' own timeouts are 20 s
  local sums
  sums=$(ns_replicas "$mode") || exit 1
  echo "check_netns_hosts: $mode: $np ranks in $np namespaces met at MASTER_ADDR=$(name 0), checksum $sums"
}

run debian
run same-name
run late
