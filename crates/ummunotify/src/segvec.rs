//! `SegVec`: segmented storage whose elements never move and are never freed while in use.
//!
//! Region slots live here. The event path reads them under the index lock, and code under that
//! lock must never allocate or free (a thread blocked in `free()` may be waiting, inside the
//! kernel, for our monitor thread). So the storage grows *outside* every lock, lock-free, by
//! installing whole new segments, and an element's address is fixed from the moment its segment
//! is installed until the `SegVec` itself drops.
//!
//! Segment `k` holds `BASE << k` elements. Element `i` lives at `p = i + BASE`,
//! `k = floor(log2 p) - log2 BASE`, `offset = p - (BASE << k)`, so segments double in size and
//! the capacity after installing `n` segments is `BASE * (2^n - 1)`.

// This module is the one place that turns raw segment pointers back into references; every
// `unsafe` block below carries its own `SAFETY:` argument.
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// log2 of [`BASE`].
const BASE_SHIFT: u32 = 10;

/// Number of elements in segment 0; segment `k` holds `BASE << k`.
pub(crate) const BASE: usize = 1 << BASE_SHIFT;

/// Number of segment slots.
///
/// Enough segments to give every `u32` index a home (the last index, `u32::MAX`, lives in
/// segment 22), limited on narrow targets so that every segment length and the total capacity
/// fit in a `usize`.
pub(crate) const SEGMENTS: usize = {
    let for_u32_indices = u32::BITS + 1 - BASE_SHIFT;
    let for_usize = usize::BITS - 1 - BASE_SHIFT;
    if for_u32_indices < for_usize {
        for_u32_indices as usize
    } else {
        for_usize as usize
    }
};

/// Segmented, append-only storage: elements never move and are freed only on drop.
///
/// `get` is lock-free and wait-free (one `Acquire` load). `grow` allocates outside any lock and
/// installs a segment with a compare-exchange, so several threads may grow concurrently.
pub(crate) struct SegVec<T> {
    /// Segment `k` is null, or points to the first of `BASE << k` initialised elements, obtained
    /// from `Box::<[T]>::into_raw`. Installed segments are contiguous from 0 and never removed
    /// before drop.
    segments: [AtomicPtr<T>; SEGMENTS],
    /// The `SegVec` owns `T`s; the raw-pointer marker opts out of the auto `Send`/`Sync` impls
    /// (which `AtomicPtr` would grant for any `T`) in favour of the explicit, bounded ones below.
    _owns: PhantomData<(T, *mut T)>,
}

// SAFETY: a `SegVec<T>` owns its `T`s (dropped by whichever thread drops the `SegVec`), so moving
// it to another thread moves the `T`s: sound when `T: Send`.
unsafe impl<T: Send> Send for SegVec<T> {}

// SAFETY: through `&SegVec<T>` threads obtain `&T` (needs `T: Sync`) and, via `grow`, create
// `T`s that are later dropped by the thread that drops the `SegVec` (needs `T: Send`).
unsafe impl<T: Send + Sync> Sync for SegVec<T> {}

/// Segment and offset of index `i`.
#[inline]
fn locate(i: u32) -> (usize, usize) {
    let p = u64::from(i) + BASE as u64;
    let k = (u64::BITS - 1 - p.leading_zeros()) - BASE_SHIFT;
    let offset = p - ((BASE as u64) << k);
    // `k <= 22` and `offset < BASE << k <= 2^32`; on targets where the offset does not fit a
    // `usize`, `k >= SEGMENTS` and the caller never uses the offset.
    (k as usize, offset as usize)
}

/// Number of elements in segment `k` (`k < SEGMENTS`, so this fits a `usize`).
#[inline]
const fn segment_len(k: usize) -> usize {
    BASE << k
}

impl<T> SegVec<T> {
    /// An empty `SegVec`, with no segment installed. Does not allocate.
    pub(crate) const fn new() -> Self {
        Self {
            segments: [const { AtomicPtr::new(ptr::null_mut()) }; SEGMENTS],
            _owns: PhantomData,
        }
    }

    /// The element at index `i`, or `None` if its segment is not installed yet.
    ///
    /// Lock-free, never allocates.
    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&T> {
        let (k, offset) = locate(i);
        let base = self.segments.get(k)?.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null segment pointer came from `Box::<[T]>::into_raw` of a slice of
        // `segment_len(k)` initialised elements, published with `Release` (in `grow`) and read
        // with `Acquire` above, so the elements' initialisation is visible. `offset <
        // segment_len(k)` by construction of `locate`. The segment is freed only in `drop`,
        // which needs `&mut self`, so it outlives the returned `&T` (tied to `&self`). Only
        // shared references to elements are ever created.
        Some(unsafe { &*base.add(offset) })
    }

    /// Number of elements addressable through installed segments (contiguous from index 0).
    ///
    /// Never allocates. A concurrent `grow` may make the true capacity larger by the time the
    /// caller looks at the result; it never becomes smaller.
    pub(crate) fn capacity(&self) -> usize {
        capacity_of(self.installed())
    }

    /// Number of installed segments (they are contiguous from 0).
    fn installed(&self) -> usize {
        self.segments
            .iter()
            .take_while(|s| !s.load(Ordering::Acquire).is_null())
            .count()
    }
}

/// Capacity when the first `n` segments are installed: `BASE * (2^n - 1)`.
const fn capacity_of(n: usize) -> usize {
    // `n <= SEGMENTS`, which keeps this within `usize` (see `SEGMENTS`).
    BASE * ((1 << n) - 1)
}

impl<T: Default> SegVec<T> {
    /// Allocates the next missing segment, filled with `T::default()`, and installs it.
    ///
    /// Returns `true` if this call installed a segment. Returns `false` if another thread
    /// installed that segment first (this call then frees its own allocation) or if every
    /// segment is already installed. Callers loop `while sv.capacity() <= needed { sv.grow(); }`
    /// outside every lock; for any `needed: u32` that loop terminates.
    ///
    /// # Panics
    ///
    /// Only as the global allocator does on exhaustion (the allocation is `BASE << k`
    /// elements).
    pub(crate) fn grow(&self) -> bool {
        let k = self.installed();
        if k >= SEGMENTS {
            return false;
        }
        let fresh: Box<[T]> = (0..segment_len(k)).map(|_| T::default()).collect();
        self.install(k, fresh)
    }
}

impl<T> SegVec<T> {
    /// Installs `fresh` (`segment_len(k)` elements) as segment `k`, or frees it if another
    /// thread installed that segment first. Returns whether it was installed.
    fn install(&self, k: usize, fresh: Box<[T]>) -> bool {
        debug_assert_eq!(fresh.len(), segment_len(k));
        let fresh = Box::into_raw(fresh).cast::<T>();
        match self.segments[k].compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(_) => {
                // SAFETY: `fresh` came from `Box::<[T]>::into_raw` of `segment_len(k)`
                // elements just above and was never published (the exchange failed), so this
                // thread still owns it exclusively.
                drop(unsafe {
                    Box::from_raw(ptr::slice_from_raw_parts_mut(fresh, segment_len(k)))
                });
                false
            }
        }
    }
}

/// Types for which all-zero bytes are a valid value, the same as `T::default()`.
///
/// # Safety
///
/// An implementor guarantees that a value whose every byte is zero is a valid, initialised `T`
/// (no references, no non-null pointers, no enums without a zero discriminant) and equals
/// `T::default()`.
pub(crate) unsafe trait Zeroable: Default {}

impl<T: Zeroable> SegVec<T> {
    /// Like [`grow`](SegVec::grow), but the segment comes zeroed from the allocator
    /// (`alloc_zeroed`, i.e. `calloc`): large segments are fresh anonymous pages the kernel
    /// zeroes on first touch, so an element costs resident memory only once it is used.
    ///
    /// # Panics
    ///
    /// Only as the global allocator does on exhaustion.
    pub(crate) fn grow_zeroed(&self) -> bool {
        let k = self.installed();
        if k >= SEGMENTS {
            return false;
        }
        let len = segment_len(k);
        let layout = std::alloc::Layout::array::<T>(len).expect("segment size overflows");
        if layout.size() == 0 {
            return self.grow();
        }
        // SAFETY: `layout` has a non-zero size (checked above).
        let fresh = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
        if fresh.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `fresh` holds `len` zeroed `T`s, which are valid values (`T: Zeroable`),
        // allocated with the layout of `[T; len]`: exactly what `Box::<[T]>::from_raw` of a
        // `len`-element slice frees (in `drop`, or just below).
        let boxed = unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(fresh, len)) };
        self.install(k, boxed)
    }
}

impl<T> Default for SegVec<T> {
    /// Same as [`SegVec::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for SegVec<T> {
    /// Shows the installed capacity, not the elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegVec")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

impl<T> Drop for SegVec<T> {
    /// Frees every installed segment, dropping its elements.
    fn drop(&mut self) {
        for (k, segment) in self.segments.iter_mut().enumerate() {
            let base = *segment.get_mut();
            if base.is_null() {
                continue;
            }
            // SAFETY: a non-null segment pointer came from `Box::<[T]>::into_raw` of
            // `segment_len(k)` elements and was installed exactly once; `&mut self` guarantees
            // no outstanding `&T` from `get` and no concurrent `grow`, and the pointer is not
            // used again after this (the `SegVec` is being dropped).
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, segment_len(k))) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicU32, AtomicUsize};
    use std::sync::{Arc, Barrier};

    /// Naive model of `locate`: walk the segments.
    fn locate_naive(i: u32) -> (usize, usize) {
        let mut rest = u64::from(i);
        let mut k = 0;
        while rest >= (BASE as u64) << k {
            rest -= (BASE as u64) << k;
            k += 1;
        }
        (k, rest as usize)
    }

    #[test]
    fn locate_at_segment_boundaries() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1023), (0, 1023));
        assert_eq!(locate(1024), (1, 0));
        assert_eq!(locate(3071), (1, 2047));
        assert_eq!(locate(3072), (2, 0));
        for k in 0..23usize {
            let first = capacity_of(k) as u64;
            if first <= u64::from(u32::MAX) {
                assert_eq!(locate(first as u32), (k, 0), "first of segment {k}");
            }
            if first > 0 {
                let last = first - 1;
                assert_eq!(
                    locate(last as u32),
                    (k - 1, segment_len(k - 1) - 1),
                    "last of segment {}",
                    k - 1
                );
            }
        }
        assert_eq!(locate(u32::MAX), locate_naive(u32::MAX));
        assert!(locate(u32::MAX).0 < SEGMENTS);
    }

    proptest! {
        #[test]
        fn locate_matches_naive(i in any::<u32>()) {
            prop_assert_eq!(locate(i), locate_naive(i));
        }
    }

    #[test]
    fn empty_has_nothing() {
        let sv: SegVec<u64> = SegVec::new();
        assert_eq!(sv.capacity(), 0);
        assert!(sv.get(0).is_none());
        assert!(sv.get(u32::MAX).is_none());
    }

    #[test]
    fn grow_installs_in_order_and_elements_never_move() {
        let sv: SegVec<AtomicU32> = SegVec::new();
        assert!(sv.grow());
        assert_eq!(sv.capacity(), BASE);
        assert!(sv.get(BASE as u32 - 1).is_some());
        assert!(sv.get(BASE as u32).is_none());
        let first: *const AtomicU32 = sv.get(7).unwrap();
        sv.get(7).unwrap().store(42, Ordering::Relaxed);
        for n in 2..=4 {
            assert!(sv.grow());
            assert_eq!(sv.capacity(), capacity_of(n));
        }
        assert!(ptr::eq(first, sv.get(7).unwrap()));
        assert_eq!(sv.get(7).unwrap().load(Ordering::Relaxed), 42);
        let cap = sv.capacity() as u32;
        assert!(sv.get(cap - 1).is_some());
        assert!(sv.get(cap).is_none());
    }

    #[test]
    fn grow_loop_reaches_needed() {
        let sv: SegVec<u8> = SegVec::new();
        let needed = 100_000;
        while sv.capacity() <= needed {
            sv.grow();
        }
        assert!(sv.get(needed as u32).is_some());
    }

    /// Counts live instances so the test can see that losing allocations were freed.
    static LIVE: AtomicUsize = AtomicUsize::new(0);

    /// An element that counts itself in [`LIVE`]; used by one test only.
    struct Counted(AtomicU32);

    impl Default for Counted {
        fn default() -> Self {
            LIVE.fetch_add(1, Ordering::Relaxed);
            Counted(AtomicU32::new(0))
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn concurrent_grow_installs_each_segment_once() {
        const THREADS: usize = 8;
        const TARGET: usize = 6; // segments
        let sv: Arc<SegVec<Counted>> = Arc::new(SegVec::new());
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let sv = Arc::clone(&sv);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut wins = 0usize;
                    while sv.capacity() < capacity_of(TARGET) {
                        if sv.grow() {
                            wins += 1;
                        }
                        // Readers racing the growth: whatever is installed is readable.
                        let cap = sv.capacity();
                        if cap > 0 {
                            let e = sv.get((cap - 1) as u32).expect("installed");
                            e.0.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    sv.get(t as u32)
                        .expect("installed")
                        .0
                        .fetch_add(1, Ordering::Relaxed);
                    wins
                })
            })
            .collect();
        let wins: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let cap = sv.capacity();
        assert!(cap >= capacity_of(TARGET));
        let segments = (0..SEGMENTS)
            .take_while(|&k| cap >= capacity_of(k + 1))
            .count();
        assert_eq!(wins, segments, "one winning grow per installed segment");
        assert_eq!(
            LIVE.load(Ordering::Relaxed),
            cap,
            "losers freed their allocations"
        );
        for i in 0..cap as u32 {
            assert!(sv.get(i).is_some());
        }
        assert!(sv.get(cap as u32).is_none());
        drop(sv);
        assert_eq!(LIVE.load(Ordering::Relaxed), 0, "drop frees every segment");
    }
}
