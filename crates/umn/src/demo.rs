//! `umn demo`: the x == y story, told by io_uring fixed buffers.
//!
//! 1. A naive registration cache: register x, write through it, `munmap(x)`, `y = mmap()` at the
//!    same address, write y "through the cache": the file receives x's old bytes.
//! 2. The same with the ummunotify cache: the unmap is seen before `munmap` returns, the next
//!    `get` registers y, the file receives y's bytes.
//! 3. A short cache run with hit/miss statistics.
#![allow(unsafe_code)] // mmap/munmap of the demo buffers.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::{IoUringRegistrar, Registrar};
use ummunotify::Cookie;

const LEN: usize = 4096;
const SHOW: usize = 24;

fn map_at(at: usize) -> io::Result<usize> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if at != 0 {
        flags |= libc::MAP_FIXED_NOREPLACE;
    }
    // SAFETY: anonymous mapping; NOREPLACE never clobbers an existing mapping.
    let p = unsafe {
        libc::mmap(
            at as *mut _,
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || (at != 0 && p as usize != at) {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

fn unmap(addr: usize) {
    // SAFETY: a demo-owned mapping.
    unsafe { libc::munmap(addr as *mut _, LEN) };
}

/// Fills the buffer with a repeated text.
fn fill(addr: usize, text: &[u8]) {
    for i in 0..LEN {
        // SAFETY: demo-owned writable mapping of LEN bytes.
        unsafe { *((addr + i) as *mut u8) = text[i % text.len()] };
    }
}

fn memory(addr: usize) -> Vec<u8> {
    let mut v = vec![0; LEN];
    // SAFETY: demo-owned readable mapping of LEN bytes.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), LEN) };
    v
}

fn show(b: &[u8]) -> String {
    format!("\"{}...\"", String::from_utf8_lossy(&b[..SHOW]))
}

struct Scratch {
    file: File,
    path: std::path::PathBuf,
}

impl Scratch {
    fn new() -> io::Result<Scratch> {
        let path = std::env::temp_dir().join(format!("umn-demo-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(Scratch { file, path })
    }
    fn read(&self) -> io::Result<Vec<u8>> {
        let mut v = vec![0; LEN];
        self.file.read_exact_at(&mut v, 0)?;
        Ok(v)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs the demo; returns whether the ummunotify half wrote correct bytes.
pub fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let out = Scratch::new()?;
    let ring = IoUringRegistrar::new(16)?;

    println!("1. A registration cache WITHOUT notifications (io_uring fixed buffers)");
    let x = map_at(0)?;
    fill(x, b"x = old data ");
    let slot = ring.register(x..x + LEN)?;
    ring.write_fixed(&slot, x, LEN, out.file.as_fd(), 0)?;
    println!(
        "   x = mmap() = {x:#x}, registered as fixed buffer {}; file: {}",
        slot.index(),
        show(&out.read()?)
    );
    unmap(x);
    let y = map_at(x)?;
    fill(y, b"y = NEW data ");
    println!("   munmap(x); y = mmap() = {y:#x}   (y == x: {})", y == x);
    ring.write_fixed(&slot, y, LEN, out.file.as_fd(), 0)?;
    let naive = out.read()?;
    println!("   memory at y: {}", show(&memory(y)));
    println!(
        "   cache hit -> WRITE_FIXED wrote: {}  <- {}",
        show(&naive),
        if naive == memory(y) {
            "correct (hazard not reproduced)"
        } else {
            "STALE: x's old pages"
        }
    );
    ring.deregister(&slot, x..x + LEN)?;
    unmap(y);

    println!();
    println!("2. The same with the ummunotify cache");
    let cache = Cache::new(ring, Config::default())?;
    let x = map_at(0)?;
    fill(x, b"x = old data ");
    // Our own watch on the same range, only to print the event the notifier delivers.
    cache.notifier().register(x..x + LEN, Cookie(1))?;
    {
        let h = cache.get(x, LEN)?;
        cache
            .registrar()
            .write_fixed(h.key(), x, LEN, out.file.as_fd(), 0)?;
        println!(
            "   x = {x:#x}: get -> miss, registered as fixed buffer {}; file: {}",
            h.key().index(),
            show(&out.read()?)
        );
    }
    let seen = cache.notifier().generation()?;
    unmap(x);
    let moved = !cache.notifier().unchanged_since(seen);
    let y = map_at(x)?;
    fill(y, b"y = NEW data ");
    println!("   munmap(x) returned; notifier generation already moved: {moved}");
    println!("   y = mmap() = {y:#x}   (y == x: {})", y == x);
    let h = cache.get(y, LEN)?;
    for ev in cache.take_events()? {
        println!(
            "   event: cookie {} range {:#x}..{:#x} (x's cached registration: invalidated)",
            ev.cookie, ev.start, ev.end
        );
    }
    cache
        .registrar()
        .write_fixed(h.key(), y, LEN, out.file.as_fd(), 0)?;
    let ours = out.read()?;
    let ok = ours == memory(y);
    println!(
        "   get(y) -> miss: x's registration released, y registered as fixed buffer {}\n   \
         WRITE_FIXED wrote: {}  <- {}",
        h.key().index(),
        show(&ours),
        if ok { "correct" } else { "STALE (bug!)" }
    );
    drop(h);
    let _ = cache.notifier().unregister(Cookie(1));
    unmap(y);
    cache.flush();

    println!();
    println!("3. A short cache run: 4 buffers, 10,000 gets, then one buffer unmapped");
    let bufs: Vec<usize> = (0..4).map(|_| map_at(0)).collect::<io::Result<_>>()?;
    for b in &bufs {
        fill(*b, b"data ");
    }
    let before = cache.stats();
    for i in 0..10_000 {
        let b = bufs[i % bufs.len()];
        drop(cache.get(b + 128, 512)?);
    }
    let s = cache.stats();
    println!(
        "   hits {}, misses {}, regions {} (adjacent buffers merge)",
        s.hits - before.hits,
        s.misses - before.misses,
        s.regions
    );
    unmap(bufs[0]);
    let again = map_at(bufs[0]);
    if let Ok(a) = again {
        fill(a, b"new ");
        drop(cache.get(a, LEN)?);
        unmap(a);
    }
    let s2 = cache.stats();
    println!(
        "   after munmap + mmap + get: misses +{}, invalidations +{}, deregistrations +{}",
        s2.misses - s.misses,
        s2.invalidations - s.invalidations,
        s2.deregistrations - s.deregistrations
    );
    for b in &bufs[1..] {
        unmap(*b);
    }
    cache.flush();
    println!();
    println!(
        "result: {}",
        if ok {
            "ummunotify wrote the bytes memory holds now"
        } else {
            "ummunotify wrote STALE bytes"
        }
    );
    Ok(ok)
}
