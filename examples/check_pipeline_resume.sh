#!/usr/bin/env bash
# A pipelined run's checkpoints (issue 31), the way users run them:
#   check_pipeline_resume.sh <mnist_deep_mlp> <gradus-run> <mnist dir>
# 1. gradus-run -np 2 --stages 2: 2 epochs straight, and 1 epoch with --checkpoint then
#    --resume to 2: one file per stage (ckpt-1.stage-K-of-2.npz, committed by ckpt.commit, no
#    ckpt.npz), the resumed run
#    starts at epoch 2 and prints the same final_loss and test_accuracy; --metrics holds
#    epochs 1 and 2;
# 2. the stage files given to a run without stages: refused, naming the stage count;
# 3. a whole model's checkpoint given to a pipeline: refused;
# 4. stage 1's file missing: refused, naming it.
# (Every rank refuses, tests/parallel/test_pipeline.cpp checks; gradus-run stops the others
# once the first has failed, so here the first rank's line is checked.)
# Every wait is bounded (timeout).
set -u
exe=$1 run=$2 data=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_pipeline_resume: $*" >&2; exit 1; }
common=(--data "$data" --train-limit 6000 --seed 1 --threads 1 --quiet)
staged=(--comm ring --stages 2 --micro-batches 4 --schedule 1f1b)
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
json0() { grep -E '^(\[0\] )?\{' | tail -1 | sed -E 's/^\[0\] //'; }
pipe() { OMP_NUM_THREADS=1 timeout 180 "$run" -np 2 "$exe" "${common[@]}" "${staged[@]}" "$@"; }

straight=$(pipe --epochs 2 --json 2>"$work/err" | json0) || { cat "$work/err" >&2; fail "2 epochs straight failed"; }
ck="$work/run/ckpt.npz"
pipe --epochs 1 --checkpoint "$ck" --metrics "$work/run/metrics.csv" >/dev/null 2>"$work/err" ||
  { cat "$work/err" >&2; fail "1 epoch with --checkpoint failed"; }
for k in 0 1; do [[ -s $work/run/ckpt-1.stage-$k-of-2.npz ]] || fail "no file for stage $k: $(ls "$work/run")"; done
grep -q '^part 1 ckpt-1.stage-1-of-2.npz [0-9]' "$work/run/ckpt.commit" || fail "no commit record naming the files: $(ls "$work/run")"
[[ -e $ck ]] && fail "a pipeline wrote a whole-model file $ck"
resumed=$(pipe --epochs 2 --json --checkpoint "$ck" --resume --metrics "$work/run/metrics.csv" 2>"$work/err" | json0) ||
  { cat "$work/err" >&2; fail "--resume to 2 epochs failed"; }
[[ $(field "$resumed" start_epoch) == 2 ]] || fail "the resumed run started at epoch $(field "$resumed" start_epoch): $resumed"
for key in final_loss test_accuracy; do
  a=$(field "$straight" $key) b=$(field "$resumed" $key)
  [[ $a == "$b" ]] || fail "$key is $a straight, $b resumed"
  echo "resumed pipeline: $key = $a both ways"
done
[[ $(grep -c . "$work/run/metrics.csv") == 3 ]] && grep -q '^1,' "$work/run/metrics.csv" && grep -q '^2,' "$work/run/metrics.csv" ||
  { cat "$work/run/metrics.csv" >&2; fail "--metrics should hold a header and epochs 1 and 2"; }

# 2. the stage files given to one process without stages
OMP_NUM_THREADS=1 timeout 60 "$exe" "${common[@]}" --epochs 2 --checkpoint "$ck" --resume >/dev/null 2>"$work/err" &&
  fail "a run without stages resumed a pipeline's checkpoint"
grep -q "was written by a pipeline of 2 stages" "$work/err" && grep -q -- "resume it with --stages 2" "$work/err" ||
  { cat "$work/err" >&2; fail "a run without stages: no clear error"; }
echo "stage files given to a run without stages: refused"

# 3. a whole model's checkpoint given to a pipeline
whole="$work/whole/ckpt.npz"
OMP_NUM_THREADS=1 timeout 60 "$exe" "${common[@]}" --epochs 1 --checkpoint "$whole" >/dev/null 2>"$work/err" ||
  { cat "$work/err" >&2; fail "one process with --checkpoint failed"; }
pipe --epochs 2 --checkpoint "$whole" --resume >/dev/null 2>"$work/err" && fail "a pipeline resumed a whole model's checkpoint"
grep -q "^\[[01]\] .*the file holds a whole model (a run without stages)" "$work/err" ||
  { cat "$work/err" >&2; fail "no clear error for a whole model's checkpoint"; }
echo "a whole model's checkpoint given to a pipeline: refused"

# 4. stage 1's file missing
rm "$work/run/ckpt-2.stage-1-of-2.npz"
pipe --epochs 3 --checkpoint "$ck" --resume >/dev/null 2>"$work/err" && fail "a pipeline resumed without stage 1's file"
grep -q "^\[[01]\] .*incomplete: the file of stage(s) 1 is missing" "$work/err" ||
  { cat "$work/err" >&2; fail "no clear error for a missing stage file"; }
echo "stage 1's file missing: refused, naming it"
echo "check_pipeline_resume: ok"
