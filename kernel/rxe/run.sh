#!/usr/bin/env bash
# The soft-RoCE guest (issue 21): the x == y hazard carried to the wire by a real RDMA stack.
# Builds the guest programs, packs an initramfs with rdma-core, libfabric and UCX, boots the
# project's guest kernel (kernel/build-kernel.sh: the same kernel as kernel/ci.sh, cached) under
# QEMU TCG with a virtio NIC, and judges the serial log with verdict.py: fails on any stale byte
# ummunotify let through for a kind its backend claims, on any missing result, and on a guest
# with fewer than 2 CPUs.
#
#   bash kernel/rxe/run.sh            # as root; .ci/run runs it as a step
#
# Knobs: UMN_RXE_PHASES (default all: rust,c,fabric,ucx,cost), UMN_RXE_BACKENDS (default
# uffd,hooks,hybrid,kernel), UMN_RXE_TIMEOUT (default 1500 s), UMN_RXE_COST_BATCH (calls per
# round of the cost measurement, default 100), UMN_RXE_COST_MAPPINGS (the verbs cost measurement
# once per count, the process grown to that many mappings first; default 100,1000,10000),
# UMN_RXE_COST_BEFORE (a libummunotify.so built before a change: the verbs cost measurement runs
# on it too, in the same guest, for a before/after table).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out="$repo/target/rxe-guest"
mkdir -p "$out"
say() { printf 'kernel/rxe/run.sh: %s\n' "$*" >&2; }
t0=$(date +%s)
lap() { say "$1 after $(( $(date +%s) - t0 )) s"; }
# A step that fails says which, instead of ending the script without a word.
trap 'say "FAIL at line $LINENO: $BASH_COMMAND (exit $?)"' ERR

# 1. Packages: the kernel build and QEMU (as kernel/ci.sh), and the RDMA userland the guest runs.
. "$repo/kernel/lib.sh"
apt_need "${GUEST_PACKAGES[@]}" iproute2 libibverbs-dev ibverbs-providers libfabric-dev libucx-dev

# 2. The kernel (cached; the one kernel/ci.sh boots) and the module built against it.
kdir=$(bash "$repo/kernel/build-kernel.sh" | tail -n 1)
rm -rf "$out/module"
cp -r "$repo/kernel/module" "$out/module"
make -s -C "$kdir" M="$out/module" modules >&2
lap "kernel and module"

# 3. The Rust test binaries and the libraries (release), the C programs.
cargo build -q --release -p ummunotify-capi -p ummunotify-fabric
rel="$repo/target/release"
test_binaries "$out" verbs_rxe mr_reg -- -p ummunotify --test verbs_rxe -p ummunotify-fabric \
    --test mr_reg
cflags=(-std=gnu11 -Wall -Wextra -Werror -O2 -g -pthread -I kernel/rxe -I include
    -I crates/ummunotify-fabric/include)
libs=(-L "$rel" -Wl,-rpath,/lib)
gcc "${cflags[@]}" kernel/rxe/rxe_peer.c -o "$out/rxe_peer" -libverbs
gcc "${cflags[@]}" kernel/rxe/verbs_hazard.c -o "$out/verbs_hazard" "${libs[@]}" -lummunotify \
    -libverbs
gcc "${cflags[@]}" kernel/rxe/fabric_hazard.c -o "$out/fabric_hazard" "${libs[@]}" -lummunotify \
    -l:libummunotify_fabric.so -lfabric -libverbs
gcc "${cflags[@]}" kernel/rxe/miss_parts.c -o "$out/miss_parts" "${libs[@]}" -lummunotify
gcc "${cflags[@]}" kernel/rxe/ucx_hazard.c -o "$out/ucx_hazard" -lucp -lucs
gcc "${cflags[@]}" crates/ummunotify-fabric/tests/c/mr_reg.c -o "$out/fabric-mr-reg" \
    "${libs[@]}" -l:libummunotify_fabric.so -lfabric
lap "programs"

# 4. The initramfs: only what this guest runs (no MPI: issue 22's guests bring their own).
cp "$repo/kernel/rxe/init" "$out/init"
chmod 755 "$out/init"
before=()
[ -z "${UMN_RXE_COST_BEFORE:-}" ] || before=("$UMN_RXE_COST_BEFORE=/lib/before/libummunotify.so.0")
python3 kernel/rxe/pack.py "$out/initrd.gz" "$out/initramfs" \
    "$out/init=/init" "$out/module/ummunotify.ko=/lib/ummunotify.ko" \
    "$rel/libummunotify.so=/lib/libummunotify.so.0" \
    "$rel/libummunotify_fabric.so=/lib/libummunotify_fabric.so" \
    "$out/verbs_rxe" "$out/mr_reg" "$out/rxe_peer" "$out/verbs_hazard" "$out/fabric_hazard" \
    "$out/ucx_hazard" "$out/fabric-mr-reg" "$out/miss_parts" "${before[@]}"
lap "initramfs ($(du -h "$out/initrd.gz" | cut -f1))"

# 5. Boot: two sockets of one CPU each (plain -smp 2 gives this kernel one CPU), the virtio NIC
# rxe0 runs on. The kinds Linux 6.1 can not make come from kernel/compare.py (one list).
lacks=$(guest_lacks "$repo")
refusals=$(known_refusals "$repo")
rxe_boot "$kdir/arch/x86/boot/bzImage" "$out/initrd.gz" 2048 "$out/guest.log" \
    "${UMN_RXE_TIMEOUT:-1500}" "rxe.phases=${UMN_RXE_PHASES:-all} rxe.lacks=$lacks rxe.batch=${UMN_RXE_COST_BATCH:-100} rxe.mappings=${UMN_RXE_COST_MAPPINGS:-100,1000,10000} rxe.backends=${UMN_RXE_BACKENDS:-uffd,hooks,hybrid,kernel} rxe.refusals=$refusals"
lap "guest"

# 6. The verdict.
python3 "$repo/kernel/rxe/verdict.py" "$out/guest.log.txt" "${UMN_RXE_PHASES:-all}" \
    "${UMN_RXE_BACKENDS:-uffd,hooks,hybrid,kernel}" "${UMN_RXE_COST_MAPPINGS:-100,1000,10000}"
