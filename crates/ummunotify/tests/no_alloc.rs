//! Guarantee 4: the event path never allocates. A counting global allocator records allocations
//! made by the monitor thread; thousands of invalidations later, it must have made none.
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::SeqCst};

use common::*;
use ummunotify::{Cookie, Notifier};

struct Counting;

static WATCHED_TID: AtomicI32 = AtomicI32::new(-1);
static BY_WATCHED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static TID: Cell<i32> = const { Cell::new(0) };
}

fn tid() -> i32 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::gettid() });
        }
        t.get()
    })
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if tid() == WATCHED_TID.load(SeqCst) {
            BY_WATCHED.fetch_add(1, SeqCst);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if tid() == WATCHED_TID.load(SeqCst) {
            BY_WATCHED.fetch_add(1, SeqCst);
        }
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn the_monitor_thread_never_allocates_or_frees() {
    let n = Notifier::new().unwrap();
    // Let the monitor start (thread start-up in std allocates once, before the event loop).
    let p = map(64 * PAGE);
    for i in 0..64 {
        n.register(p + i * PAGE..p + (i + 1) * PAGE, Cookie(i as u64))
            .unwrap();
    }
    madvise(p, PAGE, libc::MADV_DONTNEED);
    n.events().unwrap();
    let mon = n.monitor_tid();
    assert!(mon > 0);
    WATCHED_TID.store(mon, SeqCst);
    for round in 0..2000 {
        let at = (round % 64) * PAGE;
        madvise(p + at, PAGE, libc::MADV_DONTNEED);
        if round % 3 == 0 {
            madvise(p, 64 * PAGE, libc::MADV_DONTNEED); // 64 regions per message
        }
        if round % 100 == 0 {
            n.events().unwrap();
        }
    }
    // An mremap move (REMAP + UNMAP, stray ring) and munmaps, too.
    let q = map(2 * PAGE);
    n.register(q..q + 2 * PAGE, Cookie(999)).unwrap();
    // SAFETY: moves our own mapping to a new address the kernel picks.
    let moved = unsafe { libc::mremap(q as *mut _, 2 * PAGE, 4 * PAGE, libc::MREMAP_MAYMOVE) };
    assert_ne!(moved, libc::MAP_FAILED);
    unmap(p, 64 * PAGE);
    let stats = n.stats();
    WATCHED_TID.store(-1, SeqCst);
    assert!(stats.messages > 2000, "{stats:?}");
    assert_eq!(BY_WATCHED.load(SeqCst), 0, "the monitor allocated or freed");
    unmap(moved as usize, 4 * PAGE);
}
