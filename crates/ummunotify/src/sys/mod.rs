//! Thin, typed wrappers over the few non-userfaultfd syscalls the crate needs.
//!
//! Like rustix: each function is named after the syscall it wraps, takes `BorrowedFd`s, returns
//! `OwnedFd`s created on the same line as the syscall, and turns `-1` into `io::Error`.
#![allow(unsafe_code)] // The crate's general-purpose syscalls live here and nowhere else.

pub mod call_times;
pub(crate) mod vma;

use call_times::{timed, Call};

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)`: a new shared mapping.
pub(crate) fn mmap_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new mapping chosen by the kernel; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned NULL"))
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let p = PAGE.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let p = if p > 0 { p as usize } else { 4096 };
    PAGE.store(p, Ordering::Relaxed);
    p
}

/// `eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes two integers and returns a new fd or -1.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: the fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd counter (makes it readable). Event-path safe: no allocation.
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local u64, as eventfd requires. A failure (counter at its
    // maximum) leaves the fd readable, which is all we want, so the result is ignored.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd counter to 0 (not readable). Non-blocking.
pub(crate) fn eventfd_drain(fd: BorrowedFd<'_>) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a local u64. EAGAIN (already 0) is the expected failure. A raw
    // syscall, so an interposed `read` (the 2010 compat preload) never sees the notifier's fd.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_read,
            fd.as_raw_fd(),
            (&mut v as *mut u64).cast::<libc::c_void>(),
            8usize,
        )
    };
}

/// `poll` on up to two fds for readability, blocking. Returns which are readable.
/// Event-path safe: the pollfd array lives on the stack.
pub(crate) fn poll_readable(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: `fds` is a valid array of two pollfd structs for the duration of the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok((false, false));
        }
        return Err(e);
    }
    let hit = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    Ok((hit(&fds[0]), hit(&fds[1])))
}

/// Whether every page of `[start, end)` (page aligned) is mapped: `msync(start, len, 0)`
/// fails with `ENOMEM` over a hole and, with no flags, does no work on mapped pages.
pub(crate) fn is_mapped(start: usize, end: usize) -> io::Result<bool> {
    // SAFETY: msync with flags 0 only walks the VMAs of the range; it reads and writes no memory
    // and is fine on any address, mapped or not.
    let r = unsafe { libc::msync(start as *mut libc::c_void, end - start, 0) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOMEM) => Ok(false),
        _ => Err(e),
    }
}

/// Two pages of shared memory (a memfd): the first holds the generation counter, the second the
/// 2010 notification count (at file offset one page, so a view mapped from there has it in its
/// first 8 bytes, where a 2010 program reads its counter). The fd lets other views (the C API,
/// the 2010 compat layer's `mmap`) see the same live words.
pub(crate) struct CounterPage {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the page is plain shared memory accessed only through atomics.
unsafe impl Send for CounterPage {}
// SAFETY: as above.
unsafe impl Sync for CounterPage {}

impl CounterPage {
    /// `memfd_create` + `ftruncate` + `mmap(MAP_SHARED)`.
    pub(crate) fn new() -> io::Result<CounterPage> {
        let len = 2 * page_size();
        // SAFETY: the name is a NUL-terminated literal; returns a new fd or -1.
        let fd =
            cvt(unsafe { libc::memfd_create(c"ummunotify-counter".as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: the fd was just returned by the kernel and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on an fd we own.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        let ptr = mmap_shared(fd.as_fd(), len)?;
        Ok(CounterPage { fd, ptr, len })
    }

    /// The counter word: the first 8 bytes of the page.
    pub(crate) fn word(&self) -> &crate::primitive::AtomicU64 {
        // SAFETY: the page is mapped read-write for as long as `self` lives, is page aligned (so
        // 8-byte aligned), zero-initialised by the kernel, and only ever accessed atomically.
        unsafe { &*self.ptr.as_ptr().cast::<crate::primitive::AtomicU64>() }
    }

    /// The notification word: the first 8 bytes of the second page.
    pub(crate) fn notification_word(&self) -> &crate::primitive::AtomicU64 {
        // SAFETY: as for `word`; the mapping is two pages long, so `ptr + page_size()` is inside
        // it and page aligned.
        unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(page_size())
                .cast::<crate::primitive::AtomicU64>()
        }
    }

    /// Address of the page (for the fork handler, which replaces it in a child).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The memfd behind the page.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

impl Drop for CounterPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no reference to it outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// In a forked child: replace the shared counter page at `addr` by a private page whose counter
/// reads `value`, so the child's checks fail without touching the parent's counter.
///
/// Async-signal-safe (a raw `mmap` syscall and a store); called from the `pthread_atfork` child
/// handler. The syscall is raw on purpose: the `mmap` symbol may be interposed (the 2010
/// preload's `mmap` announces the new range to every device, which takes a notifier's registry
/// lock a parent's thread may have held at fork time) or patched (the hooks backend), and a
/// child handler must reach neither.
///
/// # Safety
/// `addr` must be the address of a live `CounterPage` of this process (inherited from the parent).
pub(crate) unsafe fn poison_counter_page_in_child(addr: usize, value: u64) {
    // SAFETY: (caller) `addr` is our counter page; replacing it with a private anonymous page of
    // the same size keeps the address valid for every reference to it.
    if unsafe { raw_anon_fixed(addr, page_size()) } {
        // SAFETY: the page was just mapped read-write at `addr`, which is 8-byte aligned.
        unsafe {
            (*(addr as *const std::sync::atomic::AtomicU64))
                .store(value, std::sync::atomic::Ordering::SeqCst)
        };
    }
}

/// Replaces `[addr, addr + len)` by fresh private anonymous read-write memory with a raw
/// `mmap` syscall (`MAP_FIXED`), never through the `mmap` symbol: for `pthread_atfork` child
/// handlers (see [`poison_counter_page_in_child`]). Async-signal-safe; true on success.
///
/// # Safety
/// The range must be memory of this process that nothing will use as what it was before.
pub(crate) unsafe fn raw_anon_fixed(addr: usize, len: usize) -> bool {
    // SAFETY: (caller) the range may be replaced; the kernel validates the arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1 as libc::c_long,
            0 as libc::c_long,
        )
    };
    r as usize == addr
}

/// Blocks every signal in the calling thread until dropped, then restores the old mask.
///
/// Held around every index-lock section in user threads, so a signal handler can not unmap
/// registered memory (and wait for the monitor) while this thread holds a lock the monitor needs.
pub(crate) struct SignalsBlocked {
    old: libc::sigset_t,
}

impl SignalsBlocked {
    pub(crate) fn new() -> SignalsBlocked {
        // SAFETY: sigset_t is plain data; sigfillset initialises it, pthread_sigmask writes `old`.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            timed(Call::Mask, || {
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old)
            });
            SignalsBlocked { old }
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        timed(Call::Mask, || unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut())
        });
    }
}

/// The calling thread's kernel id (`gettid(2)`).
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}
