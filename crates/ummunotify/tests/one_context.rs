//! One userfaultfd context per process (issue 10, item 4): every notifier on the userfaultfd
//! backend shares it, so our own notifiers never refuse each other's pages (`RangeBusy`), each
//! still sees only its own regions and events, dropping or unregistering in one never unwatches
//! pages another still needs, and fork poisons them all.
//!
//! Before the shared context, each notifier had its own, and the second registration on a page
//! the first watched failed with `RangeBusy` (the first assertion of every test here).
//!
//! Every test maps its memory with `map_low` (an address no other test of this binary gets):
//! the tests run in parallel on one context, and a late `UNMAP` of another test's pages (the
//! kernel queues it after the unmapped range is free again) would otherwise hit regions just
//! registered at the same addresses, or another test's regions there keep them watched.
mod common;

use std::os::fd::AsFd;

use common::*;
use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::NoopRegistrar;
use ummunotify::{Backend, Cookie, Error, Notifier};

fn uffd() -> Notifier {
    Notifier::with_backend(Backend::Userfaultfd)
        .expect("userfaultfd notifier (CI runs as root on a kernel that has it)")
}

fn cookies(n: &Notifier) -> Vec<u64> {
    let mut c: Vec<u64> = n.events().unwrap().iter().map(|e| e.cookie.0).collect();
    c.sort();
    c
}

#[test]
fn two_notifiers_on_disjoint_bytes_of_one_page() {
    let (a, b) = (uffd(), uffd());
    let p = map_low(PAGE);
    let ra = a.register(p..p + 100, Cookie(1)).unwrap();
    let rb = b.register(p + 200..p + 300, Cookie(2)).unwrap();
    assert!(a.is_valid(ra) && b.is_valid(rb));
    unmap(p, PAGE);
    assert!(
        !a.is_valid(ra),
        "first notifier not invalidated before munmap returned"
    );
    assert!(
        !b.is_valid(rb),
        "second notifier not invalidated before munmap returned"
    );
    let (ea, eb) = (a.events().unwrap(), b.events().unwrap());
    assert_eq!(ea.len(), 1);
    assert_eq!(
        (ea[0].cookie, ea[0].start, ea[0].end),
        (Cookie(1), p, p + 100)
    );
    assert_eq!(eb.len(), 1);
    assert_eq!(
        (eb[0].cookie, eb[0].start, eb[0].end),
        (Cookie(2), p + 200, p + 300)
    );
    assert_eq!(a.monitor_tid(), b.monitor_tid(), "one monitor thread");
}

#[test]
fn overlapping_notifiers_each_see_only_their_own_regions() {
    let (a, b) = (uffd(), uffd());
    let p = map_low(4 * PAGE);
    let ra = a.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    let rb = b.register(p + PAGE..p + 3 * PAGE, Cookie(2)).unwrap();
    let gb = b.generation().unwrap();
    // Only A's pages: B is handed the message too (one context) and must see nothing.
    madvise(p, PAGE, libc::MADV_DONTNEED);
    assert!(!a.is_valid(ra));
    assert!(
        b.is_valid(rb),
        "B invalidated by a change to A's pages only"
    );
    assert!(
        b.unchanged_since(gb),
        "B's counter moved for a message that hit none of its regions"
    );
    // (Readable only while some message is being taken: other tests' notifiers share it.)
    assert!(common::quiet(b.as_fd()), "B readable with nothing to read");
    assert_eq!(cookies(&a), [1]);
    assert_eq!(cookies(&b), Vec::<u64>::new());
    // The shared page: both.
    let ra = a.region(Cookie(1)).unwrap();
    madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
    assert!(!a.is_valid(ra) && !b.is_valid(rb));
    assert_eq!(cookies(&a), [1]);
    assert_eq!(cookies(&b), [2]);
    unmap(p, 4 * PAGE);
}

/// The 2010 count of a notifier that has regions takes a message for another notifier's pages
/// ahead, before the read that releases the unmapping thread, and keeps it (one too many, never
/// taken back: a program may hold a value loaded before its own call, see
/// docs/architecture/interfaces.md, "The 2010 counter"); one without regions counts nothing. In
/// a child process, alone with its two notifiers, so the counts are exact.
#[test]
fn a_message_for_another_notifiers_pages_counts_ahead_once() {
    let code = in_child(|| {
        let (a, b, idle) = (uffd(), uffd(), uffd());
        let p = map_low(4 * PAGE);
        a.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
        b.register(p + PAGE..p + 3 * PAGE, Cookie(2)).unwrap();
        let counts = || (a.notifications(), b.notifications(), idle.notifications());
        let mut failures = 0;
        // Only A's pages: B counts it ahead and keeps it; the idle one counts nothing.
        madvise(p, PAGE, libc::MADV_DONTNEED);
        if counts() != (1, 1, 0) {
            eprintln!("A's pages only: {:?}, want (1, 1, 0)", counts());
            failures += 1;
        }
        // The shared page: a hit for both.
        madvise(p + PAGE, PAGE, libc::MADV_DONTNEED);
        if counts() != (2, 2, 0) {
            eprintln!("the shared page: {:?}, want (2, 2, 0)", counts());
            failures += 1;
        }
        unmap(p, 4 * PAGE);
        failures
    });
    assert_eq!(code, 0, "counts (see the child's stderr)");
}

#[test]
fn dropping_one_never_unwatches_pages_another_needs() {
    let (a, b) = (uffd(), uffd());
    let p = map_low(3 * PAGE);
    a.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    let rb = b.register(p + PAGE..p + 2 * PAGE, Cookie(2)).unwrap();
    assert!(uffd_wp_registered(p) && uffd_wp_registered(p + PAGE));
    drop(a);
    // A's own page is unwatched in the kernel (nobody needs it), the shared one is not.
    assert!(
        !uffd_wp_registered(p),
        "the dropped notifier's own page is still watched"
    );
    assert!(
        uffd_wp_registered(p + PAGE),
        "B's page lost its watch when A was dropped"
    );
    unmap(p, 3 * PAGE);
    assert!(
        !b.is_valid(rb),
        "B's page lost its watch when A was dropped"
    );
    assert_eq!(cookies(&b), [2]);
}

/// The per-page count across notifiers is kept only while two or more live: a notifier that
/// joins after another watches pages must count those, and one left alone must still unwatch
/// what it stops needing. In a child process, whose context these notifiers have to themselves
/// (the other tests' notifiers would keep the count alive).
#[test]
fn a_notifier_joining_or_leaving_keeps_the_counts() {
    let code = in_child(|| {
        let mut failures = 0;
        let mut want = |what: &str, page: usize, watched: bool| {
            if uffd_wp_registered(page) != watched {
                eprintln!("{what}: page watched {}, want {watched}", !watched);
                failures += 1;
            }
        };
        let p = map_low(3 * PAGE);
        let a = uffd();
        a.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
        // B joins when A's pages are watched already, and shares one of them.
        let b = uffd();
        b.register(p + PAGE..p + 3 * PAGE, Cookie(2)).unwrap();
        b.unregister(Cookie(2)).unwrap();
        want("B unregistered: the page A shares", p + PAGE, true);
        want("B unregistered: B's own page", p + 2 * PAGE, false);
        b.register(p + PAGE..p + 3 * PAGE, Cookie(2)).unwrap();
        a.unregister(Cookie(1)).unwrap();
        want("A unregistered: A's own page", p, false);
        want("A unregistered: the page B shares", p + PAGE, true);
        // A third comes and goes, then A: B alone must still unwatch what it stops needing.
        let c = uffd();
        c.register(p..p + PAGE, Cookie(3)).unwrap();
        drop(c);
        want("C dropped: C's page", p, false);
        drop(a);
        let rb = b.register(p..p + PAGE, Cookie(4)).unwrap();
        b.unregister(Cookie(2)).unwrap();
        want("B alone, unregistered: the middle page", p + PAGE, false);
        want("B alone, unregistered: the last page", p + 2 * PAGE, false);
        want("B alone: its remaining page", p, true);
        unmap(p, 3 * PAGE);
        if b.is_valid(rb) {
            eprintln!("B's region valid after its memory was unmapped");
            failures += 1;
        }
        failures
    });
    assert_eq!(code, 0, "watches (see the child's stderr)");
}

#[test]
fn unregistering_in_one_never_unwatches_pages_another_needs() {
    let (a, b) = (uffd(), uffd());
    let p = map_low(2 * PAGE);
    a.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    let rb = b.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    a.unregister(Cookie(1)).unwrap();
    assert!(
        uffd_wp_registered(p),
        "B's pages lost their watch when A unregistered"
    );
    b.unregister(Cookie(1)).unwrap();
    assert!(
        !uffd_wp_registered(p),
        "watched after the last region on it went"
    );
    let rb2 = b.register(p..p + 2 * PAGE, Cookie(2)).unwrap();
    a.register(p..p + PAGE, Cookie(1)).unwrap();
    a.unregister(Cookie(1)).unwrap();
    assert!(b.is_valid(rb2) && !b.is_valid(rb));
    unmap(p, 2 * PAGE);
    assert!(
        !b.is_valid(rb2),
        "B's pages lost their watch when A unregistered"
    );
    assert_eq!(cookies(&b), [2]);
    assert_eq!(cookies(&a), Vec::<u64>::new());
}

#[test]
fn the_cache_and_a_notifier_share_pages() {
    let cache = Cache::with_notifier(uffd(), NoopRegistrar, Config::default());
    let n = uffd();
    let p = map_low(2 * PAGE);
    let r = n.register(p..p + PAGE, Cookie(9)).unwrap();
    let h = cache.get(p, 2 * PAGE).unwrap();
    assert!(h.is_valid());
    unmap(p, 2 * PAGE);
    assert!(
        !h.is_valid(),
        "the cache's registration not invalidated before munmap returned"
    );
    assert!(!n.is_valid(r));
    drop(h);
    assert_eq!(cookies(&n), [9]);
}

#[test]
fn fork_poisons_every_notifier_and_the_child_starts_its_own_context() {
    let (a, b) = (uffd(), uffd());
    let p = map_low(2 * PAGE);
    let ra = a.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    let rb = b.register(p + PAGE..p + 2 * PAGE, Cookie(2)).unwrap();
    let code = in_child(|| {
        if a.is_valid(ra) || b.is_valid(rb) {
            return 1;
        }
        if !matches!(a.events(), Err(Error::Forked)) || !matches!(b.events(), Err(Error::Forked)) {
            return 2;
        }
        // The child's unmaps never wait for the parent's monitor (it does not exist here).
        unmap(p, PAGE);
        // A notifier of the child's own works, on the pages the parent's watch.
        let c = uffd();
        let q = p + PAGE;
        let Ok(rc) = c.register(q..q + PAGE, Cookie(3)) else {
            return 3;
        };
        unmap(q, PAGE);
        if c.is_valid(rc) {
            return 4;
        }
        0
    });
    assert_eq!(code, 0, "child failed at step {code}");
    // The parent is unaffected.
    assert!(a.is_valid(ra) && b.is_valid(rb));
    unmap(p, 2 * PAGE);
    assert!(!a.is_valid(ra) && !b.is_valid(rb));
}
