//! The hybrid backend (hooks in front of userfaultfd), on the real kernel: libc's calls are
//! caught in the calling thread, which removes the userfaultfd watch from their pages before
//! calling through (the kernel's own view, `VmFlags` in smaps, shows the watch gone, so no
//! message was queued and nobody waited for the monitor); raw syscalls still reach
//! userfaultfd; shmdt, which userfaultfd never reports, is seen; pages another userfaultfd owns
//! are watched by the hooks alone instead of refused; fork leaves no child hanging.
//!
//! The deadlock hunt under hybrid is in `tests/hooks.rs` (`..._under_hybrid`).
mod common;

use common::*;
use ummunotify::{Backend, Cookie, Error, Notifier};

fn hybrid() -> Notifier {
    let n = Notifier::with_backend(Backend::Hybrid).expect("hybrid backend");
    assert_eq!(n.backend(), Backend::Hybrid);
    n
}

fn raw(nr: libc::c_long, a: usize, b: usize, c: libc::c_long) -> libc::c_long {
    // SAFETY: munmap/madvise syscalls on the caller's own mappings.
    unsafe { libc::syscall(nr, a, b, c) }
}

#[test]
fn libc_calls_are_seen_in_the_thread_and_leave_no_watch_for_the_kernel_to_report() {
    let n = hybrid();
    let p = map(3 * PAGE);
    let r = n.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    assert!(uffd_wp_registered(p), "hybrid watches with userfaultfd too");
    madvise(p, PAGE, libc::MADV_DONTNEED);
    assert!(!n.is_valid(r), "libc madvise not seen before it returned");
    assert!(
        !uffd_wp_registered(p),
        "the hook left the userfaultfd watch on the page: the kernel queued a message"
    );
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].start, ev[0].end), (p, p + PAGE));
    // Re-armed: watched again, by both.
    let r = n.region(Cookie(1)).unwrap();
    assert!(n.is_valid(r));
    assert!(
        uffd_wp_registered(p),
        "re-arming did not watch the page again"
    );
    unmap(p, 3 * PAGE);
    assert!(!n.is_valid(r), "libc munmap not seen before it returned");
    assert_eq!(n.events().unwrap().len(), 1);
}

#[test]
fn raw_syscalls_still_reach_userfaultfd() {
    let n = hybrid();
    let p = map(2 * PAGE);
    let r = n.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    assert_eq!(raw(libc::SYS_madvise, p, PAGE, libc::MADV_DONTNEED as _), 0);
    assert!(!n.is_valid(r), "raw madvise not seen before it returned");
    n.events().unwrap();
    let r = n.region(Cookie(1)).unwrap();
    assert!(n.is_valid(r));
    assert_eq!(raw(libc::SYS_munmap, p, 2 * PAGE, 0), 0);
    assert!(!n.is_valid(r), "raw munmap not seen before it returned");
    assert_eq!(n.events().unwrap().len(), 1);
}

#[test]
fn shmdt_is_seen() {
    let n = hybrid();
    // SAFETY: a private SysV segment, removed below.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 2 * PAGE, libc::IPC_CREAT | 0o600) };
    assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
    // SAFETY: attaches the segment at an address the kernel chooses.
    let a = unsafe { libc::shmat(id, std::ptr::null(), 0) } as usize;
    // SAFETY: marks the segment for removal once detached.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    assert_ne!(a, usize::MAX, "shmat: {}", std::io::Error::last_os_error());
    let r = n
        .register(a..a + 2 * PAGE, Cookie(1))
        .map_err(std::io::Error::from);
    // Watching shm with userfaultfd needs UFFD_FEATURE_WP_ASYNC: a kernel without it fails CI.
    let Some(r) = ummunotify_testkit::require::or_skip("hybrid shmdt_is_seen", r) else {
        return;
    };
    // SAFETY: detaches our own segment.
    assert_eq!(unsafe { libc::shmdt(a as *const libc::c_void) }, 0);
    assert!(!n.is_valid(r), "shmdt not seen before it returned");
}

#[test]
fn pages_a_foreign_userfaultfd_owns_are_watched_by_the_hooks_alone() {
    let n = hybrid();
    let p = map(3 * PAGE);
    let foreign = foreign_userfaultfd(p, 2 * PAGE);
    let r = n.register(p + PAGE..p + 3 * PAGE, Cookie(1)).unwrap();
    assert!(n.stats().hooks_only_watches >= 1, "{:?}", n.stats());
    madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
    assert!(
        !n.is_valid(r),
        "libc madvise on a foreign-owned page not seen"
    );
    n.events().unwrap();
    let r = n.region(Cookie(1)).unwrap();
    unmap(p, 3 * PAGE);
    assert!(
        !n.is_valid(r),
        "libc munmap on a foreign-owned page not seen"
    );
    drop(foreign);
}

#[test]
fn a_forked_child_never_hangs_and_starts_its_own() {
    let n = hybrid();
    let p = map(2 * PAGE);
    let r = n.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    let code = in_child(|| {
        if n.is_valid(r) || !matches!(n.events(), Err(Error::Forked)) {
            return 1;
        }
        // libc and raw unmaps of the parent's registered pages return (hooks ignore the
        // parent's sinks here; the context's watch is the parent's).
        unmap(p, PAGE);
        if raw(libc::SYS_munmap, p + PAGE, PAGE, 0) != 0 {
            return 2;
        }
        let c = hybrid();
        let q = map(PAGE);
        let Ok(rc) = c.register(q..q + PAGE, Cookie(2)) else {
            return 3;
        };
        unmap(q, PAGE);
        if c.is_valid(rc) {
            return 4;
        }
        0
    });
    assert_eq!(code, 0, "child failed at step {code}");
    assert!(n.is_valid(r));
    unmap(p, 2 * PAGE);
    assert!(!n.is_valid(r));
}
