//! Guarantee 4 with the heap registered: free() and malloc_trim() that shrink a watched heap (brk,
//! madvise) from many threads, while events are pending and other threads register, unregister
//! and read events. A watchdog turns a deadlock into a failure instead of a hung CI.
mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::heap_churn_round;
use ummunotify::{Cookie, Notifier};

fn heap_range() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[heap]"))?;
    let (range, _) = line.split_once(' ')?;
    let (s, e) = range.split_once('-')?;
    Some((
        usize::from_str_radix(s, 16).ok()?,
        usize::from_str_radix(e, 16).ok()?,
    ))
}

#[test]
fn trimming_a_watched_heap_from_many_threads_never_deadlocks() {
    let done = Arc::new(AtomicBool::new(false));
    {
        let done = done.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(120) {
                if done.load(SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("DEADLOCK: heap test did not finish in 120 s");
            std::process::abort();
        });
    }
    let n = Arc::new(Notifier::new().unwrap());
    // Grow the main heap so that there is something to trim, then watch all of it.
    let grow: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 * 1024]).collect();
    drop(grow);
    let (hs, he) = heap_range().expect("a [heap] mapping");
    n.register(hs..he, Cookie(0)).unwrap();
    let region = n.region(Cookie(0)).unwrap();

    let workers: Vec<_> = (0..4)
        .map(|t| {
            let n = n.clone();
            std::thread::spawn(move || {
                for round in 0..300u64 {
                    heap_churn_round(&n, round, t == 0);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        n.stats().messages > 0,
        "the watched heap was never trimmed: test proved nothing"
    );
    assert!(
        !n.is_valid(region),
        "trims of the watched heap were not seen"
    );
    n.events().unwrap();
    n.unregister(Cookie(0)).unwrap();
    done.store(true, SeqCst);
}
