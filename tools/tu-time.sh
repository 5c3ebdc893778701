#!/usr/bin/env bash
# A compiler launcher that logs what each translation unit costs, to find where a build's
# time goes (CI's budget is the build's CPU time on 2 cores):
#   cmake --preset ci -DCMAKE_CXX_COMPILER_LAUNCHER=$PWD/tools/tu-time.sh \
#         -DCMAKE_CUDA_COMPILER_LAUNCHER=$PWD/tools/tu-time.sh
#   GRADUS_TU_LOG=/tmp/tu.log cmake --build --preset ci
#   sort -rn /tmp/tu.log | head -20      # user seconds, wall seconds, peak MiB, source
# Without GRADUS_TU_LOG it runs the compiler and logs nothing.
set -u
log=${GRADUS_TU_LOG:-}
[[ -n "$log" ]] || exec "$@"
src=""
for a in "$@"; do
  case $a in *.cpp | *.cu | *.cc) src=$a ;; esac
done
out=$(mktemp)
/usr/bin/time -o "$out" -f '%U %e %M' "$@"
rc=$?
if [[ -n "$src" ]]; then
  read -r user wall kib <"$out"
  printf '%s %s %d %s\n' "$user" "$wall" $((kib / 1024)) "$src" >>"$log"
fi
rm -f "$out"
exit $rc
