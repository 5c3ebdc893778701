#!/usr/bin/env bash
# Time to accuracy (issue 13, benchmark 2): mnist_mlp on 2 workers, through the ring
# all-reduce and through 2 parameter servers in each consistency mode (async, bsp, ssp:4),
# without and with a straggler (--slow-rank 1 --slow-ms = one step's compute), to TARGET
# test accuracy (default 0.96).
#
#   benchmarks/ps_time_to_accuracy.sh [BUILD_DIR]        # default build/ci
#
# Environment: REPS (rounds, default 3), EPOCHS (default 3), TARGET (default 0.96),
# SLOW_MS (the straggler's pause; default: measured, see below), SLOW_MS2 (optional: a
# second, heavier straggler, e.g. one parameter-server step's wall time; its rows are
# added), OUT (directory for the per-run metrics CSVs, JSON lines and logs; default a
# fresh mktemp -d), SLOW_RANK (default 1; -2: every rank) and SLOW_PROB (default 1: each
# step; below 1 a rank pauses in a step at random — transient stragglers, SSP's case),
# MODES (default "ring async bsp ssp:4"), LEVELS (default "none slow").
#
# 1. One step's compute: mnist_mlp alone, one epoch on the 2-worker shard
#    (--train-limit 30000: 469 steps of 64), --threads 1, three times; the median
#    epoch_seconds / 469 is --slow-ms (unless SLOW_MS is given).
# 2. REPS rounds; each round runs the 8 configurations once, one after the other, in an
#    order rotated by one per round (so a burst of background load does not land on one
#    configuration only):
#      gradus-run -np 2 [--ps 2] mnist_mlp --comm ring|ps [--consistency async|bsp|ssp:4]
#                 --epochs EPOCHS --threads 1 --metrics FILE --json
#                 [--slow-rank 1 --slow-ms SLOW_MS]
# 3. Per configuration (medians over the rounds): test accuracy after each epoch, the
#    epochs to TARGET, and the seconds to TARGET, with a granularity of one epoch (the chief
#    evaluates after every epoch only), counted two ways:
#    - "launch to accuracy": from starting gradus-run to the chief's line that reports the
#      first test accuracy >= TARGET (every line of the job's output is time-stamped as it
#      arrives): the wall clock a user waits, start-up, data loading, the epoch-end pull of
#      the servers' state and the evaluations included;
#    - "training": the sum, over the epochs up to that one, of the slowest rank's training
#      seconds (each rank prints its epoch's training seconds; without --quiet). The
#      chief's own train_seconds from --metrics is not used for this: under async or SSP
#      the chief finishes its steps early and then waits at the epoch-end barrier for the
#      straggler, whose steps are part of the model it evaluates.
#    Also the chief's train_seconds over all epochs and the whole command's wall clock.
#    --quiet is not passed (the per-rank epoch lines need it off); the chief's progress
#    lines on a pipe are a few per epoch.
# Prints a markdown table and one JSON line per configuration.
#
# Every process runs one thread (--threads 1, OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1);
# OPENBLAS_CORETYPE is removed from the environment so OpenBLAS picks its kernels itself.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build/ci}
mlp=$build/examples/mnist_mlp
run=$build/tools/gradus-run/gradus-run
data=${DATA:-$here/data/mnist}
REPS=${REPS:-3}
EPOCHS=${EPOCHS:-3}
TARGET=${TARGET:-0.96}
OUT=${OUT:-$(mktemp -d -t gradus-tta.XXXXXX)}
mkdir -p "$OUT"
for f in "$mlp" "$run"; do [[ -x $f ]] || { echo "ps_time_to_accuracy.sh: $f not built" >&2; exit 1; }; done

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unset OPENBLAS_CORETYPE

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $cpu, $(nproc --all) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# runs in $OUT"

# ---- 1. one step's compute
if [[ -z ${SLOW_MS:-} ]]; then
  for i in 1 2 3; do
    "$mlp" --data "$data" --epochs 1 --threads 1 --train-limit 30000 --json --quiet >"$OUT/alone.$i.json"
  done
  SLOW_MS=$(python3 - "$OUT" <<'EOF'
import json, statistics, sys
s = statistics.median(json.load(open(f"{sys.argv[1]}/alone.{i}.json"))["epoch_seconds"] for i in (1, 2, 3))
print(f"{s / 469 * 1000:.2f}")
EOF
)
  echo "# one step's compute (mnist_mlp alone, 469 steps of 64, median of 3): $SLOW_MS ms -> --slow-ms $SLOW_MS"
else
  echo "# --slow-ms $SLOW_MS (given)"
fi

# ---- 2. the runs
read -r -a levels <<<"${LEVELS:-none slow}"
[[ -n ${SLOW_MS2:-} ]] && levels+=(slow2)
read -r -a modes <<<"${MODES:-ring async bsp ssp:4}"
configs=()
for l in "${levels[@]}"; do for m in "${modes[@]}"; do configs+=("$m|$l"); done; done
n=${#configs[@]}
for ((r = 1; r <= REPS; ++r)); do
  for ((i = 0; i < n; ++i)); do
    c=${configs[(i + r - 1) % n]}
    mode=${c%|*} strag=${c#*|}
    tag=${mode/:/}.$strag.$r
    args=(--data "$data" --epochs "$EPOCHS" --threads 1 --metrics "$OUT/$tag.csv" --json)
    if [[ $mode == ring ]]; then
      launch=("$run" -np 2 "$mlp" --comm ring)
    else
      launch=("$run" -np 2 --ps 2 "$mlp" --comm ps --consistency "$mode")
    fi
    [[ $strag == slow ]] && args+=(--slow-rank "${SLOW_RANK:-1}" --slow-ms "$SLOW_MS" --slow-prob "${SLOW_PROB:-1}")
    [[ $strag == slow2 ]] && args+=(--slow-rank "${SLOW_RANK:-1}" --slow-ms "$SLOW_MS2" --slow-prob "${SLOW_PROB:-1}")
    rm -f "$OUT/$tag.csv"
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s.%N)
    "${launch[@]}" "${args[@]}" 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$OUT/$tag.log"
    t1=$(date +%s.%N)
    grep -o '{.*}' "$OUT/$tag.log" | tail -1 >"$OUT/$tag.json"
    echo "{\"wall_seconds\": $(awk "BEGIN { print $t1 - $t0 }"), \"start\": $t0, \"load\": $load}" >"$OUT/$tag.wall.json"
    echo "# round $r: $mode, straggler $strag: $(awk "BEGIN { printf \"%.4f\", $t1 - $t0 }") s" >&2
  done
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 3. the table
python3 - "$OUT" "$REPS" "$EPOCHS" "$TARGET" "$SLOW_MS" "${SLOW_MS2:-}" "${SLOW_RANK:-1}" "${SLOW_PROB:-1}" <<'EOF'
import csv, json, re, statistics, sys
out, reps, epochs, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
slow_rank, slow_prob = int(sys.argv[7]), float(sys.argv[8])
pause = {"none": 0.0, "slow": float(sys.argv[5])}
if sys.argv[6]:
    pause["slow2"] = float(sys.argv[6])
med = statistics.median
rows = []
print()
print(f"| mode | straggler | test accuracy per epoch (median of {reps}) | epochs to {target:.0%} | s to {target:.0%}, launch to accuracy | s to {target:.0%}, training (slowest rank) | chief's training s, {epochs} epochs | command wall s |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for strag in pause:
    for mode in ("ring", "async", "bsp", "ssp:4"):
        acc, to_ep, to_s, to_wall, train, wall = [], [], [], [], [], []
        for r in range(1, reps + 1):
            tag = f"{mode.replace(':', '')}.{strag}.{r}"
            m = list(csv.DictReader(open(f"{out}/{tag}.csv")))
            a = [float(x["test_accuracy"]) for x in m]
            t = [float(x["train_seconds"]) for x in m]
            acc.append(a)
            train.append(sum(t))
            w = json.load(open(f"{out}/{tag}.wall.json"))
            wall.append(w["wall_seconds"])
            slowest, evaluated = [0.0] * epochs, [None] * epochs
            for line in open(f"{out}/{tag}.log"):
                if m_ := re.match(r"(\S+) \[\d+\] \S+: rank \d+ of \d+: epoch (\d+): (\S+) s training", line):
                    e = int(m_.group(2)) - 1
                    slowest[e] = max(slowest[e], float(m_.group(3)))
                elif m_ := re.match(r"(\S+) \[0\] epoch (\d+)/\d+ .*test_accuracy", line):
                    evaluated[int(m_.group(2)) - 1] = float(m_.group(1)) - w["start"]
            hit = next((k for k, v in enumerate(a) if v >= target), None)
            if hit is not None:
                to_ep.append(hit + 1)
                to_s.append(sum(slowest[: hit + 1]))
                to_wall.append(evaluated[hit])
        acc_med = [med(a[e] for a in acc) for e in range(epochs)]
        reached = len(to_ep)
        label = "ring all-reduce" if mode == "ring" else f"ps {mode}"
        who = "every rank" if slow_rank == -2 else f"rank {slow_rank}"
        s_label = (f"{who} +{pause[strag]:g} ms/step" + (f" with p {slow_prob:g}" if slow_prob < 1 else "")) if pause[strag] else "none"
        ep_txt = f"{med(to_ep):g}" + ("" if reached == reps else f" ({reached}/{reps} runs)") if to_ep else f"not reached (0/{reps})"
        s_txt = f"{med(to_s):.2f}" if to_s else "-"
        w_txt = f"{med(to_wall):.2f}" if to_wall else "-"
        print(f"| {label} | {s_label} | {' / '.join(f'{v:.4f}' for v in acc_med)} | {ep_txt} | {w_txt} | {s_txt} | {med(train):.2f} | {med(wall):.2f} |")
        rows.append({"benchmark": "ps_time_to_accuracy", "mode": mode, "straggler": pause[strag] > 0,
                     "slow_ms": pause[strag], "slow_rank": slow_rank, "slow_prob": slow_prob, "target": target, "rounds": reps,
                     "test_accuracy_per_epoch_median": acc_med, "test_accuracy_per_epoch_runs": acc,
                     "runs_reaching_target": reached, "epochs_to_target_median": med(to_ep) if to_ep else None,
                     "seconds_launch_to_target_median": med(to_wall) if to_wall else None, "seconds_launch_to_target_runs": to_wall,
                     "training_seconds_to_target_median": med(to_s) if to_s else None, "training_seconds_to_target_runs": to_s,
                     "chief_train_seconds_median": med(train), "chief_train_seconds_runs": train,
                     "wall_seconds_median": med(wall), "wall_seconds_runs": wall})
print()
for j in rows:
    print(json.dumps(j))
EOF
