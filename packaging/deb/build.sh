#!/usr/bin/env bash
# Builds the Debian package ummunotify_<version>_amd64.deb from a staged install (dpkg-deb): the
# C library (libummunotify.so.<version>, its SONAME link .so.0 and the development link .so, the
# static library, ummunotify.h, ummunotify.pc), the 2010 ABI preload libummunotify-compat.so,
# the libfabric monitor libummunotify-fabric.so with ummunotify-fabric.h, and the `umn` CLI,
# at Debian's multiarch paths (/usr/lib/x86_64-linux-gnu, /usr/include, /usr/bin).
#
#   bash packaging/deb/build.sh [--from DIR] [OUTDIR]    # default OUTDIR target/deb
#
# --from DIR takes the release libraries and umn already built in DIR (a cargo profile
# directory); otherwise they are built here. dpkg-shlibdeps computes Depends from the ELF files.
# Prints the path of the .deb on its last line. packaging/deb/check.sh checks what it holds.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
from=
if [ "${1:-}" = "--from" ]; then from=$2; shift 2; fi
out=${1:-$repo/target/deb}
if [ -z "$from" ]; then
    (cd "$repo" && cargo build -q --release -p ummunotify-capi -p ummunotify-compat \
        -p ummunotify-fabric -p umn)
    from=${CARGO_TARGET_DIR:-$repo/target}/release
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n 1)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
libdir=/usr/lib/$multiarch
stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$out"

# The project's own install scripts, staged (DESTDIR) at the distribution's paths.
DESTDIR=$stage LIBDIR=$libdir sh "$repo/crates/ummunotify-capi/install.sh" --from "$from" /usr >&2
DESTDIR=$stage LIBDIR=$libdir sh "$repo/crates/ummunotify-fabric/install.sh" --from "$from" /usr >&2
install -D -m 0755 "$from/umn" "$stage/usr/bin/umn"
strip --strip-unneeded "$stage$libdir"/libummunotify.so."$version" \
    "$stage$libdir"/libummunotify-compat.so "$stage$libdir"/libummunotify-fabric.so \
    "$stage/usr/bin/umn"
install -D -m 0644 "$repo/LICENSE-MIT" "$stage/usr/share/doc/ummunotify/LICENSE-MIT"
install -D -m 0644 "$repo/LICENSE-APACHE" "$stage/usr/share/doc/ummunotify/LICENSE-APACHE"

# Depends from the ELF files' NEEDED entries (dpkg-shlibdeps wants a debian/control to exist).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debian"
printf 'Source: ummunotify\n\nPackage: ummunotify\nArchitecture: any\n' >"$tmp/debian/control"
depends=$(cd "$tmp" && dpkg-shlibdeps -O --ignore-missing-info \
    "$stage$libdir"/libummunotify.so."$version" "$stage$libdir"/libummunotify-compat.so \
    "$stage$libdir"/libummunotify-fabric.so "$stage/usr/bin/umn" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "build.sh: dpkg-shlibdeps gave no Depends" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: ummunotify
Version: $version
Architecture: $arch
Maintainer: ummunotify developers <ummunotify@example.invalid>
Installed-Size: $size
Depends: $depends
Recommends: libfabric1 (>= 1.13)
Section: libs
Priority: optional
Multi-Arch: same
Description: learn, before an unmapping call returns, that registered memory changed
 ummunotify tells a process when the memory mappings behind ranges it registered change
 (munmap, mremap, madvise, MAP_FIXED over, and more), so that registration caches of RDMA
 stacks never hand a NIC a stale registration.
 .
 This package holds the C library (libummunotify.so.0, header, pkg-config file), the 2010
 ummunotify ABI preload (libummunotify-compat.so), libfabric's memory monitor
 (libummunotify-fabric.so: LD_PRELOAD it, or call ummunotify_fabric_import()) and umn.
CONTROL
# The SONAME for dpkg-shlibdeps of programs built against it; ldconfig after install.
echo "libummunotify ${version%%.*} ummunotify (>= $version)" >"$stage/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$stage/DEBIAN/triggers"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/shlibs" "$stage/DEBIAN/triggers"
deb="$out/ummunotify_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >&2
echo "$deb"
