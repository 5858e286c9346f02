//! Raw anonymous mappings and other kernel-facing helpers shared by every integration test
//! (the cache and reliability helpers build on these).
#![allow(dead_code)]

pub const PAGE: usize = 4096;

/// One turn at a time for the tests of one file that take it: for those that unmap and map
/// again at the same addresses, or that need no other test's unmap in flight while they
/// check (each test file is its own process, so files do not wait for each other).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The page size.
pub fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// A fresh private anonymous read-write mapping of `len` bytes, not touched (no memory committed).
pub fn map_untouched(len: usize) -> usize {
    // SAFETY: a new mapping at an address the kernel chooses; nothing existing is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(
        p,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    p as usize
}

/// A fresh private anonymous read-write mapping of `len` bytes, touched (so pages exist).
pub fn map(len: usize) -> usize {
    let p = map_untouched(len);
    // SAFETY: the mapping is ours, read-write, `len` bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0xA5, len) };
    p
}

/// New memory over `[addr, addr + len)` in one call (`MAP_FIXED`: the kernel unmaps the old pages
/// first), so no other thread's mmap can take the address in between.
pub fn replace(addr: usize, len: usize) {
    // SAFETY: callers replace only mappings they own.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(
        p as usize,
        addr,
        "mmap fixed: {}",
        std::io::Error::last_os_error()
    );
}

/// Maps `len` bytes exactly at `addr`, failing rather than replacing anything there.
pub fn map_at(addr: usize, len: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    p as usize == addr
}

/// `munmap(addr, len)` on a mapping this test created.
pub fn unmap(addr: usize, len: usize) {
    // SAFETY: the tests only unmap mappings they created and no longer reference.
    let r = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    assert_eq!(r, 0, "munmap: {}", std::io::Error::last_os_error());
}

/// `madvise(addr, len, advice)`.
pub fn madvise(addr: usize, len: usize, advice: libc::c_int) {
    // SAFETY: the tests only advise on mappings they created.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
}

/// `n`'s 2010 notification count, settled. The count is provisional while the process's monitor
/// takes a message (+1 before the read, taken back if the message hit none of `n`'s regions), and
/// every notifier of the process is handed every message, so tests running in parallel make it
/// read one high now and then — for as long as the monitor is descheduled mid-message on a
/// loaded machine. A real count never goes down: the lowest of many reads, some of them spread
/// over a few milliseconds of sleeps, is it.
pub fn notifications(n: &ummunotify::Notifier) -> u64 {
    let fast = (0..10_000).map(|_| n.notifications());
    let spread = (0..50).map(|_| {
        std::thread::sleep(std::time::Duration::from_micros(200));
        n.notifications()
    });
    fast.chain(spread).min().expect("10,050 reads")
}

/// Whether the notifier's fd is readable right now (`poll` with timeout 0).
pub fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Whether `fd` stops being readable within 10 s. The process's one userfaultfd context hands
/// every notifier every message, and a notifier with regions is readable while any message is
/// being taken, so a test running in parallel makes the fd readable now and then — for as long
/// as the monitor thread is descheduled mid-message on a loaded machine. Readiness that never
/// goes away is the bug; a bounded wait with sleeps in between tells the two apart without
/// depending on how fast the monitor gets a CPU.
pub fn quiet(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if (0..1_000).any(|_| !readable(fd)) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// A private low address range for tests that unmap and map again at the same address: the
/// kernel's top-down `mmap` never picks addresses this low, so no other thread of the test process
/// can take the hole in between. Each test uses its own `slot`.
pub fn fixed_area(slot: usize) -> usize {
    0x2000_0000 + slot * 0x10_0000
}

/// A fresh touched read-write mapping of `len` bytes (at most 1 MiB) in a low area of its own, for
/// tests that unmap it and map the hole again: a hole the kernel's top-down `mmap` placed joins
/// the free gap below it, so any other thread's next mapping (a new thread's signal stack, a
/// malloc arena) would land in it. Every call gets a new 1 MiB slot above the [`fixed_area`]s.
pub fn map_low(len: usize) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    assert!(len <= 0x10_0000, "map_low: {len} bytes is more than a slot");
    let addr = 0x4000_0000 + NEXT.fetch_add(1, Relaxed) * 0x10_0000;
    assert!(
        map_at(addr, len),
        "map_low at {addr:#x}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the mapping was just made, read-write, `len` bytes.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0xA5, len) };
    addr
}

/// Runs `child` in a forked child and returns its exit status (0 = all assertions held).
/// The child reports failures through its exit code, never by panicking across fork.
pub fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork in a test process; the child only runs `child` and then `_exit`s, and what it
    // runs is what this test exists to check is safe after fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: leave the child without running the parent's atexit handlers or test harness.
        unsafe { libc::_exit(code) };
    }
    // Bounded wait: a hung child fails the test instead of hanging it.
    for _ in 0..3000 {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: killing our own hung child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    panic!("forked child hung");
}

/// Another library's userfaultfd context (libfabric's or PSM3's monitor in the same process)
/// owning `[addr, addr + len)`: a context of its own, registered in missing mode over the range
/// (its pages must be populated, so nothing faults). Our notifiers' watches on those pages get
/// `EBUSY` from the kernel for as long as the returned fd is open.
pub fn foreign_userfaultfd(addr: usize, len: usize) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    const MODE_MISSING: u64 = 1;
    let open = |flags: libc::c_int| {
        // SAFETY: userfaultfd with flags only.
        unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | flags) }
    };
    let mut fd = open(0);
    if fd < 0 {
        fd = open(UFFD_USER_MODE_ONLY);
    }
    assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
    // SAFETY: a new fd returned by the kernel, owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let mut api = [0xAAu64, 0, 0]; // struct uffdio_api { api, features, ioctls }
                                   // SAFETY: UFFDIO_API with a 24-byte struct uffdio_api.
    let r = unsafe { libc::ioctl(raw, UFFDIO_API, api.as_mut_ptr()) };
    assert_eq!(r, 0, "UFFDIO_API: {}", std::io::Error::last_os_error());
    // struct uffdio_register { range { start, len }, mode, ioctls }
    let mut reg = [addr as u64, len as u64, MODE_MISSING, 0];
    // SAFETY: UFFDIO_REGISTER with a 32-byte struct uffdio_register over our own mapping.
    let r = unsafe { libc::ioctl(raw, UFFDIO_REGISTER, reg.as_mut_ptr()) };
    assert_eq!(r, 0, "UFFDIO_REGISTER: {}", std::io::Error::last_os_error());
    fd
}

/// Whether the page at `addr` is registered with a userfaultfd context in write-protect mode
/// (the kernel's own view: `uw` in the `VmFlags` of its VMA in `/proc/self/smaps`).
pub fn uffd_wp_registered(addr: usize) -> bool {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = head.split_once('-') {
            if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) {
                inside = s <= addr && addr < e;
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.split_whitespace().any(|f| f == "uw");
            }
        }
    }
    false
}

/// One round of the heap-trimming hunt (tests/heap.rs, tests/hooks.rs): allocate and free 32
/// blocks of 4–20 KiB (main-arena or per-thread arena heap), `malloc_trim(0)`, and, when
/// `register`, register an 8 KiB heap block, free it while registered, read the events and
/// unregister, while other threads trim.
pub fn heap_churn_round(n: &ummunotify::Notifier, round: u64, register: bool) {
    let blocks: Vec<Vec<u8>> = (0..32usize)
        .map(|i| vec![(i as u64 + round) as u8; 4096 + i * 512])
        .collect();
    drop(blocks);
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    if register {
        let v = vec![0u8; 8192];
        let a = v.as_ptr() as usize;
        let c = ummunotify::Cookie(1000 + round);
        if n.register(a..a + v.len(), c).is_ok() {
            drop(v);
            n.events().unwrap();
            n.unregister(c).unwrap();
        }
    }
}

/// A notifier on the perf backend, or `None` after a loud skip (a failure under
/// `UMN_REQUIRE_ALL=1`) where it can not start.
pub fn perf_or_skip(test: &str) -> Option<ummunotify::Notifier> {
    use ummunotify::{Backend, Error, Notifier, Unsupported};
    match Notifier::with_backend(Backend::Perf) {
        Ok(n) => Some(n),
        Err(Error::Unsupported(Unsupported::Perf { missing })) => {
            ummunotify_testkit::require::skip_or_fail(test, &missing);
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}
