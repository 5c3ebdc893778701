#!/bin/bash
# libzmq built with ThreadSanitizer, for the tsan preset (docs/testing.md#threadsanitizer).
#   tools/tsan-libzmq.sh        # once; then: cmake --preset tsan && cmake --build --preset tsan && ctest --preset tsan
# Debian's libzmq is not instrumented: messages it passes between threads (its lock-free
# pipes) synchronise nothing TSan can see, so every buffer one rank-thread writes and another
# reads after a ZeroMQ hand-over looks like a race. Built with -fsanitize=thread, its atomics
# are TSan's, and the hand-overs are seen for what they are. This fetches Debian's own source
# of the installed version (zeromq3, through a deb-src list of its own: the system's apt lists
# are not touched), builds it with clang-14 and installs it under build/tsan-libzmq/install,
# where the tsan preset's CMAKE_PREFIX_PATH finds it first. Does nothing when it is there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/tsan-libzmq
prefix=$out/install
if [[ -f $prefix/lib/libzmq.so && -f $out/stamp ]]; then exit 0; fi
mkdir -p "$out/lists/partial" "$out/archives/partial"
cd "$out"
if ! ls zeromq3_*.orig.tar.gz >/dev/null 2>&1; then
  # the deb-src twin of the system's first Debian source (its URIs, suites and key)
  awk 'BEGIN{RS=""} NR==1' /etc/apt/sources.list.d/debian.sources 2>/dev/null |
    sed 's/^Types: .*/Types: deb-src/' >"$out/src.sources"
  [[ -s $out/src.sources ]] || { echo "tsan-libzmq.sh: no Debian source in /etc/apt/sources.list.d/debian.sources" >&2; exit 1; }
  apt=(-o Dir::Etc::SourceList="$out/src.sources" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$out/lists" -o Dir::Cache::Archives="$out/archives")
  apt-get "${apt[@]}" update >/dev/null
  apt-get "${apt[@]}" source --download-only zeromq3
fi
rm -rf src && mkdir src && tar -xzf zeromq3_*.orig.tar.gz -C src --strip-components=1
san="-fsanitize=thread -g -O1 -w"  # (-w: libzmq's own warnings are not ours to read)
cmake -S src -B build -Wno-dev -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DBUILD_TESTS=OFF -DBUILD_STATIC=OFF -DWITH_DOCS=OFF -DWITH_PERF_TOOL=OFF -DENABLE_DRAFTS=OFF \
  -DWITH_LIBSODIUM=ON -DENABLE_CURVE=ON -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
cmake --install build >/dev/null
touch stamp
echo "tsan-libzmq.sh: $(ls "$prefix"/lib/libzmq.so.*.*) (ThreadSanitizer)"
