//! Which pages any hooks notifier watches: the lock-free filter every hooked call reads first.
//!
//! Pages are grouped in 64 KiB granules of 16 pages; granule `g` owns bucket `g mod 16384`, a
//! 16-bit mask of its watched pages (the OR of the masks of the granules sharing the bucket:
//! they are 1 GiB apart). A call checks one bucket per granule it touches, so a call on memory
//! no notifier watches, even right next to a watched page, costs a few loads and no lock. The
//! exact per-page counts behind the masks sit under a lock that only registering and
//! unregistering threads take, never a hook (fork takes it too, so a child never inherits it
//! held).
#![allow(unsafe_code)] // The fork-safe lock around the exact counts (one UnsafeCell).

use std::cell::UnsafeCell;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize};
use std::sync::Mutex;

use crate::cookies::CookieMap;
use crate::coverage::Coverage;

const PAGE_SHIFT: u32 = 12;
const PAGES_PER_GRANULE: u64 = 16;
const BUCKETS: usize = 1 << 14;

static MASKS: [AtomicU16; BUCKETS] = [const { AtomicU16::new(0) }; BUCKETS];
/// Pages watched by any hooks notifier: zero means nothing is (the one-load fast path).
static WATCHED: AtomicUsize = AtomicUsize::new(0);

fn bucket(granule: u64) -> &'static AtomicU16 {
    &MASKS[granule as usize & (BUCKETS - 1)]
}

/// Whether any hooks notifier exists with a watched page.
pub(crate) fn any() -> bool {
    WATCHED.load(SeqCst) != 0
}

/// Whether a hooks notifier may watch a page of `[start, end)` (`start < end`). False positives
/// only from granules 1 GiB apart sharing a bucket; never a false negative.
///
/// The SeqCst loads pair with the SeqCst stores of [`Watch::watch`]: a registration whose
/// store a hook's load (made after its syscall) misses came after that syscall, and its own
/// check that the pages are still mapped runs after the change (ARCHITECTURE, "The hooks
/// backend").
#[inline]
pub(crate) fn maybe_watched(start: u64, end: u64) -> bool {
    if WATCHED.load(SeqCst) == 0 {
        return false;
    }
    let (p0, p1) = (start >> PAGE_SHIFT, (end - 1) >> PAGE_SHIFT);
    let (g0, g1) = (p0 / PAGES_PER_GRANULE, p1 / PAGES_PER_GRANULE);
    if g1 - g0 >= BUCKETS as u64 {
        return true;
    }
    (g0..=g1).any(|g| {
        let lo = if g == g0 { p0 % PAGES_PER_GRANULE } else { 0 };
        let hi = if g == g1 { p1 % PAGES_PER_GRANULE } else { 15 };
        let want = ((1u32 << (hi + 1)) - (1u32 << lo)) as u16;
        bucket(g).load(SeqCst) & want != 0
    })
}

/// The exact counts behind [`MASKS`]: per granule, how many notifiers watch each page.
///
/// Granule numbers count up with the address, the keys a [`CookieMap`] hashes cheaply; the
/// sharing counts are an array by bucket. (A `BTreeMap` and a SipHash `HashMap` here were
/// ~650 instructions of each hybrid cache miss, issue 23.)
struct Global {
    granules: CookieMap<[u32; 16]>,
    /// How many granules with a watched page share each bucket, by bucket.
    sharing: Vec<u32>,
}

impl Default for Global {
    /// Made at the first watch (`with_global`): the counts are zeroed memory, resident only
    /// where touched.
    fn default() -> Self {
        Global {
            granules: CookieMap::default(),
            sharing: vec![0; BUCKETS],
        }
    }
}

/// A lock of our own rather than a `Mutex`: fork must be able to take it in the parent and
/// release it in the child (see [`fork_prepare`]), or a child forked while another thread
/// registered would hang in its first registration.
struct GlobalLock {
    busy: AtomicBool,
    data: UnsafeCell<Option<Global>>,
}

// SAFETY: `data` is only reached through `with_global`, which holds `busy`.
unsafe impl Sync for GlobalLock {}

static GLOBAL: GlobalLock = GlobalLock {
    busy: AtomicBool::new(false),
    data: UnsafeCell::new(None),
};

fn lock_global() {
    while GLOBAL
        .busy
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
}

fn unlock_global() {
    GLOBAL.busy.store(false, Release);
}

/// Releases the lock when dropped (also if the closure unwinds).
struct Held;
impl Drop for Held {
    fn drop(&mut self) {
        unlock_global();
    }
}

fn with_global<R>(f: impl FnOnce(&mut Global) -> R) -> R {
    lock_global();
    let _held = Held;
    // SAFETY: `busy` is ours until `_held` drops; no other reference to `data` exists.
    let g = unsafe { &mut *GLOBAL.data.get() };
    f(g.get_or_insert_with(Global::default))
}

/// `pthread_atfork` prepare: fork waits for a registering thread to leave the filter.
pub(super) fn fork_prepare() {
    lock_global();
}

/// `pthread_atfork` parent and child: the lock taken by [`fork_prepare`] is released on both
/// sides (the child's copy of the filter is consistent: nobody was inside it).
pub(super) fn fork_release() {
    unlock_global();
}

fn mask_of(counts: &[u32; 16]) -> u16 {
    counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c != 0)
        .fold(0, |m, (i, _)| m | (1 << i))
}

impl Global {
    /// Adds `delta` (+1 or -1) to every page of `[s, e)` and republishes the touched buckets.
    fn add(&mut self, s: u64, e: u64, delta: i32) {
        let (p0, p1) = (s >> PAGE_SHIFT, e >> PAGE_SHIFT);
        let mut page = p0;
        while page < p1 {
            let g = page / PAGES_PER_GRANULE;
            let end = ((g + 1) * PAGES_PER_GRANULE).min(p1);
            let counts = self.granules.entry(g).or_insert([0; 16]);
            let was_empty = counts.iter().all(|&c| c == 0);
            for p in page..end {
                let c = &mut counts[(p % PAGES_PER_GRANULE) as usize];
                if delta > 0 {
                    *c += 1;
                    if *c == 1 {
                        WATCHED.fetch_add(1, SeqCst);
                    }
                } else if *c > 0 {
                    *c -= 1;
                    if *c == 0 {
                        WATCHED.fetch_sub(1, SeqCst);
                    }
                }
            }
            let mask = mask_of(counts);
            let b = g as usize & (BUCKETS - 1);
            let sharing = &mut self.sharing[b];
            if was_empty && mask != 0 {
                *sharing += 1;
            } else if !was_empty && mask == 0 {
                *sharing -= 1;
            }
            // Other granules of the bucket with a watched page: then the bucket is their OR
            // and this one's. (`sharing > 1` alone left out the case where this granule just
            // emptied beside one other: the bucket went to 0 under that other's watched pages,
            // and the filter answered "not watched" for them.)
            let others = *sharing - u32::from(mask != 0);
            if mask == 0 {
                self.granules.remove(&g);
            }
            let published = if others > 0 {
                // Rare (granules 1 GiB apart): OR every granule of the bucket.
                self.granules
                    .iter()
                    .filter(|(&k, _)| k as usize & (BUCKETS - 1) == b)
                    .fold(0, |m, (_, c)| m | mask_of(c))
            } else {
                mask
            };
            bucket(g).store(published, SeqCst);
            page = end;
        }
    }
}

fn global_add(s: u64, e: u64, delta: i32) {
    with_global(|g| g.add(s, e, delta));
}

/// The pages one hooks notifier watches, counted once each in the filter. User threads only
/// (under the notifier's registry lock); may allocate.
pub(crate) struct Watch {
    /// Used as a set: every page in it has count 1.
    pages: Mutex<Coverage>,
}

impl Watch {
    pub(crate) fn new() -> Watch {
        super::guard_fork();
        Watch {
            pages: Mutex::new(Coverage::new()),
        }
    }

    /// Watches `[start, end)` (page aligned, idempotent): the filter says "maybe" for it from
    /// now on (SeqCst, before the caller checks that the pages are still mapped).
    pub(crate) fn watch(&self, start: u64, end: u64) {
        if start < end {
            let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
            for (s, e) in pages.fill(start, end) {
                global_add(s, e, 1);
            }
        }
    }

    /// Stops watching `[start, end)`.
    pub(crate) fn unwatch(&self, start: u64, end: u64) {
        if start < end {
            let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
            for (s, e) in pages.covered(start, end) {
                pages.remove(s, e);
                global_add(s, e, -1);
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let pages = self.pages.get_mut().unwrap_or_else(|p| p.into_inner());
        pages.for_each_covered(0, u64::MAX, |s, e| {
            global_add(s, e, -1);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_counts_each_page_once() {
        // A high address no other test watches, half a bucket cycle (1 GiB) away from the
        // other test's: no bucket shared, so no false "maybe".
        let base = 0x7d00_2000_0000u64;
        let w = Watch::new();
        w.watch(base + 0x1000, base + 0x3000);
        w.watch(base, base + 0x5000); // overlapping: only the new pages are added
        w.watch(base + 0x2000, base + 0x3000); // already watched: nothing
        w.unwatch(base + 0x2000, base + 0x4000);
        assert!(maybe_watched(base, base + 0x2000));
        assert!(!maybe_watched(base + 0x2000, base + 0x4000));
        assert!(maybe_watched(base + 0x4000, base + 0x5000));
        // Counted once: one unwatch of the whole range clears every page.
        w.unwatch(base, base + 0x10000);
        assert!(!maybe_watched(base, base + 0x10000));
        w.unwatch(base, base + 0x10000); // nothing watched: nothing happens
        assert!(!maybe_watched(base, base + 0x10000));
    }

    #[test]
    fn the_filter_is_exact_to_the_page() {
        // A high address no other test watches.
        let base = 0x7e00_0000_0000u64;
        let w = Watch::new();
        w.watch(base + 0x3000, base + 0x4000);
        assert!(maybe_watched(base + 0x3000, base + 0x4000));
        assert!(maybe_watched(base, base + 0x10_0000));
        assert!(!maybe_watched(base + 0x2000, base + 0x3000));
        assert!(!maybe_watched(base + 0x4000, base + 0x5000));
        w.watch(base + 0x3000, base + 0x4000); // idempotent
        w.unwatch(base + 0x3000, base + 0x4000);
        assert!(!maybe_watched(base + 0x3000, base + 0x4000));
        w.watch(base + 0xf000, base + 0x11000); // across a granule boundary
        assert!(maybe_watched(base + 0x10000, base + 0x10001));
        drop(w);
        assert!(!maybe_watched(base + 0xf000, base + 0x11000));
    }

    #[test]
    fn granules_sharing_a_bucket_publish_both_masks() {
        // 1 GiB apart: one bucket (4096), which no other test's pages use.
        let a = 0x7c00_1000_0000u64;
        let b = a + (1 << 30);
        let w = Watch::new();
        // Page 0 of a's granule, page 2 of b's.
        w.watch(a, a + 0x1000);
        w.watch(b + 0x2000, b + 0x3000);
        // Each granule reads the bucket's OR: a false positive by design, never a negative.
        assert!(maybe_watched(a, a + 0x1000));
        assert!(maybe_watched(a + 0x2000, a + 0x3000));
        assert!(maybe_watched(b, b + 0x1000));
        assert!(!maybe_watched(a + 0x1000, a + 0x2000));
        w.unwatch(a, a + 0x1000);
        assert!(!maybe_watched(b, b + 0x1000), "a's page left the bucket");
        assert!(maybe_watched(b + 0x2000, b + 0x3000));
        drop(w);
        assert!(!maybe_watched(b + 0x2000, b + 0x3000));
    }
}
