//! The hooks: what each intercepted syscall invalidates, before and after it runs.
//!
//! Each hook is entered from a patched site with the syscall's six arguments, and returns the
//! raw result (`-errno` on failure) for glibc's code after the site to handle. Every hook:
//! 1. works out the page ranges the call may change (nothing for calls that change no mapping:
//!    `mmap` without `MAP_FIXED`, `madvise` advice that keeps the pages, a growing `brk`);
//! 2. invalidates the regions registered on them, in this thread ([`super::invalidate`]);
//! 3. makes the syscall itself (`syscall` instruction: nothing patched is re-entered);
//! 4. invalidates the same ranges again, for regions registered while the call ran.
//!
//! Rules (guarantee 4): these functions are entered from inside malloc/free (with an arena lock
//! held), from thread exit, and from signal handlers. They never allocate, never take a lock
//! but a notifier's index lock (which no thread holds while it could unmap, allocate, or take a
//! signal), never call a patched function, and never panic (`extern "C"`: a panic would abort;
//! address arithmetic on the caller's arguments is checked or wrapping, so bad arguments reach
//! the kernel and get its error, as without the hooks).
#![allow(unsafe_code)] // Raw syscalls and the hooks' C ABI.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::patch::Target;
use super::{invalidate, maybe_watched};
use crate::backend::syscalls::drops_pages;
use crate::sys::SignalsBlocked;

const PAGE: u64 = 4096;

/// The raw `syscall` instruction (never through libc, which is what we patched).
///
/// # Safety
/// As for the syscall `nr` with these arguments.
#[inline(always)]
pub(super) unsafe fn syscall6(nr: u64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the caller's contract; `syscall` clobbers rcx and r11 only.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as i64 => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// `[addr, addr + len)` rounded out to pages; `None` when empty or wrapping.
pub(in crate::backend) fn pages(addr: u64, len: u64) -> Option<(u64, u64)> {
    let end = addr.checked_add(len)?.checked_add(PAGE - 1)? & !(PAGE - 1);
    let start = addr & !(PAGE - 1);
    (end > start).then_some((start, end))
}

/// Up to two ranges a call may change (mremap: the old range and the destination).
pub(in crate::backend) type Ranges = [Option<(u64, u64)>; 2];

/// Steps 2–4 around the raw syscall. When the filter says a range may be watched, every signal
/// stays blocked from before the first pass to after the second (two `rt_sigprocmask` calls for
/// the whole call; none of these syscalls waits for a signal): a handler must never run while
/// this thread holds an index lock, and one that unmaps runs its own hook after we are done.
fn around(ranges: Ranges, unmap: bool, nr: u64, a: [u64; 6]) -> i64 {
    let watched = |r: &Ranges| r.iter().flatten().any(|&(s, e)| maybe_watched(s, e));
    let pass = |r: &Ranges, again: bool| {
        for &(s, e) in r.iter().flatten() {
            if maybe_watched(s, e) {
                invalidate(s, e, unmap, again);
            }
        }
    };
    if !watched(&ranges) {
        // SAFETY: the caller's own syscall, with its own arguments: we only make it for them.
        let ret = unsafe { syscall6(nr, a) };
        if watched(&ranges) {
            // Registered while the call ran.
            let _blocked = SignalsBlocked::new();
            pass(&ranges, true);
        }
        return ret;
    }
    let _blocked = SignalsBlocked::new();
    pass(&ranges, false);
    // SAFETY: as above.
    let ret = unsafe { syscall6(nr, a) };
    pass(&ranges, true);
    ret
}

extern "C" fn munmap(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    let a = [a0, a1, a2, a3, a4, a5];
    around([pages(a0, a1), None], true, libc::SYS_munmap as u64, a)
}

extern "C" fn madvise(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    let a = [a0, a1, a2, a3, a4, a5];
    let r = if drops_pages(a2) { pages(a0, a1) } else { None };
    around([r, None], false, libc::SYS_madvise as u64, a)
}

/// What `mmap` with these arguments replaces: MAP_FIXED replaces whatever is there;
/// MAP_FIXED_NOREPLACE (without MAP_FIXED) never does.
pub(in crate::backend) fn mmap_range(a: [u64; 6]) -> Option<(u64, u64)> {
    if a[3] & libc::MAP_FIXED as u64 != 0 {
        pages(a[0], a[1])
    } else {
        None
    }
}

extern "C" fn mmap(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    let a = [a0, a1, a2, a3, a4, a5];
    around([mmap_range(a), None], true, libc::SYS_mmap as u64, a)
}

extern "C" fn mremap(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    let a = [a0, a1, a2, a3, a4, a5];
    around(mremap_ranges(a), true, libc::SYS_mremap as u64, a)
}

/// What `mremap` with these arguments may unmap or replace: the old range when it may move
/// (else its lost tail) and the `MREMAP_FIXED` destination.
pub(in crate::backend) fn mremap_ranges(a: [u64; 6]) -> Ranges {
    let (old, old_len, new_len, flags, new_addr) = (a[0], a[1], a[2], a[3], a[4]);
    let moves = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    // A call that may move takes the whole old range (conservative: a growth that turns out to
    // happen in place invalidates it too); one that may not only loses its tail.
    let old_part = if flags & moves as u64 != 0 {
        pages(old, old_len)
    } else if new_len < old_len {
        pages(old.wrapping_add(new_len), old_len - new_len)
    } else {
        None
    };
    let dest = if flags & libc::MREMAP_FIXED as u64 != 0 {
        pages(new_addr, new_len)
    } else {
        None
    };
    [old_part, dest]
}

/// glibc's `__curbrk` (the break as glibc last set it), found at install.
pub(super) static CURBRK: AtomicUsize = AtomicUsize::new(0);

extern "C" fn brk(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    let a = [a0, a1, a2, a3, a4, a5];
    let cell = CURBRK.load(Relaxed) as *const u64;
    // SAFETY: `cell` is glibc's `__curbrk` (a data symbol that lives as long as libc), read
    // here at the same point glibc's own brk would read it.
    let mut old = if cell.is_null() {
        0
    } else {
        unsafe { cell.read_volatile() }
    };
    if old == 0 && a0 != 0 {
        // SAFETY: brk(0) changes nothing and returns the current break.
        old = unsafe { syscall6(libc::SYS_brk as u64, [0; 6]) } as u64;
    }
    // Shrinking unmaps the pages between the new break and the old one.
    let up = |x: u64| x.checked_add(PAGE - 1).map(|x| x & !(PAGE - 1));
    let r = match (up(a0), up(old)) {
        (Some(start), Some(top)) if a0 != 0 && a0 < old => pages(start, top.saturating_sub(start)),
        _ => None,
    };
    around([r, None], true, libc::SYS_brk as u64, a)
}

extern "C" fn shmdt(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    let a = [a0, a1, a2, a3, a4, a5];
    let r = if super::any_sinks() {
        super::maps::attachment(a0)
    } else {
        None
    };
    around([r, None], true, libc::SYS_shmdt as u64, a)
}

/// `mprotect` is hooked for one reason: a library that is about to patch libc's code makes the
/// page writable first (UCX's memory hooks do, through libc's `mprotect`). A write permission on
/// a page of our sites means the hooks may soon be bypassed: before the call is made, every
/// notifier that sees libc's calls only through the hooks is killed (`Sink::hooks_overwritten`).
extern "C" fn mprotect(a0: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> i64 {
    count();
    if a2 & libc::PROT_WRITE as u64 != 0 && super::patch::touches_sites(a0, a1) {
        super::overwritten();
    }
    // SAFETY: the caller's own syscall with its own arguments.
    unsafe { syscall6(libc::SYS_mprotect as u64, [a0, a1, a2, a3, a4, a5]) }
}

/// How many calls went through a hook (tests use it to see that a path is hooked at all),
/// in 16 cache-line-padded shards picked by the caller's stack address, so that threads
/// unmapping at the same time do not fight over one line.
#[repr(align(64))]
struct Shard(AtomicUsize);
static CALLS: [Shard; 16] = [const { Shard(AtomicUsize::new(0)) }; 16];

fn count() {
    let here = 0u8;
    let at = std::ptr::addr_of!(here) as usize;
    CALLS[(at >> 21) & 15].0.fetch_add(1, Relaxed);
}

/// The sum of [`CALLS`].
pub(super) fn calls() -> usize {
    CALLS.iter().map(|s| s.0.load(Relaxed)).sum()
}

type Hook = extern "C" fn(u64, u64, u64, u64, u64, u64) -> i64;

fn target(name: &'static std::ffi::CStr, nr: libc::c_long, hook: Hook, required: bool) -> Target {
    Target {
        name,
        nr: nr as u32,
        hook: hook as usize,
        required,
    }
}

/// The functions patched, each at every site of its syscall. glibc's internal callers
/// (`free` → `__munmap`, `realloc` → `__mremap`, `malloc_trim` → `__madvise`/`__brk`,
/// `sbrk` → `__brk`, thread exit → `__madvise`, the stack cache → `__munmap`, non-main arenas
/// → `__mmap(MAP_FIXED)`) call these same bodies, so they are hooked too.
pub(super) fn targets() -> Vec<Target> {
    vec![
        target(c"munmap", libc::SYS_munmap, munmap, true),
        target(c"madvise", libc::SYS_madvise, madvise, true),
        target(c"posix_madvise", libc::SYS_madvise, madvise, false),
        target(c"mmap", libc::SYS_mmap, mmap, true),
        target(c"mremap", libc::SYS_mremap, mremap, true),
        target(c"brk", libc::SYS_brk, brk, true),
        target(c"shmdt", libc::SYS_shmdt, shmdt, false),
        target(c"mprotect", libc::SYS_mprotect, mprotect, false),
    ]
}
