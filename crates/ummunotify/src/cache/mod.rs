//! The registration cache: never hands out a registration whose memory changed, and costs a few
//! nanoseconds on a hit.
//!
//! [`Cache::get`] returns a [`Handle`] to a device registration (made by a [`Registrar`]) that
//! covers the requested range. On a miss it registers the range, rounded out to pages and merged
//! with overlapping (and, by default, adjacent) cached regions. A hit inside a larger region is a
//! hit. Every cached region is also registered with the cache's [`Notifier`], so:
//!
//! * a region whose memory was unmapped, remapped or zapped is **never returned again** once the
//!   call that changed it has returned, in any thread;
//! * a region invalidated (or evicted) while a handle holds it stays registered for that holder
//!   until the handle drops; it is deregistered afterwards;
//! * deregistration never runs on the notifier's monitor thread: it happens in the next cache call
//!   that takes the slow path, or in [`Cache::flush`], outside every lock the event path needs.
//!
//! # The hit path
//!
//! No global lock and no write to a shared cache line: the calling thread looks in its own MRU
//! (four entries), publishes the entry in one of its own hazard slots, then checks with one load
//! each that the notifier's generation and the cache's epoch are what its MRU was validated at.
//! Dropping the handle clears the hazard slot. An MRU miss looks the range up in a `BTreeMap`
//! under a striped reader lock where each thread locks only its own stripe. The orderings, and the
//! `membarrier(2)` asymmetric fence that keeps the hit path free of fences, are explained in
//! `docs/architecture/cache.md`, "Registration cache".
//!
//! # One notifier, shared with your own regions
//!
//! The cache owns its [`Notifier`] (a second notifier could not watch the same memory: the kernel
//! refuses overlapping userfaultfd registrations with `EBUSY`). Register your own regions on
//! [`Cache::notifier`] with cookies below `1 << 63` (the cache uses the upper half) and read
//! their events with [`Cache::take_events`]: the cache consumes the notifier's queue, keeps its
//! own events and hands yours back. Reading the notifier's events directly is safe too, but then
//! the cache notices its invalidated regions only when it looks them up (it still never returns
//! them, since it checks each region it finds).
//!
//! ```no_run
//! use ummunotify::cache::{Cache, Config};
//! use ummunotify::registrar::IoUringRegistrar;
//! use std::os::fd::AsFd;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cache = Cache::new(IoUringRegistrar::new(64)?, Config::default())?;
//! let file = std::fs::File::create("/tmp/out")?;
//! let buf = vec![7u8; 1 << 16];
//! let (addr, len) = (buf.as_ptr() as usize, buf.len());
//! {
//!     let reg = cache.get(addr, len)?; // miss: registers; later calls hit
//!     cache.registrar().write_fixed(reg.key(), addr, len, file.as_fd(), 0)?;
//! }
//! drop(buf); // free() unmaps the block: the region is invalidated before drop returns
//! println!("{:?}", cache.stats());
//! # Ok(()) }
//! ```
#![allow(unsafe_code)] // Hazard-protected raw pointers to entries on the lock-free hit path.

mod entry;
mod fence;
mod handle;
mod local;
mod lookup;
mod miss;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cookies::CookieMap;
use crate::registrar::Registrar;
use crate::{Event, Generation, Notifier};
use entry::Entry;
use local::{Mru, ThreadSlot};
use lookup::Lookup;
use miss::{walk, Seen};

pub use handle::Handle;

/// `get_fast` in full: every MRU line, and a pull backend's probe.
const FULL: bool = true;
/// `get_fast` as a leaf (no call, so no register saved on a hit): the line that hit last only,
/// and a miss on a pull backend.
const LEAF: bool = false;

/// Cookies of the cache's own notifier regions have this bit set.
pub const CACHE_COOKIE_BIT: u64 = 1 << 63;

static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// Limits and policy of a [`Cache`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Most regions kept cached (also capped by [`Registrar::max_registrations`]). Unused regions
    /// are evicted, least recently used first (CLOCK), to stay under it.
    pub max_regions: usize,
    /// Most bytes kept registered in cached regions; evicts like `max_regions`.
    pub max_bytes: usize,
    /// Merge a miss with cached regions that merely touch it (overlapping ones are always merged),
    /// as long as the union stays under [`Registrar::max_len`].
    pub merge_adjacent: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_regions: 1 << 16,
            max_bytes: usize::MAX,
            merge_adjacent: true,
        }
    }
}

impl Config {
    /// Sets [`max_regions`](Self::max_regions).
    pub fn max_regions(mut self, n: usize) -> Self {
        self.max_regions = n.max(1);
        self
    }
    /// Sets [`max_bytes`](Self::max_bytes).
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }
    /// Sets [`merge_adjacent`](Self::merge_adjacent).
    pub fn merge_adjacent(mut self, on: bool) -> Self {
        self.merge_adjacent = on;
        self
    }
}

/// Why [`Cache::get`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The notifier refused the range (empty, wrapping, unmapped, unsupported mapping) or is
    /// unusable (monitor dead, forked child).
    Notifier(crate::Error),
    /// The registrar refused the range.
    Register(io::Error),
    /// The memory kept changing while it was being registered.
    Unstable,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Notifier(e) => write!(f, "notifier: {e}"),
            Error::Register(e) => write!(f, "registrar: {e}"),
            Error::Unstable => write!(f, "the memory kept changing while it was being registered"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Notifier(e) => Some(e),
            Error::Register(e) => Some(e),
            Error::Unstable => None,
        }
    }
}

impl From<crate::Error> for Error {
    fn from(e: crate::Error) -> Self {
        Error::Notifier(e)
    }
}

/// Counters of a [`Cache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// `get` calls served by a cached region.
    pub hits: u64,
    /// `get` calls that registered a region.
    pub misses: u64,
    /// Regions dropped because their memory changed.
    pub invalidations: u64,
    /// Unused regions evicted to stay under the limits.
    pub evictions: u64,
    /// Cached regions absorbed into a larger one by a miss.
    pub merges: u64,
    /// Registrations released through the registrar.
    pub deregistrations: u64,
    /// Of those, how many the registrar reported an error for.
    pub deregister_errors: u64,
    /// Regions in the cache now.
    pub regions: usize,
    /// Regions out of the cache but still registered: held by a handle, or waiting for the next
    /// slow-path call or [`Cache::flush`].
    pub retired: usize,
    /// Bytes registered now (cached and retired regions).
    pub bytes_registered: usize,
}

/// State behind the miss lock (never taken on the hit path, nor by the notifier's monitor).
struct State<K> {
    by_cookie: CookieMap<Arc<Entry<K>>>,
    /// CLOCK order for eviction; may hold removed entries, skipped and compacted lazily.
    clock: VecDeque<Arc<Entry<K>>>,
    /// Out of the index, waiting for their holders.
    retired: Vec<Arc<Entry<K>>>,
    live_bytes: usize,
    /// Notifier generation up to which events were read.
    seen: Generation,
    /// Events of the user's own regions, read while looking for the cache's: at most one per
    /// cookie (a region hit again before its event was taken is merged, as the notifier merges),
    /// and cookies no longer registered are pruned when the map doubles, so it is bounded by
    /// twice the number of the user's regions.
    user_events: HashMap<u64, Event>,
    /// Size of `user_events` after its last pruning.
    user_events_pruned: usize,
}

/// A registration cache over a [`Registrar`], kept correct by a [`Notifier`].
///
/// See the [module documentation](self). `Cache` is `Send + Sync`; share it by reference or in an
/// `Arc`.
pub struct Cache<R: Registrar> {
    id: u64,
    /// The notifier's counter word (on its own page, which lives as long as `notifier`): saves
    /// the hit path two dependent loads through the notifier.
    counter: NonNull<AtomicU64>,
    epoch: Padded<AtomicU64>,
    notifier: Notifier,
    lookup: Lookup<R::Key>,
    registrar: R,
    state: Mutex<State<R::Key>>,
    threads: Mutex<Vec<Arc<ThreadSlot>>>,
    config: Config,
    seen: AtomicU64,
    retired: AtomicUsize,
    /// Retired regions taken out of `State::retired` to be deregistered, not deregistered yet
    /// (`reclaim` to `deregister`, which runs without the miss lock): still in the registrar's
    /// table, so counted against its limit with the retired ones.
    releasing: AtomicUsize,
    slow_hits: AtomicU64,
    misses: AtomicU64,
    invalidations: AtomicU64,
    evictions: AtomicU64,
    merges: AtomicU64,
    deregistrations: AtomicU64,
    deregister_errors: AtomicU64,
    regions: AtomicUsize,
    bytes: AtomicUsize,
    /// Misses registering outside the miss lock now: the regions and bytes they will add,
    /// reserved before the limits are checked (see `miss::Pending`).
    pending: miss::Pending,
    next_cookie: AtomicU64,
}

// SAFETY: `counter` is a shared reference in disguise (to an atomic in the notifier's counter
// page, owned through `notifier`); every other field is `Send + Sync` given the bounds.
unsafe impl<R: Registrar> Send for Cache<R> where R::Key: Send + Sync {}
// SAFETY: as above.
unsafe impl<R: Registrar> Sync for Cache<R> where R::Key: Send + Sync {}

#[repr(align(128))]
struct Padded<T>(T);

fn page_round(start: usize, end: usize) -> Option<Range<usize>> {
    let page = crate::sys::page_size();
    let s = start & !(page - 1);
    let e = end.checked_add(page - 1)? & !(page - 1);
    Some(s..e)
}

impl<R: Registrar> Cache<R> {
    /// A cache with its own new [`Notifier`].
    ///
    /// # Errors
    /// [`Error::Notifier`] if the notifier can not start (see [`Notifier::new`]).
    pub fn new(registrar: R, config: Config) -> Result<Self, Error> {
        Ok(Self::with_notifier(Notifier::new()?, registrar, config))
    }

    /// A cache over `notifier` (which it owns from now on; see the module documentation for
    /// registering your own regions on it).
    pub fn with_notifier(notifier: Notifier, registrar: R, mut config: Config) -> Self {
        fence::init();
        if let Some(n) = registrar.max_registrations() {
            config.max_regions = config.max_regions.min(n).max(1);
        }
        let seen = notifier.generation().unwrap_or(Generation(u64::MAX));
        Cache {
            id: NEXT_CACHE_ID.fetch_add(1, Relaxed),
            counter: NonNull::from(notifier.counter()),
            epoch: Padded(AtomicU64::new(0)),
            notifier,
            lookup: Lookup::new(),
            registrar,
            state: Mutex::new(State {
                by_cookie: CookieMap::default(),
                clock: VecDeque::new(),
                retired: Vec::new(),
                live_bytes: 0,
                seen,
                user_events: HashMap::new(),
                user_events_pruned: 0,
            }),
            threads: Mutex::new(Vec::new()),
            config,
            seen: AtomicU64::new(seen.0),
            retired: AtomicUsize::new(0),
            releasing: AtomicUsize::new(0),
            slow_hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            merges: AtomicU64::new(0),
            deregistrations: AtomicU64::new(0),
            deregister_errors: AtomicU64::new(0),
            regions: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            pending: miss::Pending::default(),
            next_cookie: AtomicU64::new(1),
        }
    }

    /// The notifier (register your own regions with cookies below [`CACHE_COOKIE_BIT`]).
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// The registrar.
    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// The configuration in force (limits capped by the registrar).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A registration covering `[addr, addr + len)`: a cached one whose memory is unchanged, or a
    /// new one (a miss).
    ///
    /// # Errors
    /// [`Error::Notifier`] for a bad range (empty, wrapping, unmapped) or a dead notifier,
    /// [`Error::Register`] if the registrar refused, [`Error::Unstable`] if the memory kept
    /// changing during the miss.
    #[inline(always)]
    pub fn get(&self, addr: usize, len: usize) -> Result<Handle<'_, R>, Error> {
        if let Some(end) = addr.checked_add(len).filter(|_| len != 0) {
            if let Some(h) = self.get_fast::<FULL>(addr, end) {
                return Ok(h);
            }
        }
        self.get_slow(addr, len)
    }

    /// The hit path alone: a registration covering `[addr, addr + len)` that this thread found
    /// recently and that is still valid, or `None` — which does *not* mean "not cached" (call
    /// [`get`](Self::get)). No lock, no syscall, no allocation, and it can not panic, so the C
    /// library calls it outside its panic boundary. On a pull backend (perf, eBPF) it always
    /// returns `None`: their check runs a probe first, which is `get`'s business.
    #[doc(hidden)]
    #[inline(always)]
    pub fn get_cached(&self, addr: usize, len: usize) -> Option<Handle<'_, R>> {
        let end = addr.checked_add(len).filter(|_| len != 0)?;
        self.get_fast::<LEAF>(addr, end)
    }

    /// The hit path: MRU, hazard, fence, two loads.
    #[inline(always)]
    fn get_fast<const MODE: bool>(&self, start: usize, end: usize) -> Option<Handle<'_, R>> {
        let slot = local::current(self.id)?;
        // SAFETY: `current` returned the slot this thread claimed for this cache; it is kept
        // alive by `self.threads` (and the thread's claim) for as long as `self` lives.
        let slot: &ThreadSlot = unsafe { &*slot };
        // SAFETY: this thread owns the slot; `o` is the only reference to its state right now.
        let o = unsafe { slot.owned() };
        let entry = if MODE == FULL {
            o.find(start, end)?
        } else {
            o.find_last(start, end)?
        };
        let hazard = slot.publish(o, entry)?;
        fence::light();
        // SAFETY: `counter` points into the notifier's counter page, mapped for as long as
        // `self.notifier` (owned by `self`) lives.
        let counter = unsafe { self.counter.as_ref() };
        // The same one-load check as `Notifier::unchanged_since` (a pull backend's probe runs
        // first: `generation::PULL`).
        let mut c = counter.load(Acquire);
        if c & crate::generation::PULL != 0 {
            if MODE == LEAF {
                c = !o.gen; // the probe is `get`'s business: a miss here
            } else {
                c = self.notifier.refreshed_counter();
            }
        }
        if c == o.gen && self.epoch.0.load(Acquire) == o.epoch {
            slot.count_hit();
            // SAFETY: `entry` is the live entry of this MRU line, now held by `hazard` (and the
            // epoch check above says it was not retired before the hazard was published).
            unsafe { &*entry.cast::<Entry<R::Key>>() }.touch();
            return Some(Handle::by_hazard(self, hazard));
        }
        hazard.store(std::ptr::null_mut(), Relaxed);
        None
    }

    #[cold]
    fn get_slow(&self, addr: usize, len: usize) -> Result<Handle<'_, R>, Error> {
        if len == 0 {
            return Err(crate::Error::EmptyRange.into());
        }
        let end = addr
            .checked_add(len)
            .ok_or(Error::Notifier(crate::Error::WrappingRange))?;
        self.maintain();
        let slot = local::current(self.id)
            .or_else(|| local::claim(self.id, &self.threads))
            // SAFETY: as in `get_fast`: this thread's claimed slot, alive while `self` is.
            .map(|p| unsafe { &*p });
        let gen = self.notifier.generation()?;
        let epoch = self.epoch.0.load(Acquire);
        if let Some(slot) = slot {
            // SAFETY: this thread owns the slot; no other reference to its state is alive.
            let o = unsafe { slot.owned() };
            if o.epoch != epoch {
                o.clear();
                o.epoch = epoch;
            } else if o.gen != gen.0 {
                // The epoch did not move, so every MRU entry is still in the index and alive;
                // keep those whose memory is unchanged (checked after `gen` was taken).
                o.retain(|token| self.notifier.is_valid(token));
            }
            o.gen = gen.0;
            if let Some(h) = self.get_fast::<FULL>(addr, end) {
                return Ok(h);
            }
        }
        // No region can cover memory whose page-rounded end wraps.
        let want = page_round(addr, end).ok_or(crate::Error::WrappingRange)?;
        // The index, under this thread's stripe.
        let seen = {
            let index = self.lookup.read(slot.map_or(0, |s| s.stripe));
            match walk(&index, &self.notifier, addr, end, &want) {
                Ok(e) => {
                    // Published under the stripe lock: a retirer removes the entry under every
                    // stripe's write lock, so it sees this hold (no fence needed here).
                    let handle = self.hold(slot, e);
                    drop(index);
                    if let Some(slot) = slot {
                        // SAFETY: as above.
                        let o = unsafe { slot.owned() };
                        if o.epoch == epoch {
                            o.insert(Mru {
                                start: handle.entry().start,
                                end: handle.entry().end,
                                entry: handle.entry_ptr().cast(),
                                token: handle.entry().token,
                            });
                        }
                        slot.count_hit();
                    } else {
                        self.slow_hits.fetch_add(1, Relaxed);
                    }
                    handle.entry().touch();
                    return Ok(handle);
                }
                Err(near) => Seen {
                    writes: self.lookup.writes(),
                    near,
                },
            }
        };
        self.miss(slot, addr, end, want, seen)
    }

    /// Holds `e` for a new handle: a hazard slot of this thread, or the entry's shared count.
    /// Caller guarantees no retirer can miss the hold (index stripe or miss lock held).
    fn hold<'c>(&'c self, slot: Option<&'c ThreadSlot>, e: &Arc<Entry<R::Key>>) -> Handle<'c, R> {
        let ptr = Arc::as_ptr(e);
        let hazard = slot.and_then(|s| {
            // SAFETY: this thread owns the slot; no other reference to its state is alive.
            let o = unsafe { s.owned() };
            s.publish(o, ptr.cast())
        });
        match hazard {
            Some(h) => Handle::by_hazard(self, h),
            None => {
                e.shared_holds.fetch_add(1, SeqCst);
                Handle::by_shared_count(self, ptr)
            }
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, State<R::Key>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slow-path housekeeping, without waiting: apply pending invalidations and deregister retired
    /// regions nobody holds any more.
    fn maintain(&self) {
        let moved = !self
            .notifier
            .unchanged_since(Generation(self.seen.load(Relaxed)));
        if !moved && self.retired.load(Relaxed) == 0 {
            return;
        }
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        let free = self.housekeep(&mut st, false);
        drop(st);
        self.deregister(free);
    }

    /// Whether any [`Handle`] of this cache is alive (on any thread): what a C caller's
    /// `ummunotify_cache_free` checks instead of counting handles on the hit path (a count there
    /// would be a shared read-modify-write on every hit). O(threads + regions), under the miss
    /// lock; a `get` racing with the call may or may not be seen.
    pub fn handles_alive(&self) -> bool {
        let st = self.lock_state();
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        threads
            .iter()
            .any(|t| t.hazards.iter().any(|h| !h.load(Acquire).is_null()))
            || st
                .by_cookie
                .values()
                .chain(st.retired.iter())
                .any(|e| e.shared_holds.load(Acquire) != 0)
    }

    /// Applies pending invalidations, then deregisters every retired region no handle holds.
    /// [`get`](Self::get) does this on its slow path; call it to release registrations promptly
    /// (for example after freeing a lot of memory) or before reading [`stats`](Self::stats).
    ///
    /// Also checks every cached region (O(regions)), in case someone else read the notifier's
    /// events.
    pub fn flush(&self) {
        let mut st = self.lock_state();
        let free = self.housekeep(&mut st, true);
        drop(st);
        self.deregister(free);
    }

    /// Events of *your* regions on [`notifier`](Self::notifier) (cookies below
    /// [`CACHE_COOKIE_BIT`]), after applying the cache's own.
    ///
    /// At most one event per region: a region hit again before its event was taken gets one
    /// event without `hint` whose range covers both hits (the notifier's own rule for a region
    /// hit twice before a read). Memory is bounded by the user's regions.
    ///
    /// # Errors
    /// [`crate::Error::Forked`], [`crate::Error::MonitorDead`].
    pub fn take_events(&self) -> Result<Vec<Event>, crate::Error> {
        let mut st = self.lock_state();
        let free = self.housekeep(&mut st, false);
        let events: Vec<Event> = st.user_events.drain().map(|(_, e)| e).collect();
        st.user_events_pruned = 0;
        drop(st);
        self.deregister(free);
        self.notifier.generation().map(|_| events)
    }

    /// Like [`take_events`](Self::take_events), into `buf`: moves up to `buf.len()` events there
    /// and returns how many; the rest stay for the next call. (The C API's
    /// `ummunotify_cache_read_events`.)
    ///
    /// # Errors
    /// [`crate::Error::Forked`], [`crate::Error::MonitorDead`].
    pub fn take_events_into(&self, buf: &mut [Event]) -> Result<usize, crate::Error> {
        let mut st = self.lock_state();
        let free = self.housekeep(&mut st, false);
        let cookies: Vec<u64> = st.user_events.keys().take(buf.len()).copied().collect();
        for (slot, c) in buf.iter_mut().zip(&cookies) {
            *slot = st.user_events.remove(c).expect("key just listed");
        }
        st.user_events_pruned = st.user_events_pruned.min(st.user_events.len());
        drop(st);
        self.deregister(free);
        self.notifier.generation().map(|_| cookies.len())
    }

    /// Sets a user event aside (miss lock held), merged with one already parked for the cookie.
    fn park_user_event(&self, st: &mut State<R::Key>, ev: Event) {
        match st.user_events.entry(ev.cookie.0) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let p = o.get_mut();
                p.start = p.start.min(ev.start);
                p.end = p.end.max(ev.end);
                p.hint = false;
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(ev);
            }
        }
        if st.user_events.len() > 2 * st.user_events_pruned.max(32) {
            // Regions unregistered since their event was parked: the notifier would have
            // discarded their pending event, so do the same.
            st.user_events
                .retain(|c, _| self.notifier.region(crate::Cookie(*c)).is_ok());
            st.user_events_pruned = st.user_events.len();
        }
    }

    /// Reads the notifier's events, removes invalidated regions, reclaims. Returns what to
    /// deregister (outside the miss lock).
    fn housekeep(&self, st: &mut State<R::Key>, full: bool) -> Vec<Arc<Entry<R::Key>>> {
        let mut dead = self.read_events(st);
        if full {
            dead.extend(
                st.by_cookie
                    .values()
                    .filter(|e| !self.notifier.is_valid(e.token))
                    .cloned(),
            );
        }
        let n = self.remove(st, &dead);
        self.invalidations.fetch_add(n as u64, Relaxed);
        self.unwatch(&dead);
        self.reclaim(st)
    }

    /// Unregisters invalidated regions from the notifier at once, even if a handle still holds
    /// them: re-arming a region whose pages were unmapped watches whatever is mapped there now,
    /// which may be someone else's memory (a thread stack, a malloc arena).
    fn unwatch(&self, dead: &[Arc<Entry<R::Key>>]) {
        for e in dead {
            if e.watched.swap(false, Relaxed) {
                let _ = self.notifier.unregister(e.cookie);
            }
        }
    }

    /// Drains the notifier's queue: the cache's regions whose memory changed, and the user's
    /// events set aside.
    fn read_events(&self, st: &mut State<R::Key>) -> Vec<Arc<Entry<R::Key>>> {
        let mut dead = Vec::new();
        if self.notifier.unchanged_since(st.seen) {
            return dead;
        }
        let mut buf = [Event::default(); 64];
        // An error means a dead notifier: every check fails anyway.
        while let Ok(r) = self.notifier.read_events(&mut buf) {
            for ev in &buf[..r.count] {
                if ev.cookie.0 & CACHE_COOKIE_BIT != 0 {
                    if let Some(e) = st.by_cookie.get(&ev.cookie.0) {
                        dead.push(e.clone());
                    }
                } else {
                    self.park_user_event(st, *ev);
                }
            }
            if let Some(g) = r.drained {
                st.seen = g;
                self.seen.store(g.0, Relaxed);
                break;
            }
        }
        dead
    }

    /// Takes `entries` out of the index and retires them; returns how many were live.
    /// Publishes the removal (epoch bump + heavy fence) before returning.
    fn remove(&self, st: &mut State<R::Key>, entries: &[Arc<Entry<R::Key>>]) -> usize {
        if entries.is_empty() {
            // The common case on a miss (nothing died, nothing evicted, nothing merged).
            return 0;
        }
        let mut n = 0;
        {
            let mut index = None;
            for e in entries {
                if e.removed.load(Relaxed) {
                    continue;
                }
                let index = index.get_or_insert_with(|| self.lookup.write());
                if index.get(&e.start).is_some_and(|x| Arc::ptr_eq(x, e)) {
                    index.remove(&e.start);
                }
                e.removed.store(true, Relaxed);
                st.by_cookie.remove(&e.cookie.0);
                st.live_bytes -= e.len();
                st.retired.push(e.clone());
                n += 1;
            }
        }
        if n > 0 {
            self.epoch.0.fetch_add(1, SeqCst);
            // Pairs with `fence::light` on the hit path: after this, a thread either sees the new
            // epoch (and drops its MRU) or its hazard is visible to `reclaim`.
            fence::heavy();
            // Retired first: a miss planning without the lock reads `regions` and then
            // `retired`, so it never sees a region leave the one before it joins the other
            // (their sum is what the registrar holds).
            self.retired.store(st.retired.len(), Relaxed);
            self.regions.store(st.by_cookie.len(), Release);
            if st.clock.len() > 2 * st.by_cookie.len() + 64 {
                st.clock.retain(|e| !e.removed.load(Relaxed));
            }
        }
        n
    }

    /// Whether any handle holds `e`.
    fn held(&self, threads: &[Arc<ThreadSlot>], e: &Arc<Entry<R::Key>>) -> bool {
        let p: *const () = Arc::as_ptr(e).cast();
        e.shared_holds.load(Acquire) != 0 || threads.iter().any(|t| t.holds(p))
    }

    /// Retired entries no handle holds: out of the retired list, to be deregistered.
    fn reclaim(&self, st: &mut State<R::Key>) -> Vec<Arc<Entry<R::Key>>> {
        if st.retired.is_empty() {
            return Vec::new();
        }
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let (held, free): (Vec<_>, Vec<_>) = std::mem::take(&mut st.retired)
            .into_iter()
            .partition(|e| self.held(&threads, e));
        st.retired = held;
        // Counted as releasing before they leave `retired` (see `remove` for the readers'
        // order): a registration may never seem to have left the registrar before it did.
        self.releasing.fetch_add(free.len(), Relaxed);
        self.retired.store(st.retired.len(), Release);
        free
    }

    /// Registrations out of the cache that the registrar still holds (miss lock held): retired,
    /// and being deregistered by another call.
    fn pinned(&self, st: &State<R::Key>) -> usize {
        st.retired.len() + self.releasing.load(Acquire)
    }

    /// Releases registrations (no cache lock held).
    fn deregister(&self, free: Vec<Arc<Entry<R::Key>>>) {
        for e in free {
            if self.registrar.deregister(&e.key, e.range()).is_err() {
                self.deregister_errors.fetch_add(1, Relaxed);
            }
            if e.watched.swap(false, Relaxed) {
                let _ = self.notifier.unregister(e.cookie);
            }
            self.deregistrations.fetch_add(1, Relaxed);
            self.bytes.fetch_sub(e.len(), Relaxed);
            self.releasing.fetch_sub(1, Release);
        }
    }

    /// Counts a hit found off the hit path.
    fn count_slow_hit(&self, slot: Option<&ThreadSlot>) {
        match slot {
            Some(s) => s.count_hit(),
            None => {
                self.slow_hits.fetch_add(1, Relaxed);
            }
        }
    }

    /// Counters (hits are summed over threads; exact once the threads are quiet).
    pub fn stats(&self) -> Stats {
        let hits = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|t| t.hits())
            .sum::<u64>()
            + self.slow_hits.load(Relaxed);
        Stats {
            hits,
            misses: self.misses.load(Relaxed),
            invalidations: self.invalidations.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            merges: self.merges.load(Relaxed),
            deregistrations: self.deregistrations.load(Relaxed),
            deregister_errors: self.deregister_errors.load(Relaxed),
            regions: self.regions.load(Relaxed),
            retired: self.retired.load(Relaxed),
            bytes_registered: self.bytes.load(Relaxed),
        }
    }
}

impl<R: Registrar> Drop for Cache<R> {
    fn drop(&mut self) {
        // `&mut self`: no handle exists. Deregister everything still registered.
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = std::mem::take(&mut st.retired);
        all.extend(st.by_cookie.drain().map(|(_, e)| e));
        st.clock.clear();
        self.lookup.get_mut().clear();
        for e in all {
            let _ = self.registrar.deregister(&e.key, e.range());
        }
    }
}

impl<R: Registrar> fmt::Debug for Cache<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
