#!/usr/bin/env python3
"""The soft-RoCE guest's initramfs: busybox, the test programs, the host's rdma-core pieces that
libibverbs loads by path (the rxe provider and its .driver file), the `rdma` tool, UCX's
transport modules, and the ldd closure of every ELF among them, at the host's paths (Debian's
merged /usr: /lib, /bin are links into /usr), so that libibverbs and UCX find their plug-ins
where they were built to look.

Usage: pack.py OUT.gz ROOT PROGRAM... (each PROGRAM is SRC or SRC=DEST; DEST defaults to
/bin/<name>). Prints the file count and sizes."""
import os
import shutil
import subprocess
import sys

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


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def copy(root, src, dest):
    """Copies src (following links) to root+dest, keeping the name's own symlink chain."""
    target = root + dest
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target):
        return False
    shutil.copy2(os.path.realpath(src), target)
    return True


def ldd(path, env):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
    libs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0].startswith("libummunotify"):
            continue  # the project's own libraries: in the program list, at their guest paths
        if "=>" in f:
            i = f.index("=>")
            if f[i + 1] == "not":
                sys.exit(f"pack.py: {path}: {f[0]} not found")
            if f[i + 1].startswith("/"):
                libs.append(f[i + 1])
        elif f and f[0].startswith("/"):
            libs.append(f[0])  # the dynamic loader
    return libs


def main():
    out, root, programs = sys.argv[1], sys.argv[2], sys.argv[3:]
    shutil.rmtree(root, ignore_errors=True)
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "proc", "sys", "dev", "tmp", "etc",
              "root", "run"):
        os.makedirs(f"{root}/{d}", exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):
        os.symlink(target, f"{root}/{link}")
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
    seen = set()
    while elves:
        e = elves.pop()
        for lib in ldd(e, env):
            if lib in seen:
                continue
            seen.add(lib)
            if copy(root, lib, lib):
                elves.append(lib)
    shutil.copy2("/bin/busybox", f"{root}/usr/bin/busybox")
    for app in BUSYBOX_APPLETS:
        if not os.path.lexists(f"{root}/usr/bin/{app}"):
            os.symlink("busybox", f"{root}/usr/bin/{app}")
    with open(f"{root}/etc/passwd", "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(f"{root}/etc/group", "w") as f:
        f.write("root:x:0:\n")
    with open(f"{root}/etc/hosts", "w") as f:
        f.write("127.0.0.1 localhost\n10.0.2.15 guest\n")
    cpio = subprocess.run(f"cd {root} && find . | cpio -o -H newc --quiet", shell=True,
                          check=True, capture_output=True).stdout
    gz = subprocess.run(["gzip", "-1"], input=cpio, check=True, capture_output=True).stdout
    with open(out, "wb") as f:
        f.write(gz)
    n = sum(len(files) for _, _, files in os.walk(root))
    print(f"pack.py: {n} files, cpio {len(cpio) / 1e6:.1f} MB, gzip -1 {len(gz) / 1e6:.1f} MB",
          file=sys.stderr)


main()
