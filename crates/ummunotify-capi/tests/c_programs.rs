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
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use ummunotify_testkit::cprog;

/// The directory holding `libummunotify.{so,a}`: the test binary lives in `<profile>/deps/`.
///
/// Cargo does not rebuild a cdylib/staticlib-only library for integration tests, so the first
/// caller builds it here (same target directory and profile as this test binary).
pub fn lib_dir() -> PathBuf {
    static BUILD: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = BUILD
        .get_or_init(|| {
            let dir = cprog::build_lib("ummunotify-capi", &crate_dir());
            // Programs linked with -lummunotify load the SONAME, as after install.sh.
            let soname = dir.join("libummunotify.so.0");
            let _ = std::fs::remove_file(&soname);
            std::os::unix::fs::symlink("libummunotify.so", &soname).expect("SONAME link");
            dir
        })
        .clone();
    assert!(
        dir.join("libummunotify.so").exists() && dir.join("libummunotify.a").exists(),
        "libummunotify.so/.a not found in {}: build the crate first (cargo build -p ummunotify-capi)",
        dir.display()
    );
    dir
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
    let mut extra: Vec<OsString> = vec!["-O1".into(), "-I".into()];
    extra.push(crate_dir().join("../../include").into());
    // Test headers shared with the 2010 drop-in's programs (xy_churn.h).
    extra.push("-I".into());
    extra.push(crate_dir().join("../ummunotify-testkit/c").into());
    match link {
        Link::Shared => {
            extra.push(format!("-L{}", lib.display()).into());
            extra.push(format!("-Wl,-rpath,{}", lib.display()).into());
            extra.push("-lummunotify".into());
        }
        Link::Static | Link::AsanStatic => {
            if matches!(link, Link::AsanStatic) {
                for f in [
                    "-fsanitize=address",
                    "-fno-omit-frame-pointer",
                    "-DUMN_UNDER_ASAN",
                ] {
                    extra.push(f.into());
                }
            }
            extra.push(lib.join("libummunotify.a").into());
            extra.extend(STATIC_DEPS.iter().map(OsString::from));
        }
    }
    cprog::gcc(&crate_dir().join(format!("tests/c/{name}.c")), &out, extra);
    out
}

/// Runs `exe` (120 s at most); false means it skipped (exit 77).
pub fn run(exe: &Path, envs: &[(&str, &str)]) -> bool {
    let mut all = vec![(
        "ASAN_OPTIONS",
        "detect_leaks=1:abort_on_error=0:exitcode=99",
    )];
    all.extend_from_slice(envs);
    cprog::run(exe, 120, &all)
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

/// Fork from a busy multithreaded program (tests/c/fork_busy.c, guarantee 6, issue 40): three
/// threads register, unmap, read and unregister while the main thread forks; every child must
/// exit within `UMN_FORK_DEADLINE_SECS` (default 20), find its inherited notifier `FORKED`, and
/// every 16th starts a notifier of its own. Linked to the shared library, on every backend (root
/// for perf and ebpf; one that can not start here is a loud skip). `UMN_FORK_SECS` (default 3)
/// and `UMN_FORK_COUNT` (default 2000) bound each run; on ebpf no child starts a notifier of its
/// own unless `UMN_FORK_OWN_EVERY` says so (loading the programs takes seconds per child).
#[test]
fn c_fork_from_busy_threads() {
    let exe = compile("fork_busy", Link::Shared);
    let own_ebpf = std::env::var("UMN_FORK_OWN_EVERY").unwrap_or_else(|_| "0".into());
    for backend in ["auto", "hybrid", "hooks", "perf", "ebpf"] {
        let mut env = vec![("UMN_BACKEND", backend)];
        if backend == "ebpf" {
            env.push(("UMN_FORK_OWN_EVERY", &own_ebpf));
        }
        if !cprog::run(&exe, 900, &env) && backend == "auto" {
            return; // skipped: no userfaultfd here
        }
    }
}

#[test]
fn c_cache() {
    check_program("cache");
}

#[test]
fn c_threads() {
    check_program("threads");
}

/// The verbs registrar's C surface (registering through it needs a device: kernel/rxe/).
#[test]
fn c_verbs() {
    check_program("verbs");
}

/// The calls the header lists as async-signal-safe, from a signal handler.
#[test]
fn c_signals() {
    check_program("signals");
}

/// The library inside a host with signal handling of its own (an MPI rank under a sampling
/// profiler): small alternate stacks sized from `AT_MINSIGSTKSZ`, per-thread SIGPROF at 10 kHz,
/// a 5 kHz SIGALRM whose handler uses 3 KiB of stack and changes registered memory, REMOVE churn
/// against the C cache; host handlers on the alternate stack and on the thread's own stack. The
/// library's signal must be used and must never crash the host (tests/c/host_signals.c).
#[test]
fn c_host_signals() {
    let secs = std::env::var("UMN_HOST_SECS").unwrap_or_else(|_| "3".into());
    for link in [Link::Shared, Link::Static, Link::AsanStatic] {
        let exe = compile("host_signals", link);
        for mode in ["onstack", "normal"] {
            if !run(&exe, &[("UMN_HOST_MODE", mode), ("UMN_HOST_SECS", &secs)]) {
                return;
            }
        }
    }
}

/// The C checks under x == y churn of every kind, beside a second notifier's traffic and a
/// 10 kHz SIGPROF: `unchanged_since`, the header's inline `*counter == g` and `is_valid` miss no
/// invalidation (tests/c/counters.c), on the default backend and on hybrid and hooks.
#[test]
fn c_counters() {
    let secs = std::env::var("UMN_COUNTERS_SECS").unwrap_or_else(|_| "3".into());
    for link in [Link::Shared, Link::Static, Link::AsanStatic] {
        let exe = compile("counters", link);
        if !run(&exe, &[("UMN_COUNTERS_SECS", &secs)]) {
            return;
        }
    }
    let exe = compile("counters", Link::Shared);
    for backend in ["hybrid", "hooks"] {
        assert!(
            run(
                &exe,
                &[("UMN_COUNTERS_SECS", &secs), ("UMN_BACKEND", backend)]
            ),
            "the {backend} backend must start here"
        );
    }
}

/// UCX's memory hooks (libucm, from Debian's libucx0) in the same process, loaded before the
/// library (preloaded: hooks and hybrid refuse, naming UCX and the fallback; the default backend
/// works) and after it (dlopened: a hooks notifier stops before UCX writes, hybrid carries on
/// through userfaultfd), and in UCX's GOT-rewriting mode (every backend works through UCX's
/// calls); no stale check, crash or hang in any order (tests/c/ucm.c).
#[test]
fn c_ucx_memory_hooks_in_the_same_process() {
    for link in [Link::Shared, Link::Static] {
        let exe = compile("ucm", link);
        for backend in ["auto", "hooks", "hybrid"] {
            let env = [
                ("LD_PRELOAD", "libucs.so.0"),
                ("UMN_UCM_ORDER", "first"),
                ("UMN_BACKEND", backend),
            ];
            if !run(&exe, &env) {
                return;
            }
        }
        for backend in ["hooks", "hybrid"] {
            let env = [("UMN_UCM_ORDER", "late"), ("UMN_BACKEND", backend)];
            if !run(&exe, &env) {
                return;
            }
            let env = [
                ("LD_PRELOAD", "libucs.so.0"),
                ("UCX_MEM_MMAP_HOOK_MODE", "reloc"),
                ("UMN_UCM_ORDER", "reloc"),
                ("UMN_BACKEND", backend),
            ];
            if !run(&exe, &env) {
                return;
            }
        }
    }
}

/// The hooks backend through the C library, chosen with `UMN_BACKEND=hooks` (what Auto picks
/// where userfaultfd is denied).
#[test]
fn c_hooks() {
    for link in [Link::Shared, Link::Static, Link::AsanStatic] {
        let exe = compile("hooks", link);
        assert!(
            run(&exe, &[("UMN_BACKEND", "hooks")]),
            "the hooks backend must start here (x86-64 glibc)"
        );
    }
}

/// The same program on the hybrid backend (`UMN_BACKEND=hybrid`): libc calls seen in the
/// thread, the raw syscall seen by userfaultfd, `ummunotify_notifier_backend` says "hybrid".
#[test]
fn c_hybrid() {
    let exe = compile("hooks", Link::Shared);
    assert!(
        run(&exe, &[("UMN_BACKEND", "hybrid")]),
        "the hybrid backend must start here (userfaultfd and x86-64 glibc)"
    );
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
    // Only what pkg-config says, after the source: as a C project would build.
    cprog::gcc(
        &crate_dir().join("tests/c/errors.c"),
        &exe,
        flags.split_whitespace(),
    );
    let libdir = prefix.join("lib");
    run(&exe, &[("LD_LIBRARY_PATH", libdir.to_str().unwrap())]);
}

/// The shared library is what a C stack expects to ship: SONAME `libummunotify.so.<major>`, only
/// `ummunotify_*` symbols exported, the header's compile-time version equal to the library's, and
/// install.sh's versioned file with its two links.
#[test]
fn soname_exports_and_version() {
    let lib = lib_dir().join("libummunotify.so");
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&lib)
        .output()
        .expect("readelf (binutils)");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        dynamic.contains(&format!("Library soname: [libummunotify.so.{major}]")),
        "{dynamic}"
    );
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(&lib)
        .output()
        .expect("nm (binutils)");
    let syms = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = syms.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(names.len() > 20, "{syms}");
    let foreign: Vec<&&str> = names
        .iter()
        .filter(|n| !n.starts_with("ummunotify_"))
        .collect();
    assert!(
        foreign.is_empty(),
        "exported beyond ummunotify_*: {foreign:?}"
    );

    let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prefix-soname");
    let st = Command::new("sh")
        .arg(crate_dir().join("install.sh"))
        .arg("--from")
        .arg(lib_dir())
        .arg(&prefix)
        .status()
        .expect("run install.sh");
    assert!(st.success(), "install.sh failed");
    let l = prefix.join("lib");
    let v = env!("CARGO_PKG_VERSION");
    assert!(l.join(format!("libummunotify.so.{v}")).is_file());
    assert_eq!(
        std::fs::read_link(l.join(format!("libummunotify.so.{major}"))).unwrap(),
        Path::new(&format!("libummunotify.so.{v}"))
    );
    assert_eq!(
        std::fs::read_link(l.join("libummunotify.so")).unwrap(),
        Path::new(&format!("libummunotify.so.{major}"))
    );

    // The header's macros against the loaded library's string, from C.
    let src = Path::new(env!("CARGO_TARGET_TMPDIR")).join("version.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <string.h>
#include <ummunotify.h>
int main(void) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", UMMUNOTIFY_VERSION_MAJOR, UMMUNOTIFY_VERSION_MINOR,
             UMMUNOTIFY_VERSION_PATCH);
    if (strcmp(want, ummunotify_version()) != 0) {
        fprintf(stderr, "header %s, library %s\n", want, ummunotify_version());
        return 1;
    }
    return 0;
}
"#,
    )
    .unwrap();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-version");
    cprog::gcc(
        &src,
        &exe,
        [
            format!("-I{}", prefix.join("include").display()),
            format!("-L{}", l.display()),
            format!("-Wl,-rpath,{}", l.display()),
            "-lummunotify".to_string(),
        ],
    );
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .unwrap();
    let needed = String::from_utf8_lossy(&out.stdout);
    assert!(
        needed.contains(&format!("Shared library: [libummunotify.so.{major}]")),
        "{needed}"
    );
    run(&exe, &[]);
}
