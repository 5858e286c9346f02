#!/usr/bin/env python3
"""The peers guest's initramfs (kernel/peers/run.sh): busybox, bash (kdreg2's test scripts are
bash), the test programs and the peers (libfabric 2.6.0, fabtests, kdreg2's module and tests) at
the paths given, rdma-core's rxe provider and `rdma` tool, and the ldd closure of every ELF file
among them at the host's paths (kernel/initramfs.py). Programs are linked with RUNPATHs into the
peers' cache, so Debian's libfabric 1.17 and libfabric 2.6.0 (both libfabric.so.1) each land where
their programs look; ldd runs with no LD_LIBRARY_PATH for that reason.

Usage: pack.py OUT.gz ROOT FILE... (each FILE is SRC or SRC=DEST; DEST defaults to /bin/<name>)."""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from initramfs import closure, copy, finish, is_elf, make_root  # noqa: E402

ARCH = "/usr/lib/x86_64-linux-gnu"
HOST_FILES = ["/etc/libibverbs.d/rxe.driver", ARCH + "/libibverbs/librxe-rdmav34.so",
              "/usr/bin/rdma", "/usr/bin/bash"]
APPLETS = ("sh mount umount insmod rmmod lsmod env sed cut ls dmesg grep nproc uname cat echo ip "
           "sleep mkdir timeout awk tr wc head tail hostname date rm cp seq realpath dirname "
           "basename stat kill killall ps").split()


def main():
    out, root, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    make_root(root)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    # The project's own libraries are given at their guest paths (/lib); ldd finds them there.
    env["LD_LIBRARY_PATH"] = ":".join(sorted({os.path.dirname(f.split("=")[0]) for f in files
                                              if "libummunotify" in f}))
    elves = []
    for f in files + HOST_FILES:
        src, _, dest = f.partition("=")
        dest = dest or ("/bin/" + os.path.basename(src) if f not in HOST_FILES else src)
        if not os.path.exists(src):
            sys.exit(f"pack.py: {src} missing")
        copy(root, src, dest)
        if is_elf(src):
            elves.append(src)
    closure(root, elves, env, skip=lambda name, lib: name.startswith("libummunotify"))
    finish(root, out, APPLETS, {"hosts": "127.0.0.1 localhost\n10.0.2.15 guest\n"})


main()
