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
//! queue, counter even: `Shared::invalidate_in_thread`), and again *after* it for regions
//! registered while the call ran. So once the call returns, every check sees the change, with
//! no monitor thread and no round trip; and a registration made during the call never stays
//! valid after it (the start/end pair userfaultfd's `REMOVE` lacks).
//!
//! # Free when unused (guarantee 3)
//! A global filter ([`maybe_watched`]) counts, per 64 KiB granule (hashed into 16,384
//! buckets), how many hooks notifiers watch pages there. A call on unwatched memory costs the
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
//! A `pthread_atfork` child handler empties the sink table, and the hook path also compares
//! `getpid()` with the process that published the sinks before it takes any lock: a child never
//! takes a lock a parent's thread held at fork time, and its own unmaps never touch the
//! parent's (poisoned) registrations.
//!
//! # What hooks can not see (shown as missed, never hidden)
//! Raw `syscall(SYS_munmap, ...)`, io_uring `IORING_OP_MADVISE`, `process_madvise`, ld.so's
//! own calls (`dlclose`), static binaries, and a call that was already past the patched
//! instruction when the hooks went in. x86-64 with a dynamic glibc only; elsewhere the backend
//! reports `Unsupported`.
#![allow(unsafe_code)] // The sink table hands raw `Shared` pointers to hooks.

#[cfg(target_arch = "x86_64")]
mod calls;
#[cfg(target_arch = "x86_64")]
mod maps;
#[cfg(target_arch = "x86_64")]
mod patch;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};

use crate::notifier::Shared;

// ---------------------------------------------------------------------------------------------
// The filter: which granules any hooks notifier watches.

const GRANULE_SHIFT: u32 = 16;
const BUCKETS: usize = 1 << 14;

static COUNTS: [AtomicU32; BUCKETS] = [const { AtomicU32::new(0) }; BUCKETS];
/// Sum of `COUNTS`: zero means nothing is watched anywhere (the one-load fast path).
static WATCHED: AtomicUsize = AtomicUsize::new(0);

fn bucket(granule: u64) -> &'static AtomicU32 {
    &COUNTS[granule as usize & (BUCKETS - 1)]
}

/// Whether a hooks notifier may watch a page of `[start, end)` (false positives possible, no
/// false negatives). SeqCst loads pair with the SeqCst increments of [`Watch::watch`]: a
/// registration that the load misses came after the syscall, and its own check that the pages
/// are mapped runs after the change (see `docs/ARCHITECTURE.md`, "The hooks backend").
#[inline]
pub(crate) fn maybe_watched(start: u64, end: u64) -> bool {
    if WATCHED.load(SeqCst) == 0 {
        return false;
    }
    let (g0, g1) = (start >> GRANULE_SHIFT, (end - 1) >> GRANULE_SHIFT);
    if g1 - g0 >= BUCKETS as u64 {
        return true;
    }
    (g0..=g1).any(|g| bucket(g).load(SeqCst) != 0)
}

/// The pages one hooks notifier watches, kept in the filter. User threads only (under the
/// notifier's registry lock); may allocate.
pub(crate) struct Watch {
    inner: Mutex<Pages>,
}

#[derive(Default)]
struct Pages {
    /// Disjoint, non-adjacent `[start, end)` page ranges.
    ranges: BTreeMap<u64, u64>,
    /// Granules holding a watched page (each counted once in `COUNTS`).
    granules: BTreeSet<u64>,
}

impl Pages {
    fn insert(&mut self, mut s: u64, mut e: u64) {
        let hit: Vec<(u64, u64)> = self
            .ranges
            .range(..=e)
            .rev()
            .take_while(|(_, &re)| re >= s)
            .map(|(&k, &v)| (k, v))
            .collect();
        for (k, v) in hit {
            self.ranges.remove(&k);
            s = s.min(k);
            e = e.max(v);
        }
        self.ranges.insert(s, e);
    }

    fn remove(&mut self, s: u64, e: u64) {
        let hit: Vec<(u64, u64)> = self
            .ranges
            .range(..e)
            .rev()
            .take_while(|(_, &re)| re > s)
            .map(|(&k, &v)| (k, v))
            .collect();
        for (k, v) in hit {
            self.ranges.remove(&k);
            if k < s {
                self.ranges.insert(k, s);
            }
            if v > e {
                self.ranges.insert(e, v);
            }
        }
    }

    fn overlaps(&self, s: u64, e: u64) -> bool {
        self.ranges
            .range(..e)
            .next_back()
            .is_some_and(|(_, &re)| re > s)
    }

    /// Brings the filter up to date for the granules of `[s, e)`.
    fn sync(&mut self, s: u64, e: u64) {
        for g in s >> GRANULE_SHIFT..=(e - 1) >> GRANULE_SHIFT {
            let has = self.overlaps(g << GRANULE_SHIFT, (g + 1) << GRANULE_SHIFT);
            if has && self.granules.insert(g) {
                bucket(g).fetch_add(1, SeqCst);
                WATCHED.fetch_add(1, SeqCst);
            } else if !has && self.granules.remove(&g) {
                bucket(g).fetch_sub(1, SeqCst);
                WATCHED.fetch_sub(1, SeqCst);
            }
        }
    }
}

impl Watch {
    pub(crate) fn new() -> Watch {
        Watch {
            inner: Mutex::new(Pages::default()),
        }
    }

    /// Watches `[start, end)` (page aligned, idempotent): the filter says "maybe" for it from
    /// now on (SeqCst, before the caller's check that the pages are still mapped).
    pub(crate) fn watch(&self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        p.insert(start, end);
        p.sync(start, end);
    }

    /// Stops watching `[start, end)`.
    pub(crate) fn unwatch(&self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        p.remove(start, end);
        p.sync(start, end);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let p = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        for &g in &p.granules {
            bucket(g).fetch_sub(1, SeqCst);
            WATCHED.fetch_sub(1, SeqCst);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The sinks: the notifiers hooks deliver to.

const MAX_SINKS: usize = 64;
static SINKS: [AtomicPtr<Shared>; MAX_SINKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SINKS];
/// Hooks using slot `i` right now.
static USERS: [AtomicUsize; MAX_SINKS] = [const { AtomicUsize::new(0) }; MAX_SINKS];
/// Slots ever used (the hooks scan `0..HIGH`).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// The process that published the sinks (a forked child has another pid).
static OWNER: AtomicI32 = AtomicI32::new(0);

fn getpid_raw() -> i32 {
    // SAFETY: getpid has no preconditions; libc's wrapper is not patched.
    unsafe { libc::getpid() }
}

pub(crate) fn any_sinks() -> bool {
    WATCHED.load(SeqCst) != 0
}

/// Invalidates `[start, end)` in every hooks notifier of this process, in the calling thread.
/// Hook path: see the module rules.
pub(crate) fn invalidate(start: u64, end: u64, unmap: bool, again: bool) {
    if OWNER.load(Relaxed) != getpid_raw() {
        return; // a forked child: its registrations are poisoned, and locks may be held
    }
    let high = HIGH.load(Acquire).min(MAX_SINKS);
    for i in 0..high {
        if SINKS[i].load(Relaxed).is_null() {
            continue;
        }
        USERS[i].fetch_add(1, SeqCst);
        let p = SINKS[i].load(SeqCst);
        if !p.is_null() {
            // SAFETY: a non-null slot is a live `Shared`: `Sink::drop` clears the slot and then
            // waits until `USERS[i]` is zero before releasing it, and our increment (SeqCst)
            // came before this load.
            unsafe { (*p).invalidate_in_thread(start, end, unmap, again) };
        }
        USERS[i].fetch_sub(1, SeqCst);
    }
}

extern "C" fn forget_sinks_in_child() {
    for (s, u) in SINKS.iter().zip(&USERS) {
        s.store(std::ptr::null_mut(), SeqCst);
        u.store(0, SeqCst);
    }
}

/// A notifier's place in the sink table; leaving it waits for hooks still inside.
pub(crate) struct Sink {
    slot: usize,
    shared: Option<Arc<Shared>>,
}

impl Sink {
    /// Publishes `shared` to the hooks. `None` when the table is full.
    pub(crate) fn publish(shared: Arc<Shared>) -> Option<Sink> {
        static ATFORK: std::sync::Once = std::sync::Once::new();
        ATFORK.call_once(|| {
            // SAFETY: registers an async-signal-safe handler that lives for the process.
            unsafe { libc::pthread_atfork(None, None, Some(forget_sinks_in_child)) };
        });
        OWNER.store(getpid_raw(), SeqCst);
        let ptr = Arc::as_ptr(&shared) as *mut Shared;
        let slot = SINKS.iter().position(|s| {
            s.compare_exchange(std::ptr::null_mut(), ptr, SeqCst, SeqCst)
                .is_ok()
        })?;
        HIGH.fetch_max(slot + 1, SeqCst);
        Some(Sink {
            slot,
            shared: Some(shared),
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        SINKS[self.slot].store(std::ptr::null_mut(), SeqCst);
        while USERS[self.slot].load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        drop(self.shared.take());
    }
}

// ---------------------------------------------------------------------------------------------
// Installing.

/// What installing found: the patched sites and notes, or why it can not be done.
pub(crate) type Installed = Result<String, String>;

/// Patches libc once per process; later calls return the first result.
pub(crate) fn install() -> &'static Installed {
    static DONE: OnceLock<Installed> = OnceLock::new();
    DONE.get_or_init(install_now)
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
    return calls::CALLS.load(Relaxed);
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

    #[test]
    fn page_sets_merge_and_split() {
        let mut p = Pages::default();
        p.insert(0x1000, 0x3000);
        p.insert(0x3000, 0x5000);
        assert_eq!(p.ranges.len(), 1);
        p.remove(0x2000, 0x4000);
        assert_eq!(
            p.ranges.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            vec![(0x1000, 0x2000), (0x4000, 0x5000)]
        );
        assert!(p.overlaps(0x1fff, 0x2001));
        assert!(!p.overlaps(0x2000, 0x4000));
    }
}
