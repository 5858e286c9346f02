//! `QueueBits`: the event queue as a two-level bitmap over region ids.
//!
//! At most one event is pending per region (guarantee 2), so the queue is a set of region ids:
//! one bit per slot, plus one summary bit per 64-bit word saying that word is not zero. That
//! costs 1/8 byte per region instead of two 32-bit list links, and keeps every operation free
//! of allocation: the bits grow with the slot table, outside every lock ([`QueueBits::reserve`]),
//! and are only read and written under the index lock.
//!
//! Events come out in id order, starting after where the last read stopped (so a region with a
//! high id is not starved by low ids invalidated again and again between partial reads).

// The bit words are plain `u64`s in `UnsafeCell`s, guarded by the caller's lock; every access
// is an `unsafe fn` whose contract is that lock.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;

use crate::segvec::{SegVec, Zeroable};

/// One word of bits, guarded by the index lock.
#[derive(Default)]
pub(crate) struct Word(UnsafeCell<u64>);

// SAFETY: every access goes through a `QueueBits` method whose contract is that the caller holds
// the lock guarding the queue, so no two threads touch a word at once.
unsafe impl Sync for Word {}

// SAFETY: an all-zero `UnsafeCell<u64>` is a valid `0`, the same as `Word::default()`.
unsafe impl Zeroable for Word {}

/// The set of queued region ids. See the module documentation.
#[derive(Default)]
pub(crate) struct QueueBits {
    /// Bit `id % 64` of word `id / 64`: region `id` is queued.
    bits: SegVec<Word>,
    /// Bit `w % 64` of word `w / 64`: `bits` word `w` is not zero.
    summary: SegVec<Word>,
}

impl QueueBits {
    /// An empty queue; allocates nothing.
    pub(crate) const fn new() -> Self {
        QueueBits {
            bits: SegVec::new(),
            summary: SegVec::new(),
        }
    }

    /// Makes room for region `id` (user threads, outside every lock: this allocates).
    pub(crate) fn reserve(&self, id: u32) {
        let w = id / 64;
        while self.bits.capacity() <= w as usize {
            self.bits.grow_zeroed();
        }
        while self.summary.capacity() <= (w / 64) as usize {
            self.summary.grow_zeroed();
        }
    }

    /// # Safety
    /// The caller holds the queue's lock (so no other reference to this word is alive), and no
    /// reference returned by an earlier call for the same word is still in use.
    #[allow(clippy::mut_from_ref)]
    unsafe fn word(v: &SegVec<Word>, i: u32) -> Option<&mut u64> {
        // SAFETY: the caller's contract.
        v.get(i).map(|w| unsafe { &mut *w.0.get() })
    }

    /// Adds `id` (reserved); returns whether it was not queued before.
    ///
    /// # Safety
    /// The caller holds the queue's lock.
    pub(crate) unsafe fn insert(&self, id: u32) -> bool {
        let w = id / 64;
        // SAFETY: lock held (caller); one word reference at a time.
        let Some(word) = (unsafe { Self::word(&self.bits, w) }) else {
            debug_assert!(false, "queue bit {id} not reserved");
            return false;
        };
        let bit = 1u64 << (id % 64);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        // SAFETY: as above; `word` is no longer used.
        if let Some(s) = unsafe { Self::word(&self.summary, w / 64) } {
            *s |= 1 << (w % 64);
        }
        true
    }

    /// Removes `id`; returns whether it was queued.
    ///
    /// # Safety
    /// The caller holds the queue's lock.
    pub(crate) unsafe fn remove(&self, id: u32) -> bool {
        let w = id / 64;
        // SAFETY: lock held (caller); one word reference at a time.
        let Some(word) = (unsafe { Self::word(&self.bits, w) }) else {
            return false;
        };
        let bit = 1u64 << (id % 64);
        if *word & bit == 0 {
            return false;
        }
        *word &= !bit;
        if *word == 0 {
            // SAFETY: as above; `word` is no longer used.
            if let Some(s) = unsafe { Self::word(&self.summary, w / 64) } {
                *s &= !(1 << (w % 64));
            }
        }
        true
    }

    /// The smallest queued id `>= from`, if any. O(words scanned / 64).
    ///
    /// # Safety
    /// The caller holds the queue's lock.
    pub(crate) unsafe fn first_from(&self, from: u32) -> Option<u32> {
        let mut w = from / 64;
        // SAFETY: lock held (caller); each reference is used only within its statement.
        let first = unsafe { Self::word(&self.bits, w) }.map(|x| *x)?;
        let masked = first & (!0u64 << (from % 64));
        if masked != 0 {
            return Some(w * 64 + masked.trailing_zeros());
        }
        w = w.checked_add(1)?;
        loop {
            let s = w / 64;
            // SAFETY: as above.
            let summary = unsafe { Self::word(&self.summary, s) }.map(|x| *x)?;
            let masked = summary & (!0u64 << (w % 64));
            if masked != 0 {
                let w = s * 64 + masked.trailing_zeros();
                // SAFETY: as above.
                let bits = unsafe { Self::word(&self.bits, w) }.map(|x| *x)?;
                debug_assert_ne!(bits, 0, "summary bit of an empty word");
                return Some(w * 64 + bits.trailing_zeros());
            }
            w = s.checked_add(1)?.checked_mul(64)?;
        }
    }

    /// The next queued id at or after `cursor`, wrapping around to 0.
    ///
    /// # Safety
    /// The caller holds the queue's lock.
    pub(crate) unsafe fn next(&self, cursor: u32) -> Option<u32> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.first_from(cursor).or_else(|| self.first_from(0)) }
    }

    /// Whether `id` is queued.
    ///
    /// # Safety
    /// The caller holds the queue's lock.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) unsafe fn contains(&self, id: u32) -> bool {
        // SAFETY: lock held (caller).
        unsafe { Self::word(&self.bits, id / 64) }.is_some_and(|w| *w & (1 << (id % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every call below runs on one thread, which is the queue's "lock" here.
    #[test]
    fn matches_a_set() {
        let q = QueueBits::new();
        let mut model = BTreeSet::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        let max = 300_000u32;
        q.reserve(max);
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x % u64::from(max)) as u32;
            // SAFETY: single thread (see above).
            unsafe {
                match x >> 62 {
                    0 | 1 => assert_eq!(q.insert(id), model.insert(id)),
                    2 => assert_eq!(q.remove(id), model.remove(&id)),
                    _ => {
                        let want = model
                            .range(id..)
                            .next()
                            .or_else(|| model.iter().next())
                            .copied();
                        assert_eq!(q.next(id), want);
                        assert_eq!(q.contains(id), model.contains(&id));
                    }
                }
            }
        }
        // Drain in order from 0.
        let mut got = Vec::new();
        // SAFETY: single thread.
        unsafe {
            let mut c = 0;
            while let Some(id) = q.next(c) {
                assert!(q.remove(id));
                got.push(id);
                c = id;
            }
        }
        assert_eq!(got, model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn empty_and_unreserved() {
        let q = QueueBits::new();
        // SAFETY: single thread.
        unsafe {
            assert_eq!(q.next(0), None);
            assert_eq!(q.next(u32::MAX - 1), None);
            assert!(!q.remove(5));
        }
        q.reserve(70_000);
        // SAFETY: single thread.
        unsafe {
            assert!(q.insert(69_999));
            assert_eq!(q.next(0), Some(69_999));
            assert_eq!(q.next(70_000), Some(69_999));
        }
    }
}
