//! Resource exhaustion: registering past `vm.max_map_count` alternating pages (the watch policy
//! widens watches instead of failing), `RLIMIT_MEMLOCK` too low for a registrar, a full io_uring
//! fixed-buffer table. Each must succeed or give a clear typed error, leak nothing (regions,
//! watches, pinned pages, table slots), and leave the notifier and the cache correct.
//!
//! The first two run in a child process (they exhaust the process's mappings, or drop a
//! capability and lower an rlimit).
mod common;
mod torture_kit;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use torture_kit::*;
use ummunotify::cache::{self, Cache, Config};
use ummunotify::registrar::{FixedBuf, IoUringRegistrar, MlockRegistrar, Registrar};
use ummunotify::{Cookie, Notifier};
use ummunotify_testkit::require::skip_or_fail;

fn memfd(name: &str) -> File {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name; the fd is owned by the File at once.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a fresh fd nobody else owns.
    unsafe { File::from_raw_fd(fd) }
}

fn in_child(test: &str, role: &str) {
    let out = run_child(test, role, Duration::from_secs(240));
    eprintln!("{}", out.stderr);
    assert!(
        out.success && out.stdout.contains("CHILD-OK"),
        "child {role} failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// Writes `[addr, addr + len)` through the cache's registration to `f` and reads it back.
fn through_device<R: Uring>(c: &Cache<R>, f: &File, addr: usize, len: usize) -> Vec<u8> {
    let h = c.get(addr, len).unwrap();
    assert!(h.is_valid());
    let n = c
        .registrar()
        .uring()
        .write_fixed(h.key(), addr, len, f.as_fd(), 0)
        .unwrap();
    assert_eq!(n, len);
    let mut out = vec![0u8; len];
    f.read_exact_at(&mut out, 0).unwrap();
    out
}

/// A registrar that is (or wraps) the io_uring one.
trait Uring: Registrar<Key = FixedBuf> {
    fn uring(&self) -> &IoUringRegistrar;
}

impl Uring for IoUringRegistrar {
    fn uring(&self) -> &IoUringRegistrar {
        self
    }
}

impl Uring for Counting {
    fn uring(&self) -> &IoUringRegistrar {
        &self.0
    }
}

// ---------------------------------------------------------------------------------------------
// vm.max_map_count

fn max_map_count_child() {
    let pg = page();
    let limit: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let n = Notifier::new().unwrap();
    let baseline = map_count();
    let maps_before = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert_eq!(watched_vmas(), 0);
    // More alternating single pages than vm.max_map_count: watched exactly, each would split
    // the mapping (the kernel refused the 32,745th here before the watch policy); past the
    // notifier's VMA budget they are watched as whole VMAs instead, and all of them register.
    let regions = limit + 32;
    let pages = 2 * regions;
    let base = map(pages * pg);
    for i in 0..regions {
        let a = base + 2 * i * pg;
        if let Err(e) = n.register(a..a + pg, Cookie(i as u64)) {
            panic!(
                "registration {i} of {regions}: {e} ({:?}, {} maps)",
                n.stats(),
                map_count()
            );
        }
    }
    let st = n.stats();
    eprintln!(
        "max_map_count {limit}: {regions} alternating registrations, {} widened, {} maps \
         (budget {}): {st:?}",
        st.wide_regions,
        map_count(),
        st.vma_budget
    );
    assert_eq!(st.regions, regions);
    assert!(
        st.wide_regions > 0 && map_count() <= st.vma_budget,
        "{st:?}"
    );
    // Still correct: unmapping a watched page invalidates its region, one event.
    let r0 = n.region(Cookie(0)).unwrap();
    let seen = n.generation().unwrap();
    unmap(base, pg);
    assert!(!n.is_valid(r0));
    assert!(!n.unchanged_since(seen));
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].cookie, Cookie(0));
    // Give everything back: the mapping count returns to where it was.
    for i in 0..regions {
        n.unregister(Cookie(i as u64)).unwrap();
    }
    let st = n.stats();
    assert_eq!((st.regions, st.coverage_segments, st.pending), (0, 0, 0));
    unmap(base + pg, (pages - 1) * pg);
    assert_eq!(watched_vmas(), 0, "watches left behind");
    // New mappings may only be the allocator's (arenas, the notifier's slot segments).
    let maps_after = std::fs::read_to_string("/proc/self/maps").unwrap();
    for l in maps_after.lines().filter(|l| !maps_before.contains(l)) {
        eprintln!("new mapping (allocator): {l}");
    }
    assert!(
        map_count() <= baseline + 16,
        "mappings leaked: {} before, {} after",
        baseline,
        map_count()
    );
    // And the notifier works as new.
    let a = map(4 * pg);
    let r = n.register(a..a + 4 * pg, Cookie(u64::MAX)).unwrap();
    assert!(n.is_valid(r));
    unmap(a + pg, pg);
    assert!(!n.is_valid(r));
    assert_eq!(n.events().unwrap().len(), 1);
    println!("CHILD-OK");
}

#[test]
fn registering_past_max_map_count_widens_watches_and_leaks_nothing() {
    const NAME: &str = "registering_past_max_map_count_widens_watches_and_leaks_nothing";
    match child_role().as_deref() {
        Some("max_map_count") => max_map_count_child(),
        Some(_) => {}
        None => in_child(NAME, "max_map_count"),
    }
}

// ---------------------------------------------------------------------------------------------
// RLIMIT_MEMLOCK

const CAP_IPC_LOCK: u32 = 14;

/// Drops CAP_IPC_LOCK from this process (root ignores RLIMIT_MEMLOCK with it) and lowers
/// RLIMIT_MEMLOCK to `bytes`.
fn limit_memlock(bytes: u64) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget with a v3 header and room for two data words.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) };
    assert_eq!(r, 0, "capget: {}", io::Error::last_os_error());
    d[0].effective &= !(1 << CAP_IPC_LOCK);
    d[0].permitted &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset with the header and data read above, minus one capability.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) };
    assert_eq!(r, 0, "capset: {}", io::Error::last_os_error());
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit with a valid rlimit.
    let r = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    assert_eq!(r, 0, "setrlimit: {}", io::Error::last_os_error());
}

fn memlock_child() {
    let pg = page();
    let limit = 64 * 1024;
    limit_memlock(limit as u64);

    // io_uring: the table is fine, pinning more than the limit is not.
    let reg = match IoUringRegistrar::new(8) {
        Ok(r) => r,
        Err(e) => {
            skip_or_fail("memlock/io_uring", &format!("io_uring ({e})"));
            println!("CHILD-OK");
            return;
        }
    };
    let c = Cache::new(reg, Config::default()).unwrap();
    let big = map(1 << 20);
    fill(big, 1 << 20, 1);
    match c.get(big, 1 << 20) {
        Err(cache::Error::Register(e)) => {
            eprintln!("io_uring over RLIMIT_MEMLOCK: {e}");
            assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
        }
        Err(e) => panic!("expected a registrar error, got {e:?}"),
        Ok(_) => panic!("registered 1 MiB with RLIMIT_MEMLOCK = 64 KiB and no CAP_IPC_LOCK"),
    }
    c.flush();
    let st = c.stats();
    assert_eq!((st.regions, st.retired, st.bytes_registered), (0, 0, 0));
    assert_eq!(c.notifier().stats().regions, 0, "notifier region leaked");
    assert_eq!(status_kib("VmPin"), 0, "pages left pinned");
    // Under the limit it works, and stays correct when the memory changes.
    let f = memfd("memlock");
    let small = map(2 * pg);
    fill(small, 2 * pg, b'x');
    assert_eq!(through_device(&c, &f, small, 2 * pg), vec![b'x'; 2 * pg]);
    map_fixed(small, 2 * pg); // new pages at the same address
    fill(small, 2 * pg, b'y');
    assert_eq!(through_device(&c, &f, small, 2 * pg), vec![b'y'; 2 * pg]);
    assert_eq!(c.stats().deregister_errors, 0);
    drop(c);

    // mlock: the same refusal through the mlock registrar.
    let c = Cache::new(MlockRegistrar, Config::default()).unwrap();
    match c.get(big, 1 << 20) {
        Err(cache::Error::Register(e)) => {
            eprintln!("mlock over RLIMIT_MEMLOCK: {e}");
            assert!(
                matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EAGAIN)),
                "{e}"
            );
        }
        Err(e) => panic!("expected a registrar error, got {e:?}"),
        Ok(_) => panic!("mlocked 1 MiB with RLIMIT_MEMLOCK = 64 KiB"),
    }
    c.flush();
    assert_eq!(c.stats().regions, 0);
    assert_eq!(c.notifier().stats().regions, 0);
    assert_eq!(status_kib("VmLck"), 0);
    let h = c.get(small, pg).unwrap();
    assert!(h.is_valid());
    drop(h);
    println!("CHILD-OK");
}

#[test]
fn memlock_limit_too_low_for_a_registrar_is_a_clear_error() {
    const NAME: &str = "memlock_limit_too_low_for_a_registrar_is_a_clear_error";
    match child_role().as_deref() {
        Some("memlock") => memlock_child(),
        Some(_) => {}
        None => in_child(NAME, "memlock"),
    }
}

// ---------------------------------------------------------------------------------------------
// io_uring table full

/// Counts the registrar's live registrations, to prove the cache gives every one back.
struct Counting(IoUringRegistrar, std::sync::atomic::AtomicIsize);

impl Registrar for Counting {
    type Key = FixedBuf;
    fn register(&self, range: std::ops::Range<usize>) -> io::Result<Self::Key> {
        let k = self.0.register(range)?;
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(k)
    }
    fn deregister(&self, key: &Self::Key, range: std::ops::Range<usize>) -> io::Result<()> {
        self.0.deregister(key, range)?;
        self.1.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn max_len(&self) -> usize {
        self.0.max_len()
    }
    fn max_registrations(&self) -> Option<usize> {
        self.0.max_registrations()
    }
}

#[test]
fn io_uring_table_full_is_a_clear_error_and_the_cache_stays_correct() {
    if child_role().is_some() {
        return;
    }
    let pg = page();
    let reg = match IoUringRegistrar::new(4) {
        Ok(r) => r,
        Err(e) => return skip_or_fail("io_uring table full", &format!("io_uring ({e})")),
    };
    let live = std::sync::atomic::AtomicIsize::new(0);
    let c = Cache::new(Counting(reg, live), Config::default().merge_adjacent(false)).unwrap();
    let bufs: Vec<usize> = (0..6).map(|_| map(2 * pg)).collect();
    for (i, &b) in bufs.iter().enumerate() {
        fill(b, 2 * pg, b'a' + i as u8);
    }
    // Four handles held: the table is full and nothing can be evicted.
    let held: Vec<_> = bufs[..4].iter().map(|&b| c.get(b, pg).unwrap()).collect();
    match c.get(bufs[4], pg) {
        Err(cache::Error::Register(e)) => {
            eprintln!("table full: {e}");
            assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
            assert!(e.to_string().contains("table full"), "{e}");
        }
        Err(e) => panic!("expected a registrar error, got {e:?}"),
        Ok(_) => panic!("a fifth registration in a 4-slot table"),
    }
    let live = || c.registrar().1.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(live(), 4);
    // The failed miss left no notifier region behind (its own regions: the cache's four).
    assert_eq!(c.notifier().stats().regions, c.stats().regions);
    assert!(c.stats().regions <= 4);
    for h in &held {
        assert!(h.is_valid());
    }
    drop(held);
    // Room again: the same request succeeds (evicting an unused region), and I/O is right.
    let f = memfd("table-full");
    for (i, &b) in bufs.iter().enumerate() {
        assert_eq!(through_device(&c, &f, b, pg), vec![b'a' + i as u8; pg]);
    }
    // A region whose memory changed is not reused: new pages, new bytes.
    map_fixed(bufs[5], 2 * pg);
    fill(bufs[5], 2 * pg, b'Z');
    assert_eq!(through_device(&c, &f, bufs[5], pg), vec![b'Z'; pg]);
    c.flush();
    let st = c.stats();
    assert!(st.regions <= 4);
    assert_eq!(st.deregister_errors, 0);
    assert_eq!(live(), (st.regions + st.retired) as isize);
    assert_eq!(c.notifier().stats().regions, st.regions);
    drop(c);
    for b in bufs {
        unmap(b, 2 * pg);
    }
    assert_eq!(
        status_kib("VmPin"),
        0,
        "pages left pinned after the cache dropped"
    );
}
