//! Builds the C test programs in `tests/c/` with gcc against the library cargo just built, and
//! runs each one three ways: linked to `libummunotify.so`, to `libummunotify.a`, and to
//! `libummunotify.a` under AddressSanitizer.
//!
//! Why the ASan build links the static library: the sanitizer runtime must come first in the
//! process, which `-fsanitize=address` on the executable guarantees either way, but with the
//! static library the Rust code's allocations and the C code's share one interposed allocator
//! and one set of symbols, so reports point into both. Leak checking stays on
//! (`detect_leaks=1`): every program frees what it created, so a report is a real leak.
//!
//! A program exits 77 when userfaultfd is unavailable here; that is a loud SKIP, and a failure
//! when `UMN_REQUIRE_ALL=1` (as in CI).
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding `libummunotify.{so,a}`: the test binary lives in `<profile>/deps/`.
///
/// Cargo does not rebuild a cdylib/staticlib-only library for integration tests, so the first
/// caller builds it here (same target directory and profile as this test binary).
pub fn lib_dir() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary in <target>/<profile>/deps");
    BUILD.call_once(|| {
        let target = dir.parent().expect("<target>/<profile>");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "ummunotify-capi", "--lib"])
            .arg("--target-dir")
            .arg(target)
            .current_dir(crate_dir());
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build");
        assert!(st.success(), "cargo build -p ummunotify-capi failed");
    });
    assert!(
        dir.join("libummunotify.so").exists() && dir.join("libummunotify.a").exists(),
        "libummunotify.so/.a not found in {}: build the crate first (cargo build -p ummunotify-capi)",
        dir.display()
    );
    dir.to_path_buf()
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Libraries the Rust standard library needs when linked statically
/// (`cargo rustc -- --print native-static-libs`).
const STATIC_DEPS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

#[derive(Clone, Copy, Debug)]
enum Link {
    Shared,
    Static,
    AsanStatic,
}

fn compile(name: &str, link: Link) -> PathBuf {
    let lib = lib_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-{name}-{link:?}"));
    let mut cmd = Command::new("gcc");
    cmd.args([
        "-std=gnu11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
        "-O1",
        "-pthread",
    ])
    .arg("-I")
    .arg(crate_dir().join("../../include"))
    .arg(crate_dir().join(format!("tests/c/{name}.c")))
    .arg("-o")
    .arg(&out);
    match link {
        Link::Shared => {
            cmd.arg(format!("-L{}", lib.display()))
                .arg(format!("-Wl,-rpath,{}", lib.display()))
                .arg("-lummunotify");
        }
        Link::Static | Link::AsanStatic => {
            if matches!(link, Link::AsanStatic) {
                cmd.args([
                    "-fsanitize=address",
                    "-fno-omit-frame-pointer",
                    "-DUMN_UNDER_ASAN",
                ]);
            }
            cmd.arg(lib.join("libummunotify.a")).args(STATIC_DEPS);
        }
    }
    let res = cmd.output().expect("run gcc (apt-get install gcc)");
    assert!(
        res.status.success(),
        "gcc failed for {name} ({link:?}): {cmd:?}\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    out
}

/// Runs `exe`; `Ok(false)` means it skipped (exit 77).
pub fn run(exe: &Path, envs: &[(&str, &str)]) -> bool {
    // `timeout` (coreutils) turns a hang into a failure instead of a stuck CI run.
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(exe)
        .envs(envs.iter().copied())
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:abort_on_error=0:exitcode=99",
        )
        .output()
        .expect("run test program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            print!("{stdout}");
            true
        }
        Some(77) => {
            let msg = format!("SKIP {}: {}", exe.display(), stdout.trim());
            if std::env::var_os("UMN_REQUIRE_ALL").is_some_and(|v| v == "1") {
                panic!("{msg} (UMN_REQUIRE_ALL=1 forbids skips)");
            }
            eprintln!("{msg}");
            false
        }
        _ => panic!(
            "{} failed: {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            exe.display(),
            out.status
        ),
    }
}

fn check_program(name: &str) {
    for link in [Link::Shared, Link::Static, Link::AsanStatic] {
        let exe = compile(name, link);
        if !run(&exe, &[]) {
            return; // skipped: the other variants would skip for the same reason
        }
    }
}

#[test]
fn c_errors() {
    check_program("errors");
}

#[test]
fn c_notifier() {
    check_program("notifier");
}

#[test]
fn c_fork() {
    check_program("fork");
}

#[test]
fn c_cache() {
    check_program("cache");
}

#[test]
fn c_threads() {
    check_program("threads");
}

/// The documented install step and `pkg-config --cflags --libs ummunotify` work end to end.
#[test]
fn pkg_config_after_install() {
    let lib = lib_dir();
    let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prefix");
    let st = Command::new("sh")
        .arg(crate_dir().join("install.sh"))
        .arg("--from")
        .arg(&lib)
        .arg(&prefix)
        .status()
        .expect("run install.sh");
    assert!(st.success(), "install.sh failed");
    let pc_dir = prefix.join("lib/pkgconfig");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "ummunotify"])
        .env("PKG_CONFIG_PATH", &pc_dir)
        .output()
        .expect("run pkg-config (apt-get install pkg-config)");
    assert!(flags.status.success(), "pkg-config failed");
    let flags = String::from_utf8(flags.stdout).unwrap();
    assert!(flags.contains("-lummunotify"), "{flags}");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-pkgconfig");
    let mut cmd = Command::new("gcc");
    cmd.args(["-std=gnu11", "-Wall", "-Werror"])
        .arg(crate_dir().join("tests/c/errors.c"))
        .arg("-o")
        .arg(&exe)
        .args(flags.split_whitespace());
    let res = cmd.output().expect("run gcc");
    assert!(
        res.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    let libdir = prefix.join("lib");
    run(&exe, &[("LD_LIBRARY_PATH", libdir.to_str().unwrap())]);
}
