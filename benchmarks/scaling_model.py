#!/usr/bin/python3
"""A scaling model of gradus' data parallelism beyond this machine (issue 14).

Three subcommands (numpy and the standard library only; run with /usr/bin/python3):

  measure   runs build-bench/benchmarks/allreduce_bench (gradus' ring all-reduce) for
            N = 2, 3, 4 ranks over loopback (GRADUS_TRANSPORT tcp and shm) and over network
            namespaces made here (one per rank, veth pairs to a bridge in one more
            namespace, each rank's link shaped by `tc qdisc ... tbf rate 1gbit` or
            `10gbit`, GRADUS_TRANSPORT=tcp), and, with --ps, ps_bench's push+pull over
            loopback; it writes rank 0's tables to benchmarks/scaling/ as
            ring_<path>_N<n>_<link>.txt and ps_loopback.txt. Needs root for the namespaces;
            every namespace it makes is removed on exit, every process it starts is waited
            for under a timeout.
  model     (the default) reads those tables, fits the alpha-beta model of each data path
            and link, validates it on held-out world sizes, calibrates the parameter
            server, projects the scaling efficiency of three models to N = 8 ... 512 on 10
            and 100 Gbit/s links (ring against PS with 1, 4, 16 servers, with bucketing
            and overlap), prints markdown tables and writes benchmarks/scaling/projection.svg
            (and projection.md, the tables as printed).
  steptime  runs the real example, build/ci/examples/mnist_mlp (--threads 1, batch 64, two
            epochs; 3 repeats), alone (--comm local: t_compute per step), as two independent
            processes at once, with gradus-run -np N --comm ring over loopback (shm, tcp;
            N = 2, 3, 4) and in network namespaces over 1 Gbit/s tc tbf links (tcp; N = 2, 3,
            4), writes the seconds per training step to benchmarks/scaling/steptime-2026-11-24/
            steptime.txt and compares their medians with the model's step time
            t_compute x max(1, N/cores) + t_allreduce(N, 0.94 MB) (prediction.md), the
            all-reduce from the alpha-beta fit of that path and link on allreduce_bench's
            tables (--fit-data, benchmarks/scaling/idle-2026-11-24). --predict-only: no runs.

The model (docs/scaling.md):
  ring all-reduce of n bytes over N ranks:  t = 2(N-1) alpha + 2(N-1)/N n beta
  PS push+pull of n bytes, W workers, S servers:  t = alpha_ps + n beta_ps max(1, W/S)
  a training step of compute c (backward 2/3 c) whose gradient goes out in buckets of
  25 MiB as each becomes final: exposed = when the last bucket's collective ends, minus the
  end of the backward pass; efficiency = c / (c + exposed).
"""
from __future__ import annotations

import argparse
import atexit
import datetime as dt
import glob
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "scaling")

# ---------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------

TBF = {  # link name -> tc tbf arguments on each rank's eth0 (egress)
    "tbf1gbit": ["rate", "1gbit", "burst", "256kb", "latency", "50ms"],
    "tbf10gbit": ["rate", "10gbit", "burst", "2mb", "latency", "50ms"],
}
LINK_RATE_BPS = {"tbf1gbit": 1e9, "tbf10gbit": 10e9}  # bits/s

_started: list[subprocess.Popen] = []  # processes this script started (ended only by their handles)
_namespaces: list[str] = []  # namespaces this script made


def _cleanup() -> None:
    for p in _started:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    _started.clear()
    for ns in reversed(_namespaces):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, timeout=20)
    _namespaces.clear()


def _on_signal(signum, _frame):
    _cleanup()
    sys.exit(128 + signum)


def _sh(*argv: str, timeout: float = 20) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


SOURCE_LABEL = ""  # measure --source-label: what the benchmark binaries were built from


def git_commit() -> str:
    if SOURCE_LABEL:
        return SOURCE_LABEL
    try:
        return _sh("git", "-C", ROOT, "describe", "--always", "--dirty").strip()
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def busy_cores(seconds: float = 2.0) -> float:
    """Cores' worth of CPU time used (by anything) over `seconds`, from /proc/stat."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4], sum(v)  # busy (all but idle and iowait), total
    b0, t0 = snap()
    time.sleep(seconds)
    b1, t1 = snap()
    return (b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1)


IDLE_WAIT = 0.0  # measure --idle-wait
TAG = ""  # measure --tag: ".<tag>" before .txt


def wait_idle_cores() -> float:
    """Waits up to IDLE_WAIT s for other processes to use < 0.1 cores; the cores they used last."""
    deadline = time.monotonic() + IDLE_WAIT
    busy = busy_cores()
    while busy >= 0.1 and time.monotonic() < deadline:
        busy = busy_cores()
    return busy


def wait_idle() -> str:
    """wait_idle_cores, said in words."""
    return f"other processes used {wait_idle_cores():.2f} cores just before"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_ranks(argvs: list[list[str]], envs: list[dict], timeout: float, outs: list | None = None) -> tuple[str, str]:
    """Starts one process per rank, waits for all (at most `timeout` s in all); returns rank
    0's stdout and every rank's stderr. Raises if one fails or the time runs out. With a list
    `outs`, every process's stdout is kept and appended to it (rank order)."""
    procs = []
    for argv, env in zip(argvs, envs):
        out = open(os.devnull, "w") if procs and outs is None else subprocess.PIPE
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        _started.append(p)
    deadline = time.monotonic() + timeout
    errs = []
    try:
        out0, err0 = procs[0].communicate(timeout=max(1.0, deadline - time.monotonic()))
        errs.append(err0)
        if outs is not None:
            outs.append(out0)
        for p in procs[1:]:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            errs.append(e)
            if outs is not None:
                outs.append(o)
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(timeout=10)
        raise RuntimeError(f"ranks still running after {timeout:.0f} s: {' '.join(argvs[0])}")
    finally:
        for p in procs:
            if p in _started and p.poll() is not None:
                _started.remove(p)
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"rank(s) {bad} failed: " + " | ".join(e.strip()[-400:] for e in errs if e.strip()))
    return out0, "".join(errs)


def bench_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "GRADUS_COMM_TRANSPORT")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def write_table(name: str, header: list[str], table: str) -> None:
    os.makedirs(DATA, exist_ok=True)
    path = os.path.join(DATA, name)
    with open(path, "w") as f:
        for h in header:
            f.write(f"# {h}\n")
        f.write(table if table.endswith("\n") else table + "\n")
    print(f"wrote {os.path.relpath(path, ROOT)}", flush=True)


def measure_loopback(bench: str, ns_: list[int], paths: list[str], timeout: float) -> None:
    for path in paths:
        for n in ns_:
            rdv = f"tcp://127.0.0.1:{free_port()}"
            idle = wait_idle()
            before, t0 = loadavg(), time.time()
            envs = [bench_env({"RANK": str(r), "WORLD_SIZE": str(n), "GRADUS_RENDEZVOUS": rdv,
                               "GRADUS_TRANSPORT": path}) for r in range(n)]
            out, _ = run_ranks([[bench]] * n, envs, timeout)
            write_table(f"ring_{path}_N{n}_loopback{TAG}.txt", [
                f"gradus allreduce_bench, N={n}, GRADUS_TRANSPORT={path}, loopback (rendezvous {rdv})",
                f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, {cpu_name()}, {os.cpu_count()} cores",
                f"load average before {before}, after {loadavg()}; {idle}; {time.time() - t0:.0f} s",
            ], out)


def make_namespaces(tag: str, subnet: str, np_: int) -> None:
    br = f"{tag}br"
    _sh("ip", "netns", "add", br)
    _namespaces.append(br)
    _sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
    _sh("ip", "-n", br, "link", "set", "br0", "up")
    for r in range(np_):
        ns = f"{tag}n{r}"
        _sh("ip", "netns", "add", ns)
        _namespaces.append(ns)
        _sh("ip", "link", "add", f"{tag}h{r}", "netns", ns, "type", "veth", "peer", "name", f"p{r}", "netns", br)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns, "link", "set", f"{tag}h{r}", "name", "eth0")
        _sh("ip", "-n", ns, "addr", "add", f"{subnet}.{r + 1}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", br, "link", "set", f"p{r}", "master", "br0")
        _sh("ip", "-n", br, "link", "set", f"p{r}", "up")


def measure_netns(bench: str, ns_: list[int], links: list[str], timeout: float) -> None:
    if os.geteuid() != 0:
        raise SystemExit("measure: network namespaces need root (or pass --links '')")
    tag = f"gsm{os.getpid() % 100000}"
    subnet = f"10.77.{230 + os.getpid() % 20}"
    np_ = max(ns_)
    make_namespaces(tag, subnet, np_)
    port = 29500
    for link in links:
        for r in range(np_):
            _sh("ip", "netns", "exec", f"{tag}n{r}", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", *TBF[link])
        for n in ns_:
            port += 1
            rdv = f"tcp://{subnet}.1:{port}"
            argvs, envs = [], []
            for r in range(n):
                argvs.append(["ip", "netns", "exec", f"{tag}n{r}", bench])
                envs.append(bench_env({"RANK": str(r), "WORLD_SIZE": str(n), "GRADUS_RENDEZVOUS": rdv,
                                       "GRADUS_TRANSPORT": "tcp", "GRADUS_BIND_ADDR": f"{subnet}.{r + 1}"}))
            idle = wait_idle()
            before, t0 = loadavg(), time.time()
            out, _ = run_ranks(argvs, envs, timeout)
            write_table(f"ring_tcp_N{n}_{link}{TAG}.txt", [
                f"gradus allreduce_bench, N={n}, GRADUS_TRANSPORT=tcp, one network namespace per rank, veth pairs to a bridge,",
                f"  tc qdisc tbf {' '.join(TBF[link])} on each rank's eth0 (egress); rendezvous {rdv}",
                f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, {cpu_name()}, {os.cpu_count()} cores",
                f"load average before {before}, after {loadavg()}; {idle}; {time.time() - t0:.0f} s",
            ], out)


def measure_ps(ps_bench: str, timeout: float) -> None:
    idle = wait_idle()
    before, t0 = loadavg(), time.time()
    argv = [ps_bench, "--curve", "off", "--sizes-mib", "1,4,16,64", "--servers", "1,2", "--rounds", "9", "--warmup", "2"]
    r = subprocess.run(argv, env=bench_env({}), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"ps_bench failed: {r.stderr.strip()[-400:]}")
    write_table(f"ps_loopback{TAG}.txt", [
        f"{' '.join(os.path.relpath(a, ROOT) if os.path.isabs(a) else a for a in argv)} (one worker, S servers, tcp 127.0.0.1)",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, {cpu_name()}, {os.cpu_count()} cores",
        f"load average before {before}, after {loadavg()}; {idle}; {time.time() - t0:.0f} s",
    ], r.stdout)


def cmd_measure(a) -> None:
    global SOURCE_LABEL, IDLE_WAIT
    SOURCE_LABEL, IDLE_WAIT = a.source_label, a.idle_wait
    global TAG
    TAG = f".{a.tag}" if a.tag else ""
    if a.tag and not re.fullmatch(r"[a-z0-9]+", a.tag):
        raise SystemExit("measure --tag: lower-case letters and digits")
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    bench = os.path.abspath(os.path.join(a.build, "benchmarks", "allreduce_bench"))
    if not os.access(bench, os.X_OK):
        raise SystemExit(f"measure: no {bench}; build it: cmake -S . -B {a.build} -DCMAKE_BUILD_TYPE=Release "
                         "-DGRADUS_BUILD_BENCHMARKS=ON -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=OFF && "
                         f"cmake --build {a.build} --target allreduce_bench -j2")
    ns_ = [int(x) for x in a.ns.split(",") if x]
    paths = [x for x in a.paths.split(",") if x]
    links = [x for x in a.links.split(",") if x]
    if paths:
        measure_loopback(bench, ns_, paths, a.timeout)
    if links:
        measure_netns(bench, ns_, links, a.timeout)
    if a.ps:
        ps = os.path.abspath(os.path.join(a.build, "benchmarks", "ps_bench"))
        if not os.access(ps, os.X_OK):
            raise SystemExit(f"measure --ps: no {ps} (cmake --build {a.build} --target ps_bench)")
        measure_ps(ps, a.timeout)
    _cleanup()


# ---------------------------------------------------------------------------------------
# Reading the measurements
# ---------------------------------------------------------------------------------------

RING_FILE = re.compile(r"ring_(?P<path>[a-z0-9-]+)_N(?P<n>\d+)_(?P<link>[a-z0-9]+)(?:\.(?P<tag>[a-z0-9]+))?\.txt$")


def read_ring_tables(data_dir: str) -> dict:
    """{(path, link): [(N, bytes, seconds), ...]} from allreduce_bench tables (columns bytes
    floats runs median_us algbw busbw; '#' lines and the header row are skipped). Repeats of
    one configuration (ring_<path>_N<n>_<link>.<tag>.txt, measure --tag) are merged size by
    size into the least disturbed one: the smallest median time."""
    best: dict = {}
    for f in sorted(glob.glob(os.path.join(data_dir, "ring_*_N*_*.txt"))):
        m = RING_FILE.search(os.path.basename(f))
        if not m:
            continue
        n = int(m["n"])
        with open(f) as fh:
            for line in fh:
                cols = line.split()
                if not cols or line.startswith("#") or not cols[0].isdigit() or len(cols) < 6:
                    continue
                k = (m["path"], m["link"], n, int(cols[0]))
                best[k] = min(best.get(k, math.inf), float(cols[3]) * 1e-6)
    out: dict = {}
    for (path, link, n, b), t in sorted(best.items()):
        out.setdefault((path, link), []).append((n, b, t))
    return out


# ps_bench's own figures from benchmarks/README.md (2026-11-24 16:08 UTC, commit 48f721c, one
# OpenMP thread in the servers, no CURVE): (servers, bytes, gradus ms per push+pull round).
PS_README = [(1, 1 << 20, 0.587), (1, 64 << 20, 67.906), (2, 1 << 20, 0.520), (2, 64 << 20, 57.975)]


def read_ps(data_dir: str) -> tuple[list, str]:
    """[(servers, bytes, seconds)] for gradus, CURVE off, from ps_loopback.txt (ps_bench's
    markdown table) if present, else the README's figures."""
    files = sorted(glob.glob(os.path.join(data_dir, "ps_loopback*.txt")))
    best: dict = {}
    row = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+) MiB\s*\|\s*off\s*\|\s*([0-9.]+)\s*\|")
    for f in files:
        with open(f) as fh:
            for line in fh:
                m = row.match(line)
                if m:
                    k = (int(m[1]), int(m[2]) << 20)
                    best[k] = min(best.get(k, math.inf), float(m[3]) * 1e-3)
    rows = [(s, b, t) for (s, b), t in sorted(best.items())]
    if rows:
        return rows, ", ".join("benchmarks/scaling/" + os.path.basename(f) for f in files)
    return [(s, b, ms * 1e-3) for s, b, ms in PS_README], "benchmarks/README.md (ps_bench, 2026-11-24 16:08 UTC)"


# ---------------------------------------------------------------------------------------
# Fitting and validation
# ---------------------------------------------------------------------------------------


def share(n_ranks, cores: int):
    """CPU sharing: with more ranks than cores (cores > 0), each rank gets cores/N of a core."""
    return np.maximum(1.0, np.asarray(n_ranks, dtype=float) / cores) if cores else 1.0


def ring_design(n_ranks: np.ndarray, nbytes: np.ndarray, cores: int = 0) -> np.ndarray:
    return np.column_stack([2.0 * (n_ranks - 1), 2.0 * (n_ranks - 1) / n_ranks * nbytes * share(n_ranks, cores)])


def fit_ring(points: list, cores: int = 0) -> tuple[float, float]:
    """Least squares (numpy.linalg.lstsq) of t = 2(N-1) alpha + 2(N-1)/N n beta, each
    point weighted by 1/t (relative error: 4 KiB and 64 MiB count alike). alpha < 0 is
    clamped to 0 (then beta alone is refitted). cores > 0: the CPU-shared variant, beta
    scaled by max(1, N/cores) (all ranks on one machine of that many cores)."""
    p = np.asarray(points, dtype=float)
    X, t = ring_design(p[:, 0], p[:, 1], cores), p[:, 2]
    w = 1.0 / t
    (alpha, beta), *_ = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)
    if alpha < 0:
        alpha = 0.0
        (beta,), *_ = np.linalg.lstsq((X[:, 1] * w)[:, None], t * w, rcond=None)
    return float(alpha), float(beta)


def ring_time(alpha: float, beta: float, n_ranks, nbytes, cores: int = 0):
    n_ranks = np.asarray(n_ranks, dtype=float)
    return (2 * (n_ranks - 1) * alpha
            + 2 * (n_ranks - 1) / n_ranks * np.asarray(nbytes, dtype=float) * beta * share(n_ranks, cores))


def fit_ps(rows: list) -> tuple[float, float]:
    """t = alpha + n beta (ps_bench has one worker, so max(1, W/S) = 1), relative least squares."""
    p = np.asarray(rows, dtype=float)
    X = np.column_stack([np.ones(len(p)), p[:, 1]])
    w = 1.0 / p[:, 2]
    (alpha, beta), *_ = np.linalg.lstsq(X * w[:, None], p[:, 2] * w, rcond=None)
    return max(float(alpha), 0.0), float(beta)


def fmt_bytes(b: float) -> str:
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            v = b / s
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_t(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


# ---------------------------------------------------------------------------------------
# Projection
# ---------------------------------------------------------------------------------------

BUCKET = 25 << 20  # data_parallel_options::bucket_bytes (as PyTorch DDP's 25 MB)
BACKWARD = 2.0 / 3.0  # backward pass share of a step's compute
NS_PROJ = [8, 16, 32, 64, 128, 256, 512]
SERVERS = [1, 4, 16]
LINKS_PROJ = {"10 Gbit/s": 10e9, "100 Gbit/s": 100e9}

MODELS = [  # name, gradient bytes, compute seconds per step, where the compute figure comes from
    ("(a) MNIST MLP", 235_146 * 4, 0.542e-3,
     "bench_mlp: gradus step, batch 64, 2 threads, 0.542 ms (benchmarks/README.md)"),
    ("(b) 25M params", 25e6 * 4, 0.100,
     "assumed: ResNet-50 on a V100, batch 32 per GPU, ~0.1 s a step (~320 images/s, fp32)"),
    ("(c) 100M params", 100e6 * 4, 0.200,
     "assumed: 2x (b), a VGG-16-class step at batch 32 on a V100 (~3.8x ResNet-50's FLOPs at higher utilisation)"),
]


def exposed_comm(nbytes: float, compute: float, bucket_time, overlap: bool = True) -> float:
    """Buckets of BUCKET bytes (the last one smaller), final uniformly over the backward pass
    (BACKWARD x compute, last layers first), each reduced as soon as it is final and the
    previous bucket's collective is done (one collective at a time, as gradus' comm thread
    does), running at full speed alongside the remaining backward (overlap fraction 1: no
    slowdown of compute and none of the collective). Without overlap the collectives start
    after the backward pass. Returns the time the step waits after its backward pass."""
    t_bwd = BACKWARD * compute
    nb = max(1, math.ceil(nbytes / BUCKET))
    sizes = [BUCKET] * (nb - 1) + [nbytes - BUCKET * (nb - 1)]
    done, cum = 0.0, 0.0
    for b in sizes:
        cum += b
        ready = t_bwd * cum / nbytes if overlap else t_bwd
        done = max(done, ready) + bucket_time(b)
    return max(0.0, done - t_bwd)


def efficiency(compute: float, exposed: float) -> float:
    return compute / (compute + exposed)


# ---------------------------------------------------------------------------------------
# SVG
# ---------------------------------------------------------------------------------------

SERIES = [  # key, label, colour, dash
    ("ring", "ring, buckets + overlap", "#1f5fbf", ""),
    ("ring_noov", "ring, no overlap", "#1f5fbf", "5,4"),
    ("ps1", "PS, 1 server", "#c0392b", ""),
    ("ps4", "PS, 4 servers", "#e08e0b", ""),
    ("ps16", "PS, 16 servers", "#2e8b57", ""),
]


def write_svg(path: str, proj: dict, subtitle: str) -> None:
    pw, ph, ml, mt, gap_x, gap_y = 300, 210, 60, 70, 50, 70
    ncol, nrow = len(MODELS), len(LINKS_PROJ)
    W = ml + ncol * pw + (ncol - 1) * gap_x + 30
    H = mt + nrow * ph + (nrow - 1) * gap_y + 125
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
         'Projected scaling efficiency of gradus data parallelism (alpha-beta model, issue 14)</text>',
         f'<text x="{W / 2}" y="40" text-anchor="middle" font-size="11" fill="#444">{subtitle}</text>']
    lx0, lx1 = math.log2(NS_PROJ[0]), math.log2(NS_PROJ[-1])
    refs = {  # (model index) -> [(N, efficiency, label)]
        0: [(32, 11.64 / 32, "TF paper: 11.64x on 32 cores")],
        1: [(512, 0.90, "Horovod ResNet-101: 90%")],
        2: [(512, 0.68, "Horovod VGG-16: 68%")],
    }
    for row, (lname, _) in enumerate(LINKS_PROJ.items()):
        for col, (mname, nbytes, compute, _) in enumerate(MODELS):
            x0 = ml + col * (pw + gap_x)
            y0 = mt + row * (ph + gap_y)

            def X(n, x0=x0):
                return x0 + (math.log2(n) - lx0) / (lx1 - lx0) * pw

            def Y(e, y0=y0):
                return y0 + (1 - e) * ph

            o.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
            o.append(f'<text x="{x0 + pw / 2}" y="{y0 - 8}" text-anchor="middle" font-weight="bold">'
                     f'{mname}, {nbytes / 1e6:.3g} MB, {fmt_t(compute)}/step, {lname}</text>')
            for e in (0, 0.25, 0.5, 0.75, 1.0):
                o.append(f'<line x1="{x0}" y1="{Y(e):.1f}" x2="{x0 + pw}" y2="{Y(e):.1f}" stroke="#ddd"/>')
                o.append(f'<text x="{x0 - 5}" y="{Y(e) + 4:.1f}" text-anchor="end">{e:.2f}</text>')
            for n in NS_PROJ:
                o.append(f'<line x1="{X(n):.1f}" y1="{y0}" x2="{X(n):.1f}" y2="{y0 + ph}" stroke="#eee"/>')
                o.append(f'<text x="{X(n):.1f}" y="{y0 + ph + 14}" text-anchor="middle">{n}</text>')
            o.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 30}" text-anchor="middle" fill="#444">ranks N (log2)</text>')
            if col == 0:
                o.append(f'<text x="{x0 - 42}" y="{y0 + ph / 2}" text-anchor="middle" fill="#444" '
                         f'transform="rotate(-90 {x0 - 42} {y0 + ph / 2})">scaling efficiency, {lname} links</text>')
            for key, _, colour, dash in SERIES:
                pts = " ".join(f"{X(n):.1f},{Y(proj[(mname, lname, n)][key]):.1f}" for n in NS_PROJ)
                d = f' stroke-dasharray="{dash}"' if dash else ""
                o.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{d}/>')
                for n in NS_PROJ:
                    o.append(f'<circle cx="{X(n):.1f}" cy="{Y(proj[(mname, lname, n)][key]):.1f}" r="2.2" fill="{colour}"/>')
            for n, e, label in refs.get(col, []):
                cx, cy = X(n), Y(e)
                o.append(f'<path d="M{cx - 6:.1f},{cy:.1f} L{cx:.1f},{cy - 6:.1f} L{cx + 6:.1f},{cy:.1f} '
                         f'L{cx:.1f},{cy + 6:.1f} Z" fill="black"/>')
                anchor = "end" if n == NS_PROJ[-1] else "start"
                tx = cx - 9 if anchor == "end" else cx + 9
                o.append(f'<text x="{tx:.1f}" y="{cy - 7:.1f}" text-anchor="{anchor}" font-size="10">{label}</text>')
    ly = mt + nrow * ph + (nrow - 1) * gap_y + 50
    for i, (key, label, colour, dash) in enumerate(SERIES):
        lx, yy = ml + (i % 3) * 260, ly + (i // 3) * 18
        d = f' stroke-dasharray="{dash}"' if dash else ""
        o.append(f'<line x1="{lx}" y1="{yy}" x2="{lx + 28}" y2="{yy}" stroke="{colour}" stroke-width="2"{d}/>')
        o.append(f'<text x="{lx + 34}" y="{yy + 4}">{label}</text>')
    lx, yy = ml + 2 * 260, ly + 18
    o.append(f'<path d="M{lx + 14},{yy} L{lx + 20},{yy - 6} L{lx + 26},{yy} L{lx + 20},{yy + 6} Z" fill="black"/>')
    o.append(f'<text x="{lx + 34}" y="{yy + 4}">published figures (other systems and hardware)</text>')
    o.append(f'<text x="{ml}" y="{ly + 42}" fill="#444">Efficiency = compute / (compute + exposed communication); '
             f'{BUCKET >> 20} MiB buckets, backward = 2/3 of compute, overlap fraction 1; per-rank batch fixed (weak scaling).</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


# ---------------------------------------------------------------------------------------
# The model command
# ---------------------------------------------------------------------------------------


def cmd_model(a) -> None:
    lines: list[str] = []

    def p(s: str = "") -> None:
        print(s)
        lines.append(s)

    data = read_ring_tables(a.data)
    if not data:
        raise SystemExit(f"model: no ring_*_N*_*.txt tables in {a.data} (run the measure subcommand first)")

    # --- fits on every world size ---
    fits: dict = {}
    p("### Fitted alpha-beta per data path and link (all measured N, all sizes)")
    p()
    p("| path | link | N measured | points | alpha (µs) | 1/beta (GB/s) | median abs. error | max abs. error | "
      "≥ 1 MiB only: alpha (µs) | 1/beta (GB/s) | of the tc rate |")
    p("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    fits_big: dict = {}
    for key in sorted(data):
        pts = data[key]
        alpha, beta = fit_ring(pts)
        fits[key] = (alpha, beta)
        arr = np.asarray(pts, dtype=float)
        err = ring_time(alpha, beta, arr[:, 0], arr[:, 1]) / arr[:, 2] - 1
        ab, bb = fits_big[key] = fit_ring([x for x in pts if x[1] >= (1 << 20)])
        rate = LINK_RATE_BPS.get(key[1])
        of_rate = f"{(1 / bb) / (rate / 8):.0%}" if rate else "—"
        p(f"| {key[0]} | {key[1]} | {','.join(str(n) for n in sorted({int(x) for x in arr[:, 0]}))} | {len(pts)} | "
          f"{alpha * 1e6:.1f} | {1 / beta / 1e9:.3f} | {np.median(np.abs(err)):.0%} | {np.max(np.abs(err)):.0%} | "
          f"{ab * 1e6:.1f} | {1 / bb / 1e9:.3f} | {of_rate} |")
    p()

    # --- validation: fit on the other world sizes, predict the held-out one ---
    p("### Validation: fit without one world size, predict its measured all-reduce times")
    p()
    cores = a.cores
    p("| path | link | fit on N | predict N | alpha (µs) | 1/beta (GB/s) | median abs. error | max abs. error | "
      f"max abs. error ≥ 1 MiB | points within 20% | fitted on ≥ 1 MiB only: errors at 1, 4, 16, 64 MiB | "
      "CPU-shared variant: max abs. error ≥ 1 MiB |")
    p("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    detail: list[str] = []
    for key in sorted(data):
        arr = np.asarray(data[key], dtype=float)
        nset = sorted({int(x) for x in arr[:, 0]})
        if len(nset) < 3:
            continue
        order = [nset[len(nset) // 2]] + [n for n in nset if n != nset[len(nset) // 2]]  # the middle one first
        for held in order:
            train = arr[arr[:, 0] != held]
            test = arr[arr[:, 0] == held]
            alpha, beta = fit_ring(train.tolist())
            pred = ring_time(alpha, beta, test[:, 0], test[:, 1])
            err = pred / test[:, 2] - 1
            big = np.abs(err[test[:, 1] >= (1 << 20)])
            a2, b2 = fit_ring(train.tolist(), cores)
            err2 = ring_time(a2, b2, test[:, 0], test[:, 1], cores) / test[:, 2] - 1
            big2 = np.abs(err2[test[:, 1] >= (1 << 20)])
            a3, b3 = fit_ring([x for x in train.tolist() if x[1] >= (1 << 20)])
            tb = test[test[:, 1] >= (1 << 20)]
            err3 = ring_time(a3, b3, tb[:, 0], tb[:, 1]) / tb[:, 2] - 1
            p(f"| {key[0]} | {key[1]} | {','.join(str(n) for n in nset if n != held)} | {held} | {alpha * 1e6:.1f} | "
              f"{1 / beta / 1e9:.3f} | {np.median(np.abs(err)):.0%} | {np.max(np.abs(err)):.0%} | "
              f"{big.max() if big.size else float('nan'):.0%} | {int(np.sum(np.abs(err) <= 0.2))}/{len(err)} | "
              f"{', '.join(f'{e:+.0%}' for e in err3)} | {big2.max() if big2.size else float('nan'):.0%} |")
            if held == order[0]:
                detail.append(f"{key[0]} / {key[1]}, fit on N={','.join(str(n) for n in nset if n != held)}, "
                              f"N={held}: " + ", ".join(f"{fmt_bytes(b)} {fmt_t(m)} -> {fmt_t(q)} ({e:+.0%})"
                                                        for b, m, q, e in zip(test[:, 1], test[:, 2], pred, err)))
    p()
    p(f"CPU-shared variant: beta x max(1, N/{cores}) (every rank of these runs shares the same {cores} cores).")
    p()
    p("Per size (measured -> predicted), the middle world size held out:")
    p()
    for d in detail:
        p(f"* {d}")
    p()

    # --- PS calibration ---
    ps_rows, ps_src = read_ps(a.data)
    alpha_ps, beta_ps = fit_ps(ps_rows)
    p(f"### Parameter server (push+pull, one worker; from {ps_src})")
    p()
    p("| servers | size | measured | model alpha + n beta | error |")
    p("|---:|---:|---:|---:|---:|")
    for s, b, t in ps_rows:
        q = alpha_ps + b * beta_ps
        p(f"| {s} | {fmt_bytes(b)} | {fmt_t(t)} | {fmt_t(q)} | {q / t - 1:+.0%} |")
    p()
    # k: the PS's time per byte against the ring's for the same traffic (at N = 2 a ring rank,
    # like a PS worker, sends n and receives n), size by size over loopback tcp; the median
    ring2 = {b: t for n, b, t in data.get(("tcp", "loopback"), []) if n == 2}
    ratios = [(b, t / ring2[b]) for s_, b, t in ps_rows if s_ == 1 and b in ring2]
    k_ps = float(np.median([r for _, r in ratios])) if ratios else 1.0
    p(f"Fit: alpha_ps = {alpha_ps * 1e6:.0f} µs, 1/beta_ps = {1 / beta_ps / 1e9:.3f} GB/s of variable (pushed and pulled). "
      "PS push+pull (1 server) over the ring all-reduce at N = 2, both over loopback tcp, the same bytes each way: "
      + ", ".join(f"{fmt_bytes(b)} {r:.2f}x" for b, r in ratios) + f"; median k = {k_ps:.2f}.")
    p()
    if alpha_ps == 0.0:
        alpha_ps = 2 * fit_ring([x for x in data[tuple(a.alpha_from.split("/"))] if not a.alpha_ns or
                                 x[0] in [int(v) for v in a.alpha_ns.split(",") if v]])[0]
        p(f"ps_bench's smallest size (1 MiB) hides the PS's latency (the fit's alpha is 0): the projection takes "
          f"alpha_ps = 2 x the ring's alpha = {alpha_ps * 1e6:.1f} µs (a push and a pull).")
        p()

    # --- projection parameters ---
    link_key = ("tcp", a.link_fit)
    if link_key not in fits:
        raise SystemExit(f"model: no fit for tcp over {a.link_fit} (measured: {sorted(fits)})")
    eff_link = (1 / fits_big[link_key][1]) / (LINK_RATE_BPS[a.link_fit] / 8)  # the bandwidth regime's fit
    alpha_key = tuple(a.alpha_from.split("/"))
    if alpha_key not in fits:
        raise SystemExit(f"model: no fit for {a.alpha_from}")
    alpha_ns = [int(x) for x in a.alpha_ns.split(",") if x]
    alpha = fit_ring([x for x in data[alpha_key] if not alpha_ns or x[0] in alpha_ns])[0]
    p("### Projection parameters")
    p()
    p(f"* ring alpha = {alpha * 1e6:.1f} µs (the {alpha_key[0]} / {alpha_key[1]} fit on N = "
      f"{','.join(map(str, alpha_ns)) if alpha_ns else 'all'}; on all N it is {fits[alpha_key][0] * 1e6:.1f} µs)")
    p(f"* link efficiency = {eff_link:.0%} of the link rate (the tcp / {a.link_fit} fit on sizes ≥ 1 MiB: its 1/beta over the tc rate); "
      + ", ".join(f"{ln}: 1/beta = {r / 8 * eff_link / 1e9:.2f} GB/s" for ln, r in LINKS_PROJ.items()))
    p(f"* PS: alpha_ps = {alpha_ps * 1e6:.0f} µs, beta_ps = max(1, k = {k_ps:.2f}) x the ring's link beta, x max(1, W/S)")
    p(f"* buckets of {BUCKET >> 20} MiB, backward = 2/3 of compute, overlap fraction 1 (a bucket's collective runs "
      "alongside the rest of the backward pass at full speed, one collective at a time)")
    for name, nbytes, compute, src in MODELS:
        p(f"* {name}: {nbytes / 1e6:.2f} MB of float32 gradients, compute {fmt_t(compute)} per step ({src})")
    p()

    proj: dict = {}
    p("### Projected scaling efficiency (compute / (compute + exposed communication))")
    p()
    p("| model | link | N | ring | ring, no overlap | PS, 1 server | PS, 4 servers | PS, 16 servers | ring all-reduce of the gradient |")
    p("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, nbytes, compute, _ in MODELS:
        for lname, rate in LINKS_PROJ.items():
            beta = 1 / (rate / 8 * eff_link)
            beta_p = max(1.0, k_ps) * beta
            for n in NS_PROJ:
                def ring_b(b, n=n, beta=beta):
                    return float(ring_time(alpha, beta, n, b))
                r = {"ring": efficiency(compute, exposed_comm(nbytes, compute, ring_b)),
                     "ring_noov": efficiency(compute, exposed_comm(nbytes, compute, ring_b, overlap=False))}
                for s in SERVERS:
                    def ps_b(b, n=n, s=s, beta_p=beta_p):
                        return alpha_ps + b * beta_p * max(1.0, n / s)
                    r[f"ps{s}"] = efficiency(compute, exposed_comm(nbytes, compute, ps_b))
                proj[(name, lname, n)] = r
                t_all = sum(ring_b(b) for b in [BUCKET] * (math.ceil(nbytes / BUCKET) - 1) +
                            [nbytes - BUCKET * (math.ceil(nbytes / BUCKET) - 1)])
                p(f"| {name} | {lname} | {n} | {r['ring']:.0%} | {r['ring_noov']:.0%} | {r['ps1']:.0%} | "
                  f"{r['ps4']:.0%} | {r['ps16']:.0%} | {fmt_t(t_all)} |")
    p()

    # --- what it takes to match published figures ---
    p("### What the model needs to match published figures (N = 512 unless said)")
    p()
    p(f"| target | model | busbw (GB/s) needed at the measured alpha ({alpha * 1e6:.0f} µs) | busbw needed at alpha 5 µs | "
      "busbw needed at alpha 5 µs without overlap | alpha (µs) allowed on 100 Gbit/s links |")
    p("|---|---|---:|---:|---:|---:|")
    targets = [("Horovod ResNet-101: 90% at 512", MODELS[1], 512, 0.90),
               ("Horovod VGG-16: 68% at 512", MODELS[2], 512, 0.68),
               ("TF paper: 11.64x on 32 (36%)", MODELS[0], 32, 11.64 / 32)]
    for label, (name, nbytes, compute, _), n, target in targets:
        def eff_at(bw, al, overlap=True, n=n, nbytes=nbytes, compute=compute):
            return efficiency(compute, exposed_comm(nbytes, compute, lambda b: float(ring_time(al, 1 / bw, n, b)), overlap))
        bw_need = solve_increasing(lambda bw: eff_at(bw, alpha), target, 1e6, 1e13)
        bw_need5 = solve_increasing(lambda bw: eff_at(bw, 5e-6), target, 1e6, 1e13)
        bw_need5_noov = solve_increasing(lambda bw: eff_at(bw, 5e-6, False), target, 1e6, 1e13)
        beta100 = 1 / (100e9 / 8 * eff_link)
        # the largest alpha that still reaches the target (efficiency falls as alpha grows)
        al_need = (float("nan") if eff_at(1 / beta100, 0.0) < target
                   else solve_increasing(lambda al: -eff_at(1 / beta100, al), -target, 0.0, 1.0))
        p(f"| {label} | {name} | {fmt_gbs(bw_need)} | {fmt_gbs(bw_need5)} | {fmt_gbs(bw_need5_noov)} | {fmt_alpha(al_need)} |")
    p()
    p("busbw here = 1/beta: the rate each rank's link must carry in each direction. '—': not reachable by that knob alone.")

    os.makedirs(a.data, exist_ok=True)
    subtitle = (f"ring: alpha {alpha * 1e6:.0f} µs, links at {eff_link:.0%} of their rate; PS: alpha {alpha_ps * 1e6:.0f} µs, "
                f"beta x max(1, {k_ps:.2f}) x max(1, N/S); fitted to measurements on {cpu_name()}")
    svg = os.path.join(a.data, "projection.svg")
    write_svg(svg, proj, subtitle)
    with open(os.path.join(a.data, "projection.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"\nwrote {os.path.relpath(svg, ROOT)} and {os.path.relpath(os.path.join(a.data, 'projection.md'), ROOT)}")


def solve_increasing(f, target: float, lo: float, hi: float) -> float:
    """The smallest x in [lo, hi] with f(x) >= target for f non-decreasing (geometric bisection
    when lo > 0); nan when even f(hi) < target; lo when f(lo) >= target."""
    if f(hi) < target:
        return float("nan")
    if f(lo) >= target:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi) if lo > 0 else 0.5 * (lo + hi)
        if f(mid) >= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return hi


def fmt_gbs(bw: float) -> str:
    return "—" if math.isnan(bw) else f"{bw / 1e9:.2f}"


def fmt_alpha(al: float) -> str:
    return "—" if math.isnan(al) else f"{al * 1e6:.1f}"


# ---------------------------------------------------------------------------------------
# Step-time validation: the model against real data-parallel training steps
# ---------------------------------------------------------------------------------------

GRAD_PARAMS = 235_146  # mnist_mlp: 784-256-128-10, weights and biases, float32
GRAD_BYTES = GRAD_PARAMS * 4  # 0.94 MB: one 25 MiB bucket, so nothing overlaps the backward pass
STEPTIME_DIR = os.path.join(DATA, "steptime-2026-11-24")
# (name, kind, data path, link, N): kind local (one process, --comm local), pair (two
# independent --comm local processes at once: the compute with both cores busy), loopback
# (gradus-run -np N, --comm ring), netns (one namespace per rank, tc tbf on each link)
STEP_CONFIGS = [
    ("local", "local", "-", "-", 1),
    ("local-x2", "pair", "-", "-", 2),
    ("shm-N2", "loopback", "shm", "loopback", 2),
    ("tcp-N2", "loopback", "tcp", "loopback", 2),
    ("shm-N3", "loopback", "shm", "loopback", 3),
    ("shm-N4", "loopback", "shm", "loopback", 4),
    ("tcp-N3", "loopback", "tcp", "loopback", 3),
    ("tcp-N4", "loopback", "tcp", "loopback", 4),
    ("tbf1gbit-N2", "netns", "tcp", "tbf1gbit", 2),
    ("tbf1gbit-N3", "netns", "tcp", "tbf1gbit", 3),
    ("tbf1gbit-N4", "netns", "tcp", "tbf1gbit", 4),
]
CLUSTER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG",
                "GRADUS_CLUSTER", "GRADUS_ROLE", "GRADUS_RANK", "GRADUS_PS", "GRADUS_PS_INDEX", "GRADUS_BIND_ADDR",
                "GRADUS_MASTER_ADDR", "GRADUS_MASTER_PORT", "OPENBLAS_CORETYPE", "GRADUS_COMM_TRANSPORT")


def step_env(extra: dict) -> dict:
    """One thread everywhere, passive OpenMP waits, no cluster variables but `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in CLUSTER_VARS and not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"})
    env.update(extra)
    return env


def json_lines(text: str) -> list[dict]:
    """The JSON objects among `text`'s lines (gradus-run's '[rank] ' prefix removed)."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"^\[\d+\]\s*", "", line.strip())
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def steps_per_epoch(j: dict) -> int:
    """As train_mnist counts them: ceil((train_examples // world) / batch)."""
    return -(-(int(j["train_examples"]) // int(j["world_size"])) // int(j["batch"]))


def file_id(path: str) -> str:
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    mtime = dt.datetime.fromtimestamp(os.path.getmtime(path), dt.timezone.utc)
    return f"sha256 {digest}, built {mtime:%Y-%m-%d %H:%M} UTC"


def run_step_config(cfg: tuple, exe: str, launcher: str, args: list[str], net: dict, timeout: float) -> list[dict]:
    """One run of a configuration; rank 0's JSON (both processes' for the pair)."""
    name, kind, path, link, n = cfg
    if kind in ("local", "pair"):
        argv = [exe, "--comm", "local", *args]
        outs: list = []
        run_ranks([argv] * n, [step_env({})] * n, timeout, outs)
        js = [j for o in outs for j in json_lines(o)]
    elif kind == "loopback":
        argv = [launcher, "-np", str(n), "--timeout", str(int(timeout)), exe, "--comm", "ring",
                "--comm-transport", path, *args]
        r = subprocess.run(argv, env=step_env({}), capture_output=True, text=True, timeout=timeout + 30)
        if r.returncode != 0:
            raise RuntimeError(f"{name}: gradus-run exit {r.returncode}: {r.stderr.strip()[-400:]}")
        js = json_lines(r.stdout)
    else:
        tag, subnet = net["tag"], net["subnet"]
        for rk in range(n):
            _sh("ip", "netns", "exec", f"{tag}n{rk}", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", *TBF[link])
        net["port"] += 1
        argvs, envs = [], []
        for rk in range(n):
            argvs.append(["ip", "netns", "exec", f"{tag}n{rk}", exe, "--comm", "ring", "--comm-transport", path, *args])
            envs.append(step_env({"RANK": str(rk), "WORLD_SIZE": str(n), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                  "MASTER_ADDR": f"{subnet}.1", "MASTER_PORT": str(net["port"]),
                                  "GRADUS_BIND_ADDR": f"{subnet}.{rk + 1}"}))
        out, _ = run_ranks(argvs, envs, timeout)
        js = json_lines(out)
    if len(js) != (n if kind == "pair" else 1):
        raise RuntimeError(f"{name}: expected {n if kind == 'pair' else 1} JSON line(s), got {len(js)}")
    return js


STEP_COLUMNS = ["config", "path", "link", "N", "repeat", "steps_per_epoch", "epoch_s", "wait_s", "ms_per_step",
                "wait_ms_per_step", "load1", "busy_before"]


def cmd_steptime_measure(a, configs: list) -> str:
    global IDLE_WAIT
    IDLE_WAIT = a.idle_wait
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    build = os.path.abspath(a.build)
    exe0 = os.path.join(build, "examples", "mnist_mlp")
    launcher0 = os.path.join(build, "tools", "gradus-run", "gradus-run")
    for f in (exe0, launcher0):
        if not os.access(f, os.X_OK):
            raise SystemExit(f"steptime: no {f} (cmake --build {a.build} --target mnist_mlp gradus-run)")
    # private copies: a rebuild of the build tree meanwhile cannot swap the binary under a run
    tmp = tempfile.mkdtemp(prefix="gradus-steptime-")
    atexit.register(shutil.rmtree, tmp, True)
    exe, launcher = os.path.join(tmp, "mnist_mlp"), os.path.join(tmp, "gradus-run")
    shutil.copy2(exe0, exe)
    shutil.copy2(launcher0, launcher)
    data_dir = os.path.abspath(a.mnist)
    args = ["--threads", "1", "--json", "--quiet", "--data", data_dir, "--epochs", str(a.epochs), "--seed", "1",
            "--batch", str(a.batch)]
    if a.train_limit:
        args += ["--train-limit", str(a.train_limit)]
    net: dict = {}
    if any(c[1] == "netns" for c in configs):
        if os.geteuid() != 0:
            raise SystemExit("steptime: network namespaces need root (or leave the netns configurations out)")
        net = {"tag": f"gst{os.getpid() % 100000}", "subnet": f"10.77.{210 + os.getpid() % 20}", "port": 29600}
        make_namespaces(net["tag"], net["subnet"], max(c[4] for c in configs if c[1] == "netns"))
    t_start = dt.datetime.now(dt.timezone.utc)
    load_start = loadavg()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "steptime.txt")

    def shown(f: str) -> str:
        return os.path.relpath(f, ROOT) if f.startswith(ROOT + os.sep) else f

    cmd = " ".join([shown(exe0), *[shown(x) if x == data_dir else x for x in args]])
    ids = f"mnist_mlp {file_id(exe0)}; gradus-run {file_id(launcher0)} (copied before the first run)"
    rows: list = []
    failed: list = []

    def write() -> None:  # after every run: what was measured survives an interruption
        header = [
            f"gradus data-parallel training step time: {cmd}",
            "  local: --comm local; local-x2: two such processes at once; <path>-N<n>: gradus-run -np <n> ... "
            "--comm ring --comm-transport <path> (loopback);",
            "  tbf1gbit-N<n>: --comm ring --comm-transport tcp, one network namespace per rank, veth pairs to a bridge, "
            f"tc qdisc tbf {' '.join(TBF['tbf1gbit'])} on each rank's eth0",
            "  env: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive, no OPENBLAS_CORETYPE",
            f"  {ids}; " + (f"built from {a.source_label}" if a.source_label else f"repository at {git_commit()} when measured"),
            f"{t_start:%Y-%m-%d %H:%M}-{dt.datetime.now(dt.timezone.utc):%H:%M} UTC, {cpu_name()}, {os.cpu_count()} "
            f"cores; load average at the start {load_start}, at the end {loadavg()}",
            "  ms_per_step = epoch_seconds (rank 0's mean training-loop seconds per epoch) / steps_per_epoch; "
            "wait = comm_wait_seconds (rank 0 waiting for the gradient all-reduce)",
            f"  busy_before: cores other processes used in the 2 s before the run (waited up to {a.idle_wait:.0f} s "
            "for < 0.1); load1: the 1-minute load average then",
            *[f"  FAILED: {x}" for x in failed],
        ]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(STEP_COLUMNS)]
        table = "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in [STEP_COLUMNS, *rows])
        with open(path, "w") as f:
            for h in header:
                f.write(f"# {h}\n")
            f.write(table + "\n")

    for rep in range(1, a.repeats + 1):  # repeats interleaved: a disturbance spreads over configurations
        for cfg in configs:
            idle = wait_idle_cores()
            load1 = loadavg().split()[0]
            try:
                js = run_step_config(cfg, exe, launcher, args, net, a.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failed.append(f"{cfg[0]} repeat {rep}: {str(e)[:300]}")
                print(f"FAILED {failed[-1]}", file=sys.stderr, flush=True)
                continue
            for j in js:
                spe = steps_per_epoch(j)
                rows.append([cfg[0], cfg[2], cfg[3], str(cfg[4]), str(rep), str(spe), f"{j['epoch_seconds']:.6f}",
                             f"{j['comm_wait_seconds']:.6f}", f"{j['epoch_seconds'] / spe * 1e3:.4f}",
                             f"{j['comm_wait_seconds'] / spe * 1e3:.4f}", load1, f"{idle:.2f}"])
                print("  ".join(rows[-1]), flush=True)
            write()
    _cleanup()
    write()
    print(f"wrote {os.path.relpath(path, ROOT)}", flush=True)
    return path


def read_steptime(path: str) -> tuple[dict, list[str]]:
    """{config: {"path", "link", "N", "ms": [...], "wait": [...], "busy": [...]}} and the '#' header."""
    cfgs: dict = {}
    header = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                header.append(line[1:].strip())
                continue
            cols = line.split()
            if not cols or cols[0] == "config":
                continue
            r = dict(zip(STEP_COLUMNS, cols))
            c = cfgs.setdefault(r["config"], {"path": r["path"], "link": r["link"], "N": int(r["N"]), "ms": [],
                                              "wait": [], "busy": [], "load1": []})
            c["ms"].append(float(r["ms_per_step"]))
            c["wait"].append(float(r["wait_ms_per_step"]))
            c["busy"].append(float(r["busy_before"]))
            c["load1"].append(float(r["load1"]))
    return cfgs, header


def measured_allreduce(points: list, n: int, nbytes: float) -> float:
    """allreduce_bench's own time at N = n for nbytes, log-log interpolated between the
    measured sizes around it (no model)."""
    pts = sorted((b, t) for m, b, t in points if m == n)
    b = np.log([p[0] for p in pts])
    t = np.log([p[1] for p in pts])
    return float(np.exp(np.interp(math.log(nbytes), b, t)))


def cmd_steptime_predict(a, path: str) -> None:
    lines: list[str] = []

    def p(s: str = "") -> None:
        print(s)
        lines.append(s)

    cfgs, header = read_steptime(path)
    if "local" not in cfgs:
        raise SystemExit(f"steptime: {path} has no 'local' (N = 1) rows: t_compute comes from them")
    data = read_ring_tables(a.fit_data)
    if not data:
        raise SystemExit(f"steptime: no allreduce_bench tables in {a.fit_data}")
    cores = a.cores
    t_c = float(np.median(cfgs["local"]["ms"])) * 1e-3
    fits = {k: fit_ring(v) for k, v in data.items()}
    fits_big = {k: fit_ring([x for x in v if x[1] >= (1 << 20)]) for k, v in data.items()}
    p(f"### Step time: measured against t_compute x max(1, N/{cores}) + t_allreduce(N, {GRAD_BYTES:,} bytes)")
    p()
    when = next((h for h in header if " UTC, " in h), "")
    p(f"Measured: {os.path.relpath(path, ROOT)} ({when}); medians of "
      f"{len(cfgs['local']['ms'])} runs.")
    p(f"t_compute = {t_c * 1e3:.3f} ms per step (the 'local' configuration, N = 1, one thread, batch 64).")
    p(f"t_allreduce: the α-β fit per data path and link on every size and N = 2, 3, 4 of {os.path.relpath(a.fit_data, ROOT)} "
      "(allreduce_bench, not these step times): "
      + "; ".join(f"{k[0]} / {k[1]}: α = {al * 1e6:.1f} µs, 1/β = {1 / be / 1e9:.3f} GB/s" for k, (al, be) in sorted(fits.items())
                  if any(c["path"] == k[0] and c["link"] == k[1] for c in cfgs.values())) + ".")
    p()
    p("| config | N | measured ms/step | of it waiting for the all-reduce | not waiting | compute term | "
      "predicted ms/step | error | the fit's all-reduce | allreduce_bench's own (interpolated) | predicted with it | "
      "error | ≥ 1 MiB fit: predicted | error |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, c in cfgs.items():
        ms, wait, n = float(np.median(c["ms"])), float(np.median(c["wait"])), c["N"]
        key = (c["path"], c["link"])
        if c["path"] == "-":  # local (t_compute itself) or local-x2 (t_compute with both cores busy)
            label = "local" if n == 1 else f"{name} ({n} independent --comm local processes at once)"
            p(f"| {label} | 1 | {ms:.3f} | — | {ms:.3f} | {t_c * 1e3:.3f} | {t_c * 1e3:.3f} | "
              f"{t_c / (ms * 1e-3) - 1:+.0%} | — | — | — | — | — | — |")
            continue
        if key not in data:
            p(f"| {name} | {n} | {ms:.3f} | {wait:.3f} | {ms - wait:.3f} | | no allreduce_bench tables for "
              f"{key[0]} / {key[1]} | | | | | | | |")
            continue
        comp = t_c * float(share(n, cores))
        ar = float(ring_time(*fits[key], n, GRAD_BYTES))
        ar_meas = measured_allreduce(data[key], n, GRAD_BYTES)
        ar_big = float(ring_time(*fits_big[key], n, GRAD_BYTES))
        pred, pred_m, pred_b = comp + ar, comp + ar_meas, comp + ar_big
        p(f"| {name} | {n} | {ms:.3f} | {wait:.3f} | {ms - wait:.3f} | {comp * 1e3:.3f} | {pred * 1e3:.3f} | "
          f"**{pred / (ms * 1e-3) - 1:+.0%}** | "
          f"{ar * 1e3:.3f} | {ar_meas * 1e3:.3f} | {pred_m * 1e3:.3f} | {pred_m / (ms * 1e-3) - 1:+.0%} | "
          f"{pred_b * 1e3:.3f} | {pred_b / (ms * 1e-3) - 1:+.0%} |")
    p()
    p(f"error = predicted / measured - 1; the target is within ±20%. Compute share max(1, N/{cores}): "
      f"{cores} cores for N ranks. 'of it waiting': rank 0's comm_wait_seconds per step (the all-reduce and "
      "any rank it waited for); 'not waiting' = measured - waiting (compute, the gradient's copies into and out of "
      "the bucket, the hand-off to the comm thread); compute term = t_compute x max(1, N/cores). Per run (ms/step): "
      + "; ".join(f"{k} {', '.join(f'{v:.3f}' for v in c['ms'])}" for k, c in cfgs.items()) + ".")
    out = os.path.join(os.path.dirname(path), "prediction.md")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"\nwrote {os.path.relpath(out, ROOT)}")


def cmd_steptime(a) -> None:
    names = [x for x in a.configs.split(",") if x]
    known = {c[0]: c for c in STEP_CONFIGS}
    if bad := [x for x in names if x not in known]:
        raise SystemExit(f"steptime --configs: unknown {bad} (known: {', '.join(known)})")
    configs = [known[x] for x in names]
    if a.predict_only:
        path = os.path.join(a.out, "steptime.txt")
    else:
        if "local" not in names:
            raise SystemExit("steptime: the 'local' configuration (N = 1) gives t_compute: keep it in --configs")
        path = cmd_steptime_measure(a, configs)
    cmd_steptime_predict(a, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    m = sub.add_parser("measure", help="run allreduce_bench (and ps_bench) and store the tables")
    m.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    m.add_argument("--ns", default="2,3,4", help="world sizes (default 2,3,4)")
    m.add_argument("--paths", default="tcp,shm", help="loopback data paths ('' for none)")
    m.add_argument("--links", default="tbf1gbit,tbf10gbit", help="shaped netns links ('' for none)")
    m.add_argument("--ps", action="store_true", help="also run ps_bench (loopback, CURVE off)")
    m.add_argument("--timeout", type=float, default=300, help="seconds for one run of N ranks")
    m.add_argument("--tag", default="", help="a repeat's name: its tables are ring_..._<link>.<tag>.txt; the model "
                   "takes, size by size, the smallest median over repeats")
    m.add_argument("--idle-wait", type=float, default=60, help="seconds to wait before each run for the cores "
                   "to be idle (other processes < 0.1 cores); runs anyway after that")
    m.add_argument("--source-label", default="", help="the commit the binaries were built from, for the tables' "
                   "headers (default: git describe --dirty of this tree)")
    for s in (sub.add_parser("model", help="fit, validate, project (default)"), ap):
        s.add_argument("--data", default=DATA, help="where the tables are (benchmarks/scaling)")
        s.add_argument("--link-fit", default="tbf1gbit", help="the link whose fitted efficiency scales to 10/100 Gbit/s")
        s.add_argument("--alpha-from", default="tcp/tbf10gbit", help="path/link whose fitted alpha the projection uses")
        s.add_argument("--alpha-ns", default="2", help="the world sizes that alpha is fitted on ('' for all; "
                       "default 2: no more ranks than cores)")
        s.add_argument("--cores", type=int, default=2, help="cores of the measuring machine (CPU-shared variant)")
    st = sub.add_parser("steptime", help="measure mnist_mlp's data-parallel step time and compare it with the model")
    st.add_argument("--build", default=os.path.join(ROOT, "build", "ci"), help="where examples/mnist_mlp and "
                    "tools/gradus-run/gradus-run are (build/ci)")
    st.add_argument("--mnist", default=os.path.join(ROOT, "data", "mnist"), help="the MNIST IDX files")
    st.add_argument("--configs", default=",".join(c[0] for c in STEP_CONFIGS),
                    help="comma-separated (default: all): " + ", ".join(c[0] for c in STEP_CONFIGS))
    st.add_argument("--epochs", type=int, default=2)
    st.add_argument("--batch", type=int, default=64)
    st.add_argument("--train-limit", type=int, default=0, help="mnist_mlp --train-limit (0: all 60000 images)")
    st.add_argument("--repeats", type=int, default=3)
    st.add_argument("--timeout", type=float, default=180, help="seconds for one run of N ranks")
    st.add_argument("--idle-wait", type=float, default=60, help="seconds to wait before each run for the cores "
                    "to be idle (other processes < 0.1 cores); runs anyway after that")
    st.add_argument("--out", default=STEPTIME_DIR, help="where steptime.txt and prediction.md go")
    st.add_argument("--fit-data", default=os.path.join(DATA, "idle-2026-11-24"),
                    help="the allreduce_bench tables the α-β fits come from")
    st.add_argument("--cores", type=int, default=2, help="cores of the measuring machine (compute share max(1, N/cores))")
    st.add_argument("--predict-only", action="store_true", help="no runs: compare --out's steptime.txt with the model")
    st.add_argument("--source-label", default="", help="what the binaries were built from, for the table's header "
                    "(default: git describe --dirty of this tree)")
    a = ap.parse_args()
    if a.cmd == "measure":
        cmd_measure(a)
    elif a.cmd == "steptime":
        cmd_steptime(a)
    else:
        cmd_model(a)


if __name__ == "__main__":
    main()
