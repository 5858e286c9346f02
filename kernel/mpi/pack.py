#!/usr/bin/env python3
"""The two-node MPI guests' initramfs (one image, both nodes): busybox, the files of Debian's
rdma-core, libfabric and Open MPI packages (plug-in directories, help texts and configuration
included, which an ldd closure alone would miss), the ldd closure of every ELF among them, at
the host's paths (merged /usr), Debian's MPICH with UMN_MPI_MPICH=1, the test's programs,
and the project's Debian packages installed with `dpkg --root` (the job then finds ummunotify
at the packages' paths only).

Usage: pack.py OUT.gz ROOT DEB[,DEB...] PROGRAM... (each PROGRAM is SRC or SRC=DEST, DEST defaulting to
/usr/bin/<name>). Prints the file count and sizes."""
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from initramfs import closure, finish, is_elf, make_root  # noqa: E402

PKGS = ("libibverbs1 ibverbs-providers ibverbs-utils librdmacm1 rdmacm-utils libfabric1 "
        "openmpi-bin libopenmpi3 openmpi-common libpmix2 libucx0").split()
# Debian's MPICH (ch4:ucx) too, when the host has it: UMN_MPI_MPICH=1 (kernel/mpi/run.sh).
if os.environ.get("UMN_MPI_MPICH") == "1":
    PKGS += ["mpich", "libmpich12"]
SKIP = ("/usr/share/doc", "/usr/share/man", "/usr/share/locale", "/usr/share/lintian",
        "/usr/share/info", "/usr/share/bug", "/usr/include", "/usr/lib/x86_64-linux-gnu/pkgconfig",
        "/usr/share/bash-completion", "/usr/lib/systemd", "/lib/systemd", "/usr/share/zsh")
HOST_FILES = ["/usr/bin/rdma"]
BUSYBOX_APPLETS = ("sh mount umount insmod env sed cut ls dmesg grep nproc uname cat echo "
                   "sleep mkdir timeout awk tr wc head tail hostname date rm cp seq ping "
                   "kill ps true false ip").split()


def main():
    out, root, deb, programs = (os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]),
                                sys.argv[3], sys.argv[4:])
    # ummunotify-tools' postinst adds its user to the root's /etc (systemd-sysusers --root);
    # finish() writes the image's own passwd and group afterwards.
    make_root(root, ("var/tmp", "var/lib/dpkg/info", "var/lib/dpkg/updates"))
    # The project's packages, as a site installs them (its own dpkg status file in the image).
    open(f"{root}/var/lib/dpkg/status", "w").close()
    subprocess.run(["dpkg", f"--root={root}", "--force-depends", "--force-script-chrootless",
                    "--no-triggers", "-i", *deb.split(",")], check=True, stdout=sys.stderr)
    files = []
    for pkg in PKGS:
        lst = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True,
                             check=True).stdout
        files += [p for p in lst.split("\n") if p and not p.startswith(SKIP)]
    files += HOST_FILES
    elves, seen = [], set()
    queue = list(files)
    while queue:
        p = queue.pop()
        if p in seen or not os.path.lexists(p) or (os.path.isdir(p) and not os.path.islink(p)):
            continue
        seen.add(p)
        d = root + p
        os.makedirs(os.path.dirname(d), exist_ok=True)
        if os.path.lexists(d):
            continue
        if os.path.islink(p):
            t = os.readlink(p)
            if "alternatives" in t:  # /etc/alternatives is not packed: copy the file itself
                shutil.copy2(os.path.realpath(p), d)
                if is_elf(p):
                    elves.append(p)
                continue
            os.symlink(t, d)
            queue.append(os.path.normpath(os.path.join(os.path.dirname(p), t)))
            continue
        shutil.copy2(p, d)
        if is_elf(p):
            elves.append(p)
    for prog in programs:
        src, _, dest = prog.partition("=")
        dest = dest or "/usr/bin/" + os.path.basename(src)
        os.makedirs(os.path.dirname(root + dest), exist_ok=True)
        shutil.copy2(src, root + dest)
        if is_elf(src):
            elves.append(src)
    # ldd closure, with the package's libraries found where the package put them.
    env = dict(os.environ, LD_LIBRARY_PATH=root + "/usr/lib/x86_64-linux-gnu")
    closure(root, elves, env, skip=lambda name, lib: lib.startswith(root))
    finish(root, out, BUSYBOX_APPLETS, {
        "hosts": "127.0.0.1 localhost\n10.22.0.1 node0\n10.22.0.2 node1\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    })


main()
