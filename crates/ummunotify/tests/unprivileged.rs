//! The notifier without privileges: as `nobody`, userfaultfd is only available with
//! `UFFD_USER_MODE_ONLY` (vm.unprivileged_userfaultfd = 0 here), and the non-cooperative events
//! this crate uses still work with it.
mod common;

use common::*;
use ummunotify::{Cookie, Notifier};

#[test]
fn works_as_an_unprivileged_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Already unprivileged: the same checks run directly below, in the child.
        eprintln!("running as a non-root user already");
    }
    let code = in_child(|| {
        // SAFETY: dropping to nobody (65534) in the child only.
        if unsafe { libc::geteuid() } == 0
            && unsafe { libc::setgid(65534) != 0 || libc::setuid(65534) != 0 }
        {
            return 10;
        }
        // vm.unprivileged_userfaultfd = 0: the plain syscall is refused, the user-mode-only
        // context is what works.
        let strict = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
            .is_ok_and(|v| v.trim() == "0");
        let Some(how) = ummunotify::probe()
            .into_iter()
            .find(|r| r.name == "userfaultfd")
            .map(|r| r.status)
        else {
            eprintln!("no userfaultfd entry in ummunotify::probe()");
            return 14;
        };
        if strict && !matches!(&how, Ok(s) if s.contains("UFFD_USER_MODE_ONLY")) {
            eprintln!("expected the UFFD_USER_MODE_ONLY path, got {how:?}");
            return 13;
        }
        let n = match Notifier::new() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("unprivileged Notifier::new: {e}");
                return 11;
            }
        };
        let p = map(2 * PAGE);
        let Ok(r) = n.register(p..p + 2 * PAGE, Cookie(1)) else {
            return 12;
        };
        madvise(p, PAGE, libc::MADV_DONTNEED);
        let mut fails = n.is_valid(r) as i32;
        unmap(p, 2 * PAGE);
        let events = n.events().unwrap_or_default();
        fails += (events.len() != 1) as i32;
        fails
    });
    assert_eq!(code, 0, "unprivileged child failed ({code})");
}
