//! The kernel backend ([`KernelNotifier`]) against this project's `/dev/ummunotify` module.
//!
//! The module exists only in the guest kernel of `kernel/ci.sh`, which runs this binary there
//! with `--ignored --test-threads=1` and fails on any failure (one thread: a test asserts the
//! exact events of its regions, and another test's mapping could land in a hole it unmapped).
//! On a host without the module every test here is ignored, not skipped silently: `cargo test`
//! lists them as ignored, and in the guest a missing device is a failure.
#![allow(unsafe_code)]

use ummunotify::{Cookie, Error, KernelNotifier};

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn map(pages: usize) -> usize {
    // SAFETY: a fresh anonymous mapping chosen by the kernel.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * page(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: just mapped, writable.
    unsafe { std::ptr::write_bytes(p as *mut u8, 7, pages * page()) };
    p as usize
}

fn open() -> KernelNotifier {
    KernelNotifier::open().expect("/dev/ummunotify (kernel/ci.sh loads the module first)")
}

#[test]
#[ignore = "needs the /dev/ummunotify module: kernel/ci.sh runs it in its guest"]
fn munmap_is_seen_before_it_returns_with_a_clipped_hint() {
    let n = open();
    let pg = page();
    let a = map(8);
    let other = map(1);
    let region = n.register(a + 2 * pg..a + 6 * pg, Cookie(1)).unwrap();
    let seen = n.generation();
    assert!(n.is_valid(region));
    // Memory outside every region: no notification, the region stays valid.
    // SAFETY: test-owned mapping.
    unsafe { libc::munmap(other as *mut _, pg) };
    assert!(n.is_valid(region) && n.unchanged_since(seen));
    // SAFETY: test-owned mapping.
    unsafe { libc::munmap((a + 4 * pg) as *mut _, 4 * pg) };
    assert!(!n.is_valid(region));
    assert!(!n.unchanged_since(seen));
    assert_eq!(n.counter().load(std::sync::atomic::Ordering::Relaxed), 1);
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].cookie, ev[0].range(), ev[0].hint),
        (Cookie(1), a + 4 * pg..a + 6 * pg, true)
    );
    assert!(n.events().unwrap().is_empty());
    // SAFETY: test-owned mapping.
    unsafe { libc::munmap(a as *mut _, 4 * pg) };
}

#[test]
#[ignore = "needs the /dev/ummunotify module: kernel/ci.sh runs it in its guest"]
fn reading_an_event_rearms_with_a_fresh_token_and_old_tokens_stay_invalid() {
    let n = open();
    let pg = page();
    let a = map(2);
    let old = n.register(a..a + 2 * pg, Cookie(9)).unwrap();
    // SAFETY: test-owned mapping.
    unsafe { libc::madvise(a as *mut _, pg, libc::MADV_DONTNEED) };
    assert!(!n.is_valid(old));
    // SAFETY: as above.
    unsafe { libc::madvise(a as *mut _, 2 * pg, libc::MADV_DONTNEED) };
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1, "one pending event per region");
    assert!(!ev[0].hint, "two invalidations: the whole region, no hint");
    assert_eq!(ev[0].range(), a..a + 2 * pg);
    let fresh = n.region(Cookie(9)).unwrap();
    assert!(n.is_valid(fresh));
    assert!(
        !n.is_valid(old),
        "a token from before the invalidation never reads valid again"
    );
    // SAFETY: as above.
    unsafe { libc::madvise((a + pg) as *mut _, pg, libc::MADV_DONTNEED) };
    assert!(!n.is_valid(fresh));
    let ev = n.events().unwrap();
    assert_eq!(
        (ev.len(), ev[0].range(), ev[0].hint),
        (1, a + pg..a + 2 * pg, true)
    );
    n.unregister(Cookie(9)).unwrap();
    // SAFETY: as above.
    unsafe { libc::munmap(a as *mut _, 2 * pg) };
}

#[test]
#[ignore = "needs the /dev/ummunotify module: kernel/ci.sh runs it in its guest"]
fn unregister_drops_the_event_and_errors_are_typed() {
    let n = open();
    let pg = page();
    let a = map(1);
    let r = n.register(a..a + pg, Cookie(3)).unwrap();
    assert!(matches!(
        n.register(a..a + pg, Cookie(3)),
        Err(Error::DuplicateCookie(Cookie(3)))
    ));
    assert!(matches!(
        n.register(a..a, Cookie(4)),
        Err(Error::EmptyRange)
    ));
    assert!(matches!(
        n.unregister(Cookie(4)),
        Err(Error::UnknownCookie(Cookie(4)))
    ));
    assert_eq!(n.regions(), 1);
    // SAFETY: test-owned mapping.
    unsafe { libc::madvise(a as *mut _, pg, libc::MADV_DONTNEED) };
    assert!(!n.is_valid(r));
    n.unregister(Cookie(3)).unwrap();
    assert!(
        n.events().unwrap().is_empty(),
        "unregister drops the queued event"
    );
    assert!(!n.is_valid(r));
    // SAFETY: as above.
    unsafe { libc::munmap(a as *mut _, pg) };
}

#[test]
#[ignore = "needs the /dev/ummunotify module: kernel/ci.sh runs it in its guest"]
fn a_forked_child_never_trusts_the_parents_registration_and_the_parent_sees_the_cow() {
    let n = open();
    let pg = page();
    let a = map(1);
    let r = n.register(a..a + pg, Cookie(5)).unwrap();
    let seen = n.generation();
    assert!(n.is_valid(r));
    // SAFETY: the child only loads, makes raw syscalls through the client and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = !n.is_valid(r)
            && !n.unchanged_since(seen)
            && matches!(n.register(a..a + pg, Cookie(6)), Err(Error::Forked))
            && matches!(n.events(), Err(Error::Forked));
        // SAFETY: leave the child without running the parent's destructors or test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child: {status:#x}"
    );
    // fork write-protected the parent's private pages for copy-on-write: an MMU invalidation of
    // the region in the parent's mm (its next write gets a new frame), which the module reports.
    assert!(
        !n.is_valid(r),
        "fork's write-protection of the region is an invalidation"
    );
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].cookie, Cookie(5));
    assert!(n.is_valid(n.region(Cookie(5)).unwrap()));
    n.unregister(Cookie(5)).unwrap();
    // SAFETY: test-owned mapping.
    unsafe { libc::munmap(a as *mut _, pg) };
}

#[test]
#[ignore = "needs the /dev/ummunotify module: kernel/ci.sh runs it in its guest"]
fn the_notifier_on_the_kernel_backend_and_auto_prefers_it() {
    use ummunotify::{Backend, Notifier};
    let auto = Notifier::with_backend(Backend::Auto).unwrap();
    assert_eq!(auto.backend(), Backend::Kernel, "{}", auto.backend_reason());
    drop(auto);
    let n = Notifier::with_backend(Backend::Kernel).unwrap();
    let pg = page();
    let a = map(4);
    let r = n.register(a + pg..a + 3 * pg, Cookie(11)).unwrap();
    let g = n.generation().unwrap();
    assert!(n.is_valid(r) && n.unchanged_since(g));
    // A raw syscall: the module sees it in the madvising thread, before it returns.
    // SAFETY: test-owned mapping.
    unsafe { libc::syscall(libc::SYS_madvise, a + 2 * pg, pg, libc::MADV_DONTNEED) };
    assert!(
        !n.unchanged_since(g),
        "the counter check did not see the madvise"
    );
    assert!(!n.is_valid(r));
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].cookie, ev[0].range(), ev[0].hint),
        (Cookie(11), a + 2 * pg..a + 3 * pg, true)
    );
    let r = n.region(Cookie(11)).unwrap();
    assert!(n.is_valid(r), "re-armed after the read");
    n.unregister(Cookie(11)).unwrap();
    // Unwatched now: a change there reaches no region and moves no counter.
    let g = n.generation().unwrap();
    // SAFETY: as above.
    unsafe { libc::munmap(a as *mut _, 4 * pg) };
    assert!(n.unchanged_since(g));
}
