# Spack recipe for ummunotify (a package repository of its own: packaging/spack).
#
#   spack repo add packaging/spack
#   spack install ummunotify              # the tagged release
#   spack dev-build ummunotify@main       # from a local clone, in its directory
#
# packaging/spack/check.sh validates it with a Spack checkout (spack audit, spack style, spack
# info) offline.
from spack.package import *


class Ummunotify(Package):
    """Tells a process when the memory mappings behind ranges it registered change (munmap,
    mremap, madvise, MAP_FIXED over, and more), so that registration caches of RDMA stacks
    (libfabric, UCX, MPI) never hand a NIC a stale registration. Installs the C library
    (libummunotify.so.0, ummunotify.h, ummunotify.pc), the 2010 ummunotify ABI preload
    libummunotify-compat.so, libfabric's memory monitor libummunotify-fabric.so and the umn
    tool."""

    homepage = "https://github.com/ummunotify/ummunotify"
    url = "https://github.com/ummunotify/ummunotify/archive/refs/tags/v0.1.0.tar.gz"
    git = "https://github.com/ummunotify/ummunotify.git"

    license("MIT OR Apache-2.0")

    version("main", branch="main")

    # Cargo.toml's rust-version. The workspace is built by cargo (not CargoPackage: its
    # `cargo install --path .` needs a package at the root, and this root is a workspace).
    depends_on("rust@1.85:", type="build")
    depends_on("pkgconfig", type="build")
    # The libfabric monitor loads libfabric at run time (1.13 or newer has the import API); it
    # does nothing where libfabric is absent.
    variant("fabric", default=True, description="Depend on libfabric (the monitor's host)")
    depends_on("libfabric@1.13:", type="run", when="+fabric")

    conflicts("platform=darwin", msg="ummunotify watches Linux memory mappings")
    conflicts("platform=windows", msg="ummunotify watches Linux memory mappings")

    packages = ("ummunotify-capi", "ummunotify-compat", "ummunotify-fabric", "umn")

    def install(self, spec, prefix):
        cargo = which("cargo", required=True)
        target = join_path(self.stage.source_path, "target")
        args = ["build", "--release", "--locked", "--target-dir", target]
        for p in self.packages:
            args += ["-p", p]
        cargo(*args)
        release = join_path(target, "release")
        sh = which("sh", required=True)
        env["LIBDIR"] = prefix.lib
        sh("crates/ummunotify-capi/install.sh", "--from", release, prefix)
        sh("crates/ummunotify-fabric/install.sh", "--from", release, prefix)
        mkdirp(prefix.bin)
        install(join_path(release, "umn"), prefix.bin)
        mkdirp(prefix.share.ummunotify)
        install("packaging/systemd/umn-daemon.service", prefix.share.ummunotify)

    @run_after("install")
    @on_package_attributes(run_tests=True)
    def check_install(self):
        # The tests need root and kernel features; here, that the installed tool runs.
        Executable(self.prefix.bin.umn)("--help", output=str)
