//! Guarantee 3: memory that is not registered pays nothing. The kernel marks every VMA it watches
//! for us with `uw` in /proc/self/smaps; after unregistering, after a failed registration, and
//! after a watch moved with an mremap, no unregistered page may carry it.
mod common;

use common::*;
use ummunotify::{Cookie, Notifier};

/// The watched (`uw`) VMAs intersecting `[start, end)`, as `(start, end)`.
fn watched(start: usize, end: usize) -> Vec<(usize, usize)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((s, e)) = current {
                if s < end && start < e && flags.split_whitespace().any(|f| f == "uw") {
                    out.push((s, e));
                }
            }
        } else if let Some((range, _)) = line.split_once(' ') {
            if let Some((s, e)) = range.split_once('-') {
                if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16))
                {
                    current = Some((s, e));
                }
            }
        }
    }
    out
}

#[test]
fn registered_pages_are_watched_and_nothing_else() {
    let n = Notifier::new().unwrap();
    let p = map(8 * PAGE);
    n.register(p + 2 * PAGE + 10..p + 4 * PAGE - 10, Cookie(1))
        .unwrap();
    assert_eq!(watched(p, p + 8 * PAGE), vec![(p + 2 * PAGE, p + 4 * PAGE)]);
    n.register(p + 3 * PAGE..p + 5 * PAGE, Cookie(2)).unwrap();
    assert_eq!(watched(p, p + 8 * PAGE), vec![(p + 2 * PAGE, p + 5 * PAGE)]);
    n.unregister(Cookie(1)).unwrap();
    assert_eq!(watched(p, p + 8 * PAGE), vec![(p + 3 * PAGE, p + 5 * PAGE)]);
    n.unregister(Cookie(2)).unwrap();
    assert!(
        watched(p, p + 8 * PAGE).is_empty(),
        "unregistered pages still watched"
    );
    unmap(p, 8 * PAGE);
}

#[test]
fn a_refused_registration_leaves_no_watch() {
    let n = Notifier::new().unwrap();
    let p = fixed_area(8);
    assert!(map_at(p, 2 * PAGE));
    // The range runs into a hole: refused, and the mapped part must not stay watched.
    assert!(n.register(p..p + 4 * PAGE, Cookie(1)).is_err());
    assert!(watched(p, p + 4 * PAGE).is_empty());
    unmap(p, 2 * PAGE);
}

#[test]
fn a_watch_that_moved_with_mremap_is_dropped_by_the_next_call() {
    let n = Notifier::new().unwrap();
    let p = fixed_area(9);
    assert!(map_at(p, 2 * PAGE));
    n.register(p..p + 2 * PAGE, Cookie(1)).unwrap();
    // Move the pages elsewhere: the kernel moves the watch with them.
    let dst = fixed_area(10);
    // SAFETY: moves our own mapping to our own reserved low address.
    let moved = unsafe {
        libc::mremap(
            p as *mut libc::c_void,
            2 * PAGE,
            2 * PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst as *mut libc::c_void,
        )
    };
    assert_eq!(moved as usize, dst);
    assert_eq!(n.events().unwrap().len(), 1);
    // The next call (read_events above already is one) cleaned the moved watch up.
    assert!(
        watched(dst, dst + 2 * PAGE).is_empty(),
        "moved watch still costs the new address"
    );
    n.unregister(Cookie(1)).unwrap();
    unmap(dst, 2 * PAGE);
}
