#!/usr/bin/env python3
"""The soak (issue 32): long jobs under chaos, as a cluster would run them.

Three jobs one after another, each through gradus-run with --max-restarts, on the whole of
MNIST (mnist_mlp), for about a third of --minutes each:
  ps-async  4 workers, 2 parameter servers, --consistency async
  ps-ssp    4 workers, 2 parameter servers, --consistency ssp:2
  ring      4 ranks, ring all-reduce, --resume (a group restart resumes from the checkpoint)
While each trains, a chaos loop (seeded: --seed) sends SIGKILL or SIGTERM at random moments
(every 10-25 s after a 20 s warm-up, none in the last 30 s) to a parameter server or a
worker other than the chief (ps jobs: gradus-run restarts what was hit alone; a server
reloads its shards from the chief's checkpoint, a worker comes back at the others' next
epoch end) or to any rank (ring: gradus-run restarts the whole group, every rank resumes
from the checkpoint).

At the end of each job it checks, and fails when any does not hold:
  - the job finished (gradus-run exit 0) and reached --target test accuracy;
  - every fault injected was survived: gradus-run restarted what was killed — that alone,
    once per fault (a restart of a process the chaos did not touch fails the job) — and its
    final line counts the restarts;
  - nothing was left behind: no process carrying this soak's token in its environment, no
    checkpoint temporary, no new entry in /dev/shm;
  - resident memory was flat after warm-up: for every process that lived at least 60 s
    (gradus-run, the servers and ranks that were never killed), the largest RSS in the last
    third of its life is at most RSS_SLACK (5 %) + RSS_FLOOR_MB (8 MiB) above the largest in
    the 20 s after its warm-up (its first 30 s).
It prints a table (and --docs rewrites docs/reliability.md's soak section with it).

Not done here (said in docs/reliability.md): killing the parameter-server job's chief. It
comes back like any worker, but one that comes back after the last epoch's end finds the job
over and exits without the evaluation and JSON line this check reads.

Every wait is bounded (a job's hard limit is twice its planned time); every process started
here is ended by PID (its own process group) on the way out. A failing job's output is kept
(its directory is printed), as with GRADUS_SOAK_KEEP=1.

  tests/soak/soak.py --bin build/ci --data data/mnist --minutes 10 [--seed N] [--docs docs/reliability.md]
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "faults"))
from fault_harness import Job, children, environ  # noqa: E402

RSS_SLACK = 0.05
RSS_FLOOR_MB = 8.0
WARMUP_S = 30.0
FIRST_FAULT_S, GAP_S, QUIET_END_S = 20.0, (10.0, 25.0), 30.0


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def role_of(pid):
    e = environ(pid)
    if e.get(b"GRADUS_ROLE") == b"ps":
        return "ps " + e.get(b"GRADUS_PS_INDEX", b"?").decode()
    if b"RANK" in e:
        return "rank " + e[b"RANK"].decode()
    return None


def token_processes(token):
    """PIDs of every process whose environment carries this soak's token."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and environ(int(d)).get(b"GRADUS_SOAK_TOKEN") == token.encode():
            found.append(int(d))
    return found


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


class Memory:
    """RSS samples of the launcher and every process under it, by PID."""

    def __init__(self):
        self.samples = {}  # pid -> (role, [(t, mb)])

    def sample(self, launcher_pid, t):
        for pid in [launcher_pid, *descendants(launcher_pid)]:
            mb = rss_mb(pid)
            if mb is None:
                continue
            role = "gradus-run" if pid == launcher_pid else role_of(pid)
            if role is None:
                continue
            self.samples.setdefault(pid, (role, []))[1].append((t, mb))

    def verdicts(self):
        """[(role, pid, lifetime, warm MiB, late MiB, ok)] for processes that lived >= 60 s."""
        rows = []
        for pid, (role, s) in sorted(self.samples.items(), key=lambda kv: kv[1][0]):
            t0, t1 = s[0][0], s[-1][0]
            if t1 - t0 < 60:
                continue
            warm = [mb for t, mb in s if t0 + WARMUP_S <= t <= t0 + WARMUP_S + 20]
            late = [mb for t, mb in s if t >= t1 - (t1 - t0) / 3]
            if not warm or not late:
                continue
            w, l = max(warm), max(late)
            rows.append((role, pid, t1 - t0, w, l, l <= w * (1 + RSS_SLACK) + RSS_FLOOR_MB))
        return rows


def json_line(text):
    for line in reversed(text.splitlines()):
        line = re.sub(r"^\[\d+\] ", "", line.strip())
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def epoch_seconds(text):
    """Rank 0's seconds per epoch from its 'rank 0 of N: epoch E: S s training' lines."""
    secs = [float(m.group(1)) for m in re.finditer(r"rank 0 of \d+: epoch \d+: ([0-9.]+) s training", text)]
    return statistics.median(secs) if secs else None


class Phase:
    def __init__(self, name, np_args, comm_args, victims):
        self.name, self.np_args, self.comm_args, self.victims = name, np_args, comm_args, victims


PHASES = [
    Phase("ps-async", ["-np", "4", "--ps", "2"], ["--comm", "ps", "--consistency", "async"], "servers and workers"),
    Phase("ps-ssp", ["-np", "4", "--ps", "2"], ["--comm", "ps", "--consistency", "ssp:2"], "servers and workers"),
    Phase("ring", ["-np", "4"], ["--comm", "ring", "--resume"], "ranks"),
]


def victims(phase, launcher_pid):
    """(pid, role) of the processes chaos may hit now."""
    out = []
    for c in children(launcher_pid):
        role = role_of(c)
        if role is None:
            continue
        if phase.victims == "servers and workers" and (role.startswith("ps ") or (role.startswith("rank ") and role != "rank 0")):
            out.append((c, role))
        elif phase.victims == "ranks" and role.startswith("rank "):
            out.append((c, role))
    return out


def run_phase(phase, a, seconds, rng, token):
    work = tempfile.mkdtemp(prefix=f"gradus-soak-{phase.name}-")
    job = Job(dict(run=a.run), work)
    ck = os.path.join(work, "ckpt.npz")
    common = ["--data", a.data, "--threads", "1", "--seed", str(a.seed), "--json"]
    shm_before = shm_entries()
    row = dict(job=phase.name, faults=[], restarts=0, accuracy=None, epochs=0, ok=False, why=[])
    try:
        # calibration: two epochs, no chaos, for the epoch count that fills the phase
        cal = job.launcher([*phase.np_args, "--timeout", "120", a.example, *common, "--epochs", "2",
                            *[x for x in phase.comm_args if x != "--resume"]],
                           GRADUS_SOAK_TOKEN=token)
        deadline = time.monotonic() + 150
        while cal.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        per_epoch = epoch_seconds(cal.err() + cal.out())
        if cal.rc != 0 or not per_epoch:
            row["why"].append(f"calibration failed ({cal.rc}): {(cal.err() + cal.out())[-400:]}")
            return row
        epochs = max(4, int(seconds * 0.8 / per_epoch))
        row["epochs"] = epochs

        launcher = job.launcher([*phase.np_args, "--max-restarts", "50", "--restart-delay", "0.5",
                                 "--timeout", str(int(seconds * 2)), a.example, *common, "--checkpoint", ck, "--epochs", str(epochs),
                                 "--log-every", "100000", *phase.comm_args], GRADUS_SOAK_TOKEN=token)
        t0 = time.monotonic()
        hard = t0 + seconds * 2 + 30
        mem = Memory()
        next_fault = t0 + FIRST_FAULT_S
        planned_end = t0 + epochs * per_epoch
        next_sample = t0
        while launcher.alive() and time.monotonic() < hard:
            now = time.monotonic()
            if now >= next_sample:
                mem.sample(launcher.pid, now)
                next_sample = now + 2
            if now >= next_fault and now < planned_end - QUIET_END_S and os.path.exists(ck):
                v = victims(phase, launcher.pid)
                if v:
                    pid, role = rng.choice(v)
                    sig = signal.SIGKILL if rng.random() < 0.7 else signal.SIGTERM
                    try:
                        os.kill(pid, sig)
                        row["faults"].append((round(now - t0, 1), role, sig.name))
                    except ProcessLookupError:
                        pass
                next_fault = now + rng.uniform(*GAP_S)
            time.sleep(0.25)
        row["seconds"] = time.monotonic() - t0
        if launcher.alive():
            row["why"].append(f"still running after {hard - t0:.0f} s")
            return row
        text = launcher.err() + launcher.out()
        final = [ln for ln in text.splitlines() if ln.startswith("gradus-run: finished") or ln.startswith("gradus-run: failed")]
        row["final"] = final[-1] if final else ""
        row["restarts"] = len(re.findall(r"^gradus-run: .*restarting", text, re.M))
        j = json_line(text)
        row["accuracy"] = j.get("test_accuracy") if j else None
        if launcher.rc != 0:
            row["why"].append(f"gradus-run exited {launcher.rc}: {row['final'] or text[-300:]}")
        if row["accuracy"] is None or row["accuracy"] < a.target:
            row["why"].append(f"test accuracy {row['accuracy']} (target {a.target})")
        if row["restarts"] != len(row["faults"]):
            # each fault restarts what it hit (a server, or the ring's group) once; more
            # restarts mean processes the chaos did not touch failed too
            lines = [ln for ln in text.splitlines() if re.match(r"gradus-run: .*restarting", ln)]
            row["why"].append(f"{len(row['faults'])} faults but {row['restarts']} restarts: " + " / ".join(lines[:30]))
        row["memory"] = mem.verdicts()
        for role, pid, life, w, l, ok in row["memory"]:
            if not ok:
                row["why"].append(f"{role} (pid {pid}) grew from {w:.1f} to {l:.1f} MiB after warm-up")
        # nothing left behind
        time.sleep(1)
        left = [p for p in token_processes(token) if p != os.getpid()]
        if left:
            row["why"].append(f"processes left: {left}")
        tmp = [f for f in os.listdir(work) if ".tmp" in f]
        if tmp:
            row["why"].append(f"temporaries left: {tmp}")
        new_shm = sorted(shm_entries() - shm_before)
        if new_shm:
            row["why"].append(f"/dev/shm entries left: {new_shm}")
        row["ok"] = not row["why"]
        return row
    finally:
        job.end()
        if os.environ.get("GRADUS_SOAK_KEEP") or not row["ok"]:
            print(f"soak: {phase.name}: the output is kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def table(rows, header):
    out = [header, "",
           "| job | epochs | seconds | faults injected | restarts | survived | test accuracy | RSS after warm-up (MiB, first → last third) | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        faults = ", ".join(f"{t} s {role} {sig}" for t, role, sig in r["faults"]) or "none"
        mem = "; ".join(f"{role} {w:.0f} → {l:.0f}" for role, _, _, w, l, _ in r.get("memory", [])) or "—"
        acc = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "—"
        survived = f"{len(r['faults'])} of {len(r['faults'])}" if r["ok"] else "—"
        verdict = "ok" if r["ok"] else "failing: " + "; ".join(r["why"])
        out.append(f"| {r['job']} | {r['epochs']} | {r.get('seconds', 0):.0f} | {len(r['faults'])}: {faults} | {r['restarts']} | "
                   f"{survived} | {acc} | {mem} | {verdict} |")
    return "\n".join(out) + "\n"


def write_docs(path, text):
    begin, end = "<!-- soak: begin (tests/soak/soak.py --docs writes this section) -->", "<!-- soak: end -->"
    with open(path) as f:
        doc = f.read()
    if begin not in doc or end not in doc:
        raise SystemExit(f"soak: {path} has no soak section ({begin} ... {end})")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the build directory (examples/, tools/ under it)")
    ap.add_argument("--data", required=True, help="the MNIST directory")
    ap.add_argument("--minutes", type=float, default=10.0, help="about how long the three jobs take together")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="chaos and training seed")
    ap.add_argument("--target", type=float, default=0.96, help="test accuracy each job must reach")
    ap.add_argument("--only", default="", help="run the jobs whose name matches this regular expression")
    ap.add_argument("--docs", help="rewrite this Markdown file's soak section")
    a = ap.parse_args()
    a.example = os.path.join(a.bin, "examples", "mnist_mlp")
    a.run = os.path.join(a.bin, "tools", "gradus-run", "gradus-run")
    a.data = os.path.abspath(a.data)
    rng = random.Random(a.seed)
    token = f"soak-{os.getpid()}-{a.seed}"
    phases = [p for p in PHASES if re.search(a.only, p.name)]
    rows = []
    start = time.monotonic()
    for p in phases:
        print(f"soak: {p.name}: starting ({a.minutes * 60 / len(PHASES):.0f} s planned, seed {a.seed})", file=sys.stderr, flush=True)
        r = run_phase(p, a, a.minutes * 60 / len(PHASES), rng, token)
        print(f"soak: {p.name}: {'ok' if r['ok'] else 'FAILING'} in {r.get('seconds', 0):.0f} s, {len(r['faults'])} faults, "
              f"{r['restarts']} restarts, accuracy {r['accuracy']}" + ("" if r["ok"] else " — " + "; ".join(r["why"])),
              file=sys.stderr, flush=True)
        rows.append(r)
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "?"
    header = (f"{len(rows)} jobs in {(time.monotonic() - start) / 60:.1f} min at {commit}, {time.strftime('%Y-%m-%d')}, "
              f"{os.cpu_count()}-core {cpu}, seed {a.seed}; {sum(r['ok'] for r in rows)} ok, "
              f"{sum(len(r['faults']) for r in rows)} faults injected, "
              f"{sum(len(r['faults']) for r in rows if r['ok'])} survived. RSS bound: the last third's largest at most "
              f"{RSS_SLACK:.0%} + {RSS_FLOOR_MB:.0f} MiB above the largest of the 20 s after a {WARMUP_S:.0f} s warm-up.")
    text = table(rows, header)
    print(text)
    if a.docs:
        write_docs(a.docs, text)
    sys.exit(0 if rows and all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
