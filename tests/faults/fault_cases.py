"""The cases of the fault battery (issue 32): for the ring, MPI, the parameter server in each
consistency mode and the pipeline, a fault or a mistake, what must happen, and the bound on
the time to notice it. fault_matrix.py runs them (`fast` ones in CI) and writes the table.

A case's run(job, ctx) starts the processes, injects the fault and returns which processes
must fail (`detect`: their first failure is the detection) or finish (`finish`: exit 0), and
optionally what became of the data. Outcome, message and detection are judged by the runner.
"""

import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from delay_proxy import DelayProxy
from fault_harness import CaseError, CaseSkipped, checkpoint_intact, children, environ, free_port, last_error
from netns import Namespaces

KILL, TERM, STOP, CONT = signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGCONT


@dataclass
class Case:
    id: str
    system: str
    fault: str
    expect: str  # "fails" (the processes in detect fail, naming the cause) or "finishes"
    message: str  # a regular expression the error (fails) or the output (finishes) must match
    bound: float  # seconds from the fault to the first failure (fails)
    run: callable
    fast: bool = False
    limit: float = 60  # seconds the job may take after the fault before it counts as hung
    needs: str = ""  # "root", "mpi": a case this machine may not be able to run
    shown: str = ""  # what the table says is expected, when not the message pattern itself


CASES = []


def case(**kw):
    def add(fn):
        CASES.append(Case(run=fn, **kw))
        return fn
    return add


def base(ctx, epochs=100, limit=6000, seed=1, data=None):
    return ["--data", data or ctx["data"], "--threads", "1", "--log-every", "10", "--train-limit", str(limit),
            "--seed", str(seed), "--epochs", str(epochs)]


def result(detect=(), finish=(), data=None, data_ok=True, observed_extra=None):
    return dict(detect=list(detect), finish=list(finish), data=data, data_ok=data_ok, observed_extra=observed_extra)


# ---------------------------------------------------------------- the ring (torchrun's variables)
def ring_signal(sig, victim, timeout=8):
    def run(job, ctx):
        ranks = job.ranks(ctx["mnist_mlp"], 2, base(ctx) + ["--comm", "ring", "--comm-timeout", str(timeout)])
        job.training(ranks[0])
        job.signal(ranks[victim].pid, sig, f"{sig.name} rank {victim}")
        return result(detect=[r for i, r in enumerate(ranks) if i != victim])
    return run


case(id="ring.kill.worker", system="ring", fault="SIGKILL rank 1 mid-collective", expect="fails",
     message=r"rank 1\b.*(gone|lost)", bound=2, fast=True)(ring_signal(KILL, 1))
case(id="ring.kill.chief", system="ring", fault="SIGKILL rank 0 (the chief) mid-collective", expect="fails",
     message=r"rank 0\b.*(gone|lost)", bound=2, fast=True)(ring_signal(KILL, 0))
case(id="ring.term.worker", system="ring", fault="SIGTERM rank 1 mid-collective", expect="fails",
     message=r"rank 1\b.*(gone|lost)", bound=2)(ring_signal(TERM, 1))
case(id="ring.stop.worker", system="ring", fault="SIGSTOP rank 1 for good (--comm-timeout 5)", expect="fails",
     message=r"rank 1\b.*silent", bound=5, limit=30)(ring_signal(STOP, 1, timeout=5))


@case(id="ring.pause.worker", system="ring", fault="SIGSTOP rank 1 for 3 s, then SIGCONT (--comm-timeout 8)",
      expect="finishes", message=r"test_accuracy", bound=0, fast=True)
def ring_pause(job, ctx):
    ranks = job.ranks(ctx["mnist_mlp"], 2, base(ctx, epochs=8) + ["--comm", "ring", "--comm-timeout", "8", "--json"])
    job.training(ranks[0])
    job.signal(ranks[1].pid, STOP, "SIGSTOP rank 1")
    time.sleep(3)
    job.signal(ranks[1].pid, CONT, "SIGCONT rank 1")
    return result(finish=ranks)


def rank_wrapper(job, ctx, body):
    """A script that runs the example, with body (bash) first in rank 1's first start."""
    path = os.path.join(job.work, "rank.sh")
    with open(path, "w") as f:
        f.write("#!/usr/bin/env bash\n"
                'if [[ ${RANK:-$OMPI_COMM_WORLD_RANK} == 1 && -z ${GRADUS_RESTART_COUNT:-} ]]; then\n'
                f"{body}\nfi\nexec {ctx['mnist_mlp']} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


@case(id="ring.kill.start", system="ring", fault="SIGKILL rank 1 at its start, before the rendezvous (gradus-run)",
      expect="fails", message=r"rank 1 was killed by signal 9", bound=2)
def ring_kill_at_start(job, ctx):
    wrapper = rank_wrapper(job, ctx, "kill -9 $$")
    job.fault_now()
    run = job.launcher(["-np", "2", wrapper, *base(ctx), "--comm", "ring"])
    return result(detect=[run])


@case(id="ring.kill.checkpoint", system="ring", fault="SIGKILL rank 0 while it writes a checkpoint", expect="fails",
      message=r"rank 0\b.*(gone|lost)", bound=2, fast=True)
def ring_kill_in_checkpoint(job, ctx):
    ck = os.path.join(job.work, "ckpt.npz")
    ranks = job.ranks(ctx["mnist_mlp"], 2, base(ctx, limit=3000) + ["--comm", "ring", "--checkpoint", ck])
    job.wait_until("epoch 1's checkpoint written", lambda: os.path.exists(ck), 60, ranks)
    # the next save's temporary (its writer is inside save_checkpoint), polled every 0.2 ms
    tmp = lambda: any(f.startswith("ckpt.npz.tmp") for f in os.listdir(job.work))
    deadline = time.monotonic() + 30
    while not tmp() and time.monotonic() < deadline and ranks[0].alive():
        time.sleep(0.0002)
    if not tmp():
        raise CaseError("no checkpoint temporary seen within 30 s")
    job.signal(ranks[0].pid, KILL, "SIGKILL rank 0 in save_checkpoint")
    ok, what = checkpoint_intact(ck)
    return result(detect=[ranks[1]], data=("no: " if ok else "YES: ") + what, data_ok=ok)


@case(id="ring.full_disk", system="ring", fault="the disk fills during a checkpoint (a 3 MiB tmpfs; 1.9 MB files)",
      expect="fails", message=r"ckpt\.npz.*(No space left|space)", bound=2, needs="root", fast=True)
def ring_full_disk(job, ctx):
    disk = os.path.join(job.work, "disk")
    os.mkdir(disk)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", disk], capture_output=True).returncode:
        raise CaseSkipped("cannot mount a tmpfs here (needs root and mount rights)")
    job.cleanups.append(lambda: subprocess.run(["umount", "-l", disk], capture_output=True))
    ck = os.path.join(disk, "ckpt.npz")
    ranks = job.ranks(ctx["mnist_mlp"], 2, base(ctx, limit=3000, epochs=3) + ["--comm", "ring", "--checkpoint", ck])
    job.wait_until("epoch 1's checkpoint written", lambda: os.path.exists(ck), 60, ranks)
    job.fault_now()  # the second save cannot fit beside the first
    job.finish(30)
    ok, what = checkpoint_intact(ck)
    left = [f for f in os.listdir(disk) if f != "ckpt.npz"]
    ok = ok and not left
    return result(detect=[ranks[0]], data=("no: " if ok else "YES: ") + what + (f"; left: {left}" if left else ""),
                  data_ok=ok)


@case(id="ring.restart", system="ring", fault="SIGKILL rank 1 mid-training, gradus-run --max-restarts 1",
      expect="finishes", message=r"restarts used: 1 of 1", bound=0, fast=True)
def ring_restart(job, ctx):
    ck = os.path.join(job.work, "run", "ckpt.npz")
    run = job.launcher(["-np", "2", "--max-restarts", "1", "--restart-delay", "0.2", ctx["mnist_mlp"],
                        *base(ctx, epochs=4, limit=6000), "--comm", "ring", "--checkpoint", ck, "--resume", "--json"])
    job.wait_until("epoch 1's checkpoint written", lambda: os.path.exists(ck), 60, [run])
    victim = job.child(run, RANK=1)
    job.signal(victim, KILL, "SIGKILL rank 1")
    job.finish(90)
    m = re.findall(r'"start_epoch": ?([0-9]+)', run.out())
    return result(finish=[run], data=f"no: resumed at epoch {m[-1]} from the last checkpoint" if m else "?",
                  data_ok=bool(m))


@case(id="ring.mismatch.lr", system="ring", fault="rank 1 started with another --lr", expect="fails",
      message=r"run fingerprint differs between ranks.*lr", bound=3, fast=True)
def ring_mismatch(job, ctx):
    job.fault_now()
    ranks = job.ranks(ctx["mnist_mlp"], 2, base(ctx) + ["--comm", "ring"],
                      per_rank=lambda r: ["--lr", "0.1"] if r == 1 else [])
    return result(detect=ranks)


@case(id="ring.port_in_use", system="ring", fault="the rendezvous port is taken by another program", expect="fails",
      message=r"cannot listen on 127\.0\.0\.1:[0-9]+.*Address already in use", bound=3, fast=True)
def ring_port_in_use(job, ctx):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    job.cleanups.append(s.close)
    job.fault_now()
    ranks = job.ranks(ctx["mnist_mlp"], 2, base(ctx) + ["--comm", "ring", "--comm-timeout", "5"],
                      port=s.getsockname()[1])
    return result(detect=[ranks[0]])


TWO_JOBS_REFUSAL = r"(Address already in use.*another job on this port|belongs to job .*two jobs on one)"


@case(id="ring.two_jobs_one_port", system="ring",
      fault="two jobs of 2 ranks started at once on one --port (gradus-run; each job its own --seed)",
      expect="finishes", message=r"replica checksum", bound=0, fast=True)
def ring_two_jobs(job, ctx):
    """Each job finishes, or (when their rendezvous overlap) one is refused naming the port;
    never do ranks of the two jobs meet (the ring refuses a rank of another GRADUS_JOB_ID)."""
    port = free_port()
    job.fault_now()
    jobs = [job.launcher(["-np", "2", "--port", port, ctx["mnist_mlp"], *base(ctx, epochs=4, seed=1 + j), "--comm", "ring",
                          "--comm-timeout", "5"]) for j in range(2)]
    job.finish(60)
    refused = [p for p in jobs if p.rc != 0 and re.search(TWO_JOBS_REFUSAL, p.err() + p.out())]
    said = "; ".join(f"job {i + 1} " + ("finished" if p.rc == 0 else "refused" if p in refused else f"FAILED ({p.rc})")
                     for i, p in enumerate(jobs))
    return result(finish=[p for p in jobs if p not in refused], observed_extra=lambda: said)


@case(id="ring.unresolvable_host", system="ring", fault="MASTER_ADDR a host name that does not resolve",
      expect="fails", message=r"no-such-host\.invalid", bound=5, fast=True)
def ring_bad_host(job, ctx):
    # a name is asked again until --comm-timeout (it may be published late: a Kubernetes
    # headless service), so the failure comes after about that long: 2 s here
    job.fault_now()
    ranks = [job.start(f"rank {r}", [ctx["mnist_mlp"], *base(ctx), "--comm", "ring", "--comm-timeout", "2"], RANK=r,
                       WORLD_SIZE=2, LOCAL_RANK=r, MASTER_ADDR="no-such-host.invalid", MASTER_PORT=free_port())
             for r in range(2)]
    return result(detect=ranks)


# ---------------------------------------------------------------- the network (namespaces, nftables)
def ranks_in_namespaces(job, ctx, ns, args):
    """A rank per namespace, over tcp to rank 0's address (torchrun's variables)."""
    return [job.start(f"rank {r}", ns.argv(r, [ctx["mnist_mlp"], *args]), RANK=r, WORLD_SIZE=ns.n, LOCAL_RANK=0,
                      MASTER_ADDR=ns.address(0), MASTER_PORT=29400) for r in range(ns.n)]


@case(id="ring.netns.loss", system="ring", fault="3 ranks in 3 network namespaces over tcp; 5 % of each rank's packets "
      "dropped, both ways (nftables)", expect="finishes", message=r"test_accuracy", bound=0, needs="root", limit=150)
def ring_loss(job, ctx):
    ns = Namespaces(job, 3)
    for r in range(3):
        ns.drop(r, 5)
    job.fault_now()
    return result(finish=ranks_in_namespaces(job, ctx, ns, base(ctx, epochs=1) +
                                             ["--comm", "ring", "--comm-transport", "tcp", "--comm-timeout", "20", "--json"]))


@case(id="ring.netns.partition", system="ring", fault="rank 2's namespace cut off mid-training: every packet dropped "
      "(--comm-timeout 5)", expect="fails", message=r"rank 2\b.*(silent|gone|lost)", bound=6, needs="root", fast=True, limit=40)
def ring_partition(job, ctx):
    ns = Namespaces(job, 3)
    ranks = ranks_in_namespaces(job, ctx, ns, base(ctx) + ["--comm", "ring", "--comm-transport", "tcp", "--comm-timeout", "5"])
    job.training(ranks[0])
    ns.drop(2, 100)
    job.fault_now()
    job.notes.append("rank 2 cut off")
    return result(detect=ranks[:2])


@case(id="ps.delay", system="ps bsp", fault="20 ms added each way between every worker and every server (a "
      "delaying TCP proxy: this kernel has no sch_netem for `tc netem delay`; --comm-timeout 4)",
      expect="finishes", message=r"test_accuracy", bound=0, limit=120)
def ps_delay(job, ctx):
    servers = [free_port() for _ in range(2)]
    proxies = [DelayProxy(("127.0.0.1", p), 0.020) for p in servers]
    for px in proxies:
        job.cleanups.append(px.close)
    common = dict(WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    args = base(ctx, epochs=1) + ["--comm", "ps", "--consistency", "bsp", "--comm-timeout", "4", "--json"]
    srv = [job.start(f"ps {i}", [ctx["mnist_mlp"], *args], GRADUS_ROLE="ps", GRADUS_PS_INDEX=i,
                     GRADUS_PS=",".join(f"127.0.0.1:{p}" for p in servers), **common) for i in range(2)]
    wk = [job.start(f"worker {r}", [ctx["mnist_mlp"], *args], RANK=r, LOCAL_RANK=r,
                    GRADUS_PS=",".join(f"127.0.0.1:{px.port}" for px in proxies), **common) for r in range(2)]
    job.fault_now()
    return result(finish=[*wk, *srv])


@case(id="ps.netns.partition.server", system="ps bsp", fault="ps 1's namespace cut off mid-training: every packet "
      "dropped (--comm-timeout 4)", expect="fails", message=r"server 1\b.*gone.*nothing answers at its address", bound=10, needs="root", limit=40)
def ps_partition(job, ctx):
    ns = Namespaces(job, 4)  # ps 0, ps 1, worker 0, worker 1
    servers = ",".join(f"{ns.address(i)}:29410" for i in range(2))
    common = dict(WORLD_SIZE=2, MASTER_ADDR=ns.address(2), MASTER_PORT=29400, GRADUS_PS=servers)
    args = base(ctx) + ["--comm", "ps", "--consistency", "bsp", "--comm-timeout", "4"]
    srv = [job.start(f"ps {i}", ns.argv(i, [ctx["mnist_mlp"], *args]), GRADUS_ROLE="ps", GRADUS_PS_INDEX=i, **common)
           for i in range(2)]
    wk = [job.start(f"worker {r}", ns.argv(2 + r, [ctx["mnist_mlp"], *args]), RANK=r, LOCAL_RANK=0, **common)
          for r in range(2)]
    job.training(wk[0])
    ns.drop(1, 100)
    job.fault_now()
    job.notes.append("ps 1 cut off")
    return result(detect=[*wk, srv[0]])


# ---------------------------------------------------------------- data files
def bad_data(how):
    def run(job, ctx):
        d = os.path.join(job.work, "mnist")
        os.mkdir(d)
        for f in os.listdir(ctx["data"]):
            os.symlink(os.path.join(ctx["data"], f), os.path.join(d, f))
        img = os.path.join(d, "train-images-idx3-ubyte")
        os.unlink(img)
        with open(os.path.join(ctx["data"], "train-images-idx3-ubyte"), "rb") as f:
            head = f.read(100000)
        with open(img, "wb") as f:
            f.write(head if how == "truncated" else b"\x00\x00\x08\x04" + b"\xff" * 12 + head[16:])
        job.fault_now()
        p = job.start("rank 0", [ctx["mnist_mlp"], *base(ctx, data=d)])
        return result(detect=[p])
    return run


case(id="data.truncated", system="data", fault="a truncated training-image file (100 kB of 47 MB)", expect="fails",
     message=r"train-images-idx3-ubyte", bound=2, fast=True)(bad_data("truncated"))
case(id="data.corrupt_header", system="data", fault="an image file whose header claims 2^32-1 images",
     expect="fails", message=r"train-images-idx3-ubyte", bound=2)(bad_data("header"))


# ---------------------------------------------------------------- MPI
def mpi_rank(launcher, rank, timeout=30):
    """The PID of mpirun's rank `rank` (the example under mpirun's process tree)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = [launcher.pid]
        while pending:
            pid = pending.pop()
            for c in children(pid):
                if environ(c).get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode() and \
                        os.path.basename(os.readlink(f"/proc/{c}/exe")) == "mnist_mlp":
                    return c
                pending.append(c)
        time.sleep(0.05)
    raise CaseError(f"mpirun started no rank {rank} within {timeout} s")


@case(id="mpi.kill.worker", system="mpi", fault="SIGKILL rank 1 mid-collective (mpirun -np 2)", expect="fails",
      message=r"rank 1|signal 9|Killed", bound=3, needs="mpi", fast=True)
def mpi_kill(job, ctx):
    run = job.start("mpirun", [*ctx["mpirun"], "-np", "2", ctx["mnist_mlp"], *base(ctx), "--comm", "mpi"])
    job.training(run)
    job.signal(mpi_rank(run, 1), KILL, "SIGKILL rank 1")
    return result(detect=[run])


# ---------------------------------------------------------------- the parameter server (by hand)
def ps_worker_killed(mode, expect):
    def run(job, ctx):
        srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 2, base(ctx, epochs=3 if expect == "finishes" else 100) +
                             ["--comm", "ps", "--consistency", mode, "--comm-timeout", "5"])
        job.training(wk[0])
        job.signal(wk[1].pid, KILL, "SIGKILL worker 1")
        if expect == "finishes":
            return result(finish=[wk[0], *srv])
        return result(detect=[wk[0], *srv])
    return run


case(id="ps.bsp.kill.worker", system="ps bsp", fault="SIGKILL worker 1 mid-step", expect="fails",
     message=r"worker 1 .*was lost", bound=2, fast=True)(ps_worker_killed("bsp", "fails"))
case(id="ps.async.kill.worker", system="ps async", fault="SIGKILL worker 1 mid-training", expect="finishes",
     message=r"test_accuracy|step", bound=0, fast=True)(ps_worker_killed("async", "finishes"))
case(id="ps.ssp.kill.worker", system="ps ssp:2", fault="SIGKILL worker 1 mid-training", expect="finishes",
     message=r"test_accuracy|step", bound=0)(ps_worker_killed("ssp:2", "finishes"))


@case(id="ps.bsp.kill.chief", system="ps bsp", fault="SIGKILL worker 0 (the chief) mid-step", expect="fails",
      message=r"worker 0 .*was lost", bound=2)
def ps_chief_killed(job, ctx):
    srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 2, base(ctx) + ["--comm", "ps", "--consistency", "bsp"])
    job.training(wk[0])
    job.signal(wk[0].pid, KILL, "SIGKILL worker 0")
    return result(detect=[wk[1], *srv])


def ps_server_signal(sig, mode="bsp", pause=None, timeout=4):
    def run(job, ctx):
        srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 2, base(ctx, epochs=6 if pause else 100) +
                             ["--comm", "ps", "--consistency", mode, "--comm-timeout", str(timeout), "--json"])
        job.training(wk[0])
        job.signal(srv[1].pid, sig, f"{sig.name} ps 1")
        if pause:
            time.sleep(pause)
            job.signal(srv[1].pid, CONT, "SIGCONT ps 1")
            return result(finish=[*wk, *srv])
        return result(detect=wk)
    return run


case(id="ps.bsp.kill.server", system="ps bsp", fault="SIGKILL ps 1, nothing restarts it (--comm-timeout 4)",
     expect="fails", message=r"server 1 .*(gone|did not come back)", bound=8, fast=True)(ps_server_signal(KILL))
case(id="ps.bsp.stop.server", system="ps bsp", fault="SIGSTOP ps 1 for good (--comm-timeout 4)", expect="fails",
     message=r"server 1\b", bound=6, limit=60)(ps_server_signal(STOP))
case(id="ps.bsp.pause.server", system="ps bsp", fault="SIGSTOP ps 1 for 5 s, then SIGCONT (--comm-timeout 8)",
     expect="finishes", message=r"test_accuracy", bound=0)(ps_server_signal(STOP, pause=5, timeout=8))


@case(id="ps.restart.server", system="ps bsp", fault="SIGKILL ps 1 mid-training, gradus-run --max-restarts 1",
      expect="finishes", message=r"test_accuracy", bound=0)
def ps_server_restart(job, ctx):
    ck = os.path.join(job.work, "ckpt.npz")
    run = job.launcher(["-np", "2", "--ps", "2", "--max-restarts", "1", "--restart-delay", "0.5", ctx["mnist_mlp"],
                        *base(ctx, epochs=4), "--comm", "ps", "--consistency", "bsp", "--checkpoint", ck, "--json"])
    job.wait_until("epoch 1's checkpoint written", lambda: os.path.exists(ck), 60, [run])
    job.signal(job.child(run, GRADUS_ROLE="ps", GRADUS_PS_INDEX=1), KILL, "SIGKILL ps 1")
    return result(finish=[run], data="updates since the last checkpoint on ps 1's shards (by design)")


@case(id="ps.restart.worker", system="ps async", fault="SIGKILL worker 1 in epoch 2, gradus-run --max-restarts 1",
      expect="finishes", message=r"is back at clock", bound=0)
def ps_worker_restart(job, ctx):
    run = job.launcher(["-np", "2", "--ps", "2", "--max-restarts", "1", "--restart-delay", "0.5", ctx["mnist_mlp"],
                        *base(ctx, epochs=40), "--comm", "ps", "--consistency", "async", "--json"])
    job.wait_until("rank 1's first epoch end", lambda: "rank 1 of 2: epoch 1:" in run.err() + run.out(), 60, [run])
    job.signal(job.child(run, GRADUS_ROLE="worker", RANK=1), KILL, "SIGKILL worker 1")
    return result(finish=[run], data="the rest of the epoch worker 1 had not reached (by design)")


@case(id="ps.mismatch.consistency", system="ps", fault="worker 1 started with --consistency async, the rest bsp",
      expect="fails", message=r"consisten", bound=5, fast=True, limit=40)
def ps_mismatch(job, ctx):
    job.fault_now()
    srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 2, base(ctx) + ["--comm", "ps"],
                         per_worker=lambda r: ["--consistency", "async" if r == 1 else "bsp"])
    return result(detect=[*wk, *srv])


@case(id="ps.curve.wrong_key", system="ps", fault="CURVE: worker 1's key is not on the servers' allow-list",
      expect="fails", message=r"(refus|not on the allow|allow-list|authenticat)", bound=5)
def ps_wrong_key(job, ctx):
    keygen, d = ctx["keygen"], job.work
    for name in ("server", "w0", "w1"):
        subprocess.run([keygen, os.path.join(d, name)], check=True, capture_output=True)
    allow = os.path.join(d, "allow.txt")
    subprocess.run([keygen, "--allow", os.path.join(d, "w0.pub"), "--rank", "0", "--list", allow], check=True,
                   capture_output=True)
    job.fault_now()
    srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 1, base(ctx) + ["--comm", "ps", "--comm-timeout", "5"],
                         server_env=dict(GRADUS_PS_CURVE_SERVER_KEY=f"{d}/server.key", GRADUS_PS_CURVE_ALLOW=allow),
                         worker_env=lambda r: dict(GRADUS_PS_CURVE_SERVER_PUB=f"{d}/server.pub",
                                                   GRADUS_PS_CURVE_CLIENT_KEY=f"{d}/w{r}.key"))
    return result(detect=[wk[1]])


def zmtp_junk(port, seconds, stop):
    """A stranger on a server's port: a ZMTP 3.0 NULL handshake as a DEALER (what any ZeroMQ
    client sends), then messages of random bytes and sizes; returns how many were sent."""
    rng, sent = __import__("random").Random(32), 0
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
    prop = lambda k, v: bytes([len(k)]) + k + len(v).to_bytes(4, "big") + v
    ready = b"\x05READY" + prop(b"Socket-Type", b"DEALER") + prop(b"Identity", b"")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(greeting + bytes([0x04, len(ready)]) + ready)
                for _ in range(200):
                    body = rng.randbytes(rng.randrange(1, 250))
                    s.sendall(bytes([0x00, len(body)]) + body)
                    sent += 1
                s.settimeout(0.05)
                try:
                    s.recv(4096)
                except OSError:
                    pass
        except OSError:
            time.sleep(0.05)
    return sent


def ps_job_training(job, ctx, epochs):
    """An async ps job (2 workers, 2 servers) by hand, once worker 0 trains: its processes and ps 0's port."""
    srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 2, base(ctx, epochs=epochs) + ["--comm", "ps", "--consistency", "async",
                                                                          "--json"])
    job.training(wk[0])
    job.fault_now()
    return srv, wk, int(job.environ_of(srv[0])["GRADUS_PS"].split(",")[0].rsplit(":", 1)[1])


@case(id="ps.junk_flood", system="ps async", fault="a stranger sends malformed frames to ps 0 while training runs",
      expect="finishes", message=r"dropped; [0-9]+ so far", bound=0, fast=True)
def ps_junk(job, ctx):
    srv, wk, port = ps_job_training(job, ctx, 6)
    stop, sent = threading.Event(), []
    t = threading.Thread(target=lambda: sent.append(zmtp_junk(port, 3, stop)))
    t.start()
    job.cleanups.append(lambda: (stop.set(), t.join()))
    t.join()
    counted = lambda: max(map(int, re.findall(r"dropped; ([0-9]+) so far", srv[0].err())), default=0)
    return result(finish=[*wk, *srv], observed_extra=lambda: f"{sent[0] if sent else 0} junk messages sent; the "
                  f"server's log counts {counted()} malformed by then (it logs at powers of two)")


def zmtp_stranger(port):
    """A connection to a server's port that completed ZeroMQ's NULL handshake as a DEALER."""
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
    prop = lambda k, v: bytes([len(k)]) + k + len(v).to_bytes(4, "big") + v
    ready = b"\x05READY" + prop(b"Socket-Type", b"DEALER") + prop(b"Identity", b"")
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(greeting + bytes([0x04, len(ready)]) + ready)
    return s


def rss_mib(p):
    """A running process's resident memory."""
    try:
        with open(f"/proc/{p.pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        raise CaseError(f"{p.role} is not running any more ({p.poll()}): {last_error(p.err())}")


@case(id="ps.oversized_frames", system="ps async", fault="a stranger (no CURVE) announces a 1 GiB frame to ps 0, then "
      "sends 60 MiB of a 64 MiB frame on each of 3 connections and holds them 3 s, while training runs",
      expect="finishes", message=r"test_accuracy", bound=0)
def ps_oversized(job, ctx):
    srv, wk, port = ps_job_training(job, ctx, 100)
    before = rss_mib(srv[0])
    # a frame over the limit (64 MiB): ZeroMQ closes the connection at its size, before any byte of it
    s = zmtp_stranger(port)
    t0 = time.monotonic()
    s.sendall(bytes([0x02]) + (1 << 30).to_bytes(8, "big") + b"\0" * 4096)
    s.settimeout(5)
    try:
        closed = s.recv(4096) == b"" or True
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    closed_ms = (time.monotonic() - t0) * 1000
    s.close()
    if not closed:
        raise CaseError("ps 0 kept a connection that announced a 1 GiB frame (over its 64 MiB limit) for 5 s")
    # frames under the limit, held incomplete: ZeroMQ keeps each until it is complete
    held, chunk = [], b"\x5a" * (1 << 20)
    for _ in range(3):
        c = zmtp_stranger(port)
        c.sendall(bytes([0x02]) + (64 << 20).to_bytes(8, "big"))
        for _ in range(60):
            c.sendall(chunk)
        held.append(c)
    time.sleep(3)
    peak = rss_mib(srv[0])
    for c in held:
        c.close()
    seen = (f"the 1 GiB frame's connection closed in {closed_ms:.0f} ms; with 3 x 60 MiB held ps 0's RSS went "
            f"{before:.0f} -> {peak:.0f} MiB (bound: 3 x 64)")
    if peak - before > 3 * 64 + 32:
        raise CaseError(f"ps 0's RSS rose by {peak - before:.0f} MiB for 3 connections of at most 64 MiB each")
    return result(finish=[*wk, *srv], observed_extra=lambda: seen)


# ---------------------------------------------------------------- the pipeline (2 stages, ring)
def stage_signal(sig, timeout=30):
    def run(job, ctx):
        ranks = job.ranks(ctx["mnist_deep_mlp"], 2, base(ctx) + ["--comm", "ring", "--stages", "2", "--micro-batches",
                                                                  "4", "--comm-timeout", str(timeout)])
        job.training(ranks[0])
        job.signal(ranks[1].pid, sig, f"{sig.name} stage 1")
        return result(detect=[ranks[0]])
    return run


case(id="pipeline.kill.stage", system="pipeline", fault="SIGKILL stage 1 (rank 1) mid-batch", expect="fails",
     message=r"pipeline stage 0 \(rank 0\)(, micro-batch [0-9]+|: waiting for the batch's loss from rank 1): .*rank 1.*gone",
     bound=2,
     fast=True)(stage_signal(KILL))
case(id="pipeline.stop.stage", system="pipeline", fault="SIGSTOP stage 1 for good (--comm-timeout 5)",
     expect="fails", message=r"pipeline stage 0 .*rank 1.*silent", bound=5, limit=30)(stage_signal(STOP, 5))


@case(id="pipeline.mismatch.micro_batches", system="pipeline", fault="rank 1 started with another --micro-batches",
      expect="fails", message=r"micro-batches 2, this rank with 4|micro-batches 4, this rank with 2", bound=3, fast=True)
def stage_mismatch(job, ctx):
    job.fault_now()
    ranks = job.ranks(ctx["mnist_deep_mlp"], 2, base(ctx) + ["--comm", "ring", "--stages", "2"],
                      per_rank=lambda r: ["--micro-batches", "4" if r else "2"])
    return result(detect=ranks)
