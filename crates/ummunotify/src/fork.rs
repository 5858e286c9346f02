//! Fork safety (guarantee 6).
//!
//! Without `UFFD_FEATURE_EVENT_FORK` a child's mappings lose their watches and the child has no
//! monitor thread. A `pthread_atfork` child handler therefore replaces each live notifier's shared
//! counter page, in the child only, by a private page that reads `DEAD | FORKED`: every check in
//! the child fails at once, every method returns `Error::Forked`, and nothing waits for a thread
//! that does not exist. The table of live counter pages is a fixed array of atomics, so the
//! handler neither allocates nor locks.
#![allow(unsafe_code)] // pthread_atfork and the async-signal-safe child handler.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::SeqCst};

use crate::generation::{DEAD, FORKED};

/// The most notifiers alive at once in one process.
const MAX_NOTIFIERS: usize = 1024;

static PAGES: [AtomicUsize; MAX_NOTIFIERS] = [const { AtomicUsize::new(0) }; MAX_NOTIFIERS];
static INSTALL: AtforkOnce = AtforkOnce::new();

/// Child, parent or prepare handler of `pthread_atfork`.
pub(crate) type Handler = Option<unsafe extern "C" fn()>;

/// Registers a set of `pthread_atfork` handlers once per process, without a `Once`.
///
/// A `std::sync::Once` is inherited by a child as it was: a child forked while another thread of
/// the parent was inside `call_once` (between taking the `Once` and `pthread_atfork`, or
/// between that and finishing) would wait for ever in its own first `call_once`, for a thread
/// that does not exist in it. Here the state is 0 (not registered), [`AtforkOnce::DONE`], or
/// the pid of the process registering. The child handler marks the state done first thing (it
/// ran, so it is registered in this process); a child that finds its parent's pid there instead
/// knows the parent had not registered when it forked, and registers itself.
pub(crate) struct AtforkOnce(AtomicI32);

impl AtforkOnce {
    const DONE: i32 = -1;

    pub(crate) const fn new() -> AtforkOnce {
        AtforkOnce(AtomicI32::new(0))
    }

    /// Registers the handlers unless this process already did; waits (yielding) while another
    /// thread of this process is registering them.
    pub(crate) fn register(&self, prepare: Handler, parent: Handler, child: Handler) {
        loop {
            let s = self.0.load(SeqCst);
            if s == Self::DONE {
                return;
            }
            // SAFETY: getpid has no preconditions.
            let me = unsafe { libc::getpid() };
            if s == me {
                std::thread::yield_now(); // another thread of this process is registering
                continue;
            }
            // 0, or a parent's registration that had not happened when this child was forked.
            if self.0.compare_exchange(s, me, SeqCst, SeqCst).is_ok() {
                // SAFETY: registers handlers with no preconditions that live for the process.
                let rc = unsafe { libc::pthread_atfork(prepare, parent, child) };
                if rc != 0 {
                    self.0.store(0, SeqCst); // ENOMEM: the next caller tries again
                    return;
                }
                self.0.store(Self::DONE, SeqCst);
                return;
            }
        }
    }

    /// First thing in the child handler: the handler ran, so it is registered in this process.
    /// An atomic store (async-signal-safe).
    pub(crate) fn registered_in_child(&self) {
        self.0.store(Self::DONE, SeqCst);
    }
}

extern "C" fn in_child() {
    INSTALL.registered_in_child();
    for p in &PAGES {
        let addr = p.load(SeqCst);
        if addr != 0 {
            // SAFETY: a non-zero entry is the address of a live counter page (entries are cleared
            // before their page is unmapped), inherited by this child.
            unsafe { crate::sys::poison_counter_page_in_child(addr, DEAD | FORKED) };
        }
    }
}

/// A notifier's entry in the table; cleared by [`Slot::release`] before its page is unmapped.
pub(crate) struct Slot(Option<usize>);

impl Slot {
    /// Records the counter page at `addr`. `None` when the table is full.
    pub(crate) fn new(addr: usize) -> Option<Slot> {
        INSTALL.register(None, None, Some(in_child));
        PAGES
            .iter()
            .position(|p| p.compare_exchange(0, addr, SeqCst, SeqCst).is_ok())
            .map(|i| Slot(Some(i)))
    }

    /// Removes the entry (idempotent). Must happen before the page is unmapped.
    pub(crate) fn release(&mut self) {
        if let Some(i) = self.0.take() {
            PAGES[i].store(0, SeqCst);
        }
    }
}

impl Drop for Slot {
    /// Also on the error paths of `Notifier::new`: an entry left behind would make a later child
    /// map a page over whatever reuses the address.
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static ONCE: AtforkOnce = AtforkOnce::new();
    static RAN: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn child() {
        ONCE.registered_in_child();
        RAN.fetch_add(1, SeqCst);
    }

    /// Waits for `pid` at most 20 s; its exit code, or `None` (killed) if it was still running.
    fn wait_exit(pid: libc::pid_t) -> Option<i32> {
        for _ in 0..20_000 {
            let mut st = 0;
            // SAFETY: waits for our own child.
            if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
                return libc::WIFEXITED(st).then(|| libc::WEXITSTATUS(st));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        None
    }

    /// A child forked while its parent was registering (the state holds the parent's pid, as a
    /// `Once` would hold "running") registers by itself instead of waiting for a thread it does
    /// not have, and its handler then runs in its own children.
    #[test]
    fn a_child_forked_mid_registration_registers_itself() {
        // SAFETY: getpid has no preconditions.
        ONCE.0.store(unsafe { libc::getpid() }, SeqCst); // "another thread is registering"
                                                         // SAFETY: the child makes only the calls below and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            ONCE.register(None, None, Some(child)); // must not wait
            let ok = ONCE.0.load(SeqCst) == AtforkOnce::DONE && RAN.load(SeqCst) == 0;
            // SAFETY: as above; the grandchild runs `child` and reports what it saw.
            let gc = unsafe { libc::fork() };
            if gc == 0 {
                let code = if RAN.load(SeqCst) == 1 { 0 } else { 3 };
                // SAFETY: leaves the grandchild at once.
                unsafe { libc::_exit(code) };
            }
            let code = match (ok, wait_exit(gc)) {
                (true, Some(0)) => 0,
                (false, _) => 2,
                _ => 4,
            };
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(code) };
        }
        ONCE.0.store(AtforkOnce::DONE, SeqCst); // the parent's "registration" finishes
        assert_eq!(
            wait_exit(pid),
            Some(0),
            "the child hung (None), or registered nothing (2), or its handler did not run in \
             its own child (4)"
        );
    }
}
