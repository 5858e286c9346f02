//! The two counters a check loads, under x == y churn of every kind (issue 20).
//!
//! * The 2010 notification count ([`Notifier::notifications`]) never goes down: a poller loads
//!   it without pause while three threads change registered memory and a second notifier of the
//!   process churns its own (on userfaultfd every notifier is handed every message, and a
//!   message that hits none of a notifier's regions used to be taken back from its count).
//! * No check misses an invalidation: right after each call returned, the 2010 count loaded
//!   before it has moved, `unchanged_since` of a `generation()` snapshot is false and the region
//!   reads invalid.
//!
//! Kinds: munmap by libc and by raw syscall, madvise(DONTNEED) by libc and by raw syscall,
//! mmap MAP_FIXED over, free of a registered heap block and a realloc that moves it (glibc
//! unmaps and mremaps blocks above its mmap threshold). Raw syscalls are skipped on hooks.
//! Seconds per backend: `UMN_COUNTERS_SECS` (default 2).
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::{map, page, replace, unmap};
use ummunotify::{Backend, Cookie, Notifier};

const KINDS: [&str; 7] = [
    "libc-munmap",
    "raw-munmap",
    "libc-madvise",
    "raw-madvise",
    "map-fixed-over",
    "free",
    "realloc-moves",
];

fn raw(kind: usize) -> bool {
    matches!(KINDS[kind], "raw-munmap" | "raw-madvise")
}

#[derive(Default)]
struct Tally {
    rounds: [AtomicU64; KINDS.len()],
    missed_2010: [AtomicU64; KINDS.len()],
    missed_generation: [AtomicU64; KINDS.len()],
    missed_region: [AtomicU64; KINDS.len()],
}

/// Whether all of `[at, at + len)` is mapped.
fn mapped(at: usize, len: usize) -> bool {
    // SAFETY: msync only looks the range up.
    unsafe { libc::msync(at as *mut libc::c_void, len, libc::MS_ASYNC) == 0 }
}

/// One round: register, snapshot, change by `kind`, check right after the call returned.
fn round(n: &Notifier, t: &Tally, kind: usize, cookie: Cookie) {
    let len = 4 * page();
    // Heap blocks of 256 KiB, above the mmap threshold `run` sets; whether the free or the move
    // unmapped the registered pages is looked up after all the same (another allocator).
    let (at, mut block) = match KINDS[kind] {
        "free" | "realloc-moves" => {
            let v = vec![1u8; 64 * page()];
            let at = (v.as_ptr() as usize).next_multiple_of(page());
            (at, Some(v))
        }
        _ => (map(len), None),
    };
    let r = n.register(at..at + len, cookie).unwrap();
    let before = n.notifications();
    let g = n.generation().unwrap();
    // SAFETY: the round's own memory; raw calls on its own range.
    unsafe {
        match KINDS[kind] {
            "libc-munmap" => assert_eq!(libc::munmap(at as *mut libc::c_void, len), 0),
            "raw-munmap" => assert_eq!(libc::syscall(libc::SYS_munmap, at, len), 0),
            "libc-madvise" => assert_eq!(
                libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTNEED),
                0
            ),
            "raw-madvise" => assert_eq!(
                libc::syscall(libc::SYS_madvise, at, len, libc::MADV_DONTNEED),
                0
            ),
            "map-fixed-over" => replace(at, len),
            "free" => drop(block.take()),
            _ => {
                let v = block.as_mut().expect("a block");
                v.reserve_exact(v.capacity() * 4);
            }
        }
    }
    let (moved_2010, moved_g, invalid) = (
        n.notifications() != before,
        !n.unchanged_since(g),
        !n.is_valid(r),
    );
    // A free or a realloc that left the registered pages mapped (the block stayed in the heap,
    // or grew in place) changed nothing: not judged.
    let judged = !matches!(KINDS[kind], "free" | "realloc-moves") || !mapped(at, len);
    if judged {
        t.rounds[kind].fetch_add(1, Relaxed);
        t.missed_2010[kind].fetch_add(!moved_2010 as u64, Relaxed);
        t.missed_generation[kind].fetch_add(!moved_g as u64, Relaxed);
        t.missed_region[kind].fetch_add(!invalid as u64, Relaxed);
    }
    n.unregister(cookie).unwrap();
    match KINDS[kind] {
        "libc-munmap" | "raw-munmap" => {}
        "free" | "realloc-moves" => drop(block),
        _ => unmap(at, len),
    }
}

fn run(backend: Backend) {
    let secs = std::env::var("UMN_COUNTERS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    // glibc's mmap threshold fixed at 128 KiB (no raise after a free): the blocks of the free
    // and realloc rounds get mappings of their own, whose free and move unmap them.
    // SAFETY: mallopt only sets a malloc parameter.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
    let n = Notifier::with_backend(backend).unwrap();
    let other = Notifier::with_backend(backend).unwrap();
    let hooks = n.backend() == Backend::Hooks;
    let t = Tally::default();
    let stop = AtomicBool::new(false);
    let (polls, decreases) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for id in 1..=3u64 {
            let (n, t, stop) = (&n, &t, &stop);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let kind = ((i + id) % KINDS.len() as u64) as usize;
                    if !(hooks && raw(kind)) {
                        round(n, t, kind, Cookie(id << 40 | i));
                    }
                    i += 1;
                }
            });
        }
        // Messages that hit none of `n`'s regions.
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Relaxed) {
                let at = map(page());
                other.register(at..at + page(), Cookie(i)).unwrap();
                unmap(at, page());
                other.unregister(Cookie(i)).unwrap();
                i += 1;
            }
        });
        s.spawn(|| {
            let mut last = n.notifications();
            while !stop.load(Relaxed) {
                let now = n.notifications();
                if now < last {
                    decreases.fetch_add(1, Relaxed);
                }
                last = now;
                polls.fetch_add(1, Relaxed);
            }
        });
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, SeqCst);
    });
    let get = |a: &[AtomicU64; KINDS.len()], k: usize| a[k].load(SeqCst);
    for (k, name) in KINDS.iter().enumerate() {
        eprintln!(
            "counters {}: {name:<15} rounds {:6} missed: 2010 {} generation {} region {}",
            n.backend(),
            get(&t.rounds, k),
            get(&t.missed_2010, k),
            get(&t.missed_generation, k),
            get(&t.missed_region, k)
        );
    }
    eprintln!(
        "counters {}: the 2010 count polled {} times, {} decreases",
        n.backend(),
        polls.load(SeqCst),
        decreases.load(SeqCst)
    );
    assert_eq!(decreases.load(SeqCst), 0, "the 2010 count went down");
    for (k, name) in KINDS.iter().enumerate() {
        let missed =
            get(&t.missed_2010, k) + get(&t.missed_generation, k) + get(&t.missed_region, k);
        assert_eq!(missed, 0, "{name}: a check missed an invalidation");
        // Heap rounds are judged only where the allocator really unmapped the block.
        let heap = matches!(*name, "free" | "realloc-moves");
        if !(heap || hooks && raw(k)) {
            assert!(get(&t.rounds, k) > 0, "{name}: no round ran");
        }
    }
}

#[test]
fn counters_on_userfaultfd() {
    run(Backend::Userfaultfd);
}

#[test]
fn counters_on_hybrid() {
    run(Backend::Hybrid);
}

#[test]
fn counters_on_hooks() {
    run(Backend::Hooks);
}
