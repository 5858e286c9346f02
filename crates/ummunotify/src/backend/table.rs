//! A fixed table of the sinks one delivery path serves (the hooks' of the process, the
//! userfaultfd monitor's of its context), safe to read on the event path: no allocation, no
//! lock, no free while a reader is inside.
//!
//! A reader announces itself in the slot's user count before it loads the pointer; a sink
//! leaves by clearing its slot and then waiting until the count is zero, and only then frees
//! its box. So every pointer a reader loaded stays valid until it says it is done.
#![allow(unsafe_code)] // Thin raw pointers to boxed `Arc<dyn Sink>`s, handed to readers.

use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};
use std::sync::atomic::{AtomicPtr, AtomicUsize};
use std::sync::Arc;

use crate::sink::Sink;

/// A published sink (boxed: the table holds thin pointers).
pub(crate) struct SinkRef(pub(crate) Arc<dyn Sink>);

/// Up to `N` sinks.
pub(crate) struct SinkTable<const N: usize> {
    sinks: [AtomicPtr<SinkRef>; N],
    /// Readers inside slot `i` right now.
    users: [AtomicUsize; N],
    /// Slots ever used (readers scan `0..high`).
    high: AtomicUsize,
}

/// A sink's place in a table, from [`SinkTable::publish`]; give it back to
/// [`SinkTable::retire`].
pub(crate) struct Place {
    slot: usize,
    sink: *mut SinkRef,
}

// SAFETY: `sink` is a box owned by this place until `retire` frees it; `SinkRef` is Send + Sync.
unsafe impl Send for Place {}
// SAFETY: as above; `&Place` gives no access through the pointer.
unsafe impl Sync for Place {}

/// The sinks a reader holds (see [`SinkTable::hold_all`]).
pub(crate) struct Held<const N: usize> {
    slots: [(usize, *const SinkRef); N],
    len: usize,
}

impl<const N: usize> Held<N> {
    pub(crate) const fn new() -> Self {
        Held {
            slots: [(0, std::ptr::null()); N],
            len: 0,
        }
    }

    /// Every held sink.
    pub(crate) fn each(&self, mut f: impl FnMut(&dyn Sink)) {
        for &(_, p) in &self.slots[..self.len] {
            // SAFETY: held (the slot's user count was raised before the pointer was loaded and
            // is lowered only by `release`), so its box is alive.
            f(unsafe { &*(*p).0 });
        }
    }
}

impl<const N: usize> SinkTable<N> {
    pub(crate) const fn new() -> Self {
        SinkTable {
            sinks: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
            users: [const { AtomicUsize::new(0) }; N],
            high: AtomicUsize::new(0),
        }
    }

    /// Puts `sink` in a free slot. `None` when the table is full.
    pub(crate) fn publish(&self, sink: Arc<dyn Sink>) -> Option<Place> {
        let ptr = Box::into_raw(Box::new(SinkRef(sink)));
        let Some(slot) = self.sinks.iter().position(|s| {
            s.compare_exchange(std::ptr::null_mut(), ptr, SeqCst, SeqCst)
                .is_ok()
        }) else {
            // SAFETY: `ptr` came from `Box::into_raw` above and was published nowhere.
            drop(unsafe { Box::from_raw(ptr) });
            return None;
        };
        self.high.fetch_max(slot + 1, SeqCst);
        Some(Place { slot, sink: ptr })
    }

    /// Takes `place` out: returns once no reader holds it, then frees its box. Waits for
    /// readers that are inside a sink call (short: event-path code).
    pub(crate) fn retire(&self, place: Place) {
        // Only our own entry (a forked child's table may have been emptied and reused).
        let _ = self.sinks[place.slot].compare_exchange(
            place.sink,
            std::ptr::null_mut(),
            SeqCst,
            SeqCst,
        );
        while self.users[place.slot].load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: from `Box::into_raw` in `publish`; no reader can reach it any more (the slot
        // no longer holds it and no user of the slot is left).
        drop(unsafe { Box::from_raw(place.sink) });
    }

    /// Holds slot `i` if it has a sink: raises its user count, then loads the pointer (which
    /// stays valid until the count is lowered again). `None` (count restored) when empty.
    fn hold(&self, i: usize) -> Option<*const SinkRef> {
        if self.sinks[i].load(Relaxed).is_null() {
            return None;
        }
        self.users[i].fetch_add(1, SeqCst);
        // SeqCst, after the increment: `retire` clears the slot and then waits until the count
        // is zero before freeing, so a pointer loaded here is alive until we lower it.
        let p = self.sinks[i].load(SeqCst);
        if p.is_null() {
            self.users[i].fetch_sub(1, SeqCst);
            return None;
        }
        Some(p)
    }

    /// Calls `f` on every sink in the table, holding each only during its call. Event path.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&dyn Sink)) {
        for i in 0..self.high.load(Acquire).min(N) {
            if let Some(p) = self.hold(i) {
                // SAFETY: held (see `hold`).
                f(unsafe { &*(*p).0 });
                self.users[i].fetch_sub(1, SeqCst);
            }
        }
    }

    /// Holds every sink in the table now, until [`release`](Self::release): the monitor
    /// delivers one message's begin, apply and end to the same set. Event path.
    pub(crate) fn hold_all(&self, held: &mut Held<N>) {
        held.len = 0;
        for i in 0..self.high.load(Acquire).min(N) {
            if let Some(p) = self.hold(i) {
                held.slots[held.len] = (i, p);
                held.len += 1;
            }
        }
    }

    /// Lets go of what [`hold_all`](Self::hold_all) held.
    pub(crate) fn release(&self, held: &mut Held<N>) {
        for &(i, _) in &held.slots[..held.len] {
            self.users[i].fetch_sub(1, SeqCst);
        }
        held.len = 0;
    }

    /// In a forked child (atfork handler, async-signal-safe): forget every sink. Each box is
    /// still freed by its owner's `retire`, which frees its own box whatever the slot holds.
    pub(crate) fn clear_in_child(&self) {
        for (s, u) in self.sinks.iter().zip(&self.users) {
            s.store(std::ptr::null_mut(), SeqCst);
            u.store(0, SeqCst);
        }
    }
}
