//! [`Notifier`]: register ranges, check them in O(1), read coalesced events.
//!
//! The public API is here; the rest is split by job:
//!
//! | file | job |
//! |---|---|
//! | `slots.rs` | region slots, the state under the index lock (`Locked`): every `UnsafeCell` |
//! | `registry.rs` | what only user threads touch: cookies, coverage, the VMA budget |
//! | `shared.rs` | `Shared`: the state shared with the backend; settling, watching, in-flight waits |
//! | `event_path.rs` | `Shared` as the backend's `Sink`: the event path and its rules |
//! | `register.rs` | registration, unregistration's undo, re-arming (`recover`) |
//! | `events.rs` | `read_events` |
//! | `stats.rs` | `Stats` |
//!
//! # Event-path rules
//!
//! `Shared`'s `Sink` methods (`event_path.rs`) run on a backend's delivery path (a monitor
//! thread, or a hooked libc call in the calling thread) between the kernel telling us of a
//! change and the region state being updated. They never allocate, never free, never unmap,
//! never log, and take only the `index` lock, which user threads hold only for short sections
//! that do none of those things and run with every signal blocked (see `docs/ARCHITECTURE.md`,
//! "Locks").

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64 as StdAtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{self, Backend, Delivery, Watcher};
use crate::cookies::CookieTable;
use crate::coverage::Coverage;
use crate::event::{self, Event, Hint, MANY, PENDING};
use crate::generation::{self, Generation, BUSY, DEAD, FORKED};
use crate::index::{IntervalIndex, Node, Nodes, TAG_MAX};
use crate::inflight::{InFlight, Scanner};
use crate::queue::QueueBits;
use crate::region::{Span, INVALID};
use crate::segvec::{SegVec, Zeroable};
use crate::sink::{Count, Invalidation, Probe, Sink, Window, WindowEnd};
use crate::sys::{self, CounterPage, SignalsBlocked};
use crate::{fork, Cookie, Error, Region, Result};

mod event_path;
mod events;
mod register;
mod registry;
mod shared;
mod slots;
mod stats;

pub use events::ReadEvents;
use registry::*;
pub(crate) use shared::Shared;
use shared::*;
use slots::*;
pub use stats::Stats;

/// Tells the process when the mappings behind registered ranges change.
///
/// See the [crate documentation](crate) for the model and an example. A `Notifier` is `Send` and
/// `Sync`: share it by reference or in an `Arc`.
pub struct Notifier {
    shared: Arc<Shared>,
    /// The backend delivering into `shared` (stopped by `Drop`).
    delivery: Option<Box<dyn Delivery>>,
    fork_slot: fork::Slot,
    /// The backend that runs, and why it was chosen.
    backend: (Backend, String),
}

impl Notifier {
    /// Starts a notifier on the backend `UMN_BACKEND` names (`auto`, `uffd`, `hooks`), by
    /// default [`Backend::Auto`]: userfaultfd (one monitor thread) where it starts, else the
    /// hooks backend. [`backend`](Self::backend) says which one runs and why.
    ///
    /// # Errors
    /// [`Error::Unsupported`] says exactly why no backend can start (no userfaultfd, refused
    /// by seccomp or by `vm.unprivileged_userfaultfd`, missing event features; and why libc can
    /// not be patched), or that `UMN_BACKEND` names none.
    pub fn new() -> Result<Notifier> {
        Notifier::with_backend(Backend::from_env().map_err(Error::Unsupported)?)
    }

    /// Starts a notifier on `backend`.
    ///
    /// ```
    /// use ummunotify::{Backend, Notifier};
    ///
    /// let n = Notifier::with_backend(Backend::Auto)?;
    /// println!("running on {}: {}", n.backend(), n.backend_reason());
    /// # Ok::<(), ummunotify::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming why that backend can not start here.
    pub fn with_backend(backend: Backend) -> Result<Notifier> {
        let (watcher, chosen, reason) = backend::open(backend).map_err(Error::Unsupported)?;
        Notifier::start(watcher, (chosen, reason))
    }

    pub(crate) fn start(watcher: Box<dyn Watcher>, backend: (Backend, String)) -> Result<Notifier> {
        let os = |op| move |source| Error::Os { op, source };
        let counter = CounterPage::new().map_err(os("memfd_create"))?;
        let ready = Readiness {
            fd: sys::eventfd().map_err(os("eventfd"))?,
            wanted: AtomicBool::new(false),
        };
        let shared = Arc::new(Shared {
            counter,
            ready,
            slots: SegVec::new(),
            queue: QueueBits::new(),
            index: Mutex::new(IndexState {
                tree: IntervalIndex::new(),
                queued: 0,
                cursor: 0,
                last_remap: (0, 0),
                strays: [(0, 0); STRAYS],
                stray_len: 0,
                stray_overflow: 0,
                unmapped: [(0, 0); UNMAPPED],
                unmapped_len: 0,
                unmapped_overflow: false,
                ready: false,
                inflight: InFlight::default(),
            }),
            registry: Mutex::new(Registry {
                cookies: CookieTable::new(),
                wide: WideRanges::default(),
                coverage: Coverage::new(),
                free: Vec::new(),
                next_slot: 0,
                budget: if watcher.splits_vmas() {
                    WatchBudget::new()
                } else {
                    // Watches split no VMA (the hooks' own filter): never widen.
                    WatchBudget {
                        limit: usize::MAX / 4,
                        ..WatchBudget::new()
                    }
                },
                scanner: Scanner::new(),
                lost: LostRanges::default(),
                watch_calls: 0,
                holes: 0,
            }),
            probe: watcher.probe(),
            watcher,
            strays_pending: AtomicBool::new(false),
            messages: StdAtomicU64::new(0),
            invalidations: StdAtomicU64::new(0),
            all_changed: StdAtomicU64::new(0),
            events_read: StdAtomicU64::new(0),
            fail_next: AtomicBool::new(false),
            message_hit: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            counted_ahead: AtomicBool::new(false),
            holes: AtomicUsize::new(0),
            readied_by_message: AtomicBool::new(false),
            overlapped: AtomicBool::new(false),
        });
        let fork_slot = fork::Slot::new(shared.counter.addr()).ok_or(Error::Os {
            op: "fork registration",
            source: io::Error::other("too many live notifiers in this process"),
        })?;
        if shared.probe.is_some() {
            // Every check pulls first (see `generation::PULL`).
            shared.counter().fetch_or(generation::PULL, SeqCst);
        }
        let delivery = shared.watcher.deliver(shared.clone())?;
        Ok(Notifier {
            shared,
            delivery: Some(delivery),
            fork_slot,
            backend,
        })
    }

    /// The backend this notifier runs on ([`Backend::Userfaultfd`] or [`Backend::Hooks`]).
    pub fn backend(&self) -> Backend {
        self.backend.0
    }

    /// Why this backend runs, in words (what was asked for, what failed, how it was opened).
    pub fn backend_reason(&self) -> &str {
        &self.backend.1
    }

    /// How many libc calls went through the hooks in this process so far (every process-wide
    /// call, registered or not; 0 when the hooks were never installed). For tests and
    /// diagnostics; not part of the stable API.
    #[doc(hidden)]
    pub fn hooked_calls() -> usize {
        backend::hooked_calls()
    }

    /// Registers `range` under `cookie` and starts watching it.
    ///
    /// The range is rounded out to pages for watching; events report it as given. Overlapping
    /// and duplicate ranges are fine; cookies must be unique.
    ///
    /// Every page of the range must be mapped: a hole is [`Error::Unmapped`], because a native
    /// caller registers memory it is about to use, and a range that is not there is a bug to
    /// report, not to watch. [`register_any`](Self::register_any) accepts holes.
    ///
    /// # Errors
    /// [`Error::EmptyRange`], [`Error::WrappingRange`], [`Error::Unmapped`],
    /// [`Error::DuplicateCookie`], [`Error::RangeBusy`], [`Error::CoverageLimit`],
    /// [`Error::UnsupportedMapping`]; the notifier is unchanged after any of them.
    pub fn register(&self, range: Range<usize>, cookie: Cookie) -> Result<Region> {
        self.register_impl(range, cookie, false)
    }

    /// Registers `range` under `cookie` whether or not it is mapped, as the 2010 device did.
    ///
    /// The mapped parts are watched at once. Memory mapped later inside the range is watched
    /// from the moment [`mapped`](Self::mapped) is told of it (the 2010 preload tells it of every
    /// `mmap`, `mremap`, `shmat` and `brk` it sees); memory mapped there by a call nobody
    /// announces (a raw `mmap` syscall, glibc's internal `mmap` in `malloc`) is not watched,
    /// because the kernel gives userfaultfd no event for a new mapping.
    ///
    /// The token is valid from now on: a hole being filled is not an invalidation (nothing was
    /// there to invalidate), and re-arming the region (reading its event) while some of its
    /// pages are unmapped makes it valid again too, watching what is mapped then. So a token of
    /// such a region says "nothing that was mapped when the token was taken has changed", not
    /// "the range is mapped".
    ///
    /// ```
    /// # use ummunotify::{Cookie, Notifier};
    /// # fn main() -> Result<(), ummunotify::Error> {
    /// let n = Notifier::new()?;
    /// let page = 4096;
    /// // Reserve an address, then leave a hole there.
    /// // SAFETY: a fresh anonymous mapping, then its unmapping.
    /// let p = unsafe {
    ///     let p = libc::mmap(std::ptr::null_mut(), page, libc::PROT_READ | libc::PROT_WRITE,
    ///                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
    ///     libc::munmap(p, page);
    ///     p as usize
    /// };
    /// let r = n.register_any(p..p + page, Cookie(1))?; // a plain `register` is `Unmapped`
    /// assert!(n.is_valid(r));
    /// // SAFETY: maps into the hole we made.
    /// unsafe {
    ///     libc::mmap(p as *mut libc::c_void, page, libc::PROT_READ | libc::PROT_WRITE,
    ///                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE, -1, 0);
    /// }
    /// n.mapped(p..p + page)?; // watched from here on
    /// // SAFETY: unmaps our own page.
    /// unsafe { libc::munmap(p as *mut libc::c_void, page) };
    /// assert!(!n.is_valid(r));
    /// assert_eq!(n.events()?.len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`register`](Self::register), without [`Error::Unmapped`]; a mapped part that can not
    /// be watched ([`Error::RangeBusy`], [`Error::UnsupportedMapping`], ...) still fails the whole
    /// call, with the notifier unchanged.
    pub fn register_any(&self, range: Range<usize>, cookie: Cookie) -> Result<Region> {
        self.register_impl(range, cookie, true)
    }

    /// Tells the notifier that `range` was just mapped (by `mmap`, the target of `mremap`,
    /// `shmat`, `brk` growth): the pages of it that lie in a registered region and were not
    /// mapped when that region was last watched are watched from now on. Call it after the
    /// mapping call returned and before the memory is used. Costs one atomic load while no
    /// region has unmapped pages; otherwise the registry lock, and a `PROCMAP_QUERY` and a
    /// `UFFDIO_REGISTER` per mapped VMA part of the range's registered pages (none for memory
    /// outside every region).
    ///
    /// Regions with holes come from [`register_any`](Self::register_any) and from re-arming a
    /// region while some of its pages are unmapped (see [`read_events`](Self::read_events)).
    ///
    /// # Errors
    /// [`Error::Forked`], [`Error::MonitorDead`]; a part that can not be watched is left
    /// unwatched (a later invalidation of it is missed, as for memory nobody announced).
    pub fn mapped(&self, range: Range<usize>) -> Result<()> {
        let sh = &*self.shared;
        if sh.holes.load(SeqCst) == 0 || range.end <= range.start {
            return Ok(());
        }
        sh.alive()?;
        let page = sys::page_size() as u64;
        let start = range.start as u64 & !(page - 1);
        let end = (range.end as u64).saturating_add(page - 1) & !(page - 1);
        let mut reg = sh.lock_registry();
        sh.settle(&mut reg)?;
        // Every page of the range some region counts: the holes' pages, and pages of regions
        // whose watch went with an unmap (pending; watching them now only adds what their
        // re-arm would watch anyway). No page outside every region is watched.
        let Registry {
            coverage, budget, ..
        } = &mut *reg;
        let mut watched = Vec::new();
        coverage.for_each_covered(start, end, |s, e| {
            if sh.watch_mapped_parts(budget, s, e).is_ok() {
                watched.push((s, e));
            }
        });
        // As after a registration's watch: shared memory just watched may be about to be
        // punched by a `MADV_REMOVE` that found no watch ("Fresh watches of shared memory").
        for (s, e) in watched {
            sh.fresh_window_after_mapped(&mut reg, s, e);
        }
        Ok(())
    }

    /// Makes room for `regions` registered regions now (the slot table and the cookie map), so
    /// that registering up to that many allocates and maps nothing. The 2010 preload reserves
    /// when the device is opened: otherwise the first registration maps the slot table, and the
    /// kernel may put it in the hole the program just made and is registering (the device
    /// mapped nothing in the program's address space).
    ///
    /// # Errors
    /// [`Error::Forked`], [`Error::MonitorDead`].
    pub fn reserve(&self, regions: usize) -> Result<()> {
        let sh = &*self.shared;
        sh.alive()?;
        let mut reg = sh.lock_registry();
        let more = regions.saturating_sub(reg.cookies.len());
        reg.cookies.reserve(more, |id| sh.cookie_of(id));
        reg.free.reserve(more);
        while sh.slots.capacity() < regions.min(u32::MAX as usize) {
            if !sh.slots.grow_zeroed() && sh.slots.capacity() < regions {
                break; // every segment installed
            }
        }
        if let Some(last) = regions.min(u32::MAX as usize).checked_sub(1) {
            sh.queue.reserve(last as u32);
        }
        Ok(())
    }

    /// Unregisters the region named `cookie`; a pending event for it is discarded.
    ///
    /// # Errors
    /// [`Error::UnknownCookie`] (nothing changes).
    pub fn unregister(&self, cookie: Cookie) -> Result<()> {
        let sh = &*self.shared;
        sh.alive()?;
        let mut reg = sh.lock_registry();
        sh.settle(&mut reg)?;
        let Some(id) = reg.cookies.get(cookie.0, |id| sh.cookie_of(id)) else {
            return Err(Error::UnknownCookie(cookie));
        };
        let span = {
            let l = sh.lock_index_blocked();
            reg.wide.span(l.node(id))
        };
        reg.cookies.remove(cookie.0, |id| sh.cookie_of(id));
        self.remove_slot(&mut reg, id, &span);
        reg.free.push(id);
        if widened(&span) {
            reg.budget.wide_regions -= 1;
        }
        Ok(())
    }

    /// A fresh token for the region named `cookie` (after its event was read and it re-armed).
    pub fn region(&self, cookie: Cookie) -> Result<Region> {
        let sh = &*self.shared;
        sh.alive()?;
        let reg = sh.lock_registry();
        let Some(id) = reg.cookies.get(cookie.0, |id| sh.cookie_of(id)) else {
            return Err(Error::UnknownCookie(cookie));
        };
        let slot = sh.slots.get(id).expect("registered id without a slot");
        Ok(Region {
            slot: id,
            expected: valid_word(serial_of(slot.word.load(Acquire))),
        })
    }

    /// The per-region check, O(1): false once any invalidation of the region's pages has
    /// returned to its caller in any thread. Waits (microseconds) while the monitor is applying
    /// a message. Always false in a forked child or after the monitor died.
    #[inline]
    pub fn is_valid(&self, region: Region) -> bool {
        match self.shared.slots.get(region.slot) {
            Some(slot) => {
                let sh = &*self.shared;
                generation::region_valid(sh.counter(), &slot.word, region.expected, || sh.pull())
            }
            None => false,
        }
    }

    /// A stable snapshot of the generation counter (waits while the monitor is mid-message).
    ///
    /// # Errors
    /// [`Error::Forked`], [`Error::MonitorDead`].
    pub fn generation(&self) -> Result<Generation> {
        match generation::wait_idle_pulled(self.shared.counter(), || self.shared.pull()) {
            Ok(c) => Ok(Generation(c)),
            Err(_) => self.shared.alive().map(|_| unreachable!("dead counter")),
        }
    }

    /// The global fast path, one atomic load: true iff no invalidation of this notifier's
    /// regions has been applied since `snapshot` was taken (and the notifier is alive). When
    /// false, read events. While the backend is applying a message (one for another notifier's
    /// pages, most often) the check waits microseconds for its end rather than fail.
    #[inline]
    pub fn unchanged_since(&self, snapshot: Generation) -> bool {
        generation::unchanged(self.shared.counter(), snapshot, || self.shared.pull())
    }

    /// The live counter word (what the C API hands out as `const volatile uint64_t *`).
    ///
    /// On a backend that delivers by pull the word carries bit 61 for good, and comparing it
    /// alone misses what the backend has not delivered yet: call
    /// [`refreshed_counter`](Self::refreshed_counter) when that bit is set.
    pub fn counter(&self) -> &AtomicU64 {
        self.shared.counter()
    }

    /// The counter after the backend delivered everything it recorded (a pull backend's probe
    /// runs; on push backends this is just a load). Not part of the stable API.
    #[doc(hidden)]
    #[cold]
    pub fn refreshed_counter(&self) -> u64 {
        self.shared.pull();
        self.shared.counter().load(Acquire)
    }

    /// A memfd whose first 8 bytes are the live counter: map it `PROT_READ, MAP_SHARED` to get
    /// another view of [`counter`](Self::counter). At offset
    /// [`notifications_offset`](Self::notifications_offset) it holds the live
    /// [notification count](Self::notifications) (the 2010 ABI's `mmap` of the device).
    pub fn counter_fd(&self) -> BorrowedFd<'_> {
        self.shared.counter.fd()
    }

    /// The 2010 device's counter: 0 when the notifier starts, then one more for each kernel
    /// message (one `munmap`, one VMA of a `madvise`, ...) that hit at least one region of this
    /// notifier. It never goes down, and it has moved when an unmapping call that hit an armed
    /// region returns, so a program may keep a value it loaded and compare it with `==` later
    /// (the 2010 contract: "unchanged" means nothing it registered was hit).
    ///
    /// Exact on the in-thread backends (hooks, and hybrid's libc calls: one per call that hit a
    /// region) and on pull backends (one per delivery that hit one, when a check delivers it).
    /// On userfaultfd the monitor counts a message before the `read()` that releases the
    /// unmapping thread, when what the message says is not known yet, and never takes the count
    /// back: a message that hits none of this notifier's regions while it has some (another
    /// notifier's pages, pages of a widened watch outside every region, a moved watch) counts
    /// one too many. A count too high only costs a program one more `read` of the events; one
    /// taken back could equal a value loaded before an invalidation. Bit 63 is set when the
    /// monitor is dead or the process forked, so the value then never equals an earlier one.
    /// The [`generation`](Self::generation) stays the word for this crate's own checks.
    ///
    /// ```no_run
    /// # use ummunotify::{Cookie, Notifier};
    /// let n = Notifier::new()?;
    /// let buf = vec![0u8; 1 << 20];
    /// let start = buf.as_ptr() as usize;
    /// n.register(start..start + buf.len(), Cookie(1))?;
    /// assert_eq!(n.notifications(), 0);
    /// drop(buf); // free() unmaps the block: one message
    /// assert_eq!(n.notifications(), 1);
    /// # Ok::<(), ummunotify::Error>(())
    /// ```
    pub fn notifications(&self) -> u64 {
        self.shared.counter.notification_word().load(SeqCst)
    }

    /// Where the notification count lives in [`counter_fd`](Self::counter_fd): a page-aligned
    /// offset, so `mmap(NULL, 8, PROT_READ, MAP_SHARED, counter_fd, notifications_offset)` gives
    /// a view whose first 8 bytes are the live count.
    pub fn notifications_offset(&self) -> usize {
        sys::page_size()
    }

    /// Reads every pending event into a new vector (convenience over [`read_events`](Self::read_events)).
    pub fn events(&self) -> Result<Vec<Event>> {
        ReadEvents::collect(|buf| self.read_events(buf))
    }

    /// Sets the VMA budget (default: half of `vm.max_map_count`), for tests and benchmarks of
    /// the watch policy: with 0, every new region is watched as the whole VMAs it lies in.
    /// Regions registered before keep their watches. Not part of the stable API.
    #[doc(hidden)]
    pub fn set_vma_budget(&self, limit: usize) {
        self.shared.lock_registry().budget.limit = limit;
    }

    /// Fault injection for tests: the monitor fails while applying the next message, as a bug in
    /// the event path would. It must then report every region invalid and keep releasing
    /// unmapping threads. Not part of the stable API.
    #[doc(hidden)]
    pub fn inject_monitor_failure(&self) {
        self.shared.fail_next.store(true, SeqCst);
    }

    /// The kernel thread id of the monitor (running before `new` returned), for diagnostics and tests
    /// (for example, to check that it never allocates).
    pub fn monitor_tid(&self) -> i32 {
        self.delivery.as_ref().map_or(0, |d| d.monitor_tid())
    }
}

impl AsFd for Notifier {
    /// Readable while events are pending — and already while the monitor is taking a message, so
    /// a `poll` with timeout 0 right after an unmapping call returned sees it. On userfaultfd the
    /// process's one context hands every notifier every message: a notifier with regions is
    /// readable while any message is being taken, and the readiness is withdrawn again when the
    /// message hit none of its regions (a `read_events` in between finds nothing).
    ///
    /// The fd is kept readable from the first call of this on: until then nobody can be polling
    /// it, and the event path makes no eventfd write for it. That first call takes the
    /// notifier's index lock (so it is not async-signal-safe); later calls are one atomic load.
    fn as_fd(&self) -> BorrowedFd<'_> {
        let sh = &*self.shared;
        // Once wanted, always wanted. A forked child takes no lock (its copy may be held by a
        // thread that does not exist there); its notifier is dead, and its fd readable (`kill`).
        if !sh.ready.wanted.load(Acquire) && sh.counter().load(Acquire) & FORKED == 0 {
            let l = sh.lock_index_blocked();
            sh.ready.want(l.locked.st.ready);
        }
        sh.ready.fd.as_fd()
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("counter", &self.shared.counter().load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.fork_slot.release();
        let forked = self.shared.counter().load(SeqCst) & FORKED != 0;
        if let Some(d) = self.delivery.take() {
            d.stop(forked);
        }
    }
}
