#!/usr/bin/env python3
"""The verdict on a soft-RoCE guest run (kernel/rxe/run.sh): reads the serial log, prints the
stale-byte tables and the costs, and exits 1 when

- the guest saw fewer than 2 CPUs, did not finish (no RXE-GUEST-DONE), had no ACTIVE rxe0 or
  could not load the module, or its kernel logged a BUG/WARNING/Oops;
- a program of a phase that ran exited non-zero or is missing (every RXE-EXIT below);
- a result is missing: every kind of the catalogue, for the Rust and the C cache (naive and
  ummunotify on every backend) and for libfabric's cache (its monitors and ummunotify on every
  backend); the UCX lines; the cost lines (a registration, a hit, and libfabric's miss of a
  fresh buffer with each monitor, with the check that it missed);
- a claimed kind was refused (typed, nothing stale sent) without being listed in
  known-refusals.txt, or a listed refusal no longer shows;
- ummunotify let a stale byte through for a kind its backend claims (the claims are the Rust
  catalogue's, printed by the Rust run: `claimed=1`), in any language or through libfabric; or,
  in the Rust and C caches, the get after such a change did not miss (untouched-neighbour: did
  not hit); or a claimed kind was refused, or any kind did not run for a reason other than what
  the guest kernel lacks (kernel/compare.py's GUEST_LACKS);
- the naive cache showed no stale byte for a kind that replaces memory (the case would then not
  make the hazard, and the test could not fail), or showed one where nothing was replaced;
- a check line failed (the verbs error message, libfabric's import, libfabric caching).

Usage: verdict.py GUEST_LOG [PHASES [BACKENDS [MAPPINGS]]]  (comma lists; default: every phase and
backend, which CI runs: a phase or backend that did not run is then a missing result; MAPPINGS:
the process sizes of the verbs cost lines, run.sh's UMN_RXE_COST_MAPPINGS, default 0)
"""
import importlib.util
import os
import re
import sys

PHASES = ("rust", "c", "fabric", "ucx", "cost")
BACKENDS = ("uffd", "hooks", "hybrid", "kernel")
FABRIC_MONITORS = ("memhooks", "userfaultfd")
COST_SIZES = (4096, 65536, 1048576)
COST_VERBS_BACKENDS = ("uffd", "kernel")
COST_FABRIC_MONITORS = ("memhooks", "userfaultfd", "ummunotify")
COST_MISS_SIZES = (16384, 4194304)


def guest_lacks():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    spec = importlib.util.spec_from_file_location("compare", os.path.join(here, "../compare.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GUEST_LACKS


def known_refusals():
    """(backend, kind) -> reason, from known-refusals.txt."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = {}
    for line in open(os.path.join(here, "known-refusals.txt"), encoding="utf-8"):
        if line.strip() and not line.startswith("#"):
            backend, kind, reason = line.split(None, 2)
            out[(backend, kind)] = reason.strip()
    return out


def fields(text):
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


def main():
    global BACKENDS
    lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
    want_phases = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] != "all" else PHASES
    if len(sys.argv) > 3:
        BACKENDS = tuple(sys.argv[3].split(","))
    mappings = [int(m) for m in sys.argv[4].split(",")] if len(sys.argv) > 4 else [0]
    lacks = guest_lacks()
    refusals = known_refusals()
    refused_seen = set()
    problems = []
    cpus = 0
    done = False
    phases = {}  # name -> uptime at start
    exits = {}  # (phase, name) -> status
    hazard = {}  # (lang, cache, backend, kind) -> fields
    checks = []
    ucx = {}
    cost_verbs = {}  # (backend, len, mappings) -> fields
    cost_before = {}  # the same, from the library before a change (UMN_RXE_COST_BEFORE)
    cost_fabric = {}
    cost_miss = {}  # (monitor, len) -> fields
    parts = []  # miss_parts.c's lines
    dmesg = []
    device = module = None
    for line in lines:
        m = re.search(r"RXE-GUEST booted \S+, (\d+) CPUs", line)
        if m:
            cpus = int(m.group(1))
        if "RXE-GUEST-DONE" in line:
            done = True
        m = re.search(r"RXE-PHASE (\S+) uptime=([\d.]+)", line)
        if m:
            phases[m.group(1)] = float(m.group(2))
        m = re.search(r"RXE-EXIT (\S+) (\S+) (\d+)", line)
        if m:
            exits[(m.group(1), m.group(2))] = int(m.group(3))
        m = re.search(r"RXE-DEVICE rxe0 (.*)", line)
        if m:
            device = m.group(1)
        m = re.search(r"RXE-MODULE (.*)", line)
        if m:
            module = m.group(1)
        at = line.find("RXE-HAZARD ")
        if at >= 0:
            f = fields(line[at:])
            key = (f["lang"], f["cache"], f["backend"], f["kind"])
            if key in hazard:
                problems.append(f"two results for {key}")
            hazard[key] = f
        m = re.search(r"RXE-CHECK (\S+ \S+) (.*)", line)
        if m:
            checks.append((m.group(1), m.group(2)))
        at = line.find("RXE-UCX ")
        if at >= 0:
            f = fields(line[at:])
            ucx[f["kind"]] = f
        for tag, into in (("RXE-COST verbs ", cost_verbs), ("RXE-COST verbs-before ", cost_before)):
            at = line.find(tag)
            if at >= 0:
                f = fields(line[at:])
                into[(f["backend"], int(f["len"]), int(f.get("mappings", 0)))] = f
        at = line.find("RXE-COST fabric ")
        if at >= 0:
            f = fields(line[at:])
            cost_fabric[f["monitor"]] = f
        at = line.find("RXE-COST fabric-miss ")
        if at >= 0:
            f = fields(line[at:])
            cost_miss[(f["monitor"], int(f["len"]))] = f
        at = line.find("RXE-PARTS ")
        if at >= 0:
            parts.append(fields(line[at:]))
        if line.startswith("RXE-DMESG "):
            dmesg.append(line)

    if cpus < 2:
        problems.append(f"the guest saw {cpus} CPU(s), not 2 (QEMU needs -smp 2,sockets=2)")
    if not done:
        problems.append("the guest did not finish (no RXE-GUEST-DONE)")
    if not device or "ACTIVE" not in device:
        problems.append(f"rxe0 is not ACTIVE: {device}")
    if module != "loaded":
        problems.append(f"the module was not loaded: {module}")
    for d in dmesg:
        if re.search(r"BUG|WARNING|Oops|general protection", d):
            problems.append(f"guest kernel: {d}")

    # The programs every phase that ran must have run, each exiting 0.
    want_exits = {
        "rust": [("rust", "naive")] + [("rust", b) for b in BACKENDS],
        "c": [("c", "naive")] + [("c", b) for b in BACKENDS],
        "fabric": [("fabric", m) for m in FABRIC_MONITORS]
        + [("fabric", f"ummunotify-{b}") for b in BACKENDS] + [("fabric", "mr_reg")],
        "ucx": [("ucx", "ucx_hazard")],
        "cost": [("cost", f"verbs-{b}-{m}") for b in COST_VERBS_BACKENDS for m in mappings]
        + [("cost", f"fabric-{m}") for m in COST_FABRIC_MONITORS],
    }
    for p in want_phases:
        if p not in phases:
            problems.append(f"the {p} phase did not run")
    ran = [p for p in want_exits if p in phases]
    for p in ran:
        for e in want_exits[p]:
            if e not in exits:
                problems.append(f"{p}: {e[1]} did not finish (no RXE-EXIT)")
            elif exits[e] != 0:
                problems.append(f"{p}: {e[1]} exited {exits[e]}")

    kinds = [k for (lang, cache, b, k) in hazard if lang == "rust" and cache == "naive"]
    claims = {}
    for (lang, cache, b, k), f in hazard.items():
        if lang == "rust" and cache == "ummunotify" and f.get("claimed") in ("0", "1"):
            claims[(b, k)] = f["claimed"] == "1"
    if "rust" in phases and len(kinds) < 22:
        problems.append(f"the Rust naive run reported {len(kinds)} kinds, not the catalogue's 22")
    if not kinds and ("c" in phases or "fabric" in phases):
        problems.append("no Rust results: the claims of each backend come from the Rust run")

    def runs(lang):
        out = []
        if lang in ("rust", "c"):
            out.append(("naive", "-"))
        if lang == "fabric":
            out += [(m, "-") for m in FABRIC_MONITORS]
        out += [("ummunotify", b) for b in BACKENDS]
        return out

    for lang in ("rust", "c", "fabric"):
        if lang not in phases:
            continue
        for cache, backend in runs(lang):
            for k in kinds:
                f = hazard.get((lang, cache, backend, k))
                who = f"{lang} {cache} {backend} {k}"
                if f is None:
                    problems.append(f"{who}: no result")
                    continue
                result = f["result"]
                stale = int(f["read_stale"]) + int(f["write_lost"])
                replaces = f["replaces"] == "1"
                if result == "lacks":
                    if k not in lacks:
                        problems.append(f"{who}: did not run: {f.get('note')}")
                    continue
                if cache == "naive":
                    if result != "ran":
                        problems.append(f"{who}: {result} {f.get('note', '')}")
                    elif replaces and (int(f["read_stale"]) == 0 or int(f["write_lost"]) == 0):
                        problems.append(f"{who}: no stale bytes: the case does not make the hazard")
                    elif not replaces and stale:
                        problems.append(f"{who}: {stale} stale bytes where nothing was replaced")
                    continue
                if cache != "ummunotify":
                    # libfabric's own monitors: what they let through is reported, and a hang
                    # (a kind that made the process stall) is a result too.
                    if result not in ("ran", "hang"):
                        problems.append(f"{who}: {result} {f.get('note', '')}")
                    continue
                claimed = claims.get((backend, k))
                if claimed is None:
                    problems.append(f"{who}: no claim from the Rust run for {backend} {k}")
                    continue
                if result == "refused":
                    if claimed and (backend, k) in refusals:
                        refused_seen.add((lang, backend, k))
                    elif claimed:
                        problems.append(f"{who}: a claimed kind was refused: {f.get('note')}")
                    continue
                if result != "ran":
                    problems.append(f"{who}: {result} {f.get('note', '')}")
                    continue
                if claimed and stale:
                    problems.append(f"{who}: {stale} stale bytes on the wire for a claimed kind "
                                    f"(read {f['read_stale']}, write {f['write_lost']}; pages read "
                                    f"{f.get('read_pages', '-')}, memory at the write's "
                                    f"completion {f.get('memory_pages', '-')})")
                silent = k == "untouched-neighbour"
                if claimed and lang != "fabric" and (f["hit_after"] == "1") != silent:
                    problems.append(f"{who}: the get after the change "
                                    f"{'missed' if silent else 'hit'}")

    late = [f"{' '.join(key)}: {f['write_late']} bytes (pages read {f.get('read_pages', '-')}, "
            f"memory at completion {f.get('memory_pages', '-')})"
            for key, f in hazard.items() if int(f.get("write_late", "0"))]
    if late:
        print("\nWrites whose bytes reached the new memory only after their completion (not "
              "stale; recorded):")
        for line in late:
            print("  " + line)

    for (backend, k), reason in refusals.items():
        for lang in ("rust", "c"):
            if lang in phases and (lang, backend, k) not in refused_seen:
                problems.append(f"{lang} {backend} {k}: listed in known-refusals.txt but not "
                                "refused any more: delete its line")

    for what, rest in checks:
        if " FAIL" in f" {rest}" or rest.startswith("FAIL"):
            problems.append(f"check {what}: {rest}")
    if "c" in phases:
        n = sum(1 for what, rest in checks if what == "c register-error" and rest.startswith("ok"))
        if n < len(BACKENDS):
            problems.append(f"the verbs error-message check ran {n} times, not {len(BACKENDS)}")
    if "ucx" in phases:
        for k in ("libc-munmap", "syscall-munmap"):
            if ucx.get(k, {}).get("sent") not in ("old", "new", "mixed"):
                problems.append(f"ucx: no result for {k}")
    if "cost" in phases:
        for b in COST_VERBS_BACKENDS:
            for n in COST_SIZES:
                for m in mappings:
                    if (b, n, m) not in cost_verbs:
                        problems.append(f"cost: no verbs line for {b} {n} with {m} mappings")
        for m in COST_FABRIC_MONITORS:
            if m not in cost_fabric:
                problems.append(f"cost: no fabric line for {m}")
            for n in COST_MISS_SIZES:
                if (m, n) not in cost_miss:
                    problems.append(f"cost: no fabric miss line for {m} {n}")
            if not any(what == "fabric miss-count" and f"monitor={m} " in rest
                       for what, rest in checks):
                problems.append(f"cost: no check that libfabric's cache missed, for {m}")

    # Tables.
    def table(lang):
        cols = [(c, b) for c, b in runs(lang)]
        head = "kind".ljust(22) + "".join(
            (c if b == "-" else f"umn-{b}").rjust(13) for c, b in cols)
        print(f"\n{lang}: stale bytes on the wire (read stale + write lost; "
              "* = a kind the backend claims, - = the kernel lacks it, r = refused, hang = the "
              "process stalled)")
        print(head)
        for k in kinds:
            row = k.ljust(22)
            for c, b in cols:
                f = hazard.get((lang, c, b, k))
                if f is None:
                    cell = "?"
                elif f["result"] == "lacks":
                    cell = "-"
                elif f["result"] in ("refused", "device-refused"):
                    cell = "r"
                elif f["result"] == "hang":
                    cell = "hang"
                else:
                    cell = str(int(f["read_stale"]) + int(f["write_lost"]))
                if c == "ummunotify" and claims.get((b, k)):
                    cell += "*"
                row += cell.rjust(13)
            print(row)

    for lang in ("rust", "c", "fabric"):
        if lang in phases:
            table(lang)
    if ucx:
        print("\nUCX 1.13 rcache after x == y (64 KiB ucp_put_nbx from the reused address):")
        for k, f in ucx.items():
            print(f"  {k}: sent the {f['sent']} pages ({f['stale_bytes']} of {f['len']} bytes old)")

    def verbs_table(rows, what):
        print(f"\nA registration with the verbs registrar{what} (TSC ticks per operation and ratios "
              "to the bare verbs calls: medians over rounds of one process; vmas: the process's "
              "mappings):")
        print("backend      len   vmas  reg+dereg  miss+evict  ratio |    reg     miss  ratio |  "
              "hit  hit/reg+dereg | one /proc/self/maps read")
        for (b, n, m), f in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
            print(f"{b:7} {n:8} {f.get('vmas', '?'):>6} {f['ibv_reg_dereg_ticks']:>10} "
                  f"{f['miss_ticks']:>11} {float(f['miss_over_reg']):6.2f} | "
                  f"{f['ibv_reg_ticks']:>6} {f['miss_in_ticks']:>8} "
                  f"{float(f['miss_in_over_reg']):6.2f} | {f['hit_ticks']:>4}  "
                  f"{float(f['hit_over_reg']):.5f} | {f.get('maps_read_ticks', '?'):>7}")

    if cost_verbs:
        verbs_table(cost_verbs, "")
    if cost_before:
        verbs_table(cost_before, ", the library before the change (UMN_RXE_COST_BEFORE), same "
                    "guest")
    if parts:
        print("\nThe kernel calls of a userfaultfd miss one by one (miss_parts.c; TSC ticks, "
              "medians; miss_*: a cache miss with a no-op registrar):")
        for f in parts:
            print("  " + " ".join(f"{k}={v}" for k, v in f.items()))
    if cost_fabric:
        print("\nA cache hit, 64 KiB (TSC ticks; ummunotify's C cache against libfabric's "
              "fi_mr_reg + fi_close hit, same process, median ratio over rounds):")
        for m, f in cost_fabric.items():
            print(f"  libfabric with {m:10}: {f['fi_hit_ticks']:>6} ticks; ummunotify "
                  f"({f['umn_backend']}): {f['umn_hit_ticks']:>5} ticks; ratio "
                  f"{float(f['umn_over_fi']):.3f}")
    if cost_miss:
        print("\nA cache miss (fi_mr_reg + fi_close of a fresh buffer: libfabric's cache registers "
              "and subscribes it with its monitor; TSC ticks, medians over rounds, one process per "
              "monitor; /reg: over ibv_reg_mr alone in the same rounds):")
        print("     len |      memhooks  /reg |   userfaultfd  /reg |    ummunotify  /reg | "
              "umn/uffd  umn/memhooks | of /reg: umn/uffd  umn/memhooks")
        for n in sorted({n for _, n in cost_miss}):
            row = {m: cost_miss.get((m, n)) for m in COST_FABRIC_MONITORS}
            line = f"{n:8} |"
            for m in COST_FABRIC_MONITORS:
                f = row[m]
                line += (f" {f['fi_miss_ticks']:>13} {float(f['miss_over_reg']):5.2f} |" if f
                         else f" {'?':>13} {'?':>5} |")

            def ratio(key, cast, a, b):
                if not row[a] or not row[b] or not cast(row[b][key]):
                    return "?"
                return f"{cast(row[a][key]) / cast(row[b][key]):.2f}"

            raw = (ratio("fi_miss_ticks", int, "ummunotify", "userfaultfd"),
                   ratio("fi_miss_ticks", int, "ummunotify", "memhooks"))
            norm = (ratio("miss_over_reg", float, "ummunotify", "userfaultfd"),
                    ratio("miss_over_reg", float, "ummunotify", "memhooks"))
            print(line + f" {raw[0]:>8}  {raw[1]:>12} | {norm[0]:>17}  {norm[1]:>12}")
        print("Each fresh buffer missed (libfabric's own counters when the domain closed: its "
              "hits are exactly the calls that had to hit):")
        for what, rest in checks:
            if what == "fabric miss-count":
                print("  " + rest)
    if phases:
        order = sorted(phases.items(), key=lambda kv: kv[1])
        print("\nguest phases (seconds of guest uptime): " + ", ".join(
            f"{name} {order[i + 1][1] - t:.1f}" for i, (name, t) in enumerate(order[:-1])))
    if problems:
        print("\nkernel/rxe/verdict.py: FAIL")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print(f"\nkernel/rxe/verdict.py: ok ({len(hazard)} hazard results, {cpus} CPUs)")


if __name__ == "__main__":
    main()
