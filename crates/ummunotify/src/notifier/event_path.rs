//! The event path: [`Shared`] as the backend's [`Sink`] (`crate::sink`).
//!
//! Everything here runs between the kernel telling us of a change and the region state being
//! updated, on a monitor thread or inside a hooked libc call: it never allocates, frees, unmaps
//! or logs, and takes only the index lock (user threads hold it only for short sections that do
//! none of those things, with every signal blocked). The counter protocol is
//! `crate::generation`'s; the 2010 notification count's rule is written at [`Sink::begin`].

use super::*;

impl Shared {
    /// An invalidation of `[start, end)` made outside the monitor's messages (in-thread hooks,
    /// `invalidate_all`, a `mapped` window still open; index lock held), applied as one message
    /// of its own: counter odd, `INVALID` and queue, a 2010 notification if a region was hit
    /// (a widened watch may cover pages no region holds), counter even. If a monitor message is
    /// between `begin` and `end` meanwhile (the counter is busy, and only the monitor leaves it
    /// busy outside the lock), its `end` must not cancel (see `overlapped`). Returns the hits.
    pub(super) fn invalidate_as_message(
        &self,
        l: &mut Locked<'_>,
        start: u64,
        end: u64,
        unmap: bool,
        again: bool,
    ) -> u64 {
        if self.counter().load(Relaxed) & BUSY != 0 {
            self.overlapped.store(true, Relaxed);
        }
        generation::begin_message(self.counter());
        let (newly, hits) = l.invalidate(start, end, unmap, again);
        if hits > 0 {
            generation::count_notification(self.counter.notification_word());
        }
        self.invalidations.fetch_add(hits, Relaxed);
        if newly {
            self.signal_ready(l);
        }
        generation::end_message(self.counter());
        hits
    }
}

/// The core's side of the seam: what backends deliver into (`crate::sink`). Event path: none
/// of these allocates, frees, unmaps or logs; they take only the index lock.
impl Sink for Shared {
    /// Monitor steps 2–3: busy and readable together, under the index lock, right before the
    /// read(). Taking the lock here is safe: no holder can be blocked waiting for us (holders
    /// never unmap, free or allocate, and run with signals blocked).
    ///
    /// The 2010 count: a notifier with a region counts a [`Count::Ahead`] message here, for
    /// good; one without a region can not owe a count to a call that returned (a region
    /// registered while the message is applied is counted in `end` if the message hits it).
    fn begin(&self, count: Count) {
        let mut l = self.lock_index();
        generation::begin_message(self.counter());
        // With no region registered, no event can be owed to a call that returned: a region
        // registered while this message is applied gets its readiness from `apply`. (The
        // process's context hands every notifier every message: idle ones stay quiet.)
        let owed = !l.st.tree.is_empty();
        let ahead = owed && count == Count::Ahead;
        if ahead {
            generation::count_notification(self.counter.notification_word());
        }
        self.counted_ahead.store(ahead, Relaxed);
        self.readied_by_message.store(owed && !l.st.ready, Relaxed);
        if owed {
            self.signal_ready(&mut l);
        }
    }

    /// The monitor's step 5 for one message (see `crate::generation`).
    fn apply(&self, inv: Invalidation) {
        self.messages.fetch_add(1, Relaxed);
        if self.fail_next.swap(false, Relaxed) {
            panic!("injected event-path failure");
        }
        let mut l = self.lock_index();
        // An mremap move sends its `Remap` and, as the very next message of that call, the
        // `Unmap` of the old range. Only that next message pairs: a `Remap` of
        // `MREMAP_DONTUNMAP` has no `Unmap`, and any message in between (a `REMOVE`, another
        // call's `Unmap`) ends the pairing, so a later genuine unmap of the same range is never
        // taken for the tail of an earlier mremap (which would keep a stale hint).
        let last_remap = std::mem::take(&mut l.st.last_remap);
        let (newly, hits) = match inv {
            Invalidation::Unmap { start, end } => {
                let tail = last_remap == (start, end);
                l.invalidate(start, end, true, tail)
            }
            Invalidation::Remove { start, end } => l.invalidate(start, end, false, false),
            Invalidation::Remap { from, to, len } => {
                let end = from.saturating_add(len);
                l.st.last_remap = (from, end);
                if l.st.stray_len < STRAYS {
                    let i = l.st.stray_len;
                    l.st.strays[i] = (to, to.saturating_add(len));
                    l.st.stray_len += 1;
                } else {
                    l.st.stray_overflow += 1;
                }
                self.strays_pending.store(true, Release);
                // MREMAP_DONTUNMAP leaves the old range mapped but the watch moved: treat the old
                // range as having lost coverage.
                l.invalidate(from, end, true, false)
            }
            Invalidation::Other => (false, 0),
        };
        self.invalidations.fetch_add(hits, Relaxed);
        if hits > 0 {
            self.message_hit.store(true, Relaxed);
        }
        if newly {
            self.signal_ready(&mut l);
        }
    }

    /// Monitor step 6 (a hit not counted in `begin` is counted first).
    ///
    /// One context serves every notifier of the process, so most messages a notifier is handed
    /// concern other notifiers' pages. A message that hit none of this notifier's regions
    /// changed nothing a check can see: its counter goes back to the value before `begin`
    /// (so `unchanged_since` and the cache's fast path stay true), and the readiness `begin`
    /// raised is taken back if the queue is still empty.
    fn end(&self) {
        let hit = self.message_hit.swap(false, Relaxed);
        let ahead = self.counted_ahead.swap(false, Relaxed);
        if hit && !ahead {
            // Published by `end_message`'s (or `cancel_message`'s) Release below.
            generation::count_notification(self.counter.notification_word());
        }
        if hit {
            // The counter moves on anyway. (A flag set after this swap, by an invalidation that
            // saw this message busy, carries to the next message: one spurious move, safe.)
            self.overlapped.store(false, Relaxed);
            generation::end_message(self.counter());
            return;
        }
        let mut l = self.lock_index();
        // Under the lock: an in-thread invalidation either ran before (and set the flag) or
        // runs after the counter is even again (and so never overlaps this message).
        if self.overlapped.swap(false, Relaxed) {
            generation::end_message(self.counter());
            return;
        }
        if self.readied_by_message.load(Relaxed) && l.st.ready && l.st.queued == 0 {
            self.ready.drain();
            l.st.ready = false;
        }
        generation::cancel_message(self.counter());
    }

    /// The hooks backend's event path: the monitor's steps 2–5 under one hold of the index lock
    /// (so the counter is odd only while that lock is held, as with one monitor). Does nothing,
    /// and leaves the counter alone, when no region overlaps the range. Never calls a patched
    /// libc function (see `backend::hooks`).
    fn invalidate_in_thread(&self, start: u64, end: u64, unmap: bool, again: bool) {
        let mut l = self.lock_index();
        let mut any = false;
        {
            let Locked { st, slots, .. } = &mut l;
            let slots: &SegVec<Slot> = slots;
            st.tree
                .for_each_overlap(&SlotNodes(slots), start, end, |id| {
                    let slot = slots.get(id).expect("tree node id without a slot");
                    any |= !(again && slot.word.load(Relaxed) & PENDING != 0);
                });
        }
        if !any {
            if unmap {
                // No region hit, but the watch over the pages may be gone all the same.
                l.st.record_unmapped(start, end);
            }
            return;
        }
        // A region is hit (checked above): its 2010 notification is counted for good.
        self.messages.fetch_add(1, Relaxed);
        self.invalidate_as_message(&mut l, start, end, unmap, again);
    }

    /// Every region invalid, each with an event for its whole range (not an unmap: watches stay).
    fn invalidate_all(&self) {
        self.all_changed.fetch_add(1, Relaxed);
        let mut l = self.lock_index();
        self.messages.fetch_add(1, Relaxed);
        self.invalidate_as_message(&mut l, 0, u64::MAX, false, false);
    }

    /// A `REMOVE` (or another announced invalidation) is in flight until its end is known
    /// (`crate::inflight`). No allocation, no syscall but the vDSO clock, the index lock only.
    fn window_open(&self, start: u64, end: u64, how: WindowEnd) -> Window {
        let mut l = self.lock_index();
        l.st.inflight.sweep();
        Window(l.st.inflight.record(start, end, how == WindowEnd::Closed))
    }

    fn window_close_range(&self, start: u64, end: u64) {
        let mut l = self.lock_index();
        l.st.inflight.close_range(start, end);
        l.st.inflight.sweep();
    }

    fn window_close(&self, window: Window) {
        let mut l = self.lock_index();
        l.st.inflight.close(window.0);
        l.st.inflight.sweep();
    }

    /// Every check fails from now on.
    fn kill(&self) {
        generation::kill(self.counter());
        generation::kill(self.counter.notification_word());
        // Unconditionally: a `poll` that starts later still finds it readable.
        sys::eventfd_signal(self.ready.fd.as_fd());
    }
}
