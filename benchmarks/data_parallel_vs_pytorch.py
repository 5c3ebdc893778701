#!/usr/bin/env python3
"""Data-parallel MNIST MLP: gradus' ring all-reduce against PyTorch DDP (gloo), in one run.

The model is mnist_vs_pytorch.py's MLP (784-256-128-10 ReLU, softmax cross-entropy, SGD lr
0.05 momentum 0.9, float32, the IDX files preloaded in memory), batch 64 per rank. Six
configurations, each a fresh set of processes, one thread per process:

  gradus 1x1   <build>/examples/mnist_mlp --comm local --threads 1
  gradus 2x1   <build>/tools/gradus-run/gradus-run -np 2 <mnist_mlp> --comm ring --threads 1
               (the ring's default transport: shared memory between processes on one host)
  gradus-mpi 2x1  mpirun -np 2 <mnist_mlp> --comm mpi --threads 1 (where Open MPI's mpirun
               is installed; the example must be built with MPI)
  gradus-apart 2x1  two `mnist_mlp --comm local --threads 1 --train-limit 30000` at once, no
               communication: each trains on half the data alone, so the pair's epoch (the
               slower one's) is the ceiling of 2x1 on this machine (the speed-up two cores give
               with nothing shared but the memory system)
  torch 1x1    one process, torch.set_num_threads(1)
  torch 2x1    two processes, torch.nn.parallel.DistributedDataParallel, gloo backend over
               tcp://127.0.0.1, torch.set_num_threads(1) in each

Data parallelism as gradus' trainer does it: every rank shuffles the epoch with the same
seed and rank r takes examples r, r+2, ... of the shuffle (DistributedSampler's sharding),
in batches of 64, so a step sees a global batch of 128 and an epoch is 469 steps instead of
938. Gradients are averaged (DDP: one all-reduce per bucket during backward; gradus: buckets
of --bucket-mb, default 25 MiB, all-reduced on a background thread).

Seconds per epoch count the training loop only (evaluation excluded; for DDP the slower
rank's); samples/s = 60,000 / (s/epoch), the whole job's throughput; test accuracy (10,000
images) after the last epoch, from rank 0. For R rounds (seed = round number, the same for
every configuration of the round) the configurations run one after another in an order that
rotates every round, so background load on a shared machine hits all alike. The table gives
medians over the rounds, the speed-up of 2 processes over the same framework's 1 process
(issue 14's target for gradus over shared memory: >= 1.5x samples/s, goal 1.8x, accuracy within 0.5 points), gradus'
comm_wait_seconds (rank 0's time waiting in collectives per epoch) and the CPU that other
processes used meanwhile.

  /usr/bin/python3 benchmarks/data_parallel_vs_pytorch.py                  # 3 rounds, 1 epoch: ~1 min
  /usr/bin/python3 benchmarks/data_parallel_vs_pytorch.py --epochs 3 --only gradus

PyTorch comes from Debian's python3-torch (1.13), which /usr/bin/python3 imports; when the
python3 on PATH cannot import torch, the script re-runs itself with /usr/bin/python3. Every
subprocess has a timeout (--timeout); nothing in the build or CI needs this script.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mnist_vs_pytorch import busy_cpu_seconds, children_cpu_seconds, last_json, load_idx, wait_for_idle  # noqa: E402

CONFIGS = ["gradus 1x1", "gradus 2x1", "gradus-mpi 2x1", "gradus-apart 2x1", "torch 1x1", "torch 2x1"]
SPEEDUP_TARGET = 1.5  # issue 14 (shared memory); its goal beyond: 1.8x. Issue 5 asked 1.7x over ZeroMQ
ACC_POINTS = 0.5
TRAIN_N = 60000


# ---------------------------------------------------------------- PyTorch worker (one rank)
def torch_worker(a):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn

    rank, world = a.rank, a.world
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    d = a.data
    tx = load_idx(f"{d}/train-images-idx3-ubyte").reshape(-1, 784)
    ty = load_idx(f"{d}/train-labels-idx1-ubyte")
    vx = load_idx(f"{d}/t10k-images-idx3-ubyte").reshape(-1, 784)
    vy = load_idx(f"{d}/t10k-labels-idx1-ubyte")
    train_x = torch.from_numpy(tx.astype(np.float32) / 255.0)
    train_y = torch.from_numpy(ty.astype(np.int64))
    test_x = torch.from_numpy(vx.astype(np.float32) / 255.0)
    test_y = torch.from_numpy(vy.astype(np.int64))

    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    net = model
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def accuracy():
        model.eval()
        hits = 0
        with torch.no_grad():
            for i in range(0, test_x.shape[0], 1000):
                hits += (model(test_x[i: i + 1000]).argmax(1) == test_y[i: i + 1000]).sum().item()
        model.train()
        return hits / test_x.shape[0]

    n, b = train_x.shape[0], a.batch
    seconds, losses = [], []
    for e in range(a.epochs):
        g = torch.Generator()
        g.manual_seed(a.seed * 1000003 + e)
        perm = torch.randperm(n, generator=g)[rank::world]  # rank r: examples r, r+world, ...
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        total, steps = 0.0, 0
        for i in range(0, perm.shape[0], b):
            idx = perm[i: i + b]
            xb, yb = train_x.index_select(0, idx), train_y.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()
            steps += 1
        dt = time.perf_counter() - t0
        if world > 1:  # the job's epoch ends with its slower rank
            t = torch.tensor([dt], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            dt = t.item()
        seconds.append(dt)
        losses.append(total / steps)
    acc = accuracy()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"epoch_seconds": seconds, "test_accuracy": acc, "loss": losses, "steps": steps,
                          "torch": torch.__version__}), flush=True)


# ---------------------------------------------------------------- runners
def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_procs(cmds, env, timeout):
    """Starts every command (each in its own session), waits for all up to timeout seconds;
    on a timeout or a failure kills every process group still running. Returns the stdouts."""
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for c in cmds]
    outs, deadline, failed = [], time.time() + timeout, None
    try:
        for p, c in zip(procs, cmds):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                failed = f"timed out after {timeout:.0f} s: {' '.join(c)}"
                break
            if p.returncode != 0:
                sys.stderr.write(err)
                failed = f"exit status {p.returncode}: {' '.join(c)}"
                break
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    if failed:
        raise RuntimeError(failed)
    return outs


def base_env():
    # one thread per process everywhere; passive OpenMP waits (as mnist_vs_pytorch.py)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG",
              "GRADUS_CLUSTER"):
        env.pop(k, None)  # no launcher's leftovers
    return env


def run_torch(a, world, seed):
    port = free_port()
    cmds = [[sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r), "--world", str(world),
             "--port", str(port), "--seed", str(seed), "--epochs", str(a.epochs), "--data", a.data,
             "--batch", str(a.batch)] for r in range(world)]
    r = last_json(run_procs(cmds, base_env(), a.timeout)[0])
    return {"epoch_seconds": statistics.mean(r["epoch_seconds"]), "acc": r["test_accuracy"],
            "comm_wait": float("nan"), "version": r["torch"], "steps": r["steps"]}


def run_gradus(a, world, seed, comm="ring"):
    exe = os.path.join(a.gradus_build, "examples", "mnist_mlp")
    cmd = [exe, "--json", "--quiet", "--data", a.data, "--epochs", str(a.epochs), "--seed", str(seed),
           "--batch", str(a.batch), "--threads", "1"]
    if world == 1:
        cmd += ["--comm", "local"]
    elif comm == "apart":  # world processes, each alone on its 1/world of the data
        half = cmd + ["--comm", "local", "--train-limit", str(TRAIN_N // world)]
        rs = [last_json(out) for out in run_procs([half] * world, base_env(), a.timeout)]
        return {"epoch_seconds": max(r["epoch_seconds"] for r in rs), "acc": float("nan"), "comm_wait": float("nan")}
    elif comm == "mpi":  # Open MPI's mpirun; --tag-output marks rank 0's lines "[1,0]<stdout>:"
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", str(world)] + cmd + ["--comm", "mpi"]
        out = run_procs([cmd], base_env(), a.timeout)[0]
        tag = re.compile(r"^\[\d+,0\]<std(out|err)>:")
        out = "\n".join(tag.sub("", line) for line in out.splitlines() if tag.match(line))
        r = last_json(out)
        return {"epoch_seconds": r["epoch_seconds"], "acc": r["test_accuracy"],
                "comm_wait": r.get("comm_wait_seconds", float("nan"))}
    else:
        cmd = [os.path.join(a.gradus_build, "tools", "gradus-run", "gradus-run"), "-np", str(world)] + cmd + \
              ["--comm", "ring"] + (["--comm-transport", a.gradus_transport] if a.gradus_transport else [])
    out = run_procs([cmd], base_env(), a.timeout)[0]
    if world > 1:  # rank 0's lines carry the prefix "[0] "
        out = "\n".join(line[4:] for line in out.splitlines() if line.startswith("[0] "))
    r = last_json(out)
    if r.get("world_size") != world:
        raise RuntimeError(f"gradus ran with world_size {r.get('world_size')}, not {world}: {' '.join(cmd)}")
    return {"epoch_seconds": r["epoch_seconds"], "acc": r["test_accuracy"],
            "comm_wait": r.get("comm_wait_seconds", float("nan"))}  # already per epoch


def measured(run):
    """run() plus 'background': the CPU other processes used meanwhile, in cores."""
    b0, c0, t0 = busy_cpu_seconds(), children_cpu_seconds(), time.perf_counter()
    r = run()
    b1, c1, wall = busy_cpu_seconds(), children_cpu_seconds(), time.perf_counter() - t0
    if b0 is not None and b1 is not None and wall > 0:
        r["background"] = max(0.0, ((b1 - b0) - (c1 - c0)) / wall)
    r["loadavg"] = os.getloadavg()[0]
    return r


# ---------------------------------------------------------------- table
def baseline(fw, have):
    """The 1-process configuration a 2x1 configuration of framework fw is compared with."""
    own = f"{fw} 1x1"
    return own if own in have else ("gradus 1x1" if fw.startswith("gradus") and "gradus 1x1" in have else None)


def median(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(x, spec, suffix=""):
    return "—" if x is None or x != x else format(x, spec) + suffix


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all configurations (medians over them)")
    ap.add_argument("--epochs", type=int, default=1, help="training epochs per run")
    ap.add_argument("--gradus-build", default=os.path.join(ROOT, "build", "ci"), help="gradus' build directory")
    ap.add_argument("--gradus-transport", default="", help="the ring's --comm-transport (default: the example's, auto)")
    ap.add_argument("--only", default="", help="run only these frameworks: gradus, torch, or both (default)")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "mnist"), help="the MNIST IDX files")
    ap.add_argument("--batch", type=int, default=64, help="per-rank batch")
    ap.add_argument("--timeout", type=float, default=600, help="seconds any one run may take")
    ap.add_argument("--idle-wait", type=float, default=30,
                    help="before each round, wait up to this many seconds for idle cores (0: don't)")
    ap.add_argument("--json-out", help="also write every measurement to this JSON file")
    # worker mode (internal): one PyTorch rank
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.data = os.path.abspath(a.data)
    a.gradus_build = os.path.abspath(a.gradus_build)
    if a.worker:
        return torch_worker(a)

    configs = [c for c in CONFIGS if not a.only or c.split()[0].startswith(a.only)]
    if "gradus-mpi 2x1" in configs and shutil.which("mpirun") is None:
        configs.remove("gradus-mpi 2x1")  # no Open MPI here
    if not configs:
        raise SystemExit(f"--only {a.only}: gradus or torch")
    for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        if not os.path.exists(os.path.join(a.data, f)):
            raise SystemExit(f"no {f} in {a.data}: run tools/fetch-mnist.sh first")
    if any(c.startswith("gradus") for c in configs):
        for exe in ("examples/mnist_mlp", "tools/gradus-run/gradus-run"):
            if not os.access(os.path.join(a.gradus_build, exe), os.X_OK):
                raise SystemExit(f"no {a.gradus_build}/{exe}: cmake --build {a.gradus_build} --target mnist_mlp gradus-run")
    if any(c.startswith("torch") for c in configs):
        try:
            import torch  # noqa: F401
        except ImportError:
            if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
                print(f"{sys.executable} cannot import torch: re-running with /usr/bin/python3", file=sys.stderr)
                os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
            raise SystemExit("cannot import torch (Debian: apt-get install python3-torch), or pass --only gradus")

    runs = {c: [] for c in configs}
    load_start = os.getloadavg()
    for rnd in range(a.rounds):
        seed = rnd + 1
        if a.idle_wait > 0:
            load = wait_for_idle(a.idle_wait)
            if load is not None and load >= 0.2:
                print(f"  (the cores are still busy after {a.idle_wait:.0f} s: {load:.2f} cores in use)", file=sys.stderr)
        k = rnd % len(configs)
        order = configs[k:] + configs[:k]  # rotate: every configuration takes every position
        print(f"round {rnd + 1}, seed {seed}, {a.epochs} epoch(s): {', '.join(order)}", file=sys.stderr, flush=True)
        for c in order:
            fw, shape = c.split()
            world = int(shape.split("x")[0])
            comm = {"gradus-mpi": "mpi", "gradus-apart": "apart"}.get(fw, "ring")
            run = (lambda: run_gradus(a, world, seed, comm)) if fw.startswith("gradus") \
                else (lambda: run_torch(a, world, seed))
            r = measured(run)
            r["seed"] = seed
            runs[c].append(r)
            print(f"  {c}: {r['epoch_seconds']:.3f} s/epoch, {TRAIN_N / r['epoch_seconds']:.0f} samples/s, "
                  f"test accuracy {r['acc']:.4f}" + (f", comm wait {r['comm_wait']:.3f} s/epoch" if fw.startswith("gradus") and world > 1 else "")
                  + f", other processes {r.get('background', float('nan')):.2f} cores, load avg {r['loadavg']:.2f}",
                  file=sys.stderr, flush=True)
    load_end = os.getloadavg()

    version = next((r["version"] for c in configs for r in runs[c] if "version" in r), None)
    print(f"\nMNIST MLP, per-rank batch {a.batch}, 1 thread per process, {a.epochs} epoch(s), {a.rounds} rounds "
          f"(medians); gradus {a.gradus_build}" + (f"; PyTorch {version}, DDP gloo over 127.0.0.1" if version else "")
          + "\n")
    print("| config | s / epoch | samples / s | speed-up vs 1 process | test accuracy | vs 1 process | comm wait s / epoch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    med = {c: {"s": median([r["epoch_seconds"] for r in runs[c]]), "acc": median([r["acc"] for r in runs[c]]),
               "wait": median([r["comm_wait"] for r in runs[c]])} for c in configs}
    verdicts = []
    for c in configs:
        fw, shape = c.split()
        one = med.get(baseline(fw, med))
        m = med[c]
        sp = one["s"] / m["s"] if one else float("nan")
        dacc = (m["acc"] - one["acc"]) * 100 if one else float("nan")
        label = {"gradus 1x1": "gradus, 1 rank x 1 thread (local)",
                 "gradus 2x1": "gradus, 2 ranks x 1 thread (ring, transport auto: shm on one host)",
                 "gradus-mpi 2x1": "gradus, 2 ranks x 1 thread (--comm mpi, Open MPI)",
                 "gradus-apart 2x1": "gradus, 2 processes x 1 thread apart (half the data each, no communication: the ceiling)",
                 "torch 1x1": "PyTorch, 1 process x 1 thread", "torch 2x1": "PyTorch DDP, 2 processes x 1 thread (gloo)"}[c]
        print(f"| {label} | {fmt(m['s'], '.3f')} | {fmt(TRAIN_N / m['s'], ',.0f')} | {fmt(sp, '.2f', 'x')} "
              f"| {fmt(m['acc'] * 100, '.2f', '%')} | {fmt(dacc, '+.2f', ' points') if shape != '1x1' else '—'} "
              f"| {fmt(m['wait'], '.3f') if fw.startswith('gradus') else '—'} |")
        if c == "gradus 2x1" and one:
            verdicts.append(f"issue 14 target, gradus 2x1: samples/s {sp:.2f}x of 1x1 (target ≥ {SPEEDUP_TARGET}x: "
                            f"{'met' if sp >= SPEEDUP_TARGET else 'missed'}), test accuracy {dacc:+.2f} points "
                            f"(target ≥ −{ACC_POINTS}: {'met' if dacc >= -ACC_POINTS else 'missed'})")
    print()
    for v in verdicts:
        print(v)
    for c in configs:
        if c.endswith("2x1"):
            fw = c.split()[0]
            base = baseline(fw, runs)
            if base:
                per = [f"{o['epoch_seconds'] / t['epoch_seconds']:.2f}x" for o, t in zip(runs[base], runs[c])]
                acc = [f"{(t['acc'] - o['acc']) * 100:+.2f}" for o, t in zip(runs[base], runs[c])]
                print(f"{c} per round (paired by seed): speed-up {', '.join(per)}"
                      + (f"; accuracy {', '.join(acc)} points" if fw != "gradus-apart" else ""))
    bg = [r["background"] for c in configs for r in runs[c] if "background" in r]
    if bg:
        print(f"Other processes' CPU during the runs: median {statistics.median(bg):.2f}, max {max(bg):.2f} cores "
              f"(of {os.cpu_count()}); 1-minute load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end.")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"args": vars(a), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
