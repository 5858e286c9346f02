#!/usr/bin/env python3
"""Applies a unit's syscall sandbox to this process, then execs a program (packaging/systemd/check.sh).

    sandbox.py UNIT -- PROGRAM ARGS...

systemd is not PID 1 where CI runs, so check.sh emulates the unit: setpriv gives the user and the
capabilities, unshare the read-only mounts and the network namespace, and this the seccomp parts,
computed from the unit's own lines with systemd's own group tables (`systemd-analyze
syscall-filter`):
  SystemCallFilter=         the allow list, its ~ removals and additions in the unit's order
  SystemCallErrorNumber=    the errno of a denied call (default: kill, as systemd)
  SystemCallArchitectures=native   any other audit arch is killed (x32 numbers too)
  RestrictAddressFamilies=  socket(2) with another family fails with EAFNOSUPPORT
  MemoryDenyWriteExecute=   prctl(PR_SET_MDWE, REFUSE_EXEC_GAIN) (Linux 6.3+: the same rule,
                            enforced by the kernel instead of systemd's mmap/mprotect filter)
  NoNewPrivileges=          prctl(PR_SET_NO_NEW_PRIVS) (seccomp needs it without CAP_SYS_ADMIN)
Not emulated: the argument filters of RestrictNamespaces, RestrictRealtime, RestrictSUIDSGID and
LockPersonality (the calls themselves are allowed or denied by the list as systemd's are).
"""
import ctypes
import errno
import os
import re
import struct
import subprocess
import sys

unit, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
lines = [ln.strip() for ln in open(unit) if not ln.lstrip().startswith("#")]
setting = lambda key: [ln.split("=", 1)[1].split() for ln in lines if ln.startswith(key + "=")]

# systemd's groups, from systemd-analyze (the version that will run the unit).
groups, cur = {}, None
for ln in subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True,
                         check=True).stdout.splitlines():
    if ln.startswith("@"):
        cur = groups.setdefault(ln.strip(), [])
    elif cur is not None and ln.strip() and not ln.strip().startswith("#"):
        cur.append(ln.strip())


def expand(name, seen=()):
    if not name.startswith("@"):
        return {name}
    out = set()
    for m in groups[name]:
        if m not in seen:
            out |= expand(m, seen + (name,))
    return out


nrs = {}
for ln in open("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"):
    m = re.match(r"#define __NR_(\w+)\s+(\d+)", ln)
    if m:
        nrs[m.group(1)] = int(m.group(2))

allow = None
for words in setting("SystemCallFilter"):
    deny = words[0].startswith("~")
    names = set().union(*(expand(w.lstrip("~")) for w in words))
    if allow is None:
        assert not deny, "emulated only as an allow list"
        allow = names
    elif deny:
        allow -= names
    else:
        allow |= names
assert allow, "no SystemCallFilter= in " + unit
allowed = sorted(nrs[n] for n in allow if n in nrs)
err = setting("SystemCallErrorNumber")
AF = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}
families = [AF[f] for words in setting("RestrictAddressFamilies") for f in words]

RET_KILL, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
deny_ret = RET_ERRNO | getattr(errno, err[0][0]) if err else RET_KILL
LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
prog = [(LD, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, RET_KILL),  # arch: native only
        (LD, 0, 0, 0), (JGE, 0, 1, 0x40000000), (RET, 0, 0, RET_KILL)]  # no x32 numbers
if families and "socket" in allow:
    # socket(2): its family (args[0], low word) must be listed.
    prog += [(JEQ, 0, len(families) + 3, nrs["socket"]), (LD, 0, 0, 16)]
    prog += [(JEQ, len(families) - i, 0, f) for i, f in enumerate(families)]
    prog += [(RET, 0, 0, RET_ERRNO | errno.EAFNOSUPPORT), (RET, 0, 0, RET_ALLOW), (LD, 0, 0, 0)]
for nr in allowed:  # (jump offsets are 8 bits: one ALLOW per listed call)
    prog += [(JEQ, 0, 1, nr), (RET, 0, 0, RET_ALLOW)]
prog.append((RET, 0, 0, deny_ret))
assert len(prog) < 4096

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_MDWE = 38, 22, 65


def prctl(*a):
    if libc.prctl(*[ctypes.c_ulong(x) if isinstance(x, int) else x for x in a]) != 0:
        e = ctypes.get_errno()
        sys.exit(f"sandbox.py: prctl{a[:1]}: {os.strerror(e)}")


if setting("MemoryDenyWriteExecute") == [["yes"]]:
    prctl(PR_SET_MDWE, 1, 0, 0, 0)
prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
buf = ctypes.create_string_buffer(raw)


class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


fp = Fprog(len(prog), ctypes.addressof(buf))
prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fp), 0, 0)
os.execv(argv[0], argv)
