#!/usr/bin/env bash
# Checks the Debian package as a site would use it: its file list (dpkg-deb -c), its SONAME
# links, then installs it with dpkg into a temporary root (dpkg --root, its own status file),
# compiles a C program against it through the package's pkg-config file, runs it on the
# installed library, loads the 2010 preload and the libfabric monitor, and runs umn. Exits 1 on
# the first missing or wrong piece.
#
#   bash packaging/deb/check.sh target/deb/ummunotify_<version>_amd64.deb
set -euo pipefail
deb=$(realpath "$1")
fail() { echo "packaging/deb/check.sh: FAIL: $*" >&2; exit 1; }
say() { echo "packaging/deb/check.sh: $*" >&2; }
version=$(dpkg-deb -f "$deb" Version)
arch=$(dpkg-deb -f "$deb" Architecture)
major=${version%%.*}
lib=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
[ "$(basename "$deb")" = "ummunotify_${version}_${arch}.deb" ] || fail "file name $(basename "$deb")"

# 1. The file list: every file and link the package promises.
list=$(dpkg-deb -c "$deb")
for want in ".$lib/libummunotify.so.$version" ".$lib/libummunotify.so.$major -> libummunotify.so.$version" \
    ".$lib/libummunotify.so -> libummunotify.so.$major" ".$lib/libummunotify.a" \
    ".$lib/pkgconfig/ummunotify.pc" "./usr/include/ummunotify.h" \
    ".$lib/libummunotify-compat.so" ".$lib/libummunotify-fabric.so" \
    "./usr/include/ummunotify-fabric.h" "./usr/bin/umn"; do
    grep -qF -- " $want" <<<"$list" || fail "dpkg-deb -c lacks $want"
done
grep -q "root/root" <<<"$list" || fail "files not owned by root"
dpkg-deb -f "$deb" Depends | grep -q libc6 || fail "no libc6 in Depends"
say "contents ok ($(wc -l <<<"$list") entries, version $version)"

# 2. Installed with dpkg into a temporary root.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
# --force-depends: the temporary root has no libc6 of its own (the host's runs the program);
# --force-script-chrootless: no maintainer scripts need the root's shell.
dpkg --root="$root" --force-depends --force-script-chrootless --no-triggers -i "$deb" >&2 ||
    fail "dpkg --root -i"
dpkg --root="$root" -s ummunotify | grep -q "^Status: install ok" ||
    dpkg --root="$root" -s ummunotify | grep -q "^Status: install ok unpacked" ||
    fail "dpkg --root -s: not installed"
so=$(readelf -d "$root$lib/libummunotify.so.$version" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
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
[ "$(pkg-config --modversion ummunotify)" = "$version" ] || fail "pkg-config --modversion"
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
dpkg --root="$root" -r ummunotify >&2 || fail "dpkg --root -r"
[ ! -e "$root$lib/libummunotify.so.$major" ] || fail "dpkg -r left libummunotify.so.$major"
say "ok: installed with dpkg --root, built with pkg-config, ran, removed"
