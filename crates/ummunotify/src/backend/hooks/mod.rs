//! The hooks backend: libc's unmapping calls intercepted in the calling thread, for processes
//! where userfaultfd is denied (containers' seccomp profiles) or unavailable.
//!
//! # Mechanism: patching glibc's syscall sites
//! Every function of glibc that changes mappings is patched *in libc's own text*, at the
//! `mov $NR, %eax; syscall` pair inside it ([`patch`]): the `mov` becomes a jump to a stub
//! that calls our hook with the syscall's arguments, and the hook makes the syscall itself.
//! Because the body is patched rather than a symbol binding, every caller reaches the hook:
//! the program's PLT calls, glibc's *internal* calls to its hidden `__munmap`, `__mremap`,
//! `__madvise`, `__mmap`, `__brk` (from `free`, `realloc`, `malloc_trim`, `sbrk`, thread-stack
//! release, arena shrinking), and libraries `dlopen`ed later. Rewriting GOT entries of every
//! loaded object (the other choice, UCX's "reloc" mode) misses all of glibc's internal calls,
//! which is where `free()` unmaps memory (KERNEL-FACTS, "Interposition"), and needs a
//! `dlopen` hook to catch later objects. UCX's "bistro" mode patches function entries; patching
//! the syscall site instead means (1) the replaced bytes are always one whole 5-byte
//! instruction, so no thread can be part-way through them while they change (at an entry, a
//! 5-byte jump usually covers the first two or three instructions), and (2) glibc's own code
//! still runs around the syscall: it sets `errno` and keeps `__curbrk` right for `brk`/`sbrk`.
//!
//! # Visibility rule (guarantee 1)
//! A hook invalidates the registered regions on the affected pages *in the calling thread,
//! before the syscall*, through the notifier's usual path (index lock, counter odd, `INVALID`,
//! queue, counter even: `Sink::invalidate_in_thread`), and again *after* it for regions
//! registered while the call ran. So once the call returns, every check sees the change, with
//! no monitor thread and no round trip; and a registration made during the call never stays
//! valid after it (the start/end pair userfaultfd's `REMOVE` lacks).
//!
//! # Free when unused (guarantee 3)
//! A global filter ([`filter`]) holds a bit per watched page (16-bit masks in 16,384 buckets,
//! one per 64 KiB granule, aliasing only 1 GiB apart). A call on unwatched memory costs the
//! filter's loads and the raw syscall; it takes no lock, blocks no signal, and leaves the
//! generation counter alone (a cache's fast path is not disturbed by unrelated unmaps).
//!
//! # Rules of the hook path (guarantee 4)
//! Hooks run inside malloc and free (arena locks held), at thread exit and in signal handlers.
//! They never allocate, never call a patched function (raw `syscall` instructions only), and
//! take only a notifier's index lock, with every signal blocked while it is held; user threads
//! hold that lock only for short sections that never unmap, allocate or take a signal, so the
//! lock is never held by a thread that could be waiting in a hook (no self-deadlock from a
//! signal handler either). A notifier leaves the sink table and waits for hooks still using it
//! before it is freed.
//!
//! # Fork (guarantee 6)
//! A `pthread_atfork` child handler empties the sink table, and the hook path also checks that
//! it runs in the process that published the sinks before it takes any lock (a child forked by
//! a raw syscall runs no handler): a child never takes a lock a parent's thread held at fork
//! time, and its own unmaps never touch the parent's (poisoned) registrations. The check is one
//! load of a word in a page mapped `MADV_WIPEONFORK`, which the kernel hands any forked child
//! zeroed ([`in_publisher`]; a `getpid()` per pass, two syscalls per hooked call, where that
//! page can not be made). The prepare handler waits for an install in progress and
//! takes the filter's lock, released on both sides, so a child can start hooks notifiers of its
//! own however the parent's threads were placed at fork.
//!
//! # What hooks can not see (shown as missed, never hidden)
//! Raw `syscall(SYS_munmap, ...)`, io_uring `IORING_OP_MADVISE`, `process_madvise`, ld.so's
//! own calls (`dlclose`), static binaries, and a call that was already past the patched
//! instruction when the hooks went in. x86-64 with a dynamic glibc only; elsewhere the backend
//! reports `Unsupported`.
//!
//! # Cost
//! Installing is permanent. From then on every hooked libc call pays the stub, a sharded call
//! counter and the filter's loads (tens of ns); one on watched pages also two `rt_sigprocmask`
//! calls and the index lock twice (no `getpid`: see "Fork") (`umn bench --backends`: about 1.5× an
//! unregistered munmap).
#![allow(unsafe_code)] // The sink table hands raw pointers to hooks.

#[cfg(target_arch = "x86_64")]
pub(in crate::backend) mod calls;
mod filter;
#[cfg(target_arch = "x86_64")]
mod maps;
#[cfg(target_arch = "x86_64")]
mod patch;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32};
use std::sync::{Arc, OnceLock};

pub(crate) use filter::{maybe_watched, Watch};

use super::table::{Place, SinkTable};
use super::{Delivery, Watcher};
use crate::sink::Sink;

/// The hooks backend of one notifier: its pages in the global filter.
///
/// Visibility rule: in the calling thread, before calling through (and again after).
struct HooksWatcher {
    watch: Watch,
}

/// A hooks [`Watcher`] (the hooks must be installed: [`install`]).
pub(crate) fn watcher() -> Box<dyn Watcher> {
    Box::new(HooksWatcher {
        watch: Watch::new(),
    })
}

impl Watcher for HooksWatcher {
    fn watch(&self, start: u64, end: u64) -> crate::Result<()> {
        // A patcher that wrote over a site without our `mprotect` hook seeing it (a raw syscall,
        // /proc/self/mem) is found here at the latest.
        if !intact() {
            return Err(crate::Error::Unsupported(crate::Unsupported::Hooks {
                reason: OVERWRITTEN_REASON.into(),
            }));
        }
        self.watch.watch(start, end);
        Ok(())
    }

    fn unwatch(&self, start: u64, end: u64) {
        self.watch.unwatch(start, end);
    }

    fn splits_vmas(&self) -> bool {
        // The filter is ours: watching splits no VMA, so the watch policy never widens.
        false
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        publish(sink)
    }

    fn stopped_because(&self) -> Option<crate::Unsupported> {
        OVERWRITTEN.load(SeqCst).then(|| crate::Unsupported::Hooks {
            reason: OVERWRITTEN_REASON.into(),
        })
    }
}

/// Hands `sink` to the hooks (every hooked call on its watched pages calls its
/// `invalidate_in_thread`) until the returned delivery stops.
pub(crate) fn publish(sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
    let p = Published::publish(sink).ok_or(crate::Error::Os {
        op: "hooks registration",
        source: std::io::Error::other("too many live hooks notifiers in this process"),
    })?;
    Ok(Box::new(p))
}

// ---------------------------------------------------------------------------------------------
// The sinks: the notifiers hooks deliver to.

/// The hooks notifiers of the process.
static SINKS: SinkTable<64> = SinkTable::new();
/// The process that published the sinks (a forked child has another pid).
static OWNER: AtomicI32 = AtomicI32::new(0);
/// 1 (in a page of its own, `MADV_WIPEONFORK`) in the process that published the sinks; the
/// kernel gives every child forked from it a zero page there. Null until the first publish, or
/// if the page could not be made.
static PUBLISHER: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());

fn getpid_raw() -> i32 {
    // SAFETY: getpid has no preconditions; libc's wrapper is not patched.
    unsafe { libc::getpid() }
}

/// Whether this process published the sinks (false in a forked child). Hook path: one load.
#[inline]
fn in_publisher() -> bool {
    let w = PUBLISHER.load(Acquire);
    if w.is_null() {
        return OWNER.load(Relaxed) == getpid_raw();
    }
    // SAFETY: a non-null PUBLISHER is a page mapped once and never unmapped.
    unsafe { (*w).load(Relaxed) != 0 }
}

/// Marks this process as the publisher (called by every publish, so a child that starts hooks
/// notifiers of its own marks its zeroed copy of the page again).
fn mark_publisher() {
    OWNER.store(getpid_raw(), SeqCst);
    static PAGE: OnceLock<usize> = OnceLock::new();
    let page = *PAGE.get_or_init(|| {
        // SAFETY: a new private page at an address the kernel chooses; kept for the process's
        // life.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return 0;
            }
            if libc::madvise(p, 4096, libc::MADV_WIPEONFORK) != 0 {
                libc::munmap(p, 4096);
                return 0;
            }
            p as usize
        }
    });
    if page != 0 {
        let w = page as *mut AtomicU32;
        // SAFETY: the page is mapped read-write for the process's life.
        unsafe { (*w).store(1, SeqCst) };
        PUBLISHER.store(w, Release);
    }
}

pub(crate) fn any_sinks() -> bool {
    filter::any()
}

/// Invalidates `[start, end)` in every hooks notifier of this process, in the calling thread.
/// Hook path: see the module rules.
pub(crate) fn invalidate(start: u64, end: u64, unmap: bool, again: bool) {
    if !in_publisher() {
        return; // a forked child: its registrations are poisoned, and locks may be held
    }
    SINKS.for_each(|sink| sink.invalidate_in_thread(start, end, unmap, again));
}

/// Set once another library was seen writing into libc's code over the hooks.
static OVERWRITTEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Another library is rewriting libc's code where our sites are (seen by the `mprotect` hook,
/// or by [`intact`] finding a site changed): every notifier that depends on the hooks alone is
/// killed, and no new one starts. Hook path: atomics and the sinks' `hooks_overwritten`.
pub(crate) fn overwritten() {
    OVERWRITTEN.store(true, SeqCst);
    if in_publisher() {
        SINKS.for_each(|sink| sink.hooks_overwritten());
    }
}

/// Whether the hooks are still in place: no other library made our sites writable or wrote over
/// them since they went in. A changed site is handled as [`overwritten`] first.
pub(crate) fn intact() -> bool {
    #[cfg(target_arch = "x86_64")]
    if !OVERWRITTEN.load(SeqCst) && !patch::intact() {
        overwritten();
    }
    !OVERWRITTEN.load(SeqCst)
}

/// Why the hooks can not serve a new notifier any more.
pub(crate) const OVERWRITTEN_REASON: &str =
    "another library is writing into libc's code over ummunotify's hooks (it made their page \
     writable, or changed a patched site; UCX's memory hooks do this when libucs loads after \
     ummunotify): hooks notifiers were stopped, every check of theirs fails; use the userfaultfd \
     or hybrid backend, or load that library first with its hooks off (UCX_MEM_EVENTS=n)";

extern "C" fn fork_prepare() {
    // An install in progress finishes first (the child would otherwise wait forever on it).
    while INSTALLING.load(SeqCst) {
        std::thread::yield_now();
    }
    filter::fork_prepare();
}

extern "C" fn fork_parent() {
    filter::fork_release();
}

static ATFORK: crate::fork::AtforkOnce = crate::fork::AtforkOnce::new();

extern "C" fn fork_child() {
    ATFORK.registered_in_child();
    SINKS.clear_in_child();
    filter::fork_release();
}

/// Registers the fork handlers once: prepare waits for an install and takes the filter's lock
/// (so the child never inherits either half done), parent and child release it, and the child
/// also empties the sink table. All async-signal-safe: atomics only.
pub(crate) fn guard_fork() {
    ATFORK.register(Some(fork_prepare), Some(fork_parent), Some(fork_child));
}

/// Set while [`install_now`] runs.
static INSTALLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A notifier's place in the sink table ([`Delivery`] of the hooks backend); leaving it waits
/// for hooks still inside.
struct Published(Option<Place>);

impl Published {
    /// Publishes `sink` to the hooks. `None` when the table is full.
    fn publish(sink: Arc<dyn Sink>) -> Option<Published> {
        guard_fork();
        mark_publisher();
        SINKS.publish(sink).map(|p| Published(Some(p)))
    }
}

impl Delivery for Published {
    fn stop(self: Box<Self>, _forked: bool) {
        // A forked child's table was emptied by `fork_child` (and its user counts zeroed):
        // dropping waits for nothing there either.
        drop(self);
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            SINKS.retire(p);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Installing.

/// What installing found: the patched sites and notes, or why it can not be done.
pub(crate) type Installed = Result<String, String>;

/// Patches libc once per process; later calls return the first result.
pub(crate) fn install() -> &'static Installed {
    static DONE: OnceLock<Installed> = OnceLock::new();
    guard_fork();
    DONE.get_or_init(|| {
        INSTALLING.store(true, SeqCst);
        let r = install_now();
        INSTALLING.store(false, SeqCst);
        r
    })
}

#[cfg(target_arch = "x86_64")]
fn install_now() -> Installed {
    // SAFETY: RTLD_DEFAULT lookup of a data symbol by a NUL-terminated name.
    let curbrk = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__curbrk".as_ptr()) };
    if curbrk.is_null() {
        return Err("glibc's __curbrk not found: not glibc?".into());
    }
    calls::CURBRK.store(curbrk as usize, SeqCst);
    let p = patch::install(&calls::targets())?;
    let mut names: Vec<&str> = p.sites.iter().map(|s| s.0).collect();
    names.dedup();
    let mut s = format!(
        "libc patched at {} syscall sites ({})",
        p.sites.len(),
        names.join(", ")
    );
    for n in &p.notes {
        s.push_str("; ");
        s.push_str(n);
    }
    Ok(s)
}

#[cfg(not(target_arch = "x86_64"))]
fn install_now() -> Installed {
    Err("the hooks backend patches x86-64 machine code; this is not x86-64".into())
}

/// Calls that went through a hook so far in this process (diagnostics and tests).
pub(crate) fn hooked_calls() -> usize {
    #[cfg(target_arch = "x86_64")]
    return calls::calls();
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// What `umn doctor` prints about the hooks backend.
pub(crate) fn probe() -> super::BackendReport {
    let status = match install() {
        Ok(s) => Ok(format!("ok: {s}")),
        Err(e) => Err(crate::Unsupported::Hooks { reason: e.clone() }),
    };
    super::BackendReport {
        name: "hooks",
        status,
        kernel_features: Vec::new(),
        notes: vec![
            "sees libc's munmap, mremap, madvise, mmap(MAP_FIXED), brk/sbrk, shmdt, and glibc's \
             internal calls (free, realloc, malloc_trim, thread exit), in the calling thread"
                .to_string(),
            "does not see raw syscalls, io_uring IORING_OP_MADVISE, process_madvise, ld.so's \
             own unmaps (dlclose), static binaries"
                .to_string(),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The publisher check is false in a child forked by a raw syscall (no `pthread_atfork`
    /// handler runs there), true again once the child publishes, and never a `getpid`.
    #[test]
    fn a_raw_forked_child_is_not_the_publisher() {
        mark_publisher();
        assert!(!PUBLISHER.load(Acquire).is_null(), "MADV_WIPEONFORK page");
        assert!(in_publisher());
        // SAFETY: the child only loads atomics and exits with `_exit`.
        let pid = unsafe { libc::syscall(libc::SYS_fork) };
        if pid == 0 {
            let first = in_publisher();
            mark_publisher();
            let code = if first {
                1
            } else if in_publisher() {
                0
            } else {
                2
            };
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(
            unsafe { libc::waitpid(pid as i32, &mut status, 0) },
            pid as i32
        );
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "1: the child took itself for the publisher; 2: publishing did not mark it"
        );
        assert!(in_publisher(), "the parent is still the publisher");
    }
}
