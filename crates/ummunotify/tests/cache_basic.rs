//! Cache behaviour with the no-op and mlock registrars: hits, misses, merging, eviction, handles
//! held across invalidation, deferred deregistration, many threads.
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

mod common;

// Tests unmap and map again at the same address: no other test may map meanwhile (`serial`).
use common::{map_untouched as map, page, replace, serial, unmap};
use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::{NoopRegistrar, Registrar};

/// Counts registrations, to see misses and deregistrations from the registrar's side.
#[derive(Default)]
struct Counting {
    live: Mutex<Vec<std::ops::Range<usize>>>,
    registered: AtomicUsize,
    deregistered: AtomicUsize,
}

impl Registrar for Counting {
    type Key = usize;
    fn register(&self, range: std::ops::Range<usize>) -> std::io::Result<usize> {
        self.live.lock().unwrap().push(range);
        Ok(self.registered.fetch_add(1, SeqCst))
    }
    fn deregister(&self, _key: &usize, range: std::ops::Range<usize>) -> std::io::Result<()> {
        let mut live = self.live.lock().unwrap();
        let i = live
            .iter()
            .position(|r| *r == range)
            .expect("deregister of unknown range");
        live.swap_remove(i);
        self.deregistered.fetch_add(1, SeqCst);
        Ok(())
    }
}

#[test]
fn hit_miss_and_inside_hit() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(NoopRegistrar, Config::default()).unwrap();
    let a = map(8 * pg);
    drop(cache.get(a, 4 * pg).unwrap());
    for _ in 0..100 {
        let h = cache.get(a + 10, 100).unwrap();
        assert_eq!(h.range(), a..a + 4 * pg);
        assert!(h.is_valid());
    }
    let s = cache.stats();
    assert_eq!((s.misses, s.hits, s.regions), (1, 100, 1));
    unmap(a, 8 * pg);
}

#[test]
fn merges_overlapping_and_adjacent() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(Counting::default(), Config::default()).unwrap();
    let a = map(8 * pg);
    drop(cache.get(a, pg).unwrap());
    drop(cache.get(a + pg, pg).unwrap()); // adjacent: merged into [a, a + 2 pages)
    let h = cache.get(a + pg / 2, pg).unwrap(); // straddles: a hit in the merged region
    assert_eq!(h.range(), a..a + 2 * pg);
    drop(h);
    drop(cache.get(a + pg, 3 * pg).unwrap()); // overlaps: merged to [a, a + 4 pages)
    let s = cache.stats();
    assert_eq!(s.regions, 1);
    assert_eq!(s.merges, 2);
    cache.flush();
    assert_eq!(
        cache.registrar().live.lock().unwrap().clone(),
        vec![a..a + 4 * pg]
    );

    drop(cache);
    let cache2 = Cache::new(NoopRegistrar, Config::default().merge_adjacent(false)).unwrap();
    drop(cache2.get(a, pg).unwrap());
    drop(cache2.get(a + pg, pg).unwrap());
    assert_eq!(cache2.stats().regions, 2);
    unmap(a, 8 * pg);
}

#[test]
fn invalidated_region_is_never_returned_and_held_one_lives_until_drop() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(Counting::default(), Config::default()).unwrap();
    let a = map(2 * pg);
    let held = cache.get(a, 2 * pg).unwrap();
    let old_key = *held.key();
    replace(a, 2 * pg);
    assert!(!held.is_valid());
    let fresh = cache.get(a, 2 * pg).unwrap();
    assert_ne!(
        *fresh.key(),
        old_key,
        "an invalidated registration was returned"
    );
    drop(fresh);
    cache.flush();
    // The held one is still registered (the device may be using it).
    assert_eq!(cache.registrar().live.lock().unwrap().len(), 2);
    assert_eq!(cache.stats().retired, 1);
    drop(held);
    cache.flush();
    assert_eq!(cache.registrar().live.lock().unwrap().len(), 1);
    let s = cache.stats();
    assert_eq!((s.retired, s.invalidations, s.deregistrations), (0, 1, 1));
    unmap(a, 2 * pg);
}

#[test]
fn madvise_and_partial_unmap_invalidate() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(NoopRegistrar, Config::default()).unwrap();
    let a = map(4 * pg);
    // SAFETY: test-owned mapping.
    unsafe { std::ptr::write_bytes(a as *mut u8, 1, 4 * pg) };
    drop(cache.get(a, 4 * pg).unwrap());
    drop(cache.get(a, 4 * pg).unwrap());
    // SAFETY: test-owned mapping.
    unsafe { libc::madvise((a + pg) as *mut _, pg, libc::MADV_DONTNEED) };
    drop(cache.get(a, 4 * pg).unwrap());
    assert_eq!(cache.stats().misses, 2);
    replace(a + 3 * pg, pg);
    drop(cache.get(a, pg).unwrap());
    assert_eq!(cache.stats().misses, 3);
    unmap(a, 4 * pg);
}

#[test]
fn lru_eviction_keeps_limits() {
    let _serial = serial();
    let pg = page();
    let cfg = Config::default().max_regions(3).merge_adjacent(false);
    let cache = Cache::new(Counting::default(), cfg).unwrap();
    let a = map(16 * pg);
    for round in 0..3 {
        for i in 0..8 {
            drop(cache.get(a + 2 * i * pg, pg).unwrap());
            assert!(cache.stats().regions <= 3, "round {round}");
        }
    }
    let held: Vec<_> = (0..3)
        .map(|i| cache.get(a + 2 * i * pg, pg).unwrap())
        .collect();
    // All cached regions held: a fourth still works (held ones are never evicted).
    drop(cache.get(a + 10 * pg, pg).unwrap());
    drop(held);
    cache.flush();
    let s = cache.stats();
    assert!(s.evictions >= 20, "{s:?}");
    assert_eq!(
        cache.registrar().live.lock().unwrap().len(),
        s.regions + s.retired
    );
    unmap(a, 16 * pg);
}

#[test]
fn max_bytes_evicts() {
    let _serial = serial();
    let pg = page();
    let cfg = Config::default().max_bytes(4 * pg).merge_adjacent(false);
    let cache = Cache::new(NoopRegistrar, cfg).unwrap();
    let a = map(16 * pg);
    for i in 0..8 {
        drop(cache.get(a + 2 * i * pg, 2 * pg - 1).unwrap());
    }
    cache.flush();
    assert!(cache.stats().bytes_registered <= 4 * pg);
    unmap(a, 16 * pg);
}

#[test]
fn many_handles_overflow_hazard_slots() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(Counting::default(), Config::default()).unwrap();
    let a = map(pg);
    let hs: Vec<_> = (0..50).map(|_| cache.get(a, pg).unwrap()).collect();
    replace(a, pg);
    cache.flush();
    assert_eq!(cache.stats().retired, 1);
    drop(hs);
    cache.flush();
    assert_eq!(cache.stats().retired, 0);
    assert!(cache.registrar().live.lock().unwrap().is_empty());
    unmap(a, pg);
}

#[test]
fn handles_dropped_on_another_thread() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(Counting::default(), Config::default()).unwrap();
    let a = map(pg);
    let h = cache.get(a, pg).unwrap();
    unmap(a, pg);
    std::thread::scope(|s| {
        s.spawn(move || drop(h));
    });
    cache.flush();
    assert!(cache.registrar().live.lock().unwrap().is_empty());
}

#[test]
fn user_regions_share_the_notifier() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(NoopRegistrar, Config::default()).unwrap();
    let a = map(4 * pg);
    drop(cache.get(a, 2 * pg).unwrap());
    cache
        .notifier()
        .register(a + 2 * pg..a + 4 * pg, ummunotify::Cookie(5))
        .unwrap();
    unmap(a, 4 * pg);
    let ev = cache.take_events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].cookie, ummunotify::Cookie(5));
    cache.notifier().unregister(ummunotify::Cookie(5)).unwrap();
    assert_eq!(cache.stats().invalidations, 1);
}

#[test]
fn threads_hit_and_invalidate() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(Counting::default(), Config::default()).unwrap();
    let bufs: Vec<usize> = (0..4).map(|_| map(pg)).collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (cache, bufs) = (&cache, &bufs);
            s.spawn(move || {
                for i in 0..20_000 {
                    let b = bufs[(i + t) % bufs.len()];
                    let h = cache.get(b, 64).unwrap();
                    assert!(h.range().contains(&b));
                }
            });
        }
    });
    let s = cache.stats();
    assert_eq!(s.hits + s.misses, 80_000);
    for b in bufs {
        unmap(b, pg);
    }
    cache.flush();
    assert!(cache.registrar().live.lock().unwrap().is_empty());
}

/// A registrar with a table of `cap` entries that notes the most it ever held at once, and yields
/// the CPU inside its calls so that misses on other threads go on meanwhile.
struct Bounded {
    cap: usize,
    live: AtomicUsize,
    most: AtomicUsize,
}

impl Registrar for Bounded {
    type Key = ();
    fn register(&self, _range: std::ops::Range<usize>) -> std::io::Result<()> {
        let now = self.live.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::yield_now();
        Ok(())
    }
    fn deregister(&self, _key: &(), _range: std::ops::Range<usize>) -> std::io::Result<()> {
        std::thread::yield_now();
        self.live.fetch_sub(1, SeqCst);
        Ok(())
    }
    fn max_registrations(&self) -> Option<usize> {
        Some(self.cap)
    }
}

/// Misses on pages with nothing cached next to them plan without the miss lock, and evictions
/// deregister without it: threads missing together must still never ask a bounded registrar
/// for more than its table (each counts the others' registrations in flight and the ones still
/// being deregistered, and waits for them when only they are in the way).
#[test]
fn concurrent_misses_never_overfill_a_bounded_registrar() {
    let _serial = serial();
    let pg = page();
    const CAP: usize = 5;
    const THREADS: usize = 4;
    const PER: usize = 500;
    let registrar = Bounded {
        cap: CAP,
        live: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    };
    let cache = Cache::new(registrar, Config::default()).unwrap();
    // One page in two: no region ever touches another, so no miss merges.
    let arena = map(2 * THREADS * PER * pg);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let cache = &cache;
            s.spawn(move || {
                for i in 0..PER {
                    let at = arena + 2 * (i * THREADS + t) * pg;
                    let h = cache.get(at, 64).unwrap();
                    assert!(h.range().contains(&at));
                }
            });
        }
    });
    let st = cache.stats();
    let reg = cache.registrar();
    assert_eq!(st.misses, (THREADS * PER) as u64);
    assert!(st.evictions > 0, "the table was never full: {st:?}");
    assert!(
        reg.most.load(SeqCst) <= CAP,
        "the registrar held {} registrations at once, its table {CAP}",
        reg.most.load(SeqCst)
    );
    cache.flush();
    assert_eq!(reg.live.load(SeqCst), st.regions + cache.stats().retired);
    drop(cache);
    unmap(arena, 2 * THREADS * PER * pg);
}

/// Regions invalidated while held stay registered with the device until their handles drop. A
/// registrar with a bounded table (io_uring: 4 slots here) must not be asked for more than it has:
/// the cache evicts unheld regions to make room for the pinned ones instead of failing.
#[test]
fn held_retired_regions_count_against_a_bounded_registrar_table() {
    let _s = serial();
    let pg = page();
    let registrar = match ummunotify::registrar::IoUringRegistrar::new(4) {
        Ok(r) => r,
        Err(e) => {
            ummunotify_testkit::require::skip_or_fail(
                "held_retired_regions_count_against_a_bounded_registrar_table",
                &format!("io_uring sparse buffer table: {e}"),
            );
            return;
        }
    };
    let cache = Cache::new(
        registrar,
        Config::default().max_regions(4).merge_adjacent(false),
    )
    .unwrap();
    let old = map(4 * 2 * pg);
    let fresh = map(4 * 2 * pg);
    // Four cached regions (every other page, so none merge), two of them held.
    let held: Vec<_> = (0..4)
        .map(|i| cache.get(old + 2 * i * pg, pg).unwrap())
        .take(2)
        .collect();
    for i in 2..4 {
        drop(cache.get(old + 2 * i * pg, pg).unwrap());
    }
    // All four invalidated: two leave at once, two stay registered for their holders.
    // SAFETY: test-owned mapping.
    assert_eq!(
        unsafe { libc::madvise(old as *mut _, 8 * pg, libc::MADV_DONTNEED) },
        0
    );
    assert!(held.iter().all(|h| !h.is_valid()));
    // Four fresh misses: with two slots pinned by holders, only two fit at a time; the cache must
    // evict its own unheld regions rather than overflow the table.
    for round in 0..3 {
        for i in 0..4 {
            let h = cache
                .get(fresh + 2 * i * pg, pg)
                .unwrap_or_else(|e| panic!("round {round}, miss {i}: {e}"));
            assert!(h.is_valid());
        }
    }
    drop(held);
    cache.flush();
    assert_eq!(cache.stats().retired, 0);
    unmap(old, 8 * pg);
    unmap(fresh, 8 * pg);
}

/// The user's events parked by the cache stay bounded: a region hit many times before its events
/// are taken has one event (merged, no hint), and unregistered regions' events are dropped.
#[test]
fn parked_user_events_are_bounded() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(NoopRegistrar, Config::default()).unwrap();
    let a = map(2 * pg);
    cache
        .notifier()
        .register(a..a + 2 * pg, ummunotify::Cookie(7))
        .unwrap();
    let b = map(pg);
    for i in 0..100 {
        // SAFETY: our own mapping; DONTNEED only drops its pages.
        unsafe {
            libc::madvise(
                (a + (i % 2) * pg) as *mut libc::c_void,
                pg,
                libc::MADV_DONTNEED,
            )
        };
        // A miss makes the cache read (and re-arm) the notifier's events.
        drop(cache.get(b, pg).unwrap());
        cache.flush();
    }
    let ev = cache.take_events().unwrap();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].cookie, ummunotify::Cookie(7));
    assert!(!ev[0].hint);
    assert_eq!((ev[0].start, ev[0].end), (a, a + 2 * pg));
    // Many short-lived regions, unregistered before their events are taken: pruned.
    for c in 0..1000u64 {
        let r = map(pg);
        let n = cache.notifier();
        n.register(r..r + pg, ummunotify::Cookie(1000 + c)).unwrap();
        unmap(r, pg);
        cache.flush();
        n.unregister(ummunotify::Cookie(1000 + c)).unwrap();
    }
    let ev = cache.take_events().unwrap();
    assert!(ev.len() <= 2 * 32 + 1, "{} parked events", ev.len());
    cache.notifier().unregister(ummunotify::Cookie(7)).unwrap();
    unmap(a, 2 * pg);
    unmap(b, pg);
}

/// A registrar whose first registration of a range containing `block_at` waits until the test
/// releases it (a slow device call: `ibv_reg_mr` of a large buffer can take milliseconds).
struct Gate {
    block_at: usize,
    state: Mutex<(bool, bool, bool)>, // (used, entered, released)
    cv: std::sync::Condvar,
    registered: AtomicUsize,
    deregistered: AtomicUsize,
}

impl Gate {
    fn new(block_at: usize) -> Self {
        Gate {
            block_at,
            state: Mutex::new((false, false, false)),
            cv: std::sync::Condvar::new(),
            registered: AtomicUsize::new(0),
            deregistered: AtomicUsize::new(0),
        }
    }
    fn wait_entered(&self) {
        let mut s = self.state.lock().unwrap();
        while !s.1 {
            s = self.cv.wait(s).unwrap();
        }
    }
    fn release(&self) {
        self.state.lock().unwrap().2 = true;
        self.cv.notify_all();
    }
}

impl Registrar for Gate {
    type Key = usize;
    fn register(&self, range: std::ops::Range<usize>) -> std::io::Result<usize> {
        let mut s = self.state.lock().unwrap();
        if range.contains(&self.block_at) && !s.0 {
            s.0 = true;
            s.1 = true;
            self.cv.notify_all();
            while !s.2 {
                s = self.cv.wait(s).unwrap();
            }
        }
        Ok(self.registered.fetch_add(1, SeqCst))
    }
    fn deregister(&self, _key: &usize, _range: std::ops::Range<usize>) -> std::io::Result<()> {
        self.deregistered.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// Releases the gate when dropped, so a failing test unblocks its registering thread.
struct Opens<'a>(&'a Gate);

impl Drop for Opens<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Waits for `rx` (a guard against a hang, not a timing check: the bound is a minute).
fn completes<T>(rx: &std::sync::mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not complete while another miss was registering"))
}

/// The device registration runs outside the miss lock: while one thread's miss is blocked in the
/// registrar, another thread's miss (other memory) and hit complete.
#[test]
fn misses_on_other_threads_proceed_while_one_registers() {
    let pg = page();
    let (a, b) = (map(pg), map(pg));
    let cache = Cache::new(Gate::new(a), Config::default().merge_adjacent(false)).unwrap();
    drop(cache.get(b, pg).unwrap()); // b cached before: a hit below too
    let c = map(pg);
    let cache = &cache;
    std::thread::scope(|s| {
        let blocked = s.spawn(move || {
            let h = cache.get(a, pg).unwrap();
            assert!(h.is_valid());
            *h.key()
        });
        cache.registrar().wait_entered();
        let opens = Opens(cache.registrar());
        let (tx, rx) = std::sync::mpsc::channel();
        let other = s.spawn(move || {
            let miss = cache.get(c, pg).map(|h| *h.key());
            let hit = cache.get(b, pg).map(|h| *h.key());
            tx.send((miss.is_ok(), hit.is_ok())).unwrap();
        });
        let (miss_ok, hit_ok) = completes(&rx, "a miss on other memory");
        assert!(miss_ok && hit_ok);
        other.join().unwrap();
        drop(opens);
        blocked.join().unwrap();
    });
    let st = cache.stats();
    assert_eq!((st.misses, st.regions), (3, 3), "{st:?}");
    unmap(a, pg);
    unmap(b, pg);
    unmap(c, pg);
}

/// Two misses on the same range at once: both register (neither waits for the other), one
/// region is published and the other registration is released; every handle is valid and
/// covers the range.
#[test]
fn concurrent_misses_on_one_range_publish_one_region() {
    let pg = page();
    let a = map(2 * pg);
    let cache = Cache::new(Gate::new(a), Config::default().merge_adjacent(false)).unwrap();
    let cache = &cache;
    std::thread::scope(|s| {
        let first = s.spawn(move || {
            let h = cache.get(a, 2 * pg).unwrap();
            assert!(h.is_valid() && h.range() == (a..a + 2 * pg));
        });
        cache.registrar().wait_entered();
        let opens = Opens(cache.registrar());
        let (tx, rx) = std::sync::mpsc::channel();
        let second = s.spawn(move || {
            let h = cache.get(a, 2 * pg).unwrap();
            assert!(h.is_valid() && h.range() == (a..a + 2 * pg));
            tx.send(()).unwrap();
        });
        completes(&rx, "a second miss on the same range");
        drop(opens);
        first.join().unwrap();
        second.join().unwrap();
    });
    cache.flush();
    let st = cache.stats();
    assert_eq!(st.regions, 1, "{st:?}");
    let g = cache.registrar();
    assert_eq!(g.registered.load(SeqCst), 2);
    assert_eq!(g.deregistered.load(SeqCst), 1, "{st:?}");
    drop(cache.get(a + pg, pg).unwrap());
    assert_eq!(
        cache.stats().misses,
        st.misses,
        "a hit in the published region"
    );
    unmap(a, 2 * pg);
}

/// A miss over pages the cache's notifier already watches (here: a region of the user's own)
/// registers with the notifier and watches (see `Watcher::watch_persists` for why the watch is
/// not skipped), and the region is invalidated by an unmap of its pages.
#[test]
fn miss_over_watched_pages_is_watched() {
    let pg = page();
    let a = map(4 * pg);
    // (The hooks backend watches in a filter of its own: no syscall to skip.)
    let n = ummunotify::Notifier::with_backend(ummunotify::Backend::Userfaultfd).unwrap();
    let cache = Cache::with_notifier(n, NoopRegistrar, Config::default().merge_adjacent(false));
    cache
        .notifier()
        .register(a..a + 4 * pg, ummunotify::Cookie(7))
        .unwrap();
    let calls = cache.notifier().stats().watch_calls;
    let h = cache.get(a + pg, pg).unwrap();
    assert_eq!(cache.stats().misses, 1);
    assert_eq!(
        cache.notifier().stats().watch_calls,
        calls + 1,
        "the miss did not watch"
    );
    let _s = serial();
    replace(a + pg, pg);
    assert!(!h.is_valid(), "a handle over new memory reads valid");
    drop(h);
    unmap(a, 4 * pg);
}

/// Misses on overlapping and adjacent ranges from several threads, with merging and eviction:
/// every handle covers what was asked, the registrar sees every region deregistered exactly once,
/// and nothing is left registered once the memory is gone. Misses here race each other's publishes, the
/// case where a publish must search the index again instead of trusting its plan (a debug build
/// checks the plan's claim whenever it skips that search).
#[test]
fn racing_misses_on_overlapping_ranges_merge_and_evict() {
    let _serial = serial();
    let pg = page();
    let cache = Cache::new(Counting::default(), Config::default().max_regions(6)).unwrap();
    let pages = 48;
    let a = map(pages * pg);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let cache = &cache;
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t + 1);
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let first = (x % pages as u64) as usize;
                    let n = 1 + ((x >> 8) % 3) as usize;
                    let n = n.min(pages - first);
                    // Not page aligned on either side, sometimes.
                    let (start, end) = (
                        a + first * pg + (x >> 20) as usize % 64,
                        a + (first + n) * pg,
                    );
                    let h = cache.get(start, end - start).unwrap();
                    assert!(h.range().start <= start && end <= h.range().end);
                }
            });
        }
    });
    let s = cache.stats();
    assert!(s.regions <= 6, "{s:?}");
    unmap(a, pages * pg);
    cache.flush();
    let r = cache.registrar();
    assert!(r.live.lock().unwrap().is_empty());
    assert_eq!(r.registered.load(SeqCst), r.deregistered.load(SeqCst));
}
