//! Ranges that are not (all) mapped (issue 10, items 2 and 3), and the mremap pairing of hint
//! data (item 6), against the real kernel.
//!
//! * `register` refuses a hole ([`Error::Unmapped`]); `register_any` accepts it, watches the
//!   mapped parts at once and, once told through `Notifier::mapped`, memory mapped into the
//!   holes later.
//! * What nobody announces (a raw `mmap` syscall into a registered hole) is not watched: the
//!   kernel sends userfaultfd no event for a new mapping. The test asserts that documented gap.
//! * A region invalidated and re-armed (its event read) while unmapped is not deaf: mapped again
//!   (and announced), its next unmap is reported.
//! * A `REMOVE`, or any other message, between an `MREMAP_DONTUNMAP` and a later munmap of the
//!   same range ends the REMAP→UNMAP pairing: the munmap is a second invalidation (no HINT).
//!
//! Each test runs on userfaultfd and on the hooks backend (x86-64).
//!
//! The tests of this file run one at a time (`SERIAL`): they make holes and map into them with
//! `MAP_FIXED_NOREPLACE`, which another test's mapping landing in the hole would make fail. Their
//! mappings come from `common::map_low`, where the kernel puts nothing on its own: a hole made
//! in a mapping the kernel placed joins the free gap below it, and the next mapping of any other
//! thread lands in it (seen in CI: a register region read valid over its "hole").
mod common;

use std::sync::Mutex;

use common::{map_at, map_low, notifications, page, unmap};
use ummunotify::{Backend, Cookie, Error, Event, Notifier};

static SERIAL: Mutex<()> = Mutex::new(());

/// Each test runs on both backends: userfaultfd, then the libc hooks (x86-64 glibc; the hooks'
/// filter watches pages, and `mapped` fills it the same way).
fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Userfaultfd];
    if cfg!(target_arch = "x86_64") {
        v.push(Backend::Hooks);
    }
    v
}

/// Runs `test` once per backend, with a fresh notifier and the page size, one test at a time.
fn on_each_backend(test: impl Fn(Backend, &Notifier, usize)) {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for backend in backends() {
        test(backend, &notifier(backend), page());
    }
}

fn notifier(backend: Backend) -> Notifier {
    let n = Notifier::with_backend(backend).expect("notifier (CI runs as root, x86-64 glibc)");
    assert_eq!(n.backend(), backend);
    // Room for every region these tests make, now: otherwise the first registration maps the
    // slot table, and the kernel may put it in the hole the test just made (seen in CI).
    n.reserve(64).unwrap();
    n
}

/// Maps `[addr, addr + len)` again (the address must still be free) and touches it.
fn remap_hole(addr: usize, len: usize) {
    assert!(
        map_at(addr, len),
        "the hole at {addr:#x} was taken: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the mapping was just made, read-write, `len` bytes.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 1, len) };
}

fn events(n: &Notifier) -> Vec<Event> {
    n.events().unwrap()
}

/// Reads the events, asserts there is exactly one, and returns its range and hint flag.
fn one_event(n: &Notifier) -> (usize, usize, bool) {
    let ev = events(n);
    assert_eq!(ev.len(), 1, "expected exactly one event, got {ev:?}");
    (ev[0].start, ev[0].end, ev[0].hint)
}

#[test]
fn register_refuses_a_hole_and_register_any_accepts_it() {
    on_each_backend(|_, n, pg| {
        let a = map_low(3 * pg);
        unmap(a + pg, pg); // [mapped][hole][mapped]
        assert!(matches!(
            n.register(a..a + 3 * pg, Cookie(1)),
            Err(Error::Unmapped)
        ));
        assert_eq!(n.stats().regions, 0, "state unchanged on error");
        let r = n.register_any(a..a + 3 * pg, Cookie(1)).unwrap();
        assert!(n.is_valid(r));
        // The mapped parts are watched at once.
        unmap(a + 2 * pg, pg);
        assert!(!n.is_valid(r));
        assert_eq!(one_event(n), (a + 2 * pg, a + 3 * pg, true));
        // Re-armed over holes: valid (a register_any region), and the notification count is exact.
        let r = n.region(Cookie(1)).unwrap();
        assert!(n.is_valid(r));
        assert_eq!(notifications(n), 1);
        // Memory mapped into a hole, announced: watched from the announcement on, and filling the
        // hole is no invalidation.
        remap_hole(a + pg, pg);
        n.mapped(a + pg..a + 2 * pg).unwrap();
        assert!(n.is_valid(r));
        assert_eq!(notifications(n), 1);
        unmap(a + pg, pg);
        assert!(!n.is_valid(r));
        assert_eq!(one_event(n), (a + pg, a + 2 * pg, true));
        assert_eq!(notifications(n), 2);
        n.unregister(Cookie(1)).unwrap();
        unmap(a, pg);
    });
}

#[test]
fn a_wholly_unmapped_range_registers_and_watches_what_is_announced() {
    on_each_backend(|_, n, pg| {
        let a = map_low(2 * pg);
        unmap(a, 2 * pg);
        let r = n.register_any(a..a + 2 * pg, Cookie(7)).unwrap();
        assert!(n.is_valid(r));
        assert_eq!(
            n.stats().watched_bytes,
            2 * pg as u64,
            "coverage counts the range"
        );
        remap_hole(a, 2 * pg);
        n.mapped(a..a + 2 * pg).unwrap();
        assert_eq!(notifications(n), 0, "nothing was there to invalidate");
        unmap(a, 2 * pg);
        assert!(!n.is_valid(r));
        assert_eq!(notifications(n), 1);
        let ev = events(n);
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].cookie, ev[0].start, ev[0].end),
            (Cookie(7), a, a + 2 * pg)
        );
    });
}

/// The documented gap: the kernel gives userfaultfd no event for a new mapping, so memory a raw
/// `mmap` syscall puts into a registered hole, with nobody calling `mapped`, is not watched, and
/// its unmap is not seen. (The 2010 device saw it; the preload sees only libc calls.)
#[test]
fn memory_mapped_into_a_hole_unannounced_is_not_watched() {
    on_each_backend(|_, n, pg| {
        let a = map_low(pg);
        unmap(a, pg);
        let r = n.register_any(a..a + pg, Cookie(1)).unwrap();
        remap_hole(a, pg); // not announced
        unmap(a, pg);
        assert!(
            n.is_valid(r),
            "documented: an unannounced mapping is not watched"
        );
        assert_eq!(notifications(n), 0);
        assert!(events(n).is_empty());
        assert_eq!(n.stats().messages, 0, "the kernel sent nothing");
    });
}

/// Item 3: invalidated, re-armed while unmapped, mapped again: the next unmap is reported. A
/// `register` region keeps reading invalid over the hole (its token says the memory it was
/// registered for is gone) until a re-arm finds all its pages mapped.
#[test]
fn a_region_rearmed_while_unmapped_is_not_deaf() {
    on_each_backend(|_, n, pg| {
        let a = map_low(2 * pg);
        n.register(a..a + 2 * pg, Cookie(1)).unwrap();
        unmap(a, 2 * pg);
        assert_eq!(events(n).len(), 1); // re-armed while unmapped
        let r = n.region(Cookie(1)).unwrap();
        assert!(
            !n.is_valid(r),
            "a register region over a hole stays invalid"
        );
        remap_hole(a, 2 * pg);
        n.mapped(a..a + 2 * pg).unwrap();
        assert!(!n.is_valid(n.region(Cookie(1)).unwrap()));
        unmap(a + pg, pg);
        // One event (a deaf region would give none).
        assert_eq!(one_event(n), (a + pg, a + 2 * pg, true));
        assert_eq!(notifications(n), 2);
        // All mapped again at the next re-arm: valid again.
        remap_hole(a + pg, pg);
        n.mapped(a + pg..a + 2 * pg).unwrap();
        unmap(a, pg);
        remap_hole(a, pg);
        n.mapped(a..a + pg).unwrap();
        assert_eq!(events(n).len(), 1);
        let r = n.region(Cookie(1)).unwrap();
        assert!(n.is_valid(r), "re-armed with every page mapped");
        unmap(a, 2 * pg);
        assert!(!n.is_valid(r));
        assert_eq!(notifications(n), 4);
    });
}

/// Item 3 for a `register_any` region (the 2010 preload's kind): valid after the re-arm over the
/// hole, and its next invalidation reported.
#[test]
fn a_register_any_region_rearmed_while_unmapped_reports_the_next_unmap() {
    on_each_backend(|_, n, pg| {
        let a = map_low(pg);
        n.register_any(a..a + pg, Cookie(1)).unwrap();
        unmap(a, pg);
        assert_eq!(events(n).len(), 1);
        let r = n.region(Cookie(1)).unwrap();
        assert!(
            n.is_valid(r),
            "re-armed: nothing mapped there has changed since"
        );
        remap_hole(a, pg);
        n.mapped(a..a + pg).unwrap();
        unmap(a, pg);
        assert!(!n.is_valid(r));
        assert_eq!(events(n).len(), 1);
        assert_eq!(notifications(n), 2);
    });
}

fn mremap_dontunmap(from: usize, len: usize) -> usize {
    // SAFETY: moves the test's own private anonymous mapping to an address the kernel picks,
    // leaving the old range mapped (MREMAP_DONTUNMAP).
    let p = unsafe {
        libc::mremap(
            from as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP,
            std::ptr::null_mut::<libc::c_void>(), // glibc reads it (a hint) with DONTUNMAP
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    p as usize
}

fn madvise_dontneed(addr: usize, len: usize) {
    // SAFETY: drops the pages of the test's own mapping.
    assert_eq!(
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) },
        0
    );
}

/// Item 6: `MREMAP_DONTUNMAP` sends a REMAP and no UNMAP. After its event was read, a REMOVE of
/// another part and then a munmap of the moved range are two invalidations: the event must not
/// carry the REMOVE's hint alone (the munmap taken for the old mremap's tail kept it).
#[test]
fn a_munmap_after_dontunmap_and_remove_is_not_taken_for_the_remaps_tail() {
    on_each_backend(|_, n, pg| {
        let a = map_low(4 * pg);
        n.register(a..a + 4 * pg, Cookie(1)).unwrap();
        let moved = mremap_dontunmap(a, pg);
        assert_eq!(one_event(n), (a, a + pg, true));
        assert!(
            n.is_valid(n.region(Cookie(1)).unwrap()),
            "re-armed (old range still mapped)"
        );
        madvise_dontneed(a + 2 * pg, pg);
        unmap(a, pg);
        assert_eq!(
            one_event(n),
            (a, a + 4 * pg, false),
            "two invalidations: the whole region, no hint"
        );
        unmap(moved, pg);
        unmap(a + pg, 3 * pg);
    });
}

/// Item 6, the pairing it keeps: an mremap move is one invalidation of the old range (REMAP then
/// UNMAP of one call), with its hint.
#[test]
fn an_mremap_move_is_still_one_invalidation() {
    on_each_backend(|backend, n, pg| {
        let a = map_low(4 * pg);
        n.register(a..a + 4 * pg, Cookie(1)).unwrap();
        let dest = map_low(pg); // unwatched: replacing it sends nothing
                                // SAFETY: moves the first page of the test's own mapping over its own `dest`.
        let p = unsafe {
            libc::mremap(
                a as *mut libc::c_void,
                pg,
                pg,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dest as *mut libc::c_void,
            )
        };
        assert_eq!(p as usize, dest, "{}", std::io::Error::last_os_error());
        assert_eq!(one_event(n), (a, a + pg, true));
        // userfaultfd: the REMAP and the UNMAP, as the 2010 device counted; hooks: one call.
        let want = if backend == Backend::Hooks { 1 } else { 2 };
        assert_eq!(notifications(n), want);
        let p = dest;
        unmap(p, pg);
        unmap(a + pg, 3 * pg);
    });
}

/// A hole's pages are counted in the coverage without being watched: a later `register` over
/// them (mapped by then, unannounced) must watch them rather than take them for watched (issue
/// 12's registration without a watch call over pages already watched).
#[test]
fn a_register_over_an_unannounced_fill_of_a_hole_watches_it() {
    on_each_backend(|backend, n, pg| {
        let a = map_low(pg);
        unmap(a, pg);
        let _any = n.register_any(a..a + pg, Cookie(1)).unwrap();
        remap_hole(a, pg); // not announced: not watched
        let before = n.stats().watch_calls;
        let r = n.register(a..a + pg, Cookie(2)).unwrap();
        assert!(
            n.stats().watch_calls > before,
            "{backend}: the filled hole was taken for watched"
        );
        unmap(a, pg);
        assert!(!n.is_valid(r), "{backend}: the unmap went unseen");
        let ev = events(n);
        assert!(
            ev.iter().any(|e| e.cookie == Cookie(2)),
            "{backend}: no event for the registered region: {ev:?}"
        );
    });
}

/// Maps `len` bytes of a fresh memfd, shared, at `addr` (which must be free), and touches them.
fn map_shared_at(addr: usize, len: usize) {
    // SAFETY: a NUL-terminated name; the fd is closed below (the mapping keeps the file).
    let fd = unsafe { libc::memfd_create(c"umn-holes-shared".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: our fresh memfd.
    assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
    // SAFETY: maps the memfd at a free address of ours (NOREPLACE: nothing else is replaced).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
            fd,
            0,
        )
    };
    // SAFETY: closes our own fd.
    unsafe { libc::close(fd) };
    assert_eq!(p as usize, addr, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping was just made, read-write, `len` bytes.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 1, len) };
}

/// Fresh-watch windows this notifier has seen end (by confirmation or by grace).
fn windows(n: &Notifier) -> (u64, u64) {
    let s = n.stats();
    (s.fresh_windows_confirmed, s.fresh_windows_by_grace)
}

/// Shared memory announced into a hole gets the fresh-watch window a registration's watch of
/// shared memory gets (architecture/in-flight.md, "Fresh watches of shared memory": a `MADV_REMOVE` that
/// looked for a watch before this one may still punch): one window per announcement, none for
/// private memory, and the memory is watched from then on.
#[test]
fn shared_memory_announced_into_a_hole_opens_a_fresh_watch_window() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let n = notifier(Backend::Userfaultfd);
    let pg = page();
    let a = map_low(2 * pg);
    unmap(a, 2 * pg);
    let r = n.register_any(a..a + 2 * pg, Cookie(3)).unwrap();
    // Private memory: no window.
    let before = windows(&n);
    remap_hole(a, pg);
    n.mapped(a..a + pg).unwrap();
    assert_eq!(windows(&n), before, "a window for private memory");
    assert!(n.is_valid(r));
    // Shared memory: one window, ended before `mapped` returned.
    map_shared_at(a + pg, pg);
    n.mapped(a + pg..a + 2 * pg).unwrap();
    let after = windows(&n);
    assert_eq!(
        after.0 + after.1,
        before.0 + before.1 + 1,
        "no fresh-watch window for shared memory announced into a hole"
    );
    // One event covering the shared page, its range as `Event::range` gives it.
    let one_over_shared = |n: &Notifier| {
        let ev = events(n);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert!(ev[0].start <= a + pg && a + 2 * pg <= ev[0].end, "{ev:?}");
    };
    // A window still open when the wait gave up holds the region invalid, with its event;
    // one that ended (confirmed, or by its grace: the punch is taken to be done by then, as for
    // a `REMOVE`) leaves it valid.
    if !n.is_valid(r) {
        one_over_shared(&n);
    }
    // Watched: its unmap is seen.
    let r = n.region(Cookie(3)).unwrap();
    unmap(a + pg, pg);
    assert!(!n.is_valid(r));
    one_over_shared(&n);
    n.unregister(Cookie(3)).unwrap();
    unmap(a, pg);
}
