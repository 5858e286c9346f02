//! One cached registration.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use crate::{Cookie, Region};

/// A cached registration: its page-aligned range, the device key, and its notifier region.
pub(super) struct Entry<K> {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) key: K,
    pub(super) cookie: Cookie,
    pub(super) token: Region,
    /// CLOCK bit: set by hits (only when clear, so steady-state hits only read it), cleared by the
    /// eviction sweep.
    pub(super) referenced: AtomicBool,
    /// Out of the index (invalidated, merged away or evicted); never handed out again.
    pub(super) removed: AtomicBool,
    /// Handles that did not fit in their thread's hazard slots.
    pub(super) shared_holds: AtomicUsize,
    /// Still registered with the notifier.
    pub(super) watched: AtomicBool,
}

impl<K> Entry<K> {
    pub(super) fn new(range: Range<usize>, key: K, cookie: Cookie, token: Region) -> Self {
        Entry {
            start: range.start,
            end: range.end,
            key,
            cookie,
            token,
            referenced: AtomicBool::new(true),
            removed: AtomicBool::new(false),
            shared_holds: AtomicUsize::new(0),
            watched: AtomicBool::new(true),
        }
    }

    pub(super) fn range(&self) -> Range<usize> {
        self.start..self.end
    }

    pub(super) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(super) fn covers(&self, start: usize, end: usize) -> bool {
        self.start <= start && end <= self.end
    }

    /// Marks the entry recently used (a read in steady state).
    #[inline]
    pub(super) fn touch(&self) {
        if !self.referenced.load(Relaxed) {
            self.referenced.store(true, Relaxed);
        }
    }
}
