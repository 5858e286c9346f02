//! The notifier against the real kernel: events, hints, coalescing, re-arming, readiness,
//! coverage sharing, bad input (guarantee 5), monitor failure, concurrent stale-use hunting.
mod common;

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use common::*;
use ummunotify::{Cookie, Error, Event, Notifier};

fn notifier() -> Notifier {
    Notifier::new().expect("userfaultfd notifier (CI runs as root on a kernel that has it)")
}

#[test]
fn munmap_invalidates_before_it_returns_and_reports_the_callers_range() {
    let n = notifier();
    // Low, where no other test maps: the region stays registered after the munmap, and another
    // test's change at reused addresses would coalesce into this event and clear its hint.
    let p = map_low(4 * PAGE);
    // A sub-page range: events report it as given, not rounded.
    let r = n.register(p + 100..p + 2 * PAGE + 7, Cookie(1)).unwrap();
    let g = n.generation().unwrap();
    assert!(n.is_valid(r) && n.unchanged_since(g));
    unmap(p, 4 * PAGE);
    assert!(!n.is_valid(r), "region valid after munmap returned");
    assert!(
        !n.unchanged_since(g),
        "counter unchanged after munmap returned"
    );
    let ev = n.events().unwrap();
    assert_eq!(
        ev,
        vec![Event {
            cookie: Cookie(1),
            start: p + 100,
            end: p + 2 * PAGE + 7,
            hint: true
        }]
    );
    assert!(!n.is_valid(r), "an old token never reads valid again");
}

#[test]
fn hint_is_clipped_then_cleared_by_a_second_invalidation() {
    let n = notifier();
    let p = map(8 * PAGE);
    n.register(p + 2 * PAGE..p + 6 * PAGE, Cookie(7)).unwrap();
    madvise(p, 3 * PAGE, libc::MADV_DONTNEED);
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].range(), p + 2 * PAGE..p + 3 * PAGE);
    assert!(ev[0].hint);
    // Two invalidations before a read: one event, no hint, the whole region.
    madvise(p + 5 * PAGE, PAGE, libc::MADV_DONTNEED);
    madvise(p + 2 * PAGE, PAGE, libc::MADV_DONTNEED);
    let ev = n.events().unwrap();
    assert_eq!(
        ev.len(),
        1,
        "coalesced: at most one pending event per region"
    );
    assert_eq!(ev[0].range(), p + 2 * PAGE..p + 6 * PAGE);
    assert!(!ev[0].hint);
    n.unregister(Cookie(7)).unwrap();
    unmap(p, 8 * PAGE);
}

#[test]
fn reading_the_event_rearms_the_region() {
    let n = notifier();
    let p = map(2 * PAGE);
    let r1 = n.register(p..p + 2 * PAGE, Cookie(3)).unwrap();
    madvise(p, PAGE, libc::MADV_DONTNEED);
    assert!(!n.is_valid(r1));
    assert_eq!(n.events().unwrap().len(), 1);
    let r2 = n.region(Cookie(3)).unwrap();
    assert!(n.is_valid(r2), "re-armed after its event was read");
    assert!(!n.is_valid(r1));
    madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
    assert!(!n.is_valid(r2));
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].range(), p + PAGE..p + 2 * PAGE);
    n.unregister(Cookie(3)).unwrap();
    unmap(p, 2 * PAGE);
}

#[test]
fn a_region_unmapped_and_mapped_again_is_watched_again_after_its_event() {
    let n = notifier();
    let p = fixed_area(1);
    assert!(map_at(p, PAGE));
    n.register(p..p + PAGE, Cookie(5)).unwrap();
    unmap(p, PAGE);
    assert!(map_at(p, PAGE));
    // The old watch went with the unmap; reading the event re-watches the new mapping.
    assert_eq!(n.events().unwrap().len(), 1);
    let r = n.region(Cookie(5)).unwrap();
    assert!(n.is_valid(r), "re-armed over the new mapping");
    unmap(p, PAGE);
    assert!(!n.is_valid(r), "the new mapping's unmap was seen");
    assert_eq!(n.events().unwrap().len(), 1);
    // Now nothing is mapped there: reading the event leaves the region invalid.
    let r = n.region(Cookie(5)).unwrap();
    assert!(!n.is_valid(r), "a region over a hole stays invalid");
    n.unregister(Cookie(5)).unwrap();
}

#[test]
fn untouched_memory_reports_nothing() {
    let n = notifier();
    let p = map(4 * PAGE);
    let r = n.register(p + PAGE..p + 2 * PAGE, Cookie(9)).unwrap();
    let g = n.generation().unwrap();
    madvise(p, PAGE, libc::MADV_DONTNEED);
    madvise(p + 2 * PAGE, 2 * PAGE, libc::MADV_DONTNEED);
    unmap(p + 3 * PAGE, PAGE);
    assert!(n.is_valid(r));
    assert!(
        n.unchanged_since(g),
        "unwatched pages cost nothing and say nothing"
    );
    assert!(n.events().unwrap().is_empty());
    n.unregister(Cookie(9)).unwrap();
    unmap(p, 3 * PAGE);
}

#[test]
fn overlapping_regions_share_coverage_and_each_get_one_event() {
    let n = notifier();
    let p = map(4 * PAGE);
    let a = n.register(p..p + 3 * PAGE, Cookie(1)).unwrap();
    let b = n.register(p + PAGE..p + 4 * PAGE, Cookie(2)).unwrap();
    let c = n.register(p + PAGE..p + 4 * PAGE, Cookie(3)).unwrap(); // duplicate range
    n.unregister(Cookie(1)).unwrap(); // must not drop coverage b and c need
    assert!(!n.is_valid(a), "an unregistered region's token is invalid");
    madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
    assert!(!n.is_valid(b) && !n.is_valid(c));
    let mut ev = n.events().unwrap();
    ev.sort_by_key(|e| e.cookie);
    let cookies: Vec<_> = ev.iter().map(|e| e.cookie).collect();
    assert_eq!(cookies, vec![Cookie(2), Cookie(3)]);
    n.unregister(Cookie(2)).unwrap();
    n.unregister(Cookie(3)).unwrap();
    unmap(p, 4 * PAGE);
}

/// Not readable, or only while the process's one userfaultfd context hands this notifier a
/// message of another test's notifier (withdrawn when the message hit none of its regions).
fn quiet(n: &Notifier) -> bool {
    common::quiet(n.as_fd())
}

#[test]
fn fd_is_readable_as_soon_as_the_unmapping_call_returns() {
    let n = notifier();
    for i in 0..500u64 {
        // An address no other test gets: the region stays registered after its munmap, and a
        // change to another test's mapping at the same addresses would be a second (genuine)
        // event for it.
        let p = map_low(PAGE);
        n.register(p..p + PAGE, Cookie(i)).unwrap();
        assert!(quiet(&n));
        unmap(p, PAGE);
        assert!(
            readable(n.as_fd()),
            "round {i}: poll(0) after munmap missed the event"
        );
        assert_eq!(n.events().unwrap().len(), 1);
        assert!(quiet(&n), "readable with nothing pending");
        n.unregister(Cookie(i)).unwrap();
    }
}

/// The readiness fd is written only once somebody asked for it (`as_fd`): an event that came
/// before makes it readable at the first ask, on the monitor's path (userfaultfd) and on the
/// in-thread path (hooks, hybrid). From then on it follows the queue.
#[test]
fn fd_asked_for_after_the_event_is_readable_at_once() {
    let mut backends = vec![ummunotify::Backend::Userfaultfd];
    if cfg!(target_arch = "x86_64") {
        backends.extend([ummunotify::Backend::Hooks, ummunotify::Backend::Hybrid]);
    }
    for backend in backends {
        let n = Notifier::with_backend(backend).unwrap();
        let p = map(2 * PAGE);
        n.register(p..p + PAGE, Cookie(1)).unwrap();
        n.register(p + PAGE..p + 2 * PAGE, Cookie(2)).unwrap();
        madvise(p, PAGE, libc::MADV_DONTNEED);
        assert!(
            readable(n.as_fd()),
            "{backend:?}: an event before the first as_fd left the fd unreadable"
        );
        assert_eq!(n.events().unwrap().len(), 1);
        assert!(quiet(&n), "{backend:?}: readable with nothing pending");
        // Asked for now: the next event writes it.
        madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
        assert!(readable(n.as_fd()), "{backend:?}: second event unseen");
        assert_eq!(n.events().unwrap().len(), 1);
        n.unregister(Cookie(1)).unwrap();
        n.unregister(Cookie(2)).unwrap();
        unmap(p, 2 * PAGE);
    }
}

#[test]
fn read_events_in_small_batches_reports_drained_only_at_the_end() {
    let n = notifier();
    // Low, where no other test maps: the regions stay registered over the hole, and another
    // test's change at reused addresses would be a second event for a region already read.
    let p = map_low(10 * PAGE);
    for i in 0..10 {
        n.register(p + i * PAGE..p + (i + 1) * PAGE, Cookie(i as u64))
            .unwrap();
    }
    unmap(p, 10 * PAGE);
    let mut buf = [Event::default(); 4];
    let mut seen = Vec::new();
    loop {
        let r = n.read_events(&mut buf).unwrap();
        seen.extend(buf[..r.count].iter().map(|e| e.cookie.0));
        if let Some(g) = r.drained {
            // The generation once no message is mid-way (`generation` waits): other tests'
            // munmaps reach this notifier through the process's shared context and make the
            // counter odd for a moment, but a message that hits none of our regions leaves it
            // where it was.
            assert_eq!(
                n.generation().unwrap(),
                g,
                "drained at the current generation"
            );
            break;
        }
        assert_eq!(r.count, 4);
    }
    seen.sort();
    assert_eq!(
        seen,
        (0..10).collect::<Vec<_>>(),
        "every region exactly once"
    );
    for i in 0..10 {
        n.unregister(Cookie(i)).unwrap();
    }
}

/// The counters that are this notifier's state. The rest are the process's: every notifier of
/// the process shares one userfaultfd context and its monitor, so the messages (and REMOVEs in
/// flight) of the other tests of this binary, running in parallel, move them.
fn own_state(mut s: ummunotify::Stats) -> ummunotify::Stats {
    s.messages = 0;
    s.removes_confirmed = 0;
    s.removes_by_grace = 0;
    s.removes_in_flight = 0;
    s.vma_estimate = 0;
    s
}

/// Guarantee 5: bad input gets a typed error and changes nothing.
#[test]
fn bad_input_is_refused_and_leaves_the_state_as_it_was() {
    let n = notifier();
    // Two mapped pages with a hole after them that no other thread can fill.
    let p = fixed_area(2);
    assert!(map_at(p, 2 * PAGE));
    let hole = p + 4 * PAGE;
    let r = n.register(p..p + PAGE, Cookie(1)).unwrap();
    let before = n.stats();
    #[allow(clippy::reversed_empty_ranges)]
    type Case<'a> = (
        &'a str,
        Result<ummunotify::Region, Error>,
        fn(&Error) -> bool,
    );
    let cases: Vec<Case> = vec![
        ("empty", n.register(p..p, Cookie(2)), |e| {
            matches!(e, Error::EmptyRange)
        }),
        ("wrapping", n.register(p + PAGE..p, Cookie(2)), |e| {
            matches!(e, Error::WrappingRange)
        }),
        (
            "rounding overflows",
            n.register(usize::MAX - 5..usize::MAX, Cookie(2)),
            |e| matches!(e, Error::WrappingRange),
        ),
        ("unmapped", n.register(hole..hole + PAGE, Cookie(2)), |e| {
            matches!(e, Error::Unmapped)
        }),
        (
            "partly unmapped",
            n.register(p..p + 2 * PAGE + PAGE, Cookie(2)),
            |e| matches!(e, Error::Unmapped),
        ),
        (
            "duplicate cookie",
            n.register(p + PAGE..p + 2 * PAGE, Cookie(1)),
            |e| matches!(e, Error::DuplicateCookie(Cookie(1))),
        ),
    ];
    for (what, result, expected) in cases {
        match result {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => assert!(expected(&e), "{what}: wrong error {e:?}"),
        }
    }
    assert!(matches!(
        n.unregister(Cookie(42)),
        Err(Error::UnknownCookie(Cookie(42)))
    ));
    assert!(matches!(n.region(Cookie(42)), Err(Error::UnknownCookie(_))));
    assert_eq!(
        own_state(n.stats()),
        own_state(before),
        "a refused call changed the state"
    );
    assert!(n.is_valid(r), "a refused call disturbed an existing region");
    // The refused cookie is still free, and the failed ranges left no watch behind.
    n.register(p + PAGE..p + 2 * PAGE, Cookie(2)).unwrap();
    n.unregister(Cookie(2)).unwrap();
    madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
    assert!(n.is_valid(r));
    assert!(n.events().unwrap().is_empty());
    n.unregister(Cookie(1)).unwrap();
    unmap(p, 2 * PAGE);
}

#[test]
fn vdso_is_refused_with_a_typed_error() {
    let n = notifier();
    // SAFETY: getauxval has no preconditions.
    let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    assert_ne!(vdso, 0);
    let e = n.register(vdso..vdso + PAGE, Cookie(1)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedMapping(_)), "{e:?}");
    assert_eq!(n.stats().regions, 0);
}

#[test]
fn a_failed_monitor_reports_every_region_invalid_and_releases_unmappers() {
    let n = notifier();
    let p = map(3 * PAGE);
    let a = n.register(p..p + PAGE, Cookie(1)).unwrap();
    let b = n.register(p + 2 * PAGE..p + 3 * PAGE, Cookie(2)).unwrap();
    n.inject_monitor_failure();
    madvise(p, PAGE, libc::MADV_DONTNEED);
    assert!(!n.is_valid(a));
    assert!(
        !n.is_valid(b),
        "a region the failing message did not touch must read invalid too"
    );
    assert!(matches!(n.events(), Err(Error::MonitorDead)));
    assert!(matches!(
        n.register(p..p + PAGE, Cookie(3)),
        Err(Error::MonitorDead)
    ));
    // Unmapping watched memory still returns: the dead monitor keeps draining.
    for _ in 0..100 {
        madvise(p + 2 * PAGE, PAGE, libc::MADV_DONTNEED);
    }
    unmap(p, 3 * PAGE);
}

/// Guarantee 1 under concurrency: one thread munmaps and maps again at the same address, another
/// checks the region after it learned the munmap returned. 100,000 rounds, no stale pass.
#[test]
fn no_stale_check_across_threads_100k_rounds() {
    let rounds: u64 = std::env::var("UMN_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let n = Arc::new(notifier());
    let p = fixed_area(3);
    assert!(map_at(p, PAGE));
    let region = n.register(p..p + PAGE, Cookie(1)).unwrap();
    // Round r: the unmapper publishes `unmapped = r` after munmap returned; the checker then checks
    // that round's token. The checker's own check and the unmapper's check both count.
    let unmapped = Arc::new(AtomicU64::new(0));
    let checked = Arc::new(AtomicU64::new(0));
    let stale = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(std::sync::Mutex::new(region));
    let checker = {
        let (n, unmapped, checked, stale, stop, tokens) = (
            n.clone(),
            unmapped.clone(),
            checked.clone(),
            stale.clone(),
            stop.clone(),
            tokens.clone(),
        );
        std::thread::spawn(move || {
            let mut last = 0;
            while !stop.load(SeqCst) {
                let r = unmapped.load(SeqCst);
                if r == last {
                    // Yield: on 2 CPUs the unmapper (and the monitor) need ours.
                    std::thread::yield_now();
                    continue;
                }
                last = r;
                let t = *tokens.lock().unwrap();
                if n.is_valid(t) {
                    stale.fetch_add(1, SeqCst);
                }
                checked.store(r, SeqCst);
            }
        })
    };
    for r in 1..=rounds {
        let t = *tokens.lock().unwrap();
        assert!(n.is_valid(t), "round {r}: fresh region invalid");
        unmap(p, PAGE);
        if n.is_valid(t) {
            stale.fetch_add(1, SeqCst);
        }
        unmapped.store(r, SeqCst);
        assert!(
            map_at(p, PAGE),
            "round {r}: could not map at the same address"
        );
        // Wait for the checker's verdict on this round, then re-arm for the next.
        while checked.load(SeqCst) != r {
            std::thread::yield_now();
        }
        n.events().unwrap();
        let fresh = n.region(Cookie(1)).unwrap();
        *tokens.lock().unwrap() = fresh;
    }
    stop.store(true, SeqCst);
    checker.join().unwrap();
    assert_eq!(stale.load(SeqCst), 0, "stale checks after munmap returned");
    n.unregister(Cookie(1)).unwrap();
    unmap(p, PAGE);
}

/// Pages another library's userfaultfd context owns are refused with `RangeBusy`, and the
/// refusal changes nothing. (Our own notifiers share one context: `tests/one_context.rs`.)
#[test]
fn pages_a_foreign_userfaultfd_owns_get_range_busy_and_change_nothing() {
    let n = Notifier::with_backend(ummunotify::Backend::Userfaultfd).unwrap();
    let p = map(4 * PAGE);
    let foreign = foreign_userfaultfd(p, 2 * PAGE);
    let state = |s: ummunotify::Stats| (s.regions, s.pending, s.coverage_segments, s.watched_bytes);
    let before = state(n.stats());
    let e = n.register(p + PAGE..p + 3 * PAGE, Cookie(1)).unwrap_err();
    assert!(matches!(e, Error::RangeBusy), "{e:?}");
    assert_eq!(state(n.stats()), before);
    // Pages next to the foreign range are fine.
    let r = n.register(p + 2 * PAGE..p + 4 * PAGE, Cookie(1)).unwrap();
    drop(foreign);
    unmap(p, 4 * PAGE);
    assert!(!n.is_valid(r));
    assert_eq!(n.events().unwrap().len(), 1);
}

/// The 2010 counter (`notifications`): 0 at start, +1 per kernel message that hit a region
/// (visible when the call returns), one per VMA for madvise, nothing for unregistered memory,
/// and the drained value of `read_events` equals it. Exact when the notifier is alone in its
/// process: on userfaultfd every notifier is handed every message and counts it ahead, so the
/// other tests' traffic would add to it (`one_context.rs` checks that over-count). Hence a child
/// process of its own, whose first notifier opens a userfaultfd context of its own.
#[test]
fn notification_count_is_the_2010_counter_exactly() {
    let code = in_child(|| {
        let n = notifier();
        let mut failures = 0;
        let mut check = |got: u64, want: u64, what: &str| {
            if got != want {
                eprintln!("{what}: {got}, want {want}");
                failures += 1;
            }
        };
        check(n.notifications(), 0, "at start");
        let p = map_low(3 * PAGE);
        // Three VMAs: the middle page gets other protections.
        // SAFETY: our own fresh mapping.
        let r = unsafe { libc::mprotect((p + PAGE) as *mut libc::c_void, PAGE, libc::PROT_READ) };
        assert_eq!(r, 0);
        n.register(p..p + 3 * PAGE, Cookie(1)).unwrap();
        madvise(p, 3 * PAGE, libc::MADV_DONTNEED);
        check(
            n.notifications(),
            3,
            "madvise over three VMAs is three messages",
        );
        let mut buf = [Event::default(); 4];
        let r = n.read_events(&mut buf).unwrap();
        check(r.count as u64, 1, "events");
        check(r.drained_notifications.unwrap_or(0), 3, "drained");
        unmap(p, 3 * PAGE);
        check(
            n.notifications(),
            4,
            "one munmap over three VMAs is one message",
        );
        n.unregister(Cookie(1)).unwrap();
        let q = map(PAGE);
        n.register(q..q + PAGE, Cookie(2)).unwrap();
        n.unregister(Cookie(2)).unwrap();
        unmap(q, PAGE);
        check(n.notifications(), 4, "unregistered memory does not count");
        let r = n.read_events(&mut buf).unwrap();
        check(
            r.drained_notifications.unwrap_or(0),
            4,
            "drained at the end",
        );
        failures
    });
    assert_eq!(
        code, 0,
        "the 2010 count was not exact (see the child's stderr)"
    );
}

/// A registration over pages already watched still watches them (the kernel queues a munmap's
/// `UNMAP` only after it dropped the VMA and `mmap_lock`, so "no unmap delivered since" does not
/// mean "still the memory that was watched"; see `Watcher::watch_persists`), and a region over
/// new memory at watched addresses is invalidated by that memory's unmap.
#[test]
fn registration_over_watched_pages_watches_them() {
    let n = Notifier::with_backend(ummunotify::Backend::Userfaultfd).unwrap();
    let p = map(4 * PAGE);
    n.register(p..p + 4 * PAGE, Cookie(1)).unwrap();
    let calls = n.stats().watch_calls;
    assert_eq!(calls, 1);
    let inner = n.register(p + PAGE..p + 2 * PAGE, Cookie(2)).unwrap();
    let sub = n
        .register(p + 2 * PAGE + 8..p + 2 * PAGE + 72, Cookie(3))
        .unwrap();
    assert_eq!(n.stats().watch_calls, calls + 2, "{:?}", n.stats());
    assert!(n.is_valid(inner) && n.is_valid(sub));
    madvise(p + 2 * PAGE, PAGE, libc::MADV_DONTNEED);
    assert!(n.is_valid(inner) && !n.is_valid(sub));
    // New memory at p + PAGE (the kernel unmaps the old page): the watch over it is gone.
    replace(p + PAGE, PAGE);
    assert!(!n.is_valid(inner));
    n.events().unwrap();
    n.unregister(Cookie(2)).unwrap();
    let again = n.register(p + PAGE..p + 2 * PAGE, Cookie(4)).unwrap();
    // The new page is watched: an unmap of it invalidates the region before it returns.
    assert!(n.is_valid(again));
    replace(p + PAGE, PAGE);
    assert!(
        !n.is_valid(again),
        "the re-registered region missed an unmap of its page"
    );
    unmap(p, 4 * PAGE);
}
