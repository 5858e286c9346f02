//! `umn coverage`'s `remove-race` row: a madvise `REMOVE` racing a registration (issue 9).
//!
//! The other rows apply one change to a region registered before it. This one is about the
//! window the kernel opens *inside* a `REMOVE`-producing call: the message is dequeued before
//! the pages are zapped, and a registration (a pin) made in between holds the old frames. The
//! notifier closes it by holding such ranges in flight until the zap is known to have happened
//! (`ummunotify`'s `inflight` module), by a signal acknowledgement where it can name the sender,
//! and by a grace period where it can not (a busy io_uring worker, another process): that grace
//! is the residual, and this row measures it instead of leaving it silent.
//!
//! The measurement is a short stress per [`RemoveKind`] (madvise DONTNEED / FREE /
//! DONTNEED_LOCKED / REMOVE, glibc and raw syscall alternately (raw only under hybrid, whose
//! hooks bracket the glibc calls), `process_madvise`,
//! `IORING_OP_MADVISE`), run in a child process: a changer drops one buffer after another and
//! stamps it anew; a register thread registers a buffer, pins it (io_uring fixed buffer) and uses
//! it; a re-arm thread keeps every buffer registered and pinned and re-pins each one the moment
//! its event is read. A use is judged only when no change overlapped it (the testkit's seqlock);
//! it is stale when the bytes the device reads through the pin are not the bytes mapped. The run
//! *exercised the window* when registrations or re-arms begun while a `REMOVE` of their buffer
//! was in progress were checked after it returned.
//!
//! Verdict: `missed` when a judged use was stale; `inconclusive` when a kind could not run or
//! did not exercise the window; `detected` otherwise.
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;
use ummunotify::registrar::{FixedBuf, IoUringRegistrar, Registrar};
use ummunotify::{Cookie, Event, Notifier};
use ummunotify_testkit::changes::ChangeKind;
use ummunotify_testkit::remove_race::{read_stamp, stamp, Buffers, Change, RemoveKind, Remover};

/// The hidden subcommand the child runs.
pub const CHILD_SUBCOMMAND: &str = "__remove-race-case";
/// Environment variable: milliseconds per kind (default [`DEFAULT_MS`]).
pub const MS_ENV: &str = "UMN_COVERAGE_RACE_MS";
/// Milliseconds per kind by default: six kinds in about a second and a half.
pub const DEFAULT_MS: u64 = 250;
/// Environment variable: `1` turns the in-flight protection off in the child (hidden; shows
/// that the row finds the bug it guards against).
pub const UNPROTECTED_ENV: &str = "UMN_COVERAGE_UNPROTECTED";
/// The row's name in the table and the JSON.
pub const NAME: &str = "remove-race";

const BUFFERS: usize = 8;
/// Rounds of [`ms_per_kind`] a kind may run before its window counts as not exercised.
const ROUNDS: usize = 4;
const PAGES: usize = 4;
/// Uses of one registration on the register path before it is dropped.
const USES: usize = 16;

/// What one kind's stress measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindResult {
    /// The kind's name ([`RemoveKind::name`]).
    pub kind: String,
    /// Why the kind could not run (a missing kernel feature): no measurement then.
    pub skipped: Option<String>,
    /// `REMOVE`-producing calls made.
    pub changes: u64,
    /// Registrations (register path) and re-arms (re-arm path).
    pub attempts: u64,
    /// Registrations and re-arms begun while a `REMOVE` of their buffer was in progress and
    /// checked after it returned: the window, exercised.
    pub racing: u64,
    /// Uses judged (valid, no change overlapping).
    pub judged: u64,
    /// Judged uses whose device bytes were not the mapped bytes.
    pub stale: u64,
    /// `REMOVE`s whose end the notifier confirmed (the sender acknowledged or exited, or an
    /// io_uring worker was seen idle).
    pub confirmed: u64,
    /// `REMOVE`s that ended by a grace period, unconfirmed (the residual).
    pub by_grace: u64,
    /// The backend can not see this kind at all (its catalogue row is missed, as expected):
    /// stale uses are shown but are no verdict on the window. Set by [`run`], not by the child.
    pub unseen: bool,
}

impl KindResult {
    /// Whether the kind ran and exercised the window.
    pub fn exercised(&self) -> bool {
        self.skipped.is_none() && self.racing > 0 && self.judged > 0
    }

    /// Adds another round's counts of the same kind.
    fn add(&mut self, other: &KindResult) {
        self.changes += other.changes;
        self.attempts += other.attempts;
        self.racing += other.racing;
        self.judged += other.judged;
        self.stale += other.stale;
        self.confirmed += other.confirmed;
        self.by_grace += other.by_grace;
    }

    /// The child's report line.
    fn line(&self) -> String {
        format!(
            "{NAME} kind={} changes={} attempts={} racing={} judged={} stale={} confirmed={} \
             by_grace={} skipped={}",
            self.kind,
            self.changes,
            self.attempts,
            self.racing,
            self.judged,
            self.stale,
            self.confirmed,
            self.by_grace,
            self.skipped.as_deref().unwrap_or("-"),
        )
    }

    /// Parses [`line`](Self::line).
    fn parse(line: &str) -> Option<KindResult> {
        // `skipped` comes last and may hold spaces.
        let (rest, skipped) = line.strip_prefix(NAME)?.trim().split_once(" skipped=")?;
        let mut r = KindResult {
            skipped: (skipped != "-").then(|| skipped.to_owned()),
            ..KindResult::default()
        };
        for field in rest.split(' ') {
            let (k, v) = field.split_once('=')?;
            let n = || v.parse::<u64>().ok();
            match k {
                "kind" => r.kind = v.to_owned(),
                "changes" => r.changes = n()?,
                "attempts" => r.attempts = n()?,
                "racing" => r.racing = n()?,
                "judged" => r.judged = n()?,
                "stale" => r.stale = n()?,
                "confirmed" => r.confirmed = n()?,
                "by_grace" => r.by_grace = n()?,
                _ => return None,
            }
        }
        (!r.kind.is_empty()).then_some(r)
    }
}

/// The row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every kind ran, exercised the window, and no judged use was stale.
    Detected,
    /// A judged use was stale: a registration made while a `REMOVE` was in flight was used as
    /// valid after the call returned.
    Missed,
    /// Some kind could not run or did not exercise the window: no verdict.
    Inconclusive,
    /// Not run on this backend (see [`Row::reason`]).
    NotApplicable,
}

impl Verdict {
    /// The name in the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Detected => "detected",
            Verdict::Missed => "missed",
            Verdict::Inconclusive => "inconclusive",
            Verdict::NotApplicable => "not-applicable",
        }
    }
}

/// The `remove-race` row as JSON ([`Row::json`]), its fields in the order printed.
#[derive(Debug, Serialize)]
pub struct RaceJson<'a> {
    name: &'static str,
    verdict: &'static str,
    ms_per_kind: u64,
    stale: u64,
    removes_confirmed: u64,
    removes_by_grace: u64,
    reason: Option<&'a str>,
    kinds: Vec<RaceKindJson<'a>>,
}

/// One kind of the `remove-race` row as JSON.
#[derive(Debug, Serialize)]
struct RaceKindJson<'a> {
    kind: &'a str,
    /// The backend can see this kind ([`KindResult::unseen`] negated).
    expected: bool,
    skipped: Option<&'a str>,
    exercised: bool,
    changes: u64,
    attempts: u64,
    racing: u64,
    judged: u64,
    stale: u64,
    removes_confirmed: u64,
    removes_by_grace: u64,
}

/// The `remove-race` row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Per kind, in [`RemoveKind::ALL`] order.
    pub kinds: Vec<KindResult>,
    /// Milliseconds each kind ran.
    pub ms: u64,
    /// Why the row has no measurement (the child failed, or the backend has no such window).
    pub reason: Option<String>,
    /// Not applicable on this backend.
    pub not_applicable: bool,
}

impl Row {
    /// The verdict (see the module docs).
    pub fn verdict(&self) -> Verdict {
        if self.not_applicable {
            Verdict::NotApplicable
        } else if self.stale() > 0 {
            Verdict::Missed
        } else if self.reason.is_some()
            || self.kinds.len() != RemoveKind::ALL.len()
            || !self.seen().all(KindResult::exercised)
        {
            Verdict::Inconclusive
        } else {
            Verdict::Detected
        }
    }

    /// The kinds the backend can see (the verdict is about them).
    fn seen(&self) -> impl Iterator<Item = &KindResult> {
        self.kinds.iter().filter(|k| !k.unseen)
    }

    /// Stale uses over every kind the backend can see.
    pub fn stale(&self) -> u64 {
        self.seen().map(|k| k.stale).sum()
    }

    fn sum(&self, f: impl Fn(&KindResult) -> u64) -> u64 {
        self.kinds.iter().map(f).sum()
    }

    /// The row as the JSON object `umn coverage --json` puts under `"remove_race"`.
    pub fn json(&self) -> RaceJson<'_> {
        RaceJson {
            name: NAME,
            verdict: self.verdict().name(),
            ms_per_kind: self.ms,
            stale: self.stale(),
            removes_confirmed: self.sum(|k| k.confirmed),
            removes_by_grace: self.sum(|k| k.by_grace),
            reason: self.reason.as_deref(),
            kinds: self
                .kinds
                .iter()
                .map(|k| RaceKindJson {
                    kind: &k.kind,
                    expected: !k.unseen,
                    skipped: k.skipped.as_deref(),
                    exercised: k.exercised(),
                    changes: k.changes,
                    attempts: k.attempts,
                    racing: k.racing,
                    judged: k.judged,
                    stale: k.stale,
                    removes_confirmed: k.confirmed,
                    removes_by_grace: k.by_grace,
                })
                .collect(),
        }
    }

    /// The row and one line per kind, in the table's columns.
    pub fn to_table(&self) -> String {
        let detected = match self.verdict() {
            Verdict::Detected => "yes",
            Verdict::Missed => "NO",
            Verdict::Inconclusive => "inconclusive",
            Verdict::NotApplicable => "n/a",
        };
        let note = match (&self.reason, self.not_applicable) {
            (Some(r), _) => r.clone(),
            (None, _) => format!(
                "madvise REMOVE racing a registration: {} kinds x {} ms, {} racing registrations \
                 and re-arms, {} judged uses; REMOVEs settled by ack {}, by grace {} (the residual)",
                self.kinds.len(),
                self.ms,
                self.sum(|k| k.racing),
                self.sum(|k| k.judged),
                self.sum(|k| k.confirmed),
                self.sum(|k| k.by_grace)
            ),
        };
        let mut out = format!(
            "{:<22} {:<12} {:<9} {:<6} {:<11} {}\n",
            NAME,
            detected,
            if self.not_applicable { "no" } else { "yes" },
            self.stale(),
            "device",
            note
        );
        for k in &self.kinds {
            let what = match &k.skipped {
                Some(why) => format!("could not run: {why}"),
                None if k.unseen => format!(
                    "not seen by this backend at all (its catalogue row above is missed, as \
                     expected): {} changes, {} stale of {} judged",
                    k.changes, k.stale, k.judged
                ),
                None => format!(
                    "{} changes, {} racing, {} judged, by ack {}, by grace {}{}",
                    k.changes,
                    k.racing,
                    k.judged,
                    k.confirmed,
                    k.by_grace,
                    if k.exercised() {
                        ""
                    } else {
                        " (window not exercised)"
                    }
                ),
            };
            out.push_str(&format!(
                "  {:<20} {:<12} {:<9} {:<6} {:<11} {}\n",
                k.kind, "", "", k.stale, "", what
            ));
        }
        out
    }

    /// Whether the row counts against the notifier (exit status 1).
    pub fn failed(&self) -> bool {
        self.verdict() == Verdict::Missed
    }

    /// Whether the row has no verdict (exit status 3 unless something failed).
    pub fn inconclusive(&self) -> bool {
        self.verdict() == Verdict::Inconclusive
    }
}

/// The catalogue kind whose expected column says whether `backend` sees a [`RemoveKind`] at all.
fn catalogue_kind(kind: RemoveKind) -> ChangeKind {
    match kind {
        RemoveKind::Dontneed => ChangeKind::MadvDontneed,
        RemoveKind::Free => ChangeKind::MadvFree,
        RemoveKind::DontneedLocked => ChangeKind::MadvDontneedLocked,
        RemoveKind::RemoveShmem => ChangeKind::MadvRemoveShmem,
        RemoveKind::ProcessMadvise => ChangeKind::ProcessMadvise,
        RemoveKind::UringMadvise => ChangeKind::UringMadvise,
    }
}

/// Milliseconds per kind: [`MS_ENV`] or [`DEFAULT_MS`].
pub fn ms_per_kind() -> u64 {
    std::env::var(MS_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&ms| ms > 0)
        .unwrap_or(DEFAULT_MS)
}

/// Runs the row: on userfaultfd in a child (`exe CHILD_SUBCOMMAND`); on the hooks backend it is
/// not applicable (there is no `REMOVE` message: the libc hooks invalidate after the call
/// returns, and the calls no hook sees are the table's missed rows).
pub fn run(exe: &std::path::Path, backend: ummunotify::Backend) -> Row {
    let ms = ms_per_kind();
    if backend == ummunotify::Backend::Hooks {
        return Row {
            kinds: Vec::new(),
            ms,
            reason: Some(
                "not run on the hooks backend: no REMOVE message, the libc hooks invalidate after \
                 the call returns (raw calls are the missed rows above)"
                    .to_owned(),
            ),
            not_applicable: true,
        };
    }
    let out = Command::new(exe)
        .arg(CHILD_SUBCOMMAND)
        .env(ummunotify::BACKEND_ENV, backend.name())
        .env(MS_ENV, ms.to_string())
        .output();
    let mut row = Row {
        kinds: Vec::new(),
        ms,
        reason: None,
        not_applicable: false,
    };
    match out {
        Ok(o) => {
            let stdout = String::from_utf8_lossy(&o.stdout);
            row.kinds = stdout.lines().filter_map(KindResult::parse).collect();
            for k in &mut row.kinds {
                k.unseen = RemoveKind::from_name(&k.kind)
                    .is_some_and(|kind| !crate::watch::expects(backend, catalogue_kind(kind)));
            }
            if !o.status.success() {
                row.reason = Some(format!(
                    "the stress child failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
        }
        Err(e) => row.reason = Some(format!("could not start the stress child: {e}")),
    }
    row
}

/// The child: every kind for `ms_per_kind()` ms, one report line each on stdout.
pub fn child_main() -> bool {
    if std::env::var_os(UNPROTECTED_ENV).is_some_and(|v| v == "1") {
        ummunotify::__testing::disable_remove_in_flight();
    }
    let secs = ms_per_kind() as f64 / 1000.0;
    for kind in RemoveKind::ALL {
        // A window that no registration happened to hit is no verdict: run more rounds (the
        // counts add up) before calling it unexercised. A stale use ends the kind at once.
        let mut total: Option<KindResult> = None;
        for _ in 0..ROUNDS {
            let r = match stress(kind, secs) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("{}: {e}", kind.name());
                    return false;
                }
            };
            let t = total.get_or_insert_with(|| KindResult {
                kind: r.kind.clone(),
                skipped: r.skipped.clone(),
                ..KindResult::default()
            });
            t.add(&r);
            if t.skipped.is_some() || t.stale > 0 || t.exercised() {
                break;
            }
        }
        if let Some(t) = total {
            println!("{}", t.line());
        }
    }
    true
}

/// What the device reads through a pin: `WRITE_FIXED` into a memfd, read back.
struct Device(File);

impl Device {
    fn new() -> io::Result<Device> {
        // SAFETY: a NUL-terminated name; the fd is fresh.
        let fd = unsafe { libc::memfd_create(c"umn-remove-race".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a descriptor owned by nobody else.
        Ok(Device(unsafe { File::from_raw_fd(fd) }))
    }

    /// The 8 bytes the device reads through `key` at `addr` (slot `slot` of the file).
    fn read(
        &self,
        r: &IoUringRegistrar,
        key: &FixedBuf,
        addr: usize,
        slot: u64,
    ) -> io::Result<u64> {
        r.write_fixed(key, addr, 8, self.0.as_fd(), slot * 8)?;
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, slot * 8)?;
        Ok(u64::from_ne_bytes(b))
    }
}

#[derive(Default)]
struct Tally {
    attempts: AtomicU64,
    racing: AtomicU64,
    judged: AtomicU64,
    stale: AtomicU64,
}

impl Tally {
    /// One check of a registration or re-arm begun at seqlock value `born`: `before` was read
    /// before the check, `device` and `mapped` after it. The first check after the `REMOVE` a
    /// registration began inside counts it as racing (once: `born` is cleared).
    fn check(&self, ch: &Change, born: &mut u64, before: u64, valid: bool, dev: u64, mapped: u64) {
        if !ch.judged(before) {
            return;
        }
        if *born % 2 == 1 && before > *born {
            self.racing.fetch_add(1, Relaxed);
            *born = 0;
        }
        if valid {
            self.judged.fetch_add(1, Relaxed);
            if dev != mapped {
                self.stale.fetch_add(1, Relaxed);
            }
        }
    }
}

struct Set {
    bufs: Buffers,
    changes: Vec<Change>,
}

impl Set {
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let a = self.bufs.addr(i);
        a..a + self.bufs.len()
    }
}

/// One kind for `secs`: a changer, a register path and a re-arm path, each on its own buffers.
fn stress(kind: RemoveKind, secs: f64) -> io::Result<KindResult> {
    let mut res = KindResult {
        kind: kind.name().to_owned(),
        ..KindResult::default()
    };
    let skipped = |e: &io::Error| {
        ummunotify_testkit::require::missing_feature(e).map(|m| m.feature().to_string())
    };
    // Under hybrid the hooks bracket every glibc call (invalidated in the calling thread before
    // and after it, no REMOVE message): only a call no hook sees opens the window, so every
    // call is raw there, and the row measures what userfaultfd still has to close.
    let raw_only = matches!(
        ummunotify::Backend::from_env(),
        Ok(ummunotify::Backend::Hybrid)
    );
    let mut remover = match Remover::new(kind) {
        Ok(r) if raw_only => r.raw_only(),
        Ok(r) => r,
        Err(e) => match skipped(&e) {
            Some(why) => {
                res.skipped = Some(why);
                return Ok(res);
            }
            None => return Err(e),
        },
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let set = || -> io::Result<Set> {
        Ok(Set {
            bufs: Buffers::new(BUFFERS, PAGES * page, kind.needs_shmem())?,
            changes: (0..BUFFERS).map(|_| Change::default()).collect(),
        })
    };
    let sets = [set()?, set()?];
    // Probe the kind once on an unwatched buffer: a refusal is a skip, not a failure.
    // SAFETY: our own buffer; the changer rewrites it anyway.
    if let Err(e) = unsafe { remover.remove(sets[0].bufs.addr(0), page) } {
        match skipped(&e) {
            Some(why) => {
                res.skipped = Some(why);
                return Ok(res);
            }
            None => return Err(e),
        }
    }
    let (ra, rb) = (IoUringRegistrar::new(16)?, IoUringRegistrar::new(16)?);
    let na = Notifier::new().map_err(io::Error::from)?;
    let nb = Notifier::new().map_err(io::Error::from)?;
    let device = Device::new()?;
    let tallies: [Tally; 2] = Default::default();
    let stop = AtomicBool::new(false);
    let changes = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let failed: std::sync::Mutex<Option<io::Error>> = std::sync::Mutex::new(None);
    let fail = |e: io::Error| {
        failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
        stop.store(true, Relaxed);
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while Instant::now() < deadline && !stop.load(Relaxed) {
                let set = &sets[(n % 2) as usize];
                let i = ((n / 2) % BUFFERS as u64) as usize;
                let r = set.range(i);
                // SAFETY: our buffer, writable; its old contents are meant to go.
                let done =
                    unsafe { remover.change(&set.changes[i], r.start, r.len(), page, stamp(i, n)) };
                if let Err(e) = done {
                    fail(e);
                    break;
                }
                n += 1;
            }
            changes.store(n, Relaxed);
            stop.store(true, Relaxed);
        });
        // Register path: register, pin, use until invalid, unpin, unregister.
        s.spawn(|| {
            let (set, t) = (&sets[0], &tallies[0]);
            let result = (|| -> io::Result<()> {
                for i in (0..BUFFERS).cycle() {
                    if stop.load(Relaxed) {
                        break;
                    }
                    let r = set.range(i);
                    t.attempts.fetch_add(1, Relaxed);
                    let mut born = set.changes[i].read();
                    let Ok(region) = na.register(r.clone(), Cookie(i as u64)) else {
                        continue;
                    };
                    let key = ra.register(r.clone())?;
                    for _ in 0..USES {
                        let before = set.changes[i].read();
                        let valid = na.is_valid(region);
                        let dev = device.read(&ra, &key, r.start, i as u64)?;
                        // SAFETY: our mapped buffer.
                        let mapped = unsafe { read_stamp(r.start) };
                        t.check(&set.changes[i], &mut born, before, valid, dev, mapped);
                        if !valid {
                            break;
                        }
                    }
                    ra.deregister(&key, r.clone())?;
                    na.unregister(Cookie(i as u64)).map_err(io::Error::from)?;
                }
                Ok(())
            })();
            if let Err(e) = result {
                fail(e);
            }
        });
        // Re-arm path: every buffer registered and pinned; re-pin each the moment its event is
        // read (the MPI pattern).
        s.spawn(|| {
            let (set, t) = (&sets[1], &tallies[1]);
            let result = (|| -> io::Result<()> {
                let mut keys = Vec::with_capacity(BUFFERS);
                let mut tokens = Vec::with_capacity(BUFFERS);
                let mut born = [0u64; BUFFERS];
                for (i, b) in born.iter_mut().enumerate() {
                    *b = set.changes[i].read();
                    tokens.push(
                        nb.register(set.range(i), Cookie(i as u64))
                            .map_err(io::Error::from)?,
                    );
                    keys.push(rb.register(set.range(i))?);
                }
                let mut evs = [Event::default(); 16];
                while !stop.load(Relaxed) {
                    let got = nb.read_events(&mut evs).map_err(io::Error::from)?;
                    for e in &evs[..got.count] {
                        let i = e.cookie.0 as usize;
                        born[i] = set.changes[i].read();
                        tokens[i] = nb.region(e.cookie).map_err(io::Error::from)?;
                        rb.deregister(&keys[i], set.range(i))?;
                        keys[i] = rb.register(set.range(i))?;
                        t.attempts.fetch_add(1, Relaxed);
                    }
                    for i in 0..BUFFERS {
                        let r = set.range(i);
                        let before = set.changes[i].read();
                        let valid = nb.is_valid(tokens[i]);
                        let dev = device.read(&rb, &keys[i], r.start, 64 + i as u64)?;
                        // SAFETY: our mapped buffer.
                        let mapped = unsafe { read_stamp(r.start) };
                        t.check(&set.changes[i], &mut born[i], before, valid, dev, mapped);
                    }
                }
                for (i, k) in keys.iter().enumerate() {
                    rb.deregister(k, set.range(i))?;
                }
                Ok(())
            })();
            if let Err(e) = result {
                fail(e);
            }
        });
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let l = |f: fn(&Tally) -> &AtomicU64| tallies.iter().map(|t| f(t).load(Relaxed)).sum::<u64>();
    res.changes = changes.load(Relaxed);
    res.attempts = l(|t| &t.attempts);
    res.racing = l(|t| &t.racing);
    res.judged = l(|t| &t.judged);
    res.stale = l(|t| &t.stale);
    for st in [na.stats(), nb.stats()] {
        res.confirmed += st.removes_confirmed;
        res.by_grace += st.removes_by_grace;
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_round_trip() {
        let r = KindResult {
            kind: "madv_dontneed".into(),
            skipped: Some("process_madvise (ENOSYS)".into()),
            changes: 1,
            attempts: 2,
            racing: 3,
            judged: 4,
            stale: 5,
            confirmed: 6,
            by_grace: 7,
            unseen: false,
        };
        assert_eq!(KindResult::parse(&r.line()), Some(r.clone()));
        let ok = KindResult { skipped: None, ..r };
        assert_eq!(KindResult::parse(&ok.line()), Some(ok));
        assert_eq!(
            KindResult::parse("remove-race kind=x bogus=1 skipped=-"),
            None
        );
    }

    #[test]
    fn verdicts() {
        let k = |stale, racing| KindResult {
            kind: "k".into(),
            racing,
            judged: 10,
            stale,
            ..KindResult::default()
        };
        let row = |kinds: Vec<KindResult>| Row {
            kinds,
            ms: 1,
            reason: None,
            not_applicable: false,
        };
        let six = |x: KindResult| vec![x; RemoveKind::ALL.len()];
        assert_eq!(row(six(k(0, 5))).verdict(), Verdict::Detected);
        assert_eq!(row(six(k(1, 5))).verdict(), Verdict::Missed);
        assert_eq!(row(six(k(0, 0))).verdict(), Verdict::Inconclusive);
        assert_eq!(row(vec![k(0, 5)]).verdict(), Verdict::Inconclusive);
        let mut stale_and_unexercised = six(k(0, 0));
        stale_and_unexercised[2].stale = 1;
        assert_eq!(row(stale_and_unexercised).verdict(), Verdict::Missed);
        // A kind the backend can not see at all: its stale uses and its window are no verdict.
        let mut unseen = six(k(0, 5));
        unseen[5] = KindResult {
            unseen: true,
            ..k(7, 0)
        };
        assert_eq!(row(unseen.clone()).verdict(), Verdict::Detected);
        assert_eq!(row(unseen).stale(), 0);
    }
}
