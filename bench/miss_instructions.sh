#!/bin/bash
# Instructions per cache miss, counted by callgrind: deterministic where times are not, so a
# change to the miss path can be judged in one run. The count is the difference between runs of
# 2N and N misses (examples/miss_syscalls.rs), divided by N: start-up and exit cancel out.
# Instructions are not time (a miss also pays for cache misses and the kernel calls'
# pollution; docs/DESIGNS.md), so read it beside `umn bench --miss`.
#
# Usage: bench/miss_instructions.sh [N] [random]   (default 1000 misses at rising addresses, as
# `umn bench`'s; `random`: the same pages in a shuffled order, where no search can be skipped
# for a key past either end of a map; UMN_BACKEND picks the backend)
# Needs valgrind (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000}
order=${2:-}
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build -q --release -p umn --example miss_syscalls
bin=target/release/examples/miss_syscalls
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" ${order:+"$order"} 2>&1 |
        awk '/Collected/ { print $4 }'
}
a=$(count "$n")
b=$(count $((2 * n)))
echo "instructions per miss: $(((b - a) / n)) (callgrind; $n and $((2 * n)) misses, ${order:-rising} addresses; backend ${UMN_BACKEND:-default})"
