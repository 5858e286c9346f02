# Shell helpers the guest scripts share (kernel/ci.sh, kernel/rxe/run.sh, kernel/mpi/run.sh):
# sourced, never run. The caller defines say().

# apt_need PKG...: installs the Debian packages of the list that are not installed yet.
# .ci/run may have updated the package lists already: update only if the install fails.
apt_need() {
    local need=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
    done
    [ ${#need[@]} -gt 0 ] || return 0
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
        { apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; }
}

# The packages every guest script needs: the kernel build and QEMU (qemu-system must come from
# Debian's packages), busybox for the initramfs.
GUEST_PACKAGES=(linux-source-6.1 qemu-system-x86 bc flex bison libelf-dev libssl-dev cpio xz-utils
    busybox-static gcc make python3)

# test_binaries OUT NAME... -- CARGO_TEST_ARGS...: builds Rust test binaries (release) with one
# `cargo test --no-run` and copies each one named to OUT/NAME (paths from cargo's JSON; the
# list is kept in OUT/test-binaries.txt). Fails naming a binary cargo did not build.
test_binaries() {
    local out=$1 names=() t bin
    shift
    while [ "$1" != -- ]; do
        names+=("$1")
        shift
    done
    shift
    cargo test -q --release "$@" --no-run --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") in sys.argv[1:]:
        print(m["target"]["name"], m["executable"])' "${names[@]}" >"$out/test-binaries.txt"
    for t in "${names[@]}"; do
        bin=$(sed -n "s/^$t //p" "$out/test-binaries.txt")
        [ -x "$bin" ] || { say "no $t test binary"; return 1; }
        cp "$bin" "$out/$t"
    done
}
