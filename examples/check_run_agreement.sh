#!/usr/bin/env bash
# Ranks that disagree on their run must fail at once, naming what differs, and a resumed
# job must resume the same way on every rank (issue 12, items 2, 3, 4 and 6):
#   check_run_agreement.sh <mnist example> <mnist dir>
# Ranks are started by hand with torchrun's variables (127.0.0.1, a free port), each with
# its own arguments. Every wait is bounded (timeout); every process is ended by PID.
set -u
exe=$1 data=$2
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "check_run_agreement: $*" >&2
  for f in "$work"/*.err; do [[ -f $f ]] && { echo "--- $f:" >&2; tail -5 "$f" >&2; }; done
  exit 1
}
free_port() { python3 "$(dirname "${BASH_SOURCE[0]}")/../tests/support/free_port.py"; }  # below the ephemeral range
common=(--data "$data" --threads 1 --quiet --comm ring --comm-timeout 20)

# two ranks: rank0 ARGS... -- rank1 ARGS...; outputs in $work/<tag>.r<r>.{out,err}, exit
# statuses in rc0, rc1
two_ranks() {
  local tag=$1
  shift
  local a0=() a1=() side=0
  for a in "$@"; do
    if [[ $a == -- ]]; then side=1; continue; fi
    if ((side == 0)); then a0+=("$a"); else a1+=("$a"); fi
  done
  [[ " ${a0[*]} " == *" --train-limit "* ]] || a0+=(--train-limit 2000)
  [[ " ${a1[*]} " == *" --train-limit "* ]] || a1+=(--train-limit 2000)
  local port
  port=$(free_port)
  pids=()
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$exe" "${common[@]}" "${a0[@]}" \
    >"$work/$tag.r0.out" 2>"$work/$tag.r0.err" </dev/null &
  pids+=($!)
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$exe" "${common[@]}" "${a1[@]}" \
    >"$work/$tag.r1.out" 2>"$work/$tag.r1.err" </dev/null &
  pids+=($!)
  wait "${pids[0]}"; rc0=$?
  wait "${pids[1]}"; rc1=$?
  pids=()
}

# ---- item 2: a different --lr, --momentum, --batch, --seed or --train-limit on rank 1
check_mismatch() {
  local tag=$1 expect=$2
  shift 2
  two_ranks "$tag" "$@"
  [[ $rc0 -ne 0 && $rc1 -ne 0 ]] || fail "$tag: the ranks exited $rc0 and $rc1; both must fail"
  for r in 0 1; do
    grep -qF "$expect" "$work/$tag.r$r.err" || fail "$tag: rank $r does not say '$expect'"
  done
  echo "check_run_agreement: $tag: both ranks fail: $(head -1 "$work/$tag.r0.err")"
}
check_mismatch lr "rank 1 has optimizer.lr = 0.1, rank 0 has optimizer.lr = 0.05" --lr 0.05 -- --lr 0.1
check_mismatch momentum "rank 1 has optimizer.momentum = 0.5, rank 0 has optimizer.momentum = 0.9" -- --momentum 0.5
check_mismatch batch "rank 1 has batch_size = 32, rank 0 has batch_size = 64" --batch 64 -- --batch 32
check_mismatch seed "rank 1 has data_seed = 2, rank 0 has data_seed = 1" --seed 1 -- --seed 2
check_mismatch limit "rank 1 has steps_per_epoch = 12, rank 0 has steps_per_epoch = 16" -- --train-limit 1500

# ---- item 3: only rank 0 can read the checkpoint (node-local disks: rank 1 is given a path
# where there is none); both resume at rank 0's epoch and end with the same replicas
two_ranks save --epochs 1 --checkpoint "$work/node0/ck.npz" -- --epochs 1 --checkpoint "$work/node1/ck.npz"
[[ $rc0 -eq 0 && $rc1 -eq 0 ]] || fail "save: the ranks exited $rc0 and $rc1"
[[ -f $work/node0/ck.npz && ! -e $work/node1/ck.npz ]] || fail "save: only rank 0 writes the checkpoint"
two_ranks resume --epochs 2 --json --resume --checkpoint "$work/node0/ck.npz" -- \
  --epochs 2 --resume --checkpoint "$work/node1/ck.npz"
[[ $rc0 -eq 0 && $rc1 -eq 0 ]] || fail "resume: the ranks exited $rc0 and $rc1"
grep -q '"start_epoch":2' "$work/resume.r0.out" || fail "resume: rank 0 did not start at epoch 2: $(cat "$work/resume.r0.out")"
c0=$(grep -o 'replica checksum [0-9a-f]*' "$work/resume.r0.err")
c1=$(grep -o 'replica checksum [0-9a-f]*' "$work/resume.r1.err")
[[ -n $c0 && $c0 == "$c1" ]] || fail "resume: the replicas differ ('$c0' vs '$c1')"
echo "check_run_agreement: resume: both ranks resumed at epoch 2 from rank 0's checkpoint; $c0 on both"

# the same checkpoint in a world of one: written by 2 ranks, refused
timeout 60 "$exe" --data "$data" --train-limit 2000 --threads 1 --quiet --epochs 3 --resume \
  --checkpoint "$work/node0/ck.npz" >"$work/world.out" 2>"$work/world.err" </dev/null && fail "world: a 2-rank checkpoint resumed in a world of 1"
grep -q "written by a job of 2 ranks; this job has 1" "$work/world.err" || fail "world: the error does not name both world sizes: $(cat "$work/world.err")"
echo "check_run_agreement: world: $(head -1 "$work/world.err")"

# ---- item 6: --checkpoint into a directory that cannot exist fails before training
touch "$work/plainfile"
start=$(date +%s%3N)
timeout 60 "$exe" --data "$data" --train-limit 2000 --threads 1 --quiet --epochs 1 \
  --checkpoint "$work/plainfile/sub/ck.npz" >"$work/dir.out" 2>"$work/dir.err" </dev/null && fail "dir: a checkpoint under a plain file did not fail"
grep -q "cannot create the directory" "$work/dir.err" || fail "dir: $(cat "$work/dir.err")"
echo "check_run_agreement: dir: fails in $(( $(date +%s%3N) - start )) ms: $(head -1 "$work/dir.err")"
# and a directory that does not exist yet is created
timeout 60 "$exe" --data "$data" --train-limit 2000 --threads 1 --quiet --epochs 1 \
  --checkpoint "$work/new/deeper/ck.npz" >/dev/null 2>"$work/newdir.err" </dev/null || fail "newdir: $(cat "$work/newdir.err")"
[[ -f $work/new/deeper/ck.npz ]] || fail "newdir: no checkpoint written"

# ---- item 6: a diverging run stops with an error naming the step, alone and on 2 ranks
timeout 60 "$exe" --data "$data" --train-limit 2000 --threads 1 --quiet --lr 10 --json \
  >"$work/div.out" 2>"$work/div.err" </dev/null && fail "diverge: --lr 10 exited 0: $(cat "$work/div.out")"
grep -q "training diverged at global step [0-9]" "$work/div.err" || fail "diverge: $(cat "$work/div.err")"
[[ -s $work/div.out ]] && fail "diverge: a JSON line was printed: $(cat "$work/div.out")"
echo "check_run_agreement: diverge: $(head -1 "$work/div.err")"
two_ranks div2 --lr 10 -- --lr 10
[[ $rc0 -ne 0 && $rc1 -ne 0 ]] || fail "div2: the ranks exited $rc0 and $rc1; both must fail"
s0=$(grep -o "diverged at global step [0-9]*" "$work/div2.r0.err")
s1=$(grep -o "diverged at global step [0-9]*" "$work/div2.r1.err")
[[ -n $s0 && $s0 == "$s1" ]] || fail "div2: the ranks name different steps ('$s0' vs '$s1')"
echo "check_run_agreement: div2: both ranks: $s0"

# ---- item 4: --comm local inside a described cluster warns (the default, auto, joins it)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 timeout 60 "$exe" --data "$data" --train-limit 2000 \
  --threads 1 --quiet --epochs 1 --comm local >/dev/null 2>"$work/local.err" </dev/null || fail "local: $(cat "$work/local.err")"
grep -q "warning: --comm local, but the environment describes a cluster (torchrun: worker 1 of 2 workers)" "$work/local.err" ||
  fail "local: no warning: $(cat "$work/local.err")"
echo "check_run_agreement: local: $(head -1 "$work/local.err")"
echo "check_run_agreement: all cases passed"
