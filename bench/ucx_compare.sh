#!/bin/bash
# Compares the ummunotify cache's hit (get + drop of a warm region) and miss (get + drop of a
# never-seen page, one every other page, regions kept; no-op and mlock registrars) with UCX
# 1.22's ucs_rcache_get + ucs_rcache_region_put, measured one right after the other in the same
# invocation (the machine is noisy: only same-run ratios mean anything). The C library's hit
# (ummunotify_cache_get + _put through libummunotify.so) is measured by umn bench, batch by
# batch against the Rust hit in the same process (row cache_hit_c).
#
# Builds the UCX harness from ../shared/peers/ucx against the PyPI wheel libucx-cu12==1.22.0
# (downloaded with pip into $UCX_WORK, default /tmp/umn-ucx; nothing is written to the repo).
# If UCX can not be built or run here, says exactly why and exits 2.
#
# usage: bench/ucx_compare.sh            (from anywhere; builds umn with --release)
#        bench/ucx_compare.sh --setup-only   (only builds the UCX harness; prints its path:
#                                            umn bench --backends runs it as its UCX row source)
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS:-$REPO/../shared/peers}
WORK=${UCX_WORK:-/tmp/umn-ucx}
W=$WORK/ucx122/libucx
ITERS=${ITERS:-100000}

fail() { echo "ucx_compare: UCX comparison not possible: $*" >&2; exit 2; }

[ -f "$PEERS/ucx/ucs_rcache_bench.c" ] || fail "harness not found at $PEERS/ucx/ucs_rcache_bench.c (set PEERS=)"
command -v gcc >/dev/null || fail "gcc is not installed (apt-get install gcc)"
mkdir -p "$WORK" || fail "can not create $WORK"

if [ ! -f "$W/include/ucs/memory/rcache.h" ]; then
  command -v pip >/dev/null || fail "pip is not installed (needed to fetch libucx-cu12==1.22.0)"
  command -v unzip >/dev/null || fail "unzip is not installed (apt-get install unzip)"
  pip download --no-deps libucx-cu12==1.22.0 -d "$WORK/wheel" >"$WORK/pip.log" 2>&1 ||
    fail "pip download libucx-cu12==1.22.0 failed (no network or no index?): $(tail -1 "$WORK/pip.log")"
  unzip -q -o "$WORK"/wheel/libucx_cu12-1.22.0-*.whl -d "$WORK/ucx122" ||
    fail "could not unzip the wheel in $WORK/wheel"
  [ -f "$W/include/ucs/memory/rcache.h" ] || fail "the wheel has no ucs/memory/rcache.h under $W/include"
fi

# The harness includes ../common/bench.h: keep the peers layout.
mkdir -p "$WORK/src/ucx" "$WORK/src/common"
cp "$PEERS/ucx/ucs_rcache_bench.c" "$WORK/src/ucx/" && cp "$PEERS/common/bench.h" "$WORK/src/common/" ||
  fail "could not copy the harness"
BIN=$WORK/src/ucx/ucs_rcache_bench_122
gcc -O2 -Wall -I"$W/include" -L"$W/lib" -Wl,-rpath,"$W/lib" -DUCX_RCACHE_V2 \
  -o "$BIN" "$WORK/src/ucx/ucs_rcache_bench.c" -lucs -lucm -lucs 2>"$WORK/gcc.log" ||
  fail "gcc could not build the harness against UCX 1.22: $(head -3 "$WORK/gcc.log")"

if [ "${1:-}" = "--setup-only" ]; then echo "$BIN"; exit 0; fi

# Our side first, then UCX right after.
(cd "$REPO" && cargo build --release -q -p umn -p ummunotify-capi) || { echo "ucx_compare: cargo build failed" >&2; exit 1; }
UMN=${CARGO_TARGET_DIR:-$REPO/target}/release/umn
OURS_JSON=$("$UMN" bench --json) || { echo "ucx_compare: umn bench failed" >&2; exit 1; }
UCX_OUT=$(UCX_LOG_LEVEL=error "$BIN" "$ITERS" 20000 2>&1) || fail "the UCX harness failed: $(echo "$UCX_OUT" | tail -3)"
# The same harness with mlock/munlock as UCX's mem_reg/mem_dereg, for the mlock miss.
UCX_MLOCK=$(MODE=mlock UCX_LOG_LEVEL=error "$BIN" "$ITERS" 20000 2>&1) || fail "the UCX harness (MODE=mlock) failed: $(echo "$UCX_MLOCK" | tail -3)"

echo "$OURS_JSON"
echo "$UCX_OUT" | grep -E "^(HIT .*batch-1000|MISS)"
echo "$UCX_MLOCK" | grep -E "^MISS" | sed 's/^/mlock: /'
python3 - "$OURS_JSON" "$UCX_OUT" "$UCX_MLOCK" <<'PY'
import json, re, sys
ours = {r["name"]: r for r in json.loads(sys.argv[1])["results"]}
def ucx_miss(out, what):
    lines = [l for l in out.splitlines() if l.startswith("MISS get+put, 1 page")]
    if not lines:
        print(f"ucx_compare: no UCX miss line ({what}) in the harness output", file=sys.stderr); sys.exit(2)
    m = re.search(r"median=\s*(\d+) ns.*mean=\s*([\d.]+)", lines[0])
    return float(m.group(1)), float(m.group(2))
hit = ours["cache_hit"]["ns_per_op"]
lines = [l for l in sys.argv[2].splitlines() if l.startswith("HIT get+put 4 KiB inside 1 MiB region (batch-1000")]
if not lines:
    print("ucx_compare: no UCX hit line found in the harness output", file=sys.stderr); sys.exit(2)
m = re.search(r"median=\s*(\d+) ns.*mean=\s*([\d.]+)", lines[0])
ucx_median, ucx_mean = float(m.group(1)), float(m.group(2))
print()
print(f"ummunotify cache hit (get + drop, median of batch means): {hit:6.1f} ns")
print(f"UCX 1.22 rcache get + put (batch-1000, median / mean):     {ucx_median:6.1f} / {ucx_mean:.1f} ns")
print(f"ratio ummunotify / UCX (median):                          {hit / ucx_median:6.2f}  (target <= 0.50)")
if "cache_hit_c" not in ours:
    print("ucx_compare: umn bench gave no cache_hit_c row (see its stderr)", file=sys.stderr); sys.exit(2)
c_hit = ours["cache_hit_c"]["ns_per_op"]
rust_paired = ours["cache_hit_c"]["baseline"]
print(f"C library hit (ummunotify_cache_get + _put, .so):         {c_hit:6.1f} ns")
print(f"Rust hit measured alongside it (paired batches):          {rust_paired:6.1f} ns")
print(f"ratio C hit / Rust hit:                                   {c_hit / rust_paired:6.2f}  (target <= 1.5)")
print(f"ratio C hit / UCX (median):                               {c_hit / ucx_median:6.2f}  (target <= 0.35)")
# Misses: ours is the mean over the run (total time / misses); UCX's per-call samples give both.
for name, out, what in (("cache_miss", sys.argv[2], "no-op registrar"), ("cache_miss_mlock", sys.argv[3], "mlock registrar")):
    med, mean = ucx_miss(out, what)
    ns = ours[name]["ns_per_op"]
    print(f"ummunotify cache miss, {what:<15} (mean):             {ns:8.1f} ns")
    print(f"UCX 1.22 rcache miss, {what:<15} (median / mean):     {med:8.1f} / {mean:.1f} ns")
    target = "  (target <= 2.00)" if name == "cache_miss" else ""
    print(f"ratio ummunotify / UCX (mean):                            {ns / mean:8.2f}{target}")
PY
