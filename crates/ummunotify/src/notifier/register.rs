//! Registration and re-arming: watching a region's pages, holes, and the in-flight `REMOVE`s a
//! new or re-armed region must not be valid across.

use super::*;

impl Notifier {
    pub(super) fn register_impl(
        &self,
        range: Range<usize>,
        cookie: Cookie,
        any: bool,
    ) -> Result<Region> {
        let mut span = Span::new(range, sys::page_size())?;
        let sh = &*self.shared;
        sh.alive()?;
        let mut reg = sh.lock_registry();
        sh.settle(&mut reg)?;
        // Looked for once: the duplicate check finds where the cookie goes (the registry lock is
        // held until the insertion below).
        let Ok(vacancy) = reg.cookies.vacancy(cookie.0, |id| sh.cookie_of(id)) else {
            return Err(Error::DuplicateCookie(cookie));
        };
        // The watch policy: exact pages while the VMA budget allows, else the whole VMAs. (Over
        // the budget, pages already watched are widened too: watched exactly inside a widened
        // range, they would split the coverage into a run per region, and unwatching the widened
        // range around them at the end would split its VMA as many times.)
        let segments = reg.coverage.segments();
        if !reg.budget.allows_exact(segments) {
            match reg.budget.widen(span.watch_start, span.watch_end)? {
                Some((s, e)) => (span.watch_start, span.watch_end) = (s, e),
                None if any => {} // holes: watch the mapped parts exactly
                None => return Err(Error::Unmapped),
            }
        }
        // Already watched: every page is counted in the coverage (so watched by a registration
        // that succeeded) and no unmap of them was delivered since. Such a registration makes no
        // watch call, on a backend that promises the watch is still there then (none does now:
        // see `Watcher::watch_persists`).
        let watched = sh.watcher.watch_persists()
            && reg
                .coverage
                .uncovered(span.watch_start, span.watch_end)
                .is_empty()
            && !reg.lost.overlaps(span.watch_start, span.watch_end);
        let tag = if widened(&span) {
            reg.wide.intern(span.watch_start, span.watch_end)?
        } else {
            EXACT
        };
        // Room in the slot table and the queue is made here, outside the index lock.
        reg.free.reserve(1);
        let id = match reg.free.last() {
            Some(&id) => id,
            None => reg.next_slot,
        };
        while sh.slots.capacity() <= id as usize {
            sh.slots.grow_zeroed();
        }
        sh.queue.reserve(id);
        // Frames a dequeued REMOVE is about to drop must not be pinned through this region.
        sh.wait_inflight(&mut reg, &span);
        // The pages that went from 0 to 1 are not needed: the whole range is watched below (see
        // there why), and a rollback's `remove` returns exactly what this added.
        reg.coverage.add(span.watch_start, span.watch_end);
        if any {
            reg.holes += 1;
            sh.holes.store(reg.holes, SeqCst);
        }
        // Kept only where a registration may skip its watch (allocating nothing otherwise).
        let keep_lost = sh.watcher.watch_persists();
        // Filled in place, and only when there is something to keep: zeroing the 1 KiB array on
        // every registration was ~80 instructions of each cache miss.
        let mut unmapped = None;
        let (token, n_unmapped, overflow) = {
            let mut l = sh.lock_index_blocked();
            // What was unmapped up to now: from here on an unmap of these pages hits the region.
            let n = l.st.unmapped_len;
            if keep_lost && n > 0 {
                unmapped.insert([(0u64, 0u64); UNMAPPED])[..n].copy_from_slice(&l.st.unmapped[..n]);
            }
            l.st.unmapped_len = 0;
            let overflow = std::mem::take(&mut l.st.unmapped_overflow);
            let slot = l.slot(id);
            slot.cookie.store(cookie.0, Relaxed);
            let expected = valid_word(serial_of(slot.word.load(Relaxed)) + 1);
            let node = l.node_mut(id);
            *node = Node::new(span.start, span.end);
            // Holes counted before they are looked for (below): a racing `mapped` that finds the
            // count 0 announced memory that the look will find mapped.
            node.set_tag(tag | if any { ANY_RANGE | HOLES } else { 0 });
            slot.word.store(expected, Release);
            let Locked { st, slots, .. } = &mut l.locked;
            st.tree.insert(&mut SlotNodes(slots), id);
            // A REMOVE dequeued since the wait above: its zap may still come after a pin.
            l.st.inflight.sweep();
            if l.st.inflight.overlaps(span.watch_start, span.watch_end) {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
            }
            (Region { slot: id, expected }, n, overflow)
        };
        // Whether the memory is shared, when the check after the watch learnt it.
        let mut shared = None;
        if keep_lost && overflow {
            reg.lost.insert(0, u64::MAX);
        }
        for &(s, e) in unmapped.as_ref().map_or(&[][..], |u| &u[..n_unmapped]) {
            reg.lost.insert(s & !(sys::page_size() as u64 - 1), e);
        }
        if any {
            // The region is in the index and counted in `holes` already: memory a racing
            // `mapped` announces is found either by the look below or, after this call (it
            // waits for the registry lock), by `mapped` itself.
            let Registry { budget, .. } = &mut *reg;
            match sh.watch_mapped_parts(budget, span.watch_start, span.watch_end) {
                Ok(true) => {
                    self.clear_holes(&mut reg, id);
                    reg.lost.remove(span.watch_start, span.watch_end);
                }
                // Holes: counted in the coverage but not watched, so a later registration over
                // them must watch (memory may be mapped there by then, announced or not).
                Ok(false) if keep_lost => reg.lost.insert(span.watch_start, span.watch_end),
                Ok(false) => {}
                Err(e) => {
                    self.remove_slot(&mut reg, id, &span);
                    return Err(e);
                }
            }
            reg.watch_calls += 1;
        } else if !watched || reg.lost.overlaps(span.watch_start, span.watch_end) {
            // Unless already watched, watch the whole page range, even parts already covered: a
            // watch lost with an unmap may have been replaced by a new mapping since (watching is
            // idempotent).
            if let Err(e) = sh.watch_then_check(&span) {
                self.remove_slot(&mut reg, id, &span);
                return Err(e);
            }
            // A racing unmap between the check in `watch` and the registration would have gone
            // unseen. One VMA over the range (the common case): one `PROCMAP_QUERY` answers this
            // and whether the memory is shared (the fresh-watch window below); without it, the
            // backend's probe for the window (one ioctl on Linux 6.0 to 6.6); a one-page watch
            // that succeeded proves it on userfaultfd; else `msync` (issue 41: under emulation
            // every call is a few percent of a soft-RoCE registration).
            let (s, e) = (span.watch_start, span.watch_end);
            let one = if sh.watcher.fresh_watch_window() {
                match reg.budget.vmas() {
                    Ok(v) if v.has_query() => v.covering(s, e).ok().flatten(),
                    _ => sh.watcher.covering(s, e),
                }
            } else {
                None
            };
            let page_watched = e - s == sys::page_size() as u64 && sh.watcher.watch_maps_one_page();
            if one.is_none()
                && !page_watched
                && !matches!(sys::is_mapped(s as usize, e as usize), Ok(true))
            {
                self.remove_slot(&mut reg, id, &span);
                return Err(Error::Unmapped);
            }
            shared = one;
            // Watched now; an unmap since the copy above is in `unmapped` for the next one.
            reg.lost.remove(span.watch_start, span.watch_end);
            reg.watch_calls += 1;
        }
        // Shared memory: a `MADV_REMOVE` that began before the watch may still be about to zap.
        // Only the window (and older entries) can leave a pin stale now: a `REMOVE` read since
        // the insertion hit the region in the index.
        if let Some(ticket) =
            sh.open_fresh_window(&mut reg, span.watch_start, span.watch_end, shared)
        {
            sh.wait_inflight(&mut reg, &span);
            let mut l = sh.lock_index_blocked();
            l.st.inflight.sweep();
            if l.st
                .inflight
                .overlaps_upto(span.watch_start, span.watch_end, ticket)
            {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
            }
        }
        if reg.free.last() == Some(&id) {
            reg.free.pop();
        } else {
            reg.next_slot += 1;
        }
        reg.cookies.insert_at(vacancy, id, |id| sh.cookie_of(id));
        if widened(&span) {
            reg.budget.wide_regions += 1;
        }
        Ok(token)
    }

    /// Region `id` has no holes (any more): uncount it (registry lock held).
    pub(super) fn clear_holes(&self, reg: &mut Registry, id: u32) {
        let had = {
            let l = self.shared.lock_index_blocked();
            let node = l.node_mut(id);
            let t = node.tag();
            node.set_tag(t & !HOLES);
            t & HOLES != 0
        };
        if had {
            reg.holes -= 1;
            self.shared.holes.store(reg.holes, SeqCst);
        }
    }

    /// Region `id` may have holes: count it, before they are looked for (registry lock held).
    pub(super) fn mark_holes(&self, reg: &mut Registry, id: u32) {
        let had = {
            let l = self.shared.lock_index_blocked();
            let node = l.node_mut(id);
            let t = node.tag();
            node.set_tag(t | HOLES);
            t & HOLES != 0
        };
        if !had {
            reg.holes += 1;
            self.shared.holes.store(reg.holes, SeqCst);
        }
    }

    /// Undoes the index and coverage part of a registration (registry lock held).
    pub(super) fn remove_slot(&self, reg: &mut Registry, id: u32, span: &Span) {
        let sh = &*self.shared;
        self.clear_holes(reg, id);
        let kind = {
            let mut l = sh.lock_index_blocked();
            let Locked { st, slots, .. } = &mut l.locked;
            st.tree.remove(&mut SlotNodes(slots), id);
            l.dequeue(id);
            let node = l.node_mut(id);
            let kind = node.tag() & KIND;
            node.set_tag(0);
            let slot = l.slot(id);
            let dead = valid_word(serial_of(slot.word.load(Relaxed)) + 1) | INVALID;
            slot.word.store(dead, Release);
            kind
        };
        if kind >= WIDE {
            reg.wide.release(kind);
        }
        for (s, e) in reg.coverage.remove(span.watch_start, span.watch_end) {
            // Unwatching part of a watched range splits its VMA as watching it did: over the VMA
            // budget the pages stay watched, as a widened registration's would (unregistered
            // pages there may pay a round trip; guarantee 3's cost of the budget). Without this,
            // unregistering every other page of a large registered range ran the process out
            // of VMAs (vm.max_map_count), and then out of memory: malloc could map no arena.
            let segments = reg.coverage.segments();
            if sh.watcher.splits_vmas() && !reg.budget.allows_exact(segments) {
                continue;
            }
            // Parts may be unmapped already; the kernel dropped those watches itself.
            sh.watcher.unwatch(s, e);
            reg.lost.remove(s, e);
        }
    }

    /// Re-arms a region whose watch was lost with an unmap: watch its pages again, then make it
    /// valid if nothing hit it meanwhile.
    ///
    /// Pages not mapped now are holes: the region goes into `holes`, so memory mapped there
    /// later and announced through [`mapped`](Self::mapped) is watched and its invalidation
    /// reported (no deaf region). A [`register_any`](Self::register_any) region becomes valid
    /// anyway (as registering it now would make it); a [`register`](Self::register) region
    /// stays invalid and keeps its watch marked lost, so every later re-arm looks again and the
    /// first one that finds all its pages mapped makes it valid.
    pub(super) fn recover(&self, reg: &mut Registry, id: u32, serial: u64, span: &Span) {
        let sh = &*self.shared;
        let mut rewatch = *span;
        if widened(span) {
            // The VMAs it was widened to may have changed (a neighbour unmapped): watch what
            // covers its own pages now, within what coverage accounts for it.
            let page = sys::page_size() as u64;
            let own = (span.start & !(page - 1), span.end.next_multiple_of(page));
            match reg.budget.widen(own.0, own.1) {
                Ok(Some((s, e))) => {
                    rewatch.watch_start = s.max(span.watch_start);
                    rewatch.watch_end = e.min(span.watch_end);
                }
                // Holes: the mapped parts of its own pages, exactly.
                Ok(None) => (rewatch.watch_start, rewatch.watch_end) = own,
                Err(_) => return,
            }
        }
        // Counted before the holes are looked for (see `register_impl`).
        self.mark_holes(reg, id);
        let Registry { budget, .. } = &mut *reg;
        let whole = match sh.watch_mapped_parts(budget, rewatch.watch_start, rewatch.watch_end) {
            Ok(whole) => whole,
            Err(_) => return, // stays invalid, its watch lost: the next re-arm tries again
        };
        // (Holes here were unmapped with the region's watch: the event path's unmapped ring has
        // them, so `lost` will.)
        if whole {
            self.clear_holes(reg, id);
        }
        reg.watch_calls += 1;
        // As in `register_impl`: a `MADV_REMOVE` that began before the watch (checked below).
        if sh
            .open_fresh_window(reg, rewatch.watch_start, rewatch.watch_end, None)
            .is_some()
        {
            sh.wait_inflight(reg, &rewatch);
        }
        let mut l = sh.lock_index_blocked();
        l.st.inflight.sweep();
        let w = l.slot(id).word.load(Relaxed);
        if serial_of(w) == serial && l.node(id).tag() & KIND != 0 && w & PENDING == 0 {
            if l.st.inflight.overlaps(span.watch_start, span.watch_end) {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
                return;
            }
            if whole || l.node(id).tag() & ANY_RANGE != 0 {
                l.slot(id).word.store(valid_word(serial + 1), Release);
            }
        }
    }
}
