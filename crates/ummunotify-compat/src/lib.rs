//! # libummunotify-compat: the 2010 `/dev/ummunotify` ABI, unmodified programs
//!
//! `LD_PRELOAD=libummunotify-compat.so ./prog`: a program written in 2010 against the
//! ummunotify character device opens `/dev/ummunotify` and gets a working descriptor, though no
//! such device exists, backed by a [`ummunotify::Notifier`]. Everything below follows
//! `shared/PRIOR-ART.md` byte for byte (ioctl numbers and struct layouts are asserted in
//! `src/abi.rs`).
//!
//! | call on the descriptor | behaviour |
//! |---|---|
//! | `open`, `open64`, `openat`, `openat64`, `__open*_2` of `"/dev/ummunotify"` | a new notifier; `O_WRONLY`/`O_RDWR` → `EINVAL`; no userfaultfd → `ENODEV`, refused → `EACCES` |
//! | `ioctl(UMMUNOTIFY_EXCHANGE_FEATURES)` | answers mask 0; `EINVAL` once the fd was used (any ioctl, read, mmap, or an earlier exchange) |
//! | `ioctl(UMMUNOTIFY_REGISTER_REGION)` | any range, mapped or not, as the device ([`Notifier::register_any`](ummunotify::Notifier::register_any)): mapped parts are watched at once, memory mapped into it later by a call seen here (below) from that call's return; duplicate cookie, empty/wrapping range → `EINVAL`; ranges may overlap anything, other descriptors' included; a range another library's userfaultfd owns → `EBUSY` |
//! | `ioctl(UMMUNOTIFY_UNREGISTER_REGION)` | unknown cookie → `EINVAL` |
//! | other ioctls | `FIONBIO` sets non-blocking; anything else `ENOTTY` |
//! | `read` | 32-byte INVAL records (HINT rules of 2010), then LAST carrying the counter when the queue drained; at most one page; `EAGAIN` with `O_NONBLOCK`, blocks otherwise (`EINTR` on a signal); a buffer smaller than one record → `EINVAL` |
//! | `poll`/`select`/`epoll` | native: the descriptor is a dup of the notifier's eventfd, readable while events (or an owed LAST) are pending |
//! | `mmap(NULL, ≤ page, PROT_READ, MAP_SHARED, fd, 0)` | a read-only view whose first 8 bytes are the live 2010 counter ([`Notifier::notifications`](ummunotify::Notifier::notifications): 0 at open, +1 per kernel message that hit at least one region of this file, already when the unmapping call returns, never down (see below); LAST carries the same value); `PROT_WRITE` + `MAP_SHARED` → `EACCES`; offset ≠ 0 or length > page → `EINVAL` |
//! | `fcntl(F_GETFL/F_SETFL)` | `O_RDONLY` plus the file's own `O_NONBLOCK` |
//! | `dup`, `dup2`, `dup3`, `fcntl(F_DUPFD*)` | the new descriptor shares the file (state, queue, flags), as in the kernel |
//! | `close`, `close_range` | the last descriptor closed stops the notifier |
//! | `mmap`, `mmap64`, `mremap`, `shmat`, `brk`, `sbrk` (any memory) | after the call returned, every device is told of the new range ([`Notifier::mapped`](ummunotify::Notifier::mapped)): the parts inside registered holes are watched from then on (one load per device while no region has holes) |
//!
//! Fork: in the child every read/ioctl returns `EIO` (as kdreg2 does: reopen in the child);
//! counter views the program mapped read `0xC000000000000000`, which never equals a LAST value,
//! and a new `mmap` of the device in the child maps such a page too. A new `open` in the child
//! works (on `UMN_BACKEND=perf` it fails with `ENODEV`: that backend does not start in a forked
//! child). `fork` itself never waits on anything another thread of the parent may hold
//! (guarantee 6), however busy the parent's threads were (`src/fork.rs`):
//! - this library's `pthread_atfork` child handler is registered when the library is loaded
//!   (`.init_array`), before `main` and any thread; the core library's handlers are registered
//!   without a `Once` (a child forked mid-registration registers by itself instead of waiting);
//! - every child handler (this library's and the core's: counter pages, userfaultfd context,
//!   hooks sink table, perf, eBPF areas) only stores to atomics and makes raw syscalls
//!   (`syscall(SYS_mmap, ...)`), never a function this library interposes: the interposed
//!   `mmap` announces the new range to every device under a notifier's registry lock, which a
//!   parent's thread may have held at fork time (before this rule the child hung inside
//!   `fork()` at its first handler);
//! - the descriptor table's per-slot reader counts are zeroed in the child (a parent thread that
//!   was mid-lookup left a count that would never drop, and the child's `close` waited for it);
//!   the references those threads held are leaked in the child, never dropped;
//! - no lock is carried across fork, with one exception: the hooks backend's prepare handler
//!   takes its page filter's lock (so the child never inherits the filter half-updated) and its
//!   parent and child handlers release it; the filter's holders only update a table and
//!   allocate, which can not wait on the forking thread (glibc runs prepare handlers before it
//!   takes the allocator's locks).
//!
//! In the child, the inherited device's notifier reports `Forked` before taking any lock, so
//! calls on the inherited descriptor (and the announcement every interposed mapping call makes)
//! return at once. Tested by `tests/c/fork2010.c` (three threads mapping, registering over a
//! hole, unmapping, reading and unregistering while the main thread forks; every child must
//! exit within a deadline) on every backend. Exec: the descriptor is always close-on-exec (the 2010 device survived exec but was
//! tied to the old address space, so it was inert). Threads: the interposed paths take no lock of
//! their own; descriptor lookups are lock-free (see `src/table.rs`).
//!
//! Limits: every descriptor's notifier shares the process's one userfaultfd context, so ranges of
//! different descriptors may overlap as on the device; pages another library's userfaultfd
//! context owns can not be watched (`EBUSY`). Memory mapped into a registered hole by a call
//! that does not go through these symbols is not watched, and its later unmap is not reported
//! (the device saw it): a raw `mmap` syscall, glibc's internal `mmap`/`brk` inside `malloc`, and
//! mappings this library makes itself (`src/mapping.rs`; the guest suite's
//! `test_raw_mmap_into_a_hole_is_unseen` shows it). A device maps its slot table for 1023
//! regions when it is opened, so registering maps nothing up to that many; past them the table
//! grows, and the kernel may place the new segment in a registered hole, where it is then
//! watched (the device mapped nothing in the program's address space). SIGIO (`O_ASYNC`) is not supported. `readv`, `pread` and
//! `fopen` of the device are not interposed. Descriptors at or above 65536 can not be devices
//! (`EMFILE`). A raw `close`, `close_range`, `dup2` or `dup3` syscall around this library leaves
//! a stale table entry, which is never trusted: every lookup checks that the number still names
//! the device's file (`kcmp`, else the eventfd's id in `/proc/self/fdinfo`, see
//! `Device::owns`), and the next `open` of the device drops stale entries. The notifier's own
//! monitor never enters the interposed functions (its `read`, `ioctl` and `close` of the
//! userfaultfd are raw syscalls). A `close_range` that also covers the library's internal
//! descriptors (the notifier's userfaultfd, eventfds and memfd) breaks that descriptor, which a
//! kernel device never had. The counter word never goes down: a program may compare a value it loaded
//! before an unmapping call with `*counter` after it (the 2010 contract). On userfaultfd the
//! monitor counts a message before it dequeues it, when what the message says is not known yet,
//! and never takes the count back, so a message over watched pages outside this descriptor's
//! regions (another descriptor's or library's pages, pages of a widened watch, a moved watch)
//! while it has regions counts one too many: the program then reads the queue once more and
//! finds only LAST. On the hooks backend (and hybrid's libc calls) the count is exact, one per
//! call that hit a region. On the pull backends (`UMN_BACKEND=perf`, `ebpf`, `kernel`) the count
//! moves when the device is read or polled, not when the unmapping call returns: use the
//! userfaultfd, hooks or hybrid backend with programs that trust `*counter` alone.
#![deny(missing_docs)]

mod abi;
mod device;
mod fork;
mod mapping;
mod real;
mod table;
mod user;
mod views;

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use device::Device;
use user::set_errno;

/// Runs `f`, turning an `Err(errno)` into `-1`/errno and a panic into `-1`/`EIO`.
/// The calling thread is marked inside this library meanwhile (`mapping::Inside`).
fn boundary<T: From<i8>>(f: impl FnOnce() -> Result<T, i32>) -> T {
    let _inside = mapping::Inside::enter();
    bare_boundary(f)
}

/// [`boundary`] for a caller that marked the thread itself.
fn bare_boundary<T: From<i8>>(f: impl FnOnce() -> Result<T, i32>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            T::from(-1)
        }
        Err(_) => {
            set_errno(libc::EIO);
            T::from(-1)
        }
    }
}

/// Whether `path` names the 2010 device.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string (as `open` requires anyway).
unsafe fn is_device(path: *const c_char) -> bool {
    // SAFETY: (caller) NUL-terminated when not NULL.
    !path.is_null() && unsafe { CStr::from_ptr(path) }.to_bytes() == abi::DEVICE_PATH
}

fn open_device(flags: c_int) -> Result<c_int, i32> {
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        return Err(libc::EINVAL); // the 2010 device was read-only
    }
    table::sweep_stale();
    let (dev, fd) = Device::open(flags & libc::O_NONBLOCK != 0)?;
    if fd as usize >= table::MAX_FDS {
        close_real(fd);
        return Err(libc::EMFILE);
    }
    drop(table::set(fd, Arc::new(dev)));
    Ok(fd)
}

fn close_real(fd: c_int) -> c_int {
    match real::get::CLOSE() {
        // SAFETY: closes a descriptor number; the kernel validates it.
        Some(close) => unsafe { close(fd) },
        None => -1,
    }
}

fn enosys<T>() -> Result<T, i32> {
    Err(libc::ENOSYS)
}

macro_rules! pass {
    ($real:ident($($arg:expr),*)) => {
        match real::get::$real() {
            // SAFETY: forwards the caller's arguments unchanged to the next definition.
            Some(f) => Ok(unsafe { f($($arg),*) }),
            None => enosys(),
        }
    };
}

/// Interposed `open(2)`: `/dev/ummunotify` becomes a notifier; everything else passes through.
///
/// # Safety
/// As `open(2)`; `mode` is read only when the caller passed it (`O_CREAT`/`O_TMPFILE`).
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPEN(path, flags, mode)),
    })
}

/// Interposed `open64(2)`.
///
/// # Safety
/// As `open64(2)`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPEN64(path, flags, mode)),
    })
}

/// Interposed `openat(2)` (an absolute path ignores `dirfd`).
///
/// # Safety
/// As `openat(2)`.
#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPENAT(dirfd, path, flags, mode)),
    })
}

/// Interposed `openat64(2)`.
///
/// # Safety
/// As `openat64(2)`.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPENAT64(dirfd, path, flags, mode)),
    })
}

/// Interposed `__open_2` (what `_FORTIFY_SOURCE` builds call).
///
/// # Safety
/// As `open(2)` without a mode.
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPEN_2(path, flags)),
    })
}

/// Interposed `__open64_2`.
///
/// # Safety
/// As `open64(2)` without a mode.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPEN64_2(path, flags)),
    })
}

/// Interposed `__openat_2`.
///
/// # Safety
/// As `openat(2)` without a mode.
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPENAT_2(dirfd, path, flags)),
    })
}

/// Interposed `__openat64_2`.
///
/// # Safety
/// As `openat64(2)` without a mode.
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: (caller) `path` is a C string.
    boundary(|| match unsafe { is_device(path) } {
        true => open_device(flags),
        false => pass!(OPENAT64_2(dirfd, path, flags)),
    })
}

/// Interposed `read(2)`: events from a device, pass-through otherwise (one atomic load).
///
/// # Safety
/// As `read(2)`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    boundary(|| match table::get(fd) {
        Some(dev) => dev.read(fd, buf as usize, count).map(|n| n as isize),
        None => pass!(READ(fd, buf, count)),
    })
}

/// Interposed `__read_chk` (`_FORTIFY_SOURCE`).
///
/// # Safety
/// As `read(2)`, with `buflen` the real size of `buf`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    buflen: usize,
) -> isize {
    boundary(|| match table::get(fd) {
        Some(dev) if count <= buflen => dev.read(fd, buf as usize, count).map(|n| n as isize),
        _ => pass!(READ_CHK(fd, buf, count, buflen)),
    })
}

/// Interposed `ioctl(2)` (the third argument is read as a pointer-sized word, which is how the
/// variadic argument is passed on Linux's x86-64 and AArch64 ABIs).
///
/// # Safety
/// As `ioctl(2)`.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    boundary(|| match table::get(fd) {
        Some(_) if request == libc::FIOCLEX || request == libc::FIONCLEX => {
            pass!(IOCTL(fd, request, arg))
        }
        Some(dev) => dev.ioctl(request, arg as usize),
        None => pass!(IOCTL(fd, request, arg)),
    })
}

fn mmap_impl(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
    wide: bool,
) -> *mut c_void {
    let inside = mapping::Inside::enter();
    let r = catch_unwind(AssertUnwindSafe(|| {
        if table::any() {
            if let Some(dev) = table::get(fd) {
                return dev.mmap(addr, len, prot, flags, off);
            }
        }
        let p = if wide {
            pass!(MMAP64(addr, len, prot, flags, fd, off))
        } else {
            pass!(MMAP(addr, len, prot, flags, fd, off))
        }?;
        mapping::after_mmap(&inside, p, len);
        Ok(p)
    }));
    match r {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            set_errno(e);
            libc::MAP_FAILED
        }
        Err(_) => {
            set_errno(libc::EIO);
            libc::MAP_FAILED
        }
    }
}

/// Interposed `mmap(2)`: a device maps its live counter page read-only.
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    mmap_impl(addr, len, prot, flags, fd, off, false)
}

/// Interposed `mmap64`.
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    mmap_impl(addr, len, prot, flags, fd, off, true)
}

/// Interposed `munmap(2)`: forgets counter views in the range, then unmaps.
///
/// # Safety
/// As `munmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    boundary(|| {
        views::forget(addr as usize, len);
        pass!(MUNMAP(addr, len))
    })
}

/// A pointer result: `Err(errno)` becomes `MAP_FAILED`-style `fail` with errno, a panic `EIO`.
/// The caller has marked the thread (`mapping::Inside`).
fn pointer_boundary(
    fail: *mut c_void,
    f: impl FnOnce() -> Result<*mut c_void, i32>,
) -> *mut c_void {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// Interposed `mremap(2)`: the new range is announced to every device (memory that lands in a
/// registered hole is watched from the return on). `new_address` is read only with
/// `MREMAP_FIXED` or `MREMAP_DONTUNMAP` (as glibc does; on x86-64 a variadic argument arrives in
/// the same register).
///
/// # Safety
/// As `mremap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_address: *mut c_void,
) -> *mut c_void {
    let inside = mapping::Inside::enter();
    pointer_boundary(libc::MAP_FAILED, || {
        // As glibc 2.36: the variadic fifth argument is read only with MREMAP_FIXED or
        // MREMAP_DONTUNMAP (otherwise the register holds garbage, which a kernel would check).
        let new_address = if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 {
            new_address
        } else {
            std::ptr::null_mut()
        };
        let p = pass!(MREMAP(old, old_len, new_len, flags, new_address))?;
        mapping::after_mmap(&inside, p, new_len);
        Ok(p)
    })
}

/// Interposed `shmat(2)`: the attachment is announced to every device.
///
/// # Safety
/// As `shmat(2)`.
#[no_mangle]
pub unsafe extern "C" fn shmat(shmid: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    let inside = mapping::Inside::enter();
    pointer_boundary(usize::MAX as *mut c_void, || {
        let p = pass!(SHMAT(shmid, addr, flags))?;
        if p as usize != usize::MAX {
            mapping::announce(
                &inside,
                p as usize..(p as usize).saturating_add(mapping::shm_size(shmid)),
            );
        }
        Ok(p)
    })
}

/// Interposed `brk(2)`: growth of the break is announced to every device.
///
/// # Safety
/// As `brk(2)`.
#[no_mangle]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> c_int {
    let inside = mapping::Inside::enter();
    bare_boundary(|| {
        let old = pass!(SBRK(0))? as usize;
        let r = pass!(BRK(addr))?;
        if r == 0 {
            mapping::announce(&inside, old..addr as usize);
        }
        Ok(r)
    })
}

/// Interposed `sbrk(2)`: growth of the break is announced to every device.
///
/// # Safety
/// As `sbrk(2)`.
#[no_mangle]
pub unsafe extern "C" fn sbrk(increment: isize) -> *mut c_void {
    let inside = mapping::Inside::enter();
    pointer_boundary(usize::MAX as *mut c_void, || {
        let old = pass!(SBRK(increment))?;
        if old as usize != usize::MAX && increment > 0 {
            mapping::announce(
                &inside,
                old as usize..(old as usize).saturating_add(increment as usize),
            );
        }
        Ok(old)
    })
}

/// Interposed `close(2)`: the last descriptor of a device stops its notifier.
///
/// # Safety
/// As `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    boundary(|| {
        let dev = table::take(fd);
        let r = pass!(CLOSE(fd));
        drop(dev); // after the descriptor is gone; may join the notifier's monitor thread
        r
    })
}

/// Interposed `close_range(2)`.
///
/// # Safety
/// As `close_range(2)`.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    boundary(|| {
        let mut devs = Vec::new();
        if table::any() && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
            let hi = (last as usize).min(table::MAX_FDS - 1);
            for fd in (first as usize)..=hi {
                devs.extend(table::take(fd as c_int));
            }
        }
        let r = pass!(CLOSE_RANGE(first, last, flags));
        drop(devs);
        r
    })
}

/// After a successful dup onto `new`: `new` now refers to `old`'s file.
fn after_dup(old: c_int, new: c_int) {
    let dev = table::get(old);
    let replaced = match dev {
        Some(d) if (new as usize) < table::MAX_FDS => table::set(new, d),
        _ => table::take(new),
    };
    drop(replaced);
}

/// Interposed `dup(2)`.
///
/// # Safety
/// As `dup(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    boundary(|| {
        let new = pass!(DUP(fd))?;
        if new >= 0 {
            after_dup(fd, new);
        }
        Ok(new)
    })
}

/// Interposed `dup2(2)`.
///
/// # Safety
/// As `dup2(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    boundary(|| {
        let r = pass!(DUP2(old, new))?;
        if r >= 0 && old != new {
            after_dup(old, new);
        }
        Ok(r)
    })
}

/// Interposed `dup3(2)`.
///
/// # Safety
/// As `dup3(2)`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    boundary(|| {
        let r = pass!(DUP3(old, new, flags))?;
        if r >= 0 {
            after_dup(old, new);
        }
        Ok(r)
    })
}

fn fcntl_impl(fd: c_int, cmd: c_int, arg: c_long, wide: bool) -> c_int {
    boundary(|| {
        let call = |cmd, arg| {
            if wide {
                pass!(FCNTL64(fd, cmd, arg))
            } else {
                pass!(FCNTL(fd, cmd, arg))
            }
        };
        let Some(dev) = table::get(fd) else {
            return call(cmd, arg);
        };
        match cmd {
            libc::F_GETFL => Ok(libc::O_RDONLY | if dev.nonblock() { libc::O_NONBLOCK } else { 0 }),
            libc::F_SETFL => {
                dev.set_nonblock(arg as c_int & libc::O_NONBLOCK != 0);
                Ok(0)
            }
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
                let new = call(cmd, arg)?;
                if new >= 0 {
                    after_dup(fd, new);
                }
                Ok(new)
            }
            _ => call(cmd, arg),
        }
    })
}

/// Interposed `fcntl(2)` (third argument read as a word, see [`ioctl`]).
///
/// # Safety
/// As `fcntl(2)`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fcntl_impl(fd, cmd, arg, false)
}

/// Interposed `fcntl64`.
///
/// # Safety
/// As `fcntl(2)`.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fcntl_impl(fd, cmd, arg, true)
}
