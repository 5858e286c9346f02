//! One open `/dev/ummunotify`: a [`Notifier`] and the 2010 per-file state.
use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use ummunotify::{Cookie, Error, Event, Notifier};

use crate::abi::{self, Event2010, RegisterIoctl};
use crate::user::{copy_to, read_value, write_value};
use crate::{real, views};

/// Events per `read()`: one 4 KiB page of 32-byte records (fewer on larger pages is allowed:
/// the 2010 ABI promises "at most one page").
const MAX_EVENTS: usize = 4096 / 32;

/// Regions a device has room for from its open on: registering up to this many maps nothing
/// (see `Notifier::reserve`); the slot table's first segment holds 1023.
const RESERVED_REGIONS: usize = 1023;

/// The state of one open file description (shared by its `dup`s, as in the kernel).
pub(crate) struct Device {
    notifier: Notifier,
    /// A read-only descriptor of the counter memfd: what `mmap` of the device maps, so the view
    /// can never be made writable.
    counter_ro: OwnedFd,
    /// The device was used (`EXCHANGE_FEATURES` is refused afterwards).
    used: AtomicBool,
    /// `O_NONBLOCK` of this open file description (kept here: the descriptor the program holds
    /// is a dup of the notifier's own eventfd, whose real flags must not change).
    nonblock: AtomicBool,
    /// A read drained the queue but had no room left for the LAST record: the next read owes it
    /// (the 2010 patch's `need_empty`). The fd is kept readable meanwhile.
    owed_last: AtomicBool,
    /// The eventfd's `eventfd-id` from `/proc/self/fdinfo` (when readable): how [`owns`]
    /// recognises the file where `kcmp(2)` is refused (seccomp) or absent.
    ///
    /// [`owns`]: Device::owns
    eventfd_id: Option<u64>,
}

/// Maps a core error to the errno the 2010 device would have returned.
fn errno_of(e: &Error) -> i32 {
    match e {
        Error::EmptyRange
        | Error::WrappingRange
        | Error::Unmapped
        | Error::DuplicateCookie(_)
        | Error::UnknownCookie(_) => libc::EINVAL,
        Error::UnsupportedMapping(_) => libc::EINVAL,
        Error::RangeBusy => libc::EBUSY,
        Error::CoverageLimit(_) => libc::ENOMEM,
        // kdreg2's convention: a forked child must reopen.
        Error::Forked | Error::MonitorDead => libc::EIO,
        Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

impl Device {
    /// Opens a device; returns it and the descriptor to hand the program (a close-on-exec dup of
    /// the notifier's readiness eventfd, so `poll`/`select`/`epoll` work on it unmodified).
    pub(crate) fn open(nonblock: bool) -> Result<(Device, i32), i32> {
        let notifier = Notifier::new().map_err(|e| match e {
            Error::Unsupported(ummunotify::Unsupported::NoUserfaultfd) => libc::ENODEV,
            Error::Unsupported(ummunotify::Unsupported::PermissionDenied { .. }) => libc::EACCES,
            Error::Unsupported(_) => libc::ENODEV,
            e => errno_of(&e),
        })?;
        // The first registrations must map nothing: a program registers holes it just made.
        notifier
            .reserve(RESERVED_REGIONS)
            .map_err(|e| errno_of(&e))?;
        let counter_ro = reopen_read_only(notifier.counter_fd().as_raw_fd())?;
        let fcntl = real::get::FCNTL().ok_or(libc::ENOSYS)?;
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor the notifier owns; returns a new fd or -1.
        let fd = unsafe { fcntl(notifier.as_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(last_errno());
        }
        let eventfd_id = eventfd_id(fd);
        let dev = Device {
            notifier,
            counter_ro,
            used: AtomicBool::new(false),
            nonblock: AtomicBool::new(nonblock),
            owed_last: AtomicBool::new(false),
            eventfd_id,
        };
        Ok((dev, fd))
    }

    /// Whether descriptor `fd` still refers to this device's file.
    ///
    /// A table entry can outlive the descriptor it was made for: a raw `close`, `close_range`,
    /// `dup2`/`dup3` syscall (or `closefrom`, which glibc implements with the raw syscall) does
    /// not pass through this library, and the number may since name another file. So an entry
    /// is trusted only when the kernel says the number still names our open file description:
    /// `kcmp(KCMP_FILE)` against the notifier's eventfd (the program's descriptor is a dup of
    /// it). Where `kcmp` is refused (a container's seccomp profile) or absent, the file must be
    /// an eventfd (same anonymous inode) with our `eventfd-id` in `/proc/self/fdinfo`; without
    /// `/proc` as well, any eventfd at that number is taken for ours (documented limit).
    /// Async-signal-safe, no allocation: a few raw syscalls.
    pub(crate) fn owns(&self, fd: i32) -> bool {
        let ours = self.notifier.as_fd().as_raw_fd();
        // SAFETY: getpid has no preconditions; kcmp only compares the two processes' file
        // tables (both ours) at the given numbers and writes no memory.
        let r = unsafe {
            let pid = libc::getpid();
            libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, fd, ours)
        };
        if r >= 0 {
            return r == 0;
        }
        if last_errno() == libc::EBADF {
            return false; // nothing at that number any more
        }
        if !same_inode(fd, ours) {
            return false;
        }
        match self.eventfd_id {
            Some(id) => eventfd_id(fd) == Some(id),
            None => true,
        }
    }

    /// `O_NONBLOCK` of this file.
    pub(crate) fn nonblock(&self) -> bool {
        self.nonblock.load(SeqCst)
    }

    /// Sets `O_NONBLOCK` (`fcntl(F_SETFL)`, `ioctl(FIONBIO)`).
    pub(crate) fn set_nonblock(&self, on: bool) {
        self.nonblock.store(on, SeqCst);
    }

    /// `ioctl(fd, request, arg)` for the three 2010 requests (and `FIONBIO`).
    pub(crate) fn ioctl(&self, request: std::ffi::c_ulong, arg: usize) -> Result<i32, i32> {
        match request {
            abi::EXCHANGE_FEATURES => {
                if self.used.swap(true, SeqCst) {
                    return Err(libc::EINVAL);
                }
                let _requested: u32 = read_value(arg)?;
                // No extensions are defined: the answer is always 0.
                write_value(arg, &0u32)?;
                Ok(0)
            }
            abi::REGISTER_REGION => {
                self.used.store(true, SeqCst);
                let r: RegisterIoctl = read_value(arg)?;
                let range = usize::try_from(r.start).map_err(|_| libc::EINVAL)?
                    ..usize::try_from(r.end).map_err(|_| libc::EINVAL)?;
                // Any range, as the device: holes are watched once a mapping call announces them
                // (`crate::mapping`).
                self.notifier
                    .register_any(range, Cookie(r.user_cookie))
                    .map_err(|e| errno_of(&e))?;
                Ok(0)
            }
            abi::UNREGISTER_REGION => {
                self.used.store(true, SeqCst);
                let cookie: u64 = read_value(arg)?;
                self.notifier
                    .unregister(Cookie(cookie))
                    .map_err(|e| errno_of(&e))?;
                Ok(0)
            }
            libc::FIONBIO => {
                let on: i32 = read_value(arg)?;
                self.set_nonblock(on != 0);
                Ok(0)
            }
            _ => Err(libc::ENOTTY),
        }
    }

    /// `read(fd, buf, count)`: INVAL records, then LAST with the counter when the queue drained;
    /// blocks (unless `O_NONBLOCK`) until there is something to return.
    pub(crate) fn read(&self, fd: i32, buf: usize, count: usize) -> Result<usize, i32> {
        self.used.store(true, SeqCst);
        if count < std::mem::size_of::<Event2010>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let max = (count.min(page) / std::mem::size_of::<Event2010>()).min(MAX_EVENTS);
        let mut events = [Event::default(); MAX_EVENTS];
        let mut out = [Event2010::default(); MAX_EVENTS];
        loop {
            let owed = self.owed_last.swap(false, SeqCst);
            let r = match self.notifier.read_events(&mut events[..max]) {
                Ok(r) => r,
                Err(e) => {
                    if owed {
                        self.owed_last.store(true, SeqCst);
                    }
                    return Err(errno_of(&e));
                }
            };
            if r.count == 0 && !owed {
                if self.nonblock() {
                    return Err(libc::EAGAIN);
                }
                wait_readable(fd)?;
                continue;
            }
            for (o, e) in out.iter_mut().zip(&events[..r.count]) {
                *o = Event2010 {
                    kind: abi::EVENT_TYPE_INVAL,
                    flags: if e.hint { abi::EVENT_FLAG_HINT } else { 0 },
                    hint_start: e.start as u64,
                    hint_end: e.end as u64,
                    user_cookie_counter: e.cookie.0,
                };
            }
            let mut n = r.count;
            if let (true, Some(g)) = (owed, r.drained) {
                // The readiness this file added for the owed LAST is ours to clear (the notifier
                // only clears what it set). If a message arrived since `g`, keep the fd readable.
                drain(fd);
                if self.notifier.counter().load(SeqCst) != g.value() {
                    signal(fd);
                }
            }
            if let Some(notes) = r.drained_notifications {
                if n < max {
                    // The 2010 counter (what the program's mapped view shows), taken with the
                    // drain: equal to `*counter` until the next message that hits a region.
                    out[n] = Event2010 {
                        kind: abi::EVENT_TYPE_LAST,
                        flags: 0,
                        hint_start: 0,
                        hint_end: 0,
                        user_cookie_counter: notes,
                    };
                    n += 1;
                } else {
                    self.owed_last.store(true, SeqCst);
                    signal(fd);
                }
            }
            let bytes = n * std::mem::size_of::<Event2010>();
            copy_to(buf, out.as_ptr().cast(), bytes)?;
            return Ok(bytes);
        }
    }

    /// Memory was just mapped at `range` (an interposed mapping call returned): watch the parts
    /// of it that lie in this device's regions' holes.
    pub(crate) fn mapped(&self, range: std::ops::Range<usize>) {
        let _ = self.notifier.mapped(range);
    }

    /// `mmap(addr, len, prot, flags, fd, offset)`: a view of the live counter page.
    pub(crate) fn mmap(
        &self,
        addr: *mut c_void,
        len: usize,
        prot: i32,
        flags: i32,
        offset: i64,
    ) -> Result<*mut c_void, i32> {
        self.used.store(true, SeqCst);
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        if offset != 0 || len == 0 || len > page {
            return Err(libc::EINVAL);
        }
        if self.notifier.generation().is_err() {
            // A forked child (or a dead monitor): a page that never equals a LAST counter.
            return views::map_poisoned(addr, len, prot, flags);
        }
        let mmap = real::get::MMAP().ok_or(libc::ENOSYS)?;
        // The view starts at the notification count (the 2010 counter: 0 at open, +1 per
        // message that hit a region of this file), not at the notifier's own generation.
        let at = i64::try_from(self.notifier.notifications_offset()).map_err(|_| libc::EINVAL)?;
        // SAFETY: maps our read-only memfd descriptor; the kernel validates addr/prot/flags and
        // refuses PROT_WRITE with MAP_SHARED (EACCES) as it would have for the device.
        let p = unsafe { mmap(addr, len, prot, flags, self.counter_ro.as_raw_fd(), at) };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        views::record(p as usize);
        Ok(p)
    }
}

/// `KCMP_FILE` of `linux/kcmp.h`.
const KCMP_FILE: libc::c_long = 0;

/// Whether two descriptors name files with the same device and inode numbers.
fn same_inode(a: i32, b: i32) -> bool {
    // SAFETY: `stat` is plain data; fstat writes one into each local.
    unsafe {
        let mut sa: libc::stat = std::mem::zeroed();
        let mut sb: libc::stat = std::mem::zeroed();
        libc::fstat(a, &mut sa) == 0
            && libc::fstat(b, &mut sb) == 0
            && sa.st_dev == sb.st_dev
            && sa.st_ino == sb.st_ino
    }
}

/// The `eventfd-id:` line of `/proc/self/fdinfo/<fd>` (Linux 5.16+), read with raw syscalls into
/// stack buffers (no allocation, and never through this library's interposed `open`/`read`).
fn eventfd_id(fd: i32) -> Option<u64> {
    let mut path = *b"/proc/self/fdinfo/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut i = b"/proc/self/fdinfo/".len();
    let mut num = [0u8; 10];
    let digits = decimal(fd.max(0).unsigned_abs(), &mut num);
    path[i..i + digits.len()].copy_from_slice(digits);
    i += digits.len();
    path[i] = 0;
    // SAFETY: a NUL-terminated path in a local buffer; returns a new fd or -1.
    let f = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if f < 0 {
        return None;
    }
    let mut buf = [0u8; 512];
    // SAFETY: reads at most `buf.len()` bytes into a local buffer, then closes the fd we opened.
    let n = unsafe {
        let n = libc::syscall(libc::SYS_read, f, buf.as_mut_ptr(), buf.len());
        libc::syscall(libc::SYS_close, f);
        n
    };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    let key = b"eventfd-id:";
    let at = text.windows(key.len()).position(|w| w == key)? + key.len();
    let mut id: Option<u64> = None;
    for &c in text[at..]
        .iter()
        .skip_while(|c| **c == b' ' || **c == b'\t')
    {
        if !c.is_ascii_digit() {
            break;
        }
        id = Some(
            id.unwrap_or(0)
                .checked_mul(10)?
                .checked_add(u64::from(c - b'0'))?,
        );
    }
    id
}

/// `v` in decimal, written to the end of `buf` (no allocation).
fn decimal(mut v: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Blocks until `fd` (the device's eventfd) is readable, like the 2010 read's wait.
fn wait_readable(fd: i32) -> Result<(), i32> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
        return Err(last_errno()); // EINTR: a signal interrupted the wait, as in 2010
    }
    Ok(())
}

/// Makes `fd` readable (a LAST record is owed).
fn signal(fd: i32) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to an eventfd; failure only means it is already
    // readable at its maximum count.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Clears the eventfd's count (non-blocking: it is a dup of the notifier's `EFD_NONBLOCK` fd).
fn drain(fd: i32) {
    let mut v: u64 = 0;
    if let Some(read) = real::get::READ() {
        // SAFETY: reads 8 bytes into a local from an eventfd; EAGAIN (already 0) is fine.
        let _ = unsafe { read(fd, (&mut v as *mut u64).cast(), 8) };
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A read-only descriptor of the same memfd (through `/proc/self/fd`); a close-on-exec dup when
/// `/proc` is not mounted (the view could then be `mprotect`ed writable: documented).
fn reopen_read_only(memfd: i32) -> Result<OwnedFd, i32> {
    let path = format!("/proc/self/fd/{memfd}\0");
    if let Some(open) = real::get::OPEN() {
        // SAFETY: a NUL-terminated path; returns a new fd or -1.
        let fd = unsafe { open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
        if fd >= 0 {
            // SAFETY: a new descriptor nobody else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    let fcntl = real::get::FCNTL().ok_or(libc::ENOSYS)?;
    // SAFETY: F_DUPFD_CLOEXEC on the notifier's memfd; returns a new fd or -1.
    let fd = unsafe { fcntl(memfd, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
