#!/bin/bash
# Compares the ummunotify cache's hit (get + drop of a warm region) and miss (get + drop of a
# never-seen page, one every other page, regions kept; no-op and mlock registrars) with UCX
# 1.22's ucs_rcache_get + ucs_rcache_region_put, measured one right after the other in the same
# invocation, ROUNDS times (default 3), reporting medians of the rounds and of the round-by-round
# ratios (the machine is noisy: only same-run ratios mean anything). The C library's hit
# (ummunotify_cache_get + _put through libummunotify.so) is measured by umn bench, batch by
# batch against the Rust hit in the same process (row cache_hit_c), and again from C by
# bench/call_floor.c, batch by batch against the floor: two calls into a .so with the same
# signatures that do no lookup at all. No out-of-line get + put (ours or UCX's) is cheaper than
# that floor, so a "C hit / UCX" target below "floor / UCX" can not be met by such a library here.
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
# The C hit and its floor (bench/call_floor.c), against the library just built.
FLOOR=$(bash "$REPO/bench/call_floor.sh" --build-only) ||
  { echo "ucx_compare: bench/call_floor.sh could not build bench/call_floor.c" >&2; exit 1; }
# ROUNDS rounds, each ours then UCX right after: the machine's speed drifts over minutes (the
# same harness read 16 ns in one run and 27 ns in the next), so every figure below is the median
# of its rounds and every ratio is taken round by round, then the median of those.
ROUNDS=${ROUNDS:-3}
TMP=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$TMP"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  "$UMN" bench --json >"$TMP/ours.$r" || { echo "ucx_compare: umn bench failed" >&2; exit 1; }
  "$FLOOR" >"$TMP/floor.$r" || { echo "ucx_compare: bench/call_floor.c failed" >&2; exit 1; }
  sed "s/^/round $r: /" "$TMP/floor.$r"
  UCX_LOG_LEVEL=error "$BIN" "$ITERS" 20000 >"$TMP/ucx.$r" 2>&1 ||
    fail "the UCX harness failed: $(tail -3 "$TMP/ucx.$r")"
  # The same harness with mlock/munlock as UCX's mem_reg/mem_dereg, for the mlock miss.
  MODE=mlock UCX_LOG_LEVEL=error "$BIN" "$ITERS" 20000 >"$TMP/mlock.$r" 2>&1 ||
    fail "the UCX harness (MODE=mlock) failed: $(tail -3 "$TMP/mlock.$r")"
  grep -E "^(HIT .*batch-1000|MISS)" "$TMP/ucx.$r" | sed "s/^/round $r: /"
  grep -E "^MISS" "$TMP/mlock.$r" | sed "s/^/round $r: mlock: /"
done
python3 - "$TMP" "$ROUNDS" <<'PY'
import json, re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def text(name, r):
    with open(f"{tmp}/{name}.{r}") as f:
        return f.read()
def stat(out, prefix, what):
    lines = [l for l in out.splitlines() if l.startswith(prefix)]
    if not lines:
        print(f"ucx_compare: no UCX line '{prefix}' ({what}) in the harness output", file=sys.stderr); sys.exit(2)
    m = re.search(r"median=\s*(\d+) ns.*mean=\s*([\d.]+)", lines[0])
    return float(m.group(1)), float(m.group(2))
HIT = "HIT get+put 4 KiB inside 1 MiB region (batch-1000"
MISS = "MISS get+put, 1 page"
rows = []
for r in range(1, rounds + 1):
    ours = {x["name"]: x for x in json.loads(text("ours", r))["results"]}
    if "cache_hit_c" not in ours:
        print("ucx_compare: umn bench gave no cache_hit_c row (see its stderr)", file=sys.stderr); sys.exit(2)
    ucx, mlock = text("ucx", r), text("mlock", r)
    floor = {}
    for l in text("floor", r).splitlines():
        m = re.match(r"(C HIT|FLOOR) .*median=([\d.]+) ns", l)
        if m:
            floor[m.group(1)] = float(m.group(2))
    if len(floor) != 2:
        print("ucx_compare: bench/call_floor.c printed no C HIT / FLOOR line", file=sys.stderr); sys.exit(2)
    rows.append({
        "hit": ours["cache_hit"]["ns_per_op"],
        "ucx_hit": stat(ucx, HIT, "hit"),
        "c_hit": ours["cache_hit_c"]["ns_per_op"],
        "rust_paired": ours["cache_hit_c"]["baseline"],
        "c_hit_plt": floor["C HIT"],
        "floor": floor["FLOOR"],
        "miss": ours["cache_miss"]["ns_per_op"],
        "ucx_miss": stat(ucx, MISS, "no-op registrar"),
        "miss_mlock": ours["cache_miss_mlock"]["ns_per_op"],
        "ucx_miss_mlock": stat(mlock, MISS, "mlock registrar"),
        # The miss against the kernel calls it makes, batch by batch in umn bench's process
        # (issue 23: UFFDIO_REGISTER + a signal-mask pair + PROCMAP_QUERY; bench/miss_floor.c).
        "miss_paired": ours["cache_miss_vs_floor"]["ns_per_op"],
        "miss_floor": ours["cache_miss_vs_floor"]["baseline"],
    })
med = lambda f: statistics.median(f(x) for x in rows)
print()
for r, x in enumerate(rows, 1):
    print(f"round {r}: hit {x['hit']:.1f} ns, C hit {x['c_hit']:.1f} (Rust alongside {x['rust_paired']:.1f}),"
          f" UCX hit {x['ucx_hit'][0]:.0f}; from C: hit {x['c_hit_plt']:.1f}, floor {x['floor']:.1f};"
          f" miss {x['miss']:.0f} ns, UCX miss mean {x['ucx_miss'][1]:.1f}")
print()
print(f"medians of {rounds} rounds (ours, then UCX right after, in each round)")
print(f"ummunotify cache hit (get + drop, median of batch means): {med(lambda x: x['hit']):6.1f} ns")
print(f"UCX 1.22 rcache get + put (batch-1000, median / mean):     {med(lambda x: x['ucx_hit'][0]):6.1f} / {med(lambda x: x['ucx_hit'][1]):.1f} ns")
print(f"ratio ummunotify / UCX (median):                          {med(lambda x: x['hit'] / x['ucx_hit'][0]):6.2f}  (target <= 0.50)")
print(f"C library hit (ummunotify_cache_get + _put, .so):         {med(lambda x: x['c_hit']):6.1f} ns")
print(f"Rust hit measured alongside it (paired batches):          {med(lambda x: x['rust_paired']):6.1f} ns")
print(f"ratio C hit / Rust hit:                                   {med(lambda x: x['c_hit'] / x['rust_paired']):6.2f}  (target <= 1.5)")
print(f"ratio C hit / UCX (median):                               {med(lambda x: x['c_hit'] / x['ucx_hit'][0]):6.2f}  (target <= 0.35)")
print(f"C hit from C (call_floor.c, direct calls):                {med(lambda x: x['c_hit_plt']):6.1f} ns")
print(f"floor: two empty calls, same signatures, no lookup:       {med(lambda x: x['floor']):6.1f} ns")
print(f"ratio floor / UCX (median): the least any out-of-line C hit can reach {med(lambda x: x['floor'] / x['ucx_hit'][0]):6.2f}")
print(f"ratio C hit from C / floor (median):                      {med(lambda x: x['c_hit_plt'] / x['floor']):6.2f}  (target <= 1.30)")
print(f"cache miss (no-op registrar), paired with its floor:      {med(lambda x: x['miss_paired']):6.0f} ns")
print(f"its kernel floor: UFFDIO_REGISTER + mask pair + PROCMAP_QUERY: {med(lambda x: x['miss_floor']):6.0f} ns")
print(f"ratio miss / floor (median):                              {med(lambda x: x['miss_paired'] / x['miss_floor']):6.2f}  (target <= 1.30)")
# Misses: ours is the mean over the run (total time / misses); UCX's per-call samples give both.
for key, what in (("miss", "no-op registrar"), ("miss_mlock", "mlock registrar")):
    ucx = "ucx_" + key
    print(f"ummunotify cache miss, {what:<15} (mean):             {med(lambda x: x[key]):8.1f} ns")
    print(f"UCX 1.22 rcache miss, {what:<15} (median / mean):     {med(lambda x: x[ucx][0]):8.1f} / {med(lambda x: x[ucx][1]):.1f} ns")
    target = "  (target <= 2.00)" if key == "miss" else ""
    print(f"ratio ummunotify / UCX (mean):                            {med(lambda x: x[key] / x[ucx][1]):8.2f}{target}")
PY
