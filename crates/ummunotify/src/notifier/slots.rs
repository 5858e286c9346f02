//! Region slots and the state under the index lock: every `UnsafeCell` of the notifier is here.
//!
//! A [`Slot`] holds one region's validity word (read without locks), its cookie, its index node
//! and its pending event's hint; [`Locked`] is the proof that the index lock is held and the only
//! way to reach the cells (see `docs/architecture/regions.md`, "Region storage" and "Locks").
#![allow(unsafe_code)] // Slot data lives in UnsafeCells guarded by the index lock; see `Locked`.

use super::*;

/// One region's storage: 56 bytes (with the cookie table's 4/load bytes and the queue's bit,
/// under 64 per region; `docs/architecture/regions.md`, "Region storage").
///
/// `word` is read without locks and written under the index lock; `cookie` is written under
/// both locks and read under the registry lock; `node` and `hint` are reached only under the
/// index lock (through [`Locked`]).
///
/// The word: bits 4.. the serial (a token is `serial << SERIAL_SHIFT`), bit 0 [`INVALID`], and
/// while it is set the region's event state, so a valid word never has them: bit 1 [`PENDING`]
/// and bit 2 [`MANY`] (one invalidation, more than one, since the event was last read), bit 3
/// [`LOST`]. The event path only ever `fetch_or`s bits in.
#[derive(Default)]
pub(crate) struct Slot {
    pub(super) word: AtomicU64,
    pub(super) cookie: AtomicU64,
    /// The region's range and its place in the index. Its tag (24 bits): in the low 22 (the
    /// [`KIND`] mask) 0 for a free slot, [`EXACT`] for a region watched as its own pages,
    /// [`WIDE`]` + k` for one watched as the `k`-th range of [`WideRanges`]; bit 22
    /// [`ANY_RANGE`] and bit 23 [`HOLES`], reached only by user threads under the index lock
    /// (the event path reads only the node's range).
    pub(super) node: UnsafeCell<Node>,
    pub(super) hint: UnsafeCell<Hint>,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 56);

/// The kernel's watch over some of the region's pages went away with an unmap; it must be
/// re-established before the region can be valid again.
pub(super) const LOST: u64 = 1 << 3;
/// The serial's place in the validity word.
pub(super) const SERIAL_SHIFT: u32 = 4;
/// Node tag of a live region watched as its own pages.
pub(super) const EXACT: u32 = 1;
/// Node tag kinds from this one up: a live region watched as the range `kind - WIDE` of
/// [`WideRanges`].
pub(super) const WIDE: u32 = 2;
/// The part of a node's tag that says how the region is watched (`0`, [`EXACT`], [`WIDE`]` + k`).
pub(super) const KIND: u32 = (1 << 22) - 1;
/// Node tag bit: registered with [`Notifier::register_any`], valid over holes (re-arming over a
/// hole makes it valid, as registering it then would).
pub(super) const ANY_RANGE: u32 = 1 << 22;
/// Node tag bit: some pages of its range were not mapped when it was last watched (at
/// registration or re-arm): counted in `Registry::holes`, so [`Notifier::mapped`] watches memory
/// announced there. Cleared when it is unregistered or re-armed with all its pages mapped.
pub(super) const HOLES: u32 = 1 << 23;
const _: () = assert!(HOLES | ANY_RANGE | KIND == TAG_MAX);

/// The validity word `serial` starts, valid.
pub(super) fn valid_word(serial: u64) -> u64 {
    serial << SERIAL_SHIFT
}

/// The serial of validity word `w`.
pub(super) fn serial_of(w: u64) -> u64 {
    w >> SERIAL_SHIFT
}

// SAFETY: `node` and `hint` are only accessed through `Locked`, which holds the index mutex;
// `word` and `cookie` are atomic.
unsafe impl Sync for Slot {}

// SAFETY: every field is an atomic or an `UnsafeCell` of plain integers (`Node`, `Hint`), for
// which all-zero bytes are valid and equal to their `Default` (zeros too).
unsafe impl Zeroable for Slot {}

/// State under the index lock (no allocation happens while it is held).
pub(super) struct IndexState {
    pub(super) tree: IntervalIndex,
    /// Regions in the event queue (`Shared::queue`).
    pub(super) queued: usize,
    /// Where the next read of the queue starts looking (see `crate::queue`).
    pub(super) cursor: u32,
    /// The last `Remap`'s old range: the `Unmap` of the same range that follows it belongs to the
    /// same mremap call and is not a second invalidation.
    pub(super) last_remap: (u64, u64),
    /// Destinations of `Remap`s: the kernel's watch moved there and may cover pages no region
    /// needs. Cleaned up by the next user call.
    pub(super) strays: [(u64, u64); STRAYS],
    pub(super) stray_len: usize,
    pub(super) stray_overflow: u64,
    /// Ranges unmapped (or moved away) since the last registration looked: the kernel's watch
    /// over them is gone. Taken by `register` into `Registry::lost`.
    pub(super) unmapped: [(u64, u64); UNMAPPED],
    pub(super) unmapped_len: usize,
    /// More were unmapped than `unmapped` holds: any watch may be gone.
    pub(super) unmapped_overflow: bool,
    /// Whether the readiness eventfd has been signalled and not drained.
    pub(super) ready: bool,
    /// `REMOVE`s dequeued whose zap is not known to have happened (issue 9, `crate::inflight`).
    pub(super) inflight: InFlight,
}

pub(super) const STRAYS: usize = 32;
pub(super) const UNMAPPED: usize = 64;

impl IndexState {
    /// Event path: the kernel's watch over `[start, end)` is gone (an unmap, or the old range of
    /// a move), for the next registration to take into `Registry::lost` (see `register`).
    pub(super) fn record_unmapped(&mut self, start: u64, end: u64) {
        if self.unmapped_len < UNMAPPED {
            self.unmapped[self.unmapped_len] = (start, end);
            self.unmapped_len += 1;
        } else {
            self.unmapped_overflow = true;
        }
    }
}

/// Proof that the index lock is held, and the only way to reach slot data.
pub(super) struct Locked<'a> {
    pub(super) st: MutexGuard<'a, IndexState>,
    pub(super) slots: &'a SegVec<Slot>,
    pub(super) queue: &'a QueueBits,
    /// How many `REMOVE`s are in flight, published at every unlock (`Shared::in_flight`).
    pub(super) in_flight: &'a AtomicUsize,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Before the guard goes: a reader that finds 0 skips only a wait, never a check (the
        // insertion looks at the table under the lock again).
        self.in_flight.store(self.st.inflight.len(), Release);
    }
}

/// Tree view over slots' nodes.
pub(super) struct SlotNodes<'a>(pub(super) &'a SegVec<Slot>);

impl Nodes for SlotNodes<'_> {
    fn node(&self, id: u32) -> &Node {
        let slot = self.0.get(id).expect("tree node id without a slot");
        // SAFETY: a `SlotNodes` exists only inside `Locked` methods (index lock held), and
        // `node_mut` needs `&mut self`, so no `&mut Node` is alive while this `&Node` is.
        unsafe { &*slot.node.get() }
    }
    fn node_mut(&mut self, id: u32) -> &mut Node {
        let slot = self.0.get(id).expect("tree node id without a slot");
        // SAFETY: as in `node`; `&mut self` makes this the only live reference into any node.
        unsafe { &mut *slot.node.get() }
    }
}

impl Locked<'_> {
    pub(super) fn slot(&self, id: u32) -> &Slot {
        self.slots.get(id).expect("slot id out of range")
    }

    /// The node of slot `id`.
    pub(super) fn node(&self, id: u32) -> &Node {
        // SAFETY: the index lock is held (`self.st`); mutable references to nodes exist only
        // inside `SlotNodes::node_mut` (under `&mut` of a `SlotNodes`, never alive across a call
        // to this) and `node_mut` below (same rule).
        unsafe { &*self.slot(id).node.get() }
    }

    /// The node of slot `id`, mutably (the slot must not be in the tree, or only its tag may
    /// change).
    #[allow(clippy::mut_from_ref)]
    pub(super) fn node_mut(&self, id: u32) -> &mut Node {
        // SAFETY: as in `node`; callers use the reference for one statement sequence on one
        // slot, with no other reference to that node alive.
        unsafe { &mut *self.slot(id).node.get() }
    }

    /// The pending event's hint of slot `id`.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn hint(&self, id: u32) -> &mut Hint {
        // SAFETY: the index lock is held, and callers never keep two references to the same
        // slot's hint alive at once.
        unsafe { &mut *self.slot(id).hint.get() }
    }

    /// Takes `id` out of the event queue if it is there.
    pub(super) fn dequeue(&mut self, id: u32) {
        // SAFETY: the index lock is held (`self.st`).
        if unsafe { self.queue.remove(id) } {
            self.st.queued -= 1;
        }
    }

    /// The next queued region from the read cursor on.
    pub(super) fn next_queued(&self) -> Option<u32> {
        // SAFETY: the index lock is held (`self.st`).
        unsafe { self.queue.next(self.st.cursor) }
    }

    /// Whether a queued region overlaps a `REMOVE` in flight with ticket <= `horizon`.
    pub(super) fn queued_in_flight(&self, wide: &WideRanges, horizon: u64) -> bool {
        if self.st.inflight.is_empty() {
            return false;
        }
        let mut from = 0;
        // SAFETY: the index lock is held (`self.st`).
        while let Some(id) = unsafe { self.queue.first_from(from) } {
            let span = wide.span(self.node(id));
            if self
                .st
                .inflight
                .overlaps_upto(span.watch_start, span.watch_end, horizon)
            {
                return true;
            }
            match id.checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        false
    }

    /// Keeps region `id` invalid under a fresh serial and queues an event for its whole range
    /// (a registration or re-arm over a `REMOVE` in flight, see `crate::inflight`).
    pub(super) fn hold_invalid(&mut self, id: u32) {
        let slot = self.slot(id);
        let w = slot.word.load(Relaxed);
        let (rs, re) = {
            let n = self.node(id);
            (n.start, n.end)
        };
        let (set, newly) = event::hit(w, self.hint(id), rs, rs, re);
        let bits = (w & (LOST | PENDING | MANY)) | set | INVALID;
        slot.word
            .store(valid_word(serial_of(w) + 1) | bits, Release);
        // SAFETY: the index lock is held (`self.st`).
        if newly && unsafe { self.queue.insert(id) } {
            self.st.queued += 1;
        }
    }

    /// Event path: marks every region overlapping `[start, end)` invalid and queues it once.
    /// Returns whether anything was newly queued.
    pub(super) fn invalidate(
        &mut self,
        start: u64,
        end: u64,
        unmap: bool,
        remap_tail: bool,
    ) -> (bool, u64) {
        let mut newly = false;
        let mut hits = 0u64;
        let (slots, queue) = (self.slots, self.queue);
        let st = &mut *self.st;
        let mut queued = st.queued;
        let lost = if unmap { LOST } else { 0 };
        if unmap {
            st.record_unmapped(start, end);
        }
        st.tree
            .for_each_overlap(&SlotNodes(slots), start, end, |id| {
                let slot = slots.get(id).expect("tree node id without a slot");
                hits += 1;
                let w = slot.word.load(Relaxed);
                if remap_tail && w & PENDING != 0 {
                    // The same mremap call as the Remap that already hit it.
                    slot.word.fetch_or(INVALID | lost, Relaxed);
                    return;
                }
                // SAFETY: index lock held (we are inside a `Locked` method). The tree walk holds
                // only shared references to nodes, so a shared one here is fine; `hint` is a
                // different cell, and no other reference to it is alive.
                let rs = unsafe { (*slot.node.get()).start };
                // SAFETY: as above.
                let hint = unsafe { &mut *slot.hint.get() };
                let (set, first) = event::hit(w, hint, rs, start, end);
                slot.word.fetch_or(INVALID | lost | set, Relaxed);
                // SAFETY: index lock held.
                if first && unsafe { queue.insert(id) } {
                    newly = true;
                    queued += 1;
                }
            });
        st.queued = queued;
        (newly, hits)
    }
}
