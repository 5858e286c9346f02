//! A notifier is ready when `new()` returns: its monitor thread runs and has made every mapping
//! it will ever make (its stack, TLS, and the alternate signal stack Rust's runtime maps when a
//! thread *starts running*). A monitor still starting after `new()` returned would map its signal
//! stack into the freshest hole, often the one the caller's first munmap just left, and the
//! caller's next `mmap` at that address would fail (seen: `umn coverage` reporting plain munmap
//! as "not detected" on machines with AMX, whose signal stacks are four pages).
//!
//! Each round, on a fresh thread with a fresh notifier: a registration, the address space, then
//! an invalidation, its event, and the address space again. The
//! only change allowed is the range the round unmapped (and heap growth, which is `brk` or
//! `mprotect` inside an arena's reservation: neither adds address space outside `[heap]` or the
//! arena). Then the unmapped hole is mapped again at the same address, which must work.
mod common;

use std::io::Read;
use std::ops::Range;

use common::{map, page, unmap};
use ummunotify::{Cookie, Notifier};

/// The process's address space as merged spans, without `[heap]` (grown by `brk` from any
/// thread's `malloc`). Reads into `buf`, whose capacity is reserved up front so the read itself
/// does not map memory.
fn address_space(buf: &mut Vec<u8>) -> Vec<Range<usize>> {
    buf.clear();
    let mut f = std::fs::File::open("/proc/self/maps").expect("open /proc/self/maps");
    f.read_to_end(buf).expect("read /proc/self/maps");
    assert!(buf.len() < buf.capacity(), "maps buffer too small");
    let text = std::str::from_utf8(buf).expect("maps is text");
    let mut spans: Vec<Range<usize>> = Vec::new();
    for line in text.lines() {
        if line.ends_with("[heap]") {
            continue;
        }
        let range = line.split(' ').next().unwrap_or_default();
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let s = usize::from_str_radix(s, 16).expect("start");
        let e = usize::from_str_radix(e, 16).expect("end");
        match spans.last_mut() {
            Some(last) if last.end == s => last.end = e,
            _ => spans.push(s..e),
        }
    }
    spans
}

/// Spans of `after` that `before` does not cover.
fn added(before: &[Range<usize>], after: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for a in after {
        let mut cur = a.start;
        for b in before.iter().filter(|b| b.end > a.start && b.start < a.end) {
            if b.start > cur {
                out.push(cur..b.start);
            }
            cur = cur.max(b.end);
        }
        if cur < a.end {
            out.push(cur..a.end);
        }
    }
    out
}

fn round(i: usize) {
    let pg = page();
    let mut before_buf = Vec::with_capacity(1 << 20);
    let mut after_buf = Vec::with_capacity(1 << 20);
    let x = map(4 * pg);
    let n = Notifier::new().expect("Notifier::new");
    // Registering allocates the notifier's first slot segment (big enough for malloc to mmap it)
    // on this thread: that is the caller's own allocation, so it happens before the snapshot.
    let region = n
        .register(x..x + 4 * pg, Cookie(i as u64))
        .expect("register");
    let before = address_space(&mut before_buf);
    unmap(x, 4 * pg);
    assert!(!n.is_valid(region), "round {i}: valid after munmap");
    let events = n.events().expect("events");
    assert_eq!(events.len(), 1, "round {i}: {events:?}");
    let after = address_space(&mut after_buf);
    let new_spans = added(&before, &after);
    assert!(
        new_spans.is_empty(),
        "round {i}: memory was mapped after Notifier::new returned: {new_spans:#x?}\n\
         maps now:\n{}",
        String::from_utf8_lossy(&after_buf)
    );
    assert!(
        common::map_at(x, 4 * pg),
        "round {i}: the hole left by munmap was taken:\n{}",
        String::from_utf8_lossy(&after_buf)
    );
    unmap(x, 4 * pg);
    n.unregister(Cookie(i as u64)).expect("unregister");
}

#[test]
fn nothing_is_mapped_after_new_returns() {
    for i in 0..50 {
        std::thread::spawn(move || round(i)).join().expect("round");
    }
}
