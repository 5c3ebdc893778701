#!/usr/bin/env bash
# The HTML reference and guides: `tools/build-docs.sh [OUT]` writes OUT/html (default
# build/docs) from docs/Doxyfile; fails, listing every warning, on any warning (an
# undocumented public name, a broken link, a bad Doxygen command). Needs doxygen
# (`apt-get install -y doxygen`, or tools/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v doxygen >/dev/null || { echo "build-docs: doxygen is not installed: apt-get install -y doxygen" >&2; exit 2; }
out=${1:-build/docs}
mkdir -p "$out"
version=$(sed -n 's/^project(gradus VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if GRADUS_DOCS_OUT=$out GRADUS_VERSION=$version doxygen docs/Doxyfile 2>"$log"; then
  echo "build-docs: $out/html/index.html"
else
  sed "s|^$PWD/||" "$log" >&2
  echo "build-docs: $(grep -cE '(warning|error):' "$log") warning(s): the docs build fails on any" >&2
  exit 1
fi
