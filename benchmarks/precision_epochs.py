#!/usr/bin/env python3
"""Mixed precision's epochs against fp32's (docs/precision.md): each example trained for one
epoch with --precision fp32 and each lower precision asked for, seeds 1..N, the runs
interleaved (round r runs every (precision, seed) once, rotated by r) so background load hits
all alike. Prints a markdown table: per precision, the median epoch_seconds and its ratio to
fp32's median in the same run, the median test accuracy and its difference from fp32's in
points, the loss scale and skipped steps at the end, and the peak RSS.

  benchmarks/precision_epochs.py --data DIR [--seeds 3] [--precisions bf16,fp16]
                                 [--threads 2] [--max-drop POINTS] [--library-path DIRS]
                                 EXAMPLE_BINARY...

Every run: --data DIR --epochs 1 --seed S --threads T --quiet --json --precision P, with
OPENBLAS_CORETYPE unset, OMP_NUM_THREADS=T and (--library-path: a GPU bundle's) LD_LIBRARY_PATH
for the examples only. Exits 1 when a run fails or (--max-drop) a
precision's median test accuracy is more than POINTS below fp32's; 77 when a program says it
has no device (exit 77: the GPU check's rehearsal)."""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys


def cpu_model():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown CPU'


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--data', required=True)
    ap.add_argument('--seeds', type=int, default=3)
    ap.add_argument('--precisions', default='bf16,fp16')
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--max-drop', type=float, default=None)
    ap.add_argument('--library-path', default=None)
    ap.add_argument('examples', nargs='+')
    a = ap.parse_args()
    env = dict(os.environ)
    env.pop('OPENBLAS_CORETYPE', None)
    env['OMP_NUM_THREADS'] = str(a.threads)
    if a.library_path:
        env['LD_LIBRARY_PATH'] = a.library_path
    precisions = ['fp32'] + [p for p in a.precisions.split(',') if p and p != 'fp32']
    failed = False
    print(f'CPU: {cpu_model()}, {os.cpu_count()} cores; {a.threads} threads; seeds 1..{a.seeds}; medians\n')
    print('| example | precision | epoch s | / fp32 | test accuracy | - fp32 (points) | loss scale | skipped | peak RSS MB |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|')
    for exe in a.examples:
        out = {p: [] for p in precisions}
        runs = []
        for s in range(1, a.seeds + 1):  # round s: every precision once, the order rotated by s
            k = s % len(precisions)
            runs += [(p, s) for p in precisions[k:] + precisions[:k]]
        for p, s in runs:
            cmd = [exe, '--data', a.data, '--epochs', '1', '--seed', str(s), '--threads', str(a.threads), '--quiet',
                   '--json', '--precision', p]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if res.returncode == 77:
                print(f'skipped: {exe} has no device (exit 77)')
                return 77
            if res.returncode != 0:
                print(f'{exe} --precision {p} --seed {s}: exit {res.returncode}: {res.stderr[-400:]}', file=sys.stderr)
                failed = True
                continue
            out[p].append(json.loads(res.stdout.strip().splitlines()[-1]))
        base = out['fp32']
        if not base:
            continue
        t0 = statistics.median(j['epoch_seconds'] for j in base)
        a0 = statistics.median(j['test_accuracy'] for j in base)
        for p in precisions:
            js = out[p]
            if not js:
                continue
            t = statistics.median(j['epoch_seconds'] for j in js)
            acc = statistics.median(j['test_accuracy'] for j in js)
            if a.max_drop is not None and 100 * (a0 - acc) > a.max_drop:
                print(f"{js[0]['example']} --precision {p}: accuracy {acc:.4f} is more than {a.max_drop} points below "
                      f"fp32's {a0:.4f}", file=sys.stderr)
                failed = True
            print(f"| {js[0]['example']} | {p} | {t:.3f} | {t / t0:.2f} | {acc:.4f} | {100 * (acc - a0):+.2f} | "
                  f"{js[-1].get('loss_scale', 1):g} | {max(j.get('skipped_steps', 0) for j in js)} | "
                  f"{statistics.median(j['peak_rss_mb'] for j in js):.0f} |")
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
