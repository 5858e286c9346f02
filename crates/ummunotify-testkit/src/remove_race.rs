//! The REMOVE race (issue 9): every way to make the kernel send a userfaultfd `REMOVE` message,
//! buffers to aim them at, and the per-buffer seqlock that decides which uses may be judged.
//!
//! A `REMOVE` is queued *before* the pages are dropped: the calling thread drops `mmap_lock`,
//! sleeps until the monitor dequeues the message, then takes the lock again and zaps. A
//! registration (a pin) made between that dequeue and the zap holds the old frames. The stress in
//! `crates/ummunotify/tests/remove_race.rs` drives these kinds against the notifier and the cache
//! and judges each use with the bytes a `WRITE_FIXED` reads from the pinned frames.
//!
//! The seqlock rule: a [`Change`] is odd while its buffer is being changed (the madvise and the
//! rewrite of the new contents); a use is judged only if it read the same even value before its
//! validity check and after its last read of the device's bytes, i.e. no change overlapped the
//! use and every earlier change had returned before the check.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

use crate::require::MissingFeature;
use crate::uring::UringMadvise;

/// `MADV_DONTNEED_LOCKED` (Linux 5.18).
pub const MADV_DONTNEED_LOCKED: libc::c_int = 24;

/// Environment variable: seconds each stress case runs (default [`DEFAULT_SECS`]).
pub const SECS_ENV: &str = "UMN_REMOVE_RACE_SECS";
/// Seconds per case when [`SECS_ENV`] is not set (a short run for `cargo test`).
pub const DEFAULT_SECS: f64 = 1.0;

/// Seconds each stress case runs: [`SECS_ENV`] or [`DEFAULT_SECS`].
pub fn stress_secs() -> f64 {
    std::env::var(SECS_ENV)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(DEFAULT_SECS)
}

/// One way to make the kernel queue a `REMOVE` for a watched range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RemoveKind {
    /// `madvise(MADV_DONTNEED)`, through glibc and as a raw `syscall`, alternately.
    Dontneed,
    /// `madvise(MADV_FREE)`, glibc and raw. Lazy free: the pinned frame usually stays mapped, so
    /// the bytes oracle rarely sees a difference; the kind is here for the event path's sake.
    Free,
    /// `madvise(MADV_DONTNEED_LOCKED)`, glibc and raw.
    DontneedLocked,
    /// `madvise(MADV_REMOVE)` on a shared memfd (shmem) mapping, glibc and raw.
    RemoveShmem,
    /// `process_madvise(pidfd_open(getpid()), MADV_DONTNEED)`, glibc 2.36's wrapper and raw.
    ProcessMadvise,
    /// `IORING_OP_MADVISE(MADV_DONTNEED)`: done by an io_uring worker thread of the kernel.
    UringMadvise,
}

impl RemoveKind {
    /// Every kind, in the order the stress runs them.
    pub const ALL: [RemoveKind; 6] = [
        RemoveKind::Dontneed,
        RemoveKind::Free,
        RemoveKind::DontneedLocked,
        RemoveKind::RemoveShmem,
        RemoveKind::ProcessMadvise,
        RemoveKind::UringMadvise,
    ];

    /// A short stable name (used in reports and in `UMN_REMOVE_RACE_KINDS`).
    pub fn name(self) -> &'static str {
        match self {
            RemoveKind::Dontneed => "madv_dontneed",
            RemoveKind::Free => "madv_free",
            RemoveKind::DontneedLocked => "madv_dontneed_locked",
            RemoveKind::RemoveShmem => "madv_remove_shmem",
            RemoveKind::ProcessMadvise => "process_madvise",
            RemoveKind::UringMadvise => "io_uring_madvise",
        }
    }

    /// The kind named `name` (see [`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<RemoveKind> {
        RemoveKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the buffers must be shared memory (shmem) for this kind.
    pub fn needs_shmem(self) -> bool {
        self == RemoveKind::RemoveShmem
    }

    fn advice(self) -> libc::c_int {
        match self {
            RemoveKind::Free => libc::MADV_FREE,
            RemoveKind::DontneedLocked => MADV_DONTNEED_LOCKED,
            RemoveKind::RemoveShmem => libc::MADV_REMOVE,
            _ => libc::MADV_DONTNEED,
        }
    }
}

extern "C" {
    /// glibc 2.36's wrapper (declared here: the `libc` crate does not bind it).
    fn process_madvise(
        pidfd: libc::c_int,
        iovec: *const libc::iovec,
        vlen: libc::size_t,
        advice: libc::c_int,
        flags: libc::c_uint,
    ) -> libc::ssize_t;
}

fn check(r: libc::c_long, what: &str) -> io::Result<libc::c_long> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => MissingFeature::error(what, e),
            _ => e,
        });
    }
    Ok(r)
}

/// Applies one [`RemoveKind`] to a range; alternates the glibc and the raw-syscall way.
pub struct Remover {
    kind: RemoveKind,
    pidfd: Option<OwnedFd>,
    uring: Option<UringMadvise>,
    calls: u64,
    raw_only: bool,
}

impl Remover {
    /// Prepares what the kind needs (a pidfd of this process, an io_uring).
    ///
    /// # Errors
    /// [`MissingFeature`] naming `pidfd_open` or `io_uring` when the kernel refuses them.
    pub fn new(kind: RemoveKind) -> io::Result<Self> {
        let pidfd = if kind == RemoveKind::ProcessMadvise {
            // SAFETY: pidfd_open takes a pid and flags; no memory is passed.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
            let fd = check(fd, "pidfd_open")?;
            // SAFETY: pidfd_open returned a fresh descriptor owned by nobody else.
            Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        } else {
            None
        };
        let uring = match kind {
            RemoveKind::UringMadvise => Some(UringMadvise::new()?),
            _ => None,
        };
        Ok(Self {
            kind,
            pidfd,
            uring,
            calls: 0,
            raw_only: false,
        })
    }

    /// Every call the raw-syscall way from now on (no glibc call). For a backend whose libc
    /// hooks bracket the glibc call (hybrid), where only a call no hook sees opens the window.
    pub fn raw_only(mut self) -> Self {
        self.raw_only = true;
        self
    }

    /// The kind this remover applies.
    pub fn kind(&self) -> RemoveKind {
        self.kind
    }

    /// Drops the pages of `[addr, addr + len)` with this kind (glibc on even calls, the raw
    /// syscall on odd ones; always raw after [`raw_only`](Remover::raw_only)).
    ///
    /// # Safety
    /// The range must be memory the caller owns and whose contents it is willing to lose; no Rust
    /// reference may point into it.
    ///
    /// # Errors
    /// The OS error of the call; [`MissingFeature`] for advice or calls this kernel refuses.
    pub unsafe fn remove(&mut self, addr: usize, len: usize) -> io::Result<()> {
        let raw = self.raw_only || self.calls % 2 == 1;
        self.calls += 1;
        let advice = self.kind.advice();
        let name = self.kind.name();
        match self.kind {
            RemoveKind::UringMadvise => self
                .uring
                .as_mut()
                .expect("io_uring made in new")
                .madvise(addr, len, advice),
            RemoveKind::ProcessMadvise => {
                let pidfd = self.pidfd.as_ref().expect("pidfd made in new").as_raw_fd();
                let iov = libc::iovec {
                    iov_base: addr as *mut libc::c_void,
                    iov_len: len,
                };
                let r = if raw {
                    // SAFETY: one iovec naming memory of this process; the caller owns it.
                    unsafe { libc::syscall(libc::SYS_process_madvise, pidfd, &iov, 1, advice, 0) }
                } else {
                    // SAFETY: as above, through glibc's wrapper.
                    unsafe { process_madvise(pidfd, &iov, 1, advice, 0) as libc::c_long }
                };
                check(r, name).map(|_| ())
            }
            _ => {
                let r = if raw {
                    // SAFETY: the caller owns the range and gives up its contents.
                    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) }
                } else {
                    // SAFETY: as above.
                    unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) as libc::c_long }
                };
                check(r, name).map(|_| ())
            }
        }
    }

    /// One change of a buffer as the stress makes it: the seqlock goes odd, the pages are
    /// dropped with this kind, a fresh `value` is stamped at the start of each page, the seqlock
    /// goes even; then a short pause (a change every few microseconds, not a storm that starves
    /// the registering threads).
    ///
    /// # Safety
    /// As for [`remove`](Self::remove); `[addr, addr + len)` must also be writable.
    ///
    /// # Errors
    /// As for [`remove`](Self::remove) (the seqlock is even again either way).
    pub unsafe fn change(
        &mut self,
        ch: &Change,
        addr: usize,
        len: usize,
        page: usize,
        value: u64,
    ) -> io::Result<()> {
        ch.begin();
        // SAFETY: the caller's contract.
        if let Err(e) = unsafe { self.remove(addr, len) } {
            ch.end();
            return Err(e);
        }
        // SAFETY: the caller's contract; writable, no Rust reference into it.
        unsafe { write_stamp(addr, len, page, value) };
        ch.end();
        for _ in 0..2000 {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Remover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remover")
            .field("kind", &self.kind)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

/// `count` buffers of `len` bytes each (private anonymous, or shared memfd pages for kinds that
/// need shmem), touched. Unmapped on drop.
pub struct Buffers {
    base: usize,
    len: usize,
    count: usize,
    _memfd: Option<File>,
}

impl Buffers {
    /// Maps the buffers in one mapping (the kernel picks the address) and touches every page.
    ///
    /// # Errors
    /// The OS error of `memfd_create`, `ftruncate` or `mmap`.
    pub fn new(count: usize, len: usize, shmem: bool) -> io::Result<Self> {
        let total = count * len;
        let memfd = if shmem {
            // SAFETY: a NUL-terminated name; the fd is fresh.
            let fd = unsafe { libc::memfd_create(c"umn-remove-race".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: memfd_create returned a descriptor owned by nobody else.
            let f = unsafe { File::from_raw_fd(fd) };
            f.set_len(total as u64)?;
            Some(f)
        } else {
            None
        };
        let (flags, fd) = match &memfd {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new mapping at an address the kernel chooses; nothing existing is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping is ours, read-write, `total` bytes, and nothing references it.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, total) };
        Ok(Self {
            base: p as usize,
            len,
            count,
            _memfd: memfd,
        })
    }

    /// For shmem buffers: writes past the buffers' end until `stop`, so that the memfd's inode
    /// lock is often held. `MADV_REMOVE` punches its hole under that lock after it dropped
    /// `mmap_lock` (and after the userfaultfd check for a watch), so this keeps the time between
    /// the check and the zap long, as a loaded machine does; a registration whose watch came in
    /// between must still not be used with the dropped frames. Returns at once for private
    /// buffers.
    ///
    /// # Errors
    /// The OS error of a write.
    pub fn contend(&self, stop: &AtomicBool) -> io::Result<()> {
        let Some(f) = &self._memfd else {
            return Ok(());
        };
        let chunk = vec![0u8; 256 << 10];
        let past = (self.count * self.len) as u64 + (1 << 20);
        while !stop.load(SeqCst) {
            f.write_all_at(&chunk, past)?;
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        Ok(())
    }

    /// The address of buffer `i`.
    pub fn addr(&self, i: usize) -> usize {
        assert!(i < self.count, "buffer index out of range");
        self.base + i * self.len
    }

    /// The length of each buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no buffers.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The number of buffers.
    pub fn count(&self) -> usize {
        self.count
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: our own mapping; nothing references it any more.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.count * self.len) };
    }
}

impl std::fmt::Debug for Buffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffers")
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .field("count", &self.count)
            .finish()
    }
}

/// The seqlock of one buffer: odd while a change to it is in progress.
#[derive(Debug, Default)]
pub struct Change(AtomicU64);

impl Change {
    /// The changer starts a change (the value becomes odd).
    pub fn begin(&self) {
        self.0.fetch_add(1, SeqCst);
    }

    /// The change (madvise and rewrite) is complete (the value becomes even).
    pub fn end(&self) {
        self.0.fetch_add(1, SeqCst);
    }

    /// A snapshot to take before a use's validity check.
    pub fn read(&self) -> u64 {
        self.0.load(SeqCst)
    }

    /// Whether a use bracketed by `before` (taken before its check) and the current value (taken
    /// after its last read) may be judged: no change was in progress or began in between.
    pub fn judged(&self, before: u64) -> bool {
        before % 2 == 0 && self.0.load(SeqCst) == before
    }
}

/// The stamp a buffer carries after its `n`-th change: a value no earlier contents had.
pub fn stamp(buffer: usize, n: u64) -> u64 {
    (buffer as u64) << 48 | (n & ((1 << 48) - 1)) | 1 << 63
}

/// Writes `value` at the start of every page of `[addr, addr + len)`.
///
/// # Safety
/// The range must be writable memory the caller owns with no Rust reference into it.
pub unsafe fn write_stamp(addr: usize, len: usize, page: usize, value: u64) {
    let mut p = addr;
    while p < addr + len {
        // SAFETY: inside the caller's writable range; aligned (page start).
        unsafe { std::ptr::write_volatile(p as *mut u64, value) };
        p += page;
    }
}

/// Reads the stamp at `addr`.
///
/// # Safety
/// `addr` must be readable memory, 8-byte aligned.
pub unsafe fn read_stamp(addr: usize) -> u64 {
    // SAFETY: the caller guarantees readability and alignment.
    unsafe { std::ptr::read_volatile(addr as *const u64) }
}
