#!/usr/bin/env python3
"""mnist_mlp's epoch on idle cores and with other processes holding cores, per threading policy.

Each run is `<build>/examples/mnist_mlp --threads 2 --epochs E --json --quiet` (the whole
60,000 training images unless --train-limit), and its epoch_seconds (training only) is
what counts. Loads: idle; one core busy; two cores busy (a compiler's -j2), each core
held by a spinning child process this script starts and ends by PID. Policies:

  adaptive      the default (GRADUS_ADAPTIVE_THREADS=1): the team follows the free cores (cpu_simd/threads.hpp)
  fixed         GRADUS_ADAPTIVE_THREADS=0: a team of --threads whatever the load (the default until aaafe7a)
  passive       fixed + OMP_WAIT_POLICY=passive (threads sleep at once at a barrier)
  spin10k       fixed + GOMP_SPINCOUNT=10000 (a bounded spin)
  1-thread      --threads 1

The runs go in rounds, each round every (policy, load) once in a rotated order, so drifting
background load hits all alike; the table gives medians, the busy/idle ratios (target: the
default's one-core-busy epoch within 2x of its idle one) and each idle epoch against the
fixed team's (target: the default loses no more than 5%).

  benchmarks/busy_machine.py --build build-bench --rounds 5
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

POLICIES = {
    "adaptive": ({"GRADUS_ADAPTIVE_THREADS": "1"}, 2),
    "fixed": ({"GRADUS_ADAPTIVE_THREADS": "0"}, 2),
    "passive": ({"GRADUS_ADAPTIVE_THREADS": "0", "OMP_WAIT_POLICY": "passive"}, 2),
    "spin10k": ({"GRADUS_ADAPTIVE_THREADS": "0", "GOMP_SPINCOUNT": "10000"}, 2),
    "1-thread": ({}, 1),
}
LOADS = {"idle": 0, "1 busy": 1, "2 busy": 2}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(exe, policy, spinners, a):
    extra, threads = POLICIES[policy]
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)  # users' machines do not set it
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "GRADUS_ADAPTIVE_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(k, None)
    env.update(extra)
    kids = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
    try:
        cmd = [exe, "--threads", str(threads), "--epochs", str(a.epochs), "--json", "--quiet", "--data", a.data]
        if a.train_limit:
            cmd += ["--train-limit", str(a.train_limit)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout, check=True).stdout
    finally:
        for k in kids:
            k.kill()
            k.wait()
    return json.loads(out.strip().splitlines()[-1])["epoch_seconds"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    p.add_argument("--data", default=os.path.join(ROOT, "data", "mnist"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--loads", default=",".join(LOADS))
    a = p.parse_args()
    exe = os.path.join(a.build, "examples", "mnist_mlp")
    policies = a.policies.split(",")
    loads = a.loads.split(",")
    cells = [(pol, ld) for pol in policies for ld in loads]
    times = {c: [] for c in cells}
    for r in range(a.rounds):
        order = cells[r % len(cells):] + cells[: r % len(cells)]
        for pol, ld in order:
            t = run(exe, pol, LOADS[ld], a)
            times[(pol, ld)].append(t)
            print(f"round {r + 1}: {pol:9s} {ld:7s} {t:.3f} s/epoch", file=sys.stderr, flush=True)
    med = {c: statistics.median(v) for c, v in times.items()}
    print(f"mnist_mlp, --threads 2 (1-thread: 1), {a.epochs} epochs of "
          f"{a.train_limit or 60000} images; {cpu_model()}, {os.cpu_count()} CPUs; medians of {a.rounds} rounds")
    print()
    print("| policy | " + " | ".join(f"{ld} (s/epoch)" for ld in loads) + " | " +
          " | ".join(f"{ld} / idle" for ld in loads if ld != "idle") + " | idle vs fixed |")
    print("|---" * (1 + len(loads) + len(loads) - 1 + 1) + "|")
    for pol in policies:
        row = [f"{med[(pol, ld)]:.3f}" for ld in loads]
        ratios = [f"{med[(pol, ld)] / med[(pol, 'idle')]:.2f}x" for ld in loads if ld != "idle"] if "idle" in loads else []
        vs = f"{med[(pol, 'idle')] / med[('fixed', 'idle')]:.2f}x" if "idle" in loads and "fixed" in policies else "-"
        print(f"| {pol} | " + " | ".join(row) + " | " + " | ".join(ratios) + f" | {vs} |")
    print()
    print("per round: " + json.dumps({f"{p_}/{l_}": [round(x, 3) for x in v] for (p_, l_), v in times.items()}))


if __name__ == "__main__":
    main()
