//! [`Notifier`]: register ranges, check them in O(1), read coalesced events.
//!
//! # Event-path rules
//!
//! [`Shared`]'s [`Sink`] methods run on a backend's delivery path (a monitor thread, or a hooked
//! libc call in the calling thread) between the kernel telling us of a change and the
//! region state being updated. It never allocates, never frees, never unmaps, never logs, and
//! takes only the `index` lock, which user threads hold only for short sections that do none of
//! those things and run with every signal blocked (see `docs/ARCHITECTURE.md`, "Locks").
#![allow(unsafe_code)] // Slot data lives in UnsafeCells guarded by the index lock; see `Locked`.

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
use crate::sink::{Invalidation, Probe, Sink, Window, WindowEnd};
use crate::sys::{self, CounterPage, SignalsBlocked};
use crate::{fork, Cookie, Error, Region, Result};

/// One region's storage: 56 bytes (with the cookie table's 4/load bytes and the queue's bit,
/// under 64 per region; `docs/ARCHITECTURE.md`, "Region storage").
///
/// `word` is read without locks and written under the index lock; `cookie` is written under
/// both locks and read under the registry lock; `node` and `hint` are reached only under the
/// index lock (through [`Locked`]).
///
/// The word: bits 4.. the serial (a token is `serial << SERIAL_SHIFT`), bit 0 [`INVALID`], and
/// while it is set the region's event state, so a valid word never has them: bit 1 [`PENDING`]
/// and bit 2 [`MANY`] (one invalidation, more than one, since the event was last read), bit 3
/// [`LOST`]. The event path only ever `fetch_or`s bits in.
#[derive(Default)]
pub(crate) struct Slot {
    word: AtomicU64,
    cookie: AtomicU64,
    /// The region's range and its place in the index. Its tag (24 bits): in the low 22 (the
    /// [`KIND`] mask) 0 for a free slot, [`EXACT`] for a region watched as its own pages,
    /// [`WIDE`]` + k` for one watched as the `k`-th range of [`WideRanges`]; bit 22
    /// [`ANY_RANGE`] and bit 23 [`HOLES`], reached only by user threads under the index lock
    /// (the event path reads only the node's range).
    node: UnsafeCell<Node>,
    hint: UnsafeCell<Hint>,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 56);

/// The kernel's watch over some of the region's pages went away with an unmap; it must be
/// re-established before the region can be valid again.
const LOST: u64 = 1 << 3;
/// The serial's place in the validity word.
const SERIAL_SHIFT: u32 = 4;
/// Node tag of a live region watched as its own pages.
const EXACT: u32 = 1;
/// Node tag kinds from this one up: a live region watched as the range `kind - WIDE` of
/// [`WideRanges`].
const WIDE: u32 = 2;
/// The part of a node's tag that says how the region is watched (`0`, [`EXACT`], [`WIDE`]` + k`).
const KIND: u32 = (1 << 22) - 1;
/// Node tag bit: registered with [`Notifier::register_any`], valid over holes (re-arming over a
/// hole makes it valid, as registering it then would).
const ANY_RANGE: u32 = 1 << 22;
/// Node tag bit: some pages of its range were not mapped when it was last watched (at
/// registration or re-arm): counted in `Registry::holes`, so [`Notifier::mapped`] watches memory
/// announced there. Cleared when it is unregistered or re-armed with all its pages mapped.
const HOLES: u32 = 1 << 23;
const _: () = assert!(HOLES | ANY_RANGE | KIND == TAG_MAX);

/// The validity word `serial` starts, valid.
fn valid_word(serial: u64) -> u64 {
    serial << SERIAL_SHIFT
}

/// The serial of validity word `w`.
fn serial_of(w: u64) -> u64 {
    w >> SERIAL_SHIFT
}

// SAFETY: `node` and `hint` are only accessed through `Locked`, which holds the index mutex;
// `word` and `cookie` are atomic.
unsafe impl Sync for Slot {}

// SAFETY: every field is an atomic or an `UnsafeCell` of plain integers (`Node`, `Hint`), for
// which all-zero bytes are valid and equal to their `Default` (zeros too).
unsafe impl Zeroable for Slot {}

/// Watch ranges of the regions registered over the VMA budget (whole VMAs, so few distinct
/// ones), interned and refcounted: a region names its range in its node's tag (the 22 bits of
/// [`KIND`]) instead of carrying 16 bytes.
#[derive(Default)]
struct WideRanges {
    /// `(watch_start, watch_end, regions using it)`; unused entries have count 0.
    ranges: Vec<(u64, u64, u32)>,
    by_range: HashMap<(u64, u64), u32>,
    free: Vec<u32>,
}

impl WideRanges {
    /// The node tag of a region watched as `[start, end)` (counts the region).
    fn intern(&mut self, start: u64, end: u64) -> Result<u32> {
        if let Some(&k) = self.by_range.get(&(start, end)) {
            self.ranges[k as usize].2 += 1;
            return Ok(WIDE + k);
        }
        let k = match self.free.pop() {
            Some(k) => k,
            None if self.ranges.len() <= (KIND - WIDE) as usize => {
                self.ranges.push((0, 0, 0));
                (self.ranges.len() - 1) as u32
            }
            None => {
                return Err(Error::CoverageLimit(io::Error::from_raw_os_error(
                    libc::ENOMEM,
                )))
            }
        };
        self.ranges[k as usize] = (start, end, 1);
        self.by_range.insert((start, end), k);
        Ok(WIDE + k)
    }

    /// Drops one region's use of the range of node tag kind `kind` (`>= WIDE`).
    fn release(&mut self, kind: u32) {
        let k = kind - WIDE;
        let r = &mut self.ranges[k as usize];
        r.2 -= 1;
        if r.2 == 0 {
            self.by_range.remove(&(r.0, r.1));
            self.free.push(k);
        }
    }

    /// The region `node` (live) as a span: its range, and the pages watched for it.
    fn span(&self, node: &Node) -> Span {
        let (start, end) = (node.start, node.end);
        let kind = node.tag() & KIND;
        let (watch_start, watch_end) = if kind >= WIDE {
            let r = self.ranges[(kind - WIDE) as usize];
            (r.0, r.1)
        } else {
            let page = sys::page_size() as u64;
            (start & !(page - 1), end.next_multiple_of(page))
        };
        Span {
            start,
            end,
            watch_start,
            watch_end,
        }
    }
}

/// State under the index lock (no allocation happens while it is held).
struct IndexState {
    tree: IntervalIndex,
    /// Regions in the event queue (`Shared::queue`).
    queued: usize,
    /// Where the next read of the queue starts looking (see `crate::queue`).
    cursor: u32,
    /// The last `Remap`'s old range: the `Unmap` of the same range that follows it belongs to the
    /// same mremap call and is not a second invalidation.
    last_remap: (u64, u64),
    /// Destinations of `Remap`s: the kernel's watch moved there and may cover pages no region
    /// needs. Cleaned up by the next user call.
    strays: [(u64, u64); STRAYS],
    stray_len: usize,
    stray_overflow: u64,
    /// Ranges unmapped (or moved away) since the last registration looked: the kernel's watch
    /// over them is gone. Taken by `register` into `Registry::lost`.
    unmapped: [(u64, u64); UNMAPPED],
    unmapped_len: usize,
    /// More were unmapped than `unmapped` holds: any watch may be gone.
    unmapped_overflow: bool,
    /// Whether the readiness eventfd has been signalled and not drained.
    ready: bool,
    /// `REMOVE`s dequeued whose zap is not known to have happened (issue 9, `crate::inflight`).
    inflight: InFlight,
}

const STRAYS: usize = 32;
const UNMAPPED: usize = 64;

impl IndexState {
    /// Event path: the kernel's watch over `[start, end)` is gone (an unmap, or the old range of
    /// a move), for the next registration to take into `Registry::lost` (see `register`).
    fn record_unmapped(&mut self, start: u64, end: u64) {
        if self.unmapped_len < UNMAPPED {
            self.unmapped[self.unmapped_len] = (start, end);
            self.unmapped_len += 1;
        } else {
            self.unmapped_overflow = true;
        }
    }
}

/// State only user threads touch (the event path never takes this lock).
struct Registry {
    cookies: CookieTable,
    /// Watch ranges of widened regions (`Slot::node`'s tag).
    wide: WideRanges,
    coverage: Coverage,
    free: Vec<u32>,
    next_slot: u32,
    budget: WatchBudget,
    /// Names the senders of in-flight `REMOVE`s (`crate::inflight`).
    scanner: Scanner,
    /// Page ranges counted in `coverage` whose kernel watch an unmap may have taken since it was
    /// established: a registration over them watches again (see `register`).
    lost: LostRanges,
    /// `UFFDIO_REGISTER`s (or filter insertions) made by registrations and re-arms.
    watch_calls: u64,
    /// Regions whose node tag has [`HOLES`].
    holes: usize,
}

/// Disjoint ranges, merged (the registry's `lost`).
#[derive(Default)]
struct LostRanges {
    /// start -> end.
    runs: std::collections::BTreeMap<u64, u64>,
}

impl LostRanges {
    /// Adds `[start, end)`.
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.runs.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.runs.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.runs.range(start..=end).next() {
            end = end.max(e);
            self.runs.remove(&s);
        }
        self.runs.insert(start, end);
    }

    /// Removes `[start, end)` (watched again).
    fn remove(&mut self, start: u64, end: u64) {
        let first = self
            .runs
            .range(..start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        let hit: Vec<(u64, u64)> = self
            .runs
            .range(first..end)
            .map(|(&s, &e)| (s, e))
            .filter(|&(_, e)| e > start)
            .collect();
        for (s, e) in hit {
            self.runs.remove(&s);
            if s < start {
                self.runs.insert(s, start);
            }
            if e > end {
                self.runs.insert(end, e);
            }
        }
    }

    /// Whether any of `[start, end)` is in the set.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.runs
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }
}

/// The watch policy's VMA budget (docs/ARCHITECTURE.md, "Watch policy").
///
/// Watching exactly a region's pages splits the VMA they lie in (a watched VMA between two
/// unwatched ones: up to two more VMAs per disjoint watched range), and the kernel refuses new
/// VMAs at `vm.max_map_count` — 32,745 alternating single-page regions here. So exact watches
/// are allowed only while the process's VMA count, estimated from the last count plus two per
/// watched range added since, stays under half of `vm.max_map_count` (the other half is left to
/// everything else the process maps). Past that, a new region is watched as the whole VMAs it
/// lies in, which splits nothing; events for the other pages of those VMAs hit no region and
/// are dropped by the index (they still cost their senders a round trip: guarantee 3 is kept for
/// memory outside those VMAs only).
struct WatchBudget {
    /// Half of `vm.max_map_count`.
    limit: usize,
    /// The process's VMAs at the last count, and the coverage segments we had then.
    counted: usize,
    counted_at: usize,
    /// The mapping list (opened at the first widened watch).
    vmas: Option<sys::vma::Vmas>,
    /// Regions registered with a widened watch, now.
    wide_regions: usize,
}

impl WatchBudget {
    fn new() -> WatchBudget {
        WatchBudget {
            limit: sys::vma::max_map_count() / 2,
            counted: sys::vma::count().unwrap_or(0),
            counted_at: 0,
            vmas: None,
            wide_regions: 0,
        }
    }

    /// The process's VMA count as far as we know: the last count, plus two for every watched
    /// range added since (never less for ranges removed: an over-estimate only widens sooner).
    fn estimate(&self, segments: usize) -> usize {
        self.counted + 2 * segments.saturating_sub(self.counted_at)
    }

    /// Room left under the limit for VMAs the rest of the process makes between two counts
    /// (allocator arenas, the notifier's own slot segments, ...).
    const MARGIN: usize = 1024;

    /// Whether one more exact watch fits. The VMAs are counted again (reading
    /// `/proc/self/maps`) whenever the watched ranges changed by `limit / 64`, or a quarter of
    /// the room left under the limit if that is more, since the last count: so the estimate
    /// follows what the rest of the process maps too, widened registrations (which add no range)
    /// do not each pay for a count, and far below the limit a count (O(VMAs) in the kernel: 40%
    /// of a cache miss's time at 10,000 VMAs when it came every `limit / 64` ranges) is rare.
    fn allows_exact(&mut self, segments: usize) -> bool {
        let room = self
            .limit
            .saturating_sub(self.estimate(segments) + Self::MARGIN);
        if segments.abs_diff(self.counted_at) >= (self.limit / 64).max(room / 4).max(1) {
            if let Ok(n) = sys::vma::count() {
                self.counted = n;
                self.counted_at = segments;
            }
        }
        self.estimate(segments) + 2 + Self::MARGIN <= self.limit
    }

    /// The mapping list, opened at first use.
    fn vmas(&mut self) -> Result<&sys::vma::Vmas> {
        if self.vmas.is_none() {
            self.vmas = Some(sys::vma::Vmas::open().map_err(|source| Error::Os {
                op: "open /proc/self/maps",
                source,
            })?);
        }
        Ok(self.vmas.as_ref().expect("opened above"))
    }

    /// The whole VMAs covering `[start, end)`, or `None` if part of it is unmapped.
    fn widen(&mut self, start: u64, end: u64) -> Result<Option<(u64, u64)>> {
        self.vmas()?.extent(start, end).map_err(|source| Error::Os {
            op: "PROCMAP_QUERY",
            source,
        })
    }
}

/// Whether `span` is watched wider than its own pages (over the VMA budget).
fn widened(span: &Span) -> bool {
    let page = sys::page_size() as u64;
    span.watch_start < span.start & !(page - 1) || span.watch_end > span.end.next_multiple_of(page)
}

/// Counters for diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Regions registered now.
    pub regions: usize,
    /// Kernel messages delivered to this notifier. On userfaultfd every notifier of the process
    /// shares one context, so this counts the messages of the others' pages too (as do the
    /// `removes_*` counters); the rest of the counters are this notifier's own.
    pub messages: u64,
    /// Region invalidations applied (one message can hit many regions).
    pub invalidations: u64,
    /// Events read by the user.
    pub events_read: u64,
    /// Events pending now.
    pub pending: usize,
    /// Disjoint page ranges the kernel watches for us.
    pub coverage_segments: usize,
    /// Moved watches that could not be cleaned up because the stray ring overflowed.
    pub stray_overflows: u64,
    /// Bytes the kernel watches for this notifier (registered pages, and over the VMA budget the
    /// rest of their VMAs).
    pub watched_bytes: u64,
    /// Regions watched as their whole VMAs because exact watches would exceed the VMA budget.
    pub wide_regions: usize,
    /// The VMA budget: exact watches stop when the process's VMAs would pass this (half of
    /// `vm.max_map_count`).
    pub vma_budget: usize,
    /// The process's VMA count as the watch policy estimates it (an over-estimate).
    pub vma_estimate: usize,
    /// `REMOVE`s held in flight until their zap was confirmed (the sender acknowledged or exited).
    pub removes_confirmed: u64,
    /// `REMOVE`s that left the in-flight state by a grace period, unconfirmed: the residual
    /// window of `crate::inflight` (io_uring workers, other processes, signal-blocking threads).
    pub removes_by_grace: u64,
    /// `REMOVE`s in flight now (fresh-watch windows included).
    pub removes_in_flight: usize,
    /// Fresh-watch windows (a registration watched shared memory, see `docs/ARCHITECTURE.md`,
    /// "Fresh watches of shared memory") ended by confirmation. Not counted as `REMOVE`s above.
    pub fresh_windows_confirmed: u64,
    /// Fresh-watch windows ended by a grace period (signals off, or a member that never
    /// acknowledged): the residual, as for `removes_by_grace`.
    pub fresh_windows_by_grace: u64,
    /// Successful watch calls (`UFFDIO_REGISTER`, or the hooks' filter insertions) made by
    /// registrations and re-arms (on a backend whose `Watcher::watch_persists`, a registration
    /// over pages already watched, with no unmap over them delivered since, makes none; no
    /// backend qualifies now).
    pub watch_calls: u64,
    /// Watch requests userfaultfd refused because another context owns the pages (`EBUSY`),
    /// taken by the hooks alone (hybrid backend only; raw syscalls on them are not seen).
    pub hooks_only_watches: u64,
    /// Times a pull backend could not say what changed and invalidated every region (a perf
    /// ring found nearly full, a call's end seen without its start).
    pub all_changed: u64,
}

/// The core's state, shared with the backend's delivery (as its [`Sink`]).
pub(crate) struct Shared {
    counter: CounterPage,
    ready: Readiness,
    slots: SegVec<Slot>,
    /// The event queue: which slots have a pending event (under the index lock).
    queue: QueueBits,
    index: Mutex<IndexState>,
    registry: Mutex<Registry>,
    /// What watches the pages (see `crate::backend`).
    watcher: Box<dyn Watcher>,
    /// The backend's pull-at-check-time probe (`None`: push only; the counter then never has
    /// `generation::PULL`).
    probe: Option<Box<dyn Probe>>,
    strays_pending: AtomicBool,
    messages: StdAtomicU64,
    invalidations: StdAtomicU64,
    /// `Sink::invalidate_all` calls.
    all_changed: StdAtomicU64,
    events_read: StdAtomicU64,
    /// Fault injection for tests: the next message makes the event path fail.
    fail_next: AtomicBool,
    /// The message being applied hit at least one region (monitor only; see
    /// `generation::count_notification`).
    message_hit: AtomicBool,
    /// `Registry::holes`, readable without the lock: [`Notifier::mapped`] returns at once while
    /// it is 0. Raised before the holes are looked for (see `register_impl`).
    holes: AtomicUsize,
    /// The message being applied made the readiness fd readable (monitor only).
    readied_by_message: AtomicBool,
    /// An invalidation in a user thread (hooks, hybrid) moved the counter while a monitor
    /// message was between `begin` and `end` (set and, in the cancel path, read under the index
    /// lock). That message's `end` must then move the counter on instead of giving it back: a
    /// snapshot taken inside the user thread's invalidation read an even value, and a cancel
    /// would bring the counter back to exactly that value with the invalidation applied.
    overlapped: AtomicBool,
}

/// The readiness eventfd, written only once somebody can be waiting on it.
///
/// Until [`Notifier`]'s `as_fd` is first called nobody can poll the fd, so the event path skips
/// the eventfd write (a syscall in the unmapping thread on the hooks and hybrid backends) and
/// the drains. The first `as_fd` marks it wanted under the index lock and makes it readable if
/// the notifier is ready then; every later change writes it. All of this under the index lock.
struct Readiness {
    fd: OwnedFd,
    wanted: AtomicBool,
}

impl Readiness {
    /// Makes the fd readable (index lock held, or the notifier dead).
    fn signal(&self) {
        if self.wanted.load(Relaxed) {
            sys::eventfd_signal(self.fd.as_fd());
        }
    }

    /// Makes the fd not readable (index lock held).
    fn drain(&self) {
        if self.wanted.load(Relaxed) {
            sys::eventfd_drain(self.fd.as_fd());
        }
    }

    /// Marks the fd wanted from now on, and readable at once if the notifier is `ready` and it
    /// was not wanted before (index lock held).
    fn want(&self, ready: bool) {
        if !self.wanted.swap(true, Relaxed) && ready {
            sys::eventfd_signal(self.fd.as_fd());
        }
    }
}

/// Proof that the index lock is held, and the only way to reach slot data.
struct Locked<'a> {
    st: MutexGuard<'a, IndexState>,
    slots: &'a SegVec<Slot>,
    queue: &'a QueueBits,
}

/// Tree view over slots' nodes.
struct SlotNodes<'a>(&'a SegVec<Slot>);

impl Nodes for SlotNodes<'_> {
    fn node(&self, id: u32) -> &Node {
        let slot = self.0.get(id).expect("tree node id without a slot");
        // SAFETY: a `SlotNodes` exists only inside `Locked` methods (index lock held), and
        // `node_mut` needs `&mut self`, so no `&mut Node` is alive while this `&Node` is.
        unsafe { &*slot.node.get() }
    }
    fn node_mut(&mut self, id: u32) -> &mut Node {
        let slot = self.0.get(id).expect("tree node id without a slot");
        // SAFETY: as in `node`; `&mut self` makes this the only live reference into any node.
        unsafe { &mut *slot.node.get() }
    }
}

impl Locked<'_> {
    fn slot(&self, id: u32) -> &Slot {
        self.slots.get(id).expect("slot id out of range")
    }

    /// The node of slot `id`.
    fn node(&self, id: u32) -> &Node {
        // SAFETY: the index lock is held (`self.st`); mutable references to nodes exist only
        // inside `SlotNodes::node_mut` (under `&mut` of a `SlotNodes`, never alive across a call
        // to this) and `node_mut` below (same rule).
        unsafe { &*self.slot(id).node.get() }
    }

    /// The node of slot `id`, mutably (the slot must not be in the tree, or only its tag may
    /// change).
    #[allow(clippy::mut_from_ref)]
    fn node_mut(&self, id: u32) -> &mut Node {
        // SAFETY: as in `node`; callers use the reference for one statement sequence on one
        // slot, with no other reference to that node alive.
        unsafe { &mut *self.slot(id).node.get() }
    }

    /// The pending event's hint of slot `id`.
    #[allow(clippy::mut_from_ref)]
    fn hint(&self, id: u32) -> &mut Hint {
        // SAFETY: the index lock is held, and callers never keep two references to the same
        // slot's hint alive at once.
        unsafe { &mut *self.slot(id).hint.get() }
    }

    /// Takes `id` out of the event queue if it is there.
    fn dequeue(&mut self, id: u32) {
        // SAFETY: the index lock is held (`self.st`).
        if unsafe { self.queue.remove(id) } {
            self.st.queued -= 1;
        }
    }

    /// The next queued region from the read cursor on.
    fn next_queued(&self) -> Option<u32> {
        // SAFETY: the index lock is held (`self.st`).
        unsafe { self.queue.next(self.st.cursor) }
    }

    /// Whether a queued region overlaps a `REMOVE` in flight with ticket <= `horizon`.
    fn queued_in_flight(&self, wide: &WideRanges, horizon: u64) -> bool {
        if self.st.inflight.is_empty() {
            return false;
        }
        let mut from = 0;
        // SAFETY: the index lock is held (`self.st`).
        while let Some(id) = unsafe { self.queue.first_from(from) } {
            let span = wide.span(self.node(id));
            if self
                .st
                .inflight
                .overlaps_upto(span.watch_start, span.watch_end, horizon)
            {
                return true;
            }
            match id.checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        false
    }

    /// Keeps region `id` invalid under a fresh serial and queues an event for its whole range
    /// (a registration or re-arm over a `REMOVE` in flight, see `crate::inflight`).
    fn hold_invalid(&mut self, id: u32) {
        let slot = self.slot(id);
        let w = slot.word.load(Relaxed);
        let (rs, re) = {
            let n = self.node(id);
            (n.start, n.end)
        };
        let (set, newly) = event::hit(w, self.hint(id), rs, rs, re);
        let bits = (w & (LOST | PENDING | MANY)) | set | INVALID;
        slot.word
            .store(valid_word(serial_of(w) + 1) | bits, Release);
        // SAFETY: the index lock is held (`self.st`).
        if newly && unsafe { self.queue.insert(id) } {
            self.st.queued += 1;
        }
    }

    /// Event path: marks every region overlapping `[start, end)` invalid and queues it once.
    /// Returns whether anything was newly queued.
    fn invalidate(&mut self, start: u64, end: u64, unmap: bool, remap_tail: bool) -> (bool, u64) {
        let mut newly = false;
        let mut hits = 0u64;
        let (slots, queue) = (self.slots, self.queue);
        let st = &mut *self.st;
        let mut queued = st.queued;
        let lost = if unmap { LOST } else { 0 };
        if unmap {
            st.record_unmapped(start, end);
        }
        st.tree
            .for_each_overlap(&SlotNodes(slots), start, end, |id| {
                let slot = slots.get(id).expect("tree node id without a slot");
                hits += 1;
                let w = slot.word.load(Relaxed);
                if remap_tail && w & PENDING != 0 {
                    // The same mremap call as the Remap that already hit it.
                    slot.word.fetch_or(INVALID | lost, Relaxed);
                    return;
                }
                // SAFETY: index lock held (we are inside a `Locked` method). The tree walk holds
                // only shared references to nodes, so a shared one here is fine; `hint` is a
                // different cell, and no other reference to it is alive.
                let rs = unsafe { (*slot.node.get()).start };
                // SAFETY: as above.
                let hint = unsafe { &mut *slot.hint.get() };
                let (set, first) = event::hit(w, hint, rs, start, end);
                slot.word.fetch_or(INVALID | lost | set, Relaxed);
                // SAFETY: index lock held.
                if first && unsafe { queue.insert(id) } {
                    newly = true;
                    queued += 1;
                }
            });
        st.queued = queued;
        (newly, hits)
    }
}

impl Shared {
    fn lock_index(&self) -> Locked<'_> {
        Locked {
            st: self.index.lock().unwrap_or_else(|p| p.into_inner()),
            slots: &self.slots,
            queue: &self.queue,
        }
    }

    /// The cookie of slot `id` (registry lock held: cookies change only under it).
    fn cookie_of(&self, id: u32) -> u64 {
        self.slots
            .get(id)
            .expect("cookie table id without a slot")
            .cookie
            .load(Relaxed)
    }

    fn lock_registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn counter(&self) -> &AtomicU64 {
        self.counter.word()
    }

    /// Makes the readiness fd readable if it is not (index lock held).
    fn signal_ready(&self, l: &mut Locked<'_>) {
        if !l.st.ready {
            l.st.ready = true;
            self.ready.signal();
        }
    }

    /// An invalidation of `[start, end)` made outside the monitor's messages (in-thread hooks,
    /// `invalidate_all`, a `mapped` window still open; index lock held), applied as one message
    /// of its own: counter odd, `INVALID` and queue, a 2010 notification if a region was hit
    /// (a widened watch may cover pages no region holds), counter even. If a monitor message is
    /// between `begin` and `end` meanwhile (the counter is busy, and only the monitor leaves it
    /// busy outside the lock), its `end` must not cancel (see `overlapped`). Returns the hits.
    fn invalidate_as_message(
        &self,
        l: &mut Locked<'_>,
        start: u64,
        end: u64,
        unmap: bool,
        again: bool,
    ) -> u64 {
        if self.counter().load(Relaxed) & BUSY != 0 {
            self.overlapped.store(true, Relaxed);
        }
        generation::begin_message(self.counter());
        let (newly, hits) = l.invalidate(start, end, unmap, again);
        if hits > 0 {
            generation::count_notification(self.counter.notification_word());
        }
        self.invalidations.fetch_add(hits, Relaxed);
        if newly {
            self.signal_ready(l);
        }
        generation::end_message(self.counter());
        hits
    }

    /// A pull backend's probe, run before a check (see `generation::PULL`).
    #[cold]
    fn pull(&self) {
        if let Some(p) = &self.probe {
            p.pull(self);
        }
    }

    fn alive(&self) -> Result<()> {
        let c = self.counter().load(Acquire);
        if c & FORKED != 0 {
            Err(Error::Forked)
        } else if c & DEAD != 0 {
            Err(Error::MonitorDead)
        } else {
            Ok(())
        }
    }

    /// The first step of every user call that changes state (registry lock held): wait until
    /// the monitor has applied every message it already dequeued, then unwatch the destinations of
    /// moved watches that no region needs.
    ///
    /// Waiting matters twice: a message for an unmap that returned before this call may still be
    /// being applied (and would otherwise hit a region this call is about to insert at the same,
    /// re-mapped addresses), and a `Remap` applied late would leave its moved watch for a later
    /// call to clean up.
    fn settle(&self, reg: &mut Registry) -> Result<()> {
        if generation::wait_idle_pulled(self.counter(), || self.pull()).is_err() {
            return self.alive();
        }
        if self.strays_pending.swap(false, Acquire) {
            self.clean_strays(reg);
        }
        Ok(())
    }

    /// Unwatches the destinations of moved watches that no region needs (registry lock held).
    fn clean_strays(&self, reg: &mut Registry) {
        let mut strays = [(0u64, 0u64); STRAYS];
        let n = {
            let mut l = self.lock_index_blocked();
            let n = l.st.stray_len;
            strays[..n].copy_from_slice(&l.st.strays[..n]);
            l.st.stray_len = 0;
            n
        };
        for &(s, e) in &strays[..n] {
            for (us, ue) in reg.coverage.uncovered(s, e) {
                // The range may be partly unmapped by now; nothing to undo then.
                self.watcher.unwatch(us, ue);
            }
        }
    }

    /// The index lock for a user thread: with every signal blocked while it is held.
    fn lock_index_blocked(&self) -> UserLocked<'_> {
        let signals = SignalsBlocked::new();
        UserLocked {
            locked: self.lock_index(),
            _signals: signals,
        }
    }

    /// After a watch of `[start, end)` (registry lock held): on a backend that needs it
    /// ([`Watcher::fresh_watch_window`](crate::backend::Watcher::fresh_watch_window)), when the
    /// range holds shared memory, records an in-flight window over it, ticketed after the watch,
    /// as if a `REMOVE` of it had just been read. A `madvise(MADV_REMOVE)` that looked for a watch
    /// before this one existed sent no message, and may zap after the watch with `mmap_lock`
    /// dropped; the caller waits for the window ([`wait_inflight`](Self::wait_inflight): the
    /// threads in `madvise` over the range, or running, are named and must come back to user
    /// space) and holds its region invalid if it is still open. Returns the window's ticket, if
    /// one was opened.
    /// `shared` is what the caller learnt already (`None`: look it up).
    fn open_fresh_window(
        &self,
        reg: &mut Registry,
        start: u64,
        end: u64,
        shared: Option<bool>,
    ) -> Option<u64> {
        if !self.watcher.fresh_watch_window() || crate::inflight::disabled() {
            return None;
        }
        // A lookup that fails counts as shared: a window costs a wait, a missing one a stale pin.
        let shared = shared.unwrap_or_else(|| {
            reg.budget
                .vmas()
                .map_or(true, |v| v.any_shared(start, end).unwrap_or(true))
        });
        shared.then(|| {
            self.lock_index_blocked()
                .st
                .inflight
                .record_fresh(start, end)
        })
    }

    /// [`Notifier::mapped`]'s fresh-watch window over `[start, end)`, just watched (registry lock
    /// held): waited for as in `register_impl`; if it is still open then, every region over the
    /// range is invalidated with an event, as a message would (the counter moves, the 2010 count
    /// too), since those regions may be cached already.
    fn fresh_window_after_mapped(&self, reg: &mut Registry, start: u64, end: u64) {
        let Some(ticket) = self.open_fresh_window(reg, start, end, None) else {
            return;
        };
        let span = Span {
            start,
            end,
            watch_start: start,
            watch_end: end,
        };
        self.wait_inflight(reg, &span);
        let mut l = self.lock_index_blocked();
        l.st.inflight.sweep();
        if !l.st.inflight.overlaps_upto(start, end, ticket) {
            return;
        }
        self.invalidate_as_message(&mut l, start, end, false, false);
    }

    /// Waits until no `REMOVE` in flight overlaps `span` (user threads; registry lock held). The
    /// wait is bounded by the table's grace periods; a registration still overlapping one then
    /// is born invalid with an event (see `register`).
    fn wait_inflight(&self, reg: &mut Registry, span: &Span) {
        let (s, e) = (span.watch_start, span.watch_end);
        self.wait_inflight_until(reg, |l, _, h| !l.st.inflight.overlaps_upto(s, e, h), (s, e));
    }

    /// How often a wait for in-flight entries looks at their members again (a scan of the threads).
    const NARROW_EVERY_NS: u64 = 200_000;

    /// Waits (bounded) until `done(locked, horizon)` holds under the index lock, naming the
    /// senders of the unresolved in-flight entries overlapping `range` and signalling them on the
    /// way. `horizon` is the ticket counter at the start: entries recorded later need not be
    /// waited for (they invalidated what they hit; what they overlap at insertion is born
    /// invalid), so a stream of new `REMOVE`s can not starve the caller.
    fn wait_inflight_until(
        &self,
        reg: &mut Registry,
        done: impl Fn(&Locked<'_>, &Registry, u64) -> bool,
        range: (u64, u64),
    ) {
        let start = InFlight::horizon();
        let limit = crate::inflight::now_ns()
            + (crate::inflight::STUCK_GRACE.as_nanos() as u64).saturating_mul(2);
        let mut round = 0;
        // When the members were last looked at again (`InFlight::narrow`).
        let mut looked = crate::inflight::now_ns();
        loop {
            let mut workers = [0i32; crate::inflight::WORKERS];
            let (unresolved, n_workers) = {
                let mut l = self.lock_index_blocked();
                if l.st.inflight.is_empty() {
                    return;
                }
                l.st.inflight.sweep();
                if done(&l, reg, start) {
                    return;
                }
                (
                    l.st.inflight.unresolved(range.0, range.1),
                    l.st.inflight.workers(range.0, range.1, &mut workers),
                )
            };
            if unresolved {
                // Scan after reading the horizon: every entry up to it was read before the scan
                // began, so its sender is still in its call (named) or done with it.
                let horizon = InFlight::horizon();
                reg.scanner.scan(sys::gettid());
                let outbox = {
                    let mut l = self.lock_index_blocked();
                    let (c, overflowed) = reg.scanner.candidates();
                    l.st.inflight.resolve(horizon, c, overflowed)
                };
                outbox.send();
                continue;
            }
            if n_workers > 0 {
                // Busy io_uring workers run no handler: look whether they went idle since.
                let horizon = InFlight::horizon();
                let mut idle = [0i32; crate::inflight::WORKERS];
                let mut n_idle = 0;
                for &w in &workers[..n_workers] {
                    if reg.scanner.worker_idle(w) {
                        idle[n_idle] = w;
                        n_idle += 1;
                    }
                }
                if n_idle > 0 {
                    let mut l = self.lock_index_blocked();
                    for &w in &idle[..n_idle] {
                        l.st.inflight.worker_idle(w, horizon);
                    }
                    continue;
                }
            }
            let now = crate::inflight::now_ns();
            if now > limit {
                return;
            }
            if now.saturating_sub(looked) >= Self::NARROW_EVERY_NS {
                // Members blocked elsewhere by now are out of the call: no signal needed.
                looked = now;
                let horizon = InFlight::horizon();
                reg.scanner.scan(sys::gettid());
                let mut l = self.lock_index_blocked();
                let (c, overflowed) = reg.scanner.candidates();
                l.st.inflight.narrow(horizon, c, overflowed);
                continue;
            }
            // A pull backend closes its windows when it delivers the call's end.
            self.pull();
            crate::primitive::backoff(&mut round);
        }
    }

    /// Watches the mapped parts of the page range `[start, end)` (registry lock held). Returns
    /// whether they covered it (no hole); a part unmapped while this runs counts as a hole. No
    /// allocation where `PROCMAP_QUERY` works (it runs inside the 2010 preload's `mmap`).
    fn watch_mapped_parts(&self, budget: &mut WatchBudget, start: u64, end: u64) -> Result<bool> {
        // The common case, all mapped: one check and one watch, as `register` (the VMA walk
        // reads all of /proc/self/maps per call where PROCMAP_QUERY is missing, Linux < 6.11).
        let whole = Span {
            start,
            end,
            watch_start: start,
            watch_end: end,
        };
        match self.watch(&whole) {
            Ok(()) if matches!(sys::is_mapped(start as usize, end as usize), Ok(true)) => {
                return Ok(true)
            }
            Ok(()) | Err(Error::Unmapped) => {}
            Err(e) => return Err(e),
        }
        let mut first_err = None;
        let mut raced = false;
        let whole = budget
            .vmas()?
            .for_each_mapped(start, end, |s, e| {
                if first_err.is_some() {
                    return;
                }
                let part = Span {
                    start: s,
                    end: e,
                    watch_start: s,
                    watch_end: e,
                };
                match self.watch(&part) {
                    Ok(()) => {}
                    Err(Error::Unmapped) => raced = true,
                    Err(e) => first_err = Some(e),
                }
            })
            .map_err(|source| Error::Os {
                op: "PROCMAP_QUERY",
                source,
            })?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(whole && !raced),
        }
    }

    /// Watches the page range of `span`, mapping kernel refusals to typed errors.
    fn watch(&self, span: &Span) -> Result<()> {
        let (s, e) = (span.watch_start, span.watch_end);
        let unmapped = || !matches!(sys::is_mapped(s as usize, e as usize), Ok(true));
        if unmapped() {
            return Err(Error::Unmapped);
        }
        self.watcher
            .watch(s, e)
            .map_err(|err| if unmapped() { Error::Unmapped } else { err })
    }
}

/// The index lock held by a user thread. Field order matters: the lock is released before the
/// signal mask is restored.
struct UserLocked<'a> {
    locked: Locked<'a>,
    _signals: SignalsBlocked,
}

impl<'a> std::ops::Deref for UserLocked<'a> {
    type Target = Locked<'a>;
    fn deref(&self) -> &Locked<'a> {
        &self.locked
    }
}
impl std::ops::DerefMut for UserLocked<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.locked
    }
}

/// What [`Notifier::read_events`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadEvents {
    /// Number of events written to the front of the buffer.
    pub count: usize,
    /// `Some` when the read drained the queue: the generation at that moment (the 2010
    /// `UMMUNOTIFY_EVENT_TYPE_LAST` counter). While
    /// [`unchanged_since`](Notifier::unchanged_since) this value, there is nothing to read.
    pub drained: Option<Generation>,
    /// `Some` with `drained`: the [notification count](Notifier::notifications) at that same
    /// moment (what the 2010 ABI's LAST record carries).
    pub drained_notifications: Option<u64>,
}

impl ReadEvents {
    /// Every pending event, read in batches by `read` until a read drains the queue.
    pub(crate) fn collect(
        mut read: impl FnMut(&mut [Event]) -> Result<ReadEvents>,
    ) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        let mut buf = [Event::default(); 64];
        loop {
            let r = read(&mut buf)?;
            out.extend_from_slice(&buf[..r.count]);
            if r.drained.is_some() {
                return Ok(out);
            }
        }
    }
}

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

    fn register_impl(&self, range: Range<usize>, cookie: Cookie, any: bool) -> Result<Region> {
        let mut span = Span::new(range, sys::page_size())?;
        let sh = &*self.shared;
        sh.alive()?;
        let mut reg = sh.lock_registry();
        sh.settle(&mut reg)?;
        if reg.cookies.get(cookie.0, |id| sh.cookie_of(id)).is_some() {
            return Err(Error::DuplicateCookie(cookie));
        }
        // The watch policy: exact pages while the VMA budget allows, else the whole VMAs. (Over
        // the budget, pages already watched are widened too: watched exactly inside a widened
        // range, they would split the coverage into a run per region, and unwatching the widened
        // range around them at the end would split its VMA as many times.)
        let segments = reg.coverage.segments();
        if !reg.budget.allows_exact(segments) {
            match reg.budget.widen(span.watch_start, span.watch_end)? {
                Some((s, e)) => (span.watch_start, span.watch_end) = (s, e),
                None if any => {} // holes: watch the mapped parts exactly
                None => return Err(Error::Unmapped),
            }
        }
        // Already watched: every page is counted in the coverage (so watched by a registration
        // that succeeded) and no unmap of them was delivered since. Such a registration makes no
        // watch call, on a backend that promises the watch is still there then (none does now:
        // see `Watcher::watch_persists`).
        let watched = sh.watcher.watch_persists()
            && reg
                .coverage
                .uncovered(span.watch_start, span.watch_end)
                .is_empty()
            && !reg.lost.overlaps(span.watch_start, span.watch_end);
        let tag = if widened(&span) {
            reg.wide.intern(span.watch_start, span.watch_end)?
        } else {
            EXACT
        };
        // Room in the slot table and the queue is made here, outside the index lock.
        reg.free.reserve(1);
        let id = match reg.free.last() {
            Some(&id) => id,
            None => reg.next_slot,
        };
        while sh.slots.capacity() <= id as usize {
            sh.slots.grow_zeroed();
        }
        sh.queue.reserve(id);
        // Frames a dequeued REMOVE is about to drop must not be pinned through this region.
        sh.wait_inflight(&mut reg, &span);
        // The pages that went from 0 to 1 are not needed: the whole range is watched below (see
        // there why), and a rollback's `remove` returns exactly what this added.
        reg.coverage.add(span.watch_start, span.watch_end);
        if any {
            reg.holes += 1;
            sh.holes.store(reg.holes, SeqCst);
        }
        let mut unmapped = [(0u64, 0u64); UNMAPPED];
        let (token, n_unmapped, overflow) = {
            let mut l = sh.lock_index_blocked();
            // What was unmapped up to now: from here on an unmap of these pages hits the region.
            let n = l.st.unmapped_len;
            unmapped[..n].copy_from_slice(&l.st.unmapped[..n]);
            l.st.unmapped_len = 0;
            let overflow = std::mem::take(&mut l.st.unmapped_overflow);
            let slot = l.slot(id);
            slot.cookie.store(cookie.0, Relaxed);
            let expected = valid_word(serial_of(slot.word.load(Relaxed)) + 1);
            let node = l.node_mut(id);
            *node = Node::new(span.start, span.end);
            // Holes counted before they are looked for (below): a racing `mapped` that finds the
            // count 0 announced memory that the look will find mapped.
            node.set_tag(tag | if any { ANY_RANGE | HOLES } else { 0 });
            slot.word.store(expected, Release);
            let Locked { st, slots, .. } = &mut l.locked;
            st.tree.insert(&mut SlotNodes(slots), id);
            // A REMOVE dequeued since the wait above: its zap may still come after a pin.
            l.st.inflight.sweep();
            if l.st.inflight.overlaps(span.watch_start, span.watch_end) {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
            }
            (Region { slot: id, expected }, n, overflow)
        };
        // Whether the memory is shared, when the check after the watch learnt it.
        let mut shared = None;
        // Kept only where a registration may skip its watch (allocating nothing otherwise).
        let keep_lost = sh.watcher.watch_persists();
        if keep_lost && overflow {
            reg.lost.insert(0, u64::MAX);
        }
        for &(s, e) in &unmapped[..if keep_lost { n_unmapped } else { 0 }] {
            reg.lost.insert(s & !(sys::page_size() as u64 - 1), e);
        }
        if any {
            // The region is in the index and counted in `holes` already: memory a racing
            // `mapped` announces is found either by the look below or, after this call (it
            // waits for the registry lock), by `mapped` itself.
            let Registry { budget, .. } = &mut *reg;
            match sh.watch_mapped_parts(budget, span.watch_start, span.watch_end) {
                Ok(true) => {
                    self.clear_holes(&mut reg, id);
                    reg.lost.remove(span.watch_start, span.watch_end);
                }
                // Holes: counted in the coverage but not watched, so a later registration over
                // them must watch (memory may be mapped there by then, announced or not).
                Ok(false) if keep_lost => reg.lost.insert(span.watch_start, span.watch_end),
                Ok(false) => {}
                Err(e) => {
                    self.remove_slot(&mut reg, id, &span);
                    return Err(e);
                }
            }
            reg.watch_calls += 1;
        } else if !watched || reg.lost.overlaps(span.watch_start, span.watch_end) {
            // Unless already watched, watch the whole page range, even parts already covered: a
            // watch lost with an unmap may have been replaced by a new mapping since (watching is
            // idempotent).
            if let Err(e) = sh.watch(&span) {
                self.remove_slot(&mut reg, id, &span);
                return Err(e);
            }
            // A racing unmap between the check in `watch` and the registration would have gone
            // unseen. One VMA over the range (the common case): one `PROCMAP_QUERY` answers this
            // and whether the memory is shared (the fresh-watch window below); else `msync`.
            let (s, e) = (span.watch_start, span.watch_end);
            let one = if sh.watcher.fresh_watch_window() {
                reg.budget
                    .vmas()
                    .ok()
                    .and_then(|v| v.covering(s, e).ok().flatten())
            } else {
                None
            };
            if one.is_none() && !matches!(sys::is_mapped(s as usize, e as usize), Ok(true)) {
                self.remove_slot(&mut reg, id, &span);
                return Err(Error::Unmapped);
            }
            shared = one;
            // Watched now; an unmap since the copy above is in `unmapped` for the next one.
            reg.lost.remove(span.watch_start, span.watch_end);
            reg.watch_calls += 1;
        }
        // Shared memory: a `MADV_REMOVE` that began before the watch may still be about to zap.
        // Only the window (and older entries) can leave a pin stale now: a `REMOVE` read since
        // the insertion hit the region in the index.
        if let Some(ticket) =
            sh.open_fresh_window(&mut reg, span.watch_start, span.watch_end, shared)
        {
            sh.wait_inflight(&mut reg, &span);
            let mut l = sh.lock_index_blocked();
            l.st.inflight.sweep();
            if l.st
                .inflight
                .overlaps_upto(span.watch_start, span.watch_end, ticket)
            {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
            }
        }
        if reg.free.last() == Some(&id) {
            reg.free.pop();
        } else {
            reg.next_slot += 1;
        }
        reg.cookies.insert(id, |id| sh.cookie_of(id));
        if widened(&span) {
            reg.budget.wide_regions += 1;
        }
        Ok(token)
    }

    /// Region `id` has no holes (any more): uncount it (registry lock held).
    fn clear_holes(&self, reg: &mut Registry, id: u32) {
        let had = {
            let l = self.shared.lock_index_blocked();
            let node = l.node_mut(id);
            let t = node.tag();
            node.set_tag(t & !HOLES);
            t & HOLES != 0
        };
        if had {
            reg.holes -= 1;
            self.shared.holes.store(reg.holes, SeqCst);
        }
    }

    /// Region `id` may have holes: count it, before they are looked for (registry lock held).
    fn mark_holes(&self, reg: &mut Registry, id: u32) {
        let had = {
            let l = self.shared.lock_index_blocked();
            let node = l.node_mut(id);
            let t = node.tag();
            node.set_tag(t | HOLES);
            t & HOLES != 0
        };
        if !had {
            reg.holes += 1;
            self.shared.holes.store(reg.holes, SeqCst);
        }
    }

    /// Undoes the index and coverage part of a registration (registry lock held).
    fn remove_slot(&self, reg: &mut Registry, id: u32, span: &Span) {
        let sh = &*self.shared;
        self.clear_holes(reg, id);
        let kind = {
            let mut l = sh.lock_index_blocked();
            let Locked { st, slots, .. } = &mut l.locked;
            st.tree.remove(&mut SlotNodes(slots), id);
            l.dequeue(id);
            let node = l.node_mut(id);
            let kind = node.tag() & KIND;
            node.set_tag(0);
            let slot = l.slot(id);
            let dead = valid_word(serial_of(slot.word.load(Relaxed)) + 1) | INVALID;
            slot.word.store(dead, Release);
            kind
        };
        if kind >= WIDE {
            reg.wide.release(kind);
        }
        for (s, e) in reg.coverage.remove(span.watch_start, span.watch_end) {
            // Unwatching part of a watched range splits its VMA as watching it did: over the VMA
            // budget the pages stay watched, as a widened registration's would (unregistered
            // pages there may pay a round trip; guarantee 3's cost of the budget). Without this,
            // unregistering every other page of a large registered range ran the process out
            // of VMAs (vm.max_map_count), and then out of memory: malloc could map no arena.
            let segments = reg.coverage.segments();
            if sh.watcher.splits_vmas() && !reg.budget.allows_exact(segments) {
                continue;
            }
            // Parts may be unmapped already; the kernel dropped those watches itself.
            sh.watcher.unwatch(s, e);
            reg.lost.remove(s, e);
        }
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

    /// The 2010 device's counter, exactly: 0 when the notifier starts, then one more for each
    /// kernel message (one `munmap`, one VMA of a `madvise`, ...) that hit at least one region
    /// of this notifier; messages over memory no region covers do not count.
    ///
    /// Visible before the unmapping call returns: the monitor counts a message before the
    /// `read()` that releases the unmapping thread, and takes the count back before the
    /// message's end if it hit nothing (so a message over watched pages outside every region
    /// shows a count one too high while it is applied). Bit 63 is set when the monitor is dead
    /// or the process forked, so the value then never equals an earlier one. The
    /// [`generation`](Self::generation) stays the word for this crate's own checks.
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

    /// Moves pending events to the front of `buf` (re-arming their regions) and reports whether
    /// the queue was drained, with the counter at that moment.
    ///
    /// Re-arming a region whose pages were unmapped watches them again where they are mapped now.
    /// What its token means when some are not (holes): a [`register`](Self::register) region
    /// keeps reading invalid (the memory it was registered for is gone) until a later re-arm
    /// finds all its pages mapped; a [`register_any`](Self::register_any) region reads valid
    /// (nothing mapped there changed since). Either way the region is never deaf: memory mapped
    /// into its holes and announced with [`mapped`](Self::mapped) is watched, and its next
    /// invalidation is an event.
    ///
    /// # Errors
    /// [`Error::Forked`], [`Error::MonitorDead`].
    pub fn read_events(&self, buf: &mut [Event]) -> Result<ReadEvents> {
        let sh = &*self.shared;
        sh.alive()?;
        let mut reg = sh.lock_registry();
        sh.settle(&mut reg)?; // pulls first on a pull backend
                              // Regions whose REMOVE is still in flight are re-armed only after its zap: wait for
                              // that (bounded) rather than hand out their event again and again.
        sh.wait_inflight_until(
            &mut reg,
            |l, reg, h| !l.queued_in_flight(&reg.wide, h),
            (0, u64::MAX),
        );
        let mut recover: Vec<(u32, u64, Span)> = Vec::with_capacity(buf.len().min(4096));
        let mut held: Vec<u32> = Vec::with_capacity(buf.len().min(4096));
        let mut n = 0;
        let drained = loop {
            if generation::wait_idle(sh.counter()).is_err() {
                return sh.alive().map(|_| unreachable!("dead counter"));
            }
            let mut l = sh.lock_index_blocked();
            l.st.inflight.sweep();
            while n < buf.len() && l.st.queued > 0 {
                if recover.len() == recover.capacity() || held.len() == held.capacity() {
                    break; // re-cover these before taking more (no allocation under the lock)
                }
                let Some(id) = l.next_queued() else { break };
                l.dequeue(id);
                l.st.cursor = id.saturating_add(1);
                let span = reg.wide.span(l.node(id));
                let slot = l.slot(id);
                let w = slot.word.load(Relaxed);
                let (s, e, hint) = event::take(w, *l.hint(id), span.start, span.end);
                // The event is taken: the region stays invalid until re-armed below.
                slot.word.store(w & !(PENDING | MANY), Release);
                buf[n] = Event {
                    cookie: Cookie(slot.cookie.load(Relaxed)),
                    start: s as usize,
                    end: e as usize,
                    hint,
                };
                n += 1;
                if l.st.inflight.overlaps(span.watch_start, span.watch_end) {
                    held.push(id); // re-armed below, once its REMOVE is known to be done
                } else if w & LOST != 0 {
                    recover.push((id, serial_of(w), span));
                } else {
                    slot.word.store(valid_word(serial_of(w) + 1), Release);
                }
            }
            // Regions over a REMOVE in flight stay invalid and get their event again: the user
            // re-arms them on a later read, after the zap.
            for id in held.drain(..) {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
            }
            if l.st.queued > 0 {
                break None;
            }
            // BUSY is only set under this lock, together with readiness: if it is clear, no
            // message is between its read() and its application, and the queue is truly empty.
            let c = sh.counter().load(SeqCst);
            if c & generation::BUSY == 0 {
                if l.st.ready {
                    sh.ready.drain();
                    l.st.ready = false;
                }
                // Stable too: the monitor changes it only between begin_message (which needs
                // this lock) and end_message (which clears BUSY after it).
                let notes = sh.counter.notification_word().load(SeqCst);
                break Some((Generation(c), notes));
            }
            if n == buf.len() {
                break None;
            }
            // The monitor is mid-message (maybe waiting for this lock): let it finish.
        };
        sh.events_read.fetch_add(n as u64, Relaxed);
        for (id, serial, span) in recover {
            self.recover(&mut reg, id, serial, &span);
        }
        Ok(ReadEvents {
            count: n,
            drained: drained.map(|d| d.0),
            drained_notifications: drained.map(|d| d.1),
        })
    }

    /// Re-arms a region whose watch was lost with an unmap: watch its pages again, then make it
    /// valid if nothing hit it meanwhile.
    ///
    /// Pages not mapped now are holes: the region goes into `holes`, so memory mapped there
    /// later and announced through [`mapped`](Self::mapped) is watched and its invalidation
    /// reported (no deaf region). A [`register_any`](Self::register_any) region becomes valid
    /// anyway (as registering it now would make it); a [`register`](Self::register) region
    /// stays invalid and keeps its watch marked lost, so every later re-arm looks again and the
    /// first one that finds all its pages mapped makes it valid.
    fn recover(&self, reg: &mut Registry, id: u32, serial: u64, span: &Span) {
        let sh = &*self.shared;
        let mut rewatch = *span;
        if widened(span) {
            // The VMAs it was widened to may have changed (a neighbour unmapped): watch what
            // covers its own pages now, within what coverage accounts for it.
            let page = sys::page_size() as u64;
            let own = (span.start & !(page - 1), span.end.next_multiple_of(page));
            match reg.budget.widen(own.0, own.1) {
                Ok(Some((s, e))) => {
                    rewatch.watch_start = s.max(span.watch_start);
                    rewatch.watch_end = e.min(span.watch_end);
                }
                // Holes: the mapped parts of its own pages, exactly.
                Ok(None) => (rewatch.watch_start, rewatch.watch_end) = own,
                Err(_) => return,
            }
        }
        // Counted before the holes are looked for (see `register_impl`).
        self.mark_holes(reg, id);
        let Registry { budget, .. } = &mut *reg;
        let whole = match sh.watch_mapped_parts(budget, rewatch.watch_start, rewatch.watch_end) {
            Ok(whole) => whole,
            Err(_) => return, // stays invalid, its watch lost: the next re-arm tries again
        };
        // (Holes here were unmapped with the region's watch: the event path's unmapped ring has
        // them, so `lost` will.)
        if whole {
            self.clear_holes(reg, id);
        }
        reg.watch_calls += 1;
        // As in `register_impl`: a `MADV_REMOVE` that began before the watch (checked below).
        if sh
            .open_fresh_window(reg, rewatch.watch_start, rewatch.watch_end, None)
            .is_some()
        {
            sh.wait_inflight(reg, &rewatch);
        }
        let mut l = sh.lock_index_blocked();
        l.st.inflight.sweep();
        let w = l.slot(id).word.load(Relaxed);
        if serial_of(w) == serial && l.node(id).tag() & KIND != 0 && w & PENDING == 0 {
            if l.st.inflight.overlaps(span.watch_start, span.watch_end) {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
                return;
            }
            if whole || l.node(id).tag() & ANY_RANGE != 0 {
                l.slot(id).word.store(valid_word(serial + 1), Release);
            }
        }
    }

    /// Reads every pending event into a new vector (convenience over [`read_events`](Self::read_events)).
    pub fn events(&self) -> Result<Vec<Event>> {
        ReadEvents::collect(|buf| self.read_events(buf))
    }

    /// Counters for diagnostics.
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        let (regions, coverage_segments, watched_bytes, wide_regions, vma_budget, vma_estimate) = {
            let reg = sh.lock_registry();
            let segments = reg.coverage.segments();
            (
                reg.cookies.len(),
                segments,
                reg.coverage.bytes(),
                reg.budget.wide_regions,
                reg.budget.limit,
                reg.budget.estimate(segments),
            )
        };
        let watch_calls = sh.lock_registry().watch_calls;
        let (pending, stray_overflows, inflight) = {
            let mut l = sh.lock_index_blocked();
            l.st.inflight.sweep();
            let f = &l.st.inflight;
            let inflight = (
                f.confirmed,
                f.by_grace,
                f.len(),
                f.fresh_confirmed,
                f.fresh_by_grace,
            );
            (l.st.queued, l.st.stray_overflow, inflight)
        };
        Stats {
            regions,
            messages: sh.messages.load(Relaxed),
            invalidations: sh.invalidations.load(Relaxed),
            events_read: sh.events_read.load(Relaxed),
            pending,
            coverage_segments,
            stray_overflows,
            watched_bytes,
            wide_regions,
            vma_budget,
            vma_estimate,
            removes_confirmed: inflight.0,
            removes_by_grace: inflight.1,
            removes_in_flight: inflight.2,
            fresh_windows_confirmed: inflight.3,
            fresh_windows_by_grace: inflight.4,
            watch_calls,
            hooks_only_watches: sh.watcher.hooks_only(),
            all_changed: sh.all_changed.load(Relaxed),
        }
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

/// The core's side of the seam: what backends deliver into (`crate::sink`). Event path: none
/// of these allocates, frees, unmaps or logs; they take only the index lock.
impl Sink for Shared {
    /// Monitor steps 2–3: busy and readable together, under the index lock, right before the
    /// read(). Taking the lock here is safe: no holder can be blocked waiting for us (holders
    /// never unmap, free or allocate, and run with signals blocked).
    fn begin(&self) {
        let mut l = self.lock_index();
        generation::begin_message(self.counter());
        generation::count_notification(self.counter.notification_word());
        // With no region registered, no event can be owed to a call that returned: a region
        // registered while this message is applied gets its readiness from `apply`. (The
        // process's context hands every notifier every message: idle ones stay quiet.)
        let owed = !l.st.tree.is_empty();
        self.readied_by_message.store(owed && !l.st.ready, Relaxed);
        if owed {
            self.signal_ready(&mut l);
        }
    }

    /// The monitor's step 5 for one message (see `crate::generation`).
    fn apply(&self, inv: Invalidation) {
        self.messages.fetch_add(1, Relaxed);
        if self.fail_next.swap(false, Relaxed) {
            panic!("injected event-path failure");
        }
        let mut l = self.lock_index();
        // An mremap move sends its `Remap` and, as the very next message of that call, the
        // `Unmap` of the old range. Only that next message pairs: a `Remap` of
        // `MREMAP_DONTUNMAP` has no `Unmap`, and any message in between (a `REMOVE`, another
        // call's `Unmap`) ends the pairing, so a later genuine unmap of the same range is never
        // taken for the tail of an earlier mremap (which would keep a stale hint).
        let last_remap = std::mem::take(&mut l.st.last_remap);
        let (newly, hits) = match inv {
            Invalidation::Unmap { start, end } => {
                let tail = last_remap == (start, end);
                l.invalidate(start, end, true, tail)
            }
            Invalidation::Remove { start, end } => l.invalidate(start, end, false, false),
            Invalidation::Remap { from, to, len } => {
                let end = from.saturating_add(len);
                l.st.last_remap = (from, end);
                if l.st.stray_len < STRAYS {
                    let i = l.st.stray_len;
                    l.st.strays[i] = (to, to.saturating_add(len));
                    l.st.stray_len += 1;
                } else {
                    l.st.stray_overflow += 1;
                }
                self.strays_pending.store(true, Release);
                // MREMAP_DONTUNMAP leaves the old range mapped but the watch moved: treat the old
                // range as having lost coverage.
                l.invalidate(from, end, true, false)
            }
            Invalidation::Other => (false, 0),
        };
        self.invalidations.fetch_add(hits, Relaxed);
        if hits > 0 {
            self.message_hit.store(true, Relaxed);
        }
        if newly {
            self.signal_ready(&mut l);
        }
    }

    /// Monitor step 6 (the notification count settled first).
    ///
    /// One context serves every notifier of the process, so most messages a notifier is handed
    /// concern other notifiers' pages. A message that hit none of this notifier's regions
    /// changed nothing a check can see: its counter goes back to the value before `begin`
    /// (so `unchanged_since` and the cache's fast path stay true), and the readiness `begin`
    /// raised is taken back if the queue is still empty.
    fn end(&self) {
        let hit = self.message_hit.swap(false, Relaxed);
        generation::settle_notification(self.counter.notification_word(), hit);
        if hit {
            // The counter moves on anyway. (A flag set after this swap, by an invalidation that
            // saw this message busy, carries to the next message: one spurious move, safe.)
            self.overlapped.store(false, Relaxed);
            generation::end_message(self.counter());
            return;
        }
        let mut l = self.lock_index();
        // Under the lock: an in-thread invalidation either ran before (and set the flag) or
        // runs after the counter is even again (and so never overlaps this message).
        if self.overlapped.swap(false, Relaxed) {
            generation::end_message(self.counter());
            return;
        }
        if self.readied_by_message.load(Relaxed) && l.st.ready && l.st.queued == 0 {
            self.ready.drain();
            l.st.ready = false;
        }
        generation::cancel_message(self.counter());
    }

    /// The hooks backend's event path: the monitor's steps 2–5 under one hold of the index lock
    /// (so the counter is odd only while that lock is held, as with one monitor). Does nothing,
    /// and leaves the counter alone, when no region overlaps the range. Never calls a patched
    /// libc function (see `backend::hooks`).
    fn invalidate_in_thread(&self, start: u64, end: u64, unmap: bool, again: bool) {
        let mut l = self.lock_index();
        let mut any = false;
        {
            let Locked { st, slots, .. } = &mut l;
            let slots: &SegVec<Slot> = slots;
            st.tree
                .for_each_overlap(&SlotNodes(slots), start, end, |id| {
                    let slot = slots.get(id).expect("tree node id without a slot");
                    any |= !(again && slot.word.load(Relaxed) & PENDING != 0);
                });
        }
        if !any {
            if unmap {
                // No region hit, but the watch over the pages may be gone all the same.
                l.st.record_unmapped(start, end);
            }
            return;
        }
        // A region is hit (checked above): its 2010 notification is counted for good.
        self.messages.fetch_add(1, Relaxed);
        self.invalidate_as_message(&mut l, start, end, unmap, again);
    }

    /// Every region invalid, each with an event for its whole range (not an unmap: watches stay).
    fn invalidate_all(&self) {
        self.all_changed.fetch_add(1, Relaxed);
        let mut l = self.lock_index();
        self.messages.fetch_add(1, Relaxed);
        self.invalidate_as_message(&mut l, 0, u64::MAX, false, false);
    }

    /// A `REMOVE` (or another announced invalidation) is in flight until its end is known
    /// (`crate::inflight`). No allocation, no syscall but the vDSO clock, the index lock only.
    fn window_open(&self, start: u64, end: u64, how: WindowEnd) -> Window {
        let mut l = self.lock_index();
        l.st.inflight.sweep();
        Window(l.st.inflight.record(start, end, how == WindowEnd::Closed))
    }

    fn window_close_range(&self, start: u64, end: u64) {
        let mut l = self.lock_index();
        l.st.inflight.close_range(start, end);
        l.st.inflight.sweep();
    }

    fn window_close(&self, window: Window) {
        let mut l = self.lock_index();
        l.st.inflight.close(window.0);
        l.st.inflight.sweep();
    }

    /// Every check fails from now on.
    fn kill(&self) {
        generation::kill(self.counter());
        generation::kill(self.counter.notification_word());
        // Unconditionally: a `poll` that starts later still finds it readable.
        sys::eventfd_signal(self.ready.fd.as_fd());
    }
}
