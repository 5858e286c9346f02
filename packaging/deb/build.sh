#!/usr/bin/env bash
# Builds the Debian packages from the source package at the repository's root (debian/) with
# dpkg-buildpackage -b, and checks them with lintian (every tag, pedantic included, fails unless
# debian/*.lintian-overrides explains it):
#   libummunotify0     libummunotify.so.0 (symbols file debian/libummunotify0.symbols)
#   libummunotify-dev  ummunotify.h, ummunotify-fabric.h, libummunotify.a, the .so link, .pc
#   ummunotify-tools   umn, libummunotify-compat.so, libummunotify-fabric.so, umn-daemon.service
#                      and its sysusers.d file (user ummunotify)
#   ummunotify-dkms    kernel/module with kernel/module/dkms.conf, in /usr/src/ummunotify-VERSION
#
#   bash packaging/deb/build.sh [OUTDIR]      # default OUTDIR target/deb
#
# Cargo builds into CARGO_TARGET_DIR (default the tree's target/: an already built tree is not
# rebuilt). dpkg-buildpackage writes next to the tree; the files the .changes lists are moved to
# OUTDIR. Prints the path of each .deb, one per line. packaging/deb/check.sh checks them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$repo/target/deb}" && cd "${1:-$repo/target/deb}" && pwd)
version=$(dpkg-parsechangelog -l "$repo/debian/changelog" -S Version)
arch=$(dpkg --print-architecture)
changes=ummunotify_${version}_${arch}.changes
cd "$repo"
dpkg-buildpackage -b -us -uc >"$out/dpkg-buildpackage.log" 2>&1 || {
    tail -n 40 "$out/dpkg-buildpackage.log" >&2
    echo "packaging/deb/build.sh: dpkg-buildpackage failed ($out/dpkg-buildpackage.log)" >&2
    exit 1
}
# The .changes names what the build made (its Files: section); move exactly those.
files=$(sed -n '/^Files:/,/^[A-Z]/s/^ [0-9a-f]\{32\} [0-9]* [^ ]* [^ ]* //p' "../$changes")
for f in $files "$changes"; do mv -f "../$f" "$out/"; done
lintian --pedantic -I --fail-on error,warning,info,pedantic "$out/$changes" >&2 ||
    { echo "packaging/deb/build.sh: lintian reports tags (above)" >&2; exit 1; }
echo "packaging/deb/build.sh: lintian clean (overrides: debian/*.lintian-overrides)" >&2
for f in $files; do case $f in *.deb) echo "$out/$f" ;; esac; done
