#!/usr/bin/env bash
# Builds the RPMs from packaging/rpm/ummunotify.spec with rpmbuild -bb --build-in-place (cargo
# into the tree's target/: a built tree is not rebuilt), checks the spec and the RPMs with
# rpmlint (packaging/rpm/ummunotify.rpmlintrc explains each filter), lists them, installs them
# into a scratch root (rpm --root -i --nodeps --noscripts: that root has no glibc or systemd of
# its own) and checks the files there: the SONAME link, the .pc, the unit's user, the DKMS
# sources with their version; runs the installed umn and a C program on the installed library.
#
#   bash packaging/rpm/build.sh [OUTDIR]      # default target/rpm; as root (rpm --root)
#
# On Debian: apt-get install rpm rpmlint. --nodeps: the build tools (rustup's cargo, gcc) are
# not in an RPM database here.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$repo/target/rpm}" && cd "${1:-$repo/target/rpm}" && pwd)
spec=$repo/packaging/rpm/ummunotify.spec
fail() { echo "packaging/rpm/build.sh: FAIL: $*" >&2; exit 1; }
say() { echo "packaging/rpm/build.sh: $*" >&2; }
version=$(rpmspec -q --srpm --qf '%{version}' "$spec")
cargo_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n 1)
[ "$version" = "$cargo_version" ] || fail "spec Version $version, Cargo.toml $cargo_version"
rm -rf "$out/top"
cd "$repo"
rpmbuild -bb --build-in-place --nodeps --define "_topdir $out/top" \
    --define "cargo_target_dir ${CARGO_TARGET_DIR:-$repo/target}" "$spec" >"$out/rpmbuild.log" 2>&1 ||
    { tail -n 40 "$out/rpmbuild.log" >&2; fail "rpmbuild ($out/rpmbuild.log)"; }
mapfile -t rpms < <(find "$out/top/RPMS" -name '*.rpm' | sort)
[ "${#rpms[@]}" = 4 ] || fail "rpmbuild made ${#rpms[@]} RPMs, want 4"
lint=$(rpmlint -r packaging/rpm/ummunotify.rpmlintrc "$spec" "${rpms[@]}" 2>&1) ||
    { echo "$lint" >&2; fail "rpmlint"; }
grep -q " 0 errors, 0 warnings" <<<"$lint" || { echo "$lint" >&2; fail "rpmlint reports"; }
say "rpmlint: $(grep -o '[0-9]* packages and .* warnings' <<<"$lint")"
for r in "${rpms[@]}"; do say "$(basename "$r"): $(rpm -qlp "$r" | paste -sd' ')"; done

# The scratch root.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
rpm --root "$root" --initdb
rpm --root "$root" -i --nodeps --noscripts "${rpms[@]}" || fail "rpm --root -i"
[ "$(rpm --root "$root" -qa | wc -l)" = 4 ] || fail "rpm --root -qa: $(rpm --root "$root" -qa)"
lib=$root$(rpm --eval '%{_libdir}')
for f in "$lib/libummunotify.so.$version" "$lib/libummunotify.a" "$lib/pkgconfig/ummunotify.pc" \
    "$lib/libummunotify-compat.so" "$lib/libummunotify-fabric.so" "$root/usr/bin/umn" \
    "$root/usr/include/ummunotify.h" "$root/usr/include/ummunotify-fabric.h" \
    "$root/usr/lib/systemd/system/umn-daemon.service" "$root/usr/lib/sysusers.d/ummunotify.conf" \
    "$root/usr/src/ummunotify-$version/ummunotify.c" "$root/usr/src/ummunotify-$version/Kbuild"; do
    [ -f "$f" ] || fail "not installed: ${f#"$root"}"
done
[ "$(readlink "$lib/libummunotify.so.${version%%.*}")" = "libummunotify.so.$version" ] ||
    fail "SONAME link"
[ "$(readlink "$lib/libummunotify.so")" = "libummunotify.so.${version%%.*}" ] || fail ".so link"
grep -q "^PACKAGE_VERSION=\"$version\"" "$root/usr/src/ummunotify-$version/dkms.conf" ||
    fail "dkms.conf's PACKAGE_VERSION"
grep -qx "User=ummunotify" "$root/usr/lib/systemd/system/umn-daemon.service" || fail "unit's User="
grep -q "^u ummunotify " "$root/usr/lib/sysusers.d/ummunotify.conf" || fail "sysusers.d user"
grep -q "^libdir=$(rpm --eval '%{_libdir}')" "$lib/pkgconfig/ummunotify.pc" || fail ".pc libdir"
LD_LIBRARY_PATH=$lib "$root/usr/bin/umn" --help >/dev/null || fail "installed umn --help"
printf '#include <ummunotify.h>\n#include <stdio.h>\nint main(void) { puts(ummunotify_version()); return 0; }\n' \
    >"$root/v.c"
gcc -I"$root/usr/include" "$root/v.c" -L"$lib" -lummunotify -o "$root/v" || fail "cc against the RPM"
[ "$(LD_LIBRARY_PATH=$lib "$root/v")" = "$version" ] || fail "program on the installed library"
say "ok: 4 RPMs built, rpmlint clean, installed into a scratch root, files and program checked"
