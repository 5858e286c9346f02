//! Which file descriptors are ummunotify devices: a fixed, lock-free table indexed by fd.
//!
//! Every `read`, `close`, `mmap`, ... in the process asks this table first, including the
//! notifier's own monitor thread reading its userfaultfd, so a lookup of a non-device fd is one
//! atomic load and never takes a lock or allocates. A device lookup pins the entry with a
//! per-slot reader count so `close` on another thread can not free it mid-lookup.
//!
//! Fork: a thread of the parent that was between its reader count's increment and decrement
//! when another thread forked does not exist in the child, so the child would inherit a count
//! that never drops and spin for ever in its first `close` (or `dup2`, `close_range`, `open`)
//! of that number. [`reset_readers_in_child`] (the crate's `pthread_atfork` child handler)
//! zeroes every count: the child's one thread is inside `fork`, not inside a lookup.
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use crate::device::Device;

/// Descriptors at or above this number can not be devices (`open` fails with `EMFILE`).
pub(crate) const MAX_FDS: usize = 1 << 16;

struct Slot {
    dev: AtomicPtr<Device>,
    readers: AtomicUsize,
}

static TABLE: [Slot; MAX_FDS] = [const {
    Slot {
        dev: AtomicPtr::new(std::ptr::null_mut()),
        readers: AtomicUsize::new(0),
    }
}; MAX_FDS];

/// How many fds are devices now (a fast "none" answer for whole-range operations).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// One more than the highest fd that was ever a device: [`for_each_entry`] looks no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

fn slot(fd: i32) -> Option<&'static Slot> {
    usize::try_from(fd).ok().and_then(|i| TABLE.get(i))
}

/// The device behind `fd`, if it is one: the entry must still own the number (see
/// [`Device::owns`]); a stale entry, left by a raw `close`/`dup2`/`close_range` syscall, is
/// ignored (and swept by the next `open` of the device, or replaced when the number is reused
/// through this library).
#[inline]
pub(crate) fn get(fd: i32) -> Option<Arc<Device>> {
    entry(fd).filter(|dev| dev.owns(fd))
}

/// The entry for `fd`, stale or not.
#[inline]
fn entry(fd: i32) -> Option<Arc<Device>> {
    let s = slot(fd)?;
    if s.dev.load(SeqCst).is_null() {
        return None; // the common case: one load
    }
    // Announce the read before loading the pointer; `take` clears the pointer before waiting for
    // readers, so either we see null or it sees us and waits (both SeqCst).
    s.readers.fetch_add(1, SeqCst);
    let p = s.dev.load(SeqCst);
    let dev = if p.is_null() {
        None
    } else {
        // SAFETY: `p` came from `Arc::into_raw` in `set`; the table's reference can not be
        // dropped while `readers` is non-zero, so the count is at least 1 here.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    };
    s.readers.fetch_sub(1, SeqCst);
    dev
}

/// Whether any fd is a device now.
#[inline]
pub(crate) fn any() -> bool {
    LIVE.load(SeqCst) != 0
}

/// Calls `f` with every device in the table, stale entries included (a device reached through
/// two numbers is passed twice). Lock-free and allocation-free: one load per number up to the
/// highest that was ever a device.
pub(crate) fn for_each_entry(mut f: impl FnMut(&Device)) {
    if !any() {
        return;
    }
    for fd in 0..HIGH.load(SeqCst).min(MAX_FDS) {
        if let Some(dev) = entry(fd as i32) {
            f(&dev);
        }
    }
}

/// Makes `fd` refer to `dev`; returns what it referred to before (the caller drops it after the
/// real call that replaced the fd).
pub(crate) fn set(fd: i32, dev: Arc<Device>) -> Option<Arc<Device>> {
    let s = slot(fd)?;
    HIGH.fetch_max(fd as usize + 1, SeqCst);
    let old = s.dev.swap(Arc::into_raw(dev).cast_mut(), SeqCst);
    if old.is_null() {
        LIVE.fetch_add(1, SeqCst);
    }
    finish(s, old)
}

/// Forgets `fd`; returns the device it was.
pub(crate) fn take(fd: i32) -> Option<Arc<Device>> {
    let s = slot(fd)?;
    if s.dev.load(SeqCst).is_null() {
        return None;
    }
    let old = s.dev.swap(std::ptr::null_mut(), SeqCst);
    if !old.is_null() {
        LIVE.fetch_sub(1, SeqCst);
    }
    finish(s, old)
}

fn finish(s: &Slot, old: *mut Device) -> Option<Arc<Device>> {
    if old.is_null() {
        return None;
    }
    while s.readers.load(SeqCst) != 0 {
        std::hint::spin_loop(); // readers hold the slot for a few instructions only
    }
    // SAFETY: `old` came from `Arc::into_raw` in `set` and the table no longer holds it; no
    // reader is between its load and its increment.
    Some(unsafe { Arc::from_raw(old) })
}

/// In a forked child (`pthread_atfork` child handler; atomics only, async-signal-safe): no
/// lookup is in progress in the child's one thread, so every reader count is zeroed. The
/// references taken by parent threads that were mid-lookup are leaked in the child, never
/// dropped (a child's device is never freed through them).
pub(crate) fn reset_readers_in_child() {
    for s in &TABLE[..HIGH.load(SeqCst).min(MAX_FDS)] {
        s.readers.store(0, SeqCst);
    }
}

/// Drops every entry whose descriptor number no longer names its device's file (a raw
/// `close`, `close_range` or `dup2` syscall went around this library). Called from `open` of
/// the device, on the opening thread: dropping a device may join its notifier's monitor.
pub(crate) fn sweep_stale() {
    if !any() {
        return;
    }
    let mut stale = Vec::new();
    for (fd, s) in TABLE.iter().enumerate() {
        if s.dev.load(SeqCst).is_null() {
            continue;
        }
        let fd = fd as i32;
        if let Some(dev) = entry(fd) {
            if !dev.owns(fd) {
                let p = Arc::as_ptr(&dev).cast_mut();
                // Only if the entry is still the stale one (a concurrent `set` may replace it).
                if s.dev
                    .compare_exchange(p, std::ptr::null_mut(), SeqCst, SeqCst)
                    .is_ok()
                {
                    LIVE.fetch_sub(1, SeqCst);
                    stale.extend(finish(s, p));
                }
            }
        }
    }
    drop(stale);
}
