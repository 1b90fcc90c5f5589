#!/usr/bin/env bash
# Copies binaries and the shared libraries they load (except the C library
# itself) into one folder, so they run on a machine without our Debian
# packages: run them there with LD_LIBRARY_PATH=OUT/lib.
#   usage: scripts/bundle-libs.sh OUT BINARY...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT BINARY..." >&2; exit 2; }
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
for bin in "$@"; do
  cp -f "$bin" "$out/bin/"
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
      *) cp -fL "$lib" "$out/lib/" ;;
    esac
  done
done
