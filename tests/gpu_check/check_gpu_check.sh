#!/usr/bin/env bash
# The GPU check rehearsed where there is no GPU (tests/gpu_check/CMakeLists.txt):
#   check_gpu_check.sh <build dir> <an sm_80-only CUDA program> <data dir> <work dir>
# 1. tools/gpu-bundle.sh --prebuilt packs the build's CUDA programs, their libraries and the
#    data into a rehearsal bundle, and its own check passes (every library inside the bundle
#    or on the GPU image's allow-list).
# 2. tools/gpu-check.sh on it: exit 0, the table and JSON written, the device and every GPU
#    step "skipped: no CUDA device"; the same for the bundle packed --compress (one
#    payload.tar.gz, as tools/gpu-bundle.sh packs the bundle a lease runs), and a damaged
#    payload refused; and with GRADUS_GPU_CHECK_ASSUME_DEVICE=1 every GPU step runs (and fails
#    or skips for want of a device), each reported: the check's own plumbing.
# 3. Bundles that cannot be used are refused (exit 2) with the error naming what is wrong: no
#    bundle at all; a program built for sm_80; a data file missing; a library taken out of
#    lib/ (ldd then finds this machine's copy: outside the bundle).
# Where a GPU is present it exits 77 (skipped): run tools/gpu-check.sh itself there.
set -u
build=$1 other_arch=$2 data=$3 work=$4
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "check_gpu_check: $*" >&2; exit 1; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "skipped: a GPU is here; run tools/gpu-check.sh with a bundle of tools/gpu-bundle.sh"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"

# expect_refusal NAME BUNDLE TEXT...: --validate exits 2 and its message holds every TEXT
expect_refusal() {
  local name=$1 dir=$2 rc
  shift 2
  timeout 120 "$root/tools/gpu-check.sh" --validate "$dir" >"$work/$name.out" 2>&1
  rc=$?
  [[ $rc == 2 ]] || { cat "$work/$name.out" >&2; fail "$name: exit $rc, expected 2"; }
  for text in "$@"; do
    grep -qF -- "$text" "$work/$name.out" || { cat "$work/$name.out" >&2; fail "$name: the message lacks '$text'"; }
  done
  echo "ok: $name refused: $(grep -m1 -v 'cannot be used:$' "$work/$name.out")"
}

# ---- 1. the rehearsal bundle
GRADUS_BUNDLE_DATA=$data timeout 200 "$root/tools/gpu-bundle.sh" --prebuilt "$build" "$work/bundle" >"$work/bundle.out" 2>&1 ||
  { cat "$work/bundle.out" >&2; fail "gpu-bundle.sh --prebuilt failed"; }
cat "$work/bundle.out"
grep -q '^kind rehearsal$' "$work/bundle/MANIFEST" || fail "the MANIFEST does not say kind rehearsal"
for p in mnist_mlp_cuda mnist_cnn_cuda seq_mnist_lstm_cuda bench_cuda cuda_gpu_test_cuda_gpu gradus-run; do
  [[ -x $work/bundle/bin/$p ]] || fail "the bundle lacks bin/$p"
done
ls "$work/bundle/lib" | grep -q '^libzmq\.so\.5$' || fail "libzmq.so.5 (not on the allow-list) was not packed into lib/"
ls "$work/bundle/lib" | grep -qE '^lib(cudart|cublas|cudnn|stdc\+\+|c)\.' && fail "an allow-listed library was packed: $(ls "$work/bundle/lib")"
[[ -s $work/bundle/data/mnist/train-images-idx3-ubyte.gz ]] || fail "no compressed MNIST in the bundle"

# ---- 2. the check end to end, no device
OUT=$work/out timeout 200 "$root/tools/gpu-check.sh" "$work/bundle" >"$work/check.out" 2>&1
rc=$?
cat "$work/check.out"
[[ $rc == 0 ]] || fail "gpu-check.sh on the rehearsal bundle: exit $rc, expected 0"
for f in gpu-check.md gpu-check.json gpu-check-logs.tar.gz; do [[ -s $work/out/$f ]] || fail "no $f written"; done
python3 - "$work/out/gpu-check.json" <<'PY' || fail "the JSON report is not what a rehearsal gives"
import json, sys
doc = json.load(open(sys.argv[1]))
steps = {s["step"]: s["status"] for s in doc["steps"]}
assert steps.get("bundle") == "ok", steps
assert steps.get("device") == "skipped: no CUDA device", steps
gpu = [k for k in steps if k not in ("bundle", "device")]
expected = {"suite:cuda_gpu", "suite:cuda_omp", "suite:cuda_omp_graph", "suite:cuda_omp_dist", "memcheck:mnist_mlp",
            "memcheck:mnist_cnn", "memcheck:seq_mnist_lstm", "memcheck:linear_regression", "memcheck:logistic_regression",
            "racecheck:mnist_cnn", "ring2", "ps2", "bench", "mnist", "precision"}
assert set(gpu) == expected, sorted(set(gpu) ^ expected)
assert all(steps[k] == "skipped: no CUDA device" for k in gpu), steps
assert doc["failed"] == [], doc["failed"]
assert doc["bundle"]["kind"] == "rehearsal", doc["bundle"]
PY
grep -q '| ring2 | skipped: no CUDA device |' "$work/out/gpu-check.md" || fail "the markdown table lacks the ring2 row"

# the GPU steps' plumbing, with no GPU: GRADUS_GPU_CHECK_ASSUME_DEVICE=1 runs every step;
# each must be reported, none may hang, and the check must fail (exit 1), naming the steps
GRADUS_GPU_CHECK_ASSUME_DEVICE=1 OUT=$work/out-assumed timeout 200 "$root/tools/gpu-check.sh" "$work/bundle" >"$work/assumed.out" 2>&1
rc=$?
[[ $rc == 1 ]] || { cat "$work/assumed.out" >&2; fail "gpu-check.sh with an assumed device: exit $rc, expected 1"; }
python3 - "$work/out-assumed/gpu-check.json" <<'PY' || { cat "$work/assumed.out" >&2; fail "the report of the assumed-device run is not what it should be"; }
import json, sys
doc = json.load(open(sys.argv[1]))
steps = {s["step"]: s for s in doc["steps"]}
assert len(steps) == 17, sorted(steps)
assert steps["device"]["status"] == "ok", steps["device"]
# the programs ran and said why they could not: the CUDA runtime's words reach the table
for k in ("ring2", "ps2"):
    assert steps[k]["status"].startswith("failed"), steps[k]
    assert "cuda" in steps[k]["summary"], steps[k]
assert steps["suite:cuda_gpu"]["status"] == "skipped", steps["suite:cuda_gpu"]
assert set(doc["failed"]) >= {"ring2", "ps2"}, doc["failed"]
PY
echo "ok: with an assumed device every step ran and was reported ($(python3 -c 'import json,sys; print(", ".join(json.load(open(sys.argv[1]))["failed"]))' "$work/out-assumed/gpu-check.json") failed)"

GRADUS_BUNDLE_DATA=$data timeout 200 "$root/tools/gpu-bundle.sh" --compress --prebuilt "$build" "$work/packed" >"$work/packed.out" 2>&1 ||
  { cat "$work/packed.out" >&2; fail "gpu-bundle.sh --compress --prebuilt failed"; }
[[ -f $work/packed/payload.tar.gz && ! -e $work/packed/bin ]] || fail "--compress left more than MANIFEST and payload.tar.gz: $(ls "$work/packed")"
OUT=$work/out-packed timeout 200 "$root/tools/gpu-check.sh" "$work/packed" >"$work/packed-check.out" 2>&1 ||
  { cat "$work/packed-check.out" >&2; fail "gpu-check.sh on the compressed rehearsal bundle failed"; }
grep -q '| mnist | skipped: no CUDA device |' "$work/out-packed/gpu-check.md" || fail "the compressed bundle's table lacks the mnist row"
echo "ok: the compressed bundle ($(du -sh "$work/packed" | cut -f1)) unpacks and passes"

# ---- 3. refusals
expect_refusal missing "$work/no-such-bundle" "no bundle at $work/no-such-bundle" "tools/gpu-bundle.sh"

cp -a "$work/bundle" "$work/other-arch"
cp "$other_arch" "$work/other-arch/bin/bench_cuda"
expect_refusal other_arch "$work/other-arch" "bin/bench_cuda was built for another architecture" "sm_80" "no sm_90 machine code"

cp -a "$work/bundle" "$work/no-data"
rm "$work/no-data/data/mnist/t10k-labels-idx1-ubyte.gz"
expect_refusal missing_data "$work/no-data" "missing data file data/mnist/t10k-labels-idx1-ubyte.gz" "tools/fetch-mnist.sh"

cp -a "$work/packed" "$work/damaged"
truncate -s -1000 "$work/damaged/payload.tar.gz"
expect_refusal damaged_payload "$work/damaged" "payload.tar.gz has sha256" "a damaged copy"

cp -a "$work/bundle" "$work/no-zmq"
rm "$work/no-zmq/lib/libzmq.so.5"
expect_refusal outside_library "$work/no-zmq" "libzmq.so.5 resolves to" "outside the bundle"

rm -rf "$work"
echo "check_gpu_check: all passed"
