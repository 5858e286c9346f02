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

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let info = unsafe { &*info };
    if info.si_code != libc::SI_QUEUE {
        return;
    }
    // SAFETY: SI_QUEUE signals carry the _rt member (pid, uid, value).
    let (pid, value) = unsafe { (info.si_pid(), info.si_value().sival_ptr as usize) };
    // SAFETY: getpid has no preconditions.
    if pid != unsafe { libc::getpid() } || value >= THREADS {
        return;
    }
    stamp(&ACK[value], &NEXT);
    HANDLED.fetch_add(1, Relaxed);
}

/// Signals this process sent, and handled, for `REMOVE` windows (see [`signal_counts`]).
static SENT_COUNT: AtomicU64 = AtomicU64::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// How many of this library's signals the process sent and how many of its handlers ran
/// (process-wide; for `Stats` and the host-safety tests).
pub(crate) fn signal_counts() -> (u64, u64) {
    (SENT_COUNT.load(Relaxed), HANDLED.load(Relaxed))
}

fn handler_addr() -> usize {
    on_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as *const ()
        as usize
}

/// Installs the handler once per process, if the signal is free (its disposition is the
/// default); otherwise signalling stays off and every entry ends by a later look or by grace.
///
/// How the signal stays harmless to its host (docs/architecture/in-flight.md, "The signal and its host"):
/// * no `SA_ONSTACK`: the handler runs on the stack the thread is on, never starting a frame on
///   the thread's alternate stack;
/// * its `sa_mask` blocks every signal, so no handler of the host nests on ours;
/// * ours never nests on a host handler that runs on the alternate stack: [`guard_hosts`] adds
///   our signal to the `sa_mask` of every such handler, and nothing is sent unless a look made
///   right before the send found them all blocking it.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let sig = match std::env::var("UMN_SIGNAL")
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
        {
            Some(s) => s,
            None => libc::SIGRTMAX() - SIGNAL_OFFSET,
        };
        if sig < libc::SIGRTMIN() || sig > libc::SIGRTMAX() {
            return;
        }
        // SAFETY: sigaction structs are plain data; the first call only reads the current
        // disposition; the handler we install is async-signal-safe (two atomics on statics).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                return;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler_addr();
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigfillset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0 {
                SIGNO.store(sig, Relaxed);
            }
        }
        // The first look at the host's handlers (a second one guards them: see there).
        guard_hosts();
    });
}

/// The signal in use, if any.
pub fn signal() -> Option<i32> {
    Some(SIGNO.load(Relaxed)).filter(|&s| s != 0)
}

/// Makes every handler of the process that runs on the alternate stack (`SA_ONSTACK`) block our
/// signal, so ours is never delivered on top of one (where its frame, 1.7 to 12 KiB by CPU, could
/// overflow a small alternate stack), and returns whether they all do now. Called by user
/// threads right before they send ([`Outbox::send`]; and once at install). The monitor never
/// sends: a host may install a handler at any time, and only a look made just before the
/// signals go can vouch for it.
///
/// A handler lacking our signal in its `sa_mask` is changed (read, then written back with our
/// signal added, nothing else) only when the previous call saw it exactly the same: a host that
/// installs a handler for a moment and restores the old one (a probe) is never written over. If
/// the host changed the handler between our read and our write, its handler is put back as it
/// wrote it and nothing is sent this round. Until then no signal is sent: the entries end by a
/// later look or by grace, which is safe.
pub(crate) fn guard_hosts() -> Option<u64> {
    /// What the last call saw of a handler that lacked our signal (0: nothing lacking).
    static LACKING: [AtomicU64; 65] = [const { AtomicU64::new(0) }; 65];
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let ours = signal()?;
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let mut guarded = true;
    let mut on_stack_set = 0u64;
    for s in 1..=libc::SIGRTMAX().min(64) {
        if s == ours || s == libc::SIGKILL || s == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction reads the disposition into a zeroed struct (glibc's reserved
        // signals answer EINVAL and are skipped); sigismember reads the set.
        let (cur, blocks) = unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, std::ptr::null(), &mut cur) != 0 {
                continue;
            }
            let blocks = libc::sigismember(&cur.sa_mask, ours) == 1;
            (cur, blocks)
        };
        let on_stack = cur.sa_flags & libc::SA_ONSTACK != 0
            && cur.sa_sigaction != libc::SIG_DFL
            && cur.sa_sigaction != libc::SIG_IGN;
        let seen = &LACKING[s as usize];
        if on_stack {
            on_stack_set |= 1 << (s - 1);
        }
        if !on_stack || blocks {
            seen.store(0, Relaxed);
            continue;
        }
        let key = disposition_key(&cur);
        if seen.swap(key, Relaxed) != key {
            guarded = false; // new since the last look: guarded next time if it stays
            continue;
        }
        let mut new = cur;
        // SAFETY: adds one signal to a copy's mask, installs the copy (the same handler,
        // flags and mask but for our signal) and reads what it replaced; if that is not what we
        // read, the host changed it meanwhile, and its handler goes back exactly as it was.
        let installed = unsafe {
            libc::sigaddset(&mut new.sa_mask, ours);
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, &new, &mut prev) != 0 {
                false
            } else if disposition_key(&prev) == key {
                true
            } else {
                libc::sigaction(s, &prev, std::ptr::null_mut());
                seen.store(disposition_key(&prev), Relaxed);
                false
            }
        };
        if installed {
            seen.store(0, Relaxed);
        } else {
            guarded = false;
        }
    }
    guarded.then_some(on_stack_set)
}

/// Whether thread `tid` may be inside a handler of one of `on_stack` (a mask of signals whose
/// handlers run on the alternate stack) that does not block `ours`: its blocked set has such a
/// signal but not ours. A handler entered before [`guard_hosts`] added our signal to its mask
/// runs with the old mask until it returns, so a signal of ours then would nest on its frame.
/// Unknown (no `/proc`) counts as inside. One `/proc/self/task/TID/status` read, stack buffer.
fn in_unguarded_handler(tid: i32, on_stack: u64, ours: i32) -> bool {
    let mut path = [0u8; 48];
    let mut w = 0;
    let mut put = |bytes: &[u8]| {
        path[w..w + bytes.len()].copy_from_slice(bytes);
        w += bytes.len();
    };
    put(b"/proc/self/task/");
    let digits = itoa_digits(tid as u32);
    put(&digits[..digits.iter().position(|&d| d == 0).unwrap_or(digits.len())]);
    put(b"/status\0");
    let mut buf = [0u8; 2048];
    // SAFETY: a NUL-terminated path in a stack buffer; the fd is closed below.
    let n = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return true;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let Ok(n) = usize::try_from(n) else {
        return true;
    };
    let text = &buf[..n];
    let Some(at) = text.windows(7).position(|w| w == b"SigBlk:") else {
        return true;
    };
    let mut blocked = 0u64;
    for &c in text[at + 7..]
        .iter()
        .skip_while(|c| c.is_ascii_whitespace())
    {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => break,
        };
        blocked = blocked << 4 | d as u64;
    }
    blocked & on_stack != 0 && blocked & (1 << (ours - 1)) == 0
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

/// A handler, its flags and the kernel's part of its mask (signals 1 to 64: glibc copies only
/// those into a `sigset_t` it returns, the rest of the 128 bytes is whatever was there), hashed
/// (FNV-1a; never 0).
fn disposition_key(sa: &libc::sigaction) -> u64 {
    // SAFETY: `sigset_t` is plain data at least 8 bytes long; its first 8 are the kernel's set.
    let mask = unsafe {
        (&sa.sa_mask as *const libc::sigset_t)
            .cast::<u64>()
            .read_unaligned()
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in (sa.sa_sigaction as u64)
        .to_le_bytes()
        .into_iter()
        .chain((sa.sa_flags as u64).to_le_bytes())
        .chain(mask.to_le_bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

/// The signal, if our handler is still the one installed (someone may have replaced it;
/// sending then could kill the process if it were reset to the default).
fn live_signal() -> Option<i32> {
    let sig = signal()?;
    // SAFETY: reads the current disposition into a zeroed struct.
    let ours = unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut cur) == 0 && cur.sa_sigaction == handler_addr()
    };
    ours.then_some(sig)
}

/// `siginfo_t` for `SI_QUEUE` as the kernel lays it out on 64-bit Linux.
#[repr(C)]
struct QueueInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: u64,
    _rest: [u64; 12],
}
const _: () = assert!(std::mem::size_of::<QueueInfo>() == 128);

/// Queues the signal for thread slot `i` unless one is pending already. Event-path safe.
fn send(sig: i32, i: usize) {
    if SENT[i].load(Acquire) > ACK[i].load(Acquire) {
        return; // its handler will stamp a value at least as new as ours
    }
    SENT[i].store(NEXT.load(Acquire), Release);
    // SAFETY: getpid/getuid have no preconditions.
    let (pid, uid) = unsafe { (libc::getpid(), libc::getuid()) };
    let info = QueueInfo {
        signo: sig,
        errno: 0,
        code: libc::SI_QUEUE,
        _pad: 0,
        pid,
        uid,
        value: i as u64,
        _rest: [0; 12],
    };
    let tid = TIDS[i].load(Relaxed);
    // SAFETY: rt_tgsigqueueinfo reads one siginfo (128 bytes) from `info`. EAGAIN (queue full)
    // leaves signals pending, whose handlers stamp the ack word all the same.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            pid,
            tid,
            sig,
            &info as *const QueueInfo,
        )
    };
    if r == 0 {
        SENT_COUNT.fetch_add(1, Relaxed);
    }
}

/// Whether thread `tid` of this process still exists.
fn thread_alive(tid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    !(r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
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

// --- Naming the senders ----------------------------------------------------------------------

/// Candidates kept per scan.
const MAX_CANDIDATES: usize = 64;

/// Lists the threads of this process blocked in `madvise`/`process_madvise`. Owned by the
/// monitor; its buffers are allocated once, when the monitor starts. Keeps each thread's
/// `syscall` file open (up to [`THREADS`]), so a scan is one `getdents64` plus one `pread` per
/// thread.
pub(crate) struct Scanner {
    dir: Option<OwnedFd>,
    dents: Box<[u8; 8192]>,
    /// Open `TID/syscall` files: (tid, fd, seen in this scan, io_uring worker).
    open: Box<[(i32, i32, bool, bool); THREADS]>,
    n_open: usize,
    found: [Candidate; MAX_CANDIDATES],
    n: usize,
    overflowed: bool,
}

impl Scanner {
    /// Opens `/proc/self/task` (without it every entry is unnamed and ends by grace).
    pub(crate) fn new() -> Scanner {
        // SAFETY: a NUL-terminated path; the fd returned is owned by nobody else.
        let fd = unsafe {
            libc::open(
                c"/proc/self/task".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        Scanner {
            // SAFETY: a fresh descriptor from open.
            dir: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
            dents: Box::new([0; 8192]),
            open: Box::new([(0, -1, false, false); THREADS]),
            n_open: 0,
            found: [Candidate::default(); MAX_CANDIDATES],
            n: 0,
            overflowed: false,
        }
    }

    /// Whether io_uring worker `tid` is idle (waiting for work: see [`look_at_worker`]) or gone.
    /// A worker that is running, or blocked anywhere else, is not.
    pub(crate) fn worker_idle(&self, tid: i32) -> bool {
        let Some(dir) = &self.dir else { return false };
        let mut name = [0u8; 12];
        let mut len = 0;
        let mut digits = [0u8; 12];
        let mut v = tid as u32;
        loop {
            digits[len] = b'0' + (v % 10) as u8;
            len += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for k in 0..len {
            name[k] = digits[len - 1 - k];
        }
        look_at_worker(dir.as_raw_fd(), &name[..len]) != WorkerLook::Busy
    }

    /// The candidates of the last scan, and whether some could not be kept (or the scan failed).
    pub(crate) fn candidates(&self) -> (&[Candidate], bool) {
        (&self.found[..self.n], self.overflowed)
    }

    /// Scans the threads but `own_tid`: those blocked in `madvise` (with its range), in
    /// `process_madvise`, or running. Stack and preallocated buffers only.
    pub(crate) fn scan(&mut self, own_tid: i32) {
        self.n = 0;
        self.overflowed = false;
        let Some(dir) = &self.dir else {
            self.overflowed = true;
            return;
        };
        let dfd = dir.as_raw_fd();
        for o in &mut self.open[..self.n_open] {
            o.2 = false;
        }
        // SAFETY: rewinds our own directory fd.
        unsafe { libc::lseek(dfd, 0, libc::SEEK_SET) };
        loop {
            // SAFETY: getdents64 writes at most `len` bytes into our buffer.
            let got = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    dfd,
                    self.dents.as_mut_ptr(),
                    self.dents.len(),
                )
            };
            if got <= 0 {
                self.overflowed |= got < 0;
                break;
            }
            let mut off = 0usize;
            while off + 19 < got as usize {
                let reclen = u16::from_ne_bytes([self.dents[off + 16], self.dents[off + 17]]);
                if reclen == 0 {
                    break;
                }
                let end = (off + reclen as usize).min(got as usize);
                let mut name = [0u8; 24];
                let raw = &self.dents[off + 19..end];
                let raw = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
                off += reclen as usize;
                if raw.len() > 16 {
                    continue;
                }
                name[..raw.len()].copy_from_slice(raw);
                let Some(tid) = parse_dec(raw) else { continue };
                let tid = tid as i32;
                if tid == own_tid {
                    continue;
                }
                let c = self.read_thread(dfd, &name[..raw.len()], tid);
                if let Some(c) = c {
                    if self.n == MAX_CANDIDATES {
                        self.overflowed = true;
                    } else {
                        self.found[self.n] = c;
                        self.n += 1;
                    }
                }
            }
        }
        // Close the files of threads that are gone.
        let mut i = 0;
        while i < self.n_open {
            if self.open[i].2 {
                i += 1;
            } else {
                // SAFETY: an fd this scanner opened and still owns.
                unsafe { libc::close(self.open[i].1) };
                self.n_open -= 1;
                self.open[i] = self.open[self.n_open];
            }
        }
    }

    /// Reads one thread's `syscall` file (kept open when there is room). A thread that is
    /// running may be a sender between its wake-up and its zap: a candidate for any range.
    fn read_thread(&mut self, dfd: i32, name: &[u8], tid: i32) -> Option<Candidate> {
        if is_monitor(tid) {
            return None;
        }
        let slot = match self.open[..self.n_open].iter().position(|o| o.0 == tid) {
            Some(i) => Some(i),
            None if self.n_open < THREADS => {
                let Some(fd) = open_syscall(dfd, name) else {
                    self.overflowed |= !last_error_is_gone();
                    return None;
                };
                self.open[self.n_open] = (tid, fd, false, is_io_worker(dfd, name));
                self.n_open += 1;
                Some(self.n_open - 1)
            }
            None => None,
        };
        let (fd, owned, io_worker) = match slot {
            Some(i) => {
                self.open[i].2 = true;
                if !task_file_live(self.open[i].1) {
                    // The file is of a thread that is gone, and `tid` (listed just now) was
                    // given to a new one (pid_max is often 32768): reading the old file would
                    // call the new thread gone and never look at it. Open its own.
                    // SAFETY: an fd this scanner opened and owns; replaced below.
                    unsafe { libc::close(self.open[i].1) };
                    let Some(fd) = open_syscall(dfd, name) else {
                        self.n_open -= 1;
                        self.open[i] = self.open[self.n_open];
                        self.overflowed |= !last_error_is_gone();
                        return None;
                    };
                    self.open[i] = (tid, fd, true, is_io_worker(dfd, name));
                }
                (self.open[i].1, false, self.open[i].3)
            }
            None => match open_syscall(dfd, name) {
                Some(fd) => (fd, true, is_io_worker(dfd, name)),
                None => {
                    self.overflowed |= !last_error_is_gone();
                    return None;
                }
            },
        };
        // An io_uring worker's `syscall` file shows registers copied from the thread that made
        // it, not what it does: a worker that is not idle (or gone) is a possible sender that
        // can not be named.
        let r = if io_worker {
            match look_at_worker(dfd, name) {
                WorkerLook::Busy => Err(true),
                WorkerLook::Idle | WorkerLook::Gone => Ok(None),
            }
        } else {
            read_syscall(fd, tid)
        };
        if owned {
            // SAFETY: the fd opened just above for this read.
            unsafe { libc::close(fd) };
        }
        let c = match r {
            Ok(c) => c,
            Err(true) => Some(Candidate {
                tid,
                start: 0,
                end: u64::MAX,
                io_worker: false,
            }),
            Err(false) => {
                // Gone since the listing: not a sender any more. Unreadable: can not be named.
                if !last_error_is_gone() {
                    self.overflowed = true;
                }
                None
            }
        };
        c.map(|c| Candidate { io_worker, ..c })
    }
}

/// Whether an open `/proc/TID/syscall` file still belongs to a live thread (a read of a file
/// whose thread is gone fails with `ESRCH`, even when the tid was given to a new thread since).
fn task_file_live(fd: i32) -> bool {
    let mut buf = [0u8; 256];
    // SAFETY: reads into our stack buffer at offset 0.
    let got = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    got > 0 || !last_error_is_gone()
}

/// Whether the last failed call failed because the thread is gone.
fn last_error_is_gone() -> bool {
    matches!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOENT | libc::ESRCH)
    )
}

/// `PF_IO_WORKER` (include/linux/sched.h), in the flags field of `/proc/TID/stat`.
const PF_IO_WORKER: u64 = 0x10;

/// Whether thread `name` is an io_uring worker: `PF_IO_WORKER` in its `stat` flags, set when
/// the kernel creates it (its `comm` becomes `iou-wrk-*` only once it runs, so a worker seen
/// right after its creation carries its creator's name). Unreadable: not one.
fn is_io_worker(dfd: i32, name: &[u8]) -> bool {
    let mut buf = [0u8; 512];
    let (got, _) = read_task(dfd, name, b"/stat\0", &mut buf);
    stat_flags(&buf[..got]).is_some_and(|f| f & PF_IO_WORKER != 0)
}

/// What a look at an io_uring worker found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WorkerLook {
    /// Waiting for work: not inside any call.
    Idle,
    /// Running, or blocked somewhere else (or unreadable): maybe inside a call.
    Busy,
    /// Exited.
    Gone,
}

/// Whether io_uring worker `name` waits for work. It does so in `io_wq_worker`, in an
/// interruptible `schedule_timeout` (state `S`). Its `wchan` names where it sleeps, as the
/// kernel's unwinder finds it: `io_wq_worker` with the ORC or frame-pointer unwinder (this
/// machine's 6.18); with the "guess" unwinder (`CONFIG_UNWINDER_GUESS`, the 6.1 guests) the first
/// text address on its stack, which for that sleep is the on-stack timer's `process_timeout`.
/// `process_timeout` alone proves nothing (any `schedule_timeout` leaves it there, and a guess
/// may read a stale word), so it counts only with state `S`: every sleep of a worker inside the
/// calls that send a `REMOVE` — the wait for the message's read (killable), `mmap_lock`, the
/// inode and `i_mmap` locks of a punch — is uninterruptible (`D`), or it runs (`R`).
fn look_at_worker(dfd: i32, name: &[u8]) -> WorkerLook {
    let wchan = read_small(dfd, name, b"/wchan\0");
    if wchan.1 == 0 {
        return if wchan.2 {
            WorkerLook::Gone
        } else {
            WorkerLook::Busy
        };
    }
    if wchan.starts_with(b"io_wq_worker") {
        return WorkerLook::Idle;
    }
    if wchan.0[..wchan.1] != *b"process_timeout" {
        return WorkerLook::Busy;
    }
    let mut buf = [0u8; 512];
    match read_task(dfd, name, b"/stat\0", &mut buf) {
        (0, true) => WorkerLook::Gone,
        (got, _) if stat_state(&buf[..got]) == Some(b'S') => WorkerLook::Idle,
        _ => WorkerLook::Busy,
    }
}

/// The state letter of a `/proc/TID/stat` line (the first field after the `)` that ends the
/// command name).
fn stat_state(line: &[u8]) -> Option<u8> {
    let close = line.iter().rposition(|&b| b == b')')?;
    line[close + 1..].iter().copied().find(|&b| b != b' ')
}

/// The flags field of a `/proc/TID/stat` line (the 9th; counted after the `)` that ends the
/// command name, which may itself hold spaces and parentheses).
fn stat_flags(line: &[u8]) -> Option<u64> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line[close + 1..]
        .split(|&b| b == b' ')
        .filter(|w| !w.is_empty());
    // state ppid pgrp session tty_nr tpgid flags
    let flags = fields.nth(6)?;
    parse_dec(flags).map(|v| v as u64)
}

/// The first bytes of `NAME` + `suffix` (NUL-terminated) under the task directory (empty on
/// failure).
fn read_small(dfd: i32, name: &[u8], suffix: &[u8]) -> SmallBuf {
    let mut out = SmallBuf([0; 32], 0, false);
    (out.1, out.2) = read_task(dfd, name, suffix, &mut out.0);
    out
}

/// Reads `NAME` + `suffix` (NUL-terminated) under the task directory into `buf`: the bytes
/// read (0 on failure), and whether it failed because the thread is gone.
fn read_task(dfd: i32, name: &[u8], suffix: &[u8], buf: &mut [u8]) -> (usize, bool) {
    let Some(fd) = open_task(dfd, name, suffix) else {
        return (0, last_error_is_gone());
    };
    // SAFETY: reads into the caller's buffer and closes the fd opened above.
    let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    let gone = got < 0 && last_error_is_gone();
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
    (got.max(0) as usize, gone)
}

/// A few bytes read from a `/proc` file, and whether it failed because the thread is gone.
struct SmallBuf([u8; 32], usize, bool);

impl SmallBuf {
    fn starts_with(&self, p: &[u8]) -> bool {
        self.0[..self.1].starts_with(p)
    }
}

impl Drop for Scanner {
    fn drop(&mut self) {
        for o in &self.open[..self.n_open] {
            // SAFETY: fds this scanner opened and owns.
            unsafe { libc::close(o.1) };
        }
    }
}

/// Opens `NAME/syscall` under the task directory.
fn open_syscall(dfd: i32, name: &[u8]) -> Option<i32> {
    open_task(dfd, name, b"/syscall\0")
}

/// Opens `NAME` + `suffix` (NUL-terminated) under the task directory, read-only.
fn open_task(dfd: i32, name: &[u8], suffix: &[u8]) -> Option<i32> {
    let mut path = [0u8; 40];
    if name.len() + suffix.len() > path.len() {
        return None;
    }
    path[..name.len()].copy_from_slice(name);
    path[name.len()..name.len() + suffix.len()].copy_from_slice(suffix);
    // SAFETY: a NUL-terminated relative path under our directory fd.
    let fd = unsafe { libc::openat(dfd, path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// `Ok(candidate or not)`, `Err(true)` if the thread was running, `Err(false)` on failure.
fn read_syscall(fd: i32, tid: i32) -> Result<Option<Candidate>, bool> {
    let mut buf = [0u8; 256];
    // SAFETY: reads into our stack buffer; offset 0 makes the kernel generate the line afresh.
    let got = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if got <= 0 {
        return Err(false);
    }
    let line = &buf[..got as usize];
    if line.starts_with(b"running") {
        return Err(true);
    }
    Ok(parse_syscall(line, tid))
}

fn parse_dec(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 18 {
        return None;
    }
    let mut v = 0i64;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (b - b'0') as i64;
    }
    Some(v)
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    let s = s.strip_prefix(b"0x")?;
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &b in s {
        let d = (b as char).to_digit(16)?;
        v = v << 4 | d as u64;
    }
    Some(v)
}

/// Parses a `/proc/TID/syscall` line: `nr arg1 .. arg6 sp pc`, or `running`, or `-1 sp pc`.
pub(crate) fn parse_syscall(line: &[u8], tid: i32) -> Option<Candidate> {
    let mut it = line
        .split(|&b| b == b' ' || b == b'\n')
        .filter(|w| !w.is_empty());
    let nr = parse_dec(it.next()?)?;
    match nr {
        NR_MADVISE => {
            let addr = parse_hex(it.next()?)?;
            let len = parse_hex(it.next()?)?;
            Some(Candidate {
                tid,
                start: addr,
                end: addr.saturating_add(len.max(1)),
                io_worker: false,
            })
        }
        // Its ranges are in an iovec of the caller: any range may be its.
        NR_PROCESS_MADVISE => Some(Candidate {
            tid,
            start: 0,
            end: u64::MAX,
            io_worker: false,
        }),
        _ => None,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A thread whose blocked set holds an alternate-stack handler's signal but not ours may be
    /// inside that handler with its old mask: no signal for it. Ours blocked too, or neither: it
    /// may be signalled. Read from this thread's own /proc status.
    #[test]
    fn a_thread_inside_an_unguarded_handler_is_not_signalled() {
        let tid = crate::sys::gettid();
        let (alrm, ours) = (libc::SIGALRM, libc::SIGRTMAX() - SIGNAL_OFFSET);
        let on_stack = 1u64 << (alrm - 1);
        let with = |sigs: &[i32], f: &mut dyn FnMut()| {
            // SAFETY: sets and restores this thread's own signal mask.
            unsafe {
                let (mut set, mut old): (libc::sigset_t, libc::sigset_t) =
                    (std::mem::zeroed(), std::mem::zeroed());
                libc::sigemptyset(&mut set);
                for &s in sigs {
                    libc::sigaddset(&mut set, s);
                }
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
                f();
                libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
        };
        with(&[alrm], &mut || {
            assert!(in_unguarded_handler(tid, on_stack, ours))
        });
        with(&[alrm, ours], &mut || {
            assert!(!in_unguarded_handler(tid, on_stack, ours))
        });
        with(&[], &mut || {
            assert!(!in_unguarded_handler(tid, on_stack, ours))
        });
        assert!(
            in_unguarded_handler(-1, on_stack, ours),
            "no such thread: unknown"
        );
        assert_eq!(&itoa_digits(1234567)[..8], b"1234567\0");
    }

    /// A live thread of this process that waits (in a futex, never running our handler) until
    /// its sender is used or dropped: its tid, the release, the handle.
    fn parked_thread() -> (
        i32,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(crate::sys::gettid()).unwrap();
            let _ = go_rx.recv();
        });
        (rx.recv().unwrap(), go_tx, t)
    }

    #[test]
    fn member_sets_iterate_their_members() {
        let mut m = Members::default();
        for i in [0, 5, 63, 64, 200, 255] {
            m.add(i);
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 200, 255]);
        assert!(m.has(64) && !m.has(65));
        let mut o = Members::default();
        o.add(65);
        m.union(&o);
        assert!(m.has(65));
    }

    #[test]
    fn an_entry_blocks_until_resolved_and_acknowledged() {
        let mut f = InFlight::default();
        f.record(0x1000, 0x2000, false);
        assert!(f.overlaps(0x1800, 0x1900) && !f.overlaps(0x2000, 0x3000));
        assert!(f.unresolved(0x1000, 0x2000));
        // Unresolved entries never end by a sweep.
        assert!(!f.sweep());
        // A resolving scan that found nobody in the call: the sender is done.
        let h = InFlight::horizon();
        let _ = f.resolve(h, &[], false);
        assert!(f.sweep());
        assert!(f.is_empty());
        assert_eq!(f.confirmed, 1);
    }

    #[test]
    fn a_member_seen_out_of_the_call_later_stops_holding_its_entry() {
        // A live thread that never runs our handler (signals are not sent in this test).
        let (tid, stop_tx, t) = parked_thread();
        let mut f = InFlight::default();
        let ticket = f.record_fresh(0x1000, 0x2000);
        let h = InFlight::horizon();
        assert!(h >= ticket);
        let member = Candidate {
            tid,
            start: 0,
            end: u64::MAX,
            io_worker: false,
        };
        let _ = f.resolve(h, &[member], false);
        // Named, alive, not acknowledged: it holds the window.
        assert!(!f.sweep() && f.overlaps(0x1000, 0x2000));
        // A later scan that could not list everyone proves nothing.
        f.narrow(InFlight::horizon(), &[], true);
        assert!(!f.sweep());
        // One that lists it still (running, or in madvise over the range) keeps it a member.
        f.narrow(InFlight::horizon(), &[member], false);
        assert!(!f.sweep());
        // In madvise over another range: out of the call that was in the window.
        let elsewhere = Candidate {
            start: 0x9000,
            end: 0xa000,
            ..member
        };
        f.narrow(InFlight::horizon(), &[elsewhere], false);
        assert!(f.sweep());
        assert!(f.is_empty());
        assert_eq!((f.fresh_confirmed, f.confirmed), (1, 0));
        stop_tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_full_table_merges_instead_of_dropping() {
        let mut f = InFlight::default();
        for i in 0..ENTRIES as u64 + 3 {
            f.record(i * 0x1000, i * 0x1000 + 0x1000, false);
        }
        assert_eq!(f.len(), ENTRIES);
        assert_eq!(f.merged, 3);
        // The merged entry covers every range that went into it.
        let last = ENTRIES as u64 + 2;
        assert!(f.overlaps(last * 0x1000, last * 0x1000 + 1));
    }

    #[test]
    fn reads_the_flags_of_proc_stat_lines() {
        let line = b"4242 (iou-wrk-4) x) S 1 4242 4242 0 -1 4194368 0 0 0 0 0 0\n";
        assert_eq!(stat_flags(line), Some(4194368));
        assert_eq!(stat_flags(line).unwrap() & PF_IO_WORKER, 0);
        assert_eq!(stat_flags(b"7 (a) R 1 7 7 0 -1 2097232 1"), Some(2097232));
        assert_eq!(stat_flags(b"7 (a) R 1"), None);
        assert_eq!(
            stat_state(b"57 (iou-wrk-54) S 1 1 1 0 -1 4194320"),
            Some(b'S')
        );
        assert_eq!(stat_state(b"7 (a) b) D 1"), Some(b'D'));
        assert_eq!(stat_state(b"7 (a"), None);
        // Our own thread is no io_uring worker; a worker of a ring we drive is one.
        let dir = c"/proc/self/task";
        // SAFETY: opens a directory read-only; closed below.
        let dfd = unsafe { libc::open(dir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        assert!(dfd >= 0);
        let me = crate::sys::gettid().to_string();
        assert!(!is_io_worker(dfd, me.as_bytes()));
        // SAFETY: our own fd.
        unsafe { libc::close(dfd) };
    }

    #[test]
    fn a_task_file_of_a_thread_that_is_gone_reads_dead() {
        let (tid, go_tx, t) = parked_thread();
        let path = std::ffi::CString::new(format!("/proc/self/task/{tid}/syscall")).unwrap();
        // SAFETY: a NUL-terminated path; closed below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        assert!(fd >= 0);
        assert!(task_file_live(fd));
        go_tx.send(()).unwrap();
        t.join().unwrap();
        // join returns when the kernel cleared the thread's tid word, a little before the thread
        // is released: look again for a while.
        let dead = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            !task_file_live(fd)
        });
        assert!(dead, "the file of an exited thread still reads live");
        // SAFETY: our own fd.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn parses_proc_syscall_lines() {
        let c = parse_syscall(
            b"28 0x7f1234560000 0x4000 0x4 0x0 0x0 0x0 0x7ffd1 0x7f2\n",
            7,
        );
        assert_eq!(
            c,
            Some(Candidate {
                tid: 7,
                start: 0x7f1234560000,
                end: 0x7f1234564000,
                io_worker: false,
            })
        );
        assert_eq!(parse_syscall(b"running\n", 7), None);
        assert_eq!(parse_syscall(b"-1 0x7ffd 0x7f\n", 7), None);
        assert_eq!(parse_syscall(b"0 0x3 0x7f 0x10 0 0 0 0x1 0x2\n", 7), None);
        assert_eq!(
            parse_syscall(b"440 0x3 0x7f 0x1 0x4 0x0 0x0 0x1 0x2\n", 9).map(|c| (c.start, c.end)),
            Some((0, u64::MAX))
        );
    }
}

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
