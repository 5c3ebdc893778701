#!/usr/bin/env python3
"""The fault battery (issue 32): runs the cases of fault_cases.py against the built examples
and writes the table of docs/reliability.md — case, what must happen, what happened, seconds
from the fault to its detection, whether data was lost, and a verdict (ok / weak / failing).
Exits 1 when any row is not ok, so a change that makes a row worse fails CI.

  fault_matrix.py --bin BUILD_DIR --data data/mnist [--set fast|full] [--only REGEX]
                  [--table OUT.md] [--docs docs/reliability.md] [--check-docs docs/reliability.md]

--docs rewrites the generated section of that file (between its fault-matrix markers);
--check-docs fails when the section lists other cases than the battery has (a stale table).
"""

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_cases import CASES  # noqa: E402
import fault_grid  # noqa: E402,F401  (adds the signal x role x moment grid to CASES)
import battery_cases  # noqa: E402,F401  (adds the independent battery's cases to CASES)
from fault_harness import CaseError, CaseSkipped, Job, last_error  # noqa: E402

BEGIN = "<!-- fault-matrix: begin (tests/faults/fault_matrix.py writes this section; do not edit by hand) -->"
END = "<!-- fault-matrix: end -->"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def telling_line(case, p):
    """The line of p's output that matches the case's message, else its last error line."""
    for ln in (p.err() + p.out()).splitlines():
        if re.search(case.message, ln):
            return ln.strip()
    return last_error(p.err())


def judge(case, job, r, hung):
    """The row of one case: (observed, detection, data, verdict, why)."""
    procs = r["detect"] if case.expect == "fails" else r["finish"]
    text = "\n".join(p.err() + p.out() for p in (procs if case.expect == "fails" else job.procs))
    matched = re.search(case.message, text, re.S) is not None
    why = []
    detection = None
    if hung:
        why.append(f"still running {case.limit:.0f} s after the fault: {', '.join(hung)}")
    if case.expect == "fails":
        failed = [p for p in procs if p.rc not in (None, 0)]
        if len(failed) < len(procs):
            why.append("exited 0: " + ", ".join(p.role for p in procs if p.rc == 0))
        if failed and job.t_fault is not None:
            detection = min(p.t_exit for p in failed) - job.t_fault
        first = sorted(failed, key=lambda p: p.t_exit)
        telling = [p for p in first if re.search(case.message, p.err() + p.out(), re.S)] or first
        observed = f"{telling[0].role}: {telling_line(case, telling[0])}" if telling else "nothing failed"
    else:
        bad = [p for p in procs if p.rc != 0]
        if bad:
            why.append("failed: " + ", ".join(f"{p.role} ({p.rc}: {last_error(p.err())})" for p in bad))
        accs = [m for p in procs for m in re.findall(r'"test_accuracy": ?([0-9.]+)', p.out())]
        m = re.search(case.message, text, re.S)
        observed = ", ".join(filter(None, [
            "finished" if not bad else "FAILED",
            f"test accuracy {accs[-1]}" if accs else None,
            m.group(0) if m and m.group(0) != "test_accuracy" else None,
            r["observed_extra"]() if r.get("observed_extra") else None]))
    if not matched:
        why.append(f"no output matches /{case.message}/")
    if detection is not None and case.bound and detection > case.bound:
        why.append(f"detected after {detection:.2f} s, bound {case.bound} s")
    if not r["data_ok"]:
        why.append("data lost")
    if hung or any(w.startswith(("exited 0", "failed:")) for w in why):
        verdict = "failing"
    elif why:
        verdict = "weak"
    else:
        verdict = "ok"
    return observed, detection, r["data"] or "—", verdict, "; ".join(why)


def run_case(case, ctx):
    work = tempfile.mkdtemp(prefix="gradus-fault-")
    job = Job(ctx, work)
    start = time.monotonic()
    try:
        r = case.run(job, ctx)
        hung = job.finish(case.limit)
        row = judge(case, job, r, hung)
    except CaseError as e:
        row = (f"not run: {e}", None, "—", "failing", str(e))
    except CaseSkipped as e:
        row = (f"skipped: {e}", None, "—", "skipped", str(e))
    finally:
        job.end()
        if os.environ.get("GRADUS_FAULT_KEEP"):
            print(f"fault_matrix: {case.id}: the processes' output is kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return dict(zip(("observed", "detection", "data", "verdict", "why"), row), seconds=time.monotonic() - start)


def cell(s, n=220):
    s = " ".join(str(s).split()).replace("|", "\\|")
    return s if len(s) <= n else s[:n - 1] + "…"


def table(rows, header):
    out = [header, "",
           "| case | system | fault | expected | observed | detection (s) | data lost? | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for case, res in rows:
        expected = ("fails: " if case.expect == "fails" else "finishes: ") + (case.shown or f"`{case.message}`") + \
                   (f" within {case.bound:g} s" if case.expect == "fails" else "")
        det = f"{res['detection']:.2f}" if res["detection"] is not None else "—"
        verdict = res["verdict"] + (f" ({res['why']})" if res["why"] else "")
        out.append(f"| `{case.id}`{' (fast)' if case.fast else ''} | {case.system} | {cell(case.fault)} | "
                   f"{cell(expected)} | {cell(res['observed'])} | {det} | {cell(res['data'])} | {cell(verdict)} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the build directory (examples/, tools/ under it)")
    ap.add_argument("--data", required=True, help="the MNIST directory")
    ap.add_argument("--set", choices=("fast", "full"), default="fast")
    ap.add_argument("--only", help="run the cases whose id matches this regular expression")
    ap.add_argument("--mpirun", default="", help="the mpirun command (words split); empty: the MPI cases are skipped")
    ap.add_argument("--table", help="write the table to this file")
    ap.add_argument("--docs", help="rewrite the generated section of this Markdown file")
    ap.add_argument("--check-docs", help="fail when this file's generated section lists other cases")
    a = ap.parse_args()
    b = a.bin
    ctx = dict(data=os.path.abspath(a.data), mnist_mlp=f"{b}/examples/mnist_mlp",
               mnist_deep_mlp=f"{b}/examples/mnist_deep_mlp", run=f"{b}/tools/gradus-run/gradus-run",
               logistic_regression=f"{b}/examples/logistic_regression",
               keygen=f"{b}/tools/gradus-keygen/gradus-keygen", mpirun=a.mpirun.split())
    cases = [c for c in CASES if (a.set == "full" or c.fast) and (not a.only or re.search(a.only, c.id))]
    if a.check_docs:
        with open(a.check_docs) as f:
            doc = f.read()
        listed = set(re.findall(r"^\| `([a-z0-9_.]+)`", doc.split(BEGIN, 1)[-1].split(END, 1)[0], re.M))
        known = {c.id for c in CASES}
        if BEGIN not in doc or listed != known:
            print(f"fault_matrix: {a.check_docs}'s table is stale: missing {sorted(known - listed)}, "
                  f"gone {sorted(listed - known)}; regenerate it: tests/faults/fault_matrix.py --set full --docs "
                  f"{a.check_docs}", file=sys.stderr)
            return 1
    rows, skipped = [], []
    for c in cases:
        if c.needs == "root" and os.geteuid() != 0 or c.needs == "mpi" and not ctx["mpirun"]:
            skipped.append(f"{c.id} (needs {c.needs})")
            continue
        res = run_case(c, ctx)
        if res["verdict"] == "skipped":
            skipped.append(f"{c.id} ({res['why']})")
            continue
        rows.append((c, res))
        print(f"fault_matrix: {c.id}: {res['verdict']} in {res['seconds']:.1f} s"
              f"{' — ' + res['why'] if res['why'] else ''} | {res['observed']}", flush=True)
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    header = (f"{len(rows)} cases ({a.set} set) at {commit or 'this tree'}, {time.strftime('%Y-%m-%d')}, "
              f"{os.cpu_count()}-core {cpu_name()}; {sum(r['verdict'] == 'ok' for _, r in rows)} ok, "
              f"{sum(r['verdict'] == 'weak' for _, r in rows)} weak, "
              f"{sum(r['verdict'] == 'failing' for _, r in rows)} failing"
              + (f"; not run here: {', '.join(skipped)}" if skipped else "") + ".")
    text = table(rows, header)
    if a.table:
        with open(a.table, "w") as f:
            f.write(text)
    if a.docs:
        with open(a.docs) as f:
            doc = f.read()
        if BEGIN in doc:
            pre, rest = doc.split(BEGIN, 1)
            post = rest.split(END, 1)[1]
        else:
            pre, post = doc.rstrip("\n") + "\n\n## The fault matrix (issue 32)\n\n", "\n"
        with open(a.docs, "w") as f:
            f.write(pre + BEGIN + "\n" + text + END + post)
    print(header)
    return 0 if all(r["verdict"] == "ok" for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
