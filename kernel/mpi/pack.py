#!/usr/bin/env python3
"""The two-node MPI guests' initramfs (one image, both nodes): busybox, the files of Debian's
rdma-core, libfabric and Open MPI packages (plug-in directories, help texts and configuration
included, which an ldd closure alone would miss), the ldd closure of every ELF among them, at
the host's paths (merged /usr), Debian's MPICH with UMN_MPI_MPICH=1, the test's programs,
and the project's Debian package installed with `dpkg --root` (the job then finds ummunotify
at the package's paths only).

Usage: pack.py OUT.gz ROOT DEB PROGRAM... (each PROGRAM is SRC or SRC=DEST, DEST defaulting to
/usr/bin/<name>). Prints the file count and sizes."""
import os
import shutil
import subprocess
import sys

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


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def main():
    out, root, deb, programs = (os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]),
                                sys.argv[3], sys.argv[4:])
    shutil.rmtree(root, ignore_errors=True)
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "proc", "sys", "dev", "tmp", "etc",
              "root", "run", "var/tmp", "var/lib/dpkg/info", "var/lib/dpkg/updates"):
        os.makedirs(f"{root}/{d}", exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):
        os.symlink(target, f"{root}/{link}")
    # The project's package, as a site installs it (its own dpkg status file in the image).
    open(f"{root}/var/lib/dpkg/status", "w").close()
    subprocess.run(["dpkg", f"--root={root}", "--force-depends", "--force-script-chrootless",
                    "--no-triggers", "-i", deb], check=True, stdout=sys.stderr)
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
    done = set()
    while elves:
        e = elves.pop()
        if e in done:
            continue
        done.add(e)
        r = subprocess.run(["ldd", e], capture_output=True, text=True, env=env)
        for line in r.stdout.split("\n"):
            f = line.split()
            lib = None
            if "=>" in f:
                i = f.index("=>")
                if f[i + 1] == "not":
                    sys.exit(f"pack.py: {e}: {f[0]} not found")
                lib = f[i + 1] if f[i + 1].startswith("/") else None
            elif f and f[0].startswith("/"):
                lib = f[0]
            if not lib or lib.startswith(root):
                continue
            d = root + lib
            if not os.path.lexists(d):
                os.makedirs(os.path.dirname(d), exist_ok=True)
                shutil.copy2(os.path.realpath(lib), d)
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
        f.write("127.0.0.1 localhost\n10.22.0.1 node0\n10.22.0.2 node1\n")
    with open(f"{root}/etc/nsswitch.conf", "w") as f:
        f.write("passwd: files\ngroup: files\nhosts: files\n")
    cpio = subprocess.run(f"cd {root} && find . | cpio -o -H newc --quiet", shell=True,
                          check=True, capture_output=True).stdout
    gz = subprocess.run(["gzip", "-1"], input=cpio, check=True, capture_output=True).stdout
    with open(out, "wb") as f:
        f.write(gz)
    n = sum(len(fs) for _, _, fs in os.walk(root))
    print(f"pack.py: {n} files, cpio {len(cpio) / 1e6:.1f} MB, gzip -1 {len(gz) / 1e6:.1f} MB",
          file=sys.stderr)


main()
