//! The perf tracepoint backend (issue 13): the 2009 counter-proposal, built.
//!
//! # Mechanism
//! `perf_event_open` on the `syscalls:sys_enter_*` and `sys_exit_*` tracepoints of every call
//! that can change the pages behind a range ([`Syscall::ALL`]: munmap, mremap, madvise, brk,
//! mmap, shmdt, shmat, process_madvise, remap_file_pages), one ring per CPU:
//!
//! * **Filtered in the kernel to this process.** Each event is per thread *and* per CPU
//!   (`pid = tid, cpu = c`) with `inherit` + `inherit_thread`: threads created later inherit it,
//!   forked children do not; every event of CPU `c` writes into CPU `c`'s ring
//!   (`PERF_EVENT_IOC_SET_OUTPUT`). Threads that exist at [`Perf::open`] get their own events
//!   (`/proc/self/task`, read again until no new thread appears); a per-task event on every CPU
//!   (`cpu = -1`) with `inherit` can not be mapped (EINVAL), and a system-wide event filtered on
//!   `common_pid` sees one thread only (`common_pid` is the tid). Other processes' calls never
//!   reach the rings; they pay the syscall tracepoints' slow path all the same (the kernel turns
//!   it on for every task while any syscall tracepoint is enabled): `umn bench --backends`
//!   measures that tax.
//! * **Not filtered to registered ranges.** The filter language compares a field with a constant
//!   (`addr < 0x...`); it has no arithmetic, so "the call's range overlaps a registered one"
//!   (`addr < end && addr + len > start`) can not be said, and each registration would have to
//!   re-filter every event of every thread and CPU. Nor by argument (`flags & MAP_FIXED`): every
//!   entry must be in the ring so that every exit has its entry (below).
//! * **The check** ([`Perf::pending`]): one load of `data_head` per ring, compared with what was
//!   consumed (N loads for N CPUs). The record is written by the calling thread at syscall
//!   entry, before the call does its work and so before it returns: a check made after the call
//!   returned sees the head moved.
//! * **Delivery** ([`Perf::pull`]): new records are decoded and handed to a [`Target`] (the
//!   notifier core) as `begin`, `window_open` per range, `apply` per range, `end`; exits close the
//!   windows. A record is taken at entry, so a failed call (munmap of an unaligned address)
//!   invalidates all the same: conservative.
//!
//! # Start and end: the invalidation-in-progress window
//! The entry record comes *before* the change. A registration made after the entry was
//! delivered and before the change completes would pin the frames about to go. So the call's
//! end (its `sys_exit_*` record, or the thread's next entry) invalidates its ranges *again*,
//! like the hooks' second pass: the exit record is in the ring before the call returns, so
//! every check after the return delivers it first. Each entry with a range also opens a window
//! (`Target::window_open`: a registration over it waits, bounded, and is born invalid) that the
//! end closes; the core may end a window by grace, which the second pass makes harmless
//! (`tests/perf.rs` blocks a madvise between entry and exit with a userfaultfd and fails
//! without the second pass). Matching is by thread (a
//! thread is in one syscall at a time) and time: an exit closes the thread's open entries older
//! than it. Rings are per CPU and a thread may move between entry and exit, so a pull snapshots
//! every head twice and takes entries up to the second snapshot, exits only up to the first: an
//! exit below the first snapshot has its entry below the second.
//!
//! # What can be lost, and what then
//! * **A full ring drops records silently** until drained. A pull that finds less than
//!   [`decode::MAX_RECORD`] bytes free in a ring, or a `PERF_RECORD_LOST`/`THROTTLE` record,
//!   calls `Target::invalidate_all`: never a stale use, never unbounded memory. Its open entries
//!   are forgotten (their exits may be among the lost; the core's in-flight protocol ends their
//!   windows).
//! * **An exit with no entry** (the entry was lost, or the call began before the events were
//!   open): some change of unknown range has just completed, so `invalidate_all` again (regions
//!   registered since the loss are covered by it).
//! * **Unseen** (`umn coverage --backend perf`): io_uring `IORING_OP_MADVISE` (no syscall),
//!   changes to a file behind a mapping (`fallocate(PUNCH_HOLE)`, `ftruncate`), 32-bit
//!   (`int 0x80`) syscalls (syscall tracepoints skip compat calls), another process's
//!   `process_madvise` on us, a `CLONE_VM` child that is not a thread, CPUs brought online later.
//!
//! * **Suppressed by a BPF program.** A BPF program attached (by anyone on the machine) to one
//!   of these tracepoints that returns 0 makes the kernel skip *every* perf event of that
//!   tracepoint, system-wide (`perf_syscall_enter`: `!perf_call_bpf_enter(..)` returns before
//!   the perf events are written). Seen here: while the eBPF backend's tests ran, the rings
//!   recorded nothing for munmap, mremap, madvise, brk, mmap, shmdt, shmat and process_madvise.
//!   So [`Perf::open`] and then the delivery thread, every tick, run a canary
//!   ([`Perf::canary`]: each traced call once with arguments the kernel refuses); a tracepoint
//!   that records nothing refuses the start, or kills the notifier (every check fails, and its
//!   errors name the quiet tracepoints: `tests/perf_silenced.rs` attaches such a program to a
//!   running notifier). Checks made between the attachment and the next tick can be stale: a
//!   BPF program on these tracepoints should return 1 to coexist with perf users (this
//!   backend, `perf trace`).
//!
//! # Privilege
//! tracefs must be mounted (for the tracepoint ids) and raw tracepoint samples need
//! `CAP_PERFMON` (or `CAP_SYS_ADMIN`) unless `kernel.perf_event_paranoid` is -1. [`Perf::open`]
//! refuses with [`Unsupported::Perf`](crate::Unsupported::Perf) naming what is missing rather
//! than run with a gap (a missing tracepoint, a CPU without a ring, a thread it could not
//! attach to).
#![allow(unsafe_code)]
// pthread_atfork.

pub(crate) mod decode;
pub(crate) mod mmu;
mod sys;
#[cfg(test)]
mod tests;
mod watcher;

pub(crate) use watcher::open as open_watcher;
pub(crate) use watcher::open_mmu as open_mmu_watcher;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Mutex;

use decode::{Ids, Mmu, Record, Syscall, MAX_RECORD};

use crate::backend::hooks::calls::Ranges;

use super::Invalidation;

/// What a pull delivers into: the notifier core. The methods mirror the core's sink, so the
/// backend's adapter is a forwarding impl. Called with the backend's drain lock held; every
/// method must follow the event-path rules (no allocation, no unmap, only the index lock).
pub(crate) trait Target {
    /// Before the invalidations of one entry record: checks wait until [`Target::end`].
    fn begin(&self);
    /// Marks every region `inv` hits invalid and queues its event.
    fn apply(&self, inv: Invalidation);
    /// Publishes what [`Target::apply`] did.
    fn end(&self);
    /// `[start, end)` is being changed and the change is not done: until the returned window is
    /// closed, no registration or re-arm over it is valid.
    fn window_open(&self, start: u64, end: u64) -> u64;
    /// The change of a window is done.
    fn window_close(&self, window: u64);
    /// Anything may have changed: every region is invalid.
    fn invalidate_all(&self);
    /// The second pass at a call's end (one message, nothing when no region overlaps): regions
    /// overlapping `[start, end)` that are not already pending from the first are invalidated
    /// (so a pending region keeps its exact hint).
    fn invalidate_again(&self, start: u64, end: u64, unmap: bool);
}

/// What [`Perf::canary`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Canary {
    /// Every tracepoint recorded the canary's call.
    Ok,
    /// A ring lost records meanwhile: no verdict.
    Void,
    /// These tracepoints (bits of the id table) recorded nothing.
    Suppressed(u32),
}

/// A target that drops everything (the start-up canary, before any region exists).
struct Discard;

impl Target for Discard {
    fn begin(&self) {}
    fn apply(&self, _: Invalidation) {}
    fn end(&self) {}
    fn window_open(&self, _: u64, _: u64) -> u64 {
        0
    }
    fn window_close(&self, _: u64) {}
    fn invalidate_all(&self) {}
    fn invalidate_again(&self, _: u64, _: u64, _: bool) {}
}

/// Open calls remembered per backend (threads in a traced syscall at once, and some slack).
const OPEN_CALLS: usize = 256;
/// Ring wake-up watermark for a poller: a quarter of the ring.
const WAKEUP: u32 = (sys::DATA_PAGES * 4096 / 4) as u32;

struct Ring {
    map: sys::RingMap,
    /// What was fully consumed (mirrors `data_tail`; read by [`Perf::pending`]).
    tail: AtomicU64,
}

/// One thread's traced calls since the last loss. A thread is in one syscall at a time, so its
/// entry at `t2` proves that its call entered at `t1 < t2` has ended: one open call per thread.
#[derive(Clone, Copy)]
struct OpenCall {
    tid: i32,
    /// The first entry seen from this thread: an exit older than it has no entry (an orphan).
    first: u64,
    /// The call in progress: its entry time, windows, and what it changes.
    open: Option<Open>,
}

/// A call in progress.
#[derive(Clone, Copy)]
struct Open {
    time: u64,
    windows: [Option<u64>; 2],
    ranges: Ranges,
    unmap: bool,
}

/// Invalidates `ranges` (one message).
fn invalidate(t: &dyn Target, ranges: &Ranges, unmap: bool) {
    for &(start, end) in ranges.iter().flatten() {
        t.apply(if unmap {
            Invalidation::Unmap { start, end }
        } else {
            Invalidation::Remove { start, end }
        });
    }
}

/// The call `o` has ended: its ranges are invalidated again (a region registered or re-armed
/// while it ran, after its entry was delivered, may hold the old pages; like the hooks' second
/// pass), then its windows close. Correct without the windows: the exit record is in the ring
/// before the call returns, so every check after the return delivers this first.
fn ended(t: &dyn Target, o: Open) {
    for &(start, end) in o.ranges.iter().flatten() {
        t.invalidate_again(start, end, o.unmap);
    }
    for w in o.windows.iter().flatten() {
        t.window_close(*w);
    }
}

/// The slot of `tid` (open addressing from `tid % OPEN_CALLS`), or a free one for it, or (all
/// taken) one whose thread is in no call, which is forgotten (its later exits may read as
/// orphans: conservative).
fn slot(d: &mut Drain, tid: i32) -> Option<usize> {
    let start = tid.unsigned_abs() as usize % OPEN_CALLS;
    let mut idle = None;
    for k in 0..OPEN_CALLS {
        let i = (start + k) % OPEN_CALLS;
        match &d.open[i] {
            Some(c) if c.tid == tid => return Some(i),
            Some(c) if c.open.is_none() && idle.is_none() => idle = Some(i),
            Some(_) => {}
            None => return Some(i),
        }
    }
    idle
}

/// What a pull keeps between pulls (under the drain lock).
struct Drain {
    /// Per ring: entries were delivered up to here (at least `tail`).
    begun: Vec<u64>,
    /// Scratch: the two head snapshots of a pull (allocated at open).
    h1: Vec<u64>,
    h2: Vec<u64>,
    open: [Option<OpenCall>; OPEN_CALLS],
    /// The highest program break seen (a shrinking brk unmaps up to it).
    brk_top: u64,
    /// The canary's thread ([`Perf::canary`]): its records are witnesses, not changes.
    canary_tid: i32,
    /// Which of `ids` the canary's records showed since the last [`Perf::canary`] (bit i; for
    /// the MMU-notifier tracepoints bit 0 is the range start, bit 1 its end).
    seen: u32,
    /// The MMU-notifier canary's page: only records of its zap are witnesses.
    canary_addr: u64,
    /// A loss since the last canary: its verdict is void.
    lost_since_canary: bool,
    stats: PerfStats,
}

/// Counters of what the backend saw (for tests, `umn bench` and `Stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PerfStats {
    /// Entry records delivered.
    pub(crate) entries: u64,
    /// Exit records that closed an entry.
    pub(crate) exits: u64,
    /// `invalidate_all` because a ring was (nearly) full or the kernel reported a loss.
    pub(crate) overflows: u64,
    /// `invalidate_all` because an exit had no entry.
    pub(crate) orphan_exits: u64,
    /// `invalidate_all` because the open-call table was full.
    pub(crate) table_full: u64,
}

/// The perf backend's rings and events for this process.
pub(crate) struct Perf {
    rings: Vec<Ring>,
    ids: Ids,
    threads: usize,
    drain: Mutex<Drain>,
    /// Every event's fd.
    fds: Vec<OwnedFd>,
    /// Per ring, the index in `fds` of the event whose ring it is.
    leads: Vec<usize>,
    /// The tracepoints (bits of the id table) the delivery thread's canary found quiet, which
    /// killed the notifier; 0 while every one records.
    quiet: AtomicU32,
    /// The MMU-notifier tracepoints instead of the syscall ones (`Backend::Tracepoint`, see
    /// [`mmu`]): their ids, layout and our mm; `ids` is then unused.
    mmu: Option<Mmu>,
    /// The page the MMU-notifier canary zaps.
    canary_page: Option<mmu::Page>,
}

/// Set in a forked child (`pthread_atfork`): the rings are not mapped there (`MADV_DONTFORK`)
/// and the parent's records are not the child's.
static FORKED: AtomicBool = AtomicBool::new(false);
static ATFORK: crate::fork::AtforkOnce = crate::fork::AtforkOnce::new();

extern "C" fn in_child() {
    ATFORK.registered_in_child();
    FORKED.store(true, Relaxed);
}

fn missing(what: impl Into<String>) -> crate::Unsupported {
    crate::Unsupported::Perf {
        missing: what.into(),
    }
}

/// The `sys_enter_*`/`sys_exit_*` ids of every traced call, or what is missing.
fn tracepoint_ids() -> Result<Ids, crate::Unsupported> {
    let root = sys::tracefs().ok_or_else(|| missing(sys::tracefs_missing()))?;
    let mut ids = [(0, Syscall::Munmap, false); 2 * Syscall::ALL.len()];
    for (i, &call) in Syscall::ALL.iter().enumerate() {
        let name = call.name();
        for (j, dir) in ["enter", "exit"].into_iter().enumerate() {
            let tp = format!("sys_{dir}_{name}");
            let id = sys::tracepoint_id(root, &tp).map_err(|e| {
                missing(format!(
                    "tracepoint syscalls:{tp} ({root}/events/syscalls/{tp}/id: {e}; needs \
                     CONFIG_FTRACE_SYSCALLS, and read access to tracefs)"
                ))
            })?;
            ids[2 * i + j] = (id, call, j == 1);
        }
    }
    Ok(ids)
}

fn perf_refused(tp: &str, e: &io::Error) -> crate::Unsupported {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unreadable".into());
    let why = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "raw tracepoint samples need CAP_PERFMON (or CAP_SYS_ADMIN), or \
             kernel.perf_event_paranoid=-1 (it is {paranoid})"
        ),
        Some(libc::ENOSYS) => "the kernel has no perf_event_open (CONFIG_PERF_EVENTS=n)".into(),
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            "out of file descriptors (one per thread, CPU and tracepoint)".into()
        }
        _ => "unexpected error".into(),
    };
    missing(format!("perf_event_open(syscalls:{tp}) failed: {e}: {why}"))
}

impl Perf {
    /// Opens the events for every thread of the process on every online CPU and maps one ring
    /// per CPU. Refuses (naming what is missing) rather than start with a gap.
    pub(crate) fn open() -> Result<Perf, crate::Unsupported> {
        ATFORK.register(None, None, Some(in_child));
        let ids = tracepoint_ids()?;
        let cpus = sys::online_cpus().map_err(|e| missing(format!("online CPUs: {e}")))?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut leads: Vec<usize> = Vec::new();
        let mut rings = Vec::new();
        let mut attached: Vec<i32> = Vec::new();
        let name = |i: usize| {
            let (_, call, exit) = ids[i];
            let n = call.name();
            format!("sys_{}_{n}", if exit { "exit" } else { "enter" })
        };
        // Attach every thread; read the list again until a pass finds no new one (a thread
        // created by one not yet attached inherits nothing).
        // This thread first: its events own the rings, and it is alive throughout.
        let own = crate::sys::gettid();
        Self::attach(own, &cpus, &ids, &mut fds, &mut leads, &mut rings)
            .map_err(|(i, e)| perf_refused(&name(i), &e))?;
        attached.push(own);
        loop {
            let tids = sys::threads().map_err(|e| missing(format!("/proc/self/task: {e}")))?;
            let new: Vec<i32> = tids.into_iter().filter(|t| !attached.contains(t)).collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match Self::attach(tid, &cpus, &ids, &mut fds, &mut leads, &mut rings) {
                    Ok(()) => attached.push(tid),
                    // Exited meanwhile: nothing to watch.
                    Err((_, e)) if e.raw_os_error() == Some(libc::ESRCH) => attached.push(tid),
                    Err((i, e)) => return Err(perf_refused(&name(i), &e)),
                }
            }
        }
        let rings: Vec<Ring> = rings
            .into_iter()
            .map(|map| Ring {
                map,
                tail: AtomicU64::new(0),
            })
            .collect();
        let n = rings.len();
        let perf = Perf {
            rings,
            ids,
            threads: attached.len(),
            drain: Mutex::new(Drain {
                begun: vec![0; n],
                h1: vec![0; n],
                h2: vec![0; n],
                open: [None; OPEN_CALLS],
                brk_top: sys::current_brk(),
                canary_tid: 0,
                seen: 0,
                canary_addr: 0,
                lost_since_canary: false,
                stats: PerfStats::default(),
            }),
            fds,
            leads,
            quiet: AtomicU32::new(0),
            mmu: None,
            canary_page: None,
        };
        // Something may suppress the samples (below): refuse to start rather than run blind.
        let verdict = perf.canary(crate::sys::gettid(), &Discard);
        // The windows "opened" into `Discard` are not the core's: forget every open call (an
        // exit of a call in progress now reads as an orphan: everything changed, harmless at
        // start).
        perf.drain.lock().unwrap_or_else(|e| e.into_inner()).open = [None; OPEN_CALLS];
        match verdict {
            Canary::Suppressed(which) => Err(missing(format!(
                "the tracepoints record nothing: {}",
                perf.suppressed(which)
            ))),
            Canary::Ok | Canary::Void => Ok(perf),
        }
    }

    /// Makes every traced syscall once from thread `tid` with arguments the kernel refuses
    /// (`EINVAL`, `EBADF`: nothing changes), pulls into `target`, and says whether the rings
    /// recorded all of them. A BPF program attached to the same tracepoint by anyone on the
    /// machine that returns 0 suppresses every perf sample of that tracepoint, system-wide
    /// (`perf_syscall_enter` skips the perf events when `perf_call_bpf_enter` says 0): the
    /// backend would then miss every such call silently. The delivery thread runs this every
    /// tick and kills the notifier (every check fails) when a tracepoint goes quiet.
    pub(crate) fn canary(&self, tid: i32, target: &dyn Target) -> Canary {
        {
            let mut d = self.drain.lock().unwrap_or_else(|e| e.into_inner());
            d.canary_tid = tid;
            d.seen = 0;
            d.lost_since_canary = false;
        }
        match &self.canary_page {
            Some(page) => sys::zap(page.addr()),
            None => sys::refused_calls(),
        }
        self.pull(target);
        let mut d = self.drain.lock().unwrap_or_else(|e| e.into_inner());
        // Every record of the canary's calls was written before that pull's snapshots: from
        // now on this thread's records are changes again.
        d.canary_tid = 0;
        let all = if self.mmu.is_some() {
            0b11
        } else {
            (1u32 << self.ids.len()) - 1
        };
        if d.lost_since_canary {
            Canary::Void
        } else if d.seen & all == all {
            Canary::Ok
        } else {
            Canary::Suppressed(all & !d.seen)
        }
    }

    /// Records that the tracepoints `which` went quiet (the delivery thread, before it kills
    /// the notifier). Event path: one store.
    pub(crate) fn went_quiet(&self, which: u32) {
        self.quiet.fetch_or(which, Release);
    }

    /// Why the notifier was killed, if a tracepoint went quiet (user threads: allocates).
    pub(crate) fn quiet_reason(&self) -> Option<String> {
        let which = self.quiet.load(Acquire);
        (which != 0).then(|| {
            format!(
                "the tracepoints stopped recording after start: {}",
                self.suppressed(which)
            )
        })
    }

    /// The tracepoints named by the bits of `which`, in words.
    pub(crate) fn suppressed(&self, which: u32) -> String {
        if self.mmu.is_some() {
            return mmu::suppressed(which);
        }
        let names: Vec<String> = (0..self.ids.len())
            .filter(|i| which & (1 << i) != 0)
            .map(|i| {
                let (_, call, exit) = self.ids[i];
                let n = call.name();
                format!("syscalls:sys_{}_{n}", if exit { "exit" } else { "enter" })
            })
            .collect();
        format!(
            "{} (a BPF program attached to them that returns 0 suppresses perf samples \
             system-wide)",
            names.join(", ")
        )
    }

    /// Opens every tracepoint for `tid` on every CPU; the first event on a CPU gets its ring.
    /// A failure part-way leaves the events opened so far: harmless if the thread exited
    /// (`ESRCH`), and dropped with the whole backend otherwise.
    fn attach(
        tid: i32,
        cpus: &[i32],
        ids: &Ids,
        fds: &mut Vec<OwnedFd>,
        leads: &mut Vec<usize>,
        rings: &mut Vec<sys::RingMap>,
    ) -> Result<(), (usize, io::Error)> {
        for (c, &cpu) in cpus.iter().enumerate() {
            for (i, &(id, _, _)) in ids.iter().enumerate() {
                let lead = leads.get(c).map(|&l| &fds[l]);
                let fd = sys::open_tracepoint(id, tid, cpu, lead, WAKEUP).map_err(|e| (i, e))?;
                if leads.len() == c {
                    rings.push(sys::RingMap::map(&fd).map_err(|e| (i, e))?);
                    leads.push(fds.len());
                }
                fds.push(fd);
            }
        }
        Ok(())
    }

    /// The check: has any ring been written since it was consumed? One load of each ring's
    /// head (N for N CPUs), no lock, no syscall. Always true in a forked child (it can not
    /// tell).
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        FORKED.load(Relaxed)
            || self
                .rings
                .iter()
                .any(|r| r.map.head() != r.tail.load(Acquire))
    }

    /// Samples the kernel says it dropped, over every event (tests: the rings' own loss
    /// detection must have seen at least one loss whenever this is not 0).
    #[cfg(test)]
    pub(crate) fn kernel_lost(&self) -> io::Result<u64> {
        self.fds.iter().map(sys::lost_samples).sum()
    }

    /// The rings' lead fds (readable at the wake-up watermark), for a poller.
    pub(crate) fn ring_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.leads.iter().map(|&l| self.fds[l].as_fd())
    }

    /// How many threads were attached at open, CPUs (rings), and events.
    pub(crate) fn shape(&self) -> (usize, usize, usize) {
        (self.threads, self.rings.len(), self.fds.len())
    }

    /// What the pulls saw so far.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn stats(&self) -> PerfStats {
        self.drain.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// Delivers every record written so far into `target` (see the module doc). Returns at
    /// once when [`pending`](Perf::pending) is false, and in a forked child (see [`FORKED`]; the
    /// core makes every check there fail).
    pub(crate) fn pull(&self, target: &dyn Target) {
        if FORKED.load(Relaxed) || !self.pending() {
            return;
        }
        let mut d = self.drain.lock().unwrap_or_else(|e| e.into_inner());
        let d = &mut *d;
        // Two snapshots of every head: exits up to the first, entries up to the second.
        for (h, r) in d.h1.iter_mut().zip(&self.rings) {
            *h = r.map.head();
        }
        for (h, r) in d.h2.iter_mut().zip(&self.rings) {
            *h = r.map.head();
        }
        let n = self.rings.len();
        let mut lost = false;
        for (i, r) in self.rings.iter().enumerate().take(n) {
            let tail = r.tail.load(Relaxed);
            if d.h2[i].wrapping_sub(tail) > r.map.size() - MAX_RECORD {
                lost = true;
            }
        }
        // Phase 1: entries (and losses) not delivered yet, up to the second snapshot.
        for (i, r) in self.rings.iter().enumerate().take(n) {
            let from = d.begun[i].max(r.tail.load(Relaxed));
            let mut last: Option<(i32, u64)> = None;
            lost |= !walk(
                &r.map,
                from,
                d.h2[i],
                |b| self.decode(b),
                |rec| match rec {
                    Record::Enter {
                        tid,
                        time,
                        call,
                        args,
                    } => {
                        // The same call twice in a row: a thread attached at open that had already
                        // inherited its events.
                        if last != Some((tid, time)) {
                            enter(d, target, tid, time, call, args);
                        }
                        last = Some((tid, time));
                    }
                    Record::RangeStart {
                        tid,
                        time,
                        start,
                        end,
                        event,
                    } => range_start(d, target, tid, time, (start, end), event),
                    Record::Lost => lost = true,
                    _ => {}
                },
            );
            d.begun[i] = d.h2[i];
        }
        // Phase 2: exits up to the first snapshot.
        for (i, r) in self.rings.iter().enumerate().take(n) {
            let from = r.tail.load(Relaxed);
            let mut last: Option<(i32, u64)> = None;
            lost |= !walk(
                &r.map,
                from,
                d.h1[i],
                |b| self.decode(b),
                |rec| match rec {
                    Record::Exit {
                        tid,
                        time,
                        call,
                        ret,
                    } => {
                        if last != Some((tid, time)) {
                            exit(d, target, tid, time, call, ret);
                        }
                        last = Some((tid, time));
                    }
                    Record::RangeEnd {
                        tid, start, end, ..
                    } => range_end(d, target, tid, (start, end)),
                    _ => {}
                },
            );
            r.map.set_tail(d.h1[i]);
            // Release: a check that finds nothing new (Acquire below) also sees what this pull
            // delivered.
            r.tail.store(d.h1[i], Release);
        }
        if lost {
            d.lost_since_canary = true;
            d.stats.overflows += 1;
            // Exits may be among the lost: forget the open calls (the core's protocol ends
            // their windows).
            d.open = [None; OPEN_CALLS];
            target.invalidate_all();
        }
    }
}

impl Perf {
    /// One record, as this backend's tracepoints lay it out.
    fn decode(&self, rec: &[u8]) -> Record {
        match &self.mmu {
            Some(m) => decode::decode_mmu(rec, m),
            None => decode::decode(rec, &self.ids),
        }
    }
}

/// Calls `f` on each record in `[from, to)` of `ring`, decoded by `dec`; false if the stream is
/// malformed (then the rest can not be trusted: treated as a loss).
fn walk(
    ring: &sys::RingMap,
    from: u64,
    to: u64,
    mut dec: impl FnMut(&[u8]) -> Record,
    mut f: impl FnMut(Record),
) -> bool {
    let mut pos = from;
    let mut buf = [0u8; 256];
    while pos < to {
        let mut h = [0u8; 8];
        ring.copy(pos, &mut h);
        let (_, size) = decode::header(&h);
        let size = size as u64;
        if size < 8 || pos + size > to {
            return false;
        }
        if size as usize <= buf.len() {
            let rec = &mut buf[..size as usize];
            ring.copy(pos, rec);
            f(dec(rec));
        } else {
            f(Record::Other);
        }
        pos += size;
    }
    true
}

/// Bit of `call` (entry or exit) in the id table's order.
fn bit(call: Syscall, exit: bool) -> u32 {
    let i = call.index();
    1 << (2 * i + exit as usize)
}

fn enter(d: &mut Drain, t: &dyn Target, tid: i32, time: u64, call: Syscall, args: [u64; 6]) {
    if tid == d.canary_tid {
        d.seen |= bit(call, false);
        return;
    }
    d.stats.entries += 1;
    let (ranges, unmap) = decode::effect(call, args, d.brk_top);
    begin_call(d, t, tid, time, ranges, unmap);
}

/// A change of `ranges` by thread `tid` began at `time`: invalidate them, open their windows,
/// and remember the call until its end.
fn begin_call(d: &mut Drain, t: &dyn Target, tid: i32, time: u64, ranges: Ranges, unmap: bool) {
    let mut windows = [None; 2];
    if ranges.iter().any(Option::is_some) {
        t.begin();
        for (w, &(s, e)) in windows.iter_mut().zip(ranges.iter().flatten()) {
            *w = Some(t.window_open(s, e));
        }
        invalidate(t, &ranges, unmap);
        t.end();
    }
    let now = Open {
        time,
        windows,
        ranges,
        unmap,
    };
    match slot(d, tid) {
        Some(i) => {
            let c = d.open[i].get_or_insert(OpenCall {
                tid,
                first: time,
                open: None,
            });
            if c.tid != tid {
                *c = OpenCall {
                    tid,
                    first: time,
                    open: None,
                };
            }
            // The thread's previous call (if its exit is not delivered yet) has ended.
            if let Some(prev) = c.open.replace(now) {
                ended(t, prev);
            }
        }
        None => {
            // Every slot holds a call in progress: this one's exit will be an orphan
            // (invalidate_all then); its windows are left to the core's protocol.
            d.stats.table_full += 1;
            t.invalidate_all();
        }
    }
}

fn exit(d: &mut Drain, t: &dyn Target, tid: i32, time: u64, call: Syscall, ret: i64) {
    if tid == d.canary_tid {
        d.seen |= bit(call, true);
        return;
    }
    if call == Syscall::Brk && ret > 0 {
        d.brk_top = d.brk_top.max(ret as u64);
    }
    end_call(d, t, tid, time);
}

/// Thread `tid`'s change ended at `time`: its ranges again, then its windows close; an end with
/// no beginning is an unknown change (everything).
fn end_call(d: &mut Drain, t: &dyn Target, tid: i32, time: u64) {
    let c = d.open.iter_mut().flatten().find(|c| c.tid == tid);
    match c {
        Some(c) if c.first < time => {
            if let Some(o) = c.open {
                if o.time < time {
                    c.open = None;
                    ended(t, o);
                }
            }
            // Else the exit of a call already ended by a later entry of the thread.
            d.stats.exits += 1;
        }
        _ => {
            // No entry of this thread before this exit: the entry was lost, or the call began
            // before the events were open. Something of unknown range just changed.
            d.stats.orphan_exits += 1;
            t.invalidate_all();
        }
    }
}

/// `mmu_notifier_invalidate_range_start` of our mm by task `tid` (ours or not): the pages of
/// `range` are about to change. The canary's own zap is a witness, not a change.
fn range_start(d: &mut Drain, t: &dyn Target, tid: i32, time: u64, range: (u64, u64), event: u32) {
    if tid == d.canary_tid && range.0 == d.canary_addr {
        d.seen |= 1;
        return;
    }
    d.stats.entries += 1;
    let r = (range.0 < range.1).then_some(range);
    begin_call(
        d,
        t,
        tid,
        time,
        [r, None],
        event == decode::MMU_NOTIFY_UNMAP,
    );
}

/// `mmu_notifier_invalidate_range_end`: task `tid`'s change of `range` is done.
///
/// Matched to its start by task and range, not by time: the records' clock may be coarse (the
/// TCG guest's `CLOCK_MONOTONIC` ticks in jiffies, so a start and its end often carry the same
/// time, and a time comparison left their window open until the core's grace). The two-snapshot
/// pull already delivers a start before its end. An end of a task with no start since open (or
/// since a loss) is an unknown change: everything. An end whose start was already ended by a
/// later start of the same task (nested invalidations) has nothing left to do.
fn range_end(d: &mut Drain, t: &dyn Target, tid: i32, range: (u64, u64)) {
    if tid == d.canary_tid && range.0 == d.canary_addr {
        d.seen |= 2;
        return;
    }
    let want = (range.0 < range.1).then_some(range);
    match d.open.iter_mut().flatten().find(|c| c.tid == tid) {
        Some(c) => {
            if let Some(o) = c.open {
                if o.ranges[0] == want {
                    c.open = None;
                    ended(t, o);
                }
            }
            d.stats.exits += 1;
        }
        None => {
            d.stats.orphan_exits += 1;
            t.invalidate_all();
        }
    }
}

/// What `umn doctor` says about the perf backend.
pub(crate) fn probe() -> super::BackendReport {
    let mut features = Vec::new();
    let mut notes = vec![
        "sees every traced syscall of this process's threads (libc or raw): munmap, mremap, \
         madvise, brk, mmap(MAP_FIXED), shmdt, shmat(SHM_REMAP), process_madvise, \
         remap_file_pages; asynchronous: the check loads every CPU's ring head"
            .to_string(),
        "does not see io_uring IORING_OP_MADVISE, hole punch/truncate of a mapped file, 32-bit \
         (int 0x80) syscalls, another process's process_madvise; while active, every process \
         on the machine takes the syscall-tracepoint slow path"
            .to_string(),
    ];
    if let Some(root) = sys::tracefs() {
        features.push("tracefs");
        notes.push(format!("tracefs at {root}"));
    }
    let status = Perf::open().map(|p| {
        let (threads, cpus, events) = p.shape();
        features.push("syscall tracepoints");
        format!(
            "ok: {cpus} rings (one per CPU), {events} events for {threads} threads, {} \
             tracepoints",
            2 * Syscall::ALL.len()
        )
    });
    super::BackendReport {
        name: "perf",
        status,
        kernel_features: features,
        notes,
    }
}
