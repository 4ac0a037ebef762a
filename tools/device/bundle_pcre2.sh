#!/usr/bin/env bash
# Bundles this Debian machine's PCRE2 (libpcre2-dev: the header and the static library) into
# .deps/pcre2/, for the GPU machines, which lack the package and have no internet: the Llama-3
# and other byte-level BPE tokenizers need it for their pre-tokenizer regex. Nothing here is
# committed (.deps is ignored); the run carries the folder and points PKG_CONFIG_PATH at it:
#   PKG_CONFIG_PATH=$PWD/.deps/pcre2/lib/pkgconfig cmake ...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.deps/pcre2
rm -rf "$out"
mkdir -p "$out/include" "$out/lib/pkgconfig"
cp /usr/include/pcre2.h "$out/include/"
cp /usr/lib/x86_64-linux-gnu/libpcre2-8.a "$out/lib/"
cat >"$out/lib/pkgconfig/libpcre2-8.pc" <<PC
prefix=\${pcfiledir}/../..
Name: libpcre2-8
Description: PCRE2 bundled (static) from Debian 12 for a machine without the package
Version: $(pkg-config --modversion libpcre2-8)
Libs: -L\${prefix}/lib -lpcre2-8
Cflags: -I\${prefix}/include
PC
du -sh "$out"
