#!/usr/bin/env python3
"""MNIST training: gradus' examples against the same models in PyTorch, in one run.

Models (batch 64, float32, the data preloaded in memory from the IDX files):
  mlp   784-256-128-10 ReLU, SGD lr 0.05 momentum 0.9           (gradus: mnist_mlp)
  cnn   LeNet-5: conv 1->6 5x5, ReLU, maxpool 2, conv 6->16 5x5, ReLU, maxpool 2,
        dense 256->120->84->10 (ReLU between), same SGD         (gradus: mnist_cnn)
  lstm  LSTM(128) over 28 steps of 28 pixels -> dense 10, Adam 1e-3  (gradus: seq_mnist_lstm)

Each (model, seed, framework) runs in its own process, so peak RSS is that run's alone:
PyTorch with torch.set_num_threads(2) and OPENBLAS_NUM_THREADS=1, gradus as
`<build>/examples/<name> --json --threads 2 --metrics <tmp>.csv`. It measures seconds per
training epoch (evaluation excluded), test accuracy (10,000 images) after the epochs the
targets name (mlp: 1 and 3, cnn: 1, lstm: 2), and peak RSS; over 3 seeds, the median.
The two frameworks alternate run by run, so background load on a shared machine hits
both alike. The table gives gradus / PyTorch and the targets: epoch time <= 0.5x PyTorch
(mlp), <= 0.7x (cnn, lstm); accuracy no more than 0.5 points below PyTorch's median;
peak RSS <= 0.5x.

  benchmarks/mnist_vs_pytorch.py                         # everything: ~15-25 min on 2 cores
  benchmarks/mnist_vs_pytorch.py --models mlp --seeds 1 --epochs 1   # a quick look
  benchmarks/mnist_vs_pytorch.py --no-gradus             # PyTorch alone
  benchmarks/mnist_vs_pytorch.py --cuda                  # on a GPU: the examples' _cuda twins
                                                         # against PyTorch on the same GPU

With --cuda, gradus runs `<build>/examples/<name>_cuda` (built where nvcc is found; or
`--exe-dir DIR/<name>_cuda`, e.g. a GPU bundle's bin/) and PyTorch moves the model and the
whole data set to the GPU once, batches by index_select there, and reads the loss every step
(as the examples do). The targets are then the GPU's (issue 29): epoch time <= 0.5x PyTorch
eager for mlp and cnn (lstm: reported), accuracy within 0.5 points; beside peak RSS each
side's peak device memory is reported: gradus' allocator's most reserved bytes
(`peak_device_mb` of the example's JSON) and torch.cuda.max_memory_reserved() (neither counts
the CUDA context or the libraries' own workspaces). A PyTorch without CUDA runs on the CPU
instead, and the table says so: the comparison is then against the CPU figures.

PyTorch comes from Debian's python3-torch (1.13), which /usr/bin/python3 imports; when the
python3 on PATH cannot import torch, the script re-runs itself with /usr/bin/python3.
Nothing in the build or CI needs this script or torch.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRADUS_EXAMPLE = {"mlp": "mnist_mlp", "cnn": "mnist_cnn", "lstm": "seq_mnist_lstm"}
DEFAULT_EPOCHS = {"mlp": 3, "cnn": 1, "lstm": 2}
ACC_EPOCHS = {"mlp": [1, 3], "cnn": [1], "lstm": [2]}  # the epochs whose accuracy is compared
TIME_TARGET = {"mlp": 0.5, "cnn": 0.7, "lstm": 0.7}
CUDA_TIME_TARGET = {"mlp": 0.5, "cnn": 0.5, "lstm": None}  # on a GPU (issue 29): lstm has none
RSS_TARGET = 0.5
ACC_POINTS = 0.5


# ---------------------------------------------------------------- PyTorch worker
def load_idx(path):
    import numpy as np

    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SystemExit(f"{path}: not a uint8 IDX file")
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * k: 8 + 4 * k], "big") for k in range(rank)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank)
    return data.reshape(dims)


def torch_worker(a):
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device("cuda" if a.cuda and torch.cuda.is_available() else "cpu")
    d = a.data
    tx = load_idx(f"{d}/train-images-idx3-ubyte").reshape(-1, 784)
    ty = load_idx(f"{d}/train-labels-idx1-ubyte")
    vx = load_idx(f"{d}/t10k-images-idx3-ubyte").reshape(-1, 784)
    vy = load_idx(f"{d}/t10k-labels-idx1-ubyte")
    if a.train_limit:
        tx, ty = tx[: a.train_limit], ty[: a.train_limit]
    train_x = torch.from_numpy(tx.astype(np.float32) / 255.0).to(dev)
    train_y = torch.from_numpy(ty.astype(np.int64)).to(dev)
    test_x = torch.from_numpy(vx.astype(np.float32) / 255.0).to(dev)
    test_y = torch.from_numpy(vy.astype(np.int64)).to(dev)

    class LSTMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(28, 128, batch_first=True)
            self.fc = nn.Linear(128, 10)

        def forward(self, x):
            out, _ = self.lstm(x.view(-1, 28, 28))
            return self.fc(out[:, -1])

    if a.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    elif a.model == "cnn":
        model = nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        model = LSTMNet()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model = model.to(dev)
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
    seconds, accs, losses = [], [], []
    for e in range(a.epochs):
        g = torch.Generator()
        g.manual_seed(a.seed * 1000003 + e)
        perm = torch.randperm(n, generator=g).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        total, steps = 0.0, 0
        for i in range(0, n, b):
            idx = perm[i: i + b]
            xb, yb = train_x.index_select(0, idx), train_y.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()  # a device-to-host copy per step, as gradus' examples make
            steps += 1
        if dev.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        losses.append(total / steps)
        accs.append(accuracy())
        print(f"  torch {a.model} seed {a.seed} epoch {e + 1}: {seconds[-1]:.2f} s, loss {losses[-1]:.4f}, "
              f"test accuracy {accs[-1]:.4f}", file=sys.stderr, flush=True)
    import re
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    blas = blas.group(1) if blas else "?"
    if blas == "generic":  # the system's libblas.so.3, whatever update-alternatives selects
        lib = "/usr/lib/x86_64-linux-gnu/libblas.so.3"
        blas += f" ({os.path.realpath(lib)})" if os.path.exists(lib) else ""
    where = f"on {torch.cuda.get_device_name(0)}" if dev.type == "cuda" else f"BLAS {blas}"
    if a.cuda and dev.type != "cuda":
        where += " (CPU: this PyTorch has no CUDA or sees no GPU)"
    peak_device = torch.cuda.max_memory_reserved() / 2**20 if dev.type == "cuda" else None
    print(json.dumps({"epoch_seconds": seconds, "test_accuracy": accs, "loss": losses,
                      "peak_rss_mb": peak_rss_mb(), "peak_device_mb": peak_device,
                      "torch": f"{torch.__version__}, {where}"}))


# ---------------------------------------------------------------- runners (one process each)
def busy_cpu_seconds():
    """CPU seconds all processes have used since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait
    except (OSError, ValueError, IndexError):
        return None


def wait_for_idle(limit_s):
    """Waits up to limit_s seconds for the other processes to leave the cores (under 0.2 of
    a core busy over a second); returns the load last seen."""
    t_end, load = time.time() + limit_s, None
    while True:
        b0 = busy_cpu_seconds()
        time.sleep(1.0)
        b1 = busy_cpu_seconds()
        if b0 is None or b1 is None:
            return None
        load = b1 - b0
        if load < 0.2 or time.time() >= t_end:
            return load


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measured(run):
    """Runs run(); adds 'background' to its result: the CPU other processes used meanwhile,
    in cores (0: the machine was ours; 1: another process kept one core busy)."""
    b0, c0, t0 = busy_cpu_seconds(), children_cpu_seconds(), time.perf_counter()
    r = run()
    b1, c1, wall = busy_cpu_seconds(), children_cpu_seconds(), time.perf_counter() - t0
    if b0 is not None and b1 is not None and wall > 0:
        r["background"] = max(0.0, ((b1 - b0) - (c1 - c0)) / wall)
    return r


def last_json(out):
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


def peak_rss_mb():
    # VmHWM: this address space's peak. ru_maxrss survives exec on Linux, so a worker would
    # report its parent's size (the parent imported torch) if it was smaller itself.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def wait_policy_env(a, env):
    # Both frameworks use OpenMP; --wait-policy gives both the same OMP_WAIT_POLICY ("default":
    # none set, each library's own default: libgomp spins briefly at a barrier). The runs wait
    # for idle cores first; on a busy machine gradus' team follows the free cores
    # (cpu_simd/threads.hpp), so it no longer needs passive waiting (until issue 15 both ran
    # passive, which cost gradus' MLP ~45% on idle cores).
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("OPENBLAS_CORETYPE", None)  # users' machines do not set it
    if a.wait_policy != "default":
        env["OMP_WAIT_POLICY"] = a.wait_policy
    return env


def run_torch(a, model, seed, epochs):
    env = wait_policy_env(a, dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(a.threads)))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--seed", str(seed),
           "--epochs-n", str(epochs), "--data", a.data, "--threads", str(a.threads), "--batch", str(a.batch),
           "--train-limit", str(a.train_limit)] + (["--cuda"] if a.cuda else [])
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"the PyTorch run failed ({p.returncode}): {' '.join(cmd)}")
    r = last_json(p.stdout)
    return {"epoch_seconds": statistics.mean(r["epoch_seconds"]), "acc": r["test_accuracy"],
            "peak_rss_mb": r["peak_rss_mb"], "peak_device_mb": r.get("peak_device_mb"), "version": r["torch"]}


def run_gradus(a, exe, model, seed, epochs, tmp):
    metrics = os.path.join(tmp, f"{model}_{seed}.csv")
    cmd = [exe, "--json", "--quiet", "--data", a.data, "--epochs", str(epochs), "--seed", str(seed),
           "--batch", str(a.batch), "--threads", str(a.threads), "--metrics", metrics]
    if a.train_limit:
        cmd += ["--train-limit", str(a.train_limit)]
    env = wait_policy_env(a, dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
    if a.gradus_library_path:
        env["LD_LIBRARY_PATH"] = a.gradus_library_path
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"the gradus run failed ({p.returncode}): {' '.join(cmd)}")
    r = last_json(p.stdout)
    accs = []
    if os.path.exists(metrics):  # per-epoch accuracy from the harness' metrics CSV
        with open(metrics) as f:
            rows = [line.strip().split(",") for line in f if line.strip()]
        col = rows[0].index("test_accuracy")
        accs = [float(row[col]) for row in rows[1:]]
    if len(accs) != epochs:
        accs = [float("nan")] * (epochs - 1) + [r["test_accuracy"]]
    print(f"  gradus {model} seed {seed}: {r['epoch_seconds']:.2f} s/epoch, test accuracy "
          f"{' '.join(f'{x:.4f}' for x in accs)}, peak RSS {r['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    return {"epoch_seconds": r["epoch_seconds"], "acc": accs, "peak_rss_mb": r["peak_rss_mb"],
            "peak_device_mb": r.get("peak_device_mb")}


# ---------------------------------------------------------------- table
def median(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(x, spec, suffix=""):
    return "—" if x is None or x != x else format(x, spec) + suffix


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="mlp,cnn,lstm", help="comma-separated: mlp, cnn, lstm")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (median over them)")
    ap.add_argument("--epochs", type=int, default=0,
                    help="epochs for every model (default: mlp 3, cnn 1, lstm 2); accuracy after 1 and the last")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "mnist"), help="the MNIST IDX files")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"), help="gradus' build directory")
    ap.add_argument("--exe-dir", help="where the gradus examples are (default: <build>/examples)")
    ap.add_argument("--gradus-library-path",
                    help="LD_LIBRARY_PATH for the gradus runs alone (a GPU bundle's lib/: PyTorch keeps its own)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--wait-policy", default="default", choices=["default", "passive", "active"],
                    help="OMP_WAIT_POLICY for both frameworks (default: none set)")
    ap.add_argument("--train-limit", type=int, default=0, help="train on the first N images (0: all 60,000)")
    ap.add_argument("--no-gradus", action="store_true", help="PyTorch alone")
    ap.add_argument("--no-torch", action="store_true", help="gradus alone")
    ap.add_argument("--cuda", action="store_true",
                    help="on a GPU: gradus' <example>_cuda against PyTorch on CUDA (CPU if it has none)")
    ap.add_argument("--json-out", help="also write every measurement to this JSON file")
    ap.add_argument("--idle-wait", type=float, default=120,
                    help="before each seed, wait up to this many seconds for idle cores (0: don't)")
    # worker mode (internal): one PyTorch run, one JSON line on stdout
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--epochs-n", dest="epochs_n", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.data = os.path.abspath(a.data)

    if a.worker:
        a.epochs = a.epochs_n
        return torch_worker(a)

    for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        if not os.path.exists(os.path.join(a.data, f)):
            raise SystemExit(f"no {f} in {a.data}: run tools/fetch-mnist.sh first")
    if not a.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
                print(f"{sys.executable} cannot import torch: re-running with /usr/bin/python3", file=sys.stderr)
                os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
            raise SystemExit("cannot import torch (Debian: apt-get install python3-torch), or pass --no-torch")

    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in GRADUS_EXAMPLE:
            raise SystemExit(f"unknown model '{m}': mlp, cnn or lstm")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    results, notes = {}, []
    tmp = tempfile.mkdtemp(prefix="mnist_vs_pytorch_")
    try:
        for m in models:
            epochs = a.epochs or DEFAULT_EPOCHS[m]
            acc_epochs = sorted({1, epochs}) if a.epochs else ACC_EPOCHS[m]
            exe = os.path.join(a.exe_dir or os.path.join(a.build, "examples"), GRADUS_EXAMPLE[m] + ("_cuda" if a.cuda else ""))
            have_gradus = not a.no_gradus and os.access(exe, os.X_OK)
            if not a.no_gradus and not have_gradus:
                notes.append(f"{m}: no {exe} (cmake --preset release && cmake --build --preset release "
                             f"--target {os.path.basename(exe)}): PyTorch only")
            runs = {"torch": [], "gradus": []}
            for s in seeds:
                if a.idle_wait > 0:
                    load = wait_for_idle(a.idle_wait)
                    if load is not None and load >= 0.2:
                        print(f"  (the cores are still busy after {a.idle_wait:.0f} s: {load:.2f} cores in use)",
                              file=sys.stderr)
                print(f"{m}, seed {s}, {epochs} epoch(s)", file=sys.stderr, flush=True)
                # alternate which framework goes first, so that neither always runs first
                order = ["torch", "gradus"] if s % 2 else ["gradus", "torch"]
                for fw in order:
                    if fw == "torch" and not a.no_torch:
                        runs["torch"].append(measured(lambda: run_torch(a, m, s, epochs)))
                    if fw == "gradus" and have_gradus:
                        runs["gradus"].append(measured(lambda: run_gradus(a, exe, m, s, epochs, tmp)))
            results[m] = {"epochs": epochs, "acc_epochs": acc_epochs, "runs": runs}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # ---- the table
    version = next((r["version"] for m in results.values() for r in m["runs"]["torch"]), "not run")
    print(f"\nMNIST, batch {a.batch}, {a.threads} threads, seeds {a.seeds} (medians); PyTorch {version}"
          + (f"; first {a.train_limit} training images" if a.train_limit else "") + "\n")
    print("| model | measure | PyTorch | gradus | gradus / PyTorch | target | met |")
    print("|---|---|---|---|---|---|---|")
    for m, r in results.items():
        t, g = r["runs"]["torch"], r["runs"]["gradus"]

        def med(runs, key):
            return median([x[key] for x in runs]) if runs else float("nan")

        ts, gs = med(t, "epoch_seconds"), med(g, "epoch_seconds")
        ratio = gs / ts if t and g else float("nan")
        target = CUDA_TIME_TARGET[m] if a.cuda else TIME_TARGET[m]
        met = "—" if ratio != ratio or target is None else ("yes" if ratio <= target else "no")
        print(f"| {m} | s / epoch (training) | {fmt(ts, '.2f')} | {fmt(gs, '.2f')} | {fmt(ratio, '.2f', 'x')} "
              f"| {'≤ ' + str(target) + 'x' if target else '—'} | {met} |")
        for e in r["acc_epochs"]:
            ta = median([x["acc"][e - 1] for x in t]) if t else float("nan")
            ga = median([x["acc"][e - 1] for x in g]) if g else float("nan")
            diff = (ga - ta) * 100 if t and g else float("nan")
            met = "—" if diff != diff else ("yes" if diff >= -ACC_POINTS else "no")
            print(f"| {m} | test accuracy, epoch {e} | {fmt(ta * 100, '.2f', '%')} | {fmt(ga * 100, '.2f', '%')} "
                  f"| {fmt(diff, '+.2f', ' points')} | ≥ −{ACC_POINTS} points | {met} |")
        tr, gr = med(t, "peak_rss_mb"), med(g, "peak_rss_mb")
        ratio = gr / tr if t and g else float("nan")
        met = "—" if ratio != ratio else ("yes" if ratio <= RSS_TARGET else "no")
        print(f"| {m} | peak RSS (MB) | {fmt(tr, '.0f')} | {fmt(gr, '.0f')} | {fmt(ratio, '.2f', 'x')} | ≤ {RSS_TARGET}x | {met} |")
        if a.cuda:
            def med_dev(runs):
                xs = [x["peak_device_mb"] for x in runs if x.get("peak_device_mb") is not None]
                return median(xs) if xs else float("nan")
            td, gd = med_dev(t), med_dev(g)
            ratio = gd / td if td == td and gd == gd and td > 0 else float("nan")
            print(f"| {m} | peak device memory (MiB, allocator) | {fmt(td, '.0f')} | {fmt(gd, '.0f')} "
                  f"| {fmt(ratio, '.2f', 'x')} | — | — |")
    bg = [x["background"] for r in results.values() for fw in ("torch", "gradus") for x in r["runs"][fw]
          if "background" in x]
    if bg:
        print(f"\nOther processes' CPU load during the runs: median {statistics.median(bg):.2f}, "
              f"max {max(bg):.2f} cores (of {os.cpu_count()}); rerun when it is high.")
    for n in notes:
        print(f"\nNote: {n}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
