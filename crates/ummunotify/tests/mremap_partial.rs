//! A multi-VMA `mremap` move stops at a watched VMA and keeps what it moved (Linux 6.17+), and
//! that never moves registered memory silently.
//!
//! Since 6.17, `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` of a range spanning several VMAs moves
//! them one at a time; at a VMA it may not move (one a userfaultfd context watches) it fails with
//! `EFAULT` and leaves the VMAs before it moved. The torture engine once took that failure for
//! "nothing changed" and crashed on its half-moved buffer. What this test pins down: only
//! unwatched VMAs move that way, so a region on the watched part stays valid (its pages did not
//! move) and gets no event; and a watched *first* VMA makes the call fail before anything moves.
mod common;

use common::{map, page, unmap};
use ummunotify::{Cookie, Notifier};

/// Whether `addr` is mapped, from `/proc/self/maps`.
fn mapped(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| {
        let r = l.split(' ').next().unwrap();
        let (s, e) = r.split_once('-').unwrap();
        let (s, e) = (
            usize::from_str_radix(s, 16).unwrap(),
            usize::from_str_radix(e, 16).unwrap(),
        );
        s <= addr && addr < e
    })
}

/// A free, reserved-then-released destination of `len` bytes.
fn free_range(len: usize) -> usize {
    let d = map(len);
    unmap(d, len);
    d
}

fn mremap_fixed(from: usize, len: usize, to: usize) -> Result<usize, std::io::Error> {
    // SAFETY: moves the test's own mapping onto a free range it chose.
    let p = unsafe {
        libc::mremap(
            from as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as usize)
    }
}

#[test]
fn a_refused_multi_vma_move_moves_only_unwatched_vmas() {
    let pg = page();
    let n = Notifier::new().unwrap();
    // Six pages; the notifier watches pages 2..6, which splits the VMA in two.
    let a = map(6 * pg);
    let r = n.register(a + 2 * pg..a + 6 * pg, Cookie(1)).unwrap();
    let to = free_range(6 * pg);
    let res = mremap_fixed(a, 6 * pg, to);
    match res {
        Ok(p) => {
            // A kernel that moves watched VMAs along: the region must have been told.
            assert_eq!(p, to);
            assert!(
                !n.is_valid(r),
                "a move of watched pages left the region valid"
            );
            unmap(to, 6 * pg);
        }
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
            // The watched pages stayed, so the region is rightly still valid, with no event.
            assert!(mapped(a + 2 * pg) && mapped(a + 5 * pg));
            assert!(n.is_valid(r), "the watched pages did not move");
            assert!(n.events().unwrap().is_empty());
            if mapped(to) {
                // 6.17+: the unwatched first VMA moved and the failure kept the move.
                assert!(!mapped(a) && mapped(to + pg) && !mapped(to + 2 * pg));
                eprintln!("kernel kept a partial move: pages 0..2 at the destination");
                unmap(to, 2 * pg);
            } else {
                eprintln!("kernel refused the whole move");
                unmap(a, 2 * pg);
            }
        }
    }
    n.unregister(Cookie(1)).unwrap();
    unmap(a, 6 * pg);

    // A watched first VMA: refused before anything moves.
    let b = map(6 * pg);
    let r = n.register(b..b + 2 * pg, Cookie(2)).unwrap();
    let to = free_range(6 * pg);
    match mremap_fixed(b, 6 * pg, to) {
        Ok(_) => {
            assert!(
                !n.is_valid(r),
                "a move of watched pages left the region valid"
            );
            unmap(to, 6 * pg);
        }
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
            assert!(
                !mapped(to) && !mapped(to + 5 * pg),
                "nothing may have moved"
            );
            assert!(n.is_valid(r));
            unmap(b, 6 * pg);
        }
    }
    n.unregister(Cookie(2)).unwrap();
}
