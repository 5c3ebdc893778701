"""The cases an independent fault battery found weak or failing, each in the fault matrix:
a pipeline killed at every point of a checkpoint's save (core/fault_point.hpp's points,
armed by GRADUS_FAULT_POINT in the first start only) restarts from the newest complete set;
gradus-run's final line names the process that failed first, in its own words; two jobs
started by hand on one MASTER_PORT never train together; a bsp parameter-server job restarts
as a whole, once; the documented minimum --comm-timeout forms the ring; options and input
files the battery got accepted or misnamed are refused by name. Imported by fault_matrix.py
(it adds these to fault_cases.CASES).
"""

import json
import os
import re
import subprocess
import time

from fault_cases import KILL, STOP, base, case, result
from fault_harness import CaseError, free_port


def json_of(text):
    """The last JSON line of rank 0's output (gradus-run prefixes it with "[0] ")."""
    lines = [ln[4:] if ln.startswith("[0] ") else ln for ln in text.splitlines()]
    for ln in reversed(lines):
        if ln.startswith("{"):
            return json.loads(ln)
    return None


# ---------------------------------------------------------------- a pipeline's checkpoint, killed while it saves
PIPE = ["--comm", "ring", "--stages", "2", "--micro-batches", "4", "--json"]


def pipeline_reference(ctx):
    """The final loss of the same pipelined run never killed (computed once per matrix run)."""
    if "pipeline_reference" not in ctx:
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        out = subprocess.run([ctx["run"], "-np", "2", ctx["mnist_deep_mlp"], *base(ctx, epochs=3, limit=3000), *PIPE],
                             capture_output=True, text=True, timeout=300, env=env).stdout
        j = json_of(out)
        if not j:
            raise CaseError("the uninterrupted pipelined run printed no JSON line")
        ctx["pipeline_reference"] = j["final_loss"]
    return ctx["pipeline_reference"]


def pipeline_save_killed(point, rank, save, resumes):
    """gradus-run --max-restarts 1 over 2 stages, 3 epochs with a save after each; rank `rank`
    SIGKILLed at `point` of save `save`: the restart resumes at epoch `resumes` (the newest
    complete set's) and ends where a run never killed ends."""
    def run(job, ctx):
        ref = pipeline_reference(ctx)
        ck = os.path.join(job.work, "run", "ckpt.npz")
        job.fault_now()
        run = job.launcher(["-np", "2", "--max-restarts", "1", "--restart-delay", "0.2", ctx["mnist_deep_mlp"],
                            *base(ctx, epochs=3, limit=3000), *PIPE, "--checkpoint", ck, "--resume"],
                           GRADUS_FAULT_POINT=f"{point}@{rank}#{save}")
        job.finish(120)
        j = json_of(run.out()) or {}
        start, loss = j.get("start_epoch"), j.get("final_loss")
        ok = start == resumes and loss == ref
        said = (f"resumed at epoch {start} (want {resumes}), final loss {loss}"
                f"{' = ' if loss == ref else ' != '}the uninterrupted run's {ref}")
        return result(finish=[run], data=("no: " if ok else "YES: ") + said, data_ok=ok)
    return run


SAVE_POINTS = [  # (point, rank, save, the epoch the restart starts at, fast)
    ("checkpoint.part.before", 1, 2, 2, False),      # stage 0's part renamed, stage 1's not written
    ("checkpoint.part.written", 0, 2, 2, False),     # stage 0's part renamed (stage 1's may be)
    ("checkpoint.part.written", 1, 2, 2, True),      # both parts renamed, no commit yet
    ("checkpoint.commit.before", 0, 2, 2, False),    # every part agreed, the record not renamed
    ("checkpoint.commit.written", 0, 2, 3, True),    # the record renamed: the new set is the checkpoint
    ("checkpoint.cleanup.before", 1, 2, 3, False),   # committed; stage 1's old part still there
    ("checkpoint.cleanup.done", 0, 2, 3, False),     # committed; stage 0's old part removed
    ("checkpoint.part.written", 1, 1, 1, False),     # the first save, never committed: a fresh start
]
for point, rank, save, resumes, fast in SAVE_POINTS:
    short = point.split(".", 1)[1].replace(".", "_")
    case(id=f"pipeline.save.{short}.stage{rank}.save{save}", system="pipeline",
         fault=f"SIGKILL stage {rank} at {point} of save {save} (GRADUS_FAULT_POINT), gradus-run --max-restarts 1",
         expect="finishes", message=r"restarts used: 1 of 1", bound=0, fast=fast, limit=150,
         shown=f"`restarts used: 1 of 1`, resumed at epoch {resumes}, the final loss of a run never killed")(
        pipeline_save_killed(point, rank, save, resumes))


# ---------------------------------------------------------------- gradus-run's final line
@case(id="ring.restart.corrupt_checkpoint", system="ring",
      fault="SIGKILL rank 1, then the checkpoint overwritten before the restart reads it (gradus-run --max-restarts 1)",
      expect="fails", message=r"gradus-run: failed: rank 0 exited with status 1: gradus: read_npz", bound=10)
def ring_restart_corrupt(job, ctx):
    ck = os.path.join(job.work, "run", "ckpt.npz")
    run = job.launcher(["-np", "2", "--max-restarts", "1", "--restart-delay", "2", ctx["mnist_mlp"],
                        *base(ctx, epochs=40, limit=3000), "--comm", "ring", "--checkpoint", ck, "--resume"])
    job.wait_until("epoch 1's checkpoint written", lambda: os.path.exists(ck), 60, [run])
    job.signal(job.child(run, RANK=1), KILL, "SIGKILL rank 1")
    time.sleep(0.5)  # rank 0 has failed its collective by now: nothing writes the checkpoint any more
    with open(ck, "wb") as f:
        f.write(b"not a zip file")
    return result(detect=[run])


@case(id="pipeline.restart.corrupt_stage", system="pipeline",
      fault="SIGKILL stage 0, then stage 1's committed file cut before the restart reads it (gradus-run --max-restarts 1)",
      expect="fails", bound=10,
      message=r"\[1\] gradus: pipeline stage 1 .*gradus-run: failed: rank 1 exited with status 1: gradus: pipeline stage 1")
def pipeline_restart_corrupt(job, ctx):
    ck = os.path.join(job.work, "run", "ckpt.npz")
    commit = os.path.join(job.work, "run", "ckpt.commit")
    run = job.launcher(["-np", "2", "--max-restarts", "1", "--restart-delay", "2", ctx["mnist_deep_mlp"],
                        *base(ctx, epochs=40, limit=3000), *PIPE, "--checkpoint", ck, "--resume"])
    job.wait_until("epoch 1's checkpoint committed", lambda: os.path.exists(commit), 60, [run])
    job.signal(job.child(run, RANK=0), KILL, "SIGKILL stage 0")
    time.sleep(0.5)  # stage 1 has failed its transfer: no save can commit any more
    with open(commit) as f:
        part = re.search(r"^part 1 (\S+) ", f.read(), re.M).group(1)
    with open(os.path.join(job.work, "run", part), "r+b") as f:
        f.truncate(1000)
    return result(detect=[run])


@case(id="ps.stop.server.final_line", system="ps bsp", fault="SIGSTOP ps 1 for good under gradus-run (--comm-timeout 4)",
      expect="fails", message=r"gradus-run: failed: ps1 stopped responding \(silent; noticed by rank [01]\)", bound=8,
      limit=40)
def ps_stop_final_line(job, ctx):
    run = job.launcher(["-np", "2", "--ps", "2", "--grace", "1", ctx["mnist_mlp"], *base(ctx), "--comm", "ps",
                        "--consistency", "bsp", "--comm-timeout", "4"])
    job.wait_until("training", lambda: re.search(r"step [0-9]+/", run.err()), 60, [run])
    job.signal(job.child(run, GRADUS_ROLE="ps", GRADUS_PS_INDEX=1), STOP, "SIGSTOP ps 1")
    return result(detect=[run])


# ---------------------------------------------------------------- two jobs on one MASTER_PORT, by hand
@case(id="ring.two_jobs_one_port.by_hand", system="ring",
      fault="two jobs of 2 ranks started at once by hand on one MASTER_PORT, no job id, the same options",
      expect="fails", message=r"(rank 1 registered twice.*GRADUS_JOB_ID|Address already in use)", bound=5, fast=True,
      shown="every process fails: one rank 0 cannot listen, both claims of rank 1 are refused by name "
            "(`registered twice ... GRADUS_JOB_ID`); no rank trains with another job's")
def ring_two_jobs_by_hand(job, ctx):
    port = free_port()
    job.fault_now()
    procs = []
    for j in "AB":
        for r in range(2):
            procs.append(job.start(f"job {j} rank {r}", [ctx["mnist_mlp"], *base(ctx, epochs=4), "--comm", "ring",
                                                          "--comm-timeout", "10"],
                                   RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
    job.finish(60)
    both = [p for p in procs if "rank 1 registered twice" in p.err()]
    if len(both) < 3:  # rank 0 and both claimants
        raise CaseError("not every claimant named the double registration: " +
                        "; ".join(f"{p.role} ({p.rc})" for p in procs))
    return result(detect=procs)


# ---------------------------------------------------------------- a bsp parameter-server job restarts as a whole
def ps_bsp_restart(victim, checkpoint):
    def run(job, ctx):
        ck = os.path.join(job.work, "run", "ckpt.npz")
        args = [*base(ctx, epochs=3, limit=3000), "--comm", "ps", "--consistency", "bsp", "--comm-timeout", "4", "--json"]
        if checkpoint:
            args += ["--checkpoint", ck, "--resume"]
        run = job.launcher(["-np", "2", "--ps", "2", "--max-restarts", "1", "--restart-delay", "0.5",
                            ctx["mnist_mlp"], *args])
        if checkpoint:
            job.wait_until("epoch 1's checkpoint written", lambda: os.path.exists(ck), 60, [run])
        else:
            job.wait_until("training", lambda: re.search(r"step [0-9]+/", run.err()), 60, [run])
        want = dict(GRADUS_ROLE="worker", RANK=1) if victim == "worker" else dict(GRADUS_ROLE="ps", GRADUS_PS_INDEX=1)
        job.signal(job.child(run, **want), KILL, f"SIGKILL {victim} 1")
        job.finish(120)
        text = run.err()
        alone = re.findall(r"gradus-run: (rank 0|rank 1|ps0)\b.*restarting it in", text)
        j = json_of(run.out()) or {}
        said = (f"the job restarted as a whole once; resumed at epoch {j.get('start_epoch')}"
                + (f"; restarted alone first: {', '.join(alone)}" if alone else ""))
        return result(finish=[run], data=said, data_ok=not alone)
    return run


case(id="ps.bsp.restart.kill.worker", system="ps bsp",
     fault="SIGKILL worker 1 under gradus-run --max-restarts 1 (with --checkpoint --resume)", expect="finishes",
     message=r"restarting all 4 in .*finished: the workers exited 0 \(restarts used: 1 of 1, after: rank 1 was killed",
     bound=0, limit=150, shown="one restart of all 4 processes, `finished ... restarts used: 1 of 1, after: rank 1 was "
                               "killed`")(ps_bsp_restart("worker", True))
case(id="ps.bsp.restart.kill.server", system="ps bsp",
     fault="SIGKILL ps 1 under gradus-run --max-restarts 1, no checkpoint", expect="finishes",
     message=r"ps1 was killed by signal 9.*restarting it in.*the job cannot go on without a restart of every process.*"
             r"restarting all 4 in .*finished: the workers exited 0 \(restarts used: 1 of 1, after: .*; ps1: 1 of 1\)",
     bound=0, limit=150, shown="ps 1 restarted alone, finds nothing to restore, the job restarts as a whole once: "
                               "`finished ... restarts used: 1 of 1 ...; ps1: 1 of 1`")(ps_bsp_restart("server", False))


# ---------------------------------------------------------------- the documented minimum --comm-timeout
@case(id="ring.comm_timeout.minimum", system="ring",
      fault="--comm-timeout 0.1 (the documented minimum), rank 1 started 1 s after rank 0", expect="finishes",
      message=r"test_accuracy", bound=0)
def ring_min_timeout(job, ctx):
    port = free_port()
    args = [*base(ctx, epochs=2, limit=3000), "--comm", "ring", "--comm-timeout", "0.1", "--json"]
    job.fault_now()
    r0 = job.start("rank 0", [ctx["mnist_mlp"], *args], RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
    time.sleep(1.0)
    r1 = job.start("rank 1", [ctx["mnist_mlp"], *args], RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
    return result(finish=[r0, r1])


# ---------------------------------------------------------------- options the battery got accepted
def refused(argv_of, pattern_absent=None):
    def run(job, ctx):
        job.fault_now()
        p = job.start("process", argv_of(ctx))
        job.finish(30)
        if pattern_absent and re.search(pattern_absent, p.err()):
            raise CaseError(f"the message still holds /{pattern_absent}/: {p.err()[-300:]}")
        return result(detect=[p])
    return run


for opt, value, msg, absent in [
        ("--timeout", "nan", r"--timeout: expected a finite number of seconds in \[0, 1000000000\], got nan", None),
        ("--timeout", "-1", r"--timeout: expected a finite number of seconds in \[0, 1000000000\], got -1", r"[0-9]{40}"),
        ("--grace", "nan", r"--grace: expected a finite number of seconds in \[0, 3600\], got nan", None)]:
    case(id=f"run.{opt[2:]}_{value.replace('-', 'minus')}", system="gradus-run",
         fault=f"gradus-run {opt} {value}", expect="fails", message=msg, bound=2, fast=True)(
        refused(lambda ctx, opt=opt, value=value: [ctx["run"], opt, value, "-np", "1", ctx["mnist_mlp"], "--help"],
                absent))
for value in ("-1", "99999999999999999999999"):
    case(id=f"example.seed_{'negative' if value == '-1' else 'too_large'}", system="examples",
         fault=f"mnist_mlp --seed {value}", expect="fails", bound=2, fast=True,
         message=r"--seed: expected an integer in \[0, 18446744073709551615\], got " + re.escape(value))(
        refused(lambda ctx, value=value: [ctx["mnist_mlp"], "--data", ctx["data"], "--seed", value]))


# ---------------------------------------------------------------- input files the battery got misnamed
def mnist_copy(job, ctx, change):
    """A directory of links to the MNIST files, `change(d)` applied; mnist_mlp started on it."""
    d = os.path.join(job.work, "mnist")
    os.mkdir(d)
    for f in os.listdir(ctx["data"]):
        os.symlink(os.path.join(ctx["data"], f), os.path.join(d, f))
    change(d)
    job.fault_now()
    return job.start("rank 0", [ctx["mnist_mlp"], *base(ctx, data=d)])


def rank_byte(d):
    img = os.path.join(d, "train-images-idx3-ubyte")
    with open(os.path.realpath(img), "rb") as f:
        head = f.read(100016)
    os.unlink(img)
    with open(img, "wb") as f:  # the magic's 4th byte says rank 1; the rest as it was
        f.write(b"\x00\x00\x08\x01" + head[4:])


def labels_of_the_test_set(d):
    os.unlink(os.path.join(d, "train-labels-idx1-ubyte"))
    os.symlink(os.path.join(os.path.dirname(os.path.realpath(os.path.join(d, "t10k-labels-idx1-ubyte"))),
                            "t10k-labels-idx1-ubyte"), os.path.join(d, "train-labels-idx1-ubyte"))


def a_directory(d):
    os.unlink(os.path.join(d, "train-images-idx3-ubyte"))
    os.mkdir(os.path.join(d, "train-images-idx3-ubyte"))


for cid, fault, change, msg in [
        ("data.idx_rank_byte", "an image file whose magic number says rank 1", rank_byte,
         r"train-images-idx3-ubyte', byte 3: magic 0x00000801 says rank 1, expected rank 3"),
        ("data.count_mismatch", "the test set's 10,000 labels beside the 60,000 training images", labels_of_the_test_set,
         r"train-images-idx3-ubyte holds 60000 images but train-labels-idx1-ubyte 10000 labels"),
        ("data.idx_is_directory", "a directory where the training images should be", a_directory,
         r"train-images-idx3-ubyte': cannot open it \(it is a directory, not a file\)")]:
    case(id=cid, system="data", fault=fault, expect="fails", message=msg, bound=2, fast=True)(
        lambda job, ctx, change=change: result(detect=[mnist_copy(job, ctx, change)]))


@case(id="data.libsvm_cut", system="data", fault="a LIBSVM file cut in the middle of its last line (logistic_regression)",
      expect="fails", message=r"cut\.svm:41: expected a finite number after '3:', got '3:' \(the file ends in this line",
      bound=2, fast=True)
def libsvm_cut(job, ctx):
    path = os.path.join(job.work, "cut.svm")
    with open(path, "w") as f:
        for i in range(40):
            f.write(f"{'+1' if i % 2 else '-1'} 1:{(i % 7) / 7:.3f} 2:{(i % 5) / 5:.3f} 13:{(i % 3) - 1}\n")
        f.write("+1 1:0.5 3:")  # the 41st line, cut after its last colon
    job.fault_now()
    return result(detect=[job.start("logistic_regression", [ctx["logistic_regression"], "--data", path])])
