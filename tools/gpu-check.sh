#!/usr/bin/env bash
# The one command a lent GPU machine runs: gradus::cuda proven on the device, from a bundle
# built beforehand on a development machine (tools/gpu-bundle.sh), in at most ~6 minutes.
#
#   tools/gpu-check.sh [DIR]             check the bundle DIR (default build/gpu-bundle), then
#                                        run every step on the GPU (each skipped without one)
#   tools/gpu-check.sh --validate DIR    check the bundle only (gpu-bundle.sh ends with this)
#   tools/gpu-check.sh --list-programs   the programs a full bundle holds (gpu-bundle.sh
#                                        builds these)
#   GPU_CHECK_ONLY=suite:cuda_omp,bench tools/gpu-check.sh DIR
#                                        a rerun after a fix: only the steps named (comma-
#                                        separated; a name ending in '*' is a prefix, e.g.
#                                        'memcheck:*'); the others are reported "not selected"
#   GPU_CHECK_SEEDS=3 ...                the mnist step's medians over seeds 1-3 (default: seed 1)
#
# On the device tool: command `tools/gpu-check.sh build/gpu-bundle`, carry ["build/gpu-bundle"],
# timeout_s 420 (docs/cuda.md, "Running the GPU check"). The machine has no Debian packages and
# no network: everything the programs need that its image lacks travels in the bundle, and
# its loader is pointed at the bundle's lib/ and at the image's CUDA libraries (the toolkit's
# and the pip wheels' site-packages/nvidia/*/lib).
#
# Steps, each bounded by a timeout and reported whatever happened before it:
#   bundle      programs, manifest, architecture (sm_90 code: tools/cuda-archs.py), data files,
#               CPU features, every shared library resolved (fatal: exit 2)
#   device      nvidia-smi: name, memory, driver, clocks, compute capability
#   then, side by side (correctness; nothing timed):
#   suite:*     the GPU test programs: cuda_gpu_test_cuda_gpu (against host loops) and
#               tests/cuda_omp's three units built by nvcc (against cpu_simd)
#   memcheck:*  compute-sanitizer --tool memcheck on a short run of each _cuda example
#   racecheck   compute-sanitizer --tool racecheck on a short mnist_cnn_cuda run
#   ring2       2 processes on the one GPU, data-parallel over the ring (shared memory,
#               pinned buckets): replicas bit-identical, accuracy >= 0.92
#   ps2         2 workers with cuda sessions and 2 parameter servers (bsp): the same checks
#   then alone (timed):
#   bench       bench_cuda: fused elementwise vs device-to-device copy, GEMM vs cuBLAS,
#               convolution vs cuDNN
#   mnist       benchmarks/mnist_vs_pytorch.py --cuda: the three MNIST twins, one epoch
#               each, against the same models in PyTorch on the same GPU
#   precision   benchmarks/precision_epochs.py: the three twins one epoch each with
#               --precision fp32, bf16 and fp16 (cuBLAS's bf16 / fp16 tensor-core GEMMs,
#               loss scaling): epoch ratios to fp32, accuracy within 0.5 points of fp32's
#
# Writes gpu-check.md (the table to publish), gpu-check.json and gpu-check-logs.tar.gz
# (every step's output) into $OUT (the device tool's folder), else into build/gpu-check,
# after each phase: a run cut short still brings back what it did. The timeouts (120 s for
# each side-by-side step, 60 s bench, 170 s mnist, 150 s precision) bound the whole at about 8 minutes.
# Exit status: 0 every step passed or was skipped (no device: the rehearsal); 1 a step
# failed; 2 the bundle cannot be used (missing, incomplete, another architecture, a missing
# data file, a library that resolves nowhere or outside the bundle).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# what a full bundle holds (bin/), and the data it carries (data/, gzip-compressed)
programs=(cuda_gpu_test_cuda_gpu cuda_gpu_test_cuda_omp cuda_gpu_test_cuda_omp_graph cuda_gpu_test_cuda_omp_dist
  bench_cuda mnist_mlp_cuda mnist_cnn_cuda seq_mnist_lstm_cuda linear_regression_cuda logistic_regression_cuda
  gradus-run)
host_only=(gradus-run)  # no device code
# What the GPU machines' image provides, never bundled: glibc, the GCC runtime, the NVIDIA
# driver, and the CUDA runtime, cuBLAS, cuDNN and NCCL (toolkit and pip wheels alike).
allow='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util|anl)\.so\.[0-9]+|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1|libnvidia-[a-z0-9-]+\.so(\.[0-9]+)*|libcudart\.so\.13|libcublas(Lt)?\.so\.13|libcudnn(_[a-z_]+)?\.so\.9|libnccl\.so\.2)$'
target_cc=90  # H100 and H200: compute capability 9.0

mode=run
case "${1:-}" in
  --list-programs) printf '%s\n' "${programs[@]}"; exit 0 ;;
  --validate) mode=validate; shift ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
bundle=${1:-$root/build/gpu-bundle}
[[ $bundle == /* ]] || bundle=$PWD/$bundle

say() { printf 'gpu-check: %s\n' "$*" >&2; }

out_dir=${OUT:-$root/build/gpu-check}
work=$(mktemp -d "${TMPDIR:-/tmp}/gradus-gpu-check.XXXXXX")  # the unpacked bundle, data, logs
logs=$work/logs
mkdir -p "$logs"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- the bundle
problems=()
problem() { problems+=("$*"); }

manifest_values() { sed -n "s/^$1 //p" "$bundle/MANIFEST"; }

find_tool() {  # PATH first, then the CUDA toolkit's folders
  local t=$1 d
  command -v "$t" 2>/dev/null && return 0
  for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /usr/local/cuda-*/bin /usr/local/cuda-*/compute-sanitizer; do
    [[ -x $d/$t ]] && { echo "$d/$t"; return 0; }
  done
  return 1
}

# The loader's path: the bundle's libraries first, then wherever the image keeps the CUDA
# libraries (the toolkit, the driver, the pip wheels PyTorch uses).
cuda_lib_dirs() {
  local d py
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [[ -d $d ]] && echo "$d"
  done
  py=$(command -v python3 2>/dev/null) || return 0
  "$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("site-packages")])
for r in sorted(roots):
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu*", "lib"))):
        if os.path.isdir(d):
            print(d)
EOF
}

# (Set for the bundle's programs alone, through `env`: the image's own programs, python3 and
# PyTorch among them, keep their libraries.)
setup_library_path() {
  local dirs
  dirs=$(cuda_lib_dirs | awk '!seen[$0]++' | paste -sd: -)
  libpath="$bundle/lib${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# ldd of one file: every dependency resolved, inside the bundle or on the allow-list
check_closure() {
  local f=$1 rel=${1#"$bundle"/} out line name path
  out=$(LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1)
  if grep -q "version \`GLIBCXX_\|version \`GCC_\|version \`CXXABI_" <<<"$out" && [[ $libpath != "$bundle/lib-fallback:"* && -d $bundle/lib-fallback ]]; then
    say "the image's libstdc++ is older than the bundle's build machine's: using the bundle's (lib-fallback/)"
    libpath="$bundle/lib-fallback:$libpath"
    out=$(LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1)
  fi
  if grep -q "version \`GLIBC_" <<<"$out"; then
    problem "$rel needs a newer glibc than this machine's ($(grep -o "GLIBC_[0-9.]*" <<<"$out" | sort -uV | tail -n 1) not found): build the bundle on a system no newer than this one"
  fi
  while IFS= read -r line; do
    if [[ $line =~ ^[[:space:]]*([^[:space:]]+)\ =\>\ not\ found ]]; then
      name=${BASH_REMATCH[1]}
      if [[ $name =~ $allow ]]; then
        problem "$rel needs $name, which the GPU image provides, but it is in none of the loader's folders ($libpath)"
      else
        problem "$rel needs $name, which is not in the bundle's lib/: rebuild the bundle (tools/gpu-bundle.sh)"
      fi
    elif [[ $line =~ ^[[:space:]]*([^[:space:]]+)\ =\>\ ([^[:space:]]+)\ \( ]]; then
      name=${BASH_REMATCH[1]} path=${BASH_REMATCH[2]}
      [[ $path == "$bundle"/* || $name =~ $allow ]] && continue
      problem "$rel: $name resolves to $path, outside the bundle, and is not on the GPU image's allow-list: rebuild the bundle (tools/gpu-bundle.sh)"
    fi
  done <<<"$out"
}

validate() {
  if [[ ! -d $bundle ]]; then
    say "no bundle at $bundle: build one on a development machine with tools/gpu-bundle.sh (it writes build/gpu-bundle) and send it with the repository (the device tool's carry: [\"build/gpu-bundle\"])"
    return 2
  fi
  if [[ ! -f $bundle/MANIFEST ]]; then
    say "$bundle has no MANIFEST: not a bundle of tools/gpu-bundle.sh, or one cut short; rebuild it"
    return 2
  fi
  if [[ $(manifest_values format) != 1 ]]; then
    say "$bundle/MANIFEST: format '$(manifest_values format)', expected 1: rebuild the bundle with this checkout's tools/gpu-bundle.sh"
    return 2
  fi
  kind=$(manifest_values kind)
  local p rel listed code f want got payload
  # a compressed bundle: everything but MANIFEST in payload.tar.gz, unpacked here first
  payload=$(manifest_values payload)
  if [[ -n $payload ]]; then
    f=${payload%% *} want=${payload##* }
    if [[ ! -f $bundle/$f ]]; then
      say "$bundle lacks $f (MANIFEST lists it): a bundle cut short; rebuild it with tools/gpu-bundle.sh"
      return 2
    fi
    got=$(sha256sum "$bundle/$f" | cut -d' ' -f1)
    if [[ $got != "$want" ]]; then
      say "$bundle/$f has sha256 $got, MANIFEST says $want: a damaged copy; rebuild the bundle"
      return 2
    fi
    mkdir -p "$work/unpacked"
    if ! tar -C "$work/unpacked" -xzf "$bundle/$f"; then
      say "$bundle/$f does not unpack (tar -xzf): rebuild the bundle"
      return 2
    fi
    cp "$bundle/MANIFEST" "$work/unpacked/MANIFEST"
    bundle=$work/unpacked
  fi
  mapfile -t listed < <(manifest_values program)
  if [[ $kind == full ]]; then
    for p in "${programs[@]}"; do
      printf '%s\n' "${listed[@]}" | grep -qx "bin/$p" || problem "the bundle lacks bin/$p (its MANIFEST does not list it): rebuild it with tools/gpu-bundle.sh"
    done
  elif [[ $kind != rehearsal ]]; then
    problem "MANIFEST: kind '$kind', expected full or rehearsal"
  fi
  for rel in "${listed[@]}"; do
    [[ -x $bundle/$rel ]] || problem "missing program $rel (listed in MANIFEST): rebuild the bundle (tools/gpu-bundle.sh)"
  done

  # the architecture: sm_90 machine code in every CUDA program (PTX for compute_90 or lower
  # would run too, compiled by the driver at start: enough for a rehearsal bundle, which is
  # what CI packs, but not for the bundle a lease runs: that would spend minutes compiling)
  # "sm_90 ptx:90" for each program: the machine code and PTX it carries, read by
  # tools/cuda-archs.py for all of them at once (one Python start, not one a program)
  local cc=${device_cc:-$target_cc} lowest line device=()
  local -A codes=()
  for rel in "${listed[@]}"; do
    [[ -x $bundle/$rel ]] || continue
    printf '%s\n' "${host_only[@]}" | grep -qx "${rel#bin/}" || device+=("$rel")
  done
  while read -r f line; do codes[$f]=$line; done < <(cd "$bundle" && python3 "$root/tools/cuda-archs.py" "${device[@]}" 2>/dev/null)
  for rel in "${device[@]}"; do
    code=${codes[$rel]:-}
    lowest=$(grep -oE 'ptx:[0-9]+' <<<"$code" | cut -d: -f2 | sort -n | head -n 1)
    if [[ -z $code ]]; then
      problem "$rel carries no GPU code (tools/cuda-archs.py finds no .nv_fatbin in it): not a CUDA program of the bundle; rebuild it"
    elif [[ " $code " == *" sm_${cc} "* ]]; then
      :
    elif [[ $kind == rehearsal && -n $lowest ]] && ((lowest <= cc)); then
      :
    else
      problem "$rel was built for another architecture: it carries ${code// /, } and no sm_${cc} machine code (H100/H200: compute capability ${cc:0:1}.${cc:1}); rebuild the bundle with tools/gpu-bundle.sh (CUDA architecture 90)"
    fi
  done

  # the data, compressed, each with the sha256 the bundle recorded
  local data_lines
  mapfile -t data_lines < <(manifest_values data)
  ((${#data_lines[@]})) || problem "MANIFEST lists no data files: rebuild the bundle (it packs data/mnist and data/heart)"
  for p in "${data_lines[@]}"; do
    f=${p%% *} want=${p##* }
    if [[ ! -f $bundle/$f ]]; then
      problem "missing data file $f: rebuild the bundle (tools/gpu-bundle.sh compresses data/mnist from tools/fetch-mnist.sh and data/heart from tools/fetch-heart.sh)"
      continue
    fi
    got=$(sha256sum "$bundle/$f" | cut -d' ' -f1)
    [[ $got == "$want" ]] || problem "data file $f has sha256 $got, MANIFEST says $want: a damaged copy; rebuild the bundle"
  done

  # the CPU: the host code was built for x86-64-v3 (AVX2, FMA, BMI2)
  if [[ $(manifest_values cpu) == x86-64-v3 ]]; then
    for f in avx2 fma bmi2; do
      grep -qw "$f" /proc/cpuinfo || problem "this CPU lacks $f, which the bundle's host code (x86-64-v3) needs"
    done
  fi

  # every shared library: in the bundle, or one the GPU image provides (ldd lists a program's
  # whole closure, the libraries' own dependencies included: lib/ is checked through the
  # programs that load it, and a library no program loads cannot stop one)
  setup_library_path
  for rel in "${listed[@]}"; do
    [[ -x $bundle/$rel ]] && check_closure "$bundle/$rel"
  done

  if ((${#problems[@]})); then
    say "the bundle $bundle cannot be used:"
    printf '  - %s\n' "${problems[@]}" >&2
    return 2
  fi
  say "bundle ok: $kind, ${#listed[@]} programs, commit $(manifest_values commit), built $(manifest_values built), $(du -sh "$bundle" | cut -f1)"
  return 0
}

# ---------------------------------------------------------------- the steps
results=$work/results.tsv  # name, status, seconds, summary
: >"$results"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$results"; }

# run_step NAME TIMEOUT_S CMD...: runs CMD into logs/NAME.log; exit 77 is "skipped", 124 a timeout
run_step() {
  local name=$1 limit=$2 t0=${EPOCHREALTIME/./} rc status
  shift 2
  if ! selected "$name"; then
    record "$name" "skipped: not selected (GPU_CHECK_ONLY)" 0 ""
    return 0
  fi
  timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1 </dev/null
  rc=$?
  case $rc in
    0) status=ok ;;
    77) status=skipped ;;
    124|137) status="failed: timed out after ${limit} s" ;;
    *) status="failed: exit $rc" ;;
  esac
  record "$name" "$status" "$(((${EPOCHREALTIME/./} - t0) / 1000))" "$(summary "$name")"
}

# GPU_CHECK_ONLY: is the step NAME one of those asked for (all when it is unset)?
selected() {
  local want
  [[ -z ${GPU_CHECK_ONLY:-} ]] && return 0
  for want in ${GPU_CHECK_ONLY//,/ }; do
    # shellcheck disable=SC2053  # a trailing '*' is meant as a pattern
    [[ $1 == $want ]] && return 0
  done
  return 1
}

# one line that says what a step's log shows (its last line when the usual one is missing)
summary() {
  local log=$logs/$1.log line
  case $1 in
    suite:*) line=$(grep -E '^\*\*\* |failures? (is|are) detected|No errors detected|^skipped:' "$log" | tail -n 1) ;;
    memcheck:*|racecheck*) line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Error:|Device not supported' "$log" | tail -n 1 | sed 's/^=* *//') ;;
    ring2|ps2) line=$(grep -E 'check_data_parallel:|gradus: |error' "$log" | tail -n 2 | sed 's/^-- //') ;;
    bench) line=$(grep -E '^device:' "$log" | head -n 1) ;;
    mnist) line=$(grep -E '^\| (mlp|cnn|lstm) \| s / epoch' "$log" | awk -F'|' '{printf "%s %s%s; ", $2, $6, $8}') ;;
    precision) line=$(grep -E '^\| [a-z_]+ \| (bf16|fp16) \|' "$log" | awk -F'|' '{printf "%s%s x%s; ", $2, $3, $5}') ;;
  esac
  [[ -n $line ]] || line=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
  # (Boost.Test colours its verdict: the escapes are dropped)
  tr '\t\n' '  ' <<<"$line" | sed 's/\x1b\[[0-9;]*m//g; s/  */ /g' | cut -c1-200
}

skip_all() {  # every GPU step, with why
  local s
  for s in "${gpu_steps[@]}"; do record "$s" "skipped: $1" 0 ""; done
}

write_report() {
  local md=$out_dir/gpu-check.md json=$out_dir/gpu-check.json
  mkdir -p "$out_dir"
  python3 - "$results" "$work" "$md" "$json" "$bundle" <<'EOF'
import json, os, sys
results, work, md, js, bundle = sys.argv[1:6]
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]
steps = [{"step": r[0], "status": r[1], "seconds": int(r[2] or 0) / 1000, "summary": r[3] if len(r) > 3 else ""} for r in rows]
def read(name):
    p = os.path.join(work, name)
    return open(p).read() if os.path.exists(p) else ""
info = dict(l.split("=", 1) for l in read("info.txt").splitlines() if "=" in l)
manifest = {}
mpath = os.path.join(bundle, "MANIFEST")
for l in (open(mpath).read().splitlines() if os.path.exists(mpath) else []):
    k, _, v = l.partition(" ")
    manifest.setdefault(k, []).append(v)
bench = [l for l in read("logs/bench.log").splitlines() if l.startswith("|")]
mnist_table = [l for l in read("logs/mnist.log").splitlines() if l.startswith("|")]
mnist_json = json.loads(read("mnist.json")) if read("mnist.json") else None
failed = [s["step"] for s in steps if s["status"].startswith("failed")]
doc = {"device": info, "bundle": {k: v if len(v) > 1 else v[0] for k, v in manifest.items()},
       "steps": steps, "bench_cuda": bench, "mnist_vs_pytorch": mnist_json, "failed": failed}
with open(js, "w") as f:
    json.dump(doc, f, indent=1)
with open(md, "w") as f:
    f.write(f"## GPU check: {info.get('gpu', 'no CUDA device')}\n\n")
    f.write(f"gradus commit {manifest.get('commit', ['?'])[0]} (bundle built {manifest.get('built', ['?'])[0]}, "
            f"nvcc {manifest.get('nvcc', ['?'])[0]}, CUDA architecture {manifest.get('cuda_arch', ['?'])[0]}); "
            f"driver {info.get('driver', '—')}, memory {info.get('memory', '—')}, compute capability {info.get('cc', '—')}, "
            f"clocks {info.get('clocks', '—')}; host {info.get('cpu', '?')}; run {info.get('date', '?')}\n\n")
    f.write("| step | status | seconds | what it showed |\n|---|---|---|---|\n")
    for s in steps:
        f.write(f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {s['summary'].replace('|', '/')} |\n")
    if bench:
        f.write("\nbench_cuda (medians, CUDA events):\n\n" + "\n".join(bench) + "\n")
    if mnist_table:
        f.write("\nMNIST, one epoch each, against PyTorch eager on the same GPU (benchmarks/mnist_vs_pytorch.py --cuda):\n\n"
                + "\n".join(mnist_table) + "\n")
    f.write(f"\n{len(failed)} step(s) failed" + (": " + ", ".join(failed) if failed else "") + ".\n")
print(open(md).read())
EOF
  tar -czf "$out_dir/gpu-check-logs.tar.gz" -C "$work" logs 2>/dev/null
}

gpu_steps=(suite:cuda_gpu suite:cuda_omp suite:cuda_omp_graph suite:cuda_omp_dist
  memcheck:mnist_mlp memcheck:mnist_cnn memcheck:seq_mnist_lstm memcheck:linear_regression memcheck:logistic_regression
  racecheck:mnist_cnn ring2 ps2 bench mnist precision)

t_start=$(date +%s)
# ---- the device, as nvidia-smi sees it (before the bundle: its code must match the GPU's
# compute capability; 9.0 where there is none)
{
  echo "date=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
  smi=$(find_tool nvidia-smi) &&
    "$smi" --query-gpu=name,memory.total,driver_version,compute_cap,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,pstate,temperature.gpu \
      --format=csv,noheader 2>/dev/null | head -n 1 |
    awk -F', ' '{print "gpu=" $1; print "memory=" $2; print "driver=" $3; print "cc=" $4;
                 print "clocks=SM " $5 " (max " $6 "), memory " $7 " (max " $8 "), " $9 ", " $10 " C"}'
} >"$work/info.txt"
info() { sed -n "s/^$1=//p" "$work/info.txt"; }
device_cc=$(info cc | tr -d .)

validate
rc=$?
if [[ $mode == validate ]]; then exit $rc; fi
if ((rc != 0)); then
  record bundle "failed: the bundle cannot be used" 0 "$(printf '%s; ' "${problems[@]}" | cut -c1-400)"
  skip_all "the bundle cannot be used"
  write_report >&2
  exit 2
fi
record bundle ok 0 "$(manifest_values kind), commit $(manifest_values commit), $(du -sh "$bundle" | cut -f1)"
echo "LD_LIBRARY_PATH=$libpath" >"$logs/bundle.log"
bin=$bundle/bin
genv=(env "LD_LIBRARY_PATH=$libpath")  # how a bundle program is started

# the CUDA runtime's own answer decides (nvidia-smi may be missing, or see a GPU that CUDA
# cannot use): the GPU test without a device exits 77
timeout 60 "${genv[@]}" "$bin/cuda_gpu_test_cuda_gpu" --run_test=dropout_mask_matches_the_host_hash_bit_for_bit >"$logs/device.log" 2>&1 </dev/null
probe=$?
# GRADUS_GPU_CHECK_ASSUME_DEVICE=1: every step runs even where the runtime sees no device, so
# that the check's own plumbing is tested without a GPU (tests/gpu_check: each step then
# fails or is skipped by its program, and the report names it)
[[ ${GRADUS_GPU_CHECK_ASSUME_DEVICE:-0} == 1 && $probe == 77 ]] && probe=0
if ((probe == 77)); then
  record device "skipped: no CUDA device" 0 "$(head -n 1 "$logs/device.log")"
  skip_all "no CUDA device"
  write_report
  say "no CUDA device: every GPU step skipped (the rehearsal); $(($(date +%s) - t_start)) s"
  exit 0
fi
record device "$( ((probe == 0)) && echo ok || echo "failed: the probe exited $probe")" 0 \
  "$(info gpu), $(info memory), driver $(info driver), compute capability $(info cc); $(info clocks)"

# ---- the data, uncompressed once
data=$work/data
mkdir -p "$data/mnist" "$data/heart"
for f in "$bundle"/data/mnist/*.gz; do gzip -dc "$f" >"$data/mnist/$(basename "${f%.gz}")"; done
gzip -dc "$bundle/data/heart/heart_scale.gz" >"$data/heart/heart_scale"

sanitizer=$(find_tool compute-sanitizer) || sanitizer=
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
short_mnist=(--data "$data/mnist" --train-limit 512 --epochs 1 --seed 1 --quiet --json)

# ---- side by side: correctness (phase 1)
for t in cuda_gpu cuda_omp cuda_omp_graph cuda_omp_dist; do
  run_step "suite:$t" 120 "${genv[@]}" "$bin/cuda_gpu_test_$t" --log_level=test_suite &
  pids+=($!)
done
sanitize() {  # sanitize TOOL NAME PROGRAM ARGS...
  local tool=$1 name=$2
  shift 2
  if [[ -z $sanitizer ]] && selected "$name"; then
    record "$name" "skipped: compute-sanitizer not found" 0 ""
    return
  fi
  run_step "$name" 120 "${genv[@]}" "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 20 "$@"
}
sanitize memcheck memcheck:mnist_mlp "$bin/mnist_mlp_cuda" "${short_mnist[@]}" &
pids+=($!)
sanitize memcheck memcheck:mnist_cnn "$bin/mnist_cnn_cuda" "${short_mnist[@]}" &
pids+=($!)
sanitize memcheck memcheck:seq_mnist_lstm "$bin/seq_mnist_lstm_cuda" "${short_mnist[@]}" &
pids+=($!)
sanitize memcheck memcheck:linear_regression "$bin/linear_regression_cuda" --steps 50 --json &
pids+=($!)
sanitize memcheck memcheck:logistic_regression "$bin/logistic_regression_cuda" --epochs 20 --data "$data/heart/heart_scale" --json &
pids+=($!)
sanitize racecheck racecheck:mnist_cnn "$bin/mnist_cnn_cuda" --data "$data/mnist" --train-limit 256 --epochs 1 --quiet --json &
pids+=($!)
dist_args="--data $data/mnist --train-limit 12000 --epochs 2 --seed 2 --threads 1"
glist=$(IFS=';'; echo "${genv[*]}")  # the same as a CMake list
run_step ring2 120 cmake "-DEXE=$glist;$bin/mnist_mlp_cuda" "-DLAUNCHER=$glist;$bin/gradus-run" -DNP=2 -DTOL=0.015 -DMIN_ACC=0.92 \
  "-DARGS=$dist_args" -P "$root/examples/check_data_parallel.cmake" &
pids+=($!)
run_step ps2 120 cmake "-DEXE=$glist;$bin/mnist_mlp_cuda" "-DLAUNCHER=$glist;$bin/gradus-run;--ps;2" -DNP=2 -DTOL=0.015 -DMIN_ACC=0.92 \
  -DCOMM=ps -DCOMM_NAME=parameter_server "-DCOMM_ARGS=--consistency bsp" "-DARGS=$dist_args" \
  -P "$root/examples/check_data_parallel.cmake" &
pids+=($!)
wait "${pids[@]}"
pids=()
write_report >/dev/null  # what a run cut short still brings back

# ---- alone: timings (phase 2)
run_step bench 60 "${genv[@]}" "$bin/bench_cuda" 21
write_report >/dev/null
# GPU_CHECK_SEEDS=3: medians over seeds 1, 2, 3 (each ~50 s more; one by default, to fit the lease)
nseeds=${GPU_CHECK_SEEDS:-1}
seeds=$(seq -s, 1 "$nseeds")
run_step mnist $((170 * nseeds)) env PYTHONUNBUFFERED=1 python3 "$root/benchmarks/mnist_vs_pytorch.py" --cuda --exe-dir "$bin" \
  --data "$data/mnist" --models mlp,cnn,lstm --seeds "$seeds" --epochs 1 --idle-wait 0 --json-out "$work/mnist.json" \
  --gradus-library-path "$libpath"
write_report >/dev/null
run_step precision 150 env PYTHONUNBUFFERED=1 python3 "$root/benchmarks/precision_epochs.py" --data "$data/mnist" \
  --seeds 1 --threads 2 --max-drop 0.5 --library-path "$libpath" "$bin/mnist_mlp_cuda" "$bin/mnist_cnn_cuda" "$bin/seq_mnist_lstm_cuda"

write_report
failed=$(awk -F'\t' '$2 ~ /^failed/' "$results" | wc -l)
say "$failed step(s) failed; $(($(date +%s) - t_start)) s in all; the table, JSON and logs are in $out_dir"
((failed == 0))
