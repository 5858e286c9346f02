//! End to end: `fi_mr_reg` through a libfabric provider that caches host memory, with ummunotify
//! imported as the monitor (`tests/c/mr_reg.c`: register, hit, munmap, map y == x, register:
//! must miss).
//!
//! Such providers (verbs, efa, cxi, opx) need RDMA hardware. Without an RDMA device the program
//! is still compiled (so it keeps building against the headers) but not run, and the test says
//! so: the one skip `UMN_REQUIRE_ALL=1` does not turn into a failure, because no kernel feature
//! is missing, only hardware. It runs on soft-RoCE in the guest of `kernel/rxe/run.sh`, where
//! `UMN_MR_REG_EXE` names the program built on the host (the guest has no compiler).
use std::path::{Path, PathBuf};

use ummunotify_testkit::{cprog, require::skip_or_fail};

fn rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn mr_reg_end_to_end_where_an_rdma_device_exists() {
    if let Some(exe) = std::env::var_os("UMN_MR_REG_EXE") {
        let devices = rdma_devices();
        assert!(
            !devices.is_empty(),
            "UMN_MR_REG_EXE is set (the guest) but there is no RDMA device"
        );
        eprintln!("RDMA devices: {devices:?}; program {exe:?}");
        assert!(
            cprog::run(Path::new(&exe), 120, &[]),
            "mr_reg: RDMA devices {devices:?} but no caching provider could be used"
        );
        return;
    }
    if !Path::new("/usr/include/rdma/fi_ext.h").exists() {
        skip_or_fail(
            "mr_reg",
            "libfabric headers (/usr/include/rdma/fi_ext.h: apt-get install libfabric-dev)",
        );
        return;
    }
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = cprog::build_lib("ummunotify-fabric", &crate_dir);
    let libdir = tmp.join("mr_reg");
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::copy(
        dir.join("libummunotify_fabric.so"),
        libdir.join("libummunotify-fabric.so"),
    )
    .expect("copy library");
    let exe = libdir.join("fabric-mr-reg");
    let include = format!("-I{}", crate_dir.join("include").display());
    let l = format!("-L{}", libdir.display());
    let rpath = format!("-Wl,-rpath,{}", libdir.display());
    cprog::gcc(
        &crate_dir.join("tests/c/mr_reg.c"),
        &exe,
        [
            include.as_str(),
            "-O0",
            l.as_str(),
            rpath.as_str(),
            "-lummunotify-fabric",
            "-lfabric",
        ],
    );
    let devices = rdma_devices();
    if devices.is_empty() {
        eprintln!(
            "**************** SKIP mr_reg end-to-end: no RDMA device (/sys/class/infiniband is \
             empty or absent), so no libfabric provider here caches host memory (verbs, efa, \
             cxi, opx need RDMA hardware). The program was built; it runs where a device \
             exists. This skip is not a failure under UMN_REQUIRE_ALL=1: hardware, not a \
             kernel feature, is missing."
        );
        return;
    }
    eprintln!("RDMA devices: {devices:?}");
    // A device exists: a provider that can not be opened or does not cache is a failure here.
    let passed = cprog::run(&exe, 120, &[]);
    assert!(
        passed,
        "mr_reg: RDMA devices {devices:?} but no caching provider could be used"
    );
}
