#!/usr/bin/env bash
# MNIST MLP inference, gradus against PyTorch: examples/mnist_infer and its PyTorch peer
# (benchmarks/mnist_infer_torch.py: the same 784-256-128-10 MLP, the same weights read from
# the same .npz with numpy, torch.set_num_threads = --threads) classify the 10,000 test
# images; each reports its test accuracy, the batch-1 latency per image (median and p99
# over RUNS single-image runs) and the throughput at BATCH. Each contender runs REPEAT
# times, alternating; the table gives the medians and the ratios gradus / PyTorch
# (latency: lower is better; throughput: higher is better).
#
#   benchmarks/inference_vs_torch.sh [build-dir = build-bench]
#
# Environment: THREADS (default 2), BATCH (1000), RUNS (2000), REPEAT (3), DATA (data/mnist),
# CHECKPOINT (a mnist_mlp --checkpoint file; default: trained here, 1 epoch, seed 1),
# BIN (a directory holding mnist_mlp and mnist_infer already built, e.g. build/ci/examples:
# no configure or build), PYTHON (an interpreter with torch; default: the first of python3,
# /usr/bin/python3 that imports it).
#
# Where PyTorch is not importable the script says so, runs no peer and still reports
# gradus' figures (and the test accuracy numpy computes from the same file through
# nn.Linear's [out, in] layout, a check of the weights). A libtorch (C++) peer is not
# written: the script says whether a libtorch is present (Torch_DIR) and that it is not run.
# Unset OPENBLAS_CORETYPE and close other work first; the load average is printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build-bench}
threads=${THREADS:-2} batch=${BATCH:-1000} runs=${RUNS:-2000} repeat=${REPEAT:-3}
data=${DATA:-$root/data/mnist}

quiet() {
  local log
  if ! log=$("$@" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
}
if [[ -n ${BIN:-} ]]; then
  bin=$BIN
else
  quiet cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=ON
  quiet cmake --build "$build" --target mnist_mlp mnist_infer -j 2
  bin=$build/examples
fi
for exe in mnist_mlp mnist_infer; do [[ -x $bin/$exe ]] || { echo "inference_vs_torch: no $bin/$exe" >&2; exit 1; }; done
[[ -f $data/t10k-images-idx3-ubyte ]] || { echo "inference_vs_torch: no MNIST in $data (tools/fetch-mnist.sh)" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradus-infer-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

ckpt=${CHECKPOINT:-}
if [[ -z $ckpt ]]; then
  ckpt=$tmp/ckpt.npz
  "$bin/mnist_mlp" --data "$data" --epochs 1 --seed 1 --threads "$threads" --quiet --json --checkpoint "$ckpt" >"$tmp/train.json"
fi

# Interpreters: one with numpy (the summary, the layout check), one with torch (the peer).
pythons=()
[[ -n ${PYTHON:-} ]] && pythons+=("$PYTHON")
pythons+=(python3 /usr/bin/python3)
first_importing() {
  for py in "${pythons[@]}"; do
    if command -v "$py" >/dev/null && "$py" -c "import $1" 2>/dev/null; then echo "$py"; return; fi
  done
}
numpy_py=$(first_importing numpy)
torch_py=$(first_importing torch)
[[ -n $numpy_py ]] || { echo "inference_vs_torch: no Python 3 with numpy among: ${pythons[*]}" >&2; exit 1; }

echo "# MNIST MLP inference: gradus mnist_infer against PyTorch"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
cpu_field() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
echo "# CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field 'model')," \
  "$(grep -m1 '^flags' /proc/cpuinfo | grep -ow 'avx512f\|avx2' | sort -u | paste -sd' ')), $(nproc) cores;" \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
echo "# threads $threads, batch $batch, $runs single-image runs, $repeat repeats (medians); checkpoint $ckpt"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

peer=()
if [[ -n $torch_py ]]; then
  peer=("$torch_py" "$here/mnist_infer_torch.py" "$ckpt" "$data" --batch "$batch" --runs "$runs" --threads "$threads")
  echo "# PyTorch $("$torch_py" -c 'import torch; print(torch.__version__)') ($torch_py)"
else
  echo "# PyTorch: NOT importable by ${pythons[*]}: the PyTorch peer was not run; gradus' figures alone below"
fi
if [[ -n ${Torch_DIR:-} && -f ${Torch_DIR}/TorchConfig.cmake ]]; then
  echo "# libtorch: found at $Torch_DIR, but the libtorch C++ peer is not written yet: not run"
else
  echo "# libtorch (C++): not found (Torch_DIR unset); no libtorch peer"
fi

: >"$tmp/gradus.jsonl"
: >"$tmp/torch.jsonl"
for ((r = 0; r < repeat; r++)); do
  OMP_NUM_THREADS=$threads "$bin/mnist_infer" --checkpoint "$ckpt" --data "$data" --batch "$batch" --runs "$runs" \
    --threads "$threads" --json | tail -1 >>"$tmp/gradus.jsonl"
  if ((${#peer[@]})); then OMP_NUM_THREADS=$threads "${peer[@]}" | tail -1 >>"$tmp/torch.jsonl"; fi
done
"$numpy_py" "$here/mnist_infer_torch.py" "$ckpt" "$data" --numpy >"$tmp/numpy.json"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$numpy_py" - "$tmp/gradus.jsonl" "$tmp/torch.jsonl" "$tmp/numpy.json" "$tmp/train.json" <<'PY'
import json, os, statistics, sys
def rows(path):
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
gradus, torch = rows(sys.argv[1]), rows(sys.argv[2])
numpy_acc = rows(sys.argv[3])[0]["test_accuracy"]
train = rows(sys.argv[4])
med = lambda rs, k: statistics.median(r[k] for r in rs)
print()
print("| measure | gradus | PyTorch | gradus / PyTorch |")
print("|---|---:|---:|---:|")
for key, label, fmt in (("latency_ms_median", "batch-1 latency, median (ms)", "{:.4f}"),
                        ("latency_ms_p99", "batch-1 latency, p99 (ms)", "{:.4f}"),
                        ("images_per_second", f"throughput at batch {gradus[0]['batch']} (images/s)", "{:.0f}")):
    g = med(gradus, key)
    t = med(torch, key) if torch else None
    print(f"| {label} | {fmt.format(g)} | {fmt.format(t) if t else 'not run'} | {f'{g / t:.2f}x' if t else '-'} |")
acc = {r["test_accuracy"] for r in gradus}
tacc = "{:.2f}%".format(100 * torch[0]["test_accuracy"]) if torch else "not run"
print("| test accuracy | {:.2f}% | {} | - |".format(100 * gradus[0]["test_accuracy"], tacc))
print()
print(f"Test accuracy: gradus {gradus[0]['test_accuracy']} (the same in all {len(gradus)} runs: {len(acc) == 1}); "
      f"numpy through nn.Linear's [out, in] layout {numpy_acc}"
      + (f"; the training run reported {train[0]['test_accuracy']}" if train else ""))
if not torch:
    print("PyTorch was not importable here: no peer figures; rerun where `import torch` works.")
PY
