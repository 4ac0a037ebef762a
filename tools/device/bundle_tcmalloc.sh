#!/usr/bin/env bash
# Copies this Debian machine's tcmalloc_minimal (libtcmalloc-minimal4) into .deps/tcmalloc/lib/ for
# the GPU machines, which have no such package and no internet. Nothing here is committed (.deps is
# ignored); a run that carries .deps/tcmalloc links the specula binary against it (CMakeLists.txt
# looks there first; the build tree's RPATH finds it at run time).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.deps/tcmalloc/lib
rm -rf "$out"
mkdir -p "$out"
cp -L /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "$out/"
du -sh "$out"
