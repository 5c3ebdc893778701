#!/usr/bin/env python3
"""The examples' timelines (--trace FILE, gradus-run --trace DIR), read back with Python's json.

  check_trace.py MNIST_MLP MNIST_DEEP_MLP GRADUS_RUN DATA_DIR

1. gradus-run -np 2 --trace DIR mnist_mlp --comm ring: DIR/rank-0.json, DIR/rank-1.json and
   the merged DIR/trace.json, whose two processes ("rank 0", "rank 1") each show every step's
   forward and backward pass, optimizer update and all-reduces (bytes > 0, on the all-reduce
   worker's thread) and the graph's kernels named after their nodes;
2. gradus-run -np 2 --trace DIR mnist_deep_mlp --stages 2: every send of activations or
   gradients joined to its receive on the other rank by a flow (same id, 's' then 'f');
3. mnist_mlp --trace-steps 5: the ring buffer keeps the last 5 steps only;
4. mnist_mlp --trace into a directory that is not there: refused before training, naming
   the file.
"""
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if expect_ok and p.returncode != 0:
        sys.exit(f"check_trace: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def load(path):
    with open(path) as f:
        return json.load(f)


def fail(why):
    sys.exit("check_trace: " + why)


def main():
    mlp, deep, gradus_run, data = sys.argv[1:5]
    small = ["--data", data, "--epochs", "1", "--threads", "1", "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        # 1. data parallel over the ring, merged
        d = os.path.join(tmp, "ring")
        p = run([gradus_run, "-np", "2", "--trace", d, mlp, "--comm", "ring", "--train-limit", "6000"] + small)
        if "the job's timeline" not in p.stderr:
            fail("gradus-run did not say where the merged timeline is:\n" + p.stderr)
        for f in ("rank-0.json", "rank-1.json", "trace.json"):
            if not os.path.exists(os.path.join(d, f)):
                fail(f"no {f} in {d}: {sorted(os.listdir(d))}")
        t = load(os.path.join(d, "trace.json"))
        ev = t["traceEvents"]
        names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
        if names != {0: "rank 0", 1: "rank 1"}:
            fail(f"process names {names}")
        steps = 6000 // 2 // 64  # each rank's share, in batches of 64 (the last partial one dropped)
        for pid in (0, 1):
            mine = [e for e in ev if e["pid"] == pid and e["ph"] == "X"]
            c = Counter(e["name"] for e in mine)
            for span in ("forward and backward", "optimizer update", "wait for the all-reduces"):
                if c[span] < steps:
                    fail(f"rank {pid}: {c[span]} spans '{span}', expected at least {steps}: {c.most_common(8)}")
            reduces = [e for e in mine if e["name"] == "all-reduce"]
            if len(reduces) < steps or any(e["args"]["bytes"] <= 0 for e in reduces):
                fail(f"rank {pid}: {len(reduces)} all-reduce spans, or one without bytes")
            main_tid = {e["tid"] for e in mine if e["name"] == "forward and backward"}
            if {e["tid"] for e in reduces} & main_tid:
                fail(f"rank {pid}: all-reduces on the training thread, not the worker's")
            kernels = [e for e in mine if e["cat"] == "compute"]
            if not any("matmul" in e["name"] for e in kernels):
                fail(f"rank {pid}: no kernel span named after a matmul node: {Counter(e['name'] for e in kernels)}")
            if any(e["ts"] < 0 or e["dur"] < 0 for e in mine):
                fail(f"rank {pid}: a negative time")

        # 2. a pipeline's transfers as flows
        d = os.path.join(tmp, "pipe")
        run([gradus_run, "-np", "2", "--trace", d, deep, "--stages", "2", "--micro-batches", "4",
             "--train-limit", "2000"] + small)
        ev = load(os.path.join(d, "trace.json"))["traceEvents"]
        starts = {e["id"]: e for e in ev if e["ph"] == "s"}
        ends = {e["id"]: e for e in ev if e["ph"] == "f"}
        if not starts or set(starts) != set(ends):
            fail(f"{len(starts)} flow starts, {len(ends)} ends, {len(set(starts) & set(ends))} joined")
        if any(starts[i]["pid"] == ends[i]["pid"] for i in starts):
            fail("a flow starts and ends on one rank")
        c = Counter((e["pid"], e["name"]) for e in ev if e.get("cat") == "transfer" and e["ph"] == "X")
        want = {(0, "send activations"), (1, "receive activations"), (1, "send gradients"), (0, "receive gradients")}
        if not want <= set(c):
            fail(f"transfer spans {dict(c)}")

        # 3. the ring buffer
        f = os.path.join(tmp, "five.json")
        run([mlp, "--train-limit", "3200", "--trace", f, "--trace-steps", "5"] + small)
        t = load(f)
        passes = [e for e in t["traceEvents"] if e["ph"] == "X" and e["name"] == "forward and backward"]
        if len(passes) != 5 or t["otherData"]["steps_seen"] != 50:
            fail(f"--trace-steps 5 kept {len(passes)} steps of {t['otherData']['steps_seen']}")

        # 4. a file that cannot be written
        bad = os.path.join(tmp, "no_such_dir", "t.json")
        p = run([mlp, "--train-limit", "640", "--trace", bad] + small, expect_ok=False)
        if p.returncode == 0 or bad not in p.stderr or "directory" not in p.stderr:
            fail(f"--trace {bad}: exit {p.returncode}, said:\n{p.stderr}")
    print("check_trace: ok")


if __name__ == "__main__":
    main()
