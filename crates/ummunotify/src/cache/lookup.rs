//! The cache's address index behind a striped ("big-reader") lock.
//!
//! Readers lock only their own stripe (one per thread slot, modulo the stripes: one per CPU, at
//! most [`STRIPES`]), so threads that look regions up never write a shared cache line; a writer
//! locks every stripe in order. Only the cache's miss/retire paths write, and only while holding
//! the cache's miss lock.
#![allow(unsafe_code)] // The index lives in an UnsafeCell guarded by the stripes.

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::entry::Entry;

/// At most this many reader stripes: one per CPU the process may run on, up to this. More
/// stripes than CPUs spread no reader further and make every write (a miss's publish, a
/// retire) lock and unlock more of them.
pub(super) const STRIPES: usize = 16;

/// Live regions by start address; they never overlap.
pub(super) type Index<K> = BTreeMap<usize, Arc<Entry<K>>>;

#[repr(align(128))]
struct Stripe(RwLock<()>);

/// A stripe's write guard while a writer holds it, kept in the `Lookup` beside the stripe
/// instead of in the writer's guard: a guard holding all of them by value was 272 bytes, built
/// and copied twice per miss (~270 instructions of a ~5,000-instruction miss, issue 23).
type Held = Option<RwLockWriteGuard<'static, ()>>;

pub(super) struct Lookup<K> {
    /// `held[i]`: stripe `i`'s write guard, set and taken only by the thread holding that very
    /// guard (after it locked the stripe, before it unlocks it), so the stripe's lock orders
    /// every access to it. Declared before `stripes`: if a guard were still in it (a leaked
    /// `WriteGuard`), it is dropped, and its stripe unlocked, before the stripe goes.
    held: Box<[UnsafeCell<Held>]>,
    stripes: Box<[Stripe]>,
    index: UnsafeCell<Index<K>>,
    /// Write accesses finished so far, counted as each ends (all stripes still held): equal at
    /// two moments, the index did not change in between. A reader reads it under its stripe,
    /// so its count and what it saw agree; writers hold the cache's miss lock.
    writes: AtomicU64,
}

// SAFETY: the index is read only under a stripe's read lock and written only under every
// stripe's write lock (see `read`/`write`), so readers and writers never overlap; the entries
// are `Send + Sync` when `K` is. `held[i]` is touched only by the thread holding stripe `i`'s
// write lock, which also drops the guard in it (`WriteGuard` is neither `Send` nor `Sync`).
unsafe impl<K: Send + Sync> Sync for Lookup<K> {}
// SAFETY: as above; moving the whole structure moves owned data only (no guard is in `held`
// unless a `WriteGuard` borrows the structure, which then can not move).
unsafe impl<K: Send + Sync> Send for Lookup<K> {}

pub(super) struct ReadGuard<'a, K> {
    _g: RwLockReadGuard<'a, ()>,
    index: &'a Index<K>,
}

impl<K> std::ops::Deref for ReadGuard<'_, K> {
    type Target = Index<K>;
    fn deref(&self) -> &Index<K> {
        self.index
    }
}

pub(super) struct WriteGuard<'a, K> {
    lookup: &'a Lookup<K>,
    index: &'a mut Index<K>,
    /// Unlocked on the thread that locked (as the std guards in `held` must be).
    _not_send: PhantomData<*const ()>,
}

impl<K> Drop for WriteGuard<'_, K> {
    /// Counted before the stripes are released, then releases them (last locked first).
    fn drop(&mut self) {
        self.lookup.writes.fetch_add(1, Relaxed);
        for held in self.lookup.held.iter().rev() {
            // SAFETY: this thread holds the stripe's write lock (`write` put its guard here),
            // so no other thread touches this cell until the guard taken out is dropped.
            drop(unsafe { (*held.get()).take() });
        }
    }
}

impl<K> std::ops::Deref for WriteGuard<'_, K> {
    type Target = Index<K>;
    fn deref(&self) -> &Index<K> {
        self.index
    }
}
impl<K> std::ops::DerefMut for WriteGuard<'_, K> {
    fn deref_mut(&mut self) -> &mut Index<K> {
        self.index
    }
}

impl<K> Lookup<K> {
    pub(super) fn new() -> Self {
        let n = std::thread::available_parallelism().map_or(STRIPES, |n| n.get().min(STRIPES));
        Lookup {
            held: (0..n).map(|_| UnsafeCell::new(None)).collect(),
            stripes: (0..n).map(|_| Stripe(RwLock::new(()))).collect(),
            index: UnsafeCell::new(BTreeMap::new()),
            writes: AtomicU64::new(0),
        }
    }

    /// How many write accesses have ended (see `writes`): under a stripe or the miss lock.
    pub(super) fn writes(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    /// Read access through stripe `stripe` modulo the number of stripes.
    pub(super) fn read(&self, stripe: usize) -> ReadGuard<'_, K> {
        let g = self.stripes[stripe % self.stripes.len()]
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner());
        // SAFETY: a read lock on one stripe excludes every writer (writers hold all stripes).
        let index = unsafe { &*self.index.get() };
        ReadGuard { _g: g, index }
    }

    /// Exclusive access: every stripe, in order (callers hold the cache's miss lock, so writers
    /// never race each other for the stripes). The stripes' guards wait in `held` until the
    /// `WriteGuard` drops: no allocation, and nothing to copy when it moves.
    pub(super) fn write(&self) -> WriteGuard<'_, K> {
        for (stripe, held) in self.stripes.iter().zip(self.held.iter()) {
            let g = stripe.0.write().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the guard borrows `self.stripes`, and leaves `held` (dropped) before a
            // `WriteGuard` borrowing `self` ends, or before the stripes when `self` drops (field
            // order): it never outlives its lock. The lifetime is all this changes.
            let g = unsafe {
                std::mem::transmute::<RwLockWriteGuard<'_, ()>, RwLockWriteGuard<'static, ()>>(g)
            };
            // SAFETY: this thread holds this stripe's write lock (just taken), which orders
            // every access to its cell (see `held`).
            unsafe { *held.get() = Some(g) };
        }
        // SAFETY: every stripe is write-locked: no reader and no other writer exists.
        let index = unsafe { &mut *self.index.get() };
        WriteGuard {
            lookup: self,
            index,
            _not_send: PhantomData,
        }
    }

    /// Exclusive access through `&mut self` (drop).
    pub(super) fn get_mut(&mut self) -> &mut Index<K> {
        self.index.get_mut()
    }
}
