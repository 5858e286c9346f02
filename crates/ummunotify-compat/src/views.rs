//! Counter views handed out by `mmap` of a device, and what a forked child sees in them.
//!
//! A view is a `MAP_SHARED` mapping of the notifier's counter memfd, so a forked child would go on
//! seeing the parent's live counter and could take "unchanged" for an answer about its own
//! memory. A `pthread_atfork` child handler therefore replaces every recorded view, in the child
//! only, by a private page that reads [`FORKED_COUNTER`](crate::abi::FORKED_COUNTER), which never
//! equals a LAST counter. Views are forgotten when the program unmaps them with `munmap` (which
//! this library interposes); the handler also checks, through `/proc/self/map_files`, that the
//! address still maps a memfd before replacing it. The table is a fixed array of atomics, and
//! the handler makes raw syscalls (`mmap`, `mprotect`, `readlink`), never the symbols this
//! library interposes: it neither allocates nor locks.
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use crate::abi::FORKED_COUNTER;

const MAX_VIEWS: usize = 256;

/// Start addresses of the views; each is exactly one page (`mmap` of a device maps at most one).
static VIEWS: [AtomicUsize; MAX_VIEWS] = [const { AtomicUsize::new(0) }; MAX_VIEWS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Remembers the one-page view at `addr`. A view beyond the table's capacity is not poisoned in
/// a child (documented limit: 256 live views).
pub(crate) fn record(addr: usize) {
    for v in &VIEWS {
        if v.compare_exchange(0, addr, SeqCst, SeqCst).is_ok() {
            COUNT.fetch_add(1, SeqCst);
            return;
        }
    }
}

/// Forgets views overlapping `[addr, addr + len)` (called before the real `munmap`).
#[inline]
pub(crate) fn forget(addr: usize, len: usize) {
    if COUNT.load(SeqCst) == 0 {
        return;
    }
    let end = addr.saturating_add(len);
    let page = page();
    for v in &VIEWS {
        let a = v.load(SeqCst);
        if a != 0 && a < end && addr < a + page && v.compare_exchange(a, 0, SeqCst, SeqCst).is_ok()
        {
            COUNT.fetch_sub(1, SeqCst);
        }
    }
}

/// A private page reading `FORKED_COUNTER`, for `mmap` of a device in a forked child.
pub(crate) fn map_poisoned(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
) -> Result<*mut c_void, i32> {
    if prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0 {
        return Err(libc::EACCES);
    }
    let fixed = flags & libc::MAP_FIXED;
    // SAFETY: an anonymous private mapping; MAP_FIXED only if the caller asked for it.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    } as *mut c_void;
    if p as isize <= -1 && p as isize >= -4095 {
        return Err(-(p as isize) as i32);
    }
    // SAFETY: `p` is a fresh read-write page-aligned mapping of at least 8 bytes.
    unsafe {
        (p as *mut u64).write_volatile(FORKED_COUNTER);
        libc::syscall(libc::SYS_mprotect, p, len, prot & !libc::PROT_WRITE);
    }
    Ok(p)
}

/// Whether `[addr, addr + len)` still maps a memfd (our counter), judged by
/// `/proc/self/map_files`. Unknown (no /proc, no permission) counts as yes.
fn still_ours(addr: usize, len: usize) -> bool {
    // "/proc/self/map_files/" + 2 * 16 hex digits + '-' + NUL fits in 64 bytes.
    let mut path = [0u8; 64];
    let prefix = b"/proc/self/map_files/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut i = prefix.len();
    i = hex(&mut path, i, addr);
    path[i] = b'-';
    i = hex(&mut path, i + 1, addr + len);
    path[i] = 0;
    let mut target = [0u8; 128];
    // SAFETY: NUL-terminated path and a local buffer of the given size.
    let n = unsafe {
        libc::syscall(
            libc::SYS_readlink,
            path.as_ptr(),
            target.as_mut_ptr(),
            target.len(),
        )
    };
    if n < 0 {
        // ENOENT: no mapping spans exactly this range any more.
        return n != -1 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT);
    }
    target[..n as usize].starts_with(b"/memfd:")
}

fn hex(buf: &mut [u8], mut i: usize, v: usize) -> usize {
    let digits = if v == 0 {
        1
    } else {
        (usize::BITS - v.leading_zeros()).div_ceil(4) as usize
    };
    for d in (0..digits).rev() {
        let nib = (v >> (4 * d)) & 0xf;
        buf[i] = b"0123456789abcdef"[nib];
        i += 1;
    }
    i
}

/// Replaces every recorded view (called by the crate's `pthread_atfork` child handler,
/// `crate::fork`): raw syscalls and atomics only.
pub(crate) fn poison_in_child() {
    let len = page();
    for v in &VIEWS {
        let addr = v.load(SeqCst);
        if addr == 0 || !still_ours(addr, len) {
            continue;
        }
        let _ = map_poisoned(
            addr as *mut c_void,
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
        );
    }
}
