#!/usr/bin/env python3
"""The verdict on a guest run (kernel/ci.sh): one suite, two implementations.

Reads the guest's serial log and kernel/expected-divergences.txt. Fails (exit 1) when
- the C library's smoke test (capi_smoke) fails;
- the guest never printed UMN-GUEST-DONE (it crashed, hung or was cut short), or the module
  could not be loaded, or the guest kernel logged a BUG/WARNING/Oops;
- a test has no result for one implementation, or a program exited without its results;
- the module (the reference) fails or skips a test that is not a listed divergence;
- the preload's result differs from the module's and the difference is not listed;
- a listed divergence no longer shows (either side changed): the list must be updated, so a
  fix lands as a visible change of this file. Only an entry that lists alternatives ("A|B", for
  a race a run may or may not hit) accepts equal results; "FAIL*" is any failure.
- the Rust kernel backend's tests (kernel_backend) fail, or `umn coverage --backend kernel`
  (every change kind against the module through ummunotify::KernelNotifier) or `--backend uffd`
  has a miss, a stale use or a problem, or a case could not run for a reason other than one
  this guest kernel is known to lack (GUEST_LACKS);
- `umn designs` did not finish (when the benchmarks ran).
Prints the side-by-side table, the coverage tables and the benchmark tables.

- the Rust REMOVE race (tests/remove_race.rs, signal on: what ships) finds a stale use or fails
  (its run with the signal off is printed, not judged: the stock kernel's window).

Both guests run userfaultfd's own selftest (UMN-SELFTEST lines): in the stock guest its stock
build must pass in every mode run; with --patched, the stock build must give the same exit code
and sub-tests on the patched kernel as in STOCK_GUEST_LOG, and the series' build must pass with
its REMOVE_DONE test.

With --debug, judges the debug guest (kernel/debug.config: lockdep, kmemleak, KASAN; see
debug_main).

With --patched, judges the second guest (kernel/patches/uffd-remove-done/): the patch's
own test (uffd_remove_done) must pass, and with the signal off the REMOVE race and the 2010
REMOVE stress must find no stale use, every REMOVE ended by the kernel's REMOVE_DONE (none by a
grace period).

Usage: compare.py GUEST_LOG EXPECTED_DIVERGENCES
       compare.py --patched GUEST_LOG [STOCK_GUEST_LOG]
       compare.py --debug GUEST_LOG EXPECTED_DIVERGENCES
"""
import json
import re
import sys

# The guest's programs and the prefix of their tests' names.
PROGRAMS = [("abi2010-suite", "abi2010/"), ("exact2010", "exact2010/"),
            ("remove_stress", "remove_stress/")]

# Change kinds the guest's 6.1 tinyconfig kernel can not make at all, so `umn coverage` reports
# them inconclusive (could not run) on every backend: not a verdict, and not a miss.
GUEST_LACKS = {
    "madv-guard-install": "MADV_GUARD_INSTALL is Linux 6.13",
    "madv-collapse": "MADV_COLLAPSE needs transparent huge pages (off in kernel.config)",
    "process-madvise": "6.1's process_madvise takes COLD, PAGEOUT, WILLNEED, COLLAPSE only",
}
# Why a backend refuses to watch a kind's mapping on this guest kernel (the notifier's typed
# UnsupportedMapping error). `umn coverage` itself counts such a refusal of a kind the backend
# is not expected to see as an expected miss (a note, no problem); this only explains it.
GUEST_REFUSES = {
    ("uffd", "shmdt"): "6.1's userfaultfd can not register a SysV shm VMA (EINVAL)",
}
COVERAGE_BACKENDS = ("kernel", "uffd")


def parse_log(path):
    results = {}  # (impl, test) -> "PASS" | "FAIL <detail>" | "SKIP"
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    done = False
    module_loaded = False
    dmesg_bad = []
    bench = []
    stress = []
    exits = set()  # (impl, program)
    codes = {}  # (impl, program) -> exit status
    coverage = {}  # backend -> parsed `umn coverage --json`, or the text that did not parse
    designs = []
    cpus = 0
    for line in lines:
        line = line.rstrip()
        m = re.search(r"UMN-GUEST booted \S+, (\d+) CPUs$", line)
        if m:
            cpus = int(m.group(1))
        m = re.match(r"^UMN-RESULT (\S+) (\S+) (PASS|FAIL|SKIP)(?: (.*))?$", line)
        if m:
            impl, test, verdict, detail = m.groups()
            results[(impl, test)] = verdict + (" " + detail if detail else "")
        elif line.startswith("UMN-EXIT "):
            f = line.split()
            exits.add(tuple(f[1:3]))
            codes[tuple(f[1:3])] = f[3] if len(f) > 3 else "?"
        elif line.startswith("UMN-COVERAGE "):
            _, backend, text = (line.split(" ", 2) + [""])[:3]
            try:
                coverage[backend] = json.loads(text)
            except ValueError:
                coverage[backend] = text
        elif line.startswith("UMN-DESIGN "):
            designs.append(line.split()[1:])
        elif line == "UMN-GUEST-DONE":
            done = True
        elif line.startswith("UMN-MODULE loaded"):
            module_loaded = True
        elif line.startswith("UMN-DMESG") and re.search(r"BUG|WARNING|Oops|general protection", line):
            dmesg_bad.append(line)
        elif line.startswith("UMN-BENCH "):
            bench.append(line)
        elif line.startswith(("UMN-STRESS ", "UMN-ACCOUNT ", "UMN-FUZZ ")):
            stress.append(line)
    if cpus < 2:
        # Every concurrency test in the guest (the REMOVE stress, the module's in-progress
        # check, the storms) needs two CPUs to mean anything (QEMU: -smp 2,sockets=2).
        dmesg_bad.append(f"UMN-DMESG the guest saw {cpus} CPUs (BUG: want 2)")
    return results, done, module_loaded, dmesg_bad, bench, stress, exits, codes, coverage, designs


def parse_races(path):
    """{label: [remove_race lines]}: each run's lines come before its UMN-EXIT <label> remove_race."""
    races, pending = {}, []
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines():
        # libtest may print "test NAME ... " on the same line before the first one.
        m = re.search(r"remove_race kind=.*", line)
        if m:
            pending.append(m.group(0).strip())
        m = re.match(r"^UMN-EXIT (\S+) remove_race (\S+)", line)
        if m:
            races[m.group(1)] = (m.group(2), pending)
            pending = []
    return races


def judge_race(label, race, judged, want_no_grace=False, want_confirmed=False):
    """Prints one remove_race run; returns its problems (none when not judged).

    want_confirmed: with the signal on, every kind must end some REMOVEs by its members'
    acknowledgements. None at all means the library took every sender for one it can not
    signal (on 6.1's guess unwinder, idle io_uring workers once read as busy), and the run
    judges next to nothing while passing."""
    if race is None:
        return [f"remove_race {label}: never ran"] if judged else []
    code, lines = race
    print(f"\nremove_race {label} (exit {code}{'' if judged else ', not judged'})")
    problems = []
    stale = grace = 0
    confirmed = {}
    for line in lines:
        kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "stale" in kv:
            stale += int(kv["stale"])
            print(f"  {kv['kind']:<22} {kv['path']:<9} judged={kv['judged']:<7} stale={kv['stale']}")
        if "removes_by_grace" in kv:
            grace += int(kv["removes_by_grace"])
            confirmed[kv["kind"]] = confirmed.get(kv["kind"], 0) + int(kv["removes_confirmed"])
            print(f"  {kv['kind']:<22} {kv['path']:<9} removes_confirmed={kv['removes_confirmed']} "
                  f"removes_by_grace={kv['removes_by_grace']}")
    print(f"  total stale uses: {stale}; REMOVEs ended by a grace period: {grace}")
    if judged:
        if code != "0":
            problems.append(f"remove_race {label}: exit {code}")
        if stale:
            problems.append(f"remove_race {label}: {stale} stale uses")
        if want_no_grace and grace:
            problems.append(f"remove_race {label}: {grace} REMOVEs ended by grace, not by the kernel")
        if not lines:
            problems.append(f"remove_race {label}: printed nothing")
        if want_confirmed:
            problems += [f"remove_race {label}: {k}: no REMOVE ended by acknowledgement"
                         for k, n in confirmed.items() if n == 0]
    return problems


# userfaultfd's selftest (tools/testing/selftests/vm/userfaultfd.c), the modes guest/init runs.
SELFTEST_MODES = ("anon", "anon:dev", "shmem", "shmem:dev")
# The series' own test of UFFD_EVENT_REMOVE_DONE (patch 0003) prints this when it passes.
SELFTEST_REMOVE_DONE = "testing events (remove, remove done): done."
# How a mode ends on this guest kernel for want of an option, whatever the patch: after the
# bounces, anon's uffd-wp pagemap test asks for MADV_NOHUGEPAGE, which is EINVAL without
# transparent huge pages (off in kernel.config), and err() ends the run there, before the
# zeropage, signal, events and REMOVE_DONE tests (which the shmem modes run).
SELFTEST_GUEST_LACKS = {
    "anon": ("ERROR: madvise(MADV_NOHUGEPAGE) failed (errno=22",
             "MADV_NOHUGEPAGE needs transparent huge pages (off in kernel.config)"),
}
SELFTEST_GUEST_LACKS["anon:dev"] = SELFTEST_GUEST_LACKS["anon"]


def selftest_lacks(mode, code, lines):
    """Why this run ended early for want of a kernel option, or None."""
    lack = SELFTEST_GUEST_LACKS.get(mode)
    # err() writes to stderr after the test's unterminated "testing ...: " on stdout.
    if lack and code == "1" and lines and lack[0] in lines[-1]:
        return lack[1]
    return None


def parse_selftest(path):
    """{(build, mode): (exit code, [lines])} from UMN-SELFTEST / UMN-SELFTEST-EXIT lines."""
    runs, pending, skips = {}, {}, []
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines():
        m = re.match(r"^UMN-SELFTEST (\S+) (\S+) (.*)$", line)
        if m:
            pending.setdefault((m.group(1), m.group(2)), []).append(m.group(3))
            continue
        m = re.match(r"^UMN-SELFTEST-EXIT (\S+) (\S+) (\S+)", line)
        if m:
            key = (m.group(1), m.group(2))
            runs[key] = (m.group(3), pending.pop(key, []))
            continue
        if line.startswith("UMN-SELFTEST-SKIP "):
            skips.append(line[len("UMN-SELFTEST-SKIP "):])
    return runs, skips


def selftest_shape(lines):
    """What a run must have in common with another on a different kernel: the sub-tests it
    reached, in order, and each bounce's mode, without the fault counts (which vary by run)."""
    shape = []
    for line in lines:
        if line.startswith("bounces:"):
            shape.append(line.split(", userfaults")[0])
        elif line.startswith("testing "):
            shape.append(line.split(":")[0])
        else:
            shape.append(line)
    return shape


def judge_selftest(runs, skips, build, label):
    """Prints one build's runs; returns its problems (a mode missing or not exiting 0)."""
    print(f"\nuserfaultfd selftest, {build} build, {label} kernel")
    problems = []
    for mode in SELFTEST_MODES:
        run = runs.get((build, mode))
        if run is None:
            problems.append(f"selftest {build} {mode} on the {label} kernel: never ran")
            continue
        code, lines = run
        tests = [t for t in selftest_shape(lines) if t.startswith("testing ")]
        print(f"  {mode:<10} exit {code}: {len(tests)} sub-tests after the bounces "
              f"({', '.join(t[len('testing '):] for t in tests)})")
        bounces = sum(line.startswith("bounces:") for line in lines)
        lack = selftest_lacks(mode, code, lines)
        if lack:
            print(f"  {'':<10} ended after {bounces} bounces and the tests above: {lack}")
        elif code != "0":
            problems.append(f"selftest {build} {mode} on the {label} kernel: exit {code}: "
                            f"{lines[-1] if lines else 'no output'}")
        if bounces == 0:
            problems.append(f"selftest {build} {mode} on the {label} kernel: no bounce ran")
    for skip in skips:
        if skip.startswith(build + " "):
            print(f"  not run: {skip[len(build) + 1:]}")
    return problems


# The patched guest's three designs side by side (issue 43): Ingo Molnar's tracepoints
# (kernel/patches/mmu-notifier-trace/), the 2010 device (the module) and userfaultfd.
PATCHED_COVERAGE_BACKENDS = ("tracepoint", "kernel", "uffd")


def parse_bench43(path):
    """UMN-BENCH43 UMN-BENCH-ROW<TAB>backend<TAB>row<TAB>value<TAB>baseline<TAB>base value<TAB>unit"""
    rows = []
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines():
        if line.startswith("UMN-BENCH43 UMN-BENCH-ROW\t"):
            f = line.split("\t")[1:]
            if len(f) == 6:
                rows.append(f)
    return rows


def judge_patched_designs(log, codes, coverage, designs):
    """The tracepoint backend's tests, the three coverages, the bench rows; returns problems."""
    problems = []
    if codes.get(("tracepoint", "mmu_tests")) != "0":
        problems.append("the tracepoint backend's tests (backend::perf::tests::mmu_*) failed or "
                        f"never ran: exit {codes.get(('tracepoint', 'mmu_tests'))}")
    for backend in PATCHED_COVERAGE_BACKENDS:
        problems += judge_coverage(backend, coverage.get(backend),
                                   codes.get((backend, "coverage")))
    rows = parse_bench43(log)
    if rows:
        print("\nbench rows, patched guest (QEMU TCG: ns, compare ratios only)")
        print(f"{'backend':<11} {'row':<32} {'value':>12} {'baseline':>12} {'ratio':>7}  baseline")
        for backend, row, v, base, bv, unit in rows:
            ratio = f"{float(v) / float(bv):.2f}" if float(bv) > 0 else "-"
            print(f"{backend:<11} {row:<32} {float(v):>12.1f} {float(bv):>12.1f} {ratio:>7}  "
                  f"{base} ({unit})")
            if row == "storm_100k_lost" and float(v) != 0:
                problems.append(f"bench {backend}: {v} regions still valid after the storm")
        for backend in PATCHED_COVERAGE_BACKENDS:
            if codes.get((backend, "bench_backend")) != "0":
                problems.append(f"bench {backend}: exit {codes.get((backend, 'bench_backend'))}")
    if designs:
        print_designs(designs)
        if codes.get(("designs", "umn_designs")) != "0":
            problems.append("umn designs (patched) failed: exit "
                            f"{codes.get(('designs', 'umn_designs'))}")
    return problems


def patched_main(log, stock_log=None):
    results, done, _, dmesg_bad, _, stress, _, codes, coverage, designs = parse_log(log)
    problems = []
    # userfaultfd's selftest: the stock build must give on the patched kernel exactly what it
    # gave on the stock one; the series' build (with the REMOVE_DONE test) must pass.
    runs, skips = parse_selftest(log)
    problems += judge_selftest(runs, skips, "stock", "patched")
    problems += judge_selftest(runs, skips, "series", "patched")
    for mode in SELFTEST_MODES:
        code, lines = runs.get(("series", mode), ("", []))
        if SELFTEST_REMOVE_DONE not in lines and not selftest_lacks(mode, code, lines):
            problems.append(f"selftest series {mode}: no '{SELFTEST_REMOVE_DONE}'")
    if stock_log is None:
        problems.append("no stock guest log to compare userfaultfd's selftest with")
    else:
        stock_runs, _ = parse_selftest(stock_log)
        for mode in SELFTEST_MODES:
            a, b = stock_runs.get(("stock", mode)), runs.get(("stock", mode))
            if a is None or b is None:
                problems.append(f"selftest stock {mode}: missing on the "
                                f"{'stock' if a is None else 'patched'} kernel")
            elif a[0] != b[0] or selftest_shape(a[1]) != selftest_shape(b[1]):
                problems.append(f"selftest stock {mode}: the patched kernel gave exit {b[0]} "
                                f"{selftest_shape(b[1])}, the stock one exit {a[0]} "
                                f"{selftest_shape(a[1])}")
        print("  the stock build's results on the stock and the patched kernel "
              f"{'differ' if any('selftest stock' in p for p in problems) else 'are the same'}")
    if not done:
        problems.append("the patched guest never printed UMN-GUEST-DONE")
    problems += [f"guest kernel: {line}" for line in dmesg_bad]
    print("\npatched kernel (kernel/patches/uffd-remove-done/)")
    own = {t: r for (i, t), r in results.items() if i == "patched"}
    for t, r in sorted(own.items()):
        print(f"  {t} {r}")
        if r != "PASS":
            problems.append(f"{t}: {r}")
    if len(own) < 4:
        problems.append(f"uffd_remove_done reported {len(own)} of 4 results")
    for prog in ("uffd_remove_done", "remove_stress"):
        if codes.get(("patched", prog)) != "0":
            problems.append(f"patched: {prog} exit {codes.get(('patched', prog))}")
    for line in stress:
        print(line)
    if results.get(("preload", "remove_stress/madvise_vs_register")) != "PASS":
        problems.append("patched: the 2010 REMOVE stress through the preload found a stale hit")
    problems += judge_race("patched (signal off)", parse_races(log).get("patched"), True, True)
    print("\npatched kernel (kernel/patches/mmu-notifier-trace/): the tracepoints, the module, "
          "userfaultfd")
    problems += judge_patched_designs(log, codes, coverage, designs)
    if problems:
        print("\nkernel/ci.sh (patched): FAIL")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("\nkernel/ci.sh (patched): the patch's test passes; 0 stale uses, every REMOVE ended "
          "by the kernel; the tracepoint backend sees every kind with 0 stale uses")
    return 0


# What the debug guest (kernel/debug.config) runs against the module, and the checkers' words.
# account: the per-user region limit and the memory cgroup's charge (issue 40); fuzz: the random
# syscall fuzzer as uid 65534 (its seed is printed in a UMN-FUZZ line).
DEBUG_PROGRAMS = PROGRAMS + [("lifecycle", "lifecycle/"), ("account", "account/"),
                             ("fuzz", "fuzz/")]
DEBUG_CHECKERS = ("lockdep", "kmemleak", "kasan")
DEBUG_REPORT = re.compile(
    r"\bBUG\b|WARNING|Oops|general protection|KASAN|locking correctness|INFO:")


def debug_main(log, expected_path):
    """The debug guest: the module's suite, REMOVE stress and teardown tests under lockdep,
    kmemleak and KASAN. Fails on a test the module fails (beyond its listed divergences), a
    program that did not finish, a checker that was not on, any lockdep/KASAN/BUG/WARNING line
    in dmesg, lockdep having turned itself off, or any kmemleak report."""
    results, done, module_loaded, dmesg_bad, _, stress, exits, codes, _, _ = parse_log(log)
    expected = parse_expected(expected_path)
    lines = open(log, encoding="utf-8", errors="replace").read().splitlines()
    problems = []
    if not done:
        problems.append("the debug guest never printed UMN-GUEST-DONE (crash, hang or cut short)")
    if not module_loaded:
        problems.append("the module was not loaded in the debug guest")
    problems += [f"guest kernel: {line}" for line in dmesg_bad if "CPUs" in line]
    reports = [line for line in lines if line.startswith("UMN-DMESG ") and DEBUG_REPORT.search(line)]
    problems += [f"guest kernel: {line}" for line in reports]
    for checker in DEBUG_CHECKERS:
        if f"UMN-DEBUG {checker} on" not in lines:
            problems.append(f"{checker} was not on in the debug kernel")
    if "UMN-DEBUG debug_locks:1" not in lines:
        problems.append("lockdep was off at the end (debug_locks != 1: it reported something)")
    if "UMN-DEBUG kmemleak scanned" not in lines:
        problems.append("kmemleak was never scanned")
    leaks = [line for line in lines if line.startswith("UMN-KMEMLEAK ")]
    if leaks:
        problems.append(f"kmemleak: {sum('unreferenced object' in l for l in leaks)} "
                        "unreferenced objects")
    print("\ndebug kernel (lockdep, kmemleak, KASAN): the module")
    for prog, prefix in DEBUG_PROGRAMS:
        if codes.get(("module", prog)) is None:
            problems.append(f"module: {prog} never finished")
        own = {t: r for (i, t), r in results.items() if i == "module" and t.startswith(prefix)}
        if not own:
            problems.append(f"module: {prog} reported no result")
        for t, r in sorted(own.items()):
            want = expected[t][0] if t in expected else "PASS"
            if not matches(r, want):
                problems.append(f"module: {t}: {r} (want {want})")
        print(f"  {prog:<14} {sum(r == 'PASS' for r in own.values())}/{len(own)} pass, "
              f"exit {codes.get(('module', prog))}")
    for line in stress:
        print(f"  {line}")
    for line in reports + leaks[:40]:
        print(f"  {line}")
    if problems:
        print("\nkernel/ci.sh (debug): FAIL")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("\nkernel/ci.sh (debug): no lockdep, KASAN or kmemleak report")
    return 0


def parse_expected(path):
    expected = {}
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            sys.exit(f"{path}:{n}: want 4 tab-separated fields: test, module, preload, why")
        test, module, preload, why = fields
        expected[test] = (module, preload, why)
    return expected


def matches(result, listed):
    """listed: alternatives separated by "|" with no space around it (a check's expression may
    hold " | "); one ending in "*" matches any result it prefixes (for the preload's
    timing-dependent counter, whose first failed check varies by run)."""
    for alt in re.split(r"(?<! )\|(?! )", listed):
        if alt == result or (alt.endswith("*") and result.startswith(alt[:-1])):
            return True
    return False


def main():
    if sys.argv[1] == "--debug":
        return debug_main(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "--patched":
        return patched_main(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    log, expected_path = sys.argv[1], sys.argv[2]
    (results, done, module_loaded, dmesg_bad, bench, stress, exits, codes, coverage,
     designs) = parse_log(log)
    expected = parse_expected(expected_path)
    problems = []
    if not done:
        problems.append("the guest never printed UMN-GUEST-DONE (crash, hang or cut short)")
    if not module_loaded:
        problems.append("the module was not loaded in the guest")
    problems += [f"guest kernel: {line}" for line in dmesg_bad]
    problems += judge_selftest(*parse_selftest(log), "stock", "stock")
    # The C library's own smoke test runs once (userfaultfd underneath): it must pass.
    capi = {t: r for (i, t), r in results.items() if i == "capi"}
    if ("capi", "capi_smoke") not in exits or not capi:
        problems.append("capi: capi_smoke never finished or reported no result")
    problems += [f"{t} (C library): {r}" for t, r in sorted(capi.items()) if r != "PASS"]
    for t, r in sorted(capi.items()):
        print(f"C library in the guest: {t} {r}")
    tests = sorted({t for (i, t) in results if i != "capi"})
    for impl in ("preload", "module"):
        for prog, prefix in PROGRAMS:
            if (impl, prog) not in exits:
                problems.append(f"{impl}: {prog} never finished")
            if not any(i == impl and t.startswith(prefix) for (i, t) in results):
                problems.append(f"{impl}: {prog} reported no result")
    if not tests:
        problems.append("no UMN-RESULT lines at all")
    width = max([len(t) for t in tests] + [10])
    print(f"\n{'test':<{width}}  {'module':<8} preload")
    for test in tests:
        mod = results.get(("module", test))
        pre = results.get(("preload", test))
        note = ""
        if mod is None or pre is None:
            problems.append(f"{test}: no result for {'module' if mod is None else 'preload'}")
        elif test in expected:
            want_mod, want_pre, why = expected[test]
            if matches(mod, want_mod) and matches(pre, want_pre):
                kind = "expected divergence" if mod != pre else "listed race, not hit this run"
                note = f"  [{kind}: {why}]"
            elif mod == pre:
                problems.append(
                    f"{test}: listed divergence no longer differs (both {mod!r}); "
                    "remove it from kernel/expected-divergences.txt")
            else:
                problems.append(
                    f"{test}: differs, but not as listed: module {mod!r} (listed {want_mod!r}), "
                    f"preload {pre!r} (listed {want_pre!r})")
        elif mod != "PASS":
            problems.append(f"{test}: the module (the reference) gives {mod!r}")
        elif pre != mod:
            problems.append(f"{test}: new difference: module {mod!r}, preload {pre!r}")
        print(f"{test:<{width}}  {(mod or '-').split(' ')[0]:<8} {(pre or '-').split(' ')[0]}{note}")
    for test in sorted(set(expected) - set(tests)):
        problems.append(f"{test}: listed in kernel/expected-divergences.txt but never ran")
    for line in stress:
        print(line)
    if module_loaded:
        if codes.get(("kernel", "kernel_backend")) != "0":
            problems.append("the kernel backend's Rust tests (kernel_backend) failed or never ran: "
                            f"exit {codes.get(('kernel', 'kernel_backend'))}")
        races = parse_races(log)
        problems += judge_race("stock", races.get("stock"), True, want_confirmed=True)
        problems += judge_race("stock-nosignal", races.get("stock-nosignal"), False)
        problems += judge_race("kernel", races.get("kernel"), True)
        for backend in COVERAGE_BACKENDS:
            problems += judge_coverage(backend, coverage.get(backend),
                                       codes.get((backend, "coverage")))
    if bench:
        print_bench(bench)
    if designs:
        print_designs(designs)
    if bench and codes.get(("designs", "umn_designs")) != "0":
        problems.append(f"umn designs failed or never ran: exit {codes.get(('designs', 'umn_designs'))}")
    if problems:
        print("\nkernel/ci.sh: FAIL")
        for p in problems:
            print(f"  - {p}")
        return 1
    n = len(tests)
    print(f"\nkernel/ci.sh: {n} tests, module and preload agree except "
          f"{sum(1 for t in tests if t in expected)} listed divergences")
    return 0


def judge_coverage(backend, report, code):
    """Prints `umn coverage --backend BACKEND`'s table; returns the problems."""
    if not isinstance(report, dict):
        return [f"coverage {backend}: no report (exit {code}): {str(report)[:200]!r}"]
    problems = []
    print(f"\numn coverage --backend {backend} (in the guest; exit {code})")
    print(f"{'kind':<22} {'detected':<12} {'expected':<9} {'stale':<6} notes")
    for case in report["cases"]:
        kind = case["kind"]
        if case["inconclusive"]:
            detected = "inconclusive"
            note = case["reason"] or ""
            if kind not in GUEST_LACKS:
                problems.append(f"coverage {backend}: {kind} could not run: {note}")
            else:
                note = f"{GUEST_LACKS[kind]} ({note})"
        else:
            detected = "yes" if case["detected"] else ("NO" if case["expected"] else "no (missed)")
            note = "; ".join(case["problems"] or case["notes"])
            failed = (case["problems"] or (case["expected"] and not case["detected"])
                      or (case["expected"] and case["stale_uses"] > 0))
            refused = GUEST_REFUSES.get((backend, kind))
            if refused and any("refuses this mapping" in n for n in case["notes"]):
                note = f"{refused} ({note})"
            if failed:
                problems.append(f"coverage {backend}: {kind}: detected={case['detected']} "
                                f"stale={case['stale_uses']} problems={case['problems']}")
        print(f"{kind:<22} {detected:<12} {'yes' if case['expected'] else 'no':<9} "
              f"{case['stale_uses']:<6} {note}")
    if code not in ("0", "3"):
        problems.append(f"coverage {backend}: umn exited {code}")
    return problems


def print_designs(rows):
    """UMN-DESIGN <design> <op> <ticks> <base ticks> <ratio>"""
    designs, ops, cell = [], [], {}
    for design, op, ticks, base, ratio in rows:
        if design not in designs:
            designs.append(design)
        if op not in ops:
            ops.append(op)
        cell[(design, op)] = float(ratio)
    print("\numn designs (emulated guest, QEMU TCG; each design's ratio to its own baseline)")
    print(f"{'operation':<30}" + "".join(f"{d:>10}" for d in designs))
    for op in ops:
        print(f"{op:<30}" + "".join(
            f"{cell[(d, op)]:>10.2f}" if (d, op) in cell else f"{'-':>10}" for d in designs))


def print_bench(lines):
    """UMN-BENCH <impl> <op> ns=<median> base=<baseline op> base_ns=<median>"""
    rows = {}
    for line in lines:
        fields = line.split()
        impl, op = fields[1], fields[2]
        kv = dict(f.split("=", 1) for f in fields[3:] if "=" in f)
        rows.setdefault(op, {})[impl] = kv
    print("\nbenchmark (emulated guest, QEMU TCG; TSC ticks, compare ratios only)")
    impls = sorted({i for r in rows.values() for i in r})
    both = "module" in impls and "preload" in impls
    print(f"{'operation':<34}" + "".join(f"{i + ' tsc':>14}{i + ' ×base':>16}" for i in impls)
          + (f"{'preload/module':>16}" if both else ""))
    for op, r in rows.items():
        cells = ""
        for i in impls:
            kv = r.get(i)
            if kv is None or "ns" not in kv:
                cells += f"{(kv or {}).get('error', '-'):>14}{'':>16}"
                continue
            ratio = ""
            if float(kv.get("base_ns", 0)) > 0:
                ratio = f"{float(kv['ns']) / float(kv['base_ns']):.2f}"
            cells += f"{kv['ns']:>14}{ratio:>16}"
        if both:
            m, p = r.get("module", {}), r.get("preload", {})
            if "ns" in m and "ns" in p and float(m["ns"]) > 0:
                cells += f"{float(p['ns']) / float(m['ns']):>16.2f}"
        print(f"{op:<34}{cells}")


if __name__ == "__main__":
    sys.exit(main())
