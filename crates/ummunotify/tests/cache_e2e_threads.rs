//! End to end across threads: workers write their buffers through the cache's io_uring
//! registrations while another thread replaces those buffers' memory. After each replacement
//! (which returned before the worker continues) the worker's next write must carry the new bytes;
//! with a naive cache it carries the old ones.
mod cache_common;
mod common;

use std::sync::mpsc;
use std::sync::Mutex;

use cache_common::*;
use ummunotify::cache::{Cache, Config};

const WORKERS: usize = 3;
const ROUNDS: usize = 200;
const CHANGE_EVERY: usize = 10;

/// Runs the workers against `write`; returns how many writes carried bytes different from memory.
fn stress(write: &(dyn Fn(usize, usize, &Out, u64) + Sync), out: &Out) -> usize {
    let pg = page();
    let len = 4 * pg;
    let bufs: Vec<usize> = (0..WORKERS).map(|_| map(len)).collect();
    let (tx, rx) = mpsc::channel::<(usize, mpsc::Sender<()>)>();
    let stale = Mutex::new(0usize);
    std::thread::scope(|s| {
        // The changer: replaces a buffer's memory (MAP_FIXED over it, or MADV_DONTNEED).
        s.spawn(move || {
            let mut n = 0;
            while let Ok((addr, done)) = rx.recv() {
                if n % 2 == 0 {
                    replace(addr, len);
                } else {
                    madvise(addr, len, libc::MADV_DONTNEED);
                }
                n += 1;
                done.send(()).unwrap();
            }
        });
        for (w, &buf) in bufs.iter().enumerate() {
            let (tx, stale) = (tx.clone(), &stale);
            s.spawn(move || {
                let range = buf..buf + len;
                let off = (w * len) as u64;
                for round in 0..ROUNDS {
                    if round % CHANGE_EVERY == CHANGE_EVERY - 1 {
                        let (dtx, drx) = mpsc::channel();
                        tx.send((buf, dtx)).unwrap();
                        drx.recv().unwrap(); // the change returned in the other thread
                    }
                    fill(&range, b'a' + (round % 26) as u8);
                    write(buf, len, out, off);
                    if out.read(off, len) != read(&range) {
                        *stale.lock().unwrap() += 1;
                    }
                }
            });
        }
        drop(tx);
    });
    for b in bufs {
        unmap(b, len);
    }
    stale.into_inner().unwrap()
}

#[test]
fn threads_never_write_stale_bytes_through_the_cache() {
    let Some(registrar) = uring_registrar("cache_e2e_threads") else {
        return;
    };
    let out = Out::new();
    let naive = Mutex::new(NaiveCache::new(&registrar));
    let naive_stale = stress(
        &|a, l, out, off| naive.lock().unwrap().write(a, l, out, off).unwrap(),
        &out,
    );
    drop(naive);
    eprintln!("naive cache: {naive_stale} stale writes");
    assert!(naive_stale > 0, "the hazard did not reproduce");

    let cache = Cache::new(registrar, Config::default()).unwrap();
    let stale = stress(
        &|a, l, out, off| {
            let h = cache.get(a, l).unwrap();
            cache
                .registrar()
                .write_fixed(h.key(), a, l, out.fd(), off)
                .unwrap();
        },
        &out,
    );
    let s = cache.stats();
    eprintln!("ummunotify cache: {stale} stale writes, {s:?}");
    assert_eq!(stale, 0);
    assert!(s.hits > 0 && s.invalidations > 0);
}
