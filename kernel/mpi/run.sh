#!/usr/bin/env bash
# Two nodes, one MPI job (issue 22): builds the project's Debian packages and checks them, packs
# one initramfs for two QEMU TCG guests with libummunotify0 and ummunotify-tools installed by dpkg, boots them as node0 and
# node1 joined by a link this script makes (QEMU socket netdev on 127.0.0.1: node1 listens,
# node0 connects), each with its own soft-RoCE device over that link, and runs Open MPI jobs
# with one rank per node (kernel/mpi/init, kernel/mpi/mpi_reuse.c). kernel/mpi/verdict.py
# judges node0's serial log: fails on a wrong byte with ummunotify as libfabric's monitor, a
# rank or job that did not finish, a missing result, a guest with fewer than 2 CPUs, or a
# control (libfabric's memhooks, raw syscalls) that shows no wrong byte.
#
#   bash kernel/mpi/run.sh              # as root; the full run (docs/MPI.md's figures)
#   UMN_MPI_SHORT=1 bash kernel/mpi/run.sh    # CI's variant
#
# Knobs: UMN_MPI_JOBS (comma list: hazard-ummunotify, hazard-memhooks, sweep-memhooks[N],
# sweep-ummunotify[N], mpich-ucx-hazard), UMN_MPI_ROUNDS (rounds per way, default 4),
# UMN_MPI_SIZE (bytes per message of the hazard job, default 1 MiB: above rxm's eager and SAR
# sizes, so it goes by rendezvous through the MR cache), UMN_MPI_SECONDS (per size of the
# sweep, default 3; 0.5 short), UMN_MPI_TIMEOUT (default 1800 s), UMN_MPI_PORT (the link's TCP
# port, default a free one).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out="$repo/target/mpi-guests"
mkdir -p "$out"
say() { printf 'kernel/mpi/run.sh: %s\n' "$*" >&2; }
t0=$(date +%s)
lap() { say "$1 after $(( $(date +%s) - t0 )) s"; }
if [ -n "${UMN_MPI_SHORT:-}" ]; then
    jobs_default=hazard-ummunotify,hazard-memhooks,sweep-memhooks,sweep-ummunotify
    rounds_default=3 seconds_default=0.5
else
    # Two sweep pairs in the order A B B A (a drift of the host's load over the run shows as
    # ratios on both sides of 1), and Debian's MPICH (ch4:ucx) on UCX's own hooks.
    jobs_default=hazard-ummunotify,hazard-memhooks,sweep-memhooks,sweep-ummunotify,sweep-ummunotify2,sweep-memhooks2,mpich-ucx-hazard
    rounds_default=4 seconds_default=3
fi
jobs=${UMN_MPI_JOBS:-$jobs_default}
rounds=${UMN_MPI_ROUNDS:-$rounds_default}
size=${UMN_MPI_SIZE:-1048576}
seconds=${UMN_MPI_SECONDS:-$seconds_default}
timeout_s=${UMN_MPI_TIMEOUT:-1800}

# 1. Packages: the kernel build and QEMU (as kernel/rxe/run.sh), rdma-core, libfabric, Open MPI.
. "$repo/kernel/lib.sh"
# shellcheck disable=SC2046 # the MPICH packages: none, or two words
apt_need "${GUEST_PACKAGES[@]}" iproute2 libibverbs-dev ibverbs-providers ibverbs-utils \
    rdmacm-utils libfabric-dev openmpi-bin libopenmpi-dev dpkg-dev pkg-config debhelper dh-dkms \
    lintian dkms \
    $(case ",$jobs," in *,mpich-*) echo mpich libmpich-dev ;; esac)

# 2. The kernel (cached; the one kernel/rxe/run.sh boots).
kdir=$(bash "$repo/kernel/build-kernel.sh" | tail -n 1)
lap "kernel"

# 3. The Debian packages (debian/, dpkg-buildpackage, lintian), checked (installed into a root,
# the DKMS module built against this kernel); the test's two programs.
cargo build -q --release -p ummunotify-capi -p ummunotify-compat -p ummunotify-fabric -p umn
bash packaging/deb/build.sh "$out/deb" >/dev/null
bash packaging/deb/check.sh "$out/deb" "$kdir"
# What a node runs: the library and the tools (umn, the preloads).
debs=$(ls "$out"/deb/libummunotify0_*.deb "$out"/deb/ummunotify-tools_*.deb | paste -sd,)
gcc -std=gnu11 -Wall -Wextra -Werror -O2 kernel/mpi/rsh.c -o "$out/umn-rsh"
mpicc.openmpi -std=gnu11 -Wall -Wextra -Werror -O2 -g kernel/mpi/mpi_reuse.c -o "$out/mpi_reuse" \
    -ldl
programs=("$out/umn-rsh" "$out/mpi_reuse")
case ",$jobs," in
*,mpich-*)
    mpicc.mpich -std=gnu11 -Wall -Wextra -Werror -O2 -g kernel/mpi/mpi_reuse.c \
        -o "$out/mpi_reuse.mpich" -ldl
    programs+=("$out/mpi_reuse.mpich")
    export UMN_MPI_MPICH=1
    ;;
esac
lap "package and programs"

# 4. One initramfs for both nodes: the package installed with dpkg, Open MPI, rdma-core.
cp kernel/mpi/init "$out/init"
chmod 755 "$out/init"
python3 kernel/mpi/pack.py "$out/initrd.gz" "$out/initramfs" "$debs" "$out/init=/init" \
    "${programs[@]}"
lap "initramfs ($(du -h "$out/initrd.gz" | cut -f1))"

# 5. Boot node1 (listening end of the link), then node0 (connecting end). Two sockets of one
# CPU each per guest (plain -smp 2 gives this kernel one CPU).
port=${UMN_MPI_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
append="console=ttyS0 rdinit=/init panic=-1 quiet mpi.jobs=$jobs mpi.rounds=$rounds mpi.size=$size mpi.seconds=$seconds"
guest() { # guest NODE NETDEV LOG (exec: in a subshell, its pid is timeout's)
    exec timeout -k 10 "$timeout_s" qemu-system-x86_64 -accel tcg -smp 2,sockets=2,cores=1,threads=1 \
        -m 2048 -nographic -no-reboot -kernel "$kdir/arch/x86/boot/bzImage" \
        -initrd "$out/initrd.gz" -netdev "$2" \
        -device "virtio-net-pci,netdev=n0,mac=52:54:00:22:00:0$(( $1 + 1 ))" \
        -append "$append mpi.node=$1" </dev/null >"$3" 2>&1
}
say "booting node1 and node0 (link 127.0.0.1:$port, timeout ${timeout_s}s, logs $out/node*.log)"
boot0=$(date +%s)
guest 1 "socket,id=n0,listen=127.0.0.1:$port" "$out/node1.log" &
node1=$!
sleep 2
set +e
(guest 0 "socket,id=n0,connect=127.0.0.1:$port" "$out/node0.log")
rc0=$?
# node0 ends node1 (umn-rsh node1 reboot -f); give it a moment, then stop it.
for _ in $(seq 1 30); do kill -0 "$node1" 2>/dev/null || break; sleep 1; done
if kill -0 "$node1" 2>/dev/null; then
    say "node1 still running: stopping it"
    kill "$node1"
fi
wait "$node1"
rc1=$?
set -e
for n in 0 1; do tr -d '\r' <"$out/node$n.log" >"$out/node$n.log.txt"; done
say "guests' wall time $(( $(date +%s) - boot0 )) s (qemu exit node0 $rc0, node1 $rc1)"
if [ "$rc0" = 124 ] || [ "$rc0" = 137 ]; then
    say "FAIL: node0 did not finish within ${timeout_s}s"
    tail -n 60 "$out/node0.log.txt" >&2
    exit 1
fi
lap "guests"

# 6. The verdict.
python3 kernel/mpi/verdict.py "$out/node0.log.txt" "$out/node1.log.txt" "$jobs"
