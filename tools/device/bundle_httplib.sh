#!/usr/bin/env bash
# Bundles this Debian machine's cpp-httplib (libcpp-httplib-dev: a header and a compiled library)
# with the headers it includes (OpenSSL, zlib, Brotli) into .deps/httplib/, for the GPU machines,
# which have no cpp-httplib package and no internet. Nothing here is committed (.deps is ignored);
# the run carries the folder and points PKG_CONFIG_PATH at it:
#   PKG_CONFIG_PATH=$PWD/.deps/httplib/lib/pkgconfig cmake --preset default
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/.deps/httplib
rm -rf "$out"
mkdir -p "$out/include" "$out/lib/pkgconfig"
cp /usr/include/httplib.h /usr/include/zlib.h /usr/include/zconf.h "$out/include/"
cp -r /usr/include/openssl /usr/include/brotli "$out/include/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$out/include/openssl/"
for lib in libcpp-httplib.so.0.11 libbrotlicommon.so.1 libbrotlidec.so.1 libbrotlienc.so.1; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$out/lib/"
done
ln -s libcpp-httplib.so.0.11 "$out/lib/libcpp-httplib.so"
cat >"$out/lib/pkgconfig/cpp-httplib.pc" <<PC
prefix=\${pcfiledir}/../..
Name: cpp-httplib
Description: cpp-httplib bundled from Debian 12 for a machine without the package
Version: 0.11.4
Libs: -L\${prefix}/lib -lcpp-httplib -Wl,-rpath,\${prefix}/lib
Cflags: -I\${prefix}/include -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT
PC
du -sh "$out"
