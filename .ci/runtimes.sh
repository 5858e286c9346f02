#!/usr/bin/env bash
# The runtimes users have (issue 20): the library under the allocators MPI and storage codes
# preload, where allocators purge memory (madvise) from inside their own locks.
#
# For each of jemalloc, tcmalloc and mimalloc (Debian's libjemalloc2, libtcmalloc-minimal4,
# libmimalloc2.0), by LD_PRELOAD:
#   - the C cache in a host with its own signals (tests/c/host_signals.c: REMOVE churn against the
#     C cache, small alternate stacks, 10 kHz SIGPROF, a SIGALRM handler changing registered memory)
#     and the C checks under x == y churn (tests/c/counters.c);
#   - the REMOVE churn of the Rust torture (tests/torture_remove.rs, release): registrations, pins
#     and re-arms racing every REMOVE-producing kind, judged by the bytes io_uring reads.
# Fails on any failure, a crash, a hang (timeout) or a stale use. The sanitizer half of the
# matrix (the C library under AddressSanitizer, static) runs in `cargo test` (c_programs.rs), and
# UCX's memory hooks in the same process in c_programs.rs's c_ucx_memory_hooks_in_the_same_process.
#
# usage: .ci/runtimes.sh [seconds per run]  (default 5; needs root and the packages above)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
libdir=/usr/lib/x86_64-linux-gnu
allocators=(jemalloc:libjemalloc.so.2 tcmalloc:libtcmalloc_minimal.so.4 mimalloc:libmimalloc.so.2)

cargo build -q --release -p ummunotify-capi
out=target/runtimes
mkdir -p "$out"
cp target/release/libummunotify.so "$out/libummunotify.so.0"
ln -sf libummunotify.so.0 "$out/libummunotify.so"
for prog in host_signals counters; do
    gcc -std=gnu11 -Wall -Wextra -Werror -O2 -g -pthread -Iinclude -Icrates/ummunotify-testkit/c \
        -Icrates/ummunotify-capi/tests/c "crates/ummunotify-capi/tests/c/$prog.c" \
        -o "$out/$prog" -L"$out" -lummunotify -Wl,-rpath,"$PWD/$out"
done
torture=$(cargo test -q --release -p ummunotify --test torture_remove --no-run \
    --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "torture_remove":
        print(m["executable"])')
[ -x "$torture" ] || { echo "runtimes: no torture_remove test binary" >&2; exit 1; }

run() { # label, command...
    local label=$1
    shift
    if ! timeout -k 5 $((secs * 6 + 60)) "$@" >"$out/run.log" 2>&1; then
        cat "$out/run.log"
        echo "runtimes: $label failed" >&2
        exit 1
    fi
    grep -E "^(host_signals (onstack|normal)|counters \(|torture_remove:)" "$out/run.log" |
        sed "s/^/  $label: /"
}

for entry in "${allocators[@]}"; do
    name=${entry%%:*}
    lib=$libdir/${entry#*:}
    [ -e "$lib" ] || { echo "runtimes: $lib missing (apt-get install the $name package)" >&2; exit 1; }
    echo "--- $name ($lib)"
    # The allocator really replaced malloc in the programs (not an empty preload).
    LD_PRELOAD=$lib grep -q "${entry#*:}" /proc/self/maps ||
        { echo "runtimes: $lib was not loaded" >&2; exit 1; }
    run "$name C cache host" env LD_PRELOAD="$lib" UMN_HOST_MODE=onstack UMN_HOST_SECS="$secs" \
        "$out/host_signals"
    run "$name C checks" env LD_PRELOAD="$lib" UMN_COUNTERS_SECS="$secs" "$out/counters"
    run "$name REMOVE churn" env LD_PRELOAD="$lib" UMN_TORTURE_SECS="$secs" UMN_REQUIRE_ALL=1 \
        "$torture" --nocapture
done
echo "runtimes: every allocator passed"
