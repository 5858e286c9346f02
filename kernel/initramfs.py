"""What the guests' initramfs packers share (kernel/rxe/pack.py, kernel/mpi/pack.py): a merged-/usr
root like Debian's (/bin, /lib, ... are links into /usr), host files copied to the same paths,
the ldd closure of the ELF files among them, busybox, and the gzip'd cpio image."""
import os
import shutil
import subprocess
import sys


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def make_root(root, extra_dirs=()):
    """A fresh, empty root with Debian's merged /usr."""
    shutil.rmtree(root, ignore_errors=True)
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "proc", "sys", "dev", "tmp", "etc",
              "root", "run", *extra_dirs):
        os.makedirs(f"{root}/{d}", exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):
        os.symlink(target, f"{root}/{link}")


def copy(root, src, dest):
    """Copies src (following links) to root+dest unless something is there; whether it did."""
    target = root + dest
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target):
        return False
    shutil.copy2(os.path.realpath(src), target)
    return True


def ldd(path, env, skip):
    """The libraries `path` loads, by ldd under `env`; `skip(name, resolved)` leaves one out.
    A library ldd can not find ends the packing."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
    libs = []
    for line in out.splitlines():
        f = line.split()
        if "=>" in f:
            i = f.index("=>")
            if skip(f[0], f[i + 1]):
                continue
            if f[i + 1] == "not":
                sys.exit(f"pack.py: {path}: {f[0]} not found")
            if f[i + 1].startswith("/"):
                libs.append(f[i + 1])
        elif f and f[0].startswith("/"):
            libs.append(f[0])  # the dynamic loader
    return libs


def closure(root, elves, env, skip=lambda name, lib: False):
    """Copies every library the ELF files `elves` load, and theirs, to their host paths."""
    elves, seen = list(elves), set()
    while elves:
        for lib in ldd(elves.pop(), env, skip):
            if lib in seen:
                continue
            seen.add(lib)
            if copy(root, lib, lib):
                elves.append(lib)


def finish(root, out, applets, etc):
    """busybox and its `applets`, root's passwd and group and the files of `etc` (name: text)
    under /etc; then the image at `out`. Prints the file count and sizes."""
    shutil.copy2("/bin/busybox", f"{root}/usr/bin/busybox")
    for app in applets:
        if not os.path.lexists(f"{root}/usr/bin/{app}"):
            os.symlink("busybox", f"{root}/usr/bin/{app}")
    files = {"passwd": "root:x:0:0:root:/root:/bin/sh\n", "group": "root:x:0:\n", **etc}
    for name, text in files.items():
        with open(f"{root}/etc/{name}", "w") as f:
            f.write(text)
    cpio = subprocess.run(f"cd {root} && find . | cpio -o -H newc --quiet", shell=True,
                          check=True, capture_output=True).stdout
    gz = subprocess.run(["gzip", "-1"], input=cpio, check=True, capture_output=True).stdout
    with open(out, "wb") as f:
        f.write(gz)
    n = sum(len(fs) for _, _, fs in os.walk(root))
    print(f"pack.py: {n} files, cpio {len(cpio) / 1e6:.1f} MB, gzip -1 {len(gz) / 1e6:.1f} MB",
          file=sys.stderr)
