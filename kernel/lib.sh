# Shell helpers the guest scripts share (kernel/ci.sh, kernel/rxe/run.sh, kernel/mpi/run.sh,
# kernel/peers/run.sh): sourced, never run. The caller defines say().

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

# guest_lacks REPO: the change kinds Linux 6.1 can not make, comma-separated (one list, in
# kernel/compare.py's GUEST_LACKS).
guest_lacks() {
    python3 -B -c 'import importlib.util as u, sys
s = u.spec_from_file_location("compare", sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)
print(",".join(sorted(m.GUEST_LACKS)))' "$1/kernel/compare.py"
}

# known_refusals REPO: the claimed kinds a backend refuses on 6.1 with a typed error
# (kernel/rxe/known-refusals.txt) as backend:kind,... (awk, not grep -v: with every refusal fixed
# the list is empty, and grep's exit 1 would end the caller under pipefail without a word).
known_refusals() {
    awk '!/^#/ && NF {print $1 ":" $2}' "$1/kernel/rxe/known-refusals.txt" | paste -sd, -
}

# rxe_boot KERNEL INITRD MEM_MIB LOG TIMEOUT_S APPEND: boots the soft-RoCE guest (two sockets of
# one CPU each: plain -smp 2 gives this kernel one CPU; the virtio NIC rxe0 runs on), its serial
# log in LOG and LOG.txt (without CRs). Fails, with the log's tail, if it outlives TIMEOUT_S.
rxe_boot() {
    local kernel=$1 initrd=$2 mem=$3 log=$4 timeout_s=$5 append=$6 boot0 rc
    say "booting (timeout ${timeout_s}s, log $log)"
    boot0=$(date +%s)
    set +e
    timeout -k 10 "$timeout_s" qemu-system-x86_64 -accel tcg -smp 2,sockets=2,cores=1,threads=1 \
        -m "$mem" -nographic -no-reboot -kernel "$kernel" -initrd "$initrd" \
        -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
        -append "console=ttyS0 rdinit=/init panic=-1 quiet $append" </dev/null >"$log" 2>&1
    rc=$?
    set -e
    tr -d '\r' <"$log" >"$log.txt"
    say "guest wall time $(( $(date +%s) - boot0 )) s (qemu exit $rc)"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        say "FAIL: the guest did not finish within ${timeout_s}s"
        tail -n 60 "$log.txt" >&2
        return 1
    fi
}
