//! End to end through a real device registration: the cache's io_uring registrar writes the
//! registered buffer to a file with `WRITE_FIXED`, the test reads the file back and compares it
//! with what memory holds *now*, after each kind of mapping change.
//!
//! A naive cache (same registrar, never invalidates) must write stale bytes after every change;
//! the ummunotify cache never. One `#[test]` per binary: the cases unmap and map again at the
//! same address, which a concurrently running test could take in between.
mod cache_common;
mod common;

use cache_common::*;
use ummunotify::cache::{Cache, Config};
use ummunotify_testkit::uring::UringMadvise;

/// The changes exercised (names as in the testkit's catalogue).
#[derive(Clone, Copy, Debug)]
enum Change {
    LibcMunmap,
    SyscallMunmap,
    MmapFixedOver,
    MremapMove,
    MremapShrink,
    MadvDontneed,
    ProcessMadvise,
    UringMadvise,
    MadvRemoveShmem,
    FreeMallocBlock,
    PartialOverlap,
}

const ALL: &[Change] = &[
    Change::LibcMunmap,
    Change::SyscallMunmap,
    Change::MmapFixedOver,
    Change::MremapMove,
    Change::MremapShrink,
    Change::MadvDontneed,
    Change::ProcessMadvise,
    Change::UringMadvise,
    Change::MadvRemoveShmem,
    Change::FreeMallocBlock,
    Change::PartialOverlap,
];

/// Memory for one case: the range written through the device, and how to change it.
struct Case {
    change: Change,
    range: std::ops::Range<usize>,
    malloc_block: Option<*mut libc::c_void>,
    memfd: Option<std::fs::File>,
    mapping: std::ops::Range<usize>,
}

const MALLOC_BLOCK: usize = 40 << 20;

impl Case {
    fn setup(change: Change) -> Case {
        let pg = page();
        let mut memfd = None;
        let mut malloc_block = None;
        let (mapping, range) = match change {
            Change::MremapShrink | Change::PartialOverlap => {
                let a = map(8 * pg);
                (a..a + 8 * pg, a..a + 8 * pg)
            }
            Change::MadvRemoveShmem => {
                let f = memfd_file(4 * pg);
                let a = map_shared(&f, 4 * pg);
                memfd = Some(f);
                (a..a + 4 * pg, a..a + 4 * pg)
            }
            Change::FreeMallocBlock => {
                // SAFETY: plain malloc; freed exactly once (by the change or at cleanup).
                let p = unsafe { libc::malloc(MALLOC_BLOCK) };
                assert!(!p.is_null());
                malloc_block = Some(p);
                let a = (p as usize + pg) & !(pg - 1);
                (a..a + 4 * pg, a..a + 4 * pg)
            }
            _ => {
                let a = map(4 * pg);
                (a..a + 4 * pg, a..a + 4 * pg)
            }
        };
        fill(&range, OLD);
        Case {
            change,
            range,
            malloc_block,
            memfd,
            mapping,
        }
    }

    /// Applies the change, then puts new memory with new bytes at the old addresses (x == y).
    fn apply_and_refill(&mut self) {
        let pg = page();
        let (a, len) = (self.range.start, self.range.len());
        match self.change {
            Change::LibcMunmap => {
                unmap(a, len);
                map_at(a, len);
            }
            Change::SyscallMunmap => {
                // SAFETY: test-owned mapping.
                assert_eq!(unsafe { libc::syscall(libc::SYS_munmap, a, len) }, 0);
                map_at(a, len);
            }
            Change::MmapFixedOver => replace(a, len),
            Change::MremapMove => {
                let dest = map(len);
                // SAFETY: moves a test-owned mapping onto a test-owned destination.
                let p = unsafe {
                    libc::mremap(
                        a as *mut _,
                        len,
                        len,
                        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                        dest as *mut libc::c_void,
                    )
                };
                assert_eq!(p as usize, dest);
                unmap(dest, len);
                map_at(a, len);
            }
            Change::MremapShrink => {
                // SAFETY: shrinks a test-owned mapping in place.
                let p = unsafe { libc::mremap(a as *mut _, len, 4 * pg, 0) };
                assert_eq!(p as usize, a);
                map_at(a + 4 * pg, 4 * pg);
            }
            Change::MadvDontneed => madvise(a, len, libc::MADV_DONTNEED),
            Change::ProcessMadvise => {
                // SAFETY: pidfd_open of our own pid.
                let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
                assert!(pidfd >= 0);
                let iov = libc::iovec {
                    iov_base: a as *mut _,
                    iov_len: len,
                };
                // SAFETY: one valid iovec over test-owned memory.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        pidfd,
                        &iov,
                        1,
                        libc::MADV_DONTNEED,
                        0,
                    )
                };
                assert_eq!(r as usize, len);
                // SAFETY: closing the pidfd we opened.
                unsafe { libc::close(pidfd as i32) };
            }
            Change::UringMadvise => UringMadvise::new()
                .unwrap()
                .madvise(a, len, libc::MADV_DONTNEED)
                .unwrap(),
            Change::MadvRemoveShmem => madvise(a, len, libc::MADV_REMOVE),
            Change::FreeMallocBlock => {
                let p = self.malloc_block.take().unwrap();
                // SAFETY: the block came from malloc and is freed once.
                unsafe { libc::free(p) };
                // glibc unmapped the whole block; map new memory at the watched pages.
                map_at(a, len);
                self.mapping = a..a + len;
            }
            Change::PartialOverlap => {
                unmap(a + 3 * pg, 2 * pg);
                map_at(a + 3 * pg, 2 * pg);
            }
        }
        fill(&self.range, NEW);
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        if let Some(p) = self.malloc_block.take() {
            // SAFETY: not freed by the change.
            unsafe { libc::free(p) };
        } else {
            unmap(self.mapping.start, self.mapping.len());
        }
        self.memfd = None;
    }
}

/// Runs one change against `cache`; returns (what reached the file, what memory holds now).
fn run(change: Change, cache: &mut dyn DeviceCache, out: &Out) -> (Vec<u8>, Vec<u8>) {
    let mut case = Case::setup(change);
    let (a, len) = (case.range.start, case.range.len());
    cache.write(a, len, out, 0).unwrap();
    cache.write(a, len, out, 0).unwrap(); // a hit
    assert_eq!(
        out.read(0, len),
        read(&case.range),
        "{change:?}: first write wrong"
    );
    case.apply_and_refill();
    cache.write(a, len, out, len as u64).unwrap();
    let device = out.read(len as u64, len);
    let now = read(&case.range);
    cache.forget();
    (device, now)
}

#[test]
fn cache_never_writes_stale_bytes_naive_cache_does() {
    let Some(registrar) = uring_registrar("cache_e2e") else {
        return;
    };
    let out = Out::new();
    let mut naive = NaiveCache::new(&registrar);
    for &change in ALL {
        let (device, now) = run(change, &mut naive, &out);
        let stale = device != now;
        eprintln!(
            "naive  {change:?}: stale bytes written: {stale} (first byte {:?}, memory {:?})",
            device[0] as char, now[0] as char
        );
        assert!(stale, "{change:?}: the hazard did not reproduce");
    }
    drop(naive);

    let cache = Cache::new(registrar, Config::default()).unwrap();
    let mut real = RealCache(&cache);
    for &change in ALL {
        let (device, now) = run(change, &mut real, &out);
        eprintln!("cache  {change:?}: stale bytes written: {}", device != now);
        assert!(device == now, "{change:?}: the cache wrote stale bytes");
    }
    let s = cache.stats();
    eprintln!("{s:?}");
    assert!(s.invalidations as usize >= ALL.len(), "{s:?}");
    assert!(s.hits as usize >= ALL.len(), "{s:?}");

    // A handle held across a change keeps its (old) registration until it drops.
    let case = Case::setup(Change::MadvDontneed);
    let (a, len) = (case.range.start, case.range.len());
    let held = cache.get(a, len).unwrap();
    madvise(a, len, libc::MADV_DONTNEED);
    fill(&case.range, NEW);
    assert!(!held.is_valid());
    cache
        .registrar()
        .write_fixed(held.key(), a, len, out.fd(), 0)
        .unwrap();
    assert_eq!(
        out.read(0, len),
        vec![OLD; len],
        "held registration changed"
    );
    {
        let fresh = cache.get(a, len).unwrap();
        assert_ne!(fresh.key().index(), held.key().index());
        cache
            .registrar()
            .write_fixed(fresh.key(), a, len, out.fd(), 0)
            .unwrap();
        assert_eq!(out.read(0, len), read(&case.range));
    }
    let before = cache.stats().deregistrations;
    drop(held);
    cache.flush();
    assert_eq!(cache.stats().deregistrations, before + 1);
    assert_eq!(cache.stats().retired, 0);
}
