//! Event storms: 100,000 registered regions invalidated by one munmap, and by 100,000 munmaps from
//! two threads while a third reads events. Every region gets exactly one event, every check made
//! after an unmapping call returned fails, and memory stays bounded: the storm itself allocates
//! nothing that grows with the number of events (the queue is threaded through region slots).
//!
//! The tests of this binary run one at a time (they measure the process's memory).
mod common;
mod torture_kit;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use torture_kit::*;
use ummunotify::{Cookie, Event, Notifier, Region};

const REGIONS: usize = 100_000;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Resets VmHWM to the current RSS (`/proc/self/clear_refs` value 5).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// Registers one single-page region per page of `[base, base + n pages)`, cookie = page number.
fn register_pages(n: &Notifier, base: usize, count: usize) -> Vec<Region> {
    let pg = page();
    (0..count)
        .map(|i| {
            let a = base + i * pg;
            n.register(a..a + pg, Cookie(i as u64)).unwrap()
        })
        .collect()
}

/// Reads every pending event through a fixed buffer (no allocation per event), adding to
/// `counts` per cookie and checking each event's range against the page it names.
fn drain_into(n: &Notifier, counts: &mut [u8], base: usize, buf: &mut [Event]) -> usize {
    let pg = page();
    let mut total = 0;
    loop {
        let r = n.read_events(buf).unwrap();
        for e in &buf[..r.count] {
            let i = e.cookie.0 as usize;
            let a = base + i * pg;
            assert_eq!(e.range(), a..a + pg, "event range of region {i}");
            counts[i] = counts[i].saturating_add(1);
        }
        total += r.count;
        if r.drained.is_some() {
            return total;
        }
    }
}

/// Prints and returns the notifier-independent memory figures of a storm.
fn figures(what: &str, rss_registered: u64, peak: u64, rss_after: u64) {
    eprintln!(
        "{what}: RSS with {REGIONS} regions registered {rss_registered} KiB, storm peak (VmHWM) \
         {peak} KiB, after {rss_after} KiB (growth during storm {} KiB)",
        peak.saturating_sub(rss_registered)
    );
}

#[test]
fn one_munmap_invalidates_100k_regions_each_exactly_once() {
    let _s = serial();
    let _w = Watchdog::new("one munmap over 100k regions", Duration::from_secs(300));
    let pg = page();
    let n = Notifier::new().unwrap();
    let rss0 = status_kib("VmRSS");
    let base = map(REGIONS * pg);
    let regions = register_pages(&n, base, REGIONS);
    let mut counts = vec![0u8; REGIONS];
    let mut buf = vec![Event::default(); 1024];
    let rss1 = status_kib("VmRSS");
    assert_eq!(n.stats().regions, REGIONS);
    assert_eq!(
        n.stats().coverage_segments,
        1,
        "adjacent pages share one watch"
    );
    let seen = n.generation().unwrap();
    reset_peak();

    unmap(base, REGIONS * pg);
    // Every check made after the munmap returned fails, without reading any event.
    assert!(!n.unchanged_since(seen));
    let stale = regions.iter().filter(|r| n.is_valid(**r)).count();
    assert_eq!(stale, 0, "regions still valid after the munmap returned");
    let stats = n.stats();
    assert_eq!(stats.pending, REGIONS);
    assert_eq!(stats.invalidations, REGIONS as u64);

    let read = drain_into(&n, &mut counts, base, &mut buf);
    let peak = status_kib("VmHWM");
    let rss2 = status_kib("VmRSS");
    figures("one munmap", rss1, peak, rss2);
    eprintln!(
        "one munmap: registering {REGIONS} regions took {} KiB of RSS",
        rss1.saturating_sub(rss0)
    );
    assert_eq!(read, REGIONS);
    assert!(
        counts.iter().all(|&c| c == 1),
        "each region gets exactly one event"
    );
    assert_eq!(n.events().unwrap(), vec![], "nothing left after the drain");
    // Unmapped regions stay invalid after their event (no re-arm over nothing).
    assert!(regions.iter().all(|r| !n.is_valid(*r)));
    // Bounded: the storm (100k invalidations, 100k events read) grows memory by less than one
    // page per 100 regions; registration costs well under 1 KiB per region.
    assert!(
        peak.saturating_sub(rss1) < (REGIONS as u64 / 100) * 4,
        "storm grew memory by {} KiB",
        peak.saturating_sub(rss1)
    );
    assert!(
        rss1.saturating_sub(rss0) < REGIONS as u64,
        "registration used {} KiB for {REGIONS} regions",
        rss1.saturating_sub(rss0)
    );
    for i in 0..REGIONS {
        n.unregister(Cookie(i as u64)).unwrap();
    }
    assert_eq!(n.stats().regions, 0);
    assert_eq!(n.stats().coverage_segments, 0);
}

#[test]
fn munmaps_from_two_threads_100k_regions_each_exactly_once() {
    let _s = serial();
    let _w = Watchdog::new("100k munmaps from two threads", Duration::from_secs(300));
    let pg = page();
    let n = Arc::new(Notifier::new().unwrap());
    let base = map(REGIONS * pg);
    let regions = Arc::new(register_pages(&n, base, REGIONS));
    let rss1 = status_kib("VmRSS");
    reset_peak();

    let stop = Arc::new(AtomicBool::new(false));
    let stale = Arc::new(AtomicU64::new(0));
    let reader = {
        let (n, stop) = (n.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut counts = vec![0u8; REGIONS];
            let mut buf = vec![Event::default(); 256];
            let mut read = 0;
            while !stop.load(SeqCst) {
                read += drain_into(&n, &mut counts, base, &mut buf);
                std::thread::yield_now();
            }
            read += drain_into(&n, &mut counts, base, &mut buf);
            (read, counts)
        })
    };
    let unmappers: Vec<_> = (0..2)
        .map(|t| {
            let (n, regions, stale) = (n.clone(), regions.clone(), stale.clone());
            std::thread::spawn(move || {
                let half = REGIONS / 2;
                for i in t * half..(t + 1) * half {
                    let a = base + i * pg;
                    // SAFETY: page `i` of the test's own mapping; nothing references it.
                    let r = unsafe { libc::munmap(a as *mut libc::c_void, pg) };
                    assert_eq!(r, 0);
                    if n.is_valid(regions[i]) {
                        stale.fetch_add(1, SeqCst);
                    }
                }
            })
        })
        .collect();
    for u in unmappers {
        u.join().unwrap();
    }
    stop.store(true, SeqCst);
    let (read, counts) = reader.join().unwrap();
    let peak = status_kib("VmHWM");
    figures("100k munmaps", rss1, peak, status_kib("VmRSS"));
    let st = n.stats();
    eprintln!(
        "100k munmaps: {} kernel messages, {} invalidations, {read} events read",
        st.messages, st.invalidations
    );
    assert_eq!(stale.load(SeqCst), 0, "checks passed after munmap returned");
    assert!(st.messages >= REGIONS as u64);
    assert_eq!(
        st.invalidations, REGIONS as u64,
        "each munmap hits one region"
    );
    assert_eq!(read, REGIONS);
    let wrong: Vec<_> = (0..REGIONS).filter(|&i| counts[i] != 1).take(10).collect();
    assert!(
        wrong.is_empty(),
        "regions without exactly one event: {wrong:?}"
    );
    assert_eq!(st.pending, 0);
    // The reader's buffers were allocated before the storm; the notifier adds nothing per event.
    assert!(
        peak.saturating_sub(rss1) < (REGIONS as u64 / 100) * 4,
        "storm grew memory by {} KiB",
        peak.saturating_sub(rss1)
    );
}
