//! New mappings inside registered ranges: the 2010 device watched address ranges, mapped or not,
//! so memory mapped into a registered hole was watched from then on. userfaultfd tells nothing of
//! new mappings, so the calls that make them are interposed here and, once they returned, every
//! device is told of the new range ([`ummunotify::Notifier::mapped`]).
//!
//! Seen: `mmap`/`mmap64` (also `MAP_FIXED` over a hole), the target of `mremap`, `shmat`, `brk`
//! and `sbrk` growth, as the program calls them through the dynamic linker. Not seen (documented
//! in the crate docs, shown by a test): a raw `mmap` syscall, glibc's internal calls (`malloc`'s
//! own `mmap`/`brk`, which do not go through these symbols), and mappings made by this library
//! itself (the notifier's slot segments): a call that starts inside another interposed call of
//! this library announces nothing, which also keeps a notifier's own `mmap` (made with its
//! registry lock held) from re-entering it.
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ops::Range;

use crate::table;

thread_local! {
    /// This thread is inside one of this library's interposed calls.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread inside an interposed call for as long as it lives; `outer()` says
/// whether it is the outermost one.
pub(crate) struct Inside {
    outer: bool,
}

impl Inside {
    pub(crate) fn enter() -> Inside {
        Inside {
            outer: !INSIDE.with(|c| c.replace(true)),
        }
    }

    fn outer(&self) -> bool {
        self.outer
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        if self.outer {
            INSIDE.with(|c| c.set(false));
        }
    }
}

/// Tells every device that `range` was just mapped (when the call is the program's own).
pub(crate) fn announce(inside: &Inside, range: Range<usize>) {
    if !inside.outer() || range.is_empty() {
        return;
    }
    table::for_each_entry(|dev| dev.mapped(range.clone()));
}

/// After a successful `mmap`/`mmap64` that was not of a device.
pub(crate) fn after_mmap(inside: &Inside, p: *mut c_void, len: usize) {
    if p != libc::MAP_FAILED {
        announce(inside, p as usize..(p as usize).saturating_add(len));
    }
}

/// The size of SysV segment `shmid` (for `shmat`), or 0 if it can not be read.
pub(crate) fn shm_size(shmid: c_int) -> usize {
    // SAFETY: `shmid_ds` is plain data; IPC_STAT writes one into the local.
    unsafe {
        let mut ds: libc::shmid_ds = std::mem::zeroed();
        if libc::shmctl(shmid, libc::IPC_STAT, &mut ds) == 0 {
            ds.shm_segsz
        } else {
            0
        }
    }
}
