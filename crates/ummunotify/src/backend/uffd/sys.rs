//! The userfaultfd kernel ABI: struct layouts, typed ioctls and feature bits.
//!
//! Debian 12's uapi headers (Linux 6.1) and the `libc` crate lack the newer feature bits, so the
//! ABI is spelled out here and its layouts are checked against the kernel's sizes at compile time.
//!
//! # References
//! - `userfaultfd(2)`, `ioctl_userfaultfd(2)`, `include/uapi/linux/userfaultfd.h`.
#![allow(unsafe_code)] // This module is the only place that issues userfaultfd syscalls and ioctls.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::sys::call_times::{timed, Call};

/// `UFFD_API`: the only API version there is.
pub(crate) const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY`: only faults from user mode; lets unprivileged users create a context.
pub(crate) const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// Feature bits of `struct uffdio_api`.
pub(crate) mod feature {
    pub(crate) const EVENT_REMAP: u64 = 1 << 2;
    pub(crate) const EVENT_REMOVE: u64 = 1 << 3;
    pub(crate) const EVENT_UNMAP: u64 = 1 << 6;
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM` (Linux 6.0, with `CONFIG_PTE_MARKER_UFFD_WP`): shmem
    /// and hugetlbfs mappings can be registered in write-protect mode. Offered or not, it is
    /// not requested: the kernel allows those registrations whenever it can.
    pub(crate) const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub(crate) const WP_ASYNC: u64 = 1 << 15;
    /// `UFFD_FEATURE_EVENT_REMOVE_DONE`: every `REMOVE` gets an end, `UFFD_EVENT_REMOVE_DONE`,
    /// sent by the remover after its zap. Not upstream: this project's kernel patch
    /// (`kernel/patches/uffd-remove-done/`, `docs/KERNEL-PATCH.md`); the bit is far above
    /// the assigned ones so that no released kernel offers it by accident.
    pub(crate) const EVENT_REMOVE_DONE: u64 = 1 << 30;
    /// Names of all bits the 6.18 kernel advertises, for `umn doctor`.
    pub(crate) const NAMES: [&str; 17] = [
        "PAGEFAULT_FLAG_WP",
        "EVENT_FORK",
        "EVENT_REMAP",
        "EVENT_REMOVE",
        "MISSING_HUGETLBFS",
        "MISSING_SHMEM",
        "EVENT_UNMAP",
        "SIGBUS",
        "THREAD_ID",
        "MINOR_HUGETLBFS",
        "MINOR_SHMEM",
        "EXACT_ADDRESS",
        "WP_HUGETLBFS_SHMEM",
        "WP_UNPOPULATED",
        "POISON",
        "WP_ASYNC",
        "MOVE",
    ];
}

/// `UFFDIO_REGISTER_MODE_WP`: register for write-protect faults (we never write-protect, so there
/// are none; the registration exists to receive the non-cooperative events).
pub(crate) const REGISTER_MODE_WP: u64 = 1 << 1;

/// Event codes in `struct uffd_msg`.
pub(crate) mod event {
    pub(crate) const REMAP: u8 = 0x14;
    pub(crate) const REMOVE: u8 = 0x15;
    pub(crate) const UNMAP: u8 = 0x16;
    /// `UFFD_EVENT_REMOVE_DONE` (with `feature::EVENT_REMOVE_DONE`): `arg` as for `REMOVE`.
    pub(crate) const REMOVE_DONE: u8 = 0x17;
}

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
pub(crate) struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
pub(crate) struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}

/// `struct uffd_msg`: 8 bytes of header, then a 24-byte union. Kept as raw words; the accessors
/// below decode the union members this crate uses.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct UffdMsg {
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    pub arg: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);
const _: () = assert!(std::mem::offset_of!(UffdMsg, arg) == 8);

const fn ioc(dir: u32, nr: u32, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u32) << 16) | (0xAA << 8) | nr) as libc::c_ulong
}
const IOC_READ: u32 = 2;
const IOC_RW: u32 = 3;
/// `UFFDIO_API = _IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: libc::c_ulong = ioc(IOC_RW, 0x3F, 24);
/// `UFFDIO_REGISTER = _IOWR(0xAA, 0x00, struct uffdio_register)`.
const UFFDIO_REGISTER: libc::c_ulong = ioc(IOC_RW, 0x00, 32);
/// `UFFDIO_UNREGISTER = _IOR(0xAA, 0x01, struct uffdio_range)`.
const UFFDIO_UNREGISTER: libc::c_ulong = ioc(IOC_READ, 0x01, 16);
/// `UFFDIO_ZEROPAGE = _IOWR(0xAA, 0x04, struct uffdio_zeropage)`.
const UFFDIO_ZEROPAGE: libc::c_ulong = ioc(IOC_RW, 0x04, 32);
/// `UFFDIO_CONTINUE = _IOWR(0xAA, 0x07, struct uffdio_continue)` (Linux 5.13).
const UFFDIO_CONTINUE: libc::c_ulong = ioc(IOC_RW, 0x07, 32);
/// `USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00)` on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: libc::c_ulong = ioc(0, 0x00, 0);
const _: () = assert!(UFFDIO_API == 0xC018_AA3F);
const _: () = assert!(UFFDIO_REGISTER == 0xC020_AA00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_AA01);
const _: () = assert!(UFFDIO_ZEROPAGE == 0xC020_AA04);
const _: () = assert!(UFFDIO_CONTINUE == 0xC020_AA07);

/// `struct uffdio_zeropage` and `struct uffdio_continue` (same layout): a range, a mode
/// (`DONTWAKE`, bit 0, for both) and what was done (bytes, or a negative errno).
#[repr(C)]
struct UffdioFill {
    range: UffdioRange,
    mode: u64,
    done: i64,
}
const _: () = assert!(std::mem::size_of::<UffdioFill>() == 32);

/// What kind of mapping holds the registered range `[start, start + len)`, from one or two
/// userfaultfd ioctls whose checks the kernel makes before doing anything, O(log VMAs) each
/// (issue 41: on kernels without `PROCMAP_QUERY` the other way to know is reading all of
/// `/proc/self/maps`):
///
/// - `UFFDIO_CONTINUE` over the range answers `ENOENT` unless one registered VMA holds all of
///   it, then `EINVAL` unless that VMA is shmem (`MAP_SHARED` anonymous, memfd, tmpfs) or
///   hugetlbfs. On shmem it maps the range's pages that are in the page cache but not in our
///   page table, stopping at the first that is (`EEXIST`) or is not in the cache (`EFAULT`):
///   what a fault on them, or the registrar's pin right after a cache miss, does.
/// - then, only where `files` (the kernel offers `WP_ASYNC`, Linux 6.7+: any VMA can be
///   registered in write-protect mode), `UFFDIO_ZEROPAGE` of the first page answers `EINVAL`
///   unless the VMA is private anonymous memory (or shmem, excluded above); on anonymous memory
///   it maps the zero page there if nothing is mapped (`EEXIST` otherwise), as a read fault
///   would. Without `WP_ASYNC` the kernel registers only anonymous, shmem and hugetlbfs VMAs
///   (`vma_can_userfault`, every mode, any context), so `CONTINUE`'s `EINVAL` already means
///   private anonymous: one ioctl (Linux 6.0 to 6.6, Debian 12's 6.1).
///
/// `shared`: `Some(true)` for shmem, hugetlbfs or another file (shared, or maybe so),
/// `Some(false)` for one private anonymous VMA, `None` when not known (several VMAs, a changing
/// address space, an older kernel): the caller looks another way. `one_vma`: the kernel got past
/// its range check, so one VMA registered with a userfaultfd context held the whole range when it
/// looked: for a range this context had just watched, the range is still mapped, with no hole
/// (`Watcher::covering`). Only answers the kernel gives after that check count (`EINVAL`, and
/// shmem's `EEXIST`, `EFAULT` or success); `ENOMEM` (Linux 6.10+ prepares the anonymous VMA
/// before it looks at the range's end) and the rest do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) shared: Option<bool>,
    pub(crate) one_vma: bool,
}

pub(crate) fn anonymous_probe(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    page: u64,
    files: bool,
) -> Probe {
    let fill = |request, len| {
        let mut arg = UffdioFill {
            range: UffdioRange { start, len },
            mode: 1, // DONTWAKE: there is nobody to wake
            done: 0,
        };
        // SAFETY: both ioctls read and write one struct of this layout, which `arg` is.
        let r = unsafe {
            ioctl(
                fd.as_raw_fd(),
                request,
                (&mut arg as *mut UffdioFill).cast(),
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    };
    let answer = |shared, one_vma| Probe { shared, one_vma };
    match fill(UFFDIO_CONTINUE, len) {
        // Neither shmem nor hugetlbfs: private anonymous where nothing else registers.
        Err(libc::EINVAL) if !files => return answer(Some(false), true),
        Err(libc::EINVAL) => {}
        // It went on to the pages: shmem or hugetlbfs.
        Ok(()) | Err(libc::EEXIST | libc::EFAULT) => return answer(Some(true), true),
        // Not one registered VMA, mmap_changing, no UFFDIO_CONTINUE (Linux < 5.13), ...
        Err(libc::ENOENT | libc::EAGAIN | libc::ENOTTY | libc::ENOSYS | libc::ESRCH) => {
            return answer(None, false)
        }
        // Anything else: maybe shared, and nothing proved about the range.
        Err(_) => return answer(Some(true), false),
    }
    let shared = match fill(UFFDIO_ZEROPAGE, page) {
        Ok(()) | Err(libc::EEXIST) => Some(false),
        Err(libc::EINVAL) => Some(true),
        Err(_) => None,
    };
    answer(shared, true)
}

/// `ioctl(2)` as a raw syscall, never through the `ioctl` symbol: a library that interposes
/// `ioctl` (the 2010 compat preload does) must not see the context's own requests, whatever it
/// believes the fd number to be.
///
/// # Safety
/// `arg` must be what `request` expects on `fd`.
unsafe fn ioctl(fd: libc::c_int, request: libc::c_ulong, arg: *mut libc::c_void) -> libc::c_long {
    // SAFETY: (caller) `arg` matches `request`; the kernel validates `fd`.
    unsafe { libc::syscall(libc::SYS_ioctl, fd, request, arg) }
}

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `userfaultfd(flags)`: a new, not yet initialised context.
///
/// # References
/// - `userfaultfd(2)`
pub(crate) fn userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: the syscall takes one integer argument and returns a new fd or -1.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    // SAFETY: the kernel just returned this fd to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `ioctl(/dev/userfaultfd, USERFAULTFD_IOC_NEW, flags)`: the device path to a new context.
pub(crate) fn userfaultfd_dev(flags: libc::c_int) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")?;
    // SAFETY: USERFAULTFD_IOC_NEW takes an integer argument and returns a new fd or -1.
    let fd = cvt(unsafe {
        ioctl(
            dev.as_raw_fd(),
            USERFAULTFD_IOC_NEW,
            flags as libc::c_long as *mut libc::c_void,
        )
    })?;
    // SAFETY: the kernel just returned this fd to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `UFFDIO_API`: the handshake; returns the features and ioctls the kernel grants.
/// May be issued once per context (a second call is `EINVAL`).
pub(crate) fn api(fd: BorrowedFd<'_>, features: u64) -> io::Result<UffdioApi> {
    let mut arg = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes exactly one `struct uffdio_api`, which `arg` is.
    cvt(unsafe {
        ioctl(
            fd.as_raw_fd(),
            UFFDIO_API,
            (&mut arg as *mut UffdioApi).cast(),
        )
    })?;
    Ok(arg)
}

/// `UFFDIO_REGISTER` of `[start, start + len)` in write-protect mode.
pub(crate) fn register_wp(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut arg = UffdioRegister {
        range: UffdioRange { start, len },
        mode: REGISTER_MODE_WP,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`, which `arg` is. It
    // changes no memory of ours: it only marks the VMAs in the range.
    cvt(timed(Call::Register, || unsafe {
        ioctl(
            fd.as_raw_fd(),
            UFFDIO_REGISTER,
            (&mut arg as *mut UffdioRegister).cast(),
        )
    }))?;
    Ok(())
}

/// `UFFDIO_UNREGISTER` of `[start, start + len)`.
pub(crate) fn unregister(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut arg = UffdioRange { start, len };
    // SAFETY: UFFDIO_UNREGISTER reads one `struct uffdio_range`, which `arg` is.
    cvt(unsafe {
        ioctl(
            fd.as_raw_fd(),
            UFFDIO_UNREGISTER,
            (&mut arg as *mut UffdioRange).cast(),
        )
    })?;
    Ok(())
}

/// Reads at most one message. `Ok(None)` when none is queued (the fd is non-blocking).
///
/// This is on the event path: no allocation, the buffer is the caller's. A raw syscall, never the
/// `read` symbol: a preload that interposes `read` (the 2010 compat layer) must never run on the
/// event path, and a stale idea of what this fd number is could make it block there.
pub(crate) fn read_one(fd: BorrowedFd<'_>, msg: &mut UffdMsg) -> io::Result<Option<()>> {
    // SAFETY: `msg` is 32 writable bytes, and we ask for at most 32.
    let n = unsafe {
        libc::syscall(
            libc::SYS_read,
            fd.as_raw_fd(),
            (msg as *mut UffdMsg).cast::<libc::c_void>(),
            std::mem::size_of::<UffdMsg>(),
        )
    };
    if n == -1 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    if n as usize != std::mem::size_of::<UffdMsg>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short userfaultfd message",
        ));
    }
    Ok(Some(()))
}
