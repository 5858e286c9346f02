#!/bin/sh
# Builds (release) and installs libummunotify.so.X.Y.Z (SONAME libummunotify.so.X, with the
# libummunotify.so.X and libummunotify.so links), libummunotify.a, ummunotify.h, ummunotify.pc
# and the 2010 ABI preload library libummunotify-compat.so.
#
#   crates/ummunotify-capi/install.sh [--from DIR] PREFIX      (e.g. /usr/local)
#
# DESTDIR is honoured (staged installs). LIBDIR defaults to PREFIX/lib. --from DIR installs the
# libraries already built in DIR (a cargo profile directory) instead of building release ones.
# Afterwards: cc prog.c $(pkg-config --cflags --libs ummunotify)
#
# Not cargo-c (cargo cinstall): it would replace the dozen install lines of this crate, not the
# compat preload's (another crate), and it is one more build tool:
# Debian 12's cargo-c 0.9.14 can not read this workspace (Cargo.lock version 4, [lints]), so it
# would be `cargo install cargo-c`, a build of cargo itself, on every CI machine and package build.
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
    (cd "$root" && cargo build --release -p ummunotify-capi -p ummunotify-compat)
    from=${CARGO_TARGET_DIR:-$root/target}/release
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)

major=${version%%.*}

install -d "$dest$libdir/pkgconfig" "$dest$prefix/include"
# The real file carries the full version; the SONAME link (what programs load) and the
# development link (what -lummunotify finds) point to it.
install -m 0755 "$from/libummunotify.so" "$dest$libdir/libummunotify.so.$version"
ln -sf "libummunotify.so.$version" "$dest$libdir/libummunotify.so.$major"
ln -sf "libummunotify.so.$major" "$dest$libdir/libummunotify.so"
install -m 0644 "$from/libummunotify.a" "$dest$libdir/libummunotify.a"
if [ -f "$from/libummunotify_compat.so" ]; then
    # Cargo names it after the crate (underscore); the 2010 ABI shim is known by this name.
    install -m 0755 "$from/libummunotify_compat.so" "$dest$libdir/libummunotify-compat.so"
fi
install -m 0644 "$root/include/ummunotify.h" "$dest$prefix/include/ummunotify.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" -e "s|@VERSION@|$version|" \
    "$here/ummunotify.pc.in" > "$dest$libdir/pkgconfig/ummunotify.pc"
chmod 0644 "$dest$libdir/pkgconfig/ummunotify.pc"
echo "installed libummunotify $version into $dest$prefix (libdir $libdir)"
