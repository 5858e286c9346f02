//! The shared generation counter and the invalidation-visibility protocol.
//!
//! This module is the protocol of `docs/ARCHITECTURE.md`, written once. The monitor calls
//! [`begin_message`] before each single-message `read()` and [`end_message`] after it has applied
//! the message; checkers call [`unchanged`] and [`region_valid`]. `tests/loom_protocol.rs` runs
//! these same functions under loom.
//!
//! Counter word: bit 63 `DEAD`, bit 62 `FORKED`, bit 0 `BUSY`, and a count that grows by two per
//! message. A stable snapshot is always even and never has `DEAD`.
use crate::primitive::{backoff, AtomicBool, AtomicU64};
use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};

/// The monitor is between committing to dequeue a message and finishing applying it.
pub(crate) const BUSY: u64 = 1;
/// No more events will be applied: every check fails.
pub(crate) const DEAD: u64 = 1 << 63;
/// Set together with `DEAD` in a forked child.
pub(crate) const FORKED: u64 = 1 << 62;

/// A snapshot of a notifier's generation counter: "nothing changed since" is one load and compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Generation(pub(crate) u64);

impl Generation {
    /// The raw counter value (even; the same value the C API and 2010 ABI expose).
    pub fn value(self) -> u64 {
        self.0
    }
}

/// Monitor, step 2–3: mark busy, then make the readiness fd readable if it was not.
/// Returns whether the caller must signal the readiness fd (the flag went false → true).
#[inline]
pub(crate) fn begin_message(counter: &AtomicU64, ready: &AtomicBool) -> bool {
    // SeqCst: this increment must be ordered before the read() that releases the unmapping
    // thread (the syscall is a full barrier; SeqCst also pairs with `reset_ready`'s reload).
    counter.fetch_add(BUSY, SeqCst);
    !ready.swap(true, SeqCst)
}

/// Monitor, step 6: the message has been applied; publish with Release so a checker that
/// Acquire-loads the even value sees every validity word the message changed.
#[inline]
pub(crate) fn end_message(counter: &AtomicU64) {
    counter.fetch_add(BUSY, Release);
}

/// Marks the counter dead (monitor gone): every check from now on fails.
pub(crate) fn kill(counter: &AtomicU64) {
    counter.fetch_or(DEAD, SeqCst);
}

/// The one-load fast path: true iff no message was dequeued since `snapshot` was taken.
#[inline]
pub(crate) fn unchanged(counter: &AtomicU64, snapshot: Generation) -> bool {
    counter.load(Acquire) == snapshot.0
}

/// Waits until the monitor is not busy; returns the even counter value, or `Err(value)` if dead.
#[inline]
pub(crate) fn wait_idle(counter: &AtomicU64) -> Result<u64, u64> {
    let mut round = 0;
    loop {
        let c = counter.load(Acquire);
        if c & DEAD != 0 {
            return Err(c);
        }
        if c & BUSY == 0 {
            return Ok(c);
        }
        backoff(&mut round);
    }
}

/// The per-region check: waits out a busy monitor, then one load of the region's word.
#[inline]
pub(crate) fn region_valid(counter: &AtomicU64, word: &AtomicU64, expected: u64) -> bool {
    if wait_idle(counter).is_err() {
        return false;
    }
    // Ordered after the Acquire load of an even counter value: sees every INVALID bit set by
    // messages whose end_message that value includes.
    word.load(Acquire) == expected
}

/// Clears readiness when the event queue is empty (caller holds the index lock), in the order
/// that pairs with [`begin_message`]: drain the fd, clear the flag, then reload the counter. If
/// the monitor went busy meanwhile, readiness is set again. Returns whether the caller must
/// signal the fd again.
pub(crate) fn reset_ready(
    counter: &AtomicU64,
    ready: &AtomicBool,
    drain_fd: impl FnOnce(),
) -> bool {
    drain_fd();
    ready.store(false, SeqCst);
    if counter.load(SeqCst) & BUSY != 0 {
        return !ready.swap(true, SeqCst);
    }
    false
}

/// Sets readiness after events were queued (caller holds the index lock). Returns whether the
/// caller must signal the fd.
pub(crate) fn set_ready(ready: &AtomicBool) -> bool {
    !ready.swap(true, SeqCst)
}
