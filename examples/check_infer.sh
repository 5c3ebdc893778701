#!/usr/bin/env bash
# Inference from a training checkpoint (issue 33):
#   check_infer.sh <mnist_mlp> <mnist_infer> <mnist dir>
# 1. mnist_mlp trains 1 epoch on 6,000 images with --checkpoint (SGD with momentum: the file
#    holds the momentum arrays and the step counter too);
# 2. mnist_infer loads it into the forward graph alone and classifies the test set: its
#    test_accuracy must equal the training run's, digit for digit, and its latency and
#    throughput figures must be positive, p99 >= median;
# 3. a checkpoint of another model (a variable removed) is refused: exit 1, the file and
#    the variable named on stderr, nothing on stdout.
# Every run is bounded (timeout).
set -uo pipefail
train=$1 infer=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_infer: $*" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ck="$work/ckpt.npz"

trained=$(timeout 120 "$train" --data "$data" --train-limit 6000 --epochs 1 --seed 4 --threads 2 --quiet --json \
  --checkpoint "$ck" 2>"$work/err" | tail -1) || { cat "$work/err" >&2; fail "mnist_mlp --checkpoint failed"; }
[[ -s $ck ]] || fail "mnist_mlp wrote no checkpoint $ck"
inferred=$(timeout 120 "$infer" --checkpoint "$ck" --data "$data" --batch 1000 --runs 200 --threads 2 --json \
  2>"$work/err" | tail -1) || { cat "$work/err" >&2; fail "mnist_infer failed"; }
a=$(field "$trained" test_accuracy) b=$(field "$inferred" test_accuracy)
[[ $a == "$b" ]] || fail "test_accuracy is $a after training, $b from mnist_infer on its checkpoint"
echo "check_infer: test_accuracy $a both ways"
python3 - "$inferred" <<'PY' || fail "implausible figures: $inferred"
import json, sys
j = json.loads(sys.argv[1])
assert j["test_images"] == 10000 and j["latency_runs"] == 200, j
assert 0 < j["latency_ms_median"] <= j["latency_ms_p99"], j
assert j["images_per_second"] > 0, j
PY
echo "check_infer: $inferred"

# a checkpoint without fc2/b (the .npz's zip less its member fc2/b.npy; no numpy needed):
# refused by name, through main's catch (exit 1)
python3 -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as a, zipfile.ZipFile(sys.argv[2], "w") as b:
    for m in a.namelist():
        if m != "fc2/b.npy": b.writestr(m, a.read(m))' "$ck" "$work/other.npz" || fail "could not rewrite the checkpoint"
out=$(timeout 60 "$infer" --checkpoint "$work/other.npz" --data "$data" --json 2>"$work/err"); rc=$?
[[ $rc == 1 ]] || fail "a checkpoint without fc2/b: exit $rc, expected 1"
[[ -z $out ]] || fail "a refused checkpoint printed on stdout: $out"
grep -q "load_weights '$work/other.npz'.*nothing was loaded" "$work/err" && grep -q "missing from the file: 'fc2/b' (128,) float32" "$work/err" ||
  { cat "$work/err" >&2; fail "the refusal does not name the file and fc2/b"; }
echo "check_infer: a checkpoint without fc2/b refused"
