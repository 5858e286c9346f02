//! One million regions (the 2010 patch walked a list; one uffd registration per region would hit
//! vm.max_map_count at ~32,745 here). Coverage is coalesced and refcounted; the index is a tree.
mod common;

use common::*;
use ummunotify::{Cookie, Event, Notifier};

#[test]
fn one_million_regions() {
    const N: usize = 1_000_000;
    let n = Notifier::new().unwrap();
    // 4 GiB of untouched address space: one page per region, plus overlapping larger regions.
    // SAFETY: a fresh, never-touched anonymous mapping (no memory is committed).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            N * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    } as usize;
    assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
    let start = std::time::Instant::now();
    for i in 0..N {
        n.register(base + i * PAGE..base + (i + 1) * PAGE, Cookie(i as u64))
            .unwrap();
    }
    // 1,000 regions of 1 MiB overlapping the small ones.
    for j in 0..1000 {
        let s = base + j * 256 * PAGE;
        n.register(s..s + 256 * PAGE, Cookie((N + j) as u64))
            .unwrap();
    }
    let stats = n.stats();
    assert_eq!(stats.regions, N + 1000);
    assert!(
        stats.coverage_segments <= 2,
        "coverage not coalesced: {stats:?}"
    );
    eprintln!("registered {} regions in {:?}", N + 1000, start.elapsed());

    // Invalidate 10 pages in the middle: exactly the overlapping regions report.
    let mid = 1000 * 128 + 250; // inside the 1 MiB regions, across two of them
    madvise(base + mid * PAGE, 10 * PAGE, libc::MADV_DONTNEED);
    let ev = n.events().unwrap();
    let mut cookies: Vec<u64> = ev.iter().map(|e| e.cookie.0).collect();
    cookies.sort();
    let mut expect: Vec<u64> = (mid as u64..mid as u64 + 10).collect();
    for j in 0..1000 {
        if j * 256 < mid + 10 && mid < j * 256 + 256 {
            expect.push((N + j) as u64);
        }
    }
    expect.sort();
    assert_eq!(cookies, expect);

    // Unregistering half the small regions must keep the others watched.
    for i in (0..N).step_by(2) {
        n.unregister(Cookie(i as u64)).unwrap();
    }
    // Unmap everything: every remaining region gets exactly one event; memory stays bounded
    // (pending <= regions).
    let t = std::time::Instant::now();
    // SAFETY: our own mapping.
    unsafe { libc::munmap(base as *mut libc::c_void, N * PAGE) };
    eprintln!(
        "munmap of 4 GiB with {} regions: {:?}",
        n.stats().regions,
        t.elapsed()
    );
    let remaining = N / 2 + 1000;
    assert_eq!(n.stats().pending, remaining);
    let mut seen = vec![false; N + 1000];
    let mut buf = vec![Event::default(); 4096];
    let mut total = 0;
    loop {
        let r = n.read_events(&mut buf).unwrap();
        for e in &buf[..r.count] {
            let c = e.cookie.0 as usize;
            assert!(!seen[c], "cookie {c} reported twice");
            assert!(c >= N || c % 2 == 1, "unregistered cookie {c} reported");
            seen[c] = true;
        }
        total += r.count;
        if r.drained.is_some() {
            break;
        }
    }
    assert_eq!(total, remaining, "every remaining region exactly once");
}
