//! The cache's address index behind a striped ("big-reader") lock.
//!
//! Readers lock only their own stripe (one per thread slot, modulo the stripes: one per CPU, at
//! most [`STRIPES`]), so threads that look regions up never write a shared cache line; a writer
//! locks every stripe in order. Only the cache's miss/retire paths write, and only while holding
//! the cache's miss lock.
#![allow(unsafe_code)] // The index lives in an UnsafeCell guarded by the stripes.

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
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

pub(super) struct Lookup<K> {
    stripes: Box<[Stripe]>,
    index: UnsafeCell<Index<K>>,
    /// Write accesses finished so far, counted as each ends (all stripes still held): equal at
    /// two moments, the index did not change in between. A reader reads it under its stripe,
    /// so its count and what it saw agree; writers hold the cache's miss lock.
    writes: AtomicU64,
}

// SAFETY: the index is read only under a stripe's read lock and written only under every
// stripe's write lock (see `read`/`write`), so readers and writers never overlap; the entries
// are `Send + Sync` when `K` is.
unsafe impl<K: Send + Sync> Sync for Lookup<K> {}
// SAFETY: as above; moving the whole structure moves owned data only.
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
    _g: [Option<RwLockWriteGuard<'a, ()>>; STRIPES],
    index: &'a mut Index<K>,
    writes: &'a AtomicU64,
}

impl<K> Drop for WriteGuard<'_, K> {
    /// Counted before the stripes are released (fields drop after this).
    fn drop(&mut self) {
        self.writes.fetch_add(1, Relaxed);
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
        Lookup {
            stripes: (0..std::thread::available_parallelism().map_or(STRIPES, |n| n.get()))
                .take(STRIPES)
                .map(|_| Stripe(RwLock::new(())))
                .collect(),
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
    /// never race each other for the stripes). The guards live in an array: no allocation on a
    /// miss for them.
    pub(super) fn write(&self) -> WriteGuard<'_, K> {
        let guards: [_; STRIPES] = std::array::from_fn(|i| {
            let s = self.stripes.get(i)?;
            Some(s.0.write().unwrap_or_else(|p| p.into_inner()))
        });
        // SAFETY: every stripe is write-locked: no reader and no other writer exists.
        let index = unsafe { &mut *self.index.get() };
        WriteGuard {
            _g: guards,
            index,
            writes: &self.writes,
        }
    }

    /// Exclusive access through `&mut self` (drop).
    pub(super) fn get_mut(&mut self) -> &mut Index<K> {
        self.index.get_mut()
    }
}
