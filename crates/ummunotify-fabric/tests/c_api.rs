//! The C call and the preload against this machine's libfabric: `tests/c/import.c`, built with
//! the installed headers and linked with `-lfabric` and `libummunotify-fabric.so`, run in each
//! mode (see the program's comment), plus the preload's report when libfabric is absent.
//! Needs `libfabric-dev`; CI installs it, so there a missing header fails (`UMN_REQUIRE_ALL=1`).
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use ummunotify_testkit::{cprog, require::skip_or_fail};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The library under its installed name, and the test program linked with it; `None` (after a
/// loud SKIP) without libfabric's headers. Built once per test process: copying over a library
/// that a running test program has mapped would crash that program.
fn build() -> Option<(PathBuf, PathBuf)> {
    static BUILT: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    BUILT.get_or_init(build_once).clone()
}

fn build_once() -> Option<(PathBuf, PathBuf)> {
    if !Path::new("/usr/include/rdma/fi_ext.h").exists() {
        skip_or_fail(
            "c_api",
            "libfabric headers (/usr/include/rdma/fi_ext.h: apt-get install libfabric-dev)",
        );
        return None;
    }
    let dir = cprog::build_lib("ummunotify-fabric", &crate_dir());
    let lib = tmp().join("libummunotify-fabric.so");
    std::fs::copy(dir.join("libummunotify_fabric.so"), &lib).expect("copy library");
    let exe = tmp().join("fabric-import");
    let include = format!("-I{}", crate_dir().join("include").display());
    let libdir = format!("-L{}", tmp().display());
    let rpath = format!("-Wl,-rpath,{}", tmp().display());
    cprog::gcc(
        &crate_dir().join("tests/c/import.c"),
        &exe,
        [
            include.as_str(),
            "-O0",
            libdir.as_str(),
            rpath.as_str(),
            "-lummunotify-fabric",
            "-lfabric",
        ],
    );
    Some((lib, exe))
}

fn run(exe: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(exe)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("run (timeout is in coreutils)");
    eprintln!(
        "--- {} {args:?} {envs:?}: {}\n{}{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn import_call_succeeds_and_libfabric_refuses_a_second_monitor() {
    let Some((_, exe)) = build() else { return };
    let out = run(&exe, &["call"], &[]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("memory monitor"));
}

#[test]
fn import_call_reports_busy_after_another_monitor() {
    let Some((_, exe)) = build() else { return };
    assert!(run(&exe, &["first"], &[]).status.success());
}

#[test]
fn preload_imports_from_its_constructor() {
    let Some((lib, exe)) = build() else { return };
    let lib = lib.to_str().unwrap();
    let out = run(
        &exe,
        &["preload"],
        &[("LD_PRELOAD", lib), ("UMMUNOTIFY_FABRIC_VERBOSE", "1")],
    );
    assert!(out.status.success());
    assert!(
        stderr(&out).contains("ummunotify is libfabric ")
            && stderr(&out).contains("memory monitor"),
        "the preload reports what it did"
    );
    // Turned off: the program's own monitor goes in.
    let out = run(
        &exe,
        &["own"],
        &[("LD_PRELOAD", lib), ("UMMUNOTIFY_FABRIC", "0")],
    );
    assert!(out.status.success());
    // (Only our own lines: `timeout` itself may warn, e.g. when timer_create is refused.)
    assert!(
        !stderr(&out).contains("ummunotify-fabric"),
        "silent when turned off"
    );
}

#[test]
fn preload_reports_a_monitor_imported_first() {
    let Some((lib, exe)) = build() else { return };
    // The library is also linked by the program, so the preload's constructor runs first; the
    // program's "own" import then finds ours. The other order (another monitor in before the
    // preload) is `import_call_reports_busy_after_another_monitor`.
    let out = run(&exe, &["own"], &[("LD_PRELOAD", lib.to_str().unwrap())]);
    assert!(
        !out.status.success(),
        "libfabric took ours first, refused the program's own"
    );
}

#[test]
fn preload_reports_libfabric_absent() {
    let Some((lib, _)) = build() else { return };
    let out = run(
        Path::new("/bin/true"),
        &[],
        &[
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("UMMUNOTIFY_FABRIC_LIBRARY", "/nonexistent/libfabric.so.1"),
        ],
    );
    assert!(out.status.success(), "the program still runs");
    let err = stderr(&out);
    assert!(
        err.contains("not libfabric's monitor") && err.contains("libfabric is absent"),
        "{err}"
    );
}

#[test]
fn preload_refuses_when_fi_mr_cache_monitor_would_override_it() {
    let Some((lib, exe)) = build() else { return };
    let out = run(
        &exe,
        &["own"],
        &[
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("FI_MR_CACHE_MONITOR", "userfaultfd"),
        ],
    );
    assert!(out.status.success(), "the program's own monitor went in");
    assert!(stderr(&out).contains("FI_MR_CACHE_MONITOR=userfaultfd is set"));
}
