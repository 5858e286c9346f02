//! Runs `tests/c/abi2010.c`, a program written only against the 2010 `/dev/ummunotify` header,
//! under `LD_PRELOAD=libummunotify-compat.so`: plain, with `_FORTIFY_SOURCE` (so the `__open_2`
//! and `__read_chk` entry points are exercised), and under AddressSanitizer with leak checking
//! (`LD_PRELOAD="$(gcc -print-file-name=libasan.so) libummunotify-compat.so"`: the sanitizer
//! runtime must come first).
//!
//! A run that can not open the device because userfaultfd is unavailable exits 77: a loud SKIP,
//! a failure under `UMN_REQUIRE_ALL=1`.
use std::path::{Path, PathBuf};
use std::process::Command;

use ummunotify_testkit::cprog;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds the preload library (cargo does not rebuild a cdylib-only crate for integration tests)
/// and returns it installed under its real name, `libummunotify-compat.so`.
///
/// Once per test binary, and installed by a rename: copying over the file in place while another
/// test's program has it mapped kills that program with SIGBUS (seen when two tests ran at once).
fn preload_lib() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let dir = cprog::build_lib("ummunotify-compat", &crate_dir());
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let lib = tmp.join("libummunotify-compat.so");
        let staged = tmp.join(format!("libummunotify-compat.so.{}", std::process::id()));
        std::fs::copy(dir.join("libummunotify_compat.so"), &staged).expect("copy preload library");
        std::fs::rename(&staged, &lib).expect("install preload library");
        lib
    })
    .clone()
}

fn compile(name: &str, extra: &[&str]) -> PathBuf {
    compile_source("abi2010", name, extra)
}

/// Builds `tests/c/{source}.c` as `name` (with the test headers shared with the C library's
/// programs on the include path).
fn compile_source(source: &str, name: &str, extra: &[&str]) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let shared = crate_dir().join("../ummunotify-testkit/c");
    let mut all = vec!["-I", shared.to_str().expect("utf-8 path")];
    all.extend_from_slice(extra);
    cprog::gcc(&crate_dir().join(format!("tests/c/{source}.c")), &out, &all);
    out
}

/// The 2010 counter under churn (tests/c/stress2010.c): x == y rounds of every kind on three
/// threads, another device's traffic, SIGPROF at 10 kHz; a check after each call that still
/// finds `*counter == before` is a miss, a poller that sees the counter go down fails it. On
/// userfaultfd (the default), hybrid and hooks (`UMN_STRESS2010_SECS`, default 3 s each).
#[test]
fn counter_never_goes_down_and_misses_nothing_under_churn() {
    let lib = preload_lib();
    let exe = compile_source("stress2010", "stress2010", &["-O2"]);
    let secs = std::env::var("UMN_STRESS2010_SECS").unwrap_or_else(|_| "3".into());
    for backend in ["auto", "hybrid", "hooks"] {
        let ok = cprog::run(
            &exe,
            180,
            &[
                ("LD_PRELOAD", lib.to_str().unwrap()),
                ("UMN_BACKEND", backend),
                ("UMN_STRESS2010_SECS", &secs),
            ],
        );
        if !ok {
            return; // skipped: no userfaultfd (the other backends are checked elsewhere)
        }
    }
}

/// Fork from a busy multithreaded 2010 program (tests/c/fork2010.c, guarantee 6, issue 40):
/// three threads map, register over a hole, unmap, read and unregister while the main thread
/// forks; every child must exit within `UMN_FORK_DEADLINE_SECS` (default 20) with the
/// inherited view poisoned and the inherited descriptor answering EIO, and every 16th opens a
/// device of its own. On every backend the preload can use (root for perf and ebpf; a backend
/// that can not start here is a loud skip). `UMN_FORK_SECS` (default 3) and `UMN_FORK_COUNT`
/// (default 2000) bound each run. On ebpf no child opens a device of its own unless
/// `UMN_FORK_OWN_EVERY` says so: loading the programs takes seconds per child.
/// Before the fix the first children hung in `fork()` (the core's child handler called the
/// interposed `mmap`, which waited on a registry lock a busy thread held).
#[test]
fn fork_from_busy_threads_never_hangs_a_child() {
    let lib = preload_lib();
    let exe = compile_source("fork2010", "fork2010", &["-O2"]);
    let own_ebpf = std::env::var("UMN_FORK_OWN_EVERY").unwrap_or_else(|_| "0".into());
    for backend in ["auto", "hybrid", "hooks", "perf", "ebpf"] {
        let mut env = vec![
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("UMN_BACKEND", backend),
        ];
        if backend == "ebpf" {
            env.push(("UMN_FORK_OWN_EVERY", &own_ebpf));
        }
        if !cprog::run(&exe, 900, &env) && backend == "auto" {
            return; // skipped: no userfaultfd (hybrid and hooks are checked elsewhere)
        }
    }
}

/// Runs `exe` with `preload` (180 s at most); false when it skipped.
fn run(exe: &Path, preload: &str) -> bool {
    run_on(exe, preload, "auto")
}

/// As [`run`], with `UMN_BACKEND=backend`.
fn run_on(exe: &Path, preload: &str, backend: &str) -> bool {
    cprog::run(
        exe,
        180,
        &[
            ("LD_PRELOAD", preload),
            ("ASAN_OPTIONS", "detect_leaks=1:exitcode=99"),
            ("UMN_BACKEND", backend),
        ],
    )
}

/// The same program on the hybrid backend (`UMN_BACKEND=hybrid` for the preload): libc calls
/// through the hooks, the raw munmap through userfaultfd; per-call counts as on hooks.
#[test]
fn abi2010_program_under_preload_on_hybrid() {
    let lib = preload_lib();
    let exe = compile("abi2010-hybrid", &["-O0"]);
    assert!(
        run_on(&exe, lib.to_str().unwrap(), "hybrid"),
        "the hybrid backend must start here (userfaultfd and x86-64 glibc)"
    );
}

/// The same unmodified 2010 program on the hooks backend (what a container without userfaultfd
/// gets): everything but the raw-syscall check, which the program expects to be missed there.
#[test]
fn abi2010_program_under_preload_on_hooks() {
    let lib = preload_lib();
    let exe = compile("abi2010-hooks", &["-O0"]);
    assert!(
        run_on(&exe, lib.to_str().unwrap(), "hooks"),
        "the hooks backend must start here (x86-64 glibc)"
    );
}

#[test]
fn abi2010_program_under_preload() {
    let lib = preload_lib();
    let lib = lib.to_str().unwrap();
    let plain = compile("abi2010", &["-O0"]);
    if !run(&plain, lib) {
        return;
    }
    let fortified = compile("abi2010-fortify", &["-O2", "-D_FORTIFY_SOURCE=2"]);
    run(&fortified, lib);
    // ASan's runtime must be the first object in the process: preload it before the shim.
    let asan = Command::new("gcc")
        .arg("-print-file-name=libasan.so")
        .output()
        .expect("gcc -print-file-name");
    let asan = String::from_utf8(asan.stdout).unwrap().trim().to_string();
    let sanitized = compile("abi2010-asan", &["-O1", "-fsanitize=address"]);
    run(&sanitized, &format!("{asan} {lib}"));
}

/// Without the preload library the program finds no device (this machine has none): proof the
/// test above exercised the shim, not a real `/dev/ummunotify`.
#[test]
fn abi2010_program_without_preload_finds_no_device() {
    assert!(!Path::new("/dev/ummunotify").exists());
    let plain = compile("abi2010-bare", &["-O0"]);
    let out = Command::new(&plain).output().expect("run");
    assert_eq!(out.status.code(), Some(77), "{out:?}");
}
