//! The torture engine: worker threads doing a seeded random mix of cache I/O through io_uring
//! fixed buffers, notifier register/unregister, every kind of mapping change, heap traffic,
//! thread creation and exit, and fork with a child that uses the library (and `brk`), judged by
//! three oracles:
//!
//! * **PFN**: the registrar records, from `/proc/self/pagemap`, the page frames it pinned; every
//!   handle the cache returns must name exactly the frames mapped at the requested pages now.
//! * **Device bytes**: `WRITE_FIXED` through the handle to a file, read back, compared with what
//!   memory holds now (a stale registration writes the old pages' bytes).
//! * **Notifier**: a region valid before a change that overlaps it is invalid once the change
//!   returned; every region a change hit gets at least one event, and never more events than hits.
//!
//! Any failure panics with the seed. Each worker owns its buffers (at fixed low addresses in its
//! own area), so only it changes them; the heap is shared by everyone.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;
use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::{FixedBuf, IoUringRegistrar, Registrar};
use ummunotify::{Cookie, Notifier, Region};
use ummunotify_testkit::pagemap;
use ummunotify_testkit::remove_race::{read_stamp, stamp as churn_stamp, Buffers, Change as Seq};
use ummunotify_testkit::remove_race::{RemoveKind, Remover};
use ummunotify_testkit::uring::UringMadvise;

/// The last operations of each worker thread, kept where a core dump shows them: in gdb,
/// `print torture::torture_kit::engine::TRACE` (or `signals::...`). Each entry is
/// `[op, a, b, c]`, newest at `next - 1` (mod `TRACE_LEN`); `op` is one of the `OP_*` codes,
/// with the change kind (`Change as u64`) in bits 8.. for `OP_CHANGE`.
pub static TRACE: [Trace; MAX_WORKERS] = [const { Trace::new() }; MAX_WORKERS];
pub const MAX_WORKERS: usize = 8;
const TRACE_LEN: usize = 64;
/// `[OP_IO, addr, len, 0]`: stamp and cache I/O.
pub const OP_IO: u64 = 1;
/// `[OP_CHANGE | kind << 8, buffer start, changed start, changed end]`, after the change.
pub const OP_CHANGE: u64 = 2;
/// `[OP_REGISTER, buffer start, 1 registered / 0 unregistered, cookie]`.
pub const OP_REGISTER: u64 = 3;
/// `[OP_HEAP, live blocks before, 0, 0]`.
pub const OP_HEAP: u64 = 4;
/// `[OP_THREAD | OP_FORK, 0, 0, 0]`, before.
pub const OP_THREAD: u64 = 5;
pub const OP_FORK: u64 = 6;
/// `[OP_CHURN, shared buffer start, path (0 register, 1 cache, 2 re-arm), 0]`, before.
pub const OP_CHURN: u64 = 7;

/// One worker's ring of recent operations (see [`TRACE`]).
pub struct Trace {
    next: AtomicU64,
    ops: [[AtomicU64; 4]; TRACE_LEN],
}

impl Trace {
    const fn new() -> Trace {
        Trace {
            next: AtomicU64::new(0),
            ops: [const { [const { AtomicU64::new(0) }; 4] }; TRACE_LEN],
        }
    }

    fn record(&self, op: [u64; 4]) {
        let i = self.next.fetch_add(1, Relaxed) as usize % TRACE_LEN;
        for (slot, v) in self.ops[i].iter().zip(op) {
            slot.store(v, Relaxed);
        }
    }

    /// Writes the ring, oldest first, to fd 2 without allocating (for a fatal-signal handler).
    pub fn write_raw(&self, worker: usize) {
        let next = self.next.load(Relaxed) as usize;
        for i in next.saturating_sub(TRACE_LEN)..next {
            let mut line = RawLine::default();
            line.text("torture trace: worker ");
            line.hex(worker as u64);
            line.text(" #");
            line.hex(i as u64);
            for word in &self.ops[i % TRACE_LEN] {
                line.text(" ");
                line.hex(word.load(Relaxed));
            }
            line.text("\n");
            line.write();
        }
    }

    /// The ring, oldest first, as text (for a failure message).
    pub fn dump(&self) -> String {
        let next = self.next.load(Relaxed) as usize;
        let first = next.saturating_sub(TRACE_LEN);
        (first..next)
            .map(|i| {
                let e = &self.ops[i % TRACE_LEN];
                let [op, a, b, c] = std::array::from_fn(|k| e[k].load(Relaxed));
                let name = match op & 0xFF {
                    OP_IO => "io".to_owned(),
                    OP_CHANGE => ALL_CHANGES
                        .get((op >> 8) as usize)
                        .map_or("change?".to_owned(), |k| k.name().to_owned()),
                    OP_REGISTER => "register".to_owned(),
                    OP_HEAP => "heap".to_owned(),
                    OP_THREAD => "thread".to_owned(),
                    OP_FORK => "fork".to_owned(),
                    OP_CHURN => "churn".to_owned(),
                    _ => "?".to_owned(),
                };
                format!("  #{i} {name} {a:#x} {b:#x} {c:#x}\n")
            })
            .collect()
    }
}

/// A line built on the stack (no allocation) and written to fd 2.
pub struct RawLine {
    buf: [u8; 256],
    len: usize,
}

impl Default for RawLine {
    fn default() -> Self {
        RawLine {
            buf: [0; 256],
            len: 0,
        }
    }
}

impl RawLine {
    pub fn text(&mut self, t: &str) {
        for &b in t.as_bytes() {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    pub fn hex(&mut self, v: u64) {
        self.text("0x");
        let digits = b"0123456789abcdef";
        let mut started = false;
        for shift in (0..16).rev() {
            let d = ((v >> (shift * 4)) & 0xF) as usize;
            if d != 0 || started || shift == 0 {
                started = true;
                if self.len < self.buf.len() {
                    self.buf[self.len] = digits[d];
                    self.len += 1;
                }
            }
        }
    }

    pub fn write(&self) {
        // SAFETY: writes initialised bytes of a live buffer to stderr.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
    }
}

/// On SIGSEGV, SIGBUS or SIGABRT: write the seed and every worker's recent operations to fd 2
/// (no allocation: async-signal-safe), then die of the same signal with a core dump. A crash in
/// a worker otherwise leaves only a core and a backtrace, not what the worker was doing.
pub fn install_crash_report() {
    extern "C" fn on_fatal(sig: libc::c_int) {
        let mut line = RawLine::default();
        line.text("torture crash: signal ");
        line.hex(sig as u64);
        line.text(", UMN_TORTURE_SEED=");
        line.hex(super::SEED.load(SeqCst));
        line.text("; last operations per worker (op codes: OP_* in engine.rs):\n");
        line.write();
        for (w, t) in TRACE.iter().enumerate() {
            t.write_raw(w);
        }
        // SA_RESETHAND put the default action back: raising the signal again (delivered at
        // once: SA_NODEFER) kills the process with a core, whether the signal came from a fault
        // or from kill(2).
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(sig) };
    }
    let handler: extern "C" fn(libc::c_int) = on_fatal;
    for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
        // SAFETY: a zeroed sigaction is valid; the handler only writes to fd 2.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as usize;
            sa.sa_flags = libc::SA_RESETHAND | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Environment variable: `1` turns the REMOVE-in-flight protection (issue 9) off for the run,
/// to show the torture catches the bug it prevents (the run then fails).
pub const UNPROTECTED_ENV: &str = "UMN_TORTURE_UNPROTECTED";

/// Turns the protection off when [`UNPROTECTED_ENV`] is `1` (before any notifier exists).
pub fn unprotected_if_asked() {
    if std::env::var_os(UNPROTECTED_ENV).is_some_and(|v| v == "1") {
        eprintln!("{UNPROTECTED_ENV}=1: REMOVE-in-flight protection off, the run should fail");
        ummunotify::__testing::disable_remove_in_flight();
    }
}

/// How a run is set up.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub threads: usize,
    pub duration: Duration,
    /// Forks at most this often (each fork costs milliseconds).
    pub fork_every: Duration,
    /// Use the testkit's `IORING_OP_MADVISE` ring (not under a signal storm: its wait gives up on
    /// `EINTR` and leaves the madvise in flight).
    pub uring_madvise: bool,
    /// Called with the notifier the workers use once it exists (before any worker starts), and
    /// with `None` after the workers stopped, before it is dropped: lets a test put memory of
    /// its own on the same notifier (the signal storm's victim page).
    pub on_notifier: Option<fn(Option<&Notifier>)>,
    /// REMOVE churn (issue 9): shared buffers that a changer thread drops again and again with
    /// every REMOVE-producing kind while the workers register, pin, re-arm and get them through
    /// the cache (see [`Churn`]).
    pub remove_churn: bool,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Totals {
    pub ops: u64,
    pub io: u64,
    pub changes: u64,
    pub registers: u64,
    pub unregisters: u64,
    pub heap_ops: u64,
    pub threads_spawned: u64,
    pub forks: u64,
    pub pfn_checks: u64,
    pub byte_checks: u64,
    pub token_checks: u64,
    pub event_checks: u64,
    pub events: u64,
    /// Writes the kernel cancelled (ECANCELED) and the run retried.
    pub cancelled: u64,
    /// How often each change kind ran, by name.
    pub kinds: Vec<(&'static str, u64)>,
    /// mremap moves the kernel refused part-way, after moving some VMAs (Linux 6.17+ moves
    /// several VMAs in one call and stops at a userfaultfd-watched one).
    pub partial_moves: u64,
    /// REMOVE churn: changes the changer made, uses judged, and registrations / re-arms / gets
    /// begun inside a REMOVE of their buffer and checked after it returned (the window).
    pub churn_changes: u64,
    pub churn_judged: u64,
    pub churn_racing: u64,
    /// Cache gets on churn buffers that answered `Unstable` (see `op_churn`).
    pub churn_unstable: u64,
    pub elapsed: Duration,
}

impl Totals {
    pub fn checks(&self) -> u64 {
        self.pfn_checks + self.byte_checks + self.token_checks + self.event_checks
    }

    /// The change kinds that never ran as themselves (`uring-madvise` only counts when the run
    /// was asked to use io_uring's madvise).
    pub fn kinds_never_run(&self, p: &Params) -> Vec<&'static str> {
        self.kinds
            .iter()
            .filter(|&&(name, n)| n == 0 && (p.uring_madvise || name != "uring-madvise"))
            .map(|&(name, _)| name)
            .collect()
    }
}

#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    io: AtomicU64,
    changes: AtomicU64,
    registers: AtomicU64,
    unregisters: AtomicU64,
    heap_ops: AtomicU64,
    threads_spawned: AtomicU64,
    forks: AtomicU64,
    pfn_checks: AtomicU64,
    byte_checks: AtomicU64,
    token_checks: AtomicU64,
    event_checks: AtomicU64,
    events: AtomicU64,
    cancelled: AtomicU64,
    /// How often each change kind really ran (`Change as usize`): a kind that fell back to
    /// another call (no io_uring madvise, no process_madvise) is not counted as itself.
    kinds: [AtomicU64; KINDS],
    /// mremap moves the kernel refused part-way (see `Worker::repair_partial_move`).
    partial_moves: AtomicU64,
    churn_changes: AtomicU64,
    churn_judged: AtomicU64,
    churn_racing: AtomicU64,
    churn_unstable: AtomicU64,
}

/// The io_uring registrar, recording the frames it pinned (the PFN oracle's reference).
pub struct Recording {
    uring: IoUringRegistrar,
    pfns: bool,
}

pub struct Key {
    buf: FixedBuf,
    range: Range<usize>,
    pfns: Vec<Option<u64>>,
}

impl Registrar for Recording {
    type Key = Key;
    fn register(&self, range: Range<usize>) -> io::Result<Key> {
        let buf = self.uring.register(range.clone())?;
        // Allocates and reads a file inside the cache's miss: registrar callbacks may do both.
        let pfns = if self.pfns {
            pagemap::pfns(range.clone()).unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(Key { buf, range, pfns })
    }
    fn deregister(&self, key: &Key, range: Range<usize>) -> io::Result<()> {
        self.uring.deregister(&key.buf, range)
    }
    fn max_len(&self) -> usize {
        self.uring.max_len()
    }
    fn max_registrations(&self) -> Option<usize> {
        self.uring.max_registrations()
    }
}

struct World {
    p: Params,
    cache: Cache<Recording>,
    pfns: bool,
    stop: AtomicBool,
    c: Counters,
    /// Events of user regions, per cookie. Every reader of events holds this lock while reading
    /// and recording, so an owner that drains under it sees all events of its regions.
    ledger: Mutex<HashMap<u64, u32>>,
    last_fork: Mutex<Instant>,
    churn: Option<Churn>,
}

/// Shared buffers for the REMOVE churn: anonymous ones (DONTNEED, FREE, DONTNEED_LOCKED,
/// process_madvise, IORING_OP_MADVISE) and shmem ones (MADV_REMOVE), each with the seqlock that
/// says which uses may be judged (`testkit::remove_race`).
pub struct Churn {
    sets: [(Buffers, Vec<Seq>); 2],
}

const CHURN_BUFS: usize = 8;
const CHURN_PAGES: usize = 4;
/// The kinds the changer cycles through on the anonymous buffers (the shmem ones get
/// `MADV_REMOVE`).
const CHURN_ANON: [RemoveKind; 5] = [
    RemoveKind::Dontneed,
    RemoveKind::DontneedLocked,
    RemoveKind::ProcessMadvise,
    RemoveKind::UringMadvise,
    RemoveKind::Free,
];

impl Churn {
    fn new() -> Churn {
        let set = |shmem| {
            let b = Buffers::new(CHURN_BUFS, CHURN_PAGES * page(), shmem).expect("churn buffers");
            (b, (0..CHURN_BUFS).map(|_| Seq::default()).collect())
        };
        Churn {
            sets: [set(false), set(true)],
        }
    }

    fn range(&self, set: usize, i: usize) -> Range<usize> {
        let a = self.sets[set].0.addr(i);
        a..a + self.sets[set].0.len()
    }

    /// The changer: one buffer after another, each kind in turn, until `stop`.
    fn changer(&self, w: &World) {
        let mut removers: Vec<Remover> = CHURN_ANON
            .iter()
            .chain([&RemoveKind::RemoveShmem])
            .filter_map(|&k| match Remover::new(k) {
                Ok(r) => Some(r),
                Err(e) => {
                    ummunotify_testkit::require::skip_or_fail(
                        "torture REMOVE churn",
                        &format!("{} ({e})", k.name()),
                    );
                    None
                }
            })
            .collect();
        let mut n = 0u64;
        while !w.stop.load(Relaxed) && !removers.is_empty() {
            let k = (n as usize) % removers.len();
            let set = usize::from(removers[k].kind().needs_shmem());
            let i = ((n / removers.len() as u64) % CHURN_BUFS as u64) as usize;
            let r = self.range(set, i);
            // SAFETY: the churn buffers are the changer's to drop; nothing references them.
            unsafe {
                removers[k].change(&self.sets[set].1[i], r.start, r.len(), page(), {
                    churn_stamp(i, n)
                })
            }
            .unwrap_or_else(|e| panic!("churn {}: {e}", removers[k].kind().name()));
            n += 1;
        }
        w.c.churn_changes.store(n, SeqCst);
    }
}

/// Panics with the seed, where, and the thread's last operations.
macro_rules! fail {
    ($w:expr, $t:expr, $($arg:tt)*) => {
        panic!(
            "TORTURE FAILURE (reproduce with UMN_TORTURE_SEED={:#x}, thread {}): {}\n\
             last operations of this thread, oldest first:\n{}",
            $w.p.seed, $t, format!($($arg)*), TRACE[$t % MAX_WORKERS].dump()
        )
    };
}

impl World {
    /// The REMOVE churn's oracle: one check of a registration (re-arm, get) begun at seqlock
    /// value `born`, `before` read before the check, `dev` (what the device read through the pin)
    /// and `mapped` after it. A judged use must carry the mapped bytes.
    #[allow(clippy::too_many_arguments)]
    fn churn_check(
        &self,
        t: usize,
        seq: &Seq,
        born: &mut u64,
        before: u64,
        valid: bool,
        dev: u64,
        mapped: u64,
        what: &str,
    ) {
        if !seq.judged(before) {
            return;
        }
        if *born % 2 == 1 && before > *born {
            self.c.churn_racing.fetch_add(1, Relaxed);
            *born = 0;
        }
        if !valid {
            return;
        }
        self.c.churn_judged.fetch_add(1, Relaxed);
        if dev != mapped {
            fail!(
                self,
                t,
                "REMOVE churn ({what}): stale registration, the device read {dev:#x} through the \
                 pin, memory holds {mapped:#x} (a registration made while a REMOVE was in flight)"
            );
        }
    }

    /// Reads pending user events into the ledger (under its lock).
    fn collect(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        let mut l = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        for e in self.cache.take_events().expect("take_events") {
            *l.entry(e.cookie.0).or_default() += 1;
            self.c.events.fetch_add(1, Relaxed);
        }
        l
    }

    /// The PFN and device-bytes oracles for `[addr, addr + len)`, which the caller owns and has
    /// just filled.
    fn io_check(&self, t: usize, file: &File, addr: usize, len: usize) {
        let h = match self.cache.get(addr, len) {
            Ok(h) => h,
            Err(e) => fail!(self, t, "cache.get({addr:#x}, {len}): {e}"),
        };
        let key = h.key();
        if !(key.range.start <= addr && addr + len <= key.range.end) {
            fail!(
                self,
                t,
                "handle {:#x?} does not cover {addr:#x}+{len}",
                key.range
            );
        }
        if self.pfns {
            let pg = page();
            let first = (addr - key.range.start) / pg;
            let now = pagemap::pfns(addr..addr + len).expect("pagemap");
            for (i, pfn) in now.iter().enumerate() {
                let pinned = key.pfns.get(first + i).copied().flatten();
                if pfn.is_none() || *pfn != pinned {
                    fail!(
                        self,
                        t,
                        "stale registration: page {:#x} is frame {pfn:?}, the registration pinned {pinned:?}",
                        (addr & !(pg - 1)) + i * pg
                    );
                }
            }
            self.c.pfn_checks.fetch_add(now.len() as u64, Relaxed);
        }
        // Under a signal storm the kernel sometimes cancels the write (ECANCELED; seen only in
        // debug builds, from short-lived threads): not a stale use, so retry and count it.
        let mut tries = 0;
        let n = loop {
            match self
                .cache
                .registrar()
                .uring
                .write_fixed(&key.buf, addr, len, file.as_fd(), 0)
            {
                Ok(n) => break n,
                Err(e) if e.raw_os_error() == Some(libc::ECANCELED) && tries < 100 => {
                    tries += 1;
                    self.c.cancelled.fetch_add(1, Relaxed);
                }
                Err(e) => fail!(self, t, "write_fixed: {e}"),
            }
        };
        drop(h);
        if n != len {
            fail!(self, t, "short write {n} of {len}");
        }
        let mut back = vec![0u8; len];
        file.read_exact_at(&mut back, 0).unwrap();
        // SAFETY: the caller owns `[addr, addr + len)`, mapped and filled.
        let mem = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        if back != mem {
            let at = back.iter().zip(mem).position(|(a, b)| a != b).unwrap();
            fail!(
                self,
                t,
                "device wrote stale bytes at {:#x}: {:#x} instead of {:#x}",
                addr + at,
                back[at],
                mem[at]
            );
        }
        self.c.byte_checks.fetch_add(1, Relaxed);
        self.c.io.fetch_add(1, Relaxed);
    }
}

/// Whether `events` read for a region fit the `hits` (changes that overlapped it) it had: none
/// without a hit, at least one with. One change can send one kernel message per VMA it spans
/// (a watched buffer has at most `2 * MAX_PAGES + 1`), and a reader may re-arm the region between
/// two of them, so a change can yield that many events.
fn events_match(hits: u32, events: u32) -> bool {
    if hits == 0 {
        events == 0
    } else {
        events >= 1 && events <= hits * (2 * MAX_PAGES as u32 + 1)
    }
}

/// Fills a range with a stamp: a counter at the start of each page, the low byte elsewhere.
fn stamp(addr: usize, len: usize, stamp: u64) {
    fill(addr, len, stamp as u8);
    let pg = page();
    let mut p = (addr + pg - 1) & !(pg - 1);
    while p + 8 <= addr + len {
        // SAFETY: inside the caller's mapped, writable range.
        unsafe { (p as *mut u64).write_unaligned(stamp) };
        p += pg;
    }
}

fn map_noreplace(addr: usize, len: usize, shared: Option<&File>) -> bool {
    let (flags, fd) = match shared {
        Some(f) => (libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(f)),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: NOREPLACE never clobbers an existing mapping.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED_NOREPLACE,
            fd,
            0,
        )
    };
    p as usize == addr
}

/// Every mapping (VMA) of the process, from `/proc/self/maps`, in address order.
fn vmas() -> Vec<Range<usize>> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| {
            let (r, _) = l.split_once(' ')?;
            let (s, e) = r.split_once('-')?;
            Some(usize::from_str_radix(s, 16).ok()?..usize::from_str_radix(e, 16).ok()?)
        })
        .collect()
}

/// The mapping (VMA) containing `addr`.
fn vma_containing(addr: usize) -> Option<Range<usize>> {
    vmas().into_iter().find(|v| v.contains(&addr))
}

/// The mappings overlapping `range`, clipped to it.
fn vmas_in(range: Range<usize>) -> Vec<Range<usize>> {
    vmas()
        .into_iter()
        .filter(|v| v.start < range.end && range.start < v.end)
        .map(|v| v.start.max(range.start)..v.end.min(range.end))
        .collect()
}

/// Maps fresh anonymous memory over every hole in `range` (a worker's own buffer). Returns the
/// span from the first to the end of the last hole filled (empty: the range was whole).
fn refill_holes(range: Range<usize>) -> Range<usize> {
    let mut cur = range.start;
    let mut changed = range.start..range.start;
    let mut vmas = vmas_in(range.clone());
    vmas.push(range.end..range.end);
    for v in vmas {
        if v.start > cur {
            assert!(map_noreplace(cur, v.start - cur, None), "refill {cur:#x}");
            if changed.is_empty() {
                changed.start = cur;
            }
            changed.end = v.start;
        }
        cur = cur.max(v.end);
    }
    changed
}

fn memfd(len: usize) -> File {
    // SAFETY: a NUL-terminated name; the fd is owned by the File at once.
    let fd = unsafe { libc::memfd_create(c"torture".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh fd nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len as u64).unwrap();
    f
}

fn madv(addr: usize, len: usize, advice: i32) {
    // SAFETY: advice on the worker's own buffer.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    assert_eq!(r, 0, "madvise({advice}): {}", io::Error::last_os_error());
}

const BUFS: usize = 12;
const SHMEM_BUFS: usize = 2;
const MAX_PAGES: usize = 16;
const SPACING: usize = 1 << 20;

/// One of a worker's buffers at a fixed address in its area.
struct Buf {
    addr: usize,
    pages: usize,
    /// Backing file for shared-memory buffers.
    shmem: Option<File>,
    user: Option<User>,
}

/// A user region on the notifier over a whole buffer.
struct User {
    cookie: u64,
    hits: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum Change {
    LibcMunmap,
    SyscallMunmap,
    MapFixedOver,
    PartialMunmap,
    MremapMove,
    MremapShrink,
    MremapDontunmap,
    MadvDontneed,
    MadvFree,
    MadvRemove,
    ProcessMadvise,
    UringMadvise,
    Mprotect,
}

/// Every change kind, in `Change as usize` order (for the per-kind counts).
const ALL_CHANGES: &[Change] = &[
    Change::LibcMunmap,
    Change::SyscallMunmap,
    Change::MapFixedOver,
    Change::PartialMunmap,
    Change::MremapMove,
    Change::MremapShrink,
    Change::MremapDontunmap,
    Change::MadvDontneed,
    Change::MadvFree,
    Change::MadvRemove,
    Change::ProcessMadvise,
    Change::UringMadvise,
    Change::Mprotect,
];
const KINDS: usize = ALL_CHANGES.len();

impl Change {
    fn name(self) -> &'static str {
        match self {
            Change::LibcMunmap => "libc-munmap",
            Change::SyscallMunmap => "syscall-munmap",
            Change::MapFixedOver => "map-fixed-over",
            Change::PartialMunmap => "partial-munmap",
            Change::MremapMove => "mremap-move",
            Change::MremapShrink => "mremap-shrink",
            Change::MremapDontunmap => "mremap-dontunmap",
            Change::MadvDontneed => "madv-dontneed",
            Change::MadvFree => "madv-free",
            Change::MadvRemove => "madv-remove",
            Change::ProcessMadvise => "process-madvise",
            Change::UringMadvise => "uring-madvise",
            Change::Mprotect => "mprotect",
        }
    }
}

const ANON_CHANGES: &[Change] = &[
    Change::LibcMunmap,
    Change::SyscallMunmap,
    Change::MapFixedOver,
    Change::PartialMunmap,
    Change::MremapMove,
    Change::MremapShrink,
    Change::MremapDontunmap,
    Change::MadvDontneed,
    Change::MadvFree,
    Change::ProcessMadvise,
    Change::UringMadvise,
    Change::Mprotect,
];

const SHMEM_CHANGES: &[Change] = &[
    Change::LibcMunmap,
    Change::MadvRemove,
    Change::MadvDontneed,
    Change::Mprotect,
];

struct Worker<'w> {
    w: &'w World,
    t: usize,
    rng: Rng,
    file: File,
    bufs: Vec<Buf>,
    area: usize,
    heap: Vec<(*mut u8, usize)>,
    next_cookie: u64,
    stamp: u64,
    pidfd: i32,
    uring_madvise: Option<UringMadvise>,
    /// The REMOVE churn's own pins (not the cache's table) and its re-armed region.
    churn_pins: Option<IoUringRegistrar>,
    churn_held: Option<Held>,
}

/// What the device reads through `key` at `addr`: 8 bytes written with `WRITE_FIXED` into
/// `file` and read back.
fn churn_device(file: &File, pins: &IoUringRegistrar, key: &FixedBuf, addr: usize) -> u64 {
    let n = pins
        .write_fixed(key, addr, 8, file.as_fd(), 0)
        .expect("churn write_fixed");
    assert_eq!(n, 8, "churn write_fixed: short write");
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, 0).unwrap();
    u64::from_ne_bytes(b)
}

/// A region the churn keeps registered and pinned over a shared buffer, re-armed on events.
struct Held {
    set: usize,
    i: usize,
    cookie: Cookie,
    key: FixedBuf,
    born: u64,
}

impl Worker<'_> {
    fn buf_range(&self, i: usize) -> Range<usize> {
        let b = &self.bufs[i];
        b.addr..b.addr + b.pages * page()
    }

    fn next_stamp(&mut self) -> u64 {
        self.stamp += 1;
        ((self.t as u64) << 56) | self.stamp
    }

    /// A random sub-range (bytes, not page-aligned) of buffer `i`.
    fn sub_range(&mut self, i: usize) -> (usize, usize) {
        let r = self.buf_range(i);
        let len = r.len();
        let start = self.rng.below(len as u64 - 1) as usize;
        let max = (len - start).min(6 * page());
        let l = 1 + self.rng.below(max as u64) as usize;
        (r.start + start, l)
    }

    fn op_io(&mut self) {
        let i = self.rng.below(BUFS as u64) as usize;
        let (a, l) = self.sub_range(i);
        let s = self.next_stamp();
        self.trace([OP_IO, a as u64, l as u64, 0]);
        stamp(a, l, s);
        self.w.io_check(self.t, &self.file, a, l);
    }

    fn trace(&self, op: [u64; 4]) {
        TRACE[self.t % MAX_WORKERS].record(op);
    }

    /// Unregisters a user region after the lost-event check: every hit shows up as at least one
    /// event, never more than hits. The ledger stays locked until the region is gone, so no event
    /// of it can be collected in between.
    fn unregister_user(&mut self, u: User) {
        let l = self.w.collect();
        let got = l.get(&u.cookie).copied().unwrap_or(0);
        if !events_match(u.hits, got) {
            fail!(
                self.w,
                self.t,
                "region {:#x}: {} hits but {got} events",
                u.cookie,
                u.hits
            );
        }
        self.w.c.event_checks.fetch_add(1, Relaxed);
        if let Err(e) = self.w.cache.notifier().unregister(Cookie(u.cookie)) {
            fail!(self.w, self.t, "unregister: {e}");
        }
        drop(l);
        self.w.c.unregisters.fetch_add(1, Relaxed);
    }

    fn op_register(&mut self) {
        let i = self.rng.below(BUFS as u64) as usize;
        let registered = u64::from(self.bufs[i].user.is_none());
        self.trace([
            OP_REGISTER,
            self.bufs[i].addr as u64,
            registered,
            self.next_cookie,
        ]);
        if let Some(u) = self.bufs[i].user.take() {
            self.unregister_user(u);
        } else {
            let r = self.buf_range(i);
            self.next_cookie += 1;
            let cookie = ((self.t as u64 + 1) << 40) | self.next_cookie;
            match self.w.cache.notifier().register(r, Cookie(cookie)) {
                Ok(_) => {
                    self.bufs[i].user = Some(User { cookie, hits: 0 });
                    self.w.c.registers.fetch_add(1, Relaxed);
                }
                Err(e) => fail!(self.w, self.t, "register: {e}"),
            }
        }
    }

    /// Applies a random change to buffer `i`, leaving it mapped (new memory where it changed).
    /// Returns the range whose mapping changed (empty: none).
    fn apply(&mut self, i: usize, ch: Change) -> Range<usize> {
        let pg = page();
        let r = self.buf_range(i);
        let (a, len) = (r.start, r.len());
        let dest = a + SPACING / 2;
        let shmem = self.bufs[i].shmem.as_ref();
        match ch {
            Change::LibcMunmap => {
                unmap(a, len);
                assert!(map_noreplace(a, len, shmem));
                self.ran(ch);
                r
            }
            Change::SyscallMunmap => {
                // SAFETY: the worker's own buffer.
                assert_eq!(unsafe { libc::syscall(libc::SYS_munmap, a, len) }, 0);
                assert!(map_noreplace(a, len, None));
                self.ran(ch);
                r
            }
            Change::MapFixedOver => {
                map_fixed(a, len);
                self.ran(ch);
                r
            }
            Change::PartialMunmap => {
                let p = a + self.rng.below(self.bufs[i].pages as u64) as usize * pg;
                unmap(p, pg);
                assert!(map_noreplace(p, pg, None));
                self.ran(ch);
                p..p + pg
            }
            Change::MremapMove | Change::MremapShrink | Change::MremapDontunmap => {
                // mremap works on one VMA: take the one holding a random page of the buffer
                // (watches split buffers into several), clipped to the buffer.
                let p = a + self.rng.below(self.bufs[i].pages as u64) as usize * pg;
                let Some(v) = vma_containing(p) else {
                    return a..a;
                };
                let (vs, ve) = (v.start.max(a), v.end.min(a + len));
                let vlen = ve - vs;
                let to = dest + (vs - a);
                if let Change::MremapShrink = ch {
                    if vlen <= pg {
                        return a..a;
                    }
                    // SAFETY: shrinks part of the worker's own buffer in place.
                    let m = unsafe { libc::mremap(vs as *mut libc::c_void, vlen, pg, 0) };
                    if m as usize != vs {
                        // Raced with a watch splitting or merging the VMA. Whatever the kernel
                        // did, the buffer must be whole again before anyone stamps it.
                        return refill_holes(vs + pg..ve);
                    }
                    assert!(map_noreplace(vs + pg, vlen - pg, None));
                    self.ran(ch);
                    return vs + pg..ve;
                }
                let mut flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
                if let Change::MremapDontunmap = ch {
                    flags |= libc::MREMAP_DONTUNMAP;
                }
                // SAFETY: moves part of the worker's own buffer to its own free destination.
                let m = unsafe {
                    libc::mremap(
                        vs as *mut libc::c_void,
                        vlen,
                        vlen,
                        flags,
                        to as *mut libc::c_void,
                    )
                };
                if m as usize != to {
                    // The range spanned several VMAs (a watch split it after we looked): since
                    // Linux 6.17 mremap moves such a range VMA by VMA and stops with EFAULT at
                    // one it may not move (a userfaultfd-watched one), *keeping* the moves
                    // already made. Not "nothing changed": put the buffer back together.
                    return self.repair_partial_move(vs, ve, to);
                }
                if let Change::MremapMove = ch {
                    assert!(map_noreplace(vs, vlen, None));
                }
                unmap(to, vlen);
                self.ran(ch);
                vs..ve
            }
            Change::MadvDontneed => {
                madv(a, len, libc::MADV_DONTNEED);
                self.ran(ch);
                r
            }
            Change::MadvFree => {
                madv(a, len, libc::MADV_FREE);
                self.ran(ch);
                r
            }
            Change::MadvRemove => {
                madv(a, len, libc::MADV_REMOVE);
                self.ran(ch);
                r
            }
            Change::ProcessMadvise => {
                let iov = libc::iovec {
                    iov_base: a as *mut libc::c_void,
                    iov_len: len,
                };
                // SAFETY: one iovec over the worker's own buffer; advice only.
                let n = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        self.pidfd,
                        &iov as *const libc::iovec,
                        1,
                        libc::MADV_DONTNEED,
                        0,
                    )
                };
                if n < 0 {
                    madv(a, len, libc::MADV_DONTNEED);
                    self.ran(Change::MadvDontneed);
                } else {
                    self.ran(ch);
                }
                r
            }
            Change::UringMadvise => {
                match self
                    .uring_madvise
                    .as_mut()
                    .map(|u| u.madvise(a, len, libc::MADV_DONTNEED))
                {
                    Some(Ok(())) => self.ran(ch),
                    _ => {
                        madv(a, len, libc::MADV_DONTNEED);
                        self.ran(Change::MadvDontneed);
                    }
                }
                r
            }
            Change::Mprotect => {
                // SAFETY: protection changes on the worker's own buffer, restored at once.
                unsafe {
                    libc::mprotect(a as *mut libc::c_void, len, libc::PROT_READ);
                    libc::mprotect(
                        a as *mut libc::c_void,
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                    );
                }
                self.ran(ch);
                a..a
            }
        }
    }

    /// Counts a change kind that really ran.
    fn ran(&self, ch: Change) {
        self.w.c.kinds[ch as usize].fetch_add(1, Relaxed);
    }

    /// After a refused mremap move of `[vs, ve)` to `to`: whatever moved is taken back out of
    /// the destination and the source gets fresh memory where it lost pages. Returns the span
    /// whose mapping changed (the VMAs that moved come first, in address order).
    fn repair_partial_move(&mut self, vs: usize, ve: usize, to: usize) -> Range<usize> {
        let moved = vmas_in(to..to + (ve - vs))
            .iter()
            .map(|v| v.end - to)
            .max()
            .unwrap_or(0);
        if moved == 0 {
            return vs..vs;
        }
        self.w.c.partial_moves.fetch_add(1, Relaxed);
        unmap(to, ve - vs);
        // A plain move left holes at the source (MREMAP_DONTUNMAP left it mapped, emptied).
        refill_holes(vs..vs + moved);
        vs..vs + moved
    }

    fn op_change(&mut self) {
        let i = self.rng.below(BUFS as u64) as usize;
        let kinds = if self.bufs[i].shmem.is_some() {
            SHMEM_CHANGES
        } else {
            ANON_CHANGES
        };
        let ch = kinds[self.rng.below(kinds.len() as u64) as usize];
        let n = self.w.cache.notifier();
        let before: Option<Region> = self.bufs[i]
            .user
            .as_ref()
            .map(|u| n.region(Cookie(u.cookie)).expect("region"));
        let was_valid = before.is_some_and(|r| n.is_valid(r));
        // Sometimes hold a cache handle across the change: it must read invalid afterwards.
        let held = if self.rng.chance(20) {
            let (a, l) = self.sub_range(i);
            stamp(a, l, self.next_stamp());
            Some(self.w.cache.get(a, l).expect("get before change"))
        } else {
            None
        };
        let changed = self.apply(i, ch);
        self.trace([
            OP_CHANGE | (ch as u64) << 8,
            self.bufs[i].addr as u64,
            changed.start as u64,
            changed.end as u64,
        ]);
        let hit = !changed.is_empty();
        if let (Some(r), true) = (before, hit) {
            if was_valid && n.is_valid(r) {
                fail!(
                    self.w,
                    self.t,
                    "{ch:?}: region still valid after the call returned"
                );
            }
            self.w.c.token_checks.fetch_add(1, Relaxed);
        }
        if hit {
            if let Some(u) = self.bufs[i].user.as_mut() {
                u.hits += 1;
            }
        }
        if let Some(h) = held {
            let hr = h.range();
            if changed.start < hr.end && hr.start < changed.end && h.is_valid() {
                fail!(
                    self.w,
                    self.t,
                    "{ch:?}: held handle still valid after the call returned"
                );
            }
            self.w.c.token_checks.fetch_add(1, Relaxed);
        }
        self.w.c.changes.fetch_add(1, Relaxed);
        // The x == y step: new bytes at the same addresses, through the device.
        if self.rng.chance(70) {
            let r = self.buf_range(i);
            let s = self.next_stamp();
            stamp(r.start, r.len(), s);
            self.w.io_check(self.t, &self.file, r.start, r.len());
        }
    }

    fn op_heap(&mut self) {
        self.trace([OP_HEAP, self.heap.len() as u64, 0, 0]);
        let pg = page();
        let c = self.rng.below(10);
        // At most 16 live blocks per worker, so memory stays flat however long the run.
        if (c < 5 || self.heap.is_empty()) && self.heap.len() < 16 {
            let size = pg + self.rng.below(300 * 1024) as usize;
            // SAFETY: plain malloc; freed exactly once below or at the end.
            let p = unsafe { libc::malloc(size) }.cast::<u8>();
            assert!(!p.is_null());
            self.heap_io(p, size);
            self.heap.push((p, size));
        } else if c < 7 && !self.heap.is_empty() {
            let k = self.rng.below(self.heap.len() as u64) as usize;
            let (p, size) = self.heap[k];
            let new = pg + self.rng.below(400 * 1024) as usize;
            // SAFETY: `p` came from malloc/realloc and is live.
            let q = unsafe { libc::realloc(p.cast(), new) }.cast::<u8>();
            assert!(!q.is_null());
            let _ = size;
            self.heap[k] = (q, new);
            self.heap_io(q, new);
        } else {
            let k = self.rng.below(self.heap.len() as u64) as usize;
            let (p, _) = self.heap.swap_remove(k);
            // SAFETY: live block from malloc/realloc, freed once.
            unsafe { libc::free(p.cast()) };
            if self.rng.chance(30) {
                // SAFETY: no preconditions.
                unsafe { libc::malloc_trim(0) };
            }
        }
        self.w.c.heap_ops.fetch_add(1, Relaxed);
    }

    /// I/O through the cache on the page-aligned interior of a heap block.
    fn heap_io(&mut self, p: *mut u8, size: usize) {
        let pg = page();
        let a = (p as usize + pg - 1) & !(pg - 1);
        let end = (p as usize + size) & !(pg - 1);
        if end > a {
            let len = (end - a).min(8 * pg);
            let s = self.next_stamp();
            stamp(a, len, s);
            self.w.io_check(self.t, &self.file, a, len);
        }
    }

    fn op_thread(&mut self) {
        self.trace([OP_THREAD, 0, 0, 0]);
        let w = self.w;
        let t = self.t;
        let seed = self.rng.next_u64();
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut rng = Rng::new(seed);
                let pg = page();
                let file = memfd(0);
                // Heap and stack I/O from a short-lived thread, then a region it unmaps.
                let v = vec![rng.next_u64() as u8; 4 * pg];
                let a = (v.as_ptr() as usize + pg - 1) & !(pg - 1);
                w.io_check(t, &file, a, 2 * pg);
                // And on its stack, which glibc releases (madvise) or caches when it exits.
                let mut stack = [0u8; 3 * 4096];
                std::hint::black_box(&mut stack);
                let sa = (stack.as_ptr() as usize + pg - 1) & !(pg - 1);
                if sa + pg <= stack.as_ptr() as usize + stack.len() {
                    stamp(sa, pg, seed);
                    w.io_check(t, &file, sa, pg);
                }
                let m = map(2 * pg);
                fill(m, 2 * pg, 1);
                let n = w.cache.notifier();
                let cookie = (0xFF << 40) | (seed & 0xFF_FFFF_FFFF);
                let r = n.register(m..m + 2 * pg, Cookie(cookie)).expect("register");
                unmap(m, 2 * pg);
                if n.is_valid(r) {
                    fail!(w, t, "spawned thread: region valid after munmap returned");
                }
                let l = w.collect();
                let got = l.get(&cookie).copied().unwrap_or(0);
                // At least one: once its event is read the region re-arms over whatever another
                // thread mapped at that address since, and that memory may change again.
                if got == 0 {
                    fail!(w, t, "spawned thread: lost event for its munmap");
                }
                n.unregister(Cookie(cookie)).expect("unregister");
                drop(l);
                w.c.token_checks.fetch_add(1, Relaxed);
                w.c.event_checks.fetch_add(1, Relaxed);
            });
        });
        self.w.c.threads_spawned.fetch_add(1, Relaxed);
    }

    fn op_fork(&mut self) {
        {
            let mut last = self.w.last_fork.lock().unwrap();
            if last.elapsed() < self.w.p.fork_every {
                return;
            }
            *last = Instant::now();
        }
        self.trace([OP_FORK, 0, 0, 0]);
        let n = self.w.cache.notifier();
        let parent_region = self
            .bufs
            .iter()
            .find_map(|b| b.user.as_ref())
            .and_then(|u| n.region(Cookie(u.cookie)).ok());
        // SAFETY: the child only uses the library (which supports a child of a multi-threaded
        // parent: glibc resets its allocator locks at fork) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fork_child(&self.w.cache, parent_region)
            }))
            .unwrap_or(99);
            // SAFETY: leaves the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                fail!(self.w, self.t, "fork child hung");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            fail!(self.w, self.t, "fork child failed, status {status:#x}");
        }
        self.w.c.forks.fetch_add(1, Relaxed);
    }

    /// A registration, a cache get or a re-arm over a shared buffer the changer is dropping.
    fn op_churn(&mut self) {
        let (Some(c), Some(pins)) = (self.w.churn.as_ref(), self.churn_pins.as_ref()) else {
            return;
        };
        let set = self.rng.below(2) as usize;
        let i = self.rng.below(CHURN_BUFS as u64) as usize;
        let r = c.range(set, i);
        let seq = &c.sets[set].1[i];
        let path = self.rng.below(3);
        self.trace([OP_CHURN, r.start as u64, path, 0]);
        let n = self.w.cache.notifier();
        let (w, t) = (self.w, self.t);
        match path {
            0 => {
                let mut born = seq.read();
                self.next_cookie += 1;
                let cookie = Cookie(((t as u64 + 1) << 40) | 1 << 39 | self.next_cookie);
                let region = n
                    .register(r.clone(), cookie)
                    .unwrap_or_else(|e| fail!(w, t, "churn register: {e}"));
                let key = pins.register(r.clone()).expect("churn pin");
                for _ in 0..4 {
                    let before = seq.read();
                    let valid = n.is_valid(region);
                    let dev = churn_device(&self.file, pins, &key, r.start);
                    // SAFETY: a mapped churn buffer.
                    let mapped = unsafe { read_stamp(r.start) };
                    w.churn_check(t, seq, &mut born, before, valid, dev, mapped, "register");
                    if !valid {
                        break;
                    }
                }
                pins.deregister(&key, r.clone()).expect("churn unpin");
                let mut l = w.collect();
                n.unregister(cookie).expect("churn unregister");
                l.remove(&cookie.0);
            }
            1 => {
                let mut born = seq.read();
                let before = born;
                let h = match w.cache.get(r.start, r.len()) {
                    Ok(h) => h,
                    // The changer drops these pages without pause, and a miss on the shmem set
                    // waits for its fresh-watch window (docs/architecture/in-flight.md): a change can land in
                    // every attempt. The cache says so; that is its contract, not a failure.
                    Err(ummunotify::cache::Error::Unstable) => {
                        w.c.churn_unstable.fetch_add(1, Relaxed);
                        return;
                    }
                    Err(e) => fail!(w, t, "churn cache.get: {e}"),
                };
                let dev = churn_device(
                    &self.file,
                    &w.cache.registrar().uring,
                    &h.key().buf,
                    r.start,
                );
                // SAFETY: a mapped churn buffer.
                let mapped = unsafe { read_stamp(r.start) };
                drop(h);
                w.churn_check(t, seq, &mut born, before, true, dev, mapped, "cache");
            }
            _ => {
                // Keep one region registered and pinned; read events (re-arming it) and re-pin
                // at once, the MPI pattern. Now and then move it to another buffer.
                if self
                    .churn_held
                    .as_ref()
                    .is_some_and(|h| self.rng.chance(10) || h.set != set)
                {
                    let h = self.churn_held.take().unwrap();
                    let hr = c.range(h.set, h.i);
                    pins.deregister(&h.key, hr).expect("churn unpin");
                    let mut l = w.collect();
                    n.unregister(h.cookie).expect("churn unregister");
                    l.remove(&h.cookie.0);
                }
                if self.churn_held.is_none() {
                    self.next_cookie += 1;
                    let cookie = Cookie(((t as u64 + 1) << 40) | 1 << 39 | self.next_cookie);
                    let born = seq.read();
                    n.register(r.clone(), cookie)
                        .unwrap_or_else(|e| fail!(w, t, "churn register: {e}"));
                    let key = pins.register(r.clone()).expect("churn pin");
                    self.churn_held = Some(Held {
                        set,
                        i,
                        cookie,
                        key,
                        born,
                    });
                }
                let h = self.churn_held.as_mut().unwrap();
                let hr = c.range(h.set, h.i);
                let hseq = &c.sets[h.set].1[h.i];
                // Re-arm: the read re-arms every region with an event; a fresh token and pin.
                let born = hseq.read();
                drop(w.collect());
                let token = n.region(h.cookie).expect("churn region");
                pins.deregister(&h.key, hr.clone()).expect("churn unpin");
                h.key = pins.register(hr.clone()).expect("churn pin");
                if born % 2 == 1 {
                    h.born = born;
                }
                let before = hseq.read();
                let valid = n.is_valid(token);
                let dev = churn_device(&self.file, pins, &h.key, hr.start);
                // SAFETY: a mapped churn buffer.
                let mapped = unsafe { read_stamp(hr.start) };
                w.churn_check(t, hseq, &mut h.born, before, valid, dev, mapped, "re-arm");
            }
        }
    }

    fn run(&mut self) {
        let mut since_collect = 0;
        while !self.w.stop.load(Relaxed) {
            let c = self.rng.below(1000);
            if self.w.churn.is_some() && self.rng.chance(40) {
                self.op_churn();
                self.w.c.ops.fetch_add(1, Relaxed);
                continue;
            }
            match c {
                0..=399 => self.op_io(),
                400..=699 => self.op_change(),
                700..=799 => self.op_register(),
                800..=919 => self.op_heap(),
                920..=939 => {
                    drop(self.w.collect());
                }
                940..=969 => self.w.cache.flush(),
                970..=989 => self.op_thread(),
                _ => self.op_fork(),
            }
            since_collect += 1;
            if since_collect > 200 {
                drop(self.w.collect());
                since_collect = 0;
            }
            self.w.c.ops.fetch_add(1, Relaxed);
        }
    }

    fn finish(&mut self) {
        if let (Some(h), Some(c), Some(pins)) = (
            self.churn_held.take(),
            self.w.churn.as_ref(),
            self.churn_pins.as_ref(),
        ) {
            pins.deregister(&h.key, c.range(h.set, h.i))
                .expect("churn unpin");
            let mut l = self.w.collect();
            self.w
                .cache
                .notifier()
                .unregister(h.cookie)
                .expect("churn unregister");
            l.remove(&h.cookie.0);
        }
        for i in 0..BUFS {
            if let Some(u) = self.bufs[i].user.take() {
                self.unregister_user(u);
            }
        }
        for (p, _) in self.heap.drain(..) {
            // SAFETY: live blocks from malloc/realloc, freed once.
            unsafe { libc::free(p.cast()) };
        }
        for i in 0..BUFS {
            let r = self.buf_range(i);
            unmap(r.start, r.len());
        }
        if self.pidfd >= 0 {
            // SAFETY: our own pidfd.
            unsafe { libc::close(self.pidfd) };
        }
    }
}

/// The child of a fork: the parent's library state is unusable (typed errors, every check
/// invalid), and a fresh notifier in the child works, including on `brk`.
fn fork_child(parent: &Cache<Recording>, parent_region: Option<Region>) -> i32 {
    let pn = parent.notifier();
    if let Some(r) = parent_region {
        if pn.is_valid(r) {
            return 10;
        }
    }
    if !matches!(pn.generation(), Err(ummunotify::Error::Forked)) {
        return 11;
    }
    let n = match Notifier::new() {
        Ok(n) => n,
        Err(_) => return 12,
    };
    let pg = page();
    // brk: grow the heap by hand, watch the new part, shrink it back.
    // SAFETY: sbrk(0) reads the break.
    let old = unsafe { libc::sbrk(0) } as usize;
    // SAFETY: grows the break by 16 pages; shrunk back below before anything else allocates.
    if unsafe { libc::sbrk(16 * pg as libc::intptr_t) } as usize != old {
        return 13;
    }
    let top = (old + pg - 1) & !(pg - 1);
    if top + 8 * pg > old + 16 * pg {
        return 14;
    }
    fill(top, 8 * pg, 3);
    let r = match n.register(top..top + 8 * pg, Cookie(1)) {
        Ok(r) => r,
        Err(_) => return 15,
    };
    // SAFETY: sbrk(0) reads the break.
    if unsafe { libc::sbrk(0) } as usize != old + 16 * pg {
        // The allocator moved the break meanwhile (this thread's arena is the main one):
        // shrinking now would take its memory away. Nothing to check then.
        return 0;
    }
    // SAFETY: shrinks the break back to where it was (unmaps what we added).
    unsafe { libc::sbrk(-(16 * pg as libc::intptr_t)) };
    if n.is_valid(r) {
        return 16;
    }
    match n.events() {
        Ok(ev) if ev.len() == 1 && ev[0].cookie == Cookie(1) => {}
        _ => return 17,
    }
    let m = map(4 * pg);
    let r = match n.register(m..m + 4 * pg, Cookie(2)) {
        Ok(r) => r,
        Err(_) => return 18,
    };
    madv(m, pg, libc::MADV_DONTNEED);
    if n.is_valid(r) {
        return 19;
    }
    0
}

/// Runs the torture and returns its totals (panics with the seed on any failure).
pub fn run(p: Params) -> Totals {
    let pfns = match pagemap::pfn(&p as *const Params as usize) {
        Ok(Some(_)) => true,
        Ok(None) => true,
        Err(e) => {
            ummunotify_testkit::require::skip_or_fail(
                "torture PFN oracle",
                &format!("PFNs in /proc/self/pagemap ({e}); the device-bytes oracle still runs"),
            );
            false
        }
    };
    // Room in the table beyond `max_regions` for regions that left the cache while a handle still
    // holds them (the cache caps regions, not regions + held retired ones, at the table size).
    let uring = match IoUringRegistrar::new(64) {
        Ok(u) => u,
        Err(e) => {
            ummunotify_testkit::require::skip_or_fail("torture", &format!("io_uring ({e})"));
            return Totals::default();
        }
    };
    let cache =
        Cache::new(Recording { uring, pfns }, Config::default().max_regions(40)).expect("cache");
    let world = World {
        p: p.clone(),
        cache,
        pfns,
        stop: AtomicBool::new(false),
        c: Counters::default(),
        ledger: Mutex::new(HashMap::new()),
        last_fork: Mutex::new(Instant::now()),
        churn: p.remove_churn.then(Churn::new),
    };
    if let Some(hook) = p.on_notifier {
        hook(Some(world.cache.notifier()));
    }
    let pg = page();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..p.threads {
            let w = &world;
            std::thread::Builder::new()
                .name(format!("torture-{t}"))
                .spawn_scoped(s, move || {
                    let area = area(t);
                    let mut rng = Rng::new(p.seed ^ (t as u64).wrapping_mul(0x9E37_79B9));
                    let bufs = (0..BUFS)
                        .map(|i| {
                            let pages = 1 + rng.below(MAX_PAGES as u64) as usize;
                            let addr = area + i * SPACING;
                            let shmem = (i >= BUFS - SHMEM_BUFS).then(|| memfd(MAX_PAGES * pg));
                            assert!(
                                map_noreplace(addr, pages * pg, shmem.as_ref()),
                                "torture area {addr:#x} is taken"
                            );
                            Buf {
                                addr,
                                pages,
                                shmem,
                                user: None,
                            }
                        })
                        .collect();
                    // SAFETY: pidfd_open of our own process.
                    let pidfd =
                        unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
                    let mut wk = Worker {
                        w,
                        t,
                        rng,
                        file: memfd(0),
                        bufs,
                        area,
                        heap: Vec::new(),
                        next_cookie: 0,
                        stamp: 0,
                        pidfd,
                        uring_madvise: if p.uring_madvise {
                            UringMadvise::new().ok()
                        } else {
                            None
                        },
                        churn_pins: w
                            .churn
                            .as_ref()
                            .map(|_| IoUringRegistrar::new(4).expect("churn io_uring")),
                        churn_held: None,
                    };
                    wk.run();
                    wk.finish();
                })
                .unwrap();
        }
        if let Some(c) = world.churn.as_ref() {
            let w = &world;
            std::thread::Builder::new()
                .name("torture-churn".into())
                .spawn_scoped(s, move || c.changer(w))
                .unwrap();
        }
        std::thread::sleep(p.duration);
        world.stop.store(true, SeqCst);
    });
    if let Some(hook) = p.on_notifier {
        hook(None);
    }
    drop(world.collect());
    let c = &world.c;
    let l = |a: &AtomicU64| a.load(SeqCst);
    world.cache.flush();
    let st = world.cache.stats();
    eprintln!("cache: {st:?}");
    eprintln!("notifier: {:?}", world.cache.notifier().stats());
    Totals {
        ops: l(&c.ops),
        io: l(&c.io),
        changes: l(&c.changes),
        registers: l(&c.registers),
        unregisters: l(&c.unregisters),
        heap_ops: l(&c.heap_ops),
        threads_spawned: l(&c.threads_spawned),
        forks: l(&c.forks),
        pfn_checks: l(&c.pfn_checks),
        byte_checks: l(&c.byte_checks),
        token_checks: l(&c.token_checks),
        event_checks: l(&c.event_checks),
        events: l(&c.events),
        cancelled: l(&c.cancelled),
        kinds: ALL_CHANGES
            .iter()
            .map(|&k| (k.name(), l(&c.kinds[k as usize])))
            .collect(),
        partial_moves: l(&c.partial_moves),
        churn_changes: l(&c.churn_changes),
        churn_judged: l(&c.churn_judged),
        churn_racing: l(&c.churn_racing),
        churn_unstable: l(&c.churn_unstable),
        elapsed: start.elapsed(),
    }
}

/// A whole torture test: the crash report, the protection switch ([`UNPROTECTED_ENV`]), a run
/// with the usual parameters (`UMN_TORTURE_SEED`, `UMN_TORTURE_THREADS`, `UMN_TORTURE_SECS`,
/// default `default_secs`), its report, and the checks that it did what it should: I/O, changes
/// and checks, every change kind run as itself, and with `remove_churn` the window exercised.
pub fn torture_test(what: &str, remove_churn: bool, default_secs: u64) -> Totals {
    install_crash_report();
    unprotected_if_asked();
    let p = Params {
        seed: seed("UMN_TORTURE_SEED"),
        threads: env_u64("UMN_TORTURE_THREADS", 3).clamp(1, 8) as usize,
        duration: Duration::from_secs(env_u64("UMN_TORTURE_SECS", default_secs)),
        fork_every: Duration::from_millis(250),
        uring_madvise: true,
        on_notifier: None,
        remove_churn,
    };
    let t = run(p.clone());
    report(what, &p, &t);
    if t.ops > 0 {
        assert!(t.io > 0 && t.changes > 0 && t.checks() > 0, "{t:?}");
        // A kind that never ran (IORING_OP_MADVISE falling back to plain madvise, say) is a
        // hole in the run, not a pass.
        let never = t.kinds_never_run(&p);
        assert!(never.is_empty(), "change kinds that never ran: {never:?}");
        // The churn ran and hit the window: uses judged, and registrations, re-arms and gets
        // begun inside a REMOVE of their buffer were checked after it returned.
        assert!(
            !remove_churn || (t.churn_changes > 0 && t.churn_judged > 0 && t.churn_racing > 0),
            "the REMOVE churn did not exercise the window: {t:?}"
        );
    }
    t
}

/// Prints the totals of a run in one block.
pub fn report(what: &str, p: &Params, t: &Totals) {
    let secs = t.elapsed.as_secs_f64().max(1e-9);
    eprintln!(
        "{what}: seed {:#x}, {} threads, {:.1} s: {} ops ({:.0} ops/s), {} checks \
         ({} PFN pages, {} device-byte compares, {} validity checks, {} event-count checks); \
         {} I/Os, {} mapping changes, {} registers / {} unregisters, {} heap ops, {} threads \
         spawned, {} forks, {} user events, {} cancelled writes retried; peak RSS {} KiB",
        p.seed,
        p.threads,
        secs,
        t.ops,
        t.ops as f64 / secs,
        t.checks(),
        t.pfn_checks,
        t.byte_checks,
        t.token_checks,
        t.event_checks,
        t.io,
        t.changes,
        t.registers,
        t.unregisters,
        t.heap_ops,
        t.threads_spawned,
        t.forks,
        t.events,
        t.cancelled,
        status_kib("VmHWM"),
    );
    let kinds: Vec<String> = t.kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    eprintln!(
        "{what}: changes by kind: {}; mremap moves refused part-way and repaired: {}",
        kinds.join(", "),
        t.partial_moves
    );
    if p.remove_churn {
        eprintln!(
            "{what}: REMOVE churn: {} changes, {} judged uses, {} registrations/re-arms/gets begun \
             inside a REMOVE and checked after it returned, {} gets answered Unstable",
            t.churn_changes, t.churn_judged, t.churn_racing, t.churn_unstable
        );
    }
}
