#!/bin/sh
# Builds (release) and installs libummunotify-fabric.so and ummunotify-fabric.h.
#
#   crates/ummunotify-fabric/install.sh [--from DIR] PREFIX      (e.g. /usr/local)
#
# DESTDIR is honoured (staged installs). LIBDIR defaults to PREFIX/lib. --from DIR installs the
# library already built in DIR (a cargo profile directory) instead of building a release one.
# Afterwards: LD_PRELOAD=PREFIX/lib/libummunotify-fabric.so prog   (or cc app.c -lummunotify-fabric)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
from=
if [ "${1:-}" = "--from" ]; then from=$2; shift 2; fi
[ $# -eq 1 ] || { echo "usage: $0 [--from DIR] PREFIX" >&2; exit 2; }
prefix=$1
libdir=${LIBDIR:-$prefix/lib}
dest=${DESTDIR:-}

if [ -z "$from" ]; then
    (cd "$root" && cargo build --release -p ummunotify-fabric)
    from=${CARGO_TARGET_DIR:-$root/target}/release
fi
install -d "$dest$libdir" "$dest$prefix/include"
# Cargo names it after the crate (underscore); it is known by this name.
install -m 0755 "$from/libummunotify_fabric.so" "$dest$libdir/libummunotify-fabric.so"
install -m 0644 "$here/include/ummunotify-fabric.h" "$dest$prefix/include/ummunotify-fabric.h"
echo "installed libummunotify-fabric into $dest$prefix (libdir $libdir)"
