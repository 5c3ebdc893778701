"""The fault battery's machinery (issue 32): start a job's processes the way clusters start
them, wait for a moment (training under way, a checkpoint being written), inject a fault
(a signal to one role, a pause, a full disk, junk on a port), and measure what happened:
each process's exit status and time, the first error line, seconds from the fault to the
first failure, and whether a checkpoint survived. The cases are in fault_cases.py, the
command line and the table in fault_matrix.py.

Every wait is bounded; every process started here is ended by PID (its own process group)
when the case ends, whatever happened.
"""

import os
import re
import signal
import subprocess
import sys
import time
import zipfile


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from free_port import free_port  # noqa: E402  (below the ephemeral range: free_port.hpp says why)


class Proc:
    """One process of a job: its role, its output files, its exit status and time."""

    def __init__(self, role, argv, env, work, n):
        self.role = role
        self.env = env
        name = f"{n:02d}-" + role.replace(" ", "_")  # two processes of one role keep their own files
        self.err_path = os.path.join(work, name + ".err")
        self.out_path = os.path.join(work, name + ".out")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        self.pid = self.popen.pid
        self.rc = None
        self.t_exit = None

    def poll(self):
        if self.rc is None:
            rc = self.popen.poll()
            if rc is not None:
                self.rc, self.t_exit = rc, time.monotonic()
        return self.rc

    def alive(self):
        return self.poll() is None

    def err(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode(errors="replace")

    def out(self):
        with open(self.out_path, "rb") as f:
            return f.read().decode(errors="replace")

    def end(self):
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=10)
        self.poll()


def children(pid):
    """The PIDs of a process's children (gradus-run's ranks and servers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


class Job:
    """The processes of one case, started by hand (torchrun's or TF_CONFIG's variables) or
    through gradus-run, and what happened to them."""

    def __init__(self, tools, work):
        self.tools = tools
        self.work = work
        self.procs = []
        self.t_fault = None
        self.notes = []
        self.cleanups = []
        self.stopped = set()  # PIDs left SIGSTOPped on purpose: not hung, ended at the case's end

    # ---- starting
    def env(self, **extra):
        e = dict(os.environ)
        e.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GRADUS_PS", "GRADUS_ROLE",
                  "GRADUS_PS_INDEX", "TF_CONFIG", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
            e.pop(k, None)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def start(self, role, argv, **env):
        p = Proc(role, [str(a) for a in argv], self.env(**env), self.work, len(self.procs))
        self.procs.append(p)
        return p

    def ranks(self, exe, n, args, per_rank=None, port=None, **env):
        """n ranks with torchrun's variables on 127.0.0.1 (per_rank(r) adds a rank's own arguments)."""
        port = port or free_port()
        return [self.start(f"rank {r}", [exe, *args, *(per_rank(r) if per_rank else [])], RANK=r, WORLD_SIZE=n,
                           LOCAL_RANK=r, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env) for r in range(n)]

    def ps_job(self, exe, workers, servers, args, per_worker=None, server_env=None, worker_env=None):
        """A parameter-server job by hand: servers first (GRADUS_ROLE=ps), then the workers."""
        port = free_port()
        ps = ",".join(f"127.0.0.1:{free_port()}" for _ in range(servers))
        common = dict(WORLD_SIZE=workers, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GRADUS_PS=ps)
        srv = [self.start(f"ps {i}", [exe, *args], GRADUS_ROLE="ps", GRADUS_PS_INDEX=i, **common,
                          **(server_env or {})) for i in range(servers)]
        wk = [self.start(f"worker {r}", [exe, *args, *(per_worker(r) if per_worker else [])], RANK=r,
                         LOCAL_RANK=r, **common, **(worker_env(r) if worker_env else {})) for r in range(workers)]
        return srv, wk

    def environ_of(self, p):
        return p.env

    def launcher(self, argv, **env):
        return self.start("gradus-run", [self.tools["run"], *argv], **env)

    def child(self, launcher, timeout=30, **want):
        """The launcher's child whose environment has every want (RANK=1, GRADUS_ROLE=ps...)."""
        want = {k.encode(): str(v).encode() for k, v in want.items()}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and launcher.alive():
            for c in children(launcher.pid):
                e = environ(c)
                if all(e.get(k) == v for k, v in want.items()):
                    return c
            time.sleep(0.02)
        raise CaseError(f"gradus-run started no process with {want} within {timeout} s")

    # ---- waiting
    def wait_until(self, what, pred, timeout, watch=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            for p in watch or []:
                if not p.alive():
                    raise CaseError(f"{p.role} exited ({p.rc}) before {what}: {last_error(p.err())}")
            time.sleep(0.01)
        raise CaseError(f"not {what} within {timeout} s")

    def training(self, p, timeout=60, step_re=r"step [0-9]+/"):
        """Until p's stderr shows a training step (the examples' --log-every lines)."""
        self.wait_until(f"{p.role} trains", lambda: re.search(step_re, p.err()), timeout, [p])

    # ---- faults
    def signal(self, pid, sig, what=None):
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped.add(pid)
        elif sig == signal.SIGCONT:
            self.stopped.discard(pid)
        if self.t_fault is None:
            self.t_fault = time.monotonic()
        self.notes.append(what or f"{signal.Signals(sig).name} to {pid}")

    def fault_now(self):
        if self.t_fault is None:
            self.t_fault = time.monotonic()

    def finish(self, limit):
        """Until every process exits (at most limit s from now); those left are 'hung'."""
        deadline = time.monotonic() + limit
        watched = [p for p in self.procs if p.pid not in self.stopped]
        # every process polled each round (not any(), which stops at the first alive one):
        # an exit's time is when it happened, not when the processes before it ended
        while time.monotonic() < deadline and sum(p.alive() for p in watched):
            time.sleep(0.02)
        hung = [p.role for p in watched if p.alive()]
        for p in self.procs:
            p.end()
        return hung

    def end(self):
        for p in self.procs:
            p.end()
        for c in reversed(self.cleanups):
            c()
        self.cleanups = []


class CaseError(Exception):
    """The case could not be set up as planned (not the fault's outcome)."""


class CaseSkipped(Exception):
    """This machine cannot run the case (no root to mount a tmpfs, no Open MPI)."""


ERROR_RE = re.compile(r"(error|failed|refus|cannot|gone|silent|lost|differs|expected|no space|not |killed|"
                      r"stopped|diverged|mismatch|asked for)", re.I)


def last_error(text):
    """The most telling line of a process's stderr: the last one that reads like an error."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ERROR_RE.search(ln) and not re.search(r"step [0-9]+/[0-9]+ loss", ln):
            return ln
    return lines[-1] if lines else ""


def checkpoint_intact(path):
    """Whether a checkpoint file is a whole .npz (every member's CRC checks), and the
    temporaries left beside it (a killed writer's; the next save removes them)."""
    d, base = os.path.split(path)
    left = [f for f in os.listdir(d or ".") if f.startswith(base + ".tmp")]
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            n = len(z.namelist())
    except (OSError, zipfile.BadZipFile) as e:
        return False, f"{os.path.basename(path)} unreadable: {e}"
    if bad is not None:
        return False, f"{os.path.basename(path)}: member {bad} corrupt"
    return True, f"{os.path.basename(path)} whole ({n} arrays)" + (f", {len(left)} temporary left" if left else "")
