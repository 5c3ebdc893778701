#!/usr/bin/env bash
# Builds, here, everything a lent GPU machine runs, and packs it into one folder that travels
# with the repository (the device tool's carry), so that the GPU's minutes go to running:
#
#   tools/gpu-bundle.sh [DIR]                    build and pack (default DIR build/gpu-bundle)
#   tools/gpu-bundle.sh --prebuilt BUILD [DIR]   pack the CUDA programs an existing build tree
#                                                holds, without building (a "rehearsal" bundle:
#                                                CI packs its own sm_90 PTX build this way)
#   --plain / --compress (before the rest)       the files as a folder (the default with
#                                                --prebuilt) or in one payload.tar.gz (the
#                                                default otherwise: the programs are 55 MB as
#                                                they are, 24 MB compressed)
#
# The build (build/gpu-bundle.build, or GRADUS_BUNDLE_BUILD): nvcc for CUDA architecture 90
# (sm_90 machine code plus compute_90 PTX), Release, host code for x86-64-v3 (AVX2/FMA: any
# H100/H200 host; not -march=native, which is this machine's CPU), without oneDNN and MPI,
# with Debian's reference BLAS for cpu_simd (the GPU suite's references; OpenBLAS is 36 MB),
# linked --as-needed; the targets are tools/gpu-check.sh --list-programs: the GPU tests (the
# gpu-labelled test and tests/cuda_omp's units built by nvcc), bench_cuda, the _cuda twins of
# the examples and gradus-run. About 20 minutes on 2 cores.
#
# The bundle: bin/ (the programs, stripped), lib/ (every shared library they need that the
# GPU image lacks, found with ldd: what is not on gpu-check.sh's allow-list of glibc, the GCC
# runtime, the driver, the CUDA runtime, cuBLAS, cuDNN and NCCL), lib-fallback/ (this
# machine's libstdc++ and libgcc_s, used there only if the image's are older), data/ (MNIST
# and the heart data, gzip-compressed), MANIFEST (commit, compiler, architecture, programs,
# data sha256). Compressed, all but MANIFEST travel in payload.tar.gz (its sha256 in MANIFEST),
# which gpu-check.sh unpacks in a second. It ends by running tools/gpu-check.sh --validate on
# the result and prints its size with the repository's: the device tool takes 64 MiB in all.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { printf 'gpu-bundle: %s\n' "$*" >&2; exit 1; }
say() { printf 'gpu-bundle: %s\n' "$*" >&2; }

prebuilt= compress=
case "${1:-}" in
  --plain) compress=no; shift ;;
  --compress) compress=yes; shift ;;
esac
if [[ ${1:-} == --prebuilt ]]; then
  [[ $# -ge 2 ]] || die "--prebuilt needs a build directory"
  prebuilt=$(cd "$2" 2>/dev/null && pwd) || die "--prebuilt $2: no such build directory"
  shift 2
fi
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
bundle=${1:-$root/build/gpu-bundle}
[[ $bundle == /* ]] || bundle=$PWD/$bundle
mapfile -t programs < <("$root/tools/gpu-check.sh" --list-programs)
allow=$(sed -n "s/^allow='\(.*\)'$/\1/p" "$root/tools/gpu-check.sh")
[[ -n $allow ]] || die "cannot read the allow-list from tools/gpu-check.sh"

# ---------------------------------------------------------------- build
nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
if [[ -z $prebuilt ]]; then
  [[ -x $nvcc ]] || die "no nvcc at $nvcc (set CUDACXX): the bundle is built with the CUDA toolkit"
  build=${GRADUS_BUNDLE_BUILD:-$root/build/gpu-bundle.build}
  # the GPU suite's cpu_simd references multiply small matrices: Debian's reference BLAS
  # (libblas3, 0.4 MB) travels instead of OpenBLAS (36 MB)
  blas=/usr/lib/$(gcc -dumpmachine)/blas/libblas.so.3
  [[ -f $blas ]] || die "no reference BLAS at $blas (Debian: apt-get install libblas3)"
  say "configuring $build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGRADUS_CUDA=ON -DGRADUS_CUDA_DEVICE_SUITE=ON \
    -DGRADUS_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DCMAKE_CUDA_FLAGS=-Xcompiler=-march=x86-64-v3 \
    -DGRADUS_DNNL=OFF -DGRADUS_MPI=OFF -DGRADUS_BLAS_LIBRARY="$blas" -DGRADUS_WERROR=ON -DGRADUS_BUILD_TESTS=ON -DGRADUS_BUILD_EXAMPLES=ON \
    -DGRADUS_BUILD_BENCHMARKS=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed \
    "-DGRADUS_GPU_BUNDLE_PROGRAMS=$(IFS=';'; echo "${programs[*]}")" >/dev/null
  say "building ${programs[*]} (nvcc, sm_90 + PTX)"
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target gpu_bundle_programs
  kind=full
else
  build=$prebuilt
  kind=rehearsal
fi
[[ -n $compress ]] || { [[ $kind == full ]] && compress=yes || compress=no; }
arch=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")
[[ -n $arch ]] || die "$build was configured without CUDA (no CMAKE_CUDA_ARCHITECTURES in its CMakeCache.txt)"

# ---------------------------------------------------------------- stage
data_src=${GRADUS_BUNDLE_DATA:-$root/data}
for f in mnist/train-images-idx3-ubyte mnist/train-labels-idx1-ubyte mnist/t10k-images-idx3-ubyte mnist/t10k-labels-idx1-ubyte heart/heart_scale; do
  [[ -f $data_src/$f ]] || die "no $data_src/$f: run tools/fetch-mnist.sh and tools/fetch-heart.sh first"
done
rm -rf "$bundle.tmp"
mkdir -p "$bundle.tmp"/{bin,lib,lib-fallback,data/mnist,data/heart}
found=()
for p in "${programs[@]}"; do
  exe=$(find "$build" -type f -name "$p" -perm -u+x -not -path '*/CMakeFiles/*' -not -path '*/bin/*' | head -n 1)
  if [[ -z $exe ]]; then
    [[ $kind == rehearsal ]] && continue
    die "the build has no $p"
  fi
  cp "$exe" "$bundle.tmp/bin/$p"
  strip --strip-unneeded "$bundle.tmp/bin/$p"  # the host symbols; the device code (.nv_fatbin) stays
  found+=("$p")
done
((${#found[@]})) || die "$build holds none of the programs (${programs[*]})"

# every library the programs load that the GPU image does not provide: into lib/, under its
# soname, stripped
for p in "${found[@]}"; do
  while read -r name path; do
    [[ $name =~ $allow || -e $bundle.tmp/lib/$name ]] && continue
    [[ -f $path ]] || die "bin/$p needs $name, which ldd resolves to '$path' here"
    cp -L "$path" "$bundle.tmp/lib/$name"
    chmod u+w "$bundle.tmp/lib/$name"
    strip --strip-unneeded "$bundle.tmp/lib/$name" 2>/dev/null || true
  done < <(ldd "$bundle.tmp/bin/$p" | sed -n 's/^[[:space:]]*\([^[:space:]]*\) => \(\/[^[:space:]]*\) .*/\1 \2/p')
done
for name in libstdc++.so.6 libgcc_s.so.1; do
  path=$(ldconfig -p | sed -n "s/^[[:space:]]*$name (libc6,x86-64) => //p" | head -n 1)
  [[ -n $path ]] && cp -L "$path" "$bundle.tmp/lib-fallback/$name"
done

# gzip -6: MNIST's training images take 1.2 s and 9.9 MB, against 13.3 s and 9.7 MB at -9
for f in mnist/train-images-idx3-ubyte mnist/train-labels-idx1-ubyte mnist/t10k-images-idx3-ubyte mnist/t10k-labels-idx1-ubyte heart/heart_scale; do
  gzip -6 -n -c "$data_src/$f" >"$bundle.tmp/data/$f.gz"
done

commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit+="-dirty"
{
  echo "format 1"
  echo "kind $kind"
  echo "commit $commit"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
  echo "nvcc $("$nvcc" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p')"
  echo "cuda_arch ${arch//;/ }"
  [[ $kind == full ]] && echo "cpu x86-64-v3"
  for p in "${found[@]}"; do echo "program bin/$p"; done
  (cd "$bundle.tmp" && for f in data/*/*.gz; do echo "data $f $(sha256sum "$f" | cut -d' ' -f1)"; done)
} >"$bundle.tmp/MANIFEST"
if [[ $compress == yes ]]; then
  tar -C "$bundle.tmp" -cf - bin lib lib-fallback data | gzip -6 -n >"$bundle.tmp/payload.tar.gz"
  rm -rf "$bundle.tmp"/{bin,lib,lib-fallback,data}
  echo "payload payload.tar.gz $(sha256sum "$bundle.tmp/payload.tar.gz" | cut -d' ' -f1)" >>"$bundle.tmp/MANIFEST"
fi
rm -rf "$bundle"
mv "$bundle.tmp" "$bundle"

# ---------------------------------------------------------------- check and size
"$root/tools/gpu-check.sh" --validate "$bundle" || die "the bundle at $bundle fails its own check (above)"
bundle_bytes=$(du -sb "$bundle" | cut -f1)
tree_bytes=$(cd "$root" && { git ls-files -z; git ls-files -z --others --exclude-standard; } | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
size_of() { mib "$(du -sb "$1" | cut -f1)"; }
if [[ $compress == yes ]]; then
  say "$bundle: $(mib "$bundle_bytes") ($kind: ${#found[@]} programs, their libraries and the data in payload.tar.gz)"
else
  say "$bundle: $(mib "$bundle_bytes") ($kind: ${#found[@]} programs $(size_of "$bundle/bin"), libraries $(size_of "$bundle/lib"), data $(size_of "$bundle/data"))"
fi
say "with the repository's working tree ($(mib "$tree_bytes")): $(mib $((bundle_bytes + tree_bytes))) of the device tool's 64 MiB"
if ((bundle_bytes + tree_bytes > 64 * 1048576)); then
  # a lease carries a bundle built for architecture 90 alone: a rehearsal of a build for more
  # (the release preset's 80;90 machine code) is over the limit without saying anything of it
  if [[ $kind == full || $arch =~ ^90(-real|-virtual)?$ ]]; then
    die "the bundle and the working tree together exceed 64 MiB: the device tool would refuse them"
  fi
  say "over 64 MiB, as a rehearsal of a build for CUDA architectures $arch may be; the bundle a lease carries is built for 90 alone (tools/gpu-bundle.sh without --prebuilt) and checked against the limit then"
fi
