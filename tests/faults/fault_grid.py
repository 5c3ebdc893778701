"""The fault battery's grid (issue 32): SIGKILL, SIGTERM and SIGSTOP of each role — the ring's
chief and worker, the parameter server's chief, worker and server (bsp), the pipeline's two
stages — at three moments: at its start (as soon as the processes are started, before they
loaded their data or met), mid-training, and while the chief writes a checkpoint (its temporary
on disk). Each cell is a case of fault_cases.CASES (ids `<system>.<signal>.<role>.<moment>`),
run and judged like the hand-written ones; the cells those already cover are left out.

What must happen: the other processes fail, naming the lost peer, within 3 s of a kill or
SIGTERM once training runs, and within --comm-timeout (5 s; the parameter server 4 s) plus
2 s of a SIGSTOP, of any fault before the rendezvous completed (a peer that never joined
cannot be told from a slow one before the deadline) and of a parameter server's kill (its
workers wait --comm-timeout for a restarted one); no checkpoint is lost (the last one is
whole when the fault came during the next one's write).
"""

import os
import signal
import time

from fault_cases import CASES, Case, base, result
from fault_harness import CaseError, checkpoint_intact

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}
MOMENTS = ("start", "mid", "checkpoint")
TIMEOUT = {"ring": 5, "ps": 4, "pipeline": 5}

# cells the hand-written cases already cover (fault_cases.py)
COVERED = {("ring", "kill", "worker", "mid"), ("ring", "kill", "chief", "mid"), ("ring", "term", "worker", "mid"),
           ("ring", "stop", "worker", "mid"), ("ring", "kill", "chief", "checkpoint"), ("ps", "kill", "worker", "mid"),
           ("ps", "kill", "chief", "mid"), ("ps", "kill", "server", "mid"), ("ps", "stop", "server", "mid"),
           ("pipeline", "kill", "stage1", "mid"), ("pipeline", "stop", "stage1", "mid")}

# cells CI's fast set runs (each fixed a finding: a stopped bsp worker blamed on server 0, a
# chief dead before its hello leaving both servers serving for ever)
FAST = {("ps", "stop", "worker", "mid"), ("ps", "kill", "chief", "start"), ("ring", "kill", "worker", "start")}

# how the survivors name the victim
NAMES = {("ring", "chief"): r"rank 0\b", ("ring", "worker"): r"rank 1\b", ("ps", "chief"): r"worker 0\b",
         ("ps", "worker"): r"worker 1\b", ("ps", "server"): r"server 1\b", ("pipeline", "stage0"): r"rank 0\b",
         ("pipeline", "stage1"): r"rank 1\b"}
FAILED = r"(gone|lost|silent|join|register|no answer|timed out|closed)"
ROLES = {"ring": ("chief", "worker"), "ps": ("chief", "worker", "server"), "pipeline": ("stage0", "stage1")}


def start_job(system, job, ctx, ck):
    """The job's processes: {role: process} and the processes that must fail when `role` goes."""
    t = str(TIMEOUT[system])
    if system == "ring":
        r = job.ranks(ctx["mnist_mlp"], 2, base(ctx, limit=3000) + ["--comm", "ring", "--comm-timeout", t,
                                                                     "--checkpoint", ck])
        return {"chief": r[0], "worker": r[1]}, r[0]
    if system == "ps":
        srv, wk = job.ps_job(ctx["mnist_mlp"], 2, 2, base(ctx, limit=3000) + ["--comm", "ps", "--consistency", "bsp",
                                                                           "--comm-timeout", t, "--checkpoint", ck])
        return {"chief": wk[0], "worker": wk[1], "server": srv[1], "server0": srv[0]}, wk[0]
    r = job.ranks(ctx["mnist_deep_mlp"], 2, base(ctx, limit=3000) + ["--comm", "ring", "--stages", "2", "--micro-batches",
                                                                      "4", "--comm-timeout", t, "--checkpoint", ck])
    return {"stage0": r[0], "stage1": r[1]}, r[0]


def grid_case(system, sig_name, role, moment):
    sig = SIGNALS[sig_name]

    def run(job, ctx):
        ck = os.path.join(job.work, "ckpt.npz")
        procs, chief = start_job(system, job, ctx, ck)
        victim = procs[role]
        if moment == "mid":
            job.training(chief)
        elif moment == "checkpoint":
            # the next checkpoint's temporary (its writer is inside save_checkpoint), after a whole first one
            files = lambda: os.listdir(job.work)
            job.wait_until("epoch 1's checkpoint written", lambda: any(f.endswith(".npz") for f in files()), 90,
                           [p for k, p in procs.items() if k != "server0"])
            deadline = time.monotonic() + 60
            while not any(".tmp" in f for f in files()) and time.monotonic() < deadline and chief.alive():
                time.sleep(0.0002)
            if not any(".tmp" in f for f in files()):
                raise CaseError("no checkpoint temporary seen within 60 s")
        job.signal(victim.pid, sig, f"SIG{sig_name.upper()} {role} ({moment})")
        survivors = [p for k, p in procs.items() if p is not victim and k not in ("server", "server0")]
        if moment == "checkpoint":
            checks = [checkpoint_intact(os.path.join(job.work, f)) for f in sorted(os.listdir(job.work)) if f.endswith(".npz")]
            ok = bool(checks) and all(c[0] for c in checks)
            what = "; ".join(c[1] for c in checks) or "no checkpoint"
            return result(detect=survivors, data=("no: " if ok else "YES: ") + what, data_ok=ok)
        return result(detect=survivors)
    return run


def add_grid():
    for system, roles in ROLES.items():
        for role in roles:
            for sig_name in SIGNALS:
                for moment in MOMENTS:
                    if (system, sig_name, role, moment) in COVERED:
                        continue
                    # a killed server gets --comm-timeout to come back (a launcher may restart it)
                    slow = sig_name == "stop" or moment == "start" or (system, role) == ("ps", "server")
                    bound = TIMEOUT[system] + 2 if slow else 3
                    what = {"start": "at its start", "mid": "mid-training", "checkpoint": "while the chief writes a checkpoint"}
                    CASES.append(Case(id=f"{system}.{sig_name}.{role}.{moment}", system=system if system != "ps" else "ps bsp",
                                      fault=f"SIG{sig_name.upper()} {role} {what[moment]} (--comm-timeout {TIMEOUT[system]})",
                                      expect="fails", message=f"{NAMES[(system, role)]}.*{FAILED}|{FAILED}.*{NAMES[(system, role)]}",
                                      shown=f"a survivor names `{NAMES[(system, role)]}` (gone, lost, silent, not joined...)",
                                      bound=bound, run=grid_case(system, sig_name, role, moment), limit=60,
                                      fast=(system, sig_name, role, moment) in FAST))


add_grid()
