//! Per-thread cache state: hazard slots (which entries this thread's handles hold), a tiny MRU of
//! entries with the snapshots that validate it, and a hit counter. The owning thread is the only
//! writer of everything except the hazards, which any thread holding a handle may clear.
#![allow(unsafe_code)] // Thread-owned state in an UnsafeCell, reached through a thread-local pointer.

use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64};
use std::sync::{Arc, Mutex};

use crate::Region;

/// Hazard slots per thread: handles a thread can hold at once before falling back to a shared
/// count on the entry.
pub(super) const HAZARDS: usize = 8;
const _: () = assert!(HAZARDS.is_power_of_two());
/// Entries remembered per thread.
pub(super) const MRU: usize = 4;

/// An MRU line: enough to decide a hit without touching the entry.
#[derive(Clone, Copy)]
pub(super) struct Mru {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) entry: *const (),
    pub(super) token: Region,
}

const EMPTY: Mru = Mru {
    start: 0,
    end: 0,
    entry: std::ptr::null(),
    token: Region {
        slot: u32::MAX,
        expected: 1,
    },
};

/// State only the owning thread reads or writes.
pub(super) struct Owned {
    /// Notifier generation every MRU line was validated at (or after).
    pub(super) gen: u64,
    /// Cache epoch the MRU lines were in the index at.
    pub(super) epoch: u64,
    /// Most recently used first: line 0 is the one that hit last, at a fixed offset, so the hit
    /// path reads it without first loading an index.
    pub(super) mru: [Mru; MRU],
    hint: usize,
}

impl Owned {
    const fn new() -> Self {
        Owned {
            gen: u64::MAX,
            epoch: u64::MAX,
            mru: [EMPTY; MRU],
            hint: 0,
        }
    }

    #[inline(always)]
    pub(super) fn find(&mut self, start: usize, end: usize) -> Option<*const ()> {
        self.find_last(start, end)
            .or_else(|| self.find_other(start, end))
    }

    /// The line that hit last, if it covers the range.
    #[inline(always)]
    pub(super) fn find_last(&self, start: usize, end: usize) -> Option<*const ()> {
        let m = &self.mru[0];
        (m.start <= start && end <= m.end).then_some(m.entry)
    }

    /// Another line covering the range, moved to the front.
    fn find_other(&mut self, start: usize, end: usize) -> Option<*const ()> {
        let i = self
            .mru
            .iter()
            .position(|m| m.start <= start && end <= m.end)?;
        self.mru[..=i].rotate_right(1);
        Some(self.mru[0].entry)
    }

    pub(super) fn clear(&mut self) {
        self.mru = [EMPTY; MRU];
    }

    /// Drops the lines for which `keep` is false.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(Region) -> bool) {
        for m in &mut self.mru {
            if !m.entry.is_null() && !keep(m.token) {
                *m = EMPTY;
            }
        }
    }

    /// Puts `line` in front (dropping the least recently used), unless its entry has a line.
    pub(super) fn insert(&mut self, line: Mru) {
        if self.mru.iter().any(|m| m.entry == line.entry) {
            return;
        }
        self.mru.rotate_right(1);
        self.mru[0] = line;
    }
}

/// One thread's slot in a cache. Claimed by one live thread at a time; recycled after it exits.
#[repr(align(128))]
pub(super) struct ThreadSlot {
    pub(super) hazards: [AtomicPtr<()>; HAZARDS],
    hits: AtomicU64,
    pub(super) stripe: usize,
    claimed: AtomicBool,
    owned: UnsafeCell<Owned>,
}

// SAFETY: `owned` is touched only by the thread that claimed the slot (`claimed` CAS with Acquire,
// released with Release at thread exit); every other field is atomic or immutable.
unsafe impl Sync for ThreadSlot {}
// SAFETY: as above; the raw pointers in `owned` are plain addresses, never dereferenced without
// the hazard protocol of the cache.
unsafe impl Send for ThreadSlot {}

impl ThreadSlot {
    fn new(stripe: usize) -> Self {
        ThreadSlot {
            hazards: Default::default(),
            hits: AtomicU64::new(0),
            stripe,
            claimed: AtomicBool::new(true),
            owned: UnsafeCell::new(Owned::new()),
        }
    }

    /// The owner's state.
    ///
    /// # Safety
    /// Only the thread that claimed this slot may call this, and it must not keep two of the
    /// returned references alive at once.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(super) unsafe fn owned(&self) -> &mut Owned {
        // SAFETY: per the contract, the caller is the only thread touching `owned`, with no other
        // live reference.
        unsafe { &mut *self.owned.get() }
    }

    /// Publishes `entry` in a free hazard slot (owner only; see `owned`'s contract for `o`).
    #[inline(always)]
    pub(super) fn publish(&self, o: &mut Owned, entry: *const ()) -> Option<&AtomicPtr<()>> {
        let h = &self.hazards[o.hint & (HAZARDS - 1)];
        if h.load(Relaxed).is_null() {
            h.store(entry.cast_mut(), Relaxed);
            return Some(h);
        }
        for (i, h) in self.hazards.iter().enumerate() {
            // Only the owner turns null into non-null, so a null seen here stays ours.
            if h.load(Relaxed).is_null() {
                h.store(entry.cast_mut(), Relaxed);
                o.hint = i;
                return Some(h);
            }
        }
        None
    }

    /// Counts a hit (owner only: a plain load and store on the owner's line).
    #[inline(always)]
    pub(super) fn count_hit(&self) {
        self.hits.store(self.hits.load(Relaxed) + 1, Relaxed);
    }

    pub(super) fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    pub(super) fn holds(&self, entry: *const ()) -> bool {
        self.hazards
            .iter()
            .any(|h| std::ptr::eq(h.load(Acquire), entry))
    }
}

/// Thread-owned references to slots, released when the thread exits.
struct Claims(Vec<(u64, Arc<ThreadSlot>)>);

impl Drop for Claims {
    fn drop(&mut self) {
        last::set(0, std::ptr::null());
        for (_, slot) in self.0.drain(..) {
            slot.claimed.store(false, Release);
        }
    }
}

thread_local! {
    static CLAIMS: RefCell<Claims> = const { RefCell::new(Claims(Vec::new())) };
}

/// The slot of the cache this thread used last (cache id, slot): the hit path's one TLS load.
///
/// On x86-64 a thread-local word of the initial-exec model, defined and read in assembly: the
/// offset from the thread pointer is fixed when the object is loaded, so the read is two
/// instructions even in `libummunotify.so`, where `thread_local!` goes through a
/// `__tls_get_addr` call (general-dynamic model; a tenth of a C hit, and the call forced the
/// hit path to save six registers). glibc places initial-exec variables of a library loaded
/// with the program in the static TLS block, and those of a `dlopen`ed one in its reserved
/// surplus (16 bytes here).
#[cfg(target_arch = "x86_64")]
mod last {
    use super::ThreadSlot;

    std::arch::global_asm!(
        ".pushsection .tbss.ummunotify_cache_last,\"awT\",@nobits",
        ".p2align 4",
        ".globl ummunotify_cache_last",
        ".hidden ummunotify_cache_last",
        ".type ummunotify_cache_last,@object",
        ".size ummunotify_cache_last,16",
        "ummunotify_cache_last:",
        ".zero 16",
        ".popsection",
    );

    #[inline(always)]
    fn cell() -> *mut (u64, *const ThreadSlot) {
        let p: usize;
        // SAFETY: reads the thread pointer (%fs:0 holds its own address on x86-64 Linux) and
        // adds the variable's offset from the GOT: no memory is written.
        unsafe {
            std::arch::asm!(
                "mov {p}, qword ptr fs:[0]",
                "add {p}, qword ptr [rip + ummunotify_cache_last@GOTTPOFF]",
                p = out(reg) p,
                options(pure, readonly, nostack),
            );
        }
        p as *mut _
    }

    #[inline(always)]
    pub(super) fn get() -> (u64, *const ThreadSlot) {
        // SAFETY: this thread's own 16-byte, 16-aligned TLS word, only ever touched by it.
        unsafe { cell().read() }
    }

    pub(super) fn set(id: u64, slot: *const ThreadSlot) {
        // SAFETY: as in `get`.
        unsafe { cell().write((id, slot)) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod last {
    use super::ThreadSlot;
    use std::cell::Cell;

    thread_local! {
        static LAST: Cell<(u64, *const ThreadSlot)> = const { Cell::new((0, std::ptr::null())) };
    }

    #[inline(always)]
    pub(super) fn get() -> (u64, *const ThreadSlot) {
        LAST.with(Cell::get)
    }

    pub(super) fn set(id: u64, slot: *const ThreadSlot) {
        LAST.with(|l| l.set((id, slot)));
    }
}

/// The calling thread's slot in cache `id`, if it has one and used that cache last.
#[inline(always)]
pub(super) fn current(id: u64) -> Option<*const ThreadSlot> {
    let (last, slot) = last::get();
    (last == id).then_some(slot)
}

/// The calling thread's slot in cache `id`, claiming one from `slots` (or adding one) if needed.
/// `None` while the thread is being torn down.
pub(super) fn claim(id: u64, slots: &Mutex<Vec<Arc<ThreadSlot>>>) -> Option<*const ThreadSlot> {
    CLAIMS
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            // Slots of dropped caches: only this thread still holds them.
            c.0.retain(|(_, s)| Arc::strong_count(s) > 1);
            if let Some((_, s)) = c.0.iter().find(|(i, _)| *i == id) {
                let p = Arc::as_ptr(s);
                last::set(id, p);
                return Some(p);
            }
            let slot = {
                let mut all = slots.lock().unwrap_or_else(|p| p.into_inner());
                let free = all.iter().find(|s| {
                    s.claimed
                        .compare_exchange(false, true, Acquire, Relaxed)
                        .is_ok()
                });
                match free {
                    Some(s) => {
                        let s = s.clone();
                        // SAFETY: the CAS above made this thread the slot's only owner.
                        *unsafe { s.owned() } = Owned::new();
                        s
                    }
                    None => {
                        let s = Arc::new(ThreadSlot::new(all.len()));
                        all.push(s.clone());
                        s
                    }
                }
            };
            let p = Arc::as_ptr(&slot);
            c.0.push((id, slot));
            last::set(id, p);
            Some(p)
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up entry address (never dereferenced).
    fn e(i: usize) -> Option<*const ()> {
        Some((i * 64) as *const ())
    }

    fn line(start: usize, entry: usize) -> Mru {
        Mru {
            start,
            end: start + 4096,
            entry: e(entry).unwrap(),
            token: Region {
                slot: entry as u32,
                expected: 2,
            },
        }
    }

    /// Line 0 is always the one that hit (or came in) last; a new line drops the least recently
    /// used one; the hit path's `find_last` sees only line 0.
    #[test]
    fn mru_keeps_the_last_hit_in_front_and_drops_the_least_recent() {
        let mut o = Owned::new();
        for i in 1..=MRU {
            o.insert(line(i << 20, i));
        }
        assert_eq!(o.find_last(MRU << 20, (MRU << 20) + 8), e(MRU));
        assert_eq!(o.find_last(1 << 20, (1 << 20) + 8), None, "not in front");
        assert_eq!(o.find(1 << 20, (1 << 20) + 8), e(1));
        assert_eq!(o.find_last(1 << 20, (1 << 20) + 8), e(1));
        // Least recently used now: 2 (1 was hit, MRU..3 came in after it).
        o.insert(line(99 << 20, 99));
        assert_eq!(o.find(2 << 20, (2 << 20) + 8), None, "the oldest line went");
        for i in [1, 3, 99] {
            assert_eq!(o.find(i << 20, (i << 20) + 8), e(i));
        }
        // A range no line covers whole, and an entry already present.
        assert_eq!(o.find(1 << 20, (1 << 20) + 8192), None);
        o.insert(line(5 << 20, 99));
        assert_eq!(o.find(5 << 20, (5 << 20) + 8), None, "one line per entry");
        o.retain(|t| t.slot != 99);
        assert_eq!(o.find(99 << 20, (99 << 20) + 8), None);
        o.clear();
        assert_eq!(o.find(1 << 20, (1 << 20) + 8), None);
    }
}
