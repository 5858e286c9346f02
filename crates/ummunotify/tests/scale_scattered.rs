//! Scattered regions never exhaust the VMA budget (issue 12).
//!
//! Watching exactly one page out of every two splits the mapping into alternating VMAs, and the
//! kernel refused new VMAs after 32,745 such registrations (`vm.max_map_count` 65,530). Past the
//! notifier's VMA budget a region is watched as the whole VMAs it lies in, so any number of
//! scattered regions registers. Both tests check, at checkpoints, that the process's VMA count
//! stays under the budget; that an unmap of a registered page (early, exactly watched, and late,
//! in a widened VMA) invalidates exactly its region before the call returns, with one event; that
//! an unmap of an unregistered page between them invalidates nothing; and that unregistering
//! everything gives the VMAs back.
//!
//! Release builds run the full sizes (`cargo test --release --test scale_scattered`); debug
//! builds run fewer regions, still far past the budget.
mod common;

use std::time::Instant;

use common::*;
use ummunotify::{Cookie, Notifier};

/// Both tests count the process's VMAs: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn vma_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// Pages not yet touched, in one `MAP_NORESERVE` reservation (no memory committed).
fn reserve(pages: usize) -> usize {
    map_untouched(pages * page())
}

fn scale(full: usize) -> usize {
    if cfg!(debug_assertions) {
        full / 10
    } else {
        full
    }
}

/// Unmaps one page and checks that exactly `expect` (a cookie) reported, before munmap returned.
fn unmap_checked(n: &Notifier, addr: usize, expect: Option<u64>) {
    let region = expect.map(|c| n.region(Cookie(c)).unwrap());
    let seen = n.generation().unwrap();
    unmap(addr, page());
    if let Some(r) = region {
        assert!(
            !n.is_valid(r),
            "region {expect:?} valid after munmap returned"
        );
        assert!(!n.unchanged_since(seen));
    }
    let ev = n.events().unwrap();
    let cookies: Vec<u64> = ev.iter().map(|e| e.cookie.0).collect();
    assert_eq!(cookies, expect.into_iter().collect::<Vec<_>>(), "{addr:#x}");
    // Map it again so the rest of the test sees the same layout (a new VMA: fine).
    assert!(map_at(addr, page()));
}

#[test]
fn every_other_page_of_one_mapping() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n_regions = scale(1_000_000);
    let pg = page();
    let baseline = vma_count();
    let n = Notifier::new().unwrap();
    let base = reserve(2 * n_regions);
    let budget = n.stats().vma_budget;
    let t = Instant::now();
    for i in 0..n_regions {
        let a = base + 2 * i * pg;
        n.register(a..a + pg, Cookie(i as u64))
            .unwrap_or_else(|e| panic!("region {i}: {e} ({:?}, {} VMAs)", n.stats(), vma_count()));
        if i % (n_regions / 10) == 0 {
            let now = vma_count();
            assert!(now <= budget, "{now} VMAs > budget {budget} at region {i}");
        }
    }
    let took = t.elapsed();
    let st = n.stats();
    let now = vma_count();
    eprintln!(
        "{n_regions} regions on every other page registered in {took:?} ({:.2} µs each); \
         {} widened; {now} VMAs (budget {budget}, baseline {baseline}); watched {} MiB; {st:?}",
        took.as_secs_f64() * 1e6 / n_regions as f64,
        st.wide_regions,
        st.watched_bytes >> 20
    );
    assert!(now <= budget, "{now} VMAs > budget {budget}");
    assert_eq!(st.regions, n_regions);
    assert!(st.wide_regions > 0, "the budget was never reached: {st:?}");
    // An exactly watched region, a widened one, and the unregistered pages next to them.
    for i in [1, n_regions - 2] {
        let a = base + 2 * i * pg;
        unmap_checked(&n, a, Some(i as u64));
        unmap_checked(&n, a + pg, None);
    }
    for i in 0..n_regions {
        n.unregister(Cookie(i as u64)).unwrap();
    }
    let st = n.stats();
    assert_eq!(
        (st.regions, st.coverage_segments, st.wide_regions),
        (0, 0, 0)
    );
    unmap(base, 2 * n_regions * pg);
    // The notifier's own storage for a million regions (slot segments, cookie table, queue) is
    // mapped while it lives: what must come back is everything else, watch splits included.
    drop(n);
    let after = vma_count();
    assert!(
        after <= baseline + 16,
        "VMAs not given back: {baseline} before, {after} after"
    );
}

#[test]
fn spread_over_many_mappings() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Full size in release; in debug all the mappings but fewer regions each (still past the
    // budget: 10,000 VMAs to start with, plus two per exact watch).
    let mappings = 10_000;
    let per = if cfg!(debug_assertions) { 3 } else { 10 };
    let pg = page();
    let baseline = vma_count();
    let n = Notifier::new().unwrap();
    // Separate VMAs: 32-page blocks of one reservation with their last 12 pages unmapped.
    let base = reserve(32 * mappings);
    for m in 0..mappings {
        unmap(base + (32 * m + 20) * pg, 12 * pg);
    }
    let budget = n.stats().vma_budget;
    let t = Instant::now();
    for m in 0..mappings {
        for k in 0..per {
            let a = base + (32 * m + 2 * k) * pg;
            let c = (m * per + k) as u64;
            n.register(a..a + pg, Cookie(c))
                .unwrap_or_else(|e| panic!("region {c}: {e} ({:?})", n.stats()));
        }
        if m % (mappings / 10) == 0 {
            let now = vma_count();
            assert!(now <= budget, "{now} VMAs > budget {budget} at mapping {m}");
        }
    }
    let took = t.elapsed();
    let st = n.stats();
    let total = mappings * per;
    eprintln!(
        "{total} regions over {mappings} mappings registered in {took:?}; {} widened; {} VMAs \
         (budget {budget}, baseline {baseline}); {st:?}",
        st.wide_regions,
        vma_count()
    );
    assert!(vma_count() <= budget);
    assert!(st.wide_regions > 0, "the budget was never reached: {st:?}");
    // The first mapping's regions are watched exactly, the last mapping's widened.
    for m in [0, mappings - 1] {
        let a = base + 32 * m * pg;
        unmap_checked(&n, a + 2 * pg, Some((m * per + 1) as u64));
        unmap_checked(&n, a + 3 * pg, None);
    }
    for c in 0..total {
        n.unregister(Cookie(c as u64)).unwrap();
    }
    assert_eq!(n.stats().coverage_segments, 0);
    for m in 0..mappings {
        unmap(base + 32 * m * pg, 20 * pg);
    }
    drop(n); // its own storage, as above
    let after = vma_count();
    assert!(
        after <= baseline + 16,
        "VMAs not given back: {baseline} before, {after} after"
    );
}
