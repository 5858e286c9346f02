#!/usr/bin/env python3
"""The soft-RoCE guest's initramfs: busybox, the test programs, the host's rdma-core pieces that
libibverbs loads by path (the rxe provider and its .driver file), the `rdma` tool, UCX's
transport modules, and the ldd closure of every ELF among them, at the host's paths (Debian's
merged /usr: /lib, /bin are links into /usr), so that libibverbs and UCX find their plug-ins
where they were built to look.

Usage: pack.py OUT.gz ROOT PROGRAM... (each PROGRAM is SRC or SRC=DEST; DEST defaults to
/bin/<name>). Prints the file count and sizes."""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from initramfs import closure, copy, finish, is_elf, make_root  # noqa: E402

ARCH = "/usr/lib/x86_64-linux-gnu"
# Files loaded by path at run time (dlopen by directory scan or configuration), not by ldd.
HOST_FILES = [
    "/etc/libibverbs.d/rxe.driver",
    ARCH + "/libibverbs/librxe-rdmav34.so",
    "/usr/bin/rdma",
    ARCH + "/ucx/libuct_ib.so.0",
    ARCH + "/ucx/libuct_rdmacm.so.0",
    ARCH + "/ucx/libuct_cma.so.0",
]
BUSYBOX_APPLETS = ("sh mount umount insmod rmmod env sed cut ls dmesg grep nproc uname cat echo "
                   "ip sleep mkdir timeout awk tr wc head tail hostname date rm cp seq").split()


def main():
    out, root, programs = sys.argv[1], sys.argv[2], sys.argv[3:]
    make_root(root)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(sorted({os.path.dirname(p.split("=")[0]) for p in programs}))
    elves = []
    for p in programs:
        src, _, dest = p.partition("=")
        dest = dest or "/bin/" + os.path.basename(src)
        copy(root, src, dest)
        if is_elf(src):
            elves.append(src)
    for f in HOST_FILES:
        if not os.path.exists(f):
            sys.exit(f"pack.py: {f} missing (apt-get install ibverbs-providers iproute2 libucx0)")
        copy(root, f, f)
        if is_elf(f):
            elves.append(f)
    # The project's own libraries are in the program list, at their guest paths.
    closure(root, elves, env, skip=lambda name, lib: name.startswith("libummunotify"))
    finish(root, out, BUSYBOX_APPLETS, {"hosts": "127.0.0.1 localhost\n10.0.2.15 guest\n"})


main()
