#!/usr/bin/env python3
"""Judges the two-node MPI guests' serial logs (kernel/mpi/run.sh): node0's holds every result.

Usage: verdict.py NODE0_LOG NODE1_LOG JOBS   (JOBS: the comma list run.sh passed to the guests)

Fails (exit 1) when a node booted with fewer than 2 CPUs or without an ACTIVE rxe0; when the
link checks (rsh, ibv_rc_pingpong, rping across) failed; when a job did not exit 0 or a rank
did not print its MPI-RANK ... done line from its own node; when a result line is missing; when
the hazard job with ummunotify as libfabric's monitor saw a wrong byte, replaced memory at
another address, or ran without the monitor started in both ranks; when the control (memhooks,
raw syscalls) saw no wrong byte (then the job did not exercise the cache at all); when a sweep
size is missing or came back wrong. MPICH's job (Debian's ch4:ucx, no ummunotify) is judged on
finishing and on its results being there; its wrong bytes are reported. Prints the tables
docs/MPI.md quotes."""
import re
import sys

WAYS = ["free-malloc", "munmap-mmap", "madv-dontneed", "mmap-fixed", "raw-munmap-mmap",
        "raw-madv-dontneed", "raw-mmap-fixed"]
RAW = [w for w in WAYS if w.startswith("raw-")]
SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20]


def kv(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def main():
    log0, log1, jobs = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3].split(",")
    fails = []
    for name, log in (("node0", log0), ("node1", log1)):
        m = re.search(r"MPI-NODE %s booted \S+, (\d+) CPUs" % name, log)
        if not m:
            fails.append(f"{name} did not boot (no MPI-NODE line)")
        elif int(m.group(1)) < 2:
            fails.append(f"{name} has {m.group(1)} CPU(s), not 2")
        if not re.search(r"MPI-DEVICE %s rxe0 \d+: ACTIVE" % name, log):
            fails.append(f"{name}: rxe0 not ACTIVE")
    if not re.search(r"MPI-LINK rsh node1 1 ", log0):
        fails.append("node1's shell unreachable from node0")
    for check in ("ping", "ibv_rc_pingpong", "rping"):
        if not re.search(r"MPI-EXIT %s 0$" % check, log0, re.M):
            fails.append(f"{check} node0 -> node1 failed")
    if "MPI-GUEST-DONE" not in log0:
        fails.append("node0 did not finish (no MPI-GUEST-DONE)")
    sweeps = {}
    for job in jobs:
        m = re.search(r"MPI-JOB %s begin.*?\n(.*?)MPI-JOB %s end" % (re.escape(job), re.escape(job)),
                      log0, re.S)
        if not m:
            fails.append(f"job {job}: no output")
            continue
        body = m.group(1)
        if not re.search(r"MPI-EXIT job-%s 0$" % re.escape(job), body, re.M):
            fails.append(f"job {job}: mpirun did not exit 0")
        for rank, node in ((0, "node0"), (1, "node1")):
            if not re.search(r"MPI-RANK rank=%d node=%s done" % (rank, node), body):
                fails.append(f"job {job}: rank {rank} on {node} did not finish")
        monitors = [kv(line) for line in re.findall(r"MPI-MONITOR (.*)", body)]
        umn = "ummunotify" in job
        if umn:
            if len(monitors) != 2 or any(
                    m.get("imported") != "1" or m.get("started") != "1" for m in monitors):
                fails.append(f"job {job}: ummunotify not started as the monitor in both ranks "
                             f"({monitors})")
        elif monitors:
            fails.append(f"job {job}: ummunotify loaded in a job without it")
        for mon in monitors:
            print(f"{job}: monitor rank {mon.get('rank')}: backend={mon.get('backend')} "
                  f"subscribes={mon.get('subscribes')} notifies={mon.get('notifies')} "
                  f"evictions={mon.get('evictions')}")
        if "hazard" in job:
            got = {kv(line)["way"]: kv(line) for line in re.findall(r"MPI-HAZARD (.*)", body)}
            print(f"\n{job}:\n| way | replaced | same address | wrong bytes | bytes received |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for w in WAYS:
                r = got.get(w)
                if not r:
                    fails.append(f"job {job}: no result for {w}")
                    continue
                print(f"| {w} | {r['replaced']} | {r['same_address']} | {r['wrong_bytes']} | "
                      f"{r['bytes']} |")
                if int(r["same_address"]) == 0:
                    fails.append(f"job {job}: {w} never gave the old address (not x == y)")
                if umn and int(r["wrong_bytes"]):
                    fails.append(f"job {job}: {w}: {r['wrong_bytes']} wrong bytes with "
                                 "ummunotify")
                if w != "free-malloc" and r["same_address"] != r["replaced"]:
                    fails.append(f"job {job}: {w}: same address {r['same_address']} of "
                                 f"{r['replaced']}")
            # The control: libfabric's memhooks (not UCX's hooks in MPICH's job: reported only).
            if job.startswith("hazard-memhooks") and got and all(int(got.get(w, {}).get("wrong_bytes", 0)) == 0
                                       for w in RAW):
                fails.append(f"job {job}: the control saw no wrong byte with raw syscalls: the "
                             "job did not exercise libfabric's MR cache")
        if job.startswith("sweep"):
            got = {int(kv(line)["size"]): kv(line) for line in re.findall(r"MPI-SWEEP (.*)", body)}
            for s in SIZES:
                if s not in got:
                    fails.append(f"job {job}: no sweep result for {s} B")
                elif int(got[s]["wrong_bytes"]):
                    fails.append(f"job {job}: {s} B came back with {got[s]['wrong_bytes']} "
                                 "wrong bytes")
            sweeps[job] = got
    # Ratios: each ummunotify sweep against the memhooks sweep of the same pair (same boot).
    pairs = sorted({j[len("sweep-memhooks"):] for j in sweeps if j.startswith("sweep-memhooks")})
    for p in pairs:
        a, b = sweeps.get("sweep-memhooks" + p), sweeps.get("sweep-ummunotify" + p)
        if not a or not b:
            continue
        print(f"\nsweep pair '{p or '1'}' (microseconds per round trip, iterations in brackets):")
        print("| size | memhooks | ummunotify | ummunotify / memhooks |")
        print("| ---: | ---: | ---: | ---: |")
        for s in SIZES:
            if s in a and s in b:
                ua, ub = float(a[s]["usec_per_rt"]), float(b[s]["usec_per_rt"])
                print(f"| {s} | {ua:.1f} ({a[s]['iters']}) | {ub:.1f} ({b[s]['iters']}) | "
                      f"{ub / ua:.2f} |")
    for line in re.findall(r"MPI-DMESG .*", log0):
        fails.append(f"kernel: {line}")
    print()
    if fails:
        for f in fails:
            print("FAIL:", f)
        sys.exit(1)
    print("verdict: ok")


main()
