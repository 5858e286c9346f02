//! errno, and copies to and from caller memory that fail with `EFAULT` instead of crashing (as
//! the kernel's `copy_from_user`/`copy_to_user` do).
use std::ffi::c_void;

/// Sets `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Copies `len` bytes at address `src` of this process into `dst`.
pub(crate) fn copy_from(dst: *mut u8, src: usize, len: usize) -> Result<(), i32> {
    let local = libc::iovec {
        iov_base: dst.cast::<c_void>(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: src as *mut c_void,
        iov_len: len,
    };
    // SAFETY: `local` is our own buffer of `len` bytes; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    finish(n, len, || {
        // SAFETY: fallback when process_vm_readv is unavailable (seccomp): the caller vouches
        // for `src` as the kernel's ioctl ABI assumes a valid user pointer.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) }
    })
}

/// Copies `len` bytes from `src` to address `dst` of this process.
pub(crate) fn copy_to(dst: usize, src: *const u8, len: usize) -> Result<(), i32> {
    let local = libc::iovec {
        iov_base: src.cast_mut().cast::<c_void>(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: dst as *mut c_void,
        iov_len: len,
    };
    // SAFETY: `local` is our own buffer of `len` bytes; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    finish(n, len, || {
        // SAFETY: as in `copy_from`.
        unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) }
    })
}

fn finish(n: isize, len: usize, fallback: impl FnOnce()) -> Result<(), i32> {
    if n == len as isize {
        return Ok(());
    }
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if n < 0 && (e == libc::ENOSYS || e == libc::EPERM) {
        fallback();
        return Ok(());
    }
    Err(libc::EFAULT)
}

/// Copies a plain-data value from caller memory.
pub(crate) fn read_value<T: Copy + Default>(src: usize) -> Result<T, i32> {
    let mut v = T::default();
    copy_from((&mut v as *mut T).cast(), src, std::mem::size_of::<T>())?;
    Ok(v)
}

/// Copies a plain-data value to caller memory.
pub(crate) fn write_value<T: Copy>(dst: usize, v: &T) -> Result<(), i32> {
    copy_to(dst, (v as *const T).cast(), std::mem::size_of::<T>())
}
