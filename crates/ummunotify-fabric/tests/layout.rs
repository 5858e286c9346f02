//! The hand-written `#[repr(C)]` mirrors in `src/abi.rs` against the installed libfabric headers:
//! `tests/c/layout.c` prints what the C compiler sees, this test compares every size, offset and
//! constant. Needs `libfabric-dev` (`rdma/fi_ext.h`); CI installs it, so there a missing header
//! fails (`UMN_REQUIRE_ALL=1`).
use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use ummunotify_fabric::abi::*;
use ummunotify_testkit::{cprog, require::skip_or_fail};

/// The installed header (Debian: libfabric-dev).
const HEADER: &str = "/usr/include/rdma/fi_ext.h";

fn c_layout() -> Option<HashMap<String, i64>> {
    if !Path::new(HEADER).exists() {
        skip_or_fail(
            "layout",
            &format!("libfabric headers ({HEADER}: apt-get install libfabric-dev)"),
        );
        return None;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/layout.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fabric-layout");
    cprog::gcc(&src, &exe, ["-O0"]);
    let out = Command::new(&exe).output().expect("run layout program");
    assert!(out.status.success(), "layout program failed: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .map(|l| {
                // "<kind> <name, may contain spaces> <value>"
                let (_, rest) = l.split_once(' ').unwrap();
                let (name, value) = rest.rsplit_once(' ').unwrap();
                (name.to_owned(), value.parse().unwrap())
            })
            .collect(),
    )
}

#[test]
fn mirrors_match_the_installed_headers() {
    let Some(c) = c_layout() else { return };
    let rust: Vec<(&str, i64)> = vec![
        ("fid", size_of::<Fid>() as i64),
        ("fid.fclass", offset_of!(Fid, fclass) as i64),
        ("fid.context", offset_of!(Fid, context) as i64),
        ("fid.ops", offset_of!(Fid, ops) as i64),
        ("fi_ops", size_of::<FiOps>() as i64),
        ("fi_ops.size", offset_of!(FiOps, size) as i64),
        ("fi_ops.close", offset_of!(FiOps, close) as i64),
        ("fi_ops.bind", offset_of!(FiOps, bind) as i64),
        ("fi_ops.control", offset_of!(FiOps, control) as i64),
        ("fi_ops.ops_open", offset_of!(FiOps, ops_open) as i64),
        ("fi_ops.tostr", offset_of!(FiOps, tostr) as i64),
        ("fi_ops.ops_set", offset_of!(FiOps, ops_set) as i64),
        ("fi_ops_mem_monitor", size_of::<FiOpsMemMonitor>() as i64),
        (
            "fi_ops_mem_monitor.size",
            offset_of!(FiOpsMemMonitor, size) as i64,
        ),
        (
            "fi_ops_mem_monitor.start",
            offset_of!(FiOpsMemMonitor, start) as i64,
        ),
        (
            "fi_ops_mem_monitor.stop",
            offset_of!(FiOpsMemMonitor, stop) as i64,
        ),
        (
            "fi_ops_mem_monitor.subscribe",
            offset_of!(FiOpsMemMonitor, subscribe) as i64,
        ),
        (
            "fi_ops_mem_monitor.unsubscribe",
            offset_of!(FiOpsMemMonitor, unsubscribe) as i64,
        ),
        (
            "fi_ops_mem_monitor.valid",
            offset_of!(FiOpsMemMonitor, valid) as i64,
        ),
        ("fi_ops_mem_notify", size_of::<FiOpsMemNotify>() as i64),
        (
            "fi_ops_mem_notify.size",
            offset_of!(FiOpsMemNotify, size) as i64,
        ),
        (
            "fi_ops_mem_notify.notify",
            offset_of!(FiOpsMemNotify, notify) as i64,
        ),
        ("fid_mem_monitor", size_of::<FidMemMonitor>() as i64),
        ("fid_mem_monitor.fid", offset_of!(FidMemMonitor, fid) as i64),
        (
            "fid_mem_monitor.export_ops",
            offset_of!(FidMemMonitor, export_ops) as i64,
        ),
        (
            "fid_mem_monitor.import_ops",
            offset_of!(FidMemMonitor, import_ops) as i64,
        ),
        ("FI_CLASS_MEM_MONITOR", FI_CLASS_MEM_MONITOR as i64),
        ("FI_CLASS_MR_CACHE", FI_CLASS_MR_CACHE as i64),
        ("FI_EBUSY", FI_EBUSY as i64),
        ("FI_EINVAL", FI_EINVAL as i64),
        ("FI_ENOMEM", FI_ENOMEM as i64),
        ("FI_ENOSYS", FI_ENOSYS as i64),
        ("FI_EFAULT", FI_EFAULT as i64),
        ("FI_EAGAIN", FI_EAGAIN as i64),
        ("FI_VERSION(1, 13)", IMPORT_MIN_VERSION as i64),
    ];
    let mut checked = 0;
    for (name, value) in rust {
        let key = name.replace(' ', "");
        let found = c
            .iter()
            .find(|(k, _)| k.replace(' ', "") == key)
            .map(|(_, v)| *v);
        assert_eq!(
            found,
            Some(value),
            "{name}: C says {found:?}, the Rust mirror {value}"
        );
        checked += 1;
    }
    eprintln!(
        "layout: {checked} sizes, offsets and constants match libfabric {}.{}'s headers",
        c["FI_MAJOR_VERSION"], c["FI_MINOR_VERSION"]
    );
}
