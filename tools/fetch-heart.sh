#!/usr/bin/env bash
# Puts the Statlog (Heart) data set in LIBSVM format (270 lines, 13 features, labels +1/-1),
# as Debian's liblinear-tools ships it, at data/heart/heart_scale for
# examples/logistic_regression.cpp. Idempotent: a file already there with the right sha256
# is left alone.
#   tools/fetch-heart.sh [DIR]     (default DIR: data/heart under the repository root)
# Where the file comes from, in order:
#   1. /usr/share/doc/liblinear-tools/examples/heart_scale (liblinear-tools installed;
#      tools/install-deps.sh installs it)
#   2. the liblinear-tools .deb itself: `apt-get download` into a temporary directory and
#      `dpkg-deb -x` (minimal images such as Docker's Debian drop /usr/share/doc when they
#      install a package, and the package need not be installed at all)
# Either way the file's sha256 is checked; anything else is an error saying what failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/data/heart}
dest=$dir/heart_scale
sha=5defa0a4c4c5bdaf3f55ae3828310252e8565c13ee37ce279e0b86d82e7f4ce9
doc=/usr/share/doc/liblinear-tools/examples/heart_scale

fail() { echo "fetch-heart: $*" >&2; exit 1; }
sum_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$dest" && "$(sum_of "$dest")" == "$sha" ]]; then
  echo "fetch-heart: $dest is there (sha256 ok)"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -f "$doc" ]]; then
  from=$doc
  cp "$doc" "$tmp/heart_scale"
else
  echo "fetch-heart: $doc is absent; extracting it from the liblinear-tools package" >&2
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    fail "$doc is absent and apt-get/dpkg-deb are not available to fetch liblinear-tools; copy heart_scale (sha256 $sha) to $dest by hand"
  # apt drops privileges to _apt for downloads; let it write the temporary directory.
  chmod 755 "$tmp" && mkdir -m 777 "$tmp/deb"
  (cd "$tmp/deb" && apt-get download liblinear-tools) >&2 ||
    fail "apt-get download liblinear-tools failed (no network, or no package lists: run apt-get update as root first)"
  debs=("$tmp"/deb/liblinear-tools_*.deb)
  [[ -f "${debs[0]}" ]] || fail "apt-get download left no liblinear-tools_*.deb"
  dpkg-deb -x "${debs[0]}" "$tmp/x" || fail "dpkg-deb -x ${debs[0]} failed"
  from="${debs[0]##*/}"
  if [[ -f "$tmp/x$doc" ]]; then
    cp "$tmp/x$doc" "$tmp/heart_scale"
  elif [[ -f "$tmp/x$doc.gz" ]]; then
    gzip -dc "$tmp/x$doc.gz" >"$tmp/heart_scale"
  else
    fail "${debs[0]##*/} holds no ${doc#/} (a different liblinear-tools version?)"
  fi
fi

got=$(sum_of "$tmp/heart_scale")
[[ "$got" == "$sha" ]] || fail "heart_scale from $from has sha256 $got, expected $sha"
mkdir -p "$dir"
# Into place atomically: a concurrent reader sees the old file or the whole new one.
cp "$tmp/heart_scale" "$dest.tmp.$$" && mv -f "$dest.tmp.$$" "$dest"
echo "fetch-heart: $dest from $from (sha256 ok)"
