#!/usr/bin/env bash
# Pipelines across processes (issue 31): mnist_deep_mlp in one process against the same
# training as a 2-stage pipeline (gradus-run -np 2 --stages 2) under the default schedule,
# 1F1B, for M = 1, 2, 4, 8, 16 micro-batches and under GPipe for M = 8, 16, against data
# parallelism (2 and 4 ranks) and a 2 stages x 2 replicas hybrid. Prints a markdown report on
# stdout.
#
#   benchmarks/pipeline_bench.sh <mnist_deep_mlp> <gradus-run> <mnist dir>
#       [--repeats N (3)] [--train-limit N (6000)] [--batch B (the example's default)] [--quick]
#
# --quick: a smoke test (1 repeat, 1,200 images, 1F1B at M = 1 and 8 only, GPipe at M = 8);
# an explicit --repeats / --train-limit still wins.
#
# Every run: --data DIR --train-limit N --epochs 1 --seed 1 --threads 1 --quiet --json
# [--batch B], OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1, OPENBLAS_CORETYPE unset, inside
# `timeout 300` (which signals the command's whole process group: gradus-run and its
# ranks). Each row runs N times; the rows are interleaved (round r runs every row once, the
# order rotated by r) so background load hits all rows alike. The table gives the median
# and range of epoch_seconds, the median over rounds of examples/s divided by the same
# round's one-process run, and the JSON's accuracy, bubble (measured, mean over ranks, and
# ideal), bytes per step against the minimum the cut needs, each stage's peak activations
# held, and rank 0's peak RSS.
# A failed or timed-out run is reported with its stderr tail; the script goes on and exits
# 1 at the end. Needs python3.
# shellcheck disable=SC2016  # the rows' labels hold markdown backquotes, not expansions
set -uo pipefail

usage() { sed -n '7,8p' "$0" | sed 's/^# *//' >&2; exit 2; }
[[ $# -ge 3 ]] || usage
exe=$1 run=$2 data=$3
shift 3
repeats='' limit='' batch='' quick=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) repeats=${2:?}; shift 2 ;;
    --train-limit) limit=${2:?}; shift 2 ;;
    --batch) batch=${2:?}; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "pipeline_bench: unknown option $1" >&2; usage ;;
  esac
done
if ((quick)); then
  repeats=${repeats:-1} limit=${limit:-1200}
  f1b_ms=(1 8) gpipe_ms=(8)
else
  repeats=${repeats:-3} limit=${limit:-6000}
  f1b_ms=(1 2 4 8 16) gpipe_ms=(8 16)
fi
[[ $repeats =~ ^[1-9][0-9]*$ && $limit =~ ^[0-9]+$ && ( -z $batch || $batch =~ ^[1-9][0-9]*$ ) ]] || usage
[[ -d $data ]] || { echo "pipeline_bench: no MNIST directory $data" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
work=$(mktemp -d "${TMPDIR:-/tmp}/gradus-pipeline-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

unset OPENBLAS_CORETYPE
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common=(--data "$data" --train-limit "$limit" --epochs 1 --seed 1 --threads 1 --quiet --json)
[[ -n $batch ]] && common+=(--batch "$batch")

# The binaries may be rebuilt while this runs: wait (bounded) for one that is missing.
wait_for() {
  local f=$1 i
  for ((i = 0; i < 120; i++)); do
    [[ -x $f ]] && return 0
    sleep 1
  done
  return 1
}
digest() { sha256sum "$exe" "$run" 2>/dev/null | cut -c1-12 | tr '\n' ' '; }
{ wait_for "$exe" && wait_for "$run"; } || { echo "pipeline_bench: $exe or $run is not an executable" >&2; exit 2; }

# The rows: id, label, and the command after the program's common flags.
ids=() labels=() cmds=()
add() { ids+=("$1"); labels+=("$2"); cmds+=("$3"); }
add one 'one process: `mnist_deep_mlp`' 'E'
# the ceiling of any 2-process split of this training on this machine: two independent
# one-process runs at once (no transfers, no bubble), their examples/s summed
add pair 'two independent processes at once (the ceiling)' 'P'
for m in "${f1b_ms[@]}"; do  # the default schedule: no --schedule, as a user runs it
  add "1f1b$m" "\`-np 2 --stages 2 --micro-batches $m\` (1f1b)" "R 2 --comm ring --stages 2 --micro-batches $m"
done
for m in "${gpipe_ms[@]}"; do
  add "gpipe$m" "\`-np 2 --stages 2 --micro-batches $m --schedule gpipe\`" "R 2 --comm ring --stages 2 --micro-batches $m --schedule gpipe"
done
add dp2 'data parallel 2x1: `-np 2 --comm ring`' 'R 2 --comm ring'
add hyb22 '2x2 hybrid: `-np 4 --stages 2 --micro-batches 4` (1f1b)' 'R 4 --comm ring --stages 2 --micro-batches 4'
add dp4 'data parallel 4x1: `-np 4 --comm ring`' 'R 4 --comm ring'
nrows=${#ids[@]}

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
cpus=$(lscpu | sed -n 's/^CPU(s): *//p' | head -1)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the CPUs this process may run on (nproc obeys OMP_NUM_THREADS)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
((dirty > 0)) && commit="$commit + uncommitted changes in $dirty tracked files"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
digest0=$(digest)

results=$work/results.tsv  # row index, round, rc, seconds, json or error tail (base64)
: >"$results"
for ((r = 0; r < repeats; r++)); do
  for ((k = 0; k < nrows; k++)); do
    i=$(((k + r) % nrows))
    read -r kind rest <<<"${cmds[$i]}"
    wait_for "$exe"; wait_for "$run"
    if [[ $kind == E || $kind == P ]]; then
      argv=("$exe" "${common[@]}")
    else
      read -r np flags <<<"$rest"
      # shellcheck disable=SC2206
      argv=("$run" -np "$np" "$exe" "${common[@]}" $flags)
    fi
    echo "pipeline_bench: round $((r + 1))/$repeats: ${ids[$i]}" >&2
    t0=$EPOCHREALTIME
    if [[ $kind == P ]]; then  # two at once; one JSON line: the first's, examples/s summed
      timeout 300 "$exe" "${common[@]}" >"$work/out1" 2>"$work/err" </dev/null &
      p1=$!
      timeout 300 "$exe" "${common[@]}" >"$work/out2" 2>>"$work/err" </dev/null &
      p2=$!
      wait "$p1"; rc=$?
      wait "$p2"; rc2=$?
      ((rc == 0)) && rc=$rc2
      python3 - "$work/out1" "$work/out2" >"$work/out" 2>>"$work/err" <<'PY' || rc=1
import json, sys
a, b = (json.loads([l for l in open(f) if l.startswith("{")][-1]) for f in sys.argv[1:3])
a["examples_per_second"] += b["examples_per_second"]
a["epoch_seconds"] = (a["epoch_seconds"] + b["epoch_seconds"]) / 2
print(json.dumps(a))
PY
    else
      timeout 300 "${argv[@]}" >"$work/out" 2>"$work/err" </dev/null
      rc=$?
    fi
    t1=$EPOCHREALTIME
    line=$(grep -E '^(\[0\] )?\{' "$work/out" | tail -1 | sed -E 's/^\[0\] //')
    if [[ $rc -eq 0 && -n $line ]]; then
      payload=$(printf '%s' "$line" | base64 -w0)
    else
      ((rc == 0)) && rc=-1  # exited 0 without a JSON line
      payload=$( { tail -n 6 "$work/err"; tail -n 2 "$work/out"; } | base64 -w0)
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$i" "$r" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$payload" >>"$results"
  done
done
digest1=$(digest)
load1=$(cut -d' ' -f1-3 /proc/loadavg)

printf '%s\n' "${labels[@]}" >"$work/labels"
printf '%s\n' "${ids[@]}" >"$work/ids"
python3 - "$work" "$cpu" "$cpus" "$cores" "$commit" "$started" "$load0" "$load1" "$repeats" "$limit" "${batch:-default}" \
  "$quick" "$digest0" "$digest1" "${common[*]}" <<'PY'
import base64, json, math, statistics as st, sys

(work, cpu, cpus, cores, commit, started, load0, load1, repeats, limit, batch, quick, dig0, dig1, flags) = sys.argv[1:]
cores, repeats = int(cores), int(repeats)
labels = open(f"{work}/labels").read().splitlines()
ids = open(f"{work}/ids").read().splitlines()
runs = {}  # (row, round) -> (rc, wall, json or error text)
for ln in open(f"{work}/results.tsv"):
    i, r, rc, wall, payload = ln.rstrip("\n").split("\t")
    text = base64.b64decode(payload).decode(errors="replace")
    rc = int(rc)
    runs[int(i), int(r)] = (rc, float(wall), json.loads(text) if rc == 0 else text)

avail = f"{cpus} CPUs" + (f", {cores} available to this run" if str(cores) != cpus else "")
print(f"# pipeline_bench.sh: {cpu}, {avail}; commit {commit}; {started}")
print()
print(f"Every run: `{flags}`, OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1, OPENBLAS_CORETYPE unset, "
      f"`timeout 300`; {repeats} round(s), rows alternated (each round every row once, order rotated)"
      + (" (--quick)" if quick == "1" else "") + f". Batch: {batch}. Load average {load0} before, {load1} after.")
if dig0 != dig1:
    print(f"\n**The binaries changed during the run** (sha256 {dig0}-> {dig1}): rerun.")
if cores < 4:
    print(f"\nThe -np 4 rows run 4 single-threaded ranks on {cores} CPU(s): oversubscribed, "
          "so their times measure time-sharing, not the method.")
print()

def fmt_rng(v):
    return f"{st.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if len(v) > 1 else f"{v[0]:.3f}"

def min_bytes(j):
    """What the cut must move per step: activations forward and their gradients back over the
    one cut (2 stages), 2 x rows x 512 floats, averaged over the epoch's steps of a replica
    (the last batch partial), as examples/check_pipeline.sh computes it."""
    if j.get("stages", 1) != 2:
        return None
    replicas = j["world_size"] // j["stages"]
    rows = j["train_examples"] // replicas
    steps = math.ceil(rows / j["batch"])
    return 2 * 512 * 4 * rows / steps

print("| run | s / epoch, median (range) | examples/s vs one process | accuracy | bubble (ideal) | "
      "bytes / step | vs minimum | activations held, MB per stage | rank 0 peak RSS MB |")
print("|---|---|---|---|---|---|---|---|---|")
failed = []
summary = {}
for i, label in enumerate(labels):
    ok = [runs[i, r][2] for r in range(repeats) if runs.get((i, r), (1,))[0] == 0]
    bad = [(r, runs[i, r]) for r in range(repeats) if (i, r) in runs and runs[i, r][0] != 0]
    for r, (rc, wall, err) in bad:
        why = "timed out (300 s)" if rc == 124 else f"exit {rc}" if rc > 0 else "no JSON line"
        failed.append((label, r + 1, f"{why} after {wall:.1f} s", err))
    if not ok:
        print(f"| {label} | **failed** ({len(bad)} of {repeats}) | | | | | | | |")
        continue
    secs = [j["epoch_seconds"] for j in ok]
    ratios = []
    for r in range(repeats):
        a, b = runs.get((i, r)), runs.get((0, r))
        if a and b and a[0] == 0 and b[0] == 0:
            ratios.append(a[2]["examples_per_second"] / b[2]["examples_per_second"])
    ratio = (f"{st.median(ratios):.2f}x" + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else "")
             if ratios else "n/a")
    acc = st.median(j["test_accuracy"] for j in ok)
    j0 = ok[0]
    bubble = bytes_ = vsmin = act = ""
    if "stages" in j0:
        bubble = (f"{st.median(j['bubble_fraction'] for j in ok):.3f} "
                  f"({j0['ideal_bubble_fraction']:.3f})")
        b = st.median(j["bytes_per_step"] for j in ok)
        bytes_ = f"{b:,.0f}"
        if "peak_activation_mb" in j0:  # per rank: the first replica's stages
            act = " / ".join(f"{v:.2f}" for v in j0["peak_activation_mb"][:j0["stages"]])
        mb = min_bytes(j0)
        if mb:
            vsmin = f"{b / mb:.3f}"
    rss = st.median(j["peak_rss_mb"] for j in ok)
    note = f" ({len(bad)} of {repeats} failed)" if bad else ""
    print(f"| {label} | {fmt_rng(secs)}{note} | {ratio} | {100 * acc:.2f}% | {bubble} | {bytes_} | {vsmin} | {act} | {rss:.1f} |")
    summary[ids[i]] = (st.median(ratios) if ratios else None, st.median(secs))

print()
print("Ratios: examples/s over the same round's one-process run, median over rounds (range). "
      "Bubble: the mean over ranks of each rank's idle share of its steps; ideal (S-1)/(M+S-1). "
      "Bytes / step: activations and gradients sent per step by one pipeline replica; the minimum "
      "is 2 x rows x 512 x 4 over the one cut, averaged over the epoch's steps. The data-parallel "
      "rows take 2 (4) x batch images a step, so half (a quarter) of the steps: their accuracy is "
      "not the one-process run's. Activations held: each stage's peak of the micro-batches' "
      "activations kept between their forward and backward passes (the JSON's peak_activation_mb). "
      "Peak RSS is rank 0's (stage 0, which also holds the gathered model for the test).")

g8, dp2 = summary.get("1f1b8"), summary.get("dp2")  # the goal's command: the default schedule
if g8 and g8[0] is not None:
    print()
    line = f"Issue 31's goal, `--stages 2 --micro-batches 8` (1f1b, the default) >= 1.6x one process: {g8[0]:.2f}x, " + \
           ("met" if g8[0] >= 1.6 else "not met")
    if dp2 and dp2[0] is not None:
        line += f"; beating data parallel 2x1 ({dp2[0]:.2f}x): " + ("yes" if g8[0] > dp2[0] else "no")
    print(line + ".")

if failed:
    print()
    print("## Failed runs")
    for label, r, why, err in failed:
        print(f"\n{label}, round {r}: {why}\n\n```\n{err.rstrip()}\n```")
    sys.exit(1)
PY
