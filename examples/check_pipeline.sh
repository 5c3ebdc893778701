#!/usr/bin/env bash
# Pipelines across processes (issue 31), the way users start them:
#   check_pipeline.sh <mnist_deep_mlp> <gradus-run> <mnist dir>
# 1. one process, then gradus-run -np 2 --stages 2 under gpipe (--comm ring) and under the
#    defaults (1f1b over --comm auto, which is the ring under gradus-run; 4 micro-batches):
#    the pipelined runs reach the one-process accuracy (within 2 points), report 2 stages,
#    a bubble, and the bytes per step the cut requires: 2 x batch x 512 floats (activations
#    forward, their gradients back) for every full batch; --log-placement names what ran
#    where and the bytes across the cut every step;
# 2. 2 stages x 2 replicas (gradus-run -np 4): the accuracy of 2 data-parallel ranks (the
#    same 2 x 64 images a step), within 2 points;
#    under --precision bf16, the same accuracy and the policy in the JSON line (fp16 refused);
# 3. -np 3 with --stages 2: refused, naming both numbers;
# 4. ranks started with different --micro-batches: both refuse, naming both values; with
#    different --max-loss-ratio: both refuse at the first step (the run fingerprint);
# 5. started by hand with TF_CONFIG, then with Slurm's variables: 2 stages under 1f1b, the
#    communicator left at --comm auto (the ring);
# 6. given Open MPI's mpirun (4th argument): under it, over --comm mpi, ring and auto (mpi).
# Every wait is bounded (timeout); processes are ended by PID. pipefail: a run that fails
# fails its `$(run | json0)` (CI once saw a 1f1b run end early and only its missing
# placement log reported).
set -u -o pipefail
exe=$1 run=$2 data=$3
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "check_pipeline: $*" >&2; exit 1; }
free_port() { python3 "$(dirname "${BASH_SOURCE[0]}")/../tests/support/free_port.py"; }  # below the ephemeral range
common=(--data "$data" --train-limit 6000 --epochs 1 --seed 1 --threads 1 --quiet --json)
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
# rank 0's JSON line among gradus-run's prefixed lines ("[0] {...}")
json0() { grep -E '^(\[0\] )?\{' | tail -1 | sed -E 's/^\[0\] //'; }

one=$(OMP_NUM_THREADS=1 timeout 120 "$exe" "${common[@]}" | tail -1) || fail "one process failed"
acc1=$(field "$one" test_accuracy)
echo "one process: accuracy $acc1"

full=$((2 * 64 * 512 * 4))  # bytes per full batch across the one cut
for sched in gpipe 1f1b; do
  # 1f1b: the schedule and the communicator left at their defaults, as issue 31's command has them
  how=(--comm ring --schedule gpipe)
  [[ $sched == 1f1b ]] && how=()
  out=$(OMP_NUM_THREADS=1 timeout 180 "$run" -np 2 "$exe" "${common[@]}" "${how[@]}" --stages 2 --micro-batches 4 \
        --log-placement 2>"$work/err" | json0) || { cat "$work/err" >&2; fail "2 stages, $sched failed"; }
  # the placement log: what ran where, and the bytes across the cut every step (64 x 512 floats)
  grep -q "gradus placement: 'matmul' (16, 512) (forward): stage 0 of 2 (rank 0, cpu_simd)" "$work/err" &&
    grep -q "gradus placement: step 0, stage 0 of 2 (rank 0, cpu_simd): sent 131072 bytes of activations to rank 1 (stage 1)" "$work/err" &&
    grep -q "gradus placement: step 93, stage 1 of 2 (rank 1, cpu_simd): sent 98304 bytes of gradients to rank 0 (stage 0)" "$work/err" ||
    { grep placement "$work/err" | head -20 >&2; tail -n 5 "$work/err" >&2; fail "2 stages, $sched: no placement log"; }
  acc=$(field "$out" test_accuracy)
  python3 - "$out" "$acc1" "$full" "$sched" <<'PY' || fail "2 stages, $sched: $out"
import json, sys
j, acc1, full, sched = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
assert j["stages"] == 2 and j["micro_batches"] == 4 and j["schedule"] == sched and j["world_size"] == 2, "fields"
assert j["comm"] == "ring", "comm %s: under gradus-run the ranks train together" % j["comm"]
assert abs(j["test_accuracy"] - acc1) <= 0.02, "accuracy %s vs one process %s" % (j["test_accuracy"], acc1)
# 6000 images: 93 full batches and one of 48 rows; the mean over the 94 steps
want = full * (93 * 64 + 48) / 64 / 94
assert abs(j["bytes_per_step"] - want) <= 1, "bytes_per_step %s, the cut requires %s" % (j["bytes_per_step"], want)
assert 0 < j["bubble_fraction"] < 1, "bubble %s" % j["bubble_fraction"]
PY
  echo "2 stages, $sched: accuracy $acc, bubble $(field "$out" bubble_fraction) (ideal $(field "$out" ideal_bubble_fraction)), $(field "$out" bytes_per_step) bytes per step"
done

# under --precision bf16 (the stages' GEMMs, deferred weight gradients among them, in bf16):
# the one-process fp32 accuracy within 2 points, the policy in the JSON line; fp16 pipelines
# are not built into the example (tests/parallel/test_pipeline_precision.cpp trains them)
out=$(OMP_NUM_THREADS=1 timeout 180 "$run" -np 2 "$exe" "${common[@]}" --stages 2 --micro-batches 4 --precision bf16 \
      2>"$work/err" | json0) || { cat "$work/err" >&2; fail "2 stages, bf16 failed"; }
python3 - "$out" "$acc1" <<'PY' || fail "2 stages, bf16: $out"
import json, sys
j, acc1 = json.loads(sys.argv[1]), float(sys.argv[2])
assert j["stages"] == 2 and j["precision"] == "bf16" and j["loss_scale"] == 1 and j["skipped_steps"] == 0, "fields"
assert abs(j["test_accuracy"] - acc1) <= 0.02, "accuracy %s vs one process (fp32) %s" % (j["test_accuracy"], acc1)
PY
echo "2 stages, bf16: accuracy $(field "$out" test_accuracy)"
OMP_NUM_THREADS=1 timeout 60 "$exe" "${common[@]}" --stages 2 --precision fp16 2>"$work/err" >/dev/null &&
  fail "--stages 2 --precision fp16 was accepted"
grep -q -- "--precision fp16 is built for the unpipelined model only" "$work/err" || { cat "$work/err" >&2; fail "fp16 pipeline: no refusal"; }

# 2 replicas take 2 x 64 images a step: the yardstick is the same data-parallel run without stages
dp=$(OMP_NUM_THREADS=1 timeout 180 "$run" -np 2 "$exe" "${common[@]}" --comm ring 2>"$work/err" | json0) ||
  { cat "$work/err" >&2; fail "2 data-parallel ranks failed"; }
acc_dp=$(field "$dp" test_accuracy)
out=$(OMP_NUM_THREADS=1 timeout 180 "$run" -np 4 "$exe" "${common[@]}" --comm ring --stages 2 --micro-batches 2 \
      2>"$work/err" | json0) || { cat "$work/err" >&2; fail "2 stages x 2 replicas failed"; }
python3 - "$out" "$acc_dp" <<'PY' || fail "2 x 2: $out"
import json, sys
j, acc1 = json.loads(sys.argv[1]), float(sys.argv[2])
assert j["stages"] == 2 and j["world_size"] == 4, "fields"
assert abs(j["test_accuracy"] - acc1) <= 0.02, "accuracy %s vs 2 data-parallel ranks %s" % (j["test_accuracy"], acc1)
PY
echo "2 stages x 2 replicas: accuracy $(field "$out" test_accuracy) (2 data-parallel ranks: $acc_dp)"

OMP_NUM_THREADS=1 timeout 60 "$run" -np 3 "$exe" "${common[@]}" --comm ring --stages 2 >/dev/null 2>"$work/err" &&
  fail "-np 3 --stages 2 did not fail"
grep -q -- "--stages 2 does not divide the 3 ranks" "$work/err" || { cat "$work/err" >&2; fail "-np 3: no clear error"; }
echo "-np 3 --stages 2: refused"

port=$(free_port)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
    timeout 60 "$exe" "${common[@]}" --comm ring --stages 2 --micro-batches $((2 + 2 * r)) \
    >"$work/m$r.out" 2>"$work/m$r.err" </dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" && fail "ranks with different --micro-batches did not fail"; done
pids=()
grep -q "rank 0 runs the pipeline with micro-batches 2, this rank with 4" "$work/m1.err" ||
  { cat "$work/m1.err" >&2; fail "rank 1: no clear mismatch error"; }
grep -q "rank 1 runs the pipeline with micro-batches 4, this rank with 2" "$work/m0.err" ||
  { cat "$work/m0.err" >&2; fail "rank 0: no clear mismatch error"; }
echo "different --micro-batches: both ranks refuse"

# ranks given another --max-loss-ratio (or seed, batch, lr...): the run fingerprint, at the first step
port=$(free_port)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
    timeout 60 "$exe" "${common[@]}" --comm ring --stages 2 --micro-batches 2 --max-loss-ratio $((10 + r)) \
    >"$work/m$r.out" 2>"$work/m$r.err" </dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" && fail "ranks with different --max-loss-ratio did not fail"; done
pids=()
for r in 0 1; do
  grep -q "run fingerprint differs between ranks: rank 1 has max_loss_ratio = 11, rank 0 has max_loss_ratio = 10" "$work/m$r.err" ||
    { cat "$work/m$r.err" >&2; fail "rank $r: no clear --max-loss-ratio mismatch error"; }
done
echo "different --max-loss-ratio: both ranks refuse, naming the field"

# 5. launched the way clusters start jobs, by hand: TF_CONFIG (two workers, a host name) and
# Slurm's variables (node list localhost, the port from GRADUS_MASTER_PORT): 2 stages, 1f1b,
# the one-process accuracy
launch() {  # label [comm]: waits for the two ranks just started, checks rank 0's JSON
  for p in "${pids[@]}"; do wait "$p" || { cat "$work"/l*.err >&2; fail "$1: a rank failed"; }; done
  pids=()
  local out; out=$(grep -E '^\{' "$work/l0.out" | tail -1)
  python3 - "$out" "$acc1" "${2:-ring}" <<'PY' || fail "$1: $out"
import json, sys
j, acc1, comm = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
assert j["stages"] == 2 and j["schedule"] == "1f1b" and j["world_size"] == 2, "fields"
assert j["comm"] == comm, "comm %s, expected %s" % (j["comm"], comm)
assert abs(j["test_accuracy"] - acc1) <= 0.02, "accuracy %s vs one process %s" % (j["test_accuracy"], acc1)
PY
  echo "$1: 2 stages, 1f1b, accuracy $(field "$out" test_accuracy)"
}
p0=$(free_port)
p1=$(free_port)
for r in 0 1; do
  TF_CONFIG="{\"cluster\": {\"worker\": [\"localhost:$p0\", \"localhost:$p1\"]}, \"task\": {\"type\": \"worker\", \"index\": $r}}" \
    OMP_NUM_THREADS=1 timeout 120 "$exe" "${common[@]}" --stages 2 --micro-batches 4 --schedule 1f1b \
    >"$work/l$r.out" 2>"$work/l$r.err" </dev/null &
  pids+=($!)
done
launch "TF_CONFIG"
port=$(free_port)
for r in 0 1; do
  SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_JOB_NODELIST=localhost SLURM_TASKS_PER_NODE=2 SLURM_JOB_ID=77 \
    GRADUS_MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 120 "$exe" "${common[@]}" --stages 2 --micro-batches 4 \
    --schedule 1f1b >"$work/l$r.out" 2>"$work/l$r.err" </dev/null &
  pids+=($!)
done
launch "Slurm variables"

# 6. under Open MPI's mpirun (the 4th argument, where CMake found it: the command and its
# options, e.g. "mpirun --allow-run-as-root --oversubscribe"), over --comm mpi (MPI's own
# point-to-point), over --comm ring (the ranks from OMPI_COMM_WORLD_*) and over --comm auto
# (mpi: the build has it where mpirun was found)
if [[ -n ${4:-} ]]; then
  read -r -a mpirun <<<"$4"
  for comm in mpi ring auto; do
    port=$(free_port)
    GRADUS_MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 120 "${mpirun[@]}" -x GRADUS_MASTER_PORT -x OMP_NUM_THREADS -np 2 \
      "$exe" "${common[@]}" --comm "$comm" --stages 2 --micro-batches 4 --schedule 1f1b \
      >"$work/l0.out" 2>"$work/l0.err" </dev/null &
    pids+=($!)
    want=$comm
    [[ $comm == auto ]] && want=mpi
    launch "mpirun, --comm $comm" "$want"
  done
fi
echo "check_pipeline: ok"
