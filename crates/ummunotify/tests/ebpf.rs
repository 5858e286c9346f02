//! The eBPF backend's mechanism against the real kernel: programs loaded here (root), ranges
//! registered in this process's area, changes made with real syscalls; the daemon path from an
//! unprivileged child process. (The whole catalogue, judged by the pinned-page oracles, runs
//! through `umn coverage --backend ebpf`: crates/umn/tests/coverage.rs.)
//!
//! Needs root with bpf(2) and the syscall tracepoints; a missing feature skips loudly (and
//! fails under `UMN_REQUIRE_ALL=1`, as in CI).
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use ummunotify::ebpf::{Area, Daemon, Ticket};
use ummunotify_testkit::require::{or_skip, MissingFeature};

const PAGE: usize = 4096;

/// One area (one set of programs) for the whole binary: `procs` holds one area per process.
fn area(test: &str) -> Option<Arc<Area>> {
    static AREA: OnceLock<Result<Arc<Area>, String>> = OnceLock::new();
    let r = AREA.get_or_init(|| Area::open_local().map(Arc::new).map_err(|e| e.to_string()));
    or_skip(
        test,
        r.clone().map_err(|e| {
            MissingFeature::error(
                "eBPF programs on syscall tracepoints (root, bpf(2), tracefs)",
                io::Error::other(e),
            )
        }),
    )
}

fn map(pages: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

fn reg(a: &Area, p: *mut u8, from: usize, to: usize) -> Ticket {
    a.register(
        (p as usize + from * PAGE) as u64,
        (p as usize + to * PAGE) as u64,
    )
    .expect("register")
}

#[test]
fn registered_munmap_is_seen_before_it_returns_and_neighbours_stay_valid() {
    let Some(a) = area("registered_munmap") else {
        return;
    };
    let p = map(6);
    let hit = reg(&a, p, 1, 3);
    let left = reg(&a, p, 0, 1);
    let right = reg(&a, p, 3, 6);
    let g = a.generation();
    // SAFETY: unmaps pages 1..2 of our own mapping.
    assert_eq!(unsafe { libc::munmap(p.add(PAGE).cast(), PAGE) }, 0);
    assert!(
        !a.is_valid(hit),
        "the munmap'd range reads invalid once munmap returned"
    );
    assert_ne!(a.generation(), g);
    assert!(
        a.is_valid(left) && a.is_valid(right),
        "untouched neighbours stay valid"
    );
    for t in [hit, left, right] {
        a.unregister(t);
    }
    // SAFETY: the rest of our mapping.
    unsafe { libc::munmap(p.cast(), 6 * PAGE) };
}

/// Two calls on different parts of one range before anyone looks: the change reported covers
/// both (a hint smaller than what changed would let a cache keep a stale part).
#[test]
fn the_reported_change_covers_every_call_since_the_last_look() {
    let Some(a) = area("hint_union") else { return };
    let p = map(8);
    let t = reg(&a, p, 0, 8);
    // SAFETY: our own mapping.
    unsafe {
        assert_eq!(
            libc::madvise(p.add(PAGE).cast(), PAGE, libc::MADV_DONTNEED),
            0
        );
        assert_eq!(
            libc::madvise(p.add(5 * PAGE).cast(), 2 * PAGE, libc::MADV_DONTNEED),
            0
        );
    }
    let r = a.take_change(t).expect("a change");
    let (b, e) = (p as u64 + PAGE as u64, p as u64 + 7 * PAGE as u64);
    assert!(
        r.start <= b && r.end >= e,
        "{r:x?} does not cover {b:x}..{e:x}"
    );
    assert_eq!(a.take_change(t), None, "taken");
    // SAFETY: our own mapping.
    unsafe { assert_eq!(libc::munmap(p.add(3 * PAGE).cast(), PAGE), 0) };
    let r = a.take_change(t).expect("a change");
    assert_eq!(
        r,
        p as u64 + 3 * PAGE as u64..p as u64 + 4 * PAGE as u64,
        "exactly the munmap"
    );
    a.unregister(t);
    // SAFETY: the rest of our mapping.
    unsafe { libc::munmap(p.cast(), 8 * PAGE) };
}

#[test]
fn unregistered_memory_and_harmless_calls_touch_nothing() {
    let Some(a) = area("unregistered") else {
        return;
    };
    let p = map(4);
    let t = reg(&a, p, 0, 2);
    let other = map(2);
    // SAFETY: calls on our own mappings; WILLNEED and a plain mmap change no frame.
    unsafe {
        assert_eq!(libc::madvise(p.cast(), 2 * PAGE, libc::MADV_WILLNEED), 0);
        assert_eq!(
            libc::madvise(p.add(2 * PAGE).cast(), 2 * PAGE, libc::MADV_DONTNEED),
            0
        );
        assert_eq!(libc::munmap(other.cast(), 2 * PAGE), 0);
        let q = libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        libc::munmap(q, PAGE);
    }
    assert!(a.is_valid(t));
    // Other tests of this binary may change their own ranges meanwhile; the counter of this
    // one's slot must not move, and the data must be there.
    // SAFETY: page 0 is still mapped and was zero-filled.
    assert_eq!(unsafe { p.read_volatile() }, 0);
    a.unregister(t);
    // SAFETY: our mapping.
    unsafe { libc::munmap(p.cast(), 4 * PAGE) };
}

/// Issue 9's problem: a range registered after a call's entry program ran (so it was not
/// seen) and before the call's change completed must read invalid once the call returns.
#[test]
fn a_registration_inside_a_calls_window_does_not_stay_valid() {
    let Some(a) = area("window") else { return };
    const PAGES: usize = 16 * 1024; // 64 MiB: zapping them takes milliseconds
    let mut inside = 0;
    for _ in 0..20 {
        let p = map(PAGES) as usize;
        let indicator = a.register(p as u64, (p + PAGE) as u64).unwrap();
        let returned = Arc::new(AtomicBool::new(false));
        let r2 = Arc::clone(&returned);
        let t = std::thread::spawn(move || {
            // SAFETY: our own mapping.
            let rc =
                unsafe { libc::madvise(p as *mut libc::c_void, PAGES * PAGE, libc::MADV_DONTNEED) };
            r2.store(true, SeqCst);
            rc
        });
        while a.is_valid(indicator) {
            std::hint::spin_loop();
        }
        // The entry program has run; register the far end of the range.
        let mid = p + (PAGES - 8) * PAGE;
        let late = a.register(mid as u64, (mid + PAGE) as u64).unwrap();
        let in_window = !returned.load(SeqCst);
        assert_eq!(t.join().unwrap(), 0);
        if in_window {
            inside += 1;
            assert!(
                !a.is_valid(late),
                "registered while madvise was in flight, still valid after it returned"
            );
        }
        a.unregister(indicator);
        a.unregister(late);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, PAGES * PAGE) };
    }
    assert!(
        inside > 0,
        "no registration landed inside a call's window in 20 tries"
    );
}

#[test]
fn a_forked_child_never_trusts_the_parents_registration() {
    let Some(a) = area("fork") else { return };
    let p = map(1);
    let t = reg(&a, p, 0, 1);
    // SAFETY: the child only reads memory, calls getpid/register (no allocation on failure
    // paths: Forked is returned before the lock) and _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = !a.is_valid(t)
            && matches!(
                a.register(p as u64, p as u64 + 4096),
                Err(ummunotify::Error::Forked)
            );
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    assert!(
        a.is_valid(t),
        "the parent's registration is untouched by the child"
    );
    a.unregister(t);
    // SAFETY: our mapping.
    unsafe { libc::munmap(p.cast(), PAGE) };
}

const CHILD_ENV: &str = "UMN_EBPF_TEST_SOCKET";

/// The unprivileged side of [`the_daemon_serves_an_unprivileged_process`]; does nothing unless
/// run by it.
#[test]
fn daemon_client_role() {
    let Some(sock) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    assert_ne!(
        unsafe { libc::geteuid() },
        0,
        "the client must run unprivileged"
    );
    let a = Area::connect(std::path::Path::new(&sock)).expect("connect to the daemon");
    assert!(!a.is_local());
    let p = map(3);
    let hit = reg(&a, p, 0, 1);
    let kept = reg(&a, p, 2, 3);
    // SAFETY: our own mapping.
    unsafe {
        assert_eq!(libc::munmap(p.cast(), PAGE), 0);
        assert_eq!(
            libc::madvise(p.add(PAGE).cast(), PAGE, libc::MADV_DONTNEED),
            0
        );
    }
    assert!(
        !a.is_valid(hit),
        "munmap of a registered page, seen through the daemon's programs"
    );
    assert!(a.is_valid(kept), "an untouched registered page stays valid");
    // SAFETY: our own mapping.
    unsafe {
        assert_eq!(
            libc::madvise(p.add(2 * PAGE).cast(), PAGE, libc::MADV_DONTNEED),
            0
        )
    };
    assert!(!a.is_valid(kept), "madvise(DONTNEED) of a registered page");
    println!("daemon client: ok");
}

#[test]
fn the_daemon_serves_an_unprivileged_process() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        ummunotify_testkit::require::skip_or_fail("daemon", "root to run the daemon");
        return;
    }
    let daemon = match Daemon::new() {
        Ok(d) => d,
        Err(e) => {
            ummunotify_testkit::require::skip_or_fail("daemon", &format!("eBPF programs: {e}"));
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("umn-ebpf-test-{}", std::process::id()));
    let sock = dir.join("ebpf.sock");
    let listener = Daemon::bind(&sock).expect("bind");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let daemon = Arc::new(daemon);
    let d2 = Arc::clone(&daemon);
    std::thread::spawn(move || d2.serve(listener));
    // A copy nobody can execute: the test binary's own path may run through a directory only
    // root can enter (a clone under a `mktemp -d` directory, mode 0700).
    let exe = dir.join("client");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).expect("copy the test binary");
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(&exe)
        .args([
            "--exact",
            "daemon_client_role",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &sock)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run the client as nobody");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && text.contains("daemon client: ok"),
        "client as nobody:\n{text}"
    );
}
