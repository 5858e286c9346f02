//! The miss path: plan under the miss lock (or without it, for a range with nothing cached next
//! to it), register with the notifier and the device with no cache lock held, publish under the
//! miss lock again (or try again, or take what another miss published meanwhile).

use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;

use super::entry::Entry;
use super::local::ThreadSlot;
use super::{lookup, Cache, Error, Handle, State, CACHE_COOKIE_BIT};
use crate::registrar::Registrar;
use crate::{Cookie, Notifier, Region};

/// How many times a miss retries when the memory changes while it is being registered.
const MISS_ATTEMPTS: usize = 4;

/// How many times a miss waits (yielding, no lock held) for the registrations in flight on
/// other threads when only they stand between it and the registrar's limit, before it registers
/// anyway and leaves the registrar to refuse.
const FULL_WAITS: usize = 1_000;

/// The regions and bytes of misses registering now (planned, not yet published or given up).
///
/// A miss reserves its share *before* it checks the limits, and gives it back only after what
/// it registered is counted in the cache's `regions` and `bytes` (published) or released by the
/// registrar (given up). So of two misses checking at once, the later reservation sees the
/// earlier one, whichever of them holds the miss lock: the cache never holds more than its
/// limits, and a registrar with a bounded table is never asked for more than it has.
#[derive(Default)]
pub(super) struct Pending {
    regions: AtomicUsize,
    bytes: AtomicUsize,
}

/// What a miss counts against the limits besides itself: the other misses in flight, from the
/// values its reservation returned.
#[derive(Clone, Copy)]
struct Others {
    regions: usize,
    bytes: usize,
}

impl Pending {
    /// Reserves one region of `len` bytes; returns what the other misses had reserved then.
    fn reserve(&self, len: usize) -> Others {
        Others {
            regions: self.regions.fetch_add(1, AcqRel),
            bytes: self.bytes.fetch_add(len, AcqRel),
        }
    }

    /// Gives back a reservation of `len` bytes, after the cache counts what it became (a
    /// publish), or after the registrar released it (a miss given up).
    fn release(&self, len: usize) {
        self.regions.fetch_sub(1, Release);
        self.bytes.fetch_sub(len, Release);
    }
}

/// What a miss registers (outside the miss lock), planned under it.
struct MissPlan<K> {
    union: Range<usize>,
    /// Cached regions the union covers: merged away when it is published.
    absorb: Vec<Arc<Entry<K>>>,
    cookie: Cookie,
    /// The index's write count when the plan was made (see `Lookup::writes`).
    writes: u64,
}

/// What the slow hit path saw on its way to a miss: the regions overlapping or touching the
/// page-rounded range, as the plan walks them, and the index's write count then (read under
/// the same stripe). The plan uses them instead of searching again if the count did not move.
pub(super) struct Seen<K> {
    pub(super) writes: u64,
    pub(super) near: Vec<Arc<Entry<K>>>,
}

/// Walks `index` down from `want.end` (the page-rounded `[addr, end)`): the valid region
/// covering `[addr, end)` if there is one (`Ok`), else every region overlapping or touching
/// `want` (`Err`, nearest the end first). Regions never overlap, so the covering one, if any,
/// is among those.
#[allow(clippy::type_complexity)]
#[inline]
pub(super) fn walk<'i, K>(
    index: &'i lookup::Index<K>,
    notifier: &Notifier,
    addr: usize,
    end: usize,
    want: &Range<usize>,
) -> Result<&'i Arc<Entry<K>>, Vec<Arc<Entry<K>>>> {
    let mut near = Vec::new();
    // Past either end, nothing is near: the walk below would stop at once, but finding where
    // to start costs two searches of the index (new regions come in address order: mmap's
    // top-down placement, an arena's bump). Reading an end is one path down, no comparisons.
    let past_last = index
        .last_key_value()
        .is_none_or(|(&s, e)| s <= want.end && e.end < want.start);
    if past_last || index.first_key_value().is_some_and(|(&s, _)| s > want.end) {
        return Err(near);
    }
    for (_, e) in index.range(..=want.end).rev() {
        if e.end < want.start {
            break;
        }
        if e.covers(addr, end) && notifier.is_valid(e.token) {
            return Ok(e);
        }
        near.push(e.clone());
    }
    Err(near)
}

/// Finds the live entry covering `[start, end)` in `index`.
#[inline]
fn covering<K>(index: &lookup::Index<K>, start: usize, end: usize) -> Option<&Arc<Entry<K>>> {
    index
        .range(..=start)
        .next_back()
        .map(|(_, e)| e)
        .filter(|e| e.covers(start, end))
}

impl<R: Registrar> Cache<R> {
    /// Whether one more region of `extra_bytes` bytes fits beside `regions` regions of `bytes`
    /// bytes in the cache and `pinned` out of it but still registered.
    fn fits(&self, regions: usize, pinned: usize, bytes: usize, extra_bytes: usize) -> bool {
        // Regions that left the cache while a handle holds them stay registered with the device
        // until dropped: a registrar with a bounded table (io_uring) has room only for the rest.
        let cap = self.registrar.max_registrations().unwrap_or(usize::MAX);
        regions < self.config.max_regions
            && regions.saturating_add(pinned) < cap
            && bytes.saturating_add(extra_bytes) <= self.config.max_bytes
    }

    /// Evicts unused regions (CLOCK) until one more region of `extra_bytes` more bytes fits
    /// beside `others` (the other misses in flight), not counting `leaving` (regions the caller
    /// is about to remove) nor `own` (registrations the caller deregisters before it registers).
    /// Also returns whether it fits then.
    fn evict_for(
        &self,
        st: &mut State<R::Key>,
        leaving: &[Arc<Entry<R::Key>>],
        extra_bytes: usize,
        others: Others,
        own: usize,
    ) -> (Vec<Arc<Entry<R::Key>>>, bool) {
        let leaving_bytes: usize = leaving.iter().map(|e| e.len()).sum();
        let mut regions = (st.by_cookie.len() + others.regions).saturating_sub(leaving.len());
        let mut bytes = (st.live_bytes + others.bytes).saturating_sub(leaving_bytes);
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let pinned = self.pinned(st).saturating_sub(own)
            + leaving.iter().filter(|e| self.held(&threads, e)).count();
        let fits = |r: usize, b: usize| self.fits(r, pinned, b, extra_bytes);
        let mut victims = Vec::new();
        if fits(regions, bytes) {
            return (victims, true);
        }
        let mut budget = 2 * st.clock.len() + 1;
        while !fits(regions, bytes) && budget > 0 {
            budget -= 1;
            let Some(e) = st.clock.pop_front() else { break };
            if e.removed.load(Relaxed) || leaving.iter().any(|l| Arc::ptr_eq(l, &e)) {
                continue;
            }
            if e.referenced.swap(false, Relaxed) || self.held(&threads, &e) {
                st.clock.push_back(e);
                continue;
            }
            regions -= 1;
            bytes -= e.len();
            victims.push(e);
        }
        (victims, fits(regions, bytes))
    }

    /// The miss path: plan under the miss lock (merge with neighbours, evict to stay under the
    /// limits), register with the notifier and the device with no cache lock held, so misses on
    /// other threads proceed meanwhile, then publish under the miss lock again, unless the memory
    /// changed or another miss published an overlapping region in between.
    pub(super) fn miss<'c>(
        &'c self,
        slot: Option<&'c ThreadSlot>,
        addr: usize,
        end: usize,
        want: Range<usize>,
        seen: Seen<R::Key>,
    ) -> Result<Handle<'c, R>, Error> {
        let mut merge = true;
        let mut seen = Some(seen);
        let mut waits = 0;
        let mut attempts = 0;
        while attempts < MISS_ATTEMPTS {
            // Nothing near the range: no lock needed to plan (see `plan_unlocked`). If the
            // region may not fit, the locked plan below still uses what the walk saw.
            let unlocked = match &seen {
                Some(s) if s.near.is_empty() => self.plan_unlocked(&want, s.writes),
                _ => None,
            };
            let plan = if let Some(plan) = unlocked {
                seen = None;
                plan
            } else {
                let mut st = self.lock_state();
                let mut free = self.housekeep(&mut st, false);
                let seen = seen.take();
                let may_wait = waits < FULL_WAITS;
                let plan = self.plan_miss(
                    &mut st, slot, addr, end, &want, merge, seen, &mut free, may_wait,
                );
                free.extend(self.reclaim(&mut st));
                drop(st);
                self.deregister(free);
                match plan {
                    Ok(Some(plan)) => plan,
                    Ok(None) => {
                        // Full of other threads' registrations in flight: let them land (their
                        // publish takes the miss lock, not held here) and plan again.
                        waits += 1;
                        std::thread::yield_now();
                        continue;
                    }
                    Err(hit) => return Ok(hit),
                }
            };
            attempts += 1;
            let union = plan.union.clone();
            // No cache lock from here to `publish`.
            let token = match self.notifier.register(union.clone(), plan.cookie) {
                Ok(t) => t,
                Err(e) => {
                    self.unplan(&plan);
                    match e {
                        // A neighbour is partly gone (retired by the next plan): try the range
                        // alone.
                        crate::Error::Unmapped if union != want => {
                            merge = false;
                            continue;
                        }
                        e => return Err(e.into()),
                    }
                }
            };
            let key = match self.registrar.register(union.clone()) {
                Ok(k) => k,
                Err(e) => {
                    let _ = self.notifier.unregister(plan.cookie);
                    self.unplan(&plan);
                    return Err(Error::Register(e));
                }
            };
            if let Some(h) = self.publish(slot, plan, token, key, addr, end) {
                return h;
            }
        }
        Err(Error::Unstable)
    }

    /// A miss's first step, under the miss lock: a hit if another thread registered the range
    /// meanwhile (`Err`), else what to register (`Ok(Some)`), with the invalidated regions in the
    /// way retired, room made, and the registration counted as pending. `Ok(None)` (only if
    /// `may_wait`): no room even with every unused region evicted, while registrations of other
    /// misses or deregistrations on other threads are in flight: the caller waits for them.
    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    fn plan_miss<'c>(
        &'c self,
        st: &mut State<R::Key>,
        slot: Option<&'c ThreadSlot>,
        addr: usize,
        end: usize,
        want: &Range<usize>,
        merge: bool,
        seen: Option<Seen<R::Key>>,
        free: &mut Vec<Arc<Entry<R::Key>>>,
        may_wait: bool,
    ) -> Result<Option<MissPlan<R::Key>>, Handle<'c, R>> {
        let (mut absorb, mut dead) = (Vec::new(), Vec::new());
        let mut union = want.clone();
        // Regions overlapping or touching `want`: what the hit path saw, if the index did not
        // change since (then no covering region appeared either: a region's token never becomes
        // valid again), else a new search, which may find one (another thread registered the
        // range meanwhile: a hit).
        let near = match seen.filter(|s| s.writes == self.lookup.writes()) {
            Some(seen) => {
                debug_assert!(
                    walk(
                        &self.lookup.read(slot.map_or(0, |s| s.stripe)),
                        &self.notifier,
                        addr,
                        end,
                        want
                    )
                    .is_err_and(|now| now.len() == seen.near.len()
                        && now.iter().zip(&seen.near).all(|(a, b)| Arc::ptr_eq(a, b))),
                    "the index changed without its write count"
                );
                seen.near
            }
            None => {
                let index = self.lookup.read(slot.map_or(0, |s| s.stripe));
                match walk(&index, &self.notifier, addr, end, want) {
                    Ok(e) => {
                        let handle = self.hold(slot, e);
                        drop(index);
                        self.count_slow_hit(slot);
                        return Err(handle);
                    }
                    Err(near) => near,
                }
            }
        };
        for e in near {
            if !self.notifier.is_valid(e.token) {
                dead.push(e);
            } else if (e.end > want.start && e.start < want.end)
                || (merge && self.config.merge_adjacent)
            {
                // Overlapping (always merged), or touching (merged if configured).
                absorb.push(e);
            }
        }
        for e in &absorb {
            union = union.start.min(e.start)..union.end.max(e.end);
        }
        if !merge || union.len() > self.registrar.max_len() {
            // Too big merged: register just the range; overlapping regions still go.
            union = want.clone();
            absorb.retain(|e| e.end > want.start && e.start < want.end);
        }
        let n_dead = self.remove(st, &dead);
        self.invalidations.fetch_add(n_dead as u64, Relaxed);
        self.unwatch(&dead);
        // Retired regions no handle holds any more give their room back first, so that
        // `evict_for` counts only the ones still pinned by a holder.
        free.extend(self.reclaim(st));
        let others = self.pending.reserve(union.len());
        let (victims, room) = self.evict_for(st, &absorb, union.len(), others, free.len());
        // Remove what leaves *before* registering with the device: a registrar with a bounded
        // table (io_uring) needs the room; the regions stay registered (retired) until reclaimed,
        // so holders are unaffected.
        let n_evicted = self.remove(st, &victims);
        self.evictions.fetch_add(n_evicted as u64, Relaxed);
        let in_flight = others.regions > 0 || self.releasing.load(Acquire) > free.len();
        if !room && in_flight && may_wait {
            self.pending.release(union.len());
            return Ok(None);
        }
        Ok(Some(MissPlan {
            union,
            absorb,
            cookie: self.next_cookie(),
            writes: self.lookup.writes(),
        }))
    }

    fn next_cookie(&self) -> Cookie {
        Cookie(CACHE_COOKIE_BIT | self.next_cookie.fetch_add(1, Relaxed))
    }

    /// A miss's first step without the miss lock, when the slow hit path found no region
    /// overlapping or touching the page-rounded range as of the index's write count `writes`:
    /// then nothing is merged, nothing in the way is retired, and the plan is the range alone,
    /// as `plan_miss` would make it. Only the limits need checking, against the counts the
    /// cache keeps for that (`Pending`); `None` when the region may not fit, and `plan_miss`
    /// evicts under the lock. Saves a miss a round of the miss lock with its housekeeping (the
    /// slow path's `maintain` just applied any pending events, unless another thread held the
    /// lock: then the next slow call does; none of them concerns this range, which had nothing
    /// near it).
    ///
    /// `publish` checks the plan as it checks a locked one: if the index changed since
    /// `writes`, it searches the union again, and a region that appeared over it sends the miss
    /// round again (or makes it a hit).
    fn plan_unlocked(&self, want: &Range<usize>, writes: u64) -> Option<MissPlan<R::Key>> {
        let len = want.len();
        let others = self.pending.reserve(len);
        // After the reservation (which synchronises with the release of every miss it no longer
        // counts, so what those published is seen here): the regions in the cache, those out
        // of it but still registered, in that order (see `remove` and `reclaim`: a region is
        // counted in the next before it leaves one), and the bytes registered (retired ones
        // too: only ever more than the locked path counts).
        let regions = self.regions.load(Acquire) + others.regions;
        let pinned = self.retired.load(Acquire) + self.releasing.load(Acquire);
        let bytes = self.bytes.load(Acquire) + others.bytes;
        if !self.fits(regions, pinned, bytes, len) {
            self.pending.release(len);
            return None;
        }
        Some(MissPlan {
            union: want.clone(),
            absorb: Vec::new(),
            cookie: self.next_cookie(),
            writes,
        })
    }

    /// A planned registration that will not be published (nothing registered, or all of it
    /// released again): no longer pending.
    fn unplan(&self, plan: &MissPlan<R::Key>) {
        self.pending.release(plan.union.len());
    }

    /// A miss's last step, under the miss lock: publishes the registration and returns a handle
    /// to it, or a handle to a region another miss published meanwhile that covers the range.
    /// `None` (after undoing the registration) when the memory changed during the registration
    /// or an overlapping region got in the way: the caller tries again.
    fn publish<'c>(
        &'c self,
        slot: Option<&'c ThreadSlot>,
        plan: MissPlan<R::Key>,
        token: Region,
        key: R::Key,
        addr: usize,
        end: usize,
    ) -> Option<Result<Handle<'c, R>, Error>> {
        let MissPlan {
            union,
            mut absorb,
            cookie,
            writes,
        } = plan;
        let mut st = self.lock_state();
        // The memory must not have changed while the device registered it (the device may hold
        // pages that are not mapped at `addr` any more), and what overlaps the union now must be
        // inside it (the planned neighbours, or regions another miss published meanwhile).
        let mut usable = self.notifier.is_valid(token);
        // Kept for the insertion below when nothing is absorbed (the common case): one round of
        // the stripes' write locks per miss, not two.
        let mut checked = None;
        // Unless a writer came in since the plan (its write count is unchanged), what overlaps
        // the union is exactly what the plan absorbed: regions never overlap, and the plan saw
        // every one overlapping the requested range (the union is that range and the absorbed
        // regions next to it). Then only an absorbed region reaching past the union (a union cut
        // back to the range) makes it unusable, and the index need not be searched again.
        let unchanged = writes == self.lookup.writes()
            && absorb
                .iter()
                .all(|a| a.start >= union.start && a.end <= union.end);
        if usable && unchanged {
            let index = checked.insert(self.lookup.write());
            debug_assert!(
                index
                    .range(..union.end)
                    .rev()
                    .take_while(|(_, e)| e.end > union.start)
                    .all(|(_, e)| absorb.iter().any(|a| Arc::ptr_eq(a, e))),
                "a region overlaps the union that the plan did not absorb"
            );
        } else if usable {
            let index = checked.insert(self.lookup.write());
            for (_, e) in index.range(..union.end).rev() {
                if e.end <= union.start {
                    break;
                }
                if e.start < union.start || e.end > union.end {
                    usable = false;
                    break;
                }
                if !absorb.iter().any(|a| Arc::ptr_eq(a, e)) {
                    absorb.push(e.clone());
                }
            }
        }
        if !usable {
            drop(checked);
            // Another miss may have published what covers the range: take it.
            let found = {
                let index = self.lookup.read(slot.map_or(0, |s| s.stripe));
                covering(&index, addr, end)
                    .filter(|e| self.notifier.is_valid(e.token))
                    .map(|e| self.hold(slot, e))
            };
            drop(st);
            let _ = self.registrar.deregister(&key, union.clone());
            let _ = self.notifier.unregister(cookie);
            self.pending.release(union.len());
            return found.map(|h| {
                self.count_slow_hit(slot);
                Ok(h)
            });
        }
        if !absorb.is_empty() {
            // `remove` takes the write locks itself, and fences after.
            drop(checked.take());
            let n_merged = self.remove(&mut st, &absorb);
            self.merges.fetch_add(n_merged as u64, Relaxed);
        }
        let entry = Arc::new(Entry::new(union.clone(), key, cookie, token));
        {
            let mut index = checked.unwrap_or_else(|| self.lookup.write());
            index.insert(union.start, entry.clone());
        }
        st.by_cookie.insert(cookie.0, entry.clone());
        st.clock.push_back(entry.clone());
        st.live_bytes += union.len();
        // Counted before the reservation goes (see `Pending`).
        self.bytes.fetch_add(union.len(), Relaxed);
        self.regions.store(st.by_cookie.len(), Relaxed);
        self.pending.release(union.len());
        self.misses.fetch_add(1, Relaxed);
        // Held under the miss lock, which every retirer takes: no fence needed.
        Some(Ok(self.hold(slot, &entry)))
    }
}
