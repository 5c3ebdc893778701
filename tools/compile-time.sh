#!/usr/bin/env bash
# Measures the compile time of each example (compile only, no link) with g++ and
# clang++-14 in Release, using the exact command CMake generates (compile_commands.json):
# wall seconds (best of RUNS) and the compiler's peak memory (GNU time's "Maximum resident
# set size", the same figure as /usr/bin/time -v). Prints docs/compile-time.md's table rows,
# and the _cuda twins' (nvcc) where the g++ configuration finds nvcc.
#   tools/compile-time.sh [RUNS=3] [GLOB='*']   e.g. tools/compile-time.sh 1 'mnist_*'
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
glob=${2:-*}
command -v /usr/bin/time >/dev/null || { echo "compile-time: needs GNU time (apt-get install time)" >&2; exit 1; }

# The "command" of FILE's entry in DIR/compile_commands.json (CMake parses the JSON).
command_for() {
  local dir=$1 file=$2 script
  script=$(mktemp --suffix=.cmake)
  cat >"$script" <<'CMAKE'
file(READ "${DB}" db)
string(JSON n LENGTH "${db}")
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON f GET "${db}" ${i} file)
  if(f STREQUAL FILE)
    string(JSON c GET "${db}" ${i} command)
    execute_process(COMMAND ${CMAKE_COMMAND} -E echo "${c}")
  endif()
endforeach()
CMAKE
  cmake -DDB="$dir/compile_commands.json" -DFILE="$file" -P "$script"
  rm -f "$script"
}

# best wall time and its peak memory of RUNS runs of a compile command in DIR: "wall kib"
time_command() {
  local dir=$1 cmd=$2 best="" mem="" out status wall kib
  for ((r = 0; r < runs; ++r)); do
    out=$(cd "$dir" && eval "/usr/bin/time -f '%x %e %M' $cmd" 2>&1 | tail -1)
    read -r status wall kib <<<"$out"
    [[ "$status" == 0 ]] || return 1
    if [[ -z "$best" ]] || awk "BEGIN{exit !($wall < $best)}"; then best=$wall mem=$kib; fi
  done
  echo "$best $mem"
}

echo "| example | compiler | wall (s) | peak memory (MiB) |"
echo "|---|---|---:|---:|"
for cxx in g++ clang++-14; do
  dir=build/compile-time-$cxx
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
        -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=ON >/dev/null 2>&1
  version="$cxx $("$cxx" -dumpfullversion 2>/dev/null || "$cxx" -dumpversion)"
  for src in examples/$glob.cpp; do
    cmd=$(command_for "$dir" "$PWD/$src")
    [[ -n "$cmd" ]] || { echo "compile-time: no compile command for $src" >&2; exit 1; }
    res=$(time_command "$dir/examples" "$cmd") || { echo "compile-time: $cxx failed on $src" >&2; exit 1; }
    read -r best mem <<<"$res"
    printf '| %s | %s | %.1f | %d |\n' "$(basename "$src" .cpp)" "$version" "$best" $((mem / 1024))
  done
done
# The examples' _cuda twins (nvcc; host code by g++), where the g++ configuration found nvcc:
# the generated one-line .cu files that include the example's .cpp.
dir=build/compile-time-g++
for cu in "$dir"/examples/cuda/$glob.cu; do
  [[ -f "$cu" ]] || continue
  cmd=$(command_for "$dir" "$PWD/$cu")
  [[ -n "$cmd" ]] || { echo "compile-time: no compile command for $cu" >&2; exit 1; }
  version="nvcc $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  res=$(time_command "$dir/examples" "$cmd") || { echo "compile-time: nvcc failed on $cu" >&2; exit 1; }
  read -r best mem <<<"$res"
  printf '| %s_cuda | %s | %.1f | %d |\n' "$(basename "$cu" .cu)" "$version" "$best" $((mem / 1024))
done
