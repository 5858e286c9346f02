//! The user ABI of this project's `/dev/ummunotify` module (`kernel/module/ummunotify.h`): the
//! 2010 ioctls and 32-byte records, plus ioctl 4 and the slot area of per-region validity words.
//!
//! Every call is a raw syscall, not libc's wrapper: the 2010 compat preload interposes `open`,
//! `read`, `ioctl` and `mmap` for the path `/dev/ummunotify`, and a notifier inside it must reach
//! the kernel's device, not the preload.
#![allow(unsafe_code)] // Raw syscalls on the device and its mapped pages.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Where the module lives.
pub(crate) const DEVICE: &CStr = c"/dev/ummunotify";
/// The module parameter that sizes the slot area (`max_regions` words).
pub(crate) const MAX_REGIONS_PARAM: &str = "/sys/module/ummunotify/parameters/max_regions";
/// mmap offset of the slot area (the counter page is at 0).
pub(crate) const SLOTS_OFFSET: u64 = 1 << 32;

pub(crate) const EVENT_TYPE_INVAL: u32 = 0;
pub(crate) const EVENT_TYPE_LAST: u32 = 1;
pub(crate) const EVENT_FLAG_HINT: u32 = 1;

/// `struct ummunotify_event`: one 32-byte record of `read()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawEvent {
    pub(crate) kind: u32,
    pub(crate) flags: u32,
    pub(crate) hint_start: u64,
    pub(crate) hint_end: u64,
    /// INVAL: the cookie; LAST: the counter.
    pub(crate) cookie_or_counter: u64,
}

/// `struct ummunotify_register_slot_ioctl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RegisterSlot {
    start: u64,
    end: u64,
    cookie: u64,
    flags: u32,
    slot: u32,
    generation: u64,
}

// _IOC(dir, 'U', nr, size) as <asm-generic/ioctl.h> builds it.
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | ((b'U' as u64) << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const UNREGISTER_REGION: u64 = ioc(IOC_WRITE, 3, 8);
const REGISTER_REGION_SLOT: u64 = ioc(
    IOC_READ | IOC_WRITE,
    4,
    std::mem::size_of::<RegisterSlot>() as u64,
);

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `openat(AT_FDCWD, "/dev/ummunotify", O_RDONLY | O_CLOEXEC)`.
pub(crate) fn open() -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path and integer flags; returns a new fd or -1.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            DEVICE.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: the fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `mmap(NULL, len, PROT_READ, MAP_SHARED, fd, offset)`.
pub(crate) fn map(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<usize> {
    // SAFETY: a fresh read-only shared mapping of the device chosen by the kernel; it touches no
    // existing memory.
    let p = cvt(unsafe {
        libc::syscall(
            libc::SYS_mmap,
            std::ptr::null_mut::<libc::c_void>(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset,
        )
    })?;
    Ok(p as usize)
}

/// `munmap` of a mapping made by [`map`].
pub(crate) fn unmap(addr: usize, len: usize) {
    // SAFETY: `addr, len` is a mapping this module made and nothing references any more.
    let _ = unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
}

/// `UMMUNOTIFY_REGISTER_REGION_SLOT`: `[start, end)` under `cookie`; returns `(slot, generation)`.
pub(crate) fn register(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    cookie: u64,
) -> io::Result<(u32, u64)> {
    let mut req = RegisterSlot {
        start,
        end,
        cookie,
        ..RegisterSlot::default()
    };
    // SAFETY: the ioctl reads and writes exactly one `RegisterSlot`, a live local.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            fd.as_raw_fd(),
            REGISTER_REGION_SLOT,
            &mut req as *mut RegisterSlot,
        )
    })?;
    Ok((req.slot, req.generation))
}

/// `UMMUNOTIFY_UNREGISTER_REGION` (drops a queued event of the region).
pub(crate) fn unregister(fd: BorrowedFd<'_>, cookie: u64) -> io::Result<()> {
    // SAFETY: the ioctl reads one u64, a live local.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            fd.as_raw_fd(),
            UNREGISTER_REGION,
            &cookie as *const u64,
        )
    })?;
    Ok(())
}

/// Non-blocking `read()` of records into `buf`: how many, 0 when none is queued (`EAGAIN`).
pub(crate) fn read(fd: BorrowedFd<'_>, buf: &mut [RawEvent]) -> io::Result<usize> {
    // The device's file is opened blocking (the 2010 default); poll first so read never blocks.
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, a live local; timeout 0.
    let n = cvt(unsafe { libc::syscall(libc::SYS_poll, &mut pfd as *mut libc::pollfd, 1, 0) })?;
    if pfd.revents & libc::POLLERR != 0 {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    if n == 0 || pfd.revents & libc::POLLIN == 0 {
        return Ok(0);
    }
    let bytes = std::mem::size_of_val(buf);
    // SAFETY: the kernel writes at most `bytes` bytes of whole records into `buf`.
    let got =
        cvt(unsafe { libc::syscall(libc::SYS_read, fd.as_raw_fd(), buf.as_mut_ptr(), bytes) })?;
    Ok(got as usize / std::mem::size_of::<RawEvent>())
}

/// The module's `max_regions` (the slot area's length in words).
pub(crate) fn max_regions() -> io::Result<usize> {
    let text = std::fs::read_to_string(MAX_REGIONS_PARAM)?;
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{MAX_REGIONS_PARAM}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes_and_numbers_match_the_header() {
        // kernel/module/ummunotify.h: 32-byte records, a 40-byte ioctl-4 argument.
        assert_eq!(std::mem::size_of::<RawEvent>(), 32);
        assert_eq!(std::mem::size_of::<RegisterSlot>(), 40);
        // _IOW('U', 3, __u64) and _IOWR('U', 4, struct ummunotify_register_slot_ioctl).
        assert_eq!(UNREGISTER_REGION, 0x4008_5503);
        assert_eq!(REGISTER_REGION_SLOT, 0xc028_5504);
    }
}
