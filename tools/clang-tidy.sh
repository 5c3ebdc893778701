#!/bin/bash
# Runs clang-tidy-14 with the repository's .clang-tidy (bugprone-*, performance-*,
# concurrency-*, warnings as errors) over gradus' own headers, and exits non-zero on any
# finding or on a header that does not compile.
#   tools/clang-tidy.sh                      every header below
#   tools/clang-tidy.sh include/gradus/train/schedule.hpp backends/comm/ring/include/gradus/comm/ring.hpp
#                                            a subset (paths from the repository's root)
#   tools/clang-tidy.sh --each [header...]   one unit per header (slow: see below); it also
#                                            shows a header that does not compile on its own
# What it checks: include/gradus/**/*.hpp, the CPU compute backend
# (backends/compute/cpu_simd) and the communicators (backends/comm/net, ring, ps), and
# backends/comm/mpi when the build found MPI (mpi.h; else those headers are skipped, with a
# line saying so). Not checked: backends/compute/cuda, whose headers need nvcc (or Thrust's
# OpenMP system, the cuda_omp build) to parse.
# How: the headers are included by a few generated translation units, one per group (core:
# include/gradus + cpu_simd; comm: net, ring, ps; mpi), not one per header: every unit parses
# xtensor and the standard library again, so one unit per header takes ~17x as long
# (docs/testing.md has the times). The include folders and definitions are those of the
# library's CMake targets, read from the compile_commands.json of a configured build:
# $GRADUS_TIDY_BUILD (default build/clang-tidy), configured here with the ci preset
# (configure only, nothing is built) when it has none. Diagnostics are reported for gradus'
# headers only (HeaderFilterRegex), never for xtensor, xsimd, ZeroMQ, Boost or the system's.
# CLANG_TIDY overrides the binary (default clang-tidy-14).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tidy=${CLANG_TIDY:-clang-tidy-14}
build=${GRADUS_TIDY_BUILD:-$root/build/clang-tidy}
start=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }

if [[ ! -f $build/compile_commands.json ]]; then
  echo "clang-tidy.sh: configuring $build (cmake --preset ci, configure only)" >&2
  cmake --preset ci -S "$root" -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
fi

# The flags the library's targets give their users: -I of gradus' include folders (not the
# tests' own, not CUDA's), -isystem, the GRADUS_HAVE_* and MPI definitions, OpenMP and the
# target architecture (xsimd picks its instruction set from -march).
mapfile -t flags < <(python3 - "$build/compile_commands.json" "$root" <<'EOF'
import json, shlex, sys
cc, root = json.load(open(sys.argv[1])), sys.argv[2]
keep_defs = ("GRADUS_HAVE_", "OMPI_SKIP_MPICXX", "MPICH_SKIP_MPICXX", "_MPICC_H")
out, seen = [], set()
def add(*f):
    if f not in seen:
        seen.add(f)
        out.extend(f)
for e in cc:
    a = shlex.split(e["command"]) if "command" in e else e["arguments"]
    if not a[0].endswith(("g++", "c++", "clang++", "clang++-14")) or "/tests/fuzz" in e["file"]:
        continue
    i = 0
    while i < len(a):
        x = a[i]
        if x in ("-I", "-isystem", "-D"):
            x, i = x + a[i + 1], i + 1
        if x.startswith("-I") and (x[2:] == root + "/include" or x[2:].startswith(root + "/backends/")) \
                and "/backends/compute/cuda/" not in x:
            add(x)
        elif x.startswith("-isystem"):
            d = x[len("-isystem"):]
            if "cccl" not in d and "cuda" not in d:
                add("-isystem", d)
        elif x.startswith("-D") and x[2:].startswith(keep_defs):
            add(x)
        elif x in ("-fopenmp", "-march=native", "-ffp-contract=off"):
            add(x)
        i += 1
print("\n".join(out))
EOF
)
have_mpi=0
for f in "${flags[@]}"; do [[ $f == -DGRADUS_HAVE_MPI* ]] && have_mpi=1; done

group_of() {  # core | comm | mpi | other, from a header's path relative to the root
  case $1 in
    include/gradus/*|backends/compute/cpu_simd/*) echo core ;;
    backends/comm/net/*|backends/comm/ring/*|backends/comm/ps/*) echo comm ;;
    backends/comm/mpi/*) echo mpi ;;
    *) echo other ;;
  esac
}

each=0
if [[ ${1:-} = --each ]]; then each=1; shift; fi
declare -A members=()
if (($#)); then
  for h in "$@"; do
    [[ $h = /* ]] && h=${h#"$root"/}
    [[ -f $root/$h ]] || { echo "clang-tidy.sh: no header $h" >&2; exit 2; }
    g=$(group_of "$h")
    [[ $g = other ]] && { echo "clang-tidy.sh: $h is not a header this script checks (CUDA headers need nvcc)" >&2; exit 2; }
    members[$g]+="$h "
  done
else
  cd "$root"
  for h in $(find include/gradus backends/compute/cpu_simd backends/comm/net backends/comm/ring \
                  backends/comm/ps backends/comm/mpi -name '*.hpp' | sort); do
    members[$(group_of "$h")]+="$h "
  done
fi
if [[ -n ${members[mpi]:-} && $have_mpi = 0 ]]; then
  echo "clang-tidy.sh: MPI not found by the build (no mpi.h): backends/comm/mpi skipped" >&2
  unset 'members[mpi]'
fi

tu_dir=$build/clang-tidy-units
mkdir -p "$tu_dir"
log=$tu_dir/findings.txt
: >"$log"
status=0
run_unit() {  # run_unit <name> <header>...: one generated unit that includes the headers
  local name=$1 t0=$EPOCHREALTIME h
  shift
  for h in "$@"; do echo "#include \"$root/$h\""; done >"$tu_dir/$name.cpp"
  echo "clang-tidy.sh: $name: $# header(s)" >&2
  # --quiet drops the counts of suppressed diagnostics (those in other libraries' headers)
  "$tidy" --quiet --config-file="$root/.clang-tidy" "$tu_dir/$name.cpp" -- -std=c++20 -DNDEBUG "${flags[@]}" \
    >"$tu_dir/$name.out" 2>&1 || status=1
  grep -vE '^[0-9]+ warnings? generated\.$' "$tu_dir/$name.out" | tee -a "$log" || true
  echo "clang-tidy.sh: $name: $(since "$t0")" >&2
}
for g in core comm mpi; do
  [[ -n ${members[$g]:-} ]] || continue
  if ((each)); then
    for h in ${members[$g]}; do n=${h//\//_}; run_unit "${n%.hpp}" "$h"; done
  else
    # shellcheck disable=SC2086  # the member list splits on spaces: paths have none
    run_unit "$g" ${members[$g]}
  fi
done

# A header included by two units is reported twice: count each finding once.
findings=$(grep -E '^/.*: (warning|error): .*\[[a-z0-9.-]+(,-warnings-as-errors)?\]$' "$log" | sort -u || true)
echo "clang-tidy.sh: wall time $(since "$start")" >&2
if [[ -n $findings ]]; then
  echo "clang-tidy.sh: $(wc -l <<<"$findings") findings:" >&2
  grep -oE '\[[a-z0-9.-]+' <<<"$findings" | tr -d '[' | sort | uniq -c | sort -rn >&2
  exit 1
fi
if ((status)); then
  echo "clang-tidy.sh: clang-tidy failed (a compile error above?)" >&2
  exit 1
fi
echo "clang-tidy.sh: no findings" >&2
