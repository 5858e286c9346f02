#!/usr/bin/env bash
# The peers' guest (issue 42): kdreg2 and libfabric 2.6.0 beside libfabric 1.17 and ummunotify,
# under the peers' own tests, in the soft-RoCE guest of kernel/rxe (same kernel, same QEMU
# command). Builds the peers once (kernel/peers/build.sh, cached), the project's libraries and
# the guest programs, packs an initramfs (kernel/peers/pack.py), boots it and judges the serial
# log with kernel/peers/verdict.py.
#
#   bash kernel/peers/run.sh      # as root
#
# Knobs: UMN_PEERS_PHASES (default all: kdreg2 (with race),race,fabtests,hazard,cost), UMN_PEERS_MONITORS
# (default memhooks,userfaultfd,kdreg2,umn-uffd,umn-kernel), UMN_PEERS_TIMEOUT (guest, default
# 3000 s), UMN_PEERS_TEST_TIMEOUT (each test in the guest, default 300 s), UMN_PEERS_BATCH
# (calls per round of the costs, default 200), UMN_PEERS_MEM (guest MiB, default 6144: kdreg2's
# test_basic maps its 524,288-region maximum, 4 GiB, and is killed by the OOM killer in 2 GiB),
# UMN_PEERS_RANKS_TIMEOUT (kdreg2's test_ranks.sh, 16 test_threads at once, default 1200 s; 0
# skips it), UMN_PEERS_CLOCK (kernel arguments for the guest's clock, default "tsc=reliable
# clocksource=tsc": fi_mr_cache_evict times registrations with clock_gettime, which on the
# jiffies clock ticks every 4 ms; empty: the kernel's own choice).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out="$repo/target/peers-guest"
mkdir -p "$out"
say() { printf 'kernel/peers/run.sh: %s\n' "$*" >&2; }
t0=$(date +%s)
lap() { say "$1 after $(( $(date +%s) - t0 )) s"; }
trap 'say "FAIL at line $LINENO: $BASH_COMMAND (exit $?)"' ERR
. "$repo/kernel/lib.sh"
apt_need "${GUEST_PACKAGES[@]}" iproute2 libibverbs-dev ibverbs-providers libfabric-dev

# 1. The peers (cached) and the kernel they were built for; our module against the same tree.
peers=$(bash "$repo/kernel/peers/build.sh" | tail -n 1)
kdir=$(bash "$repo/kernel/build-kernel.sh" | tail -n 1)
rm -rf "$out/module"
cp -r "$repo/kernel/module" "$out/module"
make -s -C "$kdir" M="$out/module" modules >&2
lap "peers, kernel and module"

# 2. Our libraries (release) and the programs, against libfabric 1.17 (Debian's) and 2.6.0.
cargo build -q --release -p ummunotify-capi -p ummunotify-fabric -p umn
rel="$repo/target/release"
lf2="$peers/libfabric-2"
cflags=(-std=gnu11 -Wall -Wextra -Werror -O2 -g -pthread -I kernel/rxe -I include
    -I crates/ummunotify-fabric/include)
libs=(-L "$rel" -Wl,-rpath,/lib -lummunotify -l:libummunotify_fabric.so)
phases=${UMN_PEERS_PHASES:-all}
wants() { case ",$phases," in *",$1,"*|*",all,"*) return 0 ;; esac; return 1; }
progs=("$out/kdreg2_race")
gcc "${cflags[@]}" -I "$peers/kdreg2/include" kernel/peers/kdreg2_race.c -o "$out/kdreg2_race"
if wants hazard; then
    gcc "${cflags[@]}" kernel/rxe/fabric_hazard.c -o "$out/fabric_hazard2" -I "$lf2/include" \
        "${libs[@]}" -L "$lf2/lib" -Wl,-rpath,"$lf2/lib" -lfabric -libverbs
    progs+=("$out/fabric_hazard2" "$rel/umn")
fi
if wants cost; then
    for v in 1 2; do
        lf=(-lfabric)
        [ $v = 1 ] || lf=(-I "$lf2/include" -L "$lf2/lib" -Wl,-rpath,"$lf2/lib" -lfabric)
        gcc "${cflags[@]}" kernel/peers/fabric_cost.c -o "$out/fabric_cost$v" "${lf[@]}" \
            "${libs[@]}" -libverbs
        progs+=("$out/fabric_cost$v")
    done
fi
lap "programs"

# 3. The initramfs. The peers stay at their cache paths (their RUNPATHs point there).
cp "$repo/kernel/peers/init" "$out/init"
chmod 755 "$out/init"
files=("$out/init=/init" "$out/module/ummunotify.ko=/lib/ummunotify.ko"
    "$peers/kdreg2/kdreg2.ko=/lib/kdreg2.ko"
    "$rel/libummunotify.so=/lib/libummunotify.so.0"
    "$rel/libummunotify_fabric.so=/lib/libummunotify_fabric.so"
    ${progs[@]+"${progs[@]}"})
for f in "$peers"/kdreg2/tests/*; do files+=("$f=$f"); done
for v in 1 2; do
    for t in fi_mr_cache_evict fi_mr_test; do
        files+=("$peers/fabtests-$v/bin/$t=$peers/fabtests-$v/bin/$t")
    done
done
python3 kernel/peers/pack.py "$out/initrd.gz" "$out/initramfs" "${files[@]}"
lap "initramfs ($(du -h "$out/initrd.gz" | cut -f1))"

# 4. Boot (kernel/rxe/run.sh's machine).
lacks=$(guest_lacks "$repo")
refusals=$(known_refusals "$repo")
monitors=${UMN_PEERS_MONITORS:-memhooks,userfaultfd,kdreg2,umn-uffd,umn-kernel}
log="$out/guest.log"
rxe_boot "$kdir/arch/x86/boot/bzImage" "$out/initrd.gz" "${UMN_PEERS_MEM:-6144}" "$log" \
    "${UMN_PEERS_TIMEOUT:-3000}" "${UMN_PEERS_CLOCK-tsc=reliable clocksource=tsc} peers.dir=$peers peers.phases=$phases peers.monitors=$monitors peers.timeout=${UMN_PEERS_TEST_TIMEOUT:-300} peers.ranks_timeout=${UMN_PEERS_RANKS_TIMEOUT:-1200} peers.batch=${UMN_PEERS_BATCH:-200} peers.lacks=$lacks peers.refusals=$refusals"
lap "guest"
python3 "$repo/kernel/peers/verdict.py" "$log.txt" "$phases" "$monitors"
