//! Raw anonymous mappings and other kernel-facing helpers shared by every integration test
//! (the cache and reliability helpers build on these).
#![allow(dead_code)]

pub const PAGE: usize = 4096;

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

/// A private low address range for tests that unmap and map again at the same address: the
/// kernel's top-down `mmap` never picks addresses this low, so no other thread of the test process
/// can take the hole in between. Each test uses its own `slot`.
pub fn fixed_area(slot: usize) -> usize {
    0x2000_0000 + slot * 0x10_0000
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
