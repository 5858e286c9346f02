//! The perf tracepoint backend through the public API (issue 13). The mechanism's own tests are
//! in `src/backend/perf/tests.rs`; `umn coverage --backend perf` runs the whole catalogue.
//!
//! Needs root (or CAP_PERFMON) and tracefs: where the backend can not start, a loud skip (a
//! failure under `UMN_REQUIRE_ALL=1`). One test per binary run matters here: the backend traces
//! every thread of its process, so these tests run one at a time (`--test-threads=1` is not
//! needed: each test is alone in this file).
mod common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{map, perf_or_skip, unmap, PAGE};
use ummunotify::Cookie;

/// A raw userfaultfd with `EVENT_REMOVE` registered (missing mode) over `[a, a + len)`: a
/// `madvise(DONTNEED)` there sleeps after its entry record until the message is read.
fn remove_blocker(a: usize, len: usize) -> OwnedFd {
    // SAFETY: the syscall returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC | libc::O_NONBLOCK | 1, /* UFFD_USER_MODE_ONLY */
        )
    };
    assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    use std::os::fd::AsRawFd;
    // struct uffdio_api { api = 0xAA, features = EVENT_REMOVE (1 << 3), ioctls }.
    let mut api = [0xAAu64, 1 << 3, 0];
    // SAFETY: UFFDIO_API reads and writes one struct uffdio_api.
    assert_eq!(
        unsafe { libc::ioctl(fd.as_raw_fd(), 0xC018_AA3F, api.as_mut_ptr()) },
        0
    );
    // struct uffdio_register { start, len, mode = MISSING (1), ioctls }.
    let mut reg = [a as u64, len as u64, 1, 0];
    // SAFETY: UFFDIO_REGISTER reads and writes one struct uffdio_register.
    assert_eq!(
        unsafe { libc::ioctl(fd.as_raw_fd(), 0xC020_AA00, reg.as_mut_ptr()) },
        0
    );
    fd
}

fn read_remove(fd: &OwnedFd) {
    use std::os::fd::AsRawFd;
    let mut msg = [0u8; 32];
    let t = Instant::now();
    // SAFETY: 32 writable bytes, one uffd_msg.
    while unsafe { libc::read(fd.as_raw_fd(), msg.as_mut_ptr().cast(), 32) } != 32 {
        assert!(t.elapsed() < Duration::from_secs(10), "no REMOVE message");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Some thread of this process sleeps in `madvise` at `a` (its `/proc` syscall line says so).
fn in_madvise_at(a: usize) -> bool {
    std::fs::read_dir("/proc/self/task").unwrap().any(|e| {
        std::fs::read_to_string(e.unwrap().path().join("syscall")).is_ok_and(|s| {
            let mut f = s.split(' ');
            f.next() == Some(&libc::SYS_madvise.to_string())
                && f.next() == Some(&format!("0x{a:x}"))
        })
    })
}

/// Item 3 of issue 13: the entry record comes before the change. A region registered after the
/// entry was delivered and before the call returned (while the pages are about to be dropped)
/// must not read valid after the call returned: the call's exit record (in the ring before the
/// call returns) invalidates its range again, whatever the window did meanwhile.
#[test]
fn a_registration_between_entry_and_exit_is_not_valid_after_the_call() {
    let Some(n) = perf_or_skip("perf_window_registration") else {
        return;
    };
    let len = 4 * PAGE;
    let a = map(len);
    let blocker = remove_blocker(a, len);
    let t = std::thread::spawn(move || {
        // SAFETY: our own mapping.
        assert_eq!(
            unsafe { libc::madvise(a as *mut _, len, libc::MADV_DONTNEED) },
            0
        );
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !in_madvise_at(a) {
        assert!(Instant::now() < deadline, "the madvise never blocked");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The call is between its entry (recorded) and its zap.
    let r = n.register(a..a + len, Cookie(7)).expect("register");
    // (It may read valid now: the call has not returned. The window makes it wait, bounded,
    // and the core ends a window by grace; what must hold is the next assertion.)
    read_remove(&blocker);
    t.join().unwrap();
    assert!(!n.is_valid(r), "valid after the call returned");
    assert!(n.events().unwrap().iter().any(|e| e.cookie == Cookie(7)));
    // A registration after the call returned (its exit delivered) is valid.
    let r2 = n.register(a..a + len, Cookie(8)).expect("register after");
    assert!(n.is_valid(r2));
    drop(blocker);
    unmap(a, len);
}
