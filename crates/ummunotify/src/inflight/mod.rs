//! `REMOVE` in flight (issue 9): a userfaultfd `REMOVE` is a "start" with no "end".
//!
//! For a watched range, `madvise(DONTNEED/FREE/DONTNEED_LOCKED/REMOVE)`, `process_madvise`,
//! `IORING_OP_MADVISE` and glibc's thread-stack release queue the `REMOVE` message, drop
//! `mmap_lock`, sleep until the monitor *dequeues* it, and only then zap the pages. A pin taken
//! between that dequeue and the zap holds the frames about to be dropped, and no later message
//! comes. So from the moment the monitor has read a `REMOVE` until the zap is known to have
//! happened, the range is *in flight* ([`InFlight`], under the index lock): registering a region
//! over it waits for the end (or, after a bound, is born invalid with an event), and re-arming one
//! waits likewise. See `docs/architecture/in-flight.md`, "REMOVE in flight", for the argument.
//!
//! How the end is learnt (only when a user call needs the range; the monitor just records):
//!
//! 1. **Who** ([`Scanner`]): after the read, the sender is either done with its call, or still
//!    in it: running, or asleep inside it, where `/proc/self/task/TID/syscall` shows `madvise`
//!    with its range or `process_madvise`. The threads in those states are the entry's members.
//! 2. **When**: each member is sent a queued real-time signal ([`SIGNAL_OFFSET`] below
//!    `SIGRTMAX`; at most one pending per thread). A handler runs only on the way back to user
//!    space and stamps the thread's ack word with the process-wide ticket counter; an entry ends
//!    when every member's stamp is at least the entry's ticket (issued right after the read) or
//!    the member is gone (`tgkill(.., 0)` says `ESRCH`).
//! 3. **What can not be learnt**: a busy io_uring worker or another process may be the sender;
//!    such an entry ends [`UNIDENTIFIED_GRACE`] after the read. A member that neither stamps nor
//!    exits (it blocks the signal) ends its entry after [`STUCK_GRACE`]. These are the residual
//!    window, measured by `tests/remove_race.rs`.
//!
//! Memory is bounded: [`ENTRIES`] entries per notifier (a member set each), a table of
//! [`THREADS`] named threads for the process. A full entry table merges the new entry into the
//! newest (union of ranges, the newer ticket): conservative, never stale, and the monitor never
//! waits for room (a waiting monitor would deadlock with senders waiting for their message to be
//! read). A thread that finds no slot in the thread table leaves its entry unnamed.
#![allow(unsafe_code)] // /proc reads with stack buffers, rt_tgsigqueueinfo, the signal handler.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::sync::Once;
use std::time::Duration;

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{self, AcqRel, Acquire, Release};

/// Entries (in-flight `REMOVE`s) per notifier.
pub(crate) const ENTRIES: usize = 64;
/// The signal is `SIGRTMAX - SIGNAL_OFFSET` (glibc: 62), unless `UMN_SIGNAL` names another
/// (0 disables signalling: every entry then ends by exit or grace).
pub const SIGNAL_OFFSET: i32 = 2;
/// How long a `REMOVE` nobody could be named for stays in flight (5 ms was too short on a loaded
/// machine: a woken io-wq worker can wait that long for a CPU before it zaps).
pub const UNIDENTIFIED_GRACE: Duration = Duration::from_millis(100);
/// How long a named thread that neither acknowledged nor exited keeps its entry in flight.
pub const STUCK_GRACE: Duration = Duration::from_millis(200);
/// How long a window the backend ends itself ([`WindowEnd::Closed`](crate::sink::WindowEnd):
/// the patched kernel's `REMOVE_DONE`, a perf or eBPF exit record) stays open when that end does
/// not come. The end normally comes; this bounds windows nobody will close (a notifier that
/// joined after the start). 200 ms was too short with two vCPUs under a loaded host: a
/// `MADV_REMOVE` that waits for a busy inode lock before it punches sent its `REMOVE_DONE` after
/// it, and the window had ended by grace (the patched guest, after the guests got their second
/// CPU). Longer is only more conservative: registrations over the window wait at most twice
/// `STUCK_GRACE` and are then born invalid.
pub const CLOSED_GRACE: Duration = Duration::from_secs(2);

/// `madvise` and `process_madvise` on x86_64 (`/proc/TID/syscall` numbers).
const NR_MADVISE: i64 = libc::SYS_madvise;
const NR_PROCESS_MADVISE: i64 = libc::SYS_process_madvise;

// --- The ack protocol (loom-checked below) ---------------------------------------------------
//
// Tickets come from one process-wide counter, issued by the monitor *after* the read that
// released a sender. Each named thread has an ack word; the signal handler stamps it with the
// counter's value at the time the handler runs. A stamp >= t proves the thread ran a handler,
// i.e. was back in user space, after ticket t was issued, hence after the read: if it was the
// sender, its zap is done. Stamps only grow, so one handler run answers every earlier ticket.

/// An atomic word: std's in the process-wide tables, loom's in the model.
pub(crate) trait Word {
    fn get(&self, order: Ordering) -> u64;
    fn max(&self, v: u64, order: Ordering);
    fn add(&self, v: u64, order: Ordering) -> u64;
}

impl Word for AtomicU64 {
    #[inline]
    fn get(&self, order: Ordering) -> u64 {
        self.load(order)
    }
    #[inline]
    fn max(&self, v: u64, order: Ordering) {
        self.fetch_max(v, order);
    }
    #[inline]
    fn add(&self, v: u64, order: Ordering) -> u64 {
        self.fetch_add(v, order)
    }
}

#[cfg(loom)]
impl Word for loom::sync::atomic::AtomicU64 {
    fn get(&self, order: Ordering) -> u64 {
        self.load(order)
    }
    fn max(&self, v: u64, order: Ordering) {
        self.fetch_max(v, order);
    }
    fn add(&self, v: u64, order: Ordering) -> u64 {
        self.fetch_add(v, order)
    }
}

/// The monitor, after the read: a new ticket. AcqRel: a handler that reads this value (or a
/// later one) is ordered after the read that released the sender.
#[inline]
pub(crate) fn issue(next: &impl Word) -> u64 {
    next.add(1, AcqRel) + 1
}

/// The signal handler: this thread is in user space now.
#[inline]
pub(crate) fn stamp(ack: &impl Word, next: &impl Word) {
    ack.max(next.get(Acquire), Release);
}

/// Whether the thread ran a handler after ticket `t` was issued.
#[inline]
pub(crate) fn acked(ack: &impl Word, t: u64) -> bool {
    ack.get(Acquire) >= t
}

/// Set by [`disable_for_tests`]: the monitor records no `REMOVE` (the behaviour before issue 9).
static DISABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the in-flight protection off for the rest of the process: `REMOVE`s are no longer
/// recorded, so registrations and re-arms never wait for a zap, as before issue 9. Breaks
/// guarantee 1 on purpose; only for tests and measurements that show what the protection
/// prevents (the REMOVE-race stress, the torture's REMOVE churn, `umn coverage`'s race row).
#[doc(hidden)]
pub fn disable_for_tests() {
    DISABLED.store(true, Relaxed);
}

/// Whether [`disable_for_tests`] was called.
pub(crate) fn disabled() -> bool {
    DISABLED.load(Relaxed)
}

/// Threads of the process that can be named at once.
pub(crate) const THREADS: usize = 256;
const MASK_WORDS: usize = THREADS / 64;

static TIDS: [AtomicI32; THREADS] = [const { AtomicI32::new(0) }; THREADS];
static ACK: [AtomicU64; THREADS] = [const { AtomicU64::new(0) }; THREADS];
/// The counter's value at the last signal sent to the thread: a signal is pending while
/// `SENT > ACK`.
static SENT: [AtomicU64; THREADS] = [const { AtomicU64::new(0) }; THREADS];
static NEXT: AtomicU64 = AtomicU64::new(1);
/// The signal in use (0: none).
static SIGNO: AtomicI32 = AtomicI32::new(0);

/// Monitor threads of this process, as `pid << 32 | tid` (the pid keeps a forked child from
/// trusting its parent's entries). A monitor never changes watched memory (it would deadlock),
/// runs with every signal blocked, and so is never a member.
static MONITORS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

fn monitor_key(tid: i32) -> u64 {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    (pid as u64) << 32 | tid as u32 as u64
}

/// Notes a monitor thread (when it starts). Without room it is simply not skipped: it then
/// counts as a member that never acknowledges (the entry ends by grace), never as missing.
pub(crate) fn note_monitor(tid: i32) {
    let k = monitor_key(tid);
    for m in &MONITORS {
        if m.compare_exchange(0, k, Relaxed, Relaxed).is_ok() {
            return;
        }
    }
}

/// Forgets a monitor thread (after it was joined: its tid may be reused).
pub(crate) fn forget_monitor(tid: i32) {
    let k = monitor_key(tid);
    for m in &MONITORS {
        let _ = m.compare_exchange(k, 0, Relaxed, Relaxed);
    }
}

fn is_monitor(tid: i32) -> bool {
    let k = monitor_key(tid);
    MONITORS.iter().any(|m| m.load(Relaxed) == k)
}

/// The thread table's slot for `tid`, claiming a free one or one of a thread that is gone.
fn thread_slot(tid: i32) -> Option<usize> {
    // Threads are usually found where they were put: start at a hash of the tid.
    let h = tid as usize % THREADS;
    for k in 0..THREADS {
        let i = (h + k) % THREADS;
        match TIDS[i].load(Relaxed) {
            t if t == tid => return Some(i),
            0 if TIDS[i].compare_exchange(0, tid, Relaxed, Relaxed).is_ok() => {
                SENT[i].store(0, Release);
                return Some(i);
            }
            _ => {}
        }
    }
    for (i, t) in TIDS.iter().enumerate() {
        let old = t.load(Relaxed);
        if old != 0 && !thread_alive(old) && t.compare_exchange(old, tid, Relaxed, Relaxed).is_ok()
        {
            // A signal left pending by the thread that is gone must not hold back this one's.
            SENT[i].store(0, Release);
            return Some(i);
        }
    }
    None
}

/// Monotonic nanoseconds (vDSO; no allocation).
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The decimal digits of `v`, NUL-padded.
fn itoa_digits(mut v: u32) -> [u8; 11] {
    let mut rev = [0u8; 10];
    let mut n = 0;
    loop {
        rev[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut out = [0u8; 11];
    for k in 0..n {
        out[k] = rev[n - 1 - k];
    }
    out
}

// --- The table -------------------------------------------------------------------------------

/// A thread that may be the sender of a `REMOVE`, and the range its call names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub tid: i32,
    pub start: u64,
    pub end: u64,
    /// An io_uring worker (`iou-wrk-*`): a kernel thread that never returns to user space.
    pub io_worker: bool,
}

/// A set of thread-table slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Members([u64; MASK_WORDS]);

impl Members {
    fn add(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn union(&mut self, o: &Members) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a |= b;
        }
    }
    /// The slots in the set, lowest first (one step per member, not per slot).
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            let mut rest = bits;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let b = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(w * 64 + b)
            })
        })
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    start: u64,
    end: u64,
    /// Every member must have stamped at least this.
    ticket: u64,
    since: u64,
    members: Members,
    /// Not every possible sender could be named.
    unnamed: bool,
    /// Busy io_uring workers that may be the sender (they run no signal handler): each is
    /// cleared when a later look finds it idle or gone ([`InFlight::worker_idle`]); until then
    /// the entry can end only by [`UNIDENTIFIED_GRACE`].
    workers: [i32; WORKERS],
    n_workers: u8,
    /// Members were named (by a scan made after the read).
    resolved: bool,
    /// Holds more than one invalidation (the table was full): `close` can not end it.
    merged: bool,
    /// Ended by `close` (or `STUCK_GRACE`), never by naming senders.
    explicit: bool,
    /// A fresh-watch window (no `REMOVE` was read: see [`InFlight::record_fresh`]), counted
    /// apart from the `REMOVE`s.
    fresh: bool,
}

/// Busy io_uring workers followed per entry; more leave the entry to its grace.
pub(crate) const WORKERS: usize = 4;

/// The in-flight `REMOVE`s of one notifier (under its index lock).
#[derive(Debug)]
pub(crate) struct InFlight {
    entries: [Entry; ENTRIES],
    len: usize,
    /// Entries ended by acknowledgement or exit / by grace / merged for want of room.
    pub confirmed: u64,
    pub by_grace: u64,
    pub merged: u64,
    /// Fresh-watch windows ended by acknowledgement or exit / by grace.
    pub fresh_confirmed: u64,
    pub fresh_by_grace: u64,
    /// Members `sweep` found owing an acknowledgement to a newer entry, to be signalled again
    /// by a user thread ([`take_resend`](Self::take_resend)).
    resend: Members,
}

/// Signals to send after the table was updated (outside the index lock).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outbox(Members);

impl Outbox {
    /// Sends the signals, from a user thread with no lock held: only after a fresh look at the
    /// host's handlers found every one that runs on the alternate stack blocking ours
    /// ([`guard_hosts`]), microseconds before the signals go. One that can not be sent leaves
    /// its member to a later look, exit or grace.
    pub(crate) fn send(&self) {
        if self.0 == Members::default() {
            return;
        }
        let Some(on_stack) = guard_hosts() else {
            return;
        };
        let Some(sig) = live_signal() else { return };
        for i in self.0.iter() {
            // Not into a host handler entered before its mask had our signal (see there): the
            // member is signalled by a later round, once that handler returned.
            if on_stack != 0 && in_unguarded_handler(TIDS[i].load(Relaxed), on_stack, sig) {
                continue;
            }
            send(sig, i);
        }
    }
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            entries: [Entry::default(); ENTRIES],
            len: 0,
            confirmed: 0,
            by_grace: 0,
            merged: 0,
            fresh_confirmed: 0,
            fresh_by_grace: 0,
            resend: Members::default(),
        }
    }
}

/// Below this age an entry's unacknowledged members are not re-checked with syscalls.
const RECHECK_NS: u64 = 100_000;

impl InFlight {
    /// How many are in flight.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[start, end)` overlaps a `REMOVE` in flight.
    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        self.entries[..self.len]
            .iter()
            .any(|e| e.start < end && start < e.end)
    }

    /// Records a dequeued `REMOVE` of `[start, end)` (the monitor, right after the read). Its
    /// senders are named later, by the first user call that needs the range ([`resolve`]).
    /// When the table is full the entry is merged into the newest one (union of ranges, the
    /// newer ticket, unresolved again): never dropped, never waiting.
    ///
    /// Returns the entry's ticket, for [`close`](Self::close). An `explicit` entry is ended by
    /// `close` (the backend knows the end), or after [`CLOSED_GRACE`] ([`STUCK_GRACE`] once
    /// merged); nobody is named for it.
    ///
    /// [`resolve`]: Self::resolve
    pub(crate) fn record(&mut self, start: u64, end: u64, explicit: bool) -> u64 {
        self.record_as(start, end, explicit, false)
    }

    /// Records a fresh-watch window over `[start, end)`: a registration watched shared memory
    /// just now, and a `madvise(MADV_REMOVE)` that looked for a watch before may still zap it
    /// (`docs/architecture/in-flight.md`, "Fresh watches of shared memory"). Resolved like a `REMOVE`
    /// read now; counted in `fresh_confirmed` / `fresh_by_grace`.
    pub(crate) fn record_fresh(&mut self, start: u64, end: u64) -> u64 {
        self.record_as(start, end, false, true)
    }

    fn record_as(&mut self, start: u64, end: u64, explicit: bool, fresh: bool) -> u64 {
        let ticket = issue(&NEXT);
        let since = now_ns();
        if self.len == ENTRIES {
            let last = &mut self.entries[ENTRIES - 1];
            last.start = last.start.min(start);
            last.end = last.end.max(end);
            last.ticket = ticket;
            last.since = since;
            // A merge that holds an explicit window ends only by grace (conservative: the
            // learnt part then waits `STUCK_GRACE` too); otherwise its senders are named again.
            last.explicit |= explicit;
            last.fresh &= fresh;
            last.resolved = last.explicit;
            last.merged = true;
            self.merged += 1;
            return ticket;
        }
        self.entries[self.len] = Entry {
            start,
            end,
            ticket,
            since,
            // Nothing to name: `resolve` and `sweep`'s naming skip it.
            resolved: explicit,
            explicit,
            fresh,
            ..Entry::default()
        };
        self.len += 1;
        ticket
    }

    /// Ends the oldest explicit, unmerged entry over exactly `[start, end)` (a backend whose end
    /// names the range: the patched kernel's `REMOVE_DONE`). Equal ranges are interchangeable:
    /// the range stays in flight until the last of them ends.
    pub(crate) fn close_range(&mut self, start: u64, end: u64) -> bool {
        let oldest = self.entries[..self.len]
            .iter()
            .filter(|e| e.explicit && !e.merged && (e.start, e.end) == (start, end))
            .map(|e| e.ticket)
            .min();
        oldest.is_some_and(|t| self.close(t))
    }

    /// Ends the entry recorded with `ticket`, for a backend that learns the end of an
    /// invalidation itself (a kernel module's `invalidate_range_end`). Counted as confirmed.
    /// An entry merged since (its ticket replaced) is left to the usual rules: the merge may
    /// cover another invalidation whose end is not known.
    pub(crate) fn close(&mut self, ticket: u64) -> bool {
        let Some(i) = self.entries[..self.len]
            .iter()
            .position(|e| e.ticket == ticket && !e.merged)
        else {
            return false;
        };
        self.len -= 1;
        self.entries[i] = self.entries[self.len];
        self.confirmed += 1;
        true
    }

    /// The ticket counter now: a scan started after this value was read can resolve every
    /// entry whose ticket is not above it.
    pub(crate) fn horizon() -> u64 {
        NEXT.load(Acquire)
    }

    /// Whether an entry with ticket <= `horizon` overlaps `[start, end)`.
    pub(crate) fn overlaps_upto(&self, start: u64, end: u64, horizon: u64) -> bool {
        self.entries[..self.len]
            .iter()
            .any(|e| e.ticket <= horizon && e.start < end && start < e.end)
    }

    /// Whether an unresolved entry overlaps `[start, end)`.
    pub(crate) fn unresolved(&self, start: u64, end: u64) -> bool {
        self.entries[..self.len]
            .iter()
            .any(|e| !e.resolved && e.start < end && start < e.end)
    }

    /// Names the members of every unresolved entry with ticket <= `horizon` from a scan that
    /// started after `horizon` was read; returns the signals to send (outside the lock).
    pub(crate) fn resolve(
        &mut self,
        horizon: u64,
        candidates: &[Candidate],
        overflowed: bool,
    ) -> Outbox {
        let mut out = Members::default();
        for e in self.entries[..self.len]
            .iter_mut()
            .filter(|e| !e.resolved && e.ticket <= horizon)
        {
            e.resolved = true;
            e.unnamed = overflowed;
            for c in candidates
                .iter()
                .filter(|c| c.start < e.end && e.start < c.end)
            {
                if c.io_worker {
                    // Runs no handler: ends when seen idle after the read, or by the grace.
                    if (e.n_workers as usize) < WORKERS {
                        e.workers[e.n_workers as usize] = c.tid;
                        e.n_workers += 1;
                    } else {
                        e.unnamed = true;
                    }
                    continue;
                }
                match thread_slot(c.tid) {
                    Some(i) => e.members.add(i),
                    None => e.unnamed = true,
                }
            }
            out.union(&e.members);
        }
        Outbox(out)
    }

    /// The busy io_uring workers that keep an entry overlapping `[start, end)` in flight (at most
    /// `out.len()`, each once).
    pub(crate) fn workers(&self, start: u64, end: u64, out: &mut [i32]) -> usize {
        let mut n = 0;
        for e in self.entries[..self.len]
            .iter()
            .filter(|e| e.start < end && start < e.end)
        {
            for &w in &e.workers[..e.n_workers as usize] {
                if n < out.len() && !out[..n].contains(&w) {
                    out[n] = w;
                    n += 1;
                }
            }
        }
        n
    }

    /// A later look at the members: a scan that started after `horizon` was read did not list
    /// a member (it is neither running nor in `madvise` over the entry's range nor in
    /// `process_madvise`), so it is not inside the call that sent any entry with ticket <=
    /// `horizon` (that call began before the entry's read, or before the fresh watch, and a
    /// call does not resume once it returned): those entries stop waiting for it. Ends entries
    /// without a signal: threads blocked elsewhere by now, or with the signal off. A scan that
    /// could not list every thread narrows nothing.
    pub(crate) fn narrow(&mut self, horizon: u64, candidates: &[Candidate], overflowed: bool) {
        if overflowed {
            return;
        }
        for e in self.entries[..self.len]
            .iter_mut()
            .filter(|e| e.resolved && !e.explicit && e.ticket <= horizon)
        {
            let mut keep = Members::default();
            for m in e.members.iter() {
                let tid = TIDS[m].load(Relaxed);
                if candidates
                    .iter()
                    .any(|c| !c.io_worker && c.tid == tid && c.start < e.end && e.start < c.end)
                {
                    keep.add(m);
                }
            }
            e.members = keep;
        }
    }

    /// io_uring worker `tid` was seen idle (waiting for work) or gone by a look that started
    /// after `horizon` was read: it is not inside a call that sent any entry with ticket <=
    /// `horizon` (such a call began before the read and ends after its zap), so those entries
    /// stop waiting for it.
    pub(crate) fn worker_idle(&mut self, tid: i32, horizon: u64) {
        for e in self.entries[..self.len]
            .iter_mut()
            .filter(|e| e.resolved && e.ticket <= horizon)
        {
            let n = e.n_workers as usize;
            if let Some(k) = e.workers[..n].iter().position(|&w| w == tid) {
                e.workers[k] = e.workers[n - 1];
                e.n_workers -= 1;
            }
        }
    }

    /// The members `sweep` noted for a new signal (to send with [`Outbox::send`]).
    pub(crate) fn take_resend(&mut self) -> Outbox {
        Outbox(std::mem::take(&mut self.resend))
    }

    /// Ends every entry whose zap is known to have happened (or whose grace ran out); notes for
    /// a new signal ([`take_resend`](Self::take_resend)) a member whose last signal was handled
    /// before the entry's ticket. Returns whether any ended. Cheap when empty.
    pub(crate) fn sweep(&mut self) -> bool {
        if self.len == 0 {
            return false;
        }
        let now = now_ns();
        let mut i = 0;
        let mut ended = false;
        // Per sweep, each thread is checked (and signalled again) at most once.
        let mut checked = Members::default();
        let mut gone = Members::default();
        while i < self.len {
            let e = &self.entries[i];
            if !e.resolved {
                i += 1;
                continue;
            }
            let age = now.saturating_sub(e.since);
            let grace_ns = if e.explicit && !e.merged {
                CLOSED_GRACE
            } else {
                STUCK_GRACE
            };
            let stuck = age >= grace_ns.as_nanos() as u64;
            // An explicit window has no members: only `close` or the grace end it.
            let mut all = !e.explicit;
            for m in e.members.iter() {
                if acked(&ACK[m], e.ticket) || gone.has(m) {
                    continue;
                }
                all = false;
                if age < RECHECK_NS || checked.has(m) {
                    continue;
                }
                checked.add(m);
                if !thread_alive(TIDS[m].load(Relaxed)) {
                    gone.add(m);
                    continue;
                }
                // Signalled by the next waiting user thread (`take_resend`), after it looked at
                // the host's handlers: this may be the monitor, which never signals.
                self.resend.add(m);
            }
            // A member found gone above counted as not done for this entry; look again.
            if !all && !e.explicit {
                all = e
                    .members
                    .iter()
                    .all(|m| acked(&ACK[m], e.ticket) || gone.has(m));
            }
            let confirmed = all && !e.unnamed && e.n_workers == 0;
            let grace = if (e.unnamed || e.n_workers > 0) && all {
                age >= UNIDENTIFIED_GRACE.as_nanos() as u64
            } else {
                stuck
            };
            if confirmed || grace {
                match (e.fresh, confirmed) {
                    (false, true) => self.confirmed += 1,
                    (false, false) => self.by_grace += 1,
                    (true, true) => self.fresh_confirmed += 1,
                    (true, false) => self.fresh_by_grace += 1,
                }
                self.len -= 1;
                self.entries[i] = self.entries[self.len];
                ended = true;
            } else {
                i += 1;
            }
        }
        ended
    }
}

mod scan;
mod signal;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use scan::Scanner;
pub use signal::signal;
pub(crate) use signal::{guard_hosts, install, signal_counts};
use signal::{in_unguarded_handler, live_signal, send, thread_alive};

/// The in-flight rule under loom: a registration racing a `REMOVE` (before the read, between
/// the read and the record, between record and apply, after apply, after the zap) is never valid
/// with the old frame pinned once the call has returned. Run with
/// `RUSTFLAGS="--cfg loom" cargo test -p ummunotify --lib --release loom`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::{acked, issue, stamp};
    use crate::generation::{begin_message, end_message, region_valid};
    use loom::sync::atomic::{AtomicBool, AtomicU64};
    use loom::sync::{Arc, Mutex};
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};

    const OLD: u64 = 1;
    const NEW: u64 = 2;
    const VALID: u64 = 2;
    const INVALID: u64 = 1;

    /// What the index lock guards, reduced to this rule's part.
    #[derive(Default)]
    struct Locked {
        /// The in-flight entry's ticket.
        entry: Option<u64>,
        /// Whether the region is in the index (the monitor's apply then invalidates it).
        registered: bool,
    }

    struct World {
        index: Mutex<Locked>,
        /// The frame mapped at the address: OLD until the zap.
        frame: AtomicU64,
        /// The region's validity word.
        word: AtomicU64,
        /// The monitor's read() dequeued the message: the sender may go on and zap.
        released: AtomicBool,
        /// The sender's call has returned.
        returned: AtomicBool,
        /// The ack signal was queued to the sender.
        sent: AtomicBool,
        /// The sender's ack word and the ticket counter.
        ack: AtomicU64,
        next: AtomicU64,
        /// The generation counter (the visibility protocol this rule builds on).
        counter: AtomicU64,
    }

    /// The monitor, in `monitor.rs` order: busy, read, record, apply, send, idle.
    fn monitor(w: &World) {
        begin_message(&w.counter);
        w.released.store(true, SeqCst);
        {
            let mut l = w.index.lock().unwrap();
            l.entry = Some(issue(&w.next));
        }
        {
            let l = w.index.lock().unwrap();
            if l.registered {
                w.word.fetch_or(INVALID, Relaxed);
            }
        }
        w.sent.store(true, SeqCst);
        end_message(&w.counter);
    }

    /// The sender: zaps after the dequeue, returns; its handler runs after the signal was sent
    /// and after the zap (on a return to user space).
    fn sender(w: &World) {
        while !w.released.load(SeqCst) {
            loom::thread::yield_now();
        }
        w.frame.store(NEW, SeqCst);
        w.returned.store(true, SeqCst);
        while !w.sent.load(SeqCst) {
            loom::thread::yield_now();
        }
        stamp(&w.ack, &w.next);
    }

    /// `Notifier::register` (one attempt, no waiting), then the pin, then a check made after the
    /// sender's call returned.
    fn registrar(w: &World) {
        {
            let mut l = w.index.lock().unwrap();
            if let Some(t) = l.entry {
                if acked(&w.ack, t) {
                    l.entry = None; // sweep: the zap is known to have happened
                }
            }
            l.registered = true;
            if l.entry.is_some() {
                w.word.fetch_or(INVALID, Relaxed); // born invalid
            }
        }
        let pinned = w.frame.load(SeqCst);
        if w.returned.load(SeqCst) && region_valid(&w.counter, &w.word, VALID, || {}) {
            assert_eq!(pinned, NEW, "valid registration pins the dropped frame");
        }
    }

    #[test]
    fn no_valid_pin_of_a_removed_frame() {
        loom::model(|| {
            let w = Arc::new(World {
                index: Mutex::new(Locked::default()),
                frame: AtomicU64::new(OLD),
                word: AtomicU64::new(VALID),
                released: AtomicBool::new(false),
                returned: AtomicBool::new(false),
                sent: AtomicBool::new(false),
                ack: AtomicU64::new(0),
                next: AtomicU64::new(1),
                counter: AtomicU64::new(0),
            });
            let m = {
                let w = w.clone();
                loom::thread::spawn(move || monitor(&w))
            };
            let s = {
                let w = w.clone();
                loom::thread::spawn(move || sender(&w))
            };
            registrar(&w);
            m.join().unwrap();
            s.join().unwrap();
        });
    }
}
