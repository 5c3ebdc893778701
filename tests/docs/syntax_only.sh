#!/bin/sh
# The compiler launcher of the documentation's compile-only snippets (tests/docs/CMakeLists.txt):
# their compile command carries -fsyntax-only, so the compiler checks the code (templates
# instantiated, the front end's warnings, errors as errors) and writes no object; this runs the
# command and then creates its -o file, empty, so that the build tool sees the step done and an
# incremental build does not repeat it. Its dependency file (-MD -MF) is the compiler's own.
"$@" || exit $?
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
[ -n "$out" ] && : >"$out"
exit 0
