#!/usr/bin/env bash
# The parameter server as users run it (issue 13):
#   check_ps.sh <example> <gradus-run> <mnist dir>
# 1. gradus-run -np 2 --ps 2 <example> --comm ps --consistency async|bsp|ssp:2: each mode
#    trains (12,000 images, 2 epochs) to >= 0.92 test accuracy (async, ssp: >= 0.90, see below),
#    the JSON names the mode, the servers and the world, and the replicas agree at the end.
# 2. A TensorFlow user's TF_CONFIG with a chief, a worker and two ps tasks, host names
#    ("localhost"), four processes started by hand: it trains.
# 3. A worker SIGKILLed mid-training (processes started by hand with torchrun's variables
#    and GRADUS_PS): in bsp the other worker fails within 10 s naming worker 1; in async it
#    goes on and finishes.
# 4. A parameter server SIGKILLed mid-training under gradus-run --max-restarts: restarted, it
#    reloads its shards from the chief's checkpoint, the workers rejoin it and the job
#    reaches its accuracy.
# 4b. A worker SIGKILLed mid-training under gradus-run --max-restarts (async): its restart
#    comes back at the others' next epoch end and the job finishes at its accuracy.
# 5. A parameter server SIGKILLed with workers started by hand (no launcher to restart it) and
#    --comm-timeout 4: both workers fail within 12 s, saying the server did not come back
#    within 4000 ms (the wait for a lost server follows --comm-timeout, not a fixed 30 s).
# Every wait is bounded; every process started here is ended by PID on the way out (no
# `timeout` wrapper in part 3: the PID killed must be the example's own).
set -u
exe=$1 launcher=$2 data=$3
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "check_ps: $*" >&2
  for f in "$work"/*.err "$work"/*.out; do [[ -s $f ]] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }; done
  exit 1
}
# kill_child_and_wait LAUNCHER_PID WHAT KEY=VALUE...: SIGKILL gradus-run's child whose
# environment holds every KEY=VALUE, then wait (180 s at most) for the job to end; fails
# when there is no such child, the job runs on, or it fails
kill_child_and_wait() {
  local launcher_pid=$1 what=$2 victim="" c env_of kv all
  shift 2
  for c in $(pgrep -P "$launcher_pid"); do
    env_of=$(tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null)
    all=1
    for kv in "$@"; do grep -qx "$kv" <<<"$env_of" || all=0; done
    ((all)) && victim=$c
  done
  [[ -n $victim ]] || fail "$what: no child of gradus-run $launcher_pid has $*"
  kill -9 "$victim"
  for _ in $(seq 1800); do kill -0 "$launcher_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$launcher_pid" 2>/dev/null && fail "$what: the job still runs 180 s after the kill"
  wait "$launcher_pid" || fail "$what: the job failed after the kill and the restart"
  pids=()
}
free_port() { python3 "$(dirname "${BASH_SOURCE[0]}")/../tests/support/free_port.py"; }  # below the ephemeral range
json_of() { grep -h '^\(\[0\] \)\?{' "$1" | sed 's/^\[0\] //' | tail -n 1; }
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
base=(--data "$data" --train-limit 12000 --seed 2 --threads 1 --json --quiet)
train=("${base[@]}" --epochs 2)

# ---- 1. the three modes through gradus-run
# async's and ssp's results depend on how the OS interleaves the workers: the order of the
# updates, and (async) a gradient's staleness, which nothing bounds; stale gradients under
# the servers' momentum 0.9 act as extra momentum (Mitliagkas et al. 2016), and the final
# iterate's accuracy swings by ~2 points. Measured (stop 28, clang -O1, 8 of the async runs
# g++ -O3, with 0-8 busy loops beside it): async 49 runs, 0.9137-0.9416; ssp:2 28 runs,
# 0.9185-0.9429; CI saw async at 0.9123 (stop 27, tests in parallel). bsp is deterministic
# (0.9341 in every run) and keeps 0.92; async and ssp get 0.90, which still fails a run
# that loses updates: a quarter of the data (3,000 images, 1 epoch, one process) reaches
# only 0.87.
for mode in async bsp ssp:2; do
  min=0.92
  [[ $mode == bsp ]] || min=0.90
  out=$work/mode.out
  OMP_NUM_THREADS=1 timeout 200 "$launcher" -np 2 --ps 2 --timeout 180 "$exe" "${train[@]}" --comm ps --consistency "$mode" \
    >"$out" 2>&1 </dev/null || fail "gradus-run --ps 2 with --consistency $mode failed"
  j=$(json_of "$out")
  [[ -n $j ]] || fail "$mode: no JSON line"
  acc=$(field "$j" test_accuracy)
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)" "$acc" "$min" ||
    fail "$mode: test accuracy $acc < $min"
  [[ $(field "$j" comm) == parameter_server && $(field "$j" consistency) == "$mode" && $(field "$j" servers) == 2 &&
     $(field "$j" world_size) == 2 ]] || fail "$mode: JSON $j"
  [[ $(grep -c 'replica checksum' "$out") == 2 ]] || fail "$mode: the replica checksums were not printed"
  echo "check_ps: $mode: test accuracy $acc, $(field "$j" epoch_seconds) s per epoch"
done

# ---- 1b. checkpoints: 1 epoch with --checkpoint, then --resume to 2 (the servers' state:
# variables, momentum, the step); the resumed run starts at epoch 2
ck=$work/ps.npz
OMP_NUM_THREADS=1 timeout 200 "$launcher" -np 2 --ps 2 --timeout 180 "$exe" "${base[@]}" --comm ps \
  --consistency bsp --checkpoint "$ck" --epochs 1 >"$work/ck1.out" 2>&1 </dev/null || fail "--checkpoint with --comm ps failed"
[[ -s $ck ]] || fail "no checkpoint written"
python3 - "$ck" <<'PY' || fail "the checkpoint lacks the servers' optimizer state"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert any(n.endswith("/momentum.npy") for n in names), names
PY
OMP_NUM_THREADS=1 timeout 200 "$launcher" -np 2 --ps 2 --timeout 180 "$exe" "${train[@]}" --comm ps --consistency bsp \
  --checkpoint "$ck" --resume >"$work/ck2.out" 2>&1 </dev/null || fail "--resume with --comm ps failed"
j=$(json_of "$work/ck2.out")
[[ $(field "$j" start_epoch) == 2 ]] || fail "the resumed run did not start at epoch 2: $j"
acc=$(field "$j" test_accuracy)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.92 else 1)" "$acc" || fail "resumed: test accuracy $acc"
echo "check_ps: checkpoint after epoch 1, resumed to epoch 2: test accuracy $acc"

# ---- 2. TF_CONFIG with ps tasks, host names, started by hand
p0=$(free_port) p1=$(free_port) s0=$(free_port) s1=$(free_port)
cluster="\"cluster\": {\"chief\": [\"localhost:$p0\"], \"worker\": [\"localhost:$p1\"], \"ps\": [\"localhost:$s0\", \"localhost:$s1\"]}"
start() {  # name type index
  TF_CONFIG="{$cluster, \"task\": {\"type\": \"$2\", \"index\": $3}}" OMP_NUM_THREADS=1 \
    timeout 200 "$exe" "${train[@]}" --comm ps --consistency bsp >"$work/$1.out" 2>"$work/$1.err" </dev/null &
  pids+=($!)
}
start ps0 ps 0
start ps1 ps 1
start chief chief 0
start worker worker 0
for i in 2 3; do
  wait "${pids[$i]}" || fail "TF_CONFIG: the $([[ $i == 2 ]] && echo chief || echo worker) failed"
done
for i in 0 1; do  # the servers end when the chief ends the job
  for _ in $(seq 100); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${pids[$i]}" 2>/dev/null && fail "TF_CONFIG: ps $i still serves 10 s after the job ended"
  wait "${pids[$i]}" || fail "TF_CONFIG: ps $i exited with an error"
done
j=$(json_of "$work/chief.out")
acc=$(field "$j" test_accuracy)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.92 else 1)" "$acc" || fail "TF_CONFIG: test accuracy $acc"
echo "check_ps: TF_CONFIG (chief, worker, 2 ps on localhost): test accuracy $acc"
pids=()

# ---- 3. a worker killed mid-training (at its 20th step; 12,000 images, 3 epochs: the survivor
# trains on alone, as far as the job's end)
killed() {  # mode expect(fail|finish)
  local mode=$1 expect=$2 port ps
  port=$(free_port)
  ps="127.0.0.1:$(free_port),127.0.0.1:$(free_port)"
  pids=()
  local common=(WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GRADUS_PS=$ps OMP_NUM_THREADS=1)
  for i in 0 1; do
    env "${common[@]}" GRADUS_ROLE=ps GRADUS_PS_INDEX=$i "$exe" --data "$data" --comm ps --consistency "$mode" \
      --comm-timeout 30 >"$work/k_ps$i.out" 2>"$work/k_ps$i.err" </dev/null &
    pids+=($!)
  done
  for r in 0 1; do
    env "${common[@]}" RANK=$r LOCAL_RANK=$r "$exe" --data "$data" --train-limit 12000 --epochs 3 --threads 1 \
      --comm ps --consistency "$mode" --comm-timeout 30 --log-every 20 --json >"$work/k_r$r.out" 2>"$work/k_r$r.err" </dev/null &
    pids+=($!)
  done
  for _ in $(seq 300); do
    grep -q "step" "$work/k_r0.err" 2>/dev/null && break
    kill -0 "${pids[2]}" 2>/dev/null || fail "$mode: worker 0 exited before training"
    sleep 0.1
  done
  grep -q "step" "$work/k_r0.err" || fail "$mode: worker 0 did not start training within 30 s"
  kill -9 "${pids[3]}"
  local start=$SECONDS
  if [[ $expect == fail ]]; then
    for _ in $(seq 200); do kill -0 "${pids[2]}" 2>/dev/null || break; sleep 0.05; done
    kill -0 "${pids[2]}" 2>/dev/null && fail "$mode: worker 0 still runs 10 s after worker 1 was killed"
    wait "${pids[2]}" && fail "$mode: worker 0 exited 0 although its peer died"
    grep -q "worker 1 .*was lost" "$work/k_r0.err" || fail "$mode: worker 0's error does not name worker 1"
    echo "check_ps: $mode: worker 0 stopped $((SECONDS - start)) s after worker 1 was killed: $(grep -o 'worker 1 .*was lost[^;]*' "$work/k_r0.err" | head -n 1)"
  else
    for _ in $(seq 1200); do kill -0 "${pids[2]}" 2>/dev/null || break; sleep 0.1; done
    kill -0 "${pids[2]}" 2>/dev/null && fail "$mode: worker 0 still runs 120 s after worker 1 was killed"
    wait "${pids[2]}" || fail "$mode: worker 0 did not finish after worker 1 was killed"
    j=$(json_of "$work/k_r0.out")
    [[ -n $j ]] || fail "$mode: no JSON from worker 0"
    echo "check_ps: $mode: worker 0 finished without worker 1: test accuracy $(field "$j" test_accuracy)"
  fi
  for i in 0 1; do
    for _ in $(seq 150); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
    kill -0 "${pids[$i]}" 2>/dev/null && fail "$mode: ps $i still serves 15 s after the job ended"
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
}
killed bsp fail
killed async finish

# ---- 4. a server killed mid-training and restarted (server recovery): gradus-run
# --max-restarts starts ps 1 again; it reloads its shards from the chief's checkpoint
# (epoch 1) when the workers rejoin it, and the bsp run finishes with its accuracy
ck=$work/recover.npz
OMP_NUM_THREADS=1 "$launcher" -np 2 --ps 2 --timeout 180 --max-restarts 1 --restart-delay 0.5 "$exe" "${base[@]}" \
  --epochs 3 --comm ps --consistency bsp --checkpoint "$ck" >"$work/recover.out" 2>&1 </dev/null &
launcher_pid=$!
pids=("$launcher_pid")
for _ in $(seq 1200); do [[ -s $ck ]] && break; kill -0 "$launcher_pid" 2>/dev/null || break; sleep 0.05; done
[[ -s $ck ]] || fail "recovery: no checkpoint after epoch 1 within 60 s"
kill_child_and_wait "$launcher_pid" "recovery (ps 1 killed)" GRADUS_ROLE=ps GRADUS_PS_INDEX=1
grep -q "restarting it" "$work/recover.out" || fail "recovery: gradus-run did not restart ps 1"
grep -q "restored 'fc" "$work/recover.out" || fail "recovery: the restarted ps 1 did not restore its shards"
j=$(json_of "$work/recover.out")
acc=$(field "$j" test_accuracy)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.92 else 1)" "$acc" || fail "recovery: test accuracy $acc < 0.92"
echo "check_ps: ps 1 killed in epoch 2 and restarted from the epoch-1 checkpoint: the bsp job finished, test accuracy $acc;" \
  "$(grep -c "restored '" "$work/recover.out") shards restored"

# ---- 4b. a worker killed mid-training and restarted (async): gradus-run --max-restarts
# starts rank 1 again; it waits at server 0 for the others' next epoch end, comes back there
# at their step, trains the epochs left with them, and the job finishes with its accuracy,
# both replicas agreeing at the end. Half the images, 5 epochs (once the whole set, 4 epochs:
# 37% fewer steps): an epoch takes ~1.4 s with g++ -O3 on a 2-core AMD EPYC and ~10 s under
# ASan; the restart (0.5 s, the kill, 0.5 s, a process start) took longer than one there and
# the worker came back at the end of epoch 3, so two epochs are left to spare.
OMP_NUM_THREADS=1 "$launcher" -np 2 --ps 2 --timeout 180 --max-restarts 1 --restart-delay 0.5 "$exe" --data "$data" \
  --train-limit 30000 --seed 2 --threads 1 --json --epochs 5 --comm ps --consistency async >"$work/wrestart.out" 2>&1 </dev/null &
launcher_pid=$!
pids=("$launcher_pid")
for _ in $(seq 1200); do grep -q "rank 1 of 2: epoch 1:" "$work/wrestart.out" && break; kill -0 "$launcher_pid" 2>/dev/null || break; sleep 0.05; done
grep -q "rank 1 of 2: epoch 1:" "$work/wrestart.out" || fail "worker restart: rank 1 did not finish epoch 1 within 60 s"
sleep 0.5
kill_child_and_wait "$launcher_pid" "worker restart (rank 1 killed)" GRADUS_ROLE=worker RANK=1
grep -q "rank 1 was killed by signal 9.*restarting it" "$work/wrestart.out" || fail "worker restart: gradus-run did not restart rank 1"
back=$(grep -o "worker 1 is back at clock [0-9]*" "$work/wrestart.out" | head -n 1)
[[ -n $back ]] || fail "worker restart: no server took worker 1 back"
[[ $(grep -c 'replica checksum' "$work/wrestart.out") == 2 ]] || fail "worker restart: the replica checksums were not printed by both ranks"
j=$(json_of "$work/wrestart.out")
acc=$(field "$j" test_accuracy)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.90 else 1)" "$acc" || fail "worker restart: test accuracy $acc < 0.90"
echo "check_ps: rank 1 killed in epoch 2 and restarted: $back (an epoch's end), the async job finished, test accuracy $acc"

# ---- 5. a server killed, workers started by hand: nothing restarts it; the workers fail
# after --comm-timeout (4 s), naming it
port=$(free_port)
ps="127.0.0.1:$(free_port),127.0.0.1:$(free_port)"
common=(WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GRADUS_PS=$ps OMP_NUM_THREADS=1)
for i in 0 1; do
  env "${common[@]}" GRADUS_ROLE=ps GRADUS_PS_INDEX=$i "$exe" --data "$data" --comm ps --consistency bsp \
    --comm-timeout 4 >"$work/g_ps$i.out" 2>"$work/g_ps$i.err" </dev/null &
  pids+=($!)
done
for r in 0 1; do
  env "${common[@]}" RANK=$r LOCAL_RANK=$r "$exe" --data "$data" --epochs 3 --threads 1 \
    --comm ps --consistency bsp --comm-timeout 4 --log-every 20 >"$work/g_r$r.out" 2>"$work/g_r$r.err" </dev/null &
  pids+=($!)
done
for _ in $(seq 300); do
  grep -q "step" "$work/g_r0.err" 2>/dev/null && break
  kill -0 "${pids[2]}" 2>/dev/null || fail "server killed: worker 0 exited before training"
  sleep 0.1
done
grep -q "step" "$work/g_r0.err" || fail "server killed: worker 0 did not start training within 30 s"
kill -9 "${pids[1]}"
start=$SECONDS
for r in 0 1; do
  for _ in $(seq 240); do kill -0 "${pids[$((2 + r))]}" 2>/dev/null || break; sleep 0.05; done
  kill -0 "${pids[$((2 + r))]}" 2>/dev/null && fail "server killed: worker $r still runs 12 s after ps 1 was killed"
  wait "${pids[$((2 + r))]}" && fail "server killed: worker $r exited 0"
  grep -q "server 1 .*did not come back within 4000 ms" "$work/g_r$r.err" ||
    fail "server killed: worker $r does not say that server 1 did not come back within 4000 ms"
done
echo "check_ps: ps 1 killed, workers started by hand with --comm-timeout 4: both failed within $((SECONDS - start)) s:" \
  "$(grep -o 'server 1 .*did not come back within 4000 ms' "$work/g_r0.err" | head -n 1 | cut -c1-160)"
echo "check_ps: ok"
