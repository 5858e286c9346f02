//! Fork safety (guarantee 6).
//!
//! Without `UFFD_FEATURE_EVENT_FORK` a child's mappings lose their watches and the child has no
//! monitor thread. A `pthread_atfork` child handler therefore replaces each live notifier's shared
//! counter page, in the child only, by a private page that reads `DEAD | FORKED`: every check in
//! the child fails at once, every method returns `Error::Forked`, and nothing waits for a thread
//! that does not exist. The table of live counter pages is a fixed array of atomics, so the
//! handler neither allocates nor locks.
#![allow(unsafe_code)] // pthread_atfork and the async-signal-safe child handler.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;

use crate::generation::{DEAD, FORKED};

/// The most notifiers alive at once in one process.
const MAX_NOTIFIERS: usize = 1024;

static PAGES: [AtomicUsize; MAX_NOTIFIERS] = [const { AtomicUsize::new(0) }; MAX_NOTIFIERS];
static INSTALL: Once = Once::new();

extern "C" fn in_child() {
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
        INSTALL.call_once(|| {
            // SAFETY: registers a handler with no preconditions that lives for the whole process.
            unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        });
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
