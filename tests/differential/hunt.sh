#!/usr/bin/env bash
# Hunts for gradient bugs with fresh random expressions: generates N seeds (default 4) of
# CASES expressions each (default 5), builds them in build/hunt and runs them. A failure
# prints the seed, the case and its expression; `gen_cases.py --seed S` rebuilds it, and
# adding S to GRADUS_DIFFERENTIAL_SEEDS (tests/differential/CMakeLists.txt) keeps it in CI.
#   tests/differential/hunt.sh [N] [CASES] [SEED...]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-4}
cases=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
seeds=("$@")
while (( ${#seeds[@]} < n )); do seeds+=( $(( (RANDOM << 15 | RANDOM) + 100 )) ); done
list=$(IFS=';'; echo "${seeds[*]}")
echo "hunt: seeds ${list}, ${cases} expressions each"
cmake -S . -B build/hunt -DCMAKE_BUILD_TYPE=Release -DGRADUS_BUILD_TESTS=ON -DGRADUS_BUILD_EXAMPLES=OFF \
  "-DGRADUS_DIFFERENTIAL_SEEDS=${list}" "-DGRADUS_DIFFERENTIAL_CASES=${cases}" >/dev/null
targets=()
for s in "${seeds[@]}"; do targets+=(differential_seed_"$s"); done
cmake --build build/hunt -j"$(nproc)" --target "${targets[@]}"
ctest --test-dir build/hunt -L differential --output-on-failure
