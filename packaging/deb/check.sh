#!/usr/bin/env bash
# Checks the Debian packages (packaging/deb/build.sh) as a site would use them: their file lists
# (dpkg-deb -c), the SONAME links, then installs libummunotify0, libummunotify-dev and
# ummunotify-tools with dpkg into a temporary root (dpkg --root, its own status file: the
# postinst's systemd-sysusers creates the user ummunotify there), compiles a C program against
# them through the pkg-config file, runs it on the installed library, loads the 2010 preload and
# the libfabric monitor, runs umn; then builds ummunotify-dkms's module with dkms (its own source
# and DKMS trees under a temporary directory) against the kernel tree KERNEL_DIR (the guest's,
# from kernel/build-kernel.sh). Exits 1 on the first missing or wrong piece.
#
#   bash packaging/deb/check.sh DEBDIR KERNEL_DIR      # DEBDIR: the .deb files (target/deb)
set -euo pipefail
dir=$(realpath "$1")
kdir=$(realpath "$2")
fail() { echo "packaging/deb/check.sh: FAIL: $*" >&2; exit 1; }
say() { echo "packaging/deb/check.sh: $*" >&2; }
arch=$(dpkg --print-architecture)
deb() { # deb PACKAGE: its file in DEBDIR
    local f
    f=$(ls "$dir/$1"_*_"$arch".deb "$dir/$1"_*_all.deb 2>/dev/null | head -n 1)
    [ -n "$f" ] || fail "no $1 package in $dir"
    echo "$f"
}
lib0=$(deb libummunotify0) dev=$(deb libummunotify-dev) tools=$(deb ummunotify-tools)
dkms=$(deb ummunotify-dkms)
version=$(dpkg-deb -f "$lib0" Version)
upstream=${version%%-*}
major=${upstream%%.*}
lib=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for d in "$dev" "$tools" "$dkms"; do
    [ "$(dpkg-deb -f "$d" Version)" = "$version" ] || fail "$d: not version $version"
done

# 1. The file list: every file and link the package promises.
has() { # has DEB ENTRY...: dpkg-deb -c lists each, owned by root
    local d=$1 list want
    shift
    list=$(dpkg-deb -c "$d")
    for want in "$@"; do
        grep -qF -- " $want" <<<"$list" || fail "$(basename "$d") lacks $want"
    done
    ! grep -v "root/root" <<<"$list" | grep -q . || fail "$(basename "$d"): files not owned by root"
}
has "$lib0" ".$lib/libummunotify.so.$upstream" ".$lib/libummunotify.so.$major -> libummunotify.so.$upstream"
has "$dev" ".$lib/libummunotify.so -> libummunotify.so.$major" ".$lib/libummunotify.a" \
    ".$lib/pkgconfig/ummunotify.pc" "./usr/include/ummunotify.h" "./usr/include/ummunotify-fabric.h"
has "$tools" "./usr/bin/umn" ".$lib/libummunotify-compat.so" ".$lib/libummunotify-fabric.so" \
    "./lib/systemd/system/umn-daemon.service" "./usr/lib/sysusers.d/ummunotify-tools.conf"
has "$dkms" "./usr/src/ummunotify-$upstream/dkms.conf" "./usr/src/ummunotify-$upstream/Kbuild" \
    "./usr/src/ummunotify-$upstream/ummunotify.c" "./usr/src/ummunotify-$upstream/ummunotify.h"
dpkg-deb -f "$lib0" Depends | grep -q libc6 || fail "no libc6 in libummunotify0's Depends"
dpkg-deb -f "$dev" Depends | grep -qF "libummunotify0 (= $version)" || fail "-dev's Depends"
say "contents ok (version $version)"

# 2. Installed with dpkg into a temporary root.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc"
touch "$root/var/lib/dpkg/status"
# --force-depends: the temporary root has no libc6 of its own (the host's runs the program);
# --force-script-chrootless: no maintainer scripts need the root's shell.
dpkg --root="$root" --force-depends --force-script-chrootless --no-triggers -i "$lib0" "$dev" \
    "$tools" >&2 || fail "dpkg --root -i"
for p in libummunotify0 libummunotify-dev ummunotify-tools; do
    dpkg --root="$root" -s "$p" | grep -q "^Status: install ok" || fail "dpkg --root -s $p"
done
# The postinst made the daemon's user (systemd-sysusers --root); the unit runs as it.
grep -q "^ummunotify:" "$root/etc/passwd" || fail "postinst made no user ummunotify"
grep -qx "User=ummunotify" "$root/lib/systemd/system/umn-daemon.service" || fail "unit's User="
so=$(readelf -d "$root$lib/libummunotify.so.$upstream" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$so" = "libummunotify.so.$major" ] || fail "SONAME '$so', want libummunotify.so.$major"

# 3. A C program built with the package's pkg-config file and run on the installed library.
cat >"$root/prog.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <ummunotify.h>
int main(void)
{
	struct ummunotify_notifier *n;
	if (ummunotify_notifier_new(&n) != 0) {
		char buf[256];
		ummunotify_last_error(buf, sizeof buf);
		printf("notifier: %s\n", buf);
		return 1;
	}
	printf("ummunotify %s backend %s\n", ummunotify_version(), ummunotify_notifier_backend(n));
	ummunotify_notifier_free(n);
	return 0;
}
C
export PKG_CONFIG_PATH="$root$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
[ "$(pkg-config --modversion ummunotify)" = "$upstream" ] || fail "pkg-config --modversion"
# shellcheck disable=SC2046
gcc -Wall -Werror "$root/prog.c" -o "$root/prog" $(pkg-config --cflags --libs ummunotify) ||
    fail "cc against the package"
readelf -d "$root/prog" | grep -q "NEEDED.*\[libummunotify.so.$major\]" ||
    fail "prog does not need libummunotify.so.$major"
LD_LIBRARY_PATH="$root$lib" "$root/prog" >&2 || fail "prog on the installed library"
# The 2010 preload and the libfabric monitor load into a program; umn runs.
LD_PRELOAD="$root$lib/libummunotify-compat.so" /bin/true || fail "preload libummunotify-compat.so"
said=$(LD_PRELOAD="$root$lib/libummunotify-fabric.so" UMMUNOTIFY_FABRIC_VERBOSE=1 /bin/true 2>&1)
say "$said"
grep -q "ummunotify-fabric (LD_PRELOAD): ummunotify is libfabric" <<<"$said" ||
    fail "preload libummunotify-fabric.so"
LD_LIBRARY_PATH="$root$lib" "$root/usr/bin/umn" --help >/dev/null || fail "umn --help"
dpkg --root="$root" --force-script-chrootless -r ummunotify-tools libummunotify-dev \
    libummunotify0 >&2 || fail "dpkg --root -r"
[ ! -e "$root$lib/libummunotify.so.$major" ] || fail "dpkg -r left libummunotify.so.$major"
say "ok: installed with dpkg --root, built with pkg-config, ran, removed"

# 4. The DKMS package: dkms add and build against the kernel tree, in trees of its own.
krel=$(cat "$kdir/include/config/kernel.release") || fail "$kdir: no kernel.release"
t=$root/dkms
mkdir -p "$t/root" "$t/tree"
dpkg-deb -x "$dkms" "$t/root"
dkms add --sourcetree "$t/root/usr/src" --dkmstree "$t/tree" -m ummunotify -v "$upstream" >&2 ||
    fail "dkms add"
dkms build --sourcetree "$t/root/usr/src" --dkmstree "$t/tree" -m ummunotify -v "$upstream" \
    -k "$krel" --kernelsourcedir "$kdir" >&2 || {
    cat "$t/tree/ummunotify/$upstream/build/make.log" >&2 || true
    fail "dkms build against $kdir"
}
ko=$t/tree/ummunotify/$upstream/$krel/$(uname -m)/module/ummunotify.ko
[ -f "$ko" ] || ko=$ko.xz
[ -f "$ko" ] || fail "dkms build made no ummunotify.ko"
[ "$(modinfo -F vermagic "$ko" | cut -d' ' -f1)" = "$krel" ] || fail "$ko: vermagic not $krel"
say "ok: dkms built ummunotify.ko for $krel ($kdir)"
