//! `umn bench --backends`: every backend that starts here, side by side, in one run (issue 13).
//!
//! A backend is a [`RowSource`]: something that measures the same rows (see [`ROWS`]) against
//! baselines it measures in the same process, right next to them. Each notifier backend runs in
//! a child process of its own (`umn __bench-backend NAME`): backends leave traces in a process
//! (hooks patch libc for good; perf traces every thread), so one must not tax the next. UCX
//! 1.22's hooks + rcache are a source too, through `bench/ucx_compare.sh`'s set-up (its own
//! harness, its own baselines). Adding a backend: a [`RowSource`] in [`sources`].
//!
//! Rows (`ns_per_op` against `baseline_ns`, except where the unit says otherwise):
//! * `check` — "changed since?" (`unchanged_since`) vs an atomic load;
//! * `cache_hit` — the cache's hit vs an atomic load;
//! * `register_unregister` — one page vs mlock + munlock;
//! * `munmap_registered_4k` / `madvise_registered_4k` — vs the same call on an unregistered
//!   page, back to back (interleaved) and `_cold` (after 2 ms idle each);
//! * `munmap_registered_4k_vs_floor` / `madvise_registered_4k_vs_floor` — the same registered
//!   call (back to back) vs the kernel work the backend's design can not skip, made directly
//!   (`crate::floors`: a userfaultfd round trip, an unregister with signals blocked, ...);
//! * `libc_munmap_unregistered_4k` / `libc_madvise_unregistered_4k` — libc's call on an
//!   unregistered page vs the raw syscall on another (interleaved): what a backend's hooks add to
//!   every libc call, registered or not (issue 11's +30 ns; about 1.0 where nothing is hooked);
//! * `getpid_other_process` — a getpid loop in *another* process while the backend is active vs
//!   while it is not (paired, alternating): the tax on what is not registered at all;
//! * `munmap_other_process` — the same with an mmap + touch + munmap of one page per round:
//!   the tax on another process's invalidations (the MMU-notifier tracepoints' filter runs for
//!   every task's invalidation while the `tracepoint` backend's CPU-wide events exist);
//! * `memory_per_region` (bytes) — RSS growth per registered one-page region (100,000 of them)
//!   vs a 4 KiB page;
//! * `storm_100k_munmap` — 100,000 registered pages unmapped one call each, back to back, vs an
//!   unregistered munmap; `storm_100k_lost` (count: regions still valid afterwards, must be 0)
//!   and `storm_100k_all_changed` (count: "assume everything changed" by the backend).
#![allow(unsafe_code)] // mmap/munmap/madvise of benchmark memory, getpid.

use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::Serialize;
use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::NoopRegistrar;
use ummunotify::{Backend, Cookie, Notifier};

use crate::bench::{median, paired, touch, unmap};
use crate::floors::{self, Floor};

fn map(len: usize) -> usize {
    crate::bench::map(len, 0)
}

/// The hidden subcommand a backend's child runs.
pub const CHILD: &str = "__bench-backend";
/// The hidden subcommand of the other process in `getpid_other_process`.
pub const GETPID: &str = "__getpid-loop";
const ROW_PREFIX: &str = "UMN-BENCH-ROW\t";

/// The rows every notifier backend measures, in order.
pub const ROWS: &[&str] = &[
    "check",
    "cache_hit",
    "register_unregister",
    "munmap_registered_4k",
    "munmap_registered_4k_cold",
    "madvise_registered_4k",
    "madvise_registered_4k_cold",
    "munmap_registered_4k_vs_floor",
    "madvise_registered_4k_vs_floor",
    "libc_munmap_unregistered_4k",
    "libc_madvise_unregistered_4k",
    "getpid_other_process",
    "munmap_other_process",
    "memory_per_region",
    "storm_100k_munmap",
    "storm_100k_lost",
    "storm_100k_all_changed",
];

/// One measured row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The backend (`uffd`, `hooks`, `perf`, `ucx`, ...).
    pub backend: String,
    /// The row (one of [`ROWS`], or a source's own).
    pub name: String,
    /// The measured value (ns per operation unless `unit` says otherwise).
    pub ns_per_op: f64,
    /// What the baseline is.
    pub baseline: String,
    /// The baseline's value, measured in the same process, next to it.
    pub baseline_ns: f64,
    /// `ns`, `bytes` or `count`.
    pub unit: &'static str,
}

impl Row {
    fn new(backend: &str, name: &str, v: f64, baseline: &str, b: f64, unit: &'static str) -> Row {
        Row {
            backend: backend.into(),
            name: name.into(),
            ns_per_op: v,
            baseline: baseline.into(),
            baseline_ns: b,
            unit,
        }
    }

    /// `ns_per_op / baseline_ns` (0 when the baseline is 0: a count that must be 0).
    pub fn ratio(&self) -> f64 {
        if self.baseline_ns == 0.0 {
            0.0
        } else {
            self.ns_per_op / self.baseline_ns
        }
    }
}

/// A backend's rows: measured in this process (a notifier backend's child) or by a harness of
/// its own (UCX).
pub trait RowSource {
    /// The name in the `backend` column.
    fn backend(&self) -> String;
    /// Measures every row, or says why this backend can not run here.
    fn rows(&self, quick: bool) -> Result<Vec<Row>, String>;
}

/// Every source this build knows, in the table's order.
pub fn sources(exe: &std::path::Path) -> Vec<Box<dyn RowSource>> {
    let mut v: Vec<Box<dyn RowSource>> = Vec::new();
    for name in [
        "uffd",
        "hooks",
        "hybrid",
        "perf",
        "tracepoint",
        "ebpf",
        "kernel",
    ] {
        if Backend::from_name(name).is_some() {
            v.push(Box::new(InChild {
                exe: exe.to_path_buf(),
                name,
            }));
        }
    }
    v.push(Box::new(Ucx));
    v
}

/// A notifier backend, measured in a child process of its own.
struct InChild {
    exe: std::path::PathBuf,
    name: &'static str,
}

impl RowSource for InChild {
    fn backend(&self) -> String {
        self.name.into()
    }

    fn rows(&self, quick: bool) -> Result<Vec<Row>, String> {
        let mut cmd = Command::new(&self.exe);
        cmd.args([CHILD, self.name]);
        if quick {
            cmd.arg("--quick");
        }
        let out = cmd.output().map_err(|e| format!("spawn: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rows: Vec<Row> = stdout.lines().filter_map(parse_row).collect();
        if !out.status.success() || rows.is_empty() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(err.lines().last().unwrap_or("no rows").to_string());
        }
        // What the child said about its rows (a storm smaller than asked for) is for the user.
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        Ok(rows)
    }
}

fn parse_row(line: &str) -> Option<Row> {
    let f: Vec<&str> = line.strip_prefix(ROW_PREFIX)?.split('\t').collect();
    let unit = match *f.get(5)? {
        "bytes" => "bytes",
        "count" => "count",
        _ => "ns",
    };
    Some(Row::new(
        f[0],
        f[1],
        f[2].parse().ok()?,
        f[3],
        f[4].parse().ok()?,
        unit,
    ))
}

/// The child's side: measures every row on backend `name` and prints them for the parent.
pub fn child_main(name: &str, quick: bool) -> Result<(), String> {
    let backend = Backend::from_name(name).ok_or_else(|| format!("unknown backend {name}"))?;
    // The cache and the C library read UMN_BACKEND; every notifier here runs on `backend`.
    std::env::set_var(ummunotify::BACKEND_ENV, name);
    let rows = measure(name, backend, quick).map_err(|e| format!("{name}: {e}"))?;
    for r in rows {
        println!(
            "{ROW_PREFIX}{}\t{}\t{}\t{}\t{}\t{}",
            r.backend, r.name, r.ns_per_op, r.baseline, r.baseline_ns, r.unit
        );
    }
    Ok(())
}

/// The other process of `getpid_other_process`: `n` raw getpid calls, ns per call on stdout;
/// with `munmap` (`munmap_other_process`), `n` rounds of mmap + touch + munmap of one page.
pub fn getpid_main(n: u64, munmap: bool) {
    let t = Instant::now();
    for _ in 0..n {
        if munmap {
            let p = map(PG);
            touch(p, PG);
            unmap(p, PG);
        } else {
            // SAFETY: getpid has no preconditions.
            black_box(unsafe { libc::syscall(libc::SYS_getpid) });
        }
    }
    println!("{}", t.elapsed().as_nanos() as f64 / n as f64);
}

const PG: usize = 4096;

/// A page that is a VMA of its own (a hole above it, and below it once the next one is made):
/// so the rows that compare munmaps of two pages compare the same kernel work (removing a whole
/// VMA) and differ only in what the backend adds, not in whether the kernel had to split or
/// trim a VMA that neighbouring pages share.
pub(crate) fn lone_page() -> usize {
    let p = map(2 * PG);
    unmap(p + PG, PG);
    p
}

/// The raw syscall on a benchmark page (bypassing libc, and so any hooks): `munmap(a, PG)` or
/// `madvise(a, PG, advice)`.
fn raw(nr: libc::c_long, a: usize, advice: libc::c_int) {
    // SAFETY: munmap/madvise of a benchmark-owned page.
    unsafe { libc::syscall(nr, a, PG, advice) };
}

fn dontneed(a: usize, len: usize) {
    // SAFETY: benchmark-owned memory.
    unsafe { libc::madvise(a as *mut _, len, libc::MADV_DONTNEED) };
}

fn ns(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64
}

fn rss_bytes() -> f64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = s
        .split(' ')
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0.0);
    pages * PG as f64
}

/// The other process's getpid cost now (ns per call), or with `munmap` its mmap + touch +
/// munmap round's.
fn getpid_elsewhere(n: u64, munmap: bool) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args([GETPID, &n.to_string()]);
    if munmap {
        cmd.arg("--munmap");
    }
    let out = cmd
        .env_remove(ummunotify::BACKEND_ENV)
        .output()
        .map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| "getpid loop printed no number".to_string())
}

fn measure(name: &str, backend: Backend, quick: bool) -> Result<Vec<Row>, String> {
    fn e(e: impl std::fmt::Display) -> String {
        e.to_string()
    }
    let scale = if quick { 10 } else { 1 };
    let (batches, per) = (51, 20_000 / scale);
    let cycles = 2_000 / scale;
    let mut rows = Vec::new();
    let mut row =
        |n: &str, v: f64, b: &str, bv: f64, unit| rows.push(Row::new(name, n, v, b, bv, unit));
    let word = AtomicU64::new(1);

    let n = Notifier::with_backend(backend).map_err(e)?;
    // The check, against an atomic load.
    let (c, l) = crate::bench::check_vs_load(&n, batches, per).map_err(e)?;
    row("check", c, "atomic_load", l, "ns");

    // The cache hit (the cache's own notifier runs on the same backend: UMN_BACKEND).
    {
        let cache =
            Cache::new(NoopRegistrar, Config::default().merge_adjacent(false)).map_err(e)?;
        let buf = map(1 << 20);
        touch(buf, 1 << 20);
        drop(cache.get(buf, 1 << 20).map_err(e)?);
        let (h, l) = paired(
            batches,
            per,
            || {
                black_box(cache.get(black_box(buf + 8192), 4096).expect("hit"));
            },
            || {
                black_box(word.load(Relaxed));
            },
        );
        row("cache_hit", h, "atomic_load", l, "ns");
        drop(cache);
        unmap(buf, 1 << 20);
    }

    // Register + unregister one page vs mlock + munlock.
    let p = map(PG);
    touch(p, PG);
    let mut cookie = 1u64;
    let (r, m) = paired(
        21,
        200 / scale.min(10),
        || {
            cookie += 1;
            n.register(p..p + PG, Cookie(cookie)).expect("register");
            n.unregister(Cookie(cookie)).expect("unregister");
        },
        || {
            // SAFETY: benchmark-owned page.
            unsafe {
                libc::mlock(p as *const _, PG);
                libc::munlock(p as *const _, PG);
            }
        },
    );
    row("register_unregister", r, "mlock_munlock", m, "ns");
    unmap(p, PG);

    // munmap / madvise of a registered page vs an unregistered one, back to back and cold; and
    // (back to back only) the raw syscall on a third page. Each page is a VMA of its own.
    let mut t = [(); 8].map(|_| Vec::new());
    let (mut raw_madvise, mut raw_munmap) = (Vec::new(), Vec::new());
    // The kernel floor of the registered calls (back to back only), right after them.
    let floor = Floor::of(name);
    let probe = floors::Probe::new(floor)?;
    let (mut floor_madvise, mut floor_munmap) = (Vec::new(), Vec::new());
    for i in 0..cycles {
        let cold = i % 8 == 0;
        let (a, b, w) = (lone_page(), lone_page(), lone_page());
        touch(a, PG);
        touch(b, PG);
        touch(w, PG);
        cookie += 1;
        n.register(a..a + PG, Cookie(cookie)).map_err(e)?;
        let k = if cold { 4 } else { 0 };
        if cold {
            std::thread::sleep(Duration::from_millis(2));
        }
        t[k].push(ns(|| dontneed(a, PG)));
        if cold {
            std::thread::sleep(Duration::from_millis(2));
        }
        // The libc call and the raw syscall take turns going first (neither profits from
        // coming second).
        let raw_first = !cold && i % 2 == 1;
        if raw_first {
            raw_madvise.push(ns(|| raw(libc::SYS_madvise, w, libc::MADV_DONTNEED)));
        }
        t[k + 1].push(ns(|| dontneed(b, PG)));
        if !cold && !raw_first {
            raw_madvise.push(ns(|| raw(libc::SYS_madvise, w, libc::MADV_DONTNEED)));
        }
        if !cold {
            floor_madvise.push(probe.madvise()?);
        }
        n.unregister(Cookie(cookie)).map_err(e)?;
        // Every page the munmaps below remove holds a page again: the madvises above dropped
        // them, and a munmap that frees a page does more kernel work than one that frees none.
        touch(a, PG);
        touch(b, PG);
        touch(w, PG);
        cookie += 1;
        n.register(a..a + PG, Cookie(cookie)).map_err(e)?;
        if cold {
            std::thread::sleep(Duration::from_millis(2));
        }
        t[k + 2].push(ns(|| unmap(a, PG)));
        if cold {
            std::thread::sleep(Duration::from_millis(2));
        }
        if raw_first {
            raw_munmap.push(ns(|| raw(libc::SYS_munmap, w, 0)));
        }
        t[k + 3].push(ns(|| unmap(b, PG)));
        if cold {
            unmap(w, PG);
        } else if !raw_first {
            raw_munmap.push(ns(|| raw(libc::SYS_munmap, w, 0)));
        }
        if !cold {
            floor_munmap.push(probe.munmap()?);
        }
        n.unregister(Cookie(cookie)).map_err(e)?;
    }
    let [dr, du, mr, mu, cdr, cdu, cmr, cmu] = t.map(median);
    row(
        "munmap_registered_4k",
        mr,
        "munmap_unregistered_4k",
        mu,
        "ns",
    );
    row(
        "munmap_registered_4k_cold",
        cmr,
        "munmap_unregistered_4k_cold",
        cmu,
        "ns",
    );
    row(
        "madvise_registered_4k",
        dr,
        "madvise_unregistered_4k",
        du,
        "ns",
    );
    row(
        "madvise_registered_4k_cold",
        cdr,
        "madvise_unregistered_4k_cold",
        cdu,
        "ns",
    );
    probe.finish()?;
    row(
        "munmap_registered_4k_vs_floor",
        mr,
        &floor.name("munmap"),
        median(floor_munmap),
        "ns",
    );
    row(
        "madvise_registered_4k_vs_floor",
        dr,
        &floor.name("madvise"),
        median(floor_madvise),
        "ns",
    );
    row(
        "libc_munmap_unregistered_4k",
        mu,
        "raw_syscall_munmap_4k",
        median(raw_munmap),
        "ns",
    );
    row(
        "libc_madvise_unregistered_4k",
        du,
        "raw_syscall_madvise_4k",
        median(raw_madvise),
        "ns",
    );

    // The tax on another process's syscalls: with this notifier alive and one region registered
    // vs with no notifier, alternating.
    drop(n);
    let calls = 2_000_000 / scale as u64;
    for (munmap, calls, name, base) in [
        (
            false,
            calls,
            "getpid_other_process",
            "getpid_other_process_no_backend",
        ),
        (
            true,
            calls / 20,
            "munmap_other_process",
            "munmap_other_process_no_backend",
        ),
    ] {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let n = Notifier::with_backend(backend).map_err(e)?;
            let p = map(PG);
            touch(p, PG);
            n.register(p..p + PG, Cookie(1)).map_err(e)?;
            on.push(getpid_elsewhere(calls, munmap)?);
            drop(n);
            unmap(p, PG);
            off.push(getpid_elsewhere(calls, munmap)?);
        }
        row(name, median(on), base, median(off), "ns");
    }

    // Memory per region and the storm: 100,000 one-page regions on one mapping.
    let wanted = 100_000 / scale;
    let n = Notifier::with_backend(backend).map_err(e)?;
    let arena = map(wanted * PG);
    touch(arena, wanted * PG);
    let before = rss_bytes();
    let mut count = wanted;
    for i in 0..wanted {
        let a = arena + i * PG;
        match n.register(a..a + PG, Cookie(1_000_000 + i as u64)) {
            Ok(_) => {}
            // A backend with a fixed capacity (the eBPF area holds 1,024 ranges): the storm
            // runs over what it holds, and says so (stderr reaches the table's notes).
            Err(ummunotify::Error::CoverageLimit(why)) if i > 0 => {
                eprintln!("{name}: the storm holds {i} regions, not {wanted}: {why}");
                count = i;
                unmap(arena + i * PG, (wanted - i) * PG);
                break;
            }
            Err(err) => return Err(e(err)),
        }
    }
    let per_region = (rss_bytes() - before).max(0.0) / count as f64;
    row(
        "memory_per_region",
        per_region,
        "page_4k",
        PG as f64,
        "bytes",
    );
    let regions: Vec<_> = (0..count)
        .map(|i| n.region(Cookie(1_000_000 + i as u64)))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let all_before = n.stats().all_changed;
    let storm = ns(|| {
        for i in 0..count {
            unmap(arena + i * PG, PG);
        }
    }) / count as f64;
    let lost = regions.iter().filter(|&&r| n.is_valid(r)).count();
    let all = n.stats().all_changed - all_before;
    row(
        "storm_100k_munmap",
        storm,
        "munmap_unregistered_4k",
        mu,
        "ns",
    );
    row("storm_100k_lost", lost as f64, "must_be_0", 0.0, "count");
    row("storm_100k_all_changed", all as f64, "none", 0.0, "count");
    drop(n);
    assert!(
        rows.iter()
            .map(|r| r.name.as_str())
            .eq(ROWS.iter().copied()),
        "the rows measured are not ROWS"
    );
    Ok(rows)
}

/// UCX 1.22's memory hooks + rcache, measured by its own harness (built by
/// `bench/ucx_compare.sh --setup-only`): its hit, and its hooked munmap of a cached vs an
/// uncached 4 KiB page.
struct Ucx;

impl RowSource for Ucx {
    fn backend(&self) -> String {
        "ucx".into()
    }

    fn rows(&self, quick: bool) -> Result<Vec<Row>, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/ucx_compare.sh");
        let out = Command::new("bash")
            .args([script, "--setup-only"])
            .output()
            .map_err(|e| format!("bench/ucx_compare.sh: {e}"))?;
        let bin = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || bin.is_empty() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        let iters = if quick { "20000" } else { "100000" };
        let out = Command::new(&bin)
            .args([iters, "2000"])
            .env("UCX_LOG_LEVEL", "error")
            .output()
            .map_err(|e| format!("{bin}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let med = |prefix: &str| -> Result<f64, String> {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .and_then(|l| l.split("median=").nth(1))
                .and_then(|m| m.split_whitespace().next())
                .and_then(|m| m.parse().ok())
                .ok_or_else(|| format!("UCX harness: no line {prefix:?}"))
        };
        let hit = med("HIT get+put 4 KiB inside 1 MiB region (batch-1000")?;
        let inval = med("INVAL munmap    4096 B")?;
        let ctrl = med("CTRL  munmap    4096 B")?;
        let miss = med("MISS get+put, 1 page")?;
        let ucx = |n: &str, v, b: &str, bv| Row::new("ucx", n, v, b, bv, "ns");
        Ok(vec![
            ucx("cache_hit", hit, "ucx_cache_miss", miss),
            ucx(
                "munmap_registered_4k",
                inval,
                "munmap_unregistered_4k_hooked",
                ctrl,
            ),
        ])
    }
}

/// Runs every source; a backend that can not start here is reported on stderr and left out.
pub fn run(exe: &std::path::Path, quick: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for s in sources(exe) {
        match s.rows(quick) {
            Ok(r) => rows.extend(r),
            Err(why) => eprintln!("umn bench --backends: {} left out: {why}", s.backend()),
        }
    }
    rows
}

/// `{"results": [{"backend", "name", "ns_per_op", "baseline", "baseline_ns", "ratio", "unit"}]}`,
/// one row per line ([`crate::rows_json`]).
pub fn to_json(rows: &[Row]) -> String {
    /// A row as printed: `ratio` (computed) sits between `baseline_ns` and `unit`.
    #[derive(Serialize)]
    struct RowJson<'a> {
        backend: &'a str,
        name: &'a str,
        #[serde(serialize_with = "crate::rows_json::fixed2")]
        ns_per_op: f64,
        baseline: &'a str,
        #[serde(serialize_with = "crate::rows_json::fixed2")]
        baseline_ns: f64,
        #[serde(serialize_with = "crate::rows_json::fixed3")]
        ratio: f64,
        unit: &'a str,
    }
    let rows: Vec<RowJson> = rows
        .iter()
        .map(|r| RowJson {
            backend: &r.backend,
            name: &r.name,
            ns_per_op: r.ns_per_op,
            baseline: &r.baseline,
            baseline_ns: r.baseline_ns,
            ratio: r.ratio(),
            unit: r.unit,
        })
        .collect();
    crate::rows_json::results(&rows)
}

/// The rows as a table: one line per row and backend.
pub fn to_table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<8} {:<28} {:>12}  {:<34} {:>12} {:>8}\n",
        "backend", "name", "value", "baseline", "baseline", "ratio"
    );
    for r in rows {
        s += &format!(
            "{:<8} {:<28} {:>12.1}  {:<34} {:>12.1} {:>8.2}{}\n",
            r.backend,
            r.name,
            r.ns_per_op,
            r.baseline,
            r.baseline_ns,
            r.ratio(),
            if r.unit == "ns" {
                String::new()
            } else {
                format!("  ({})", r.unit)
            }
        );
    }
    s
}

/// An SVG bar chart of every `ns` row: one group per row name, one bar per backend, log scale
/// (the rows span 1 ns to 100 µs). Generated from the rows, never drawn by hand.
pub fn to_svg(rows: &[Row]) -> String {
    let ns: Vec<&Row> = rows.iter().filter(|r| r.unit == "ns").collect();
    let mut names: Vec<&str> = Vec::new();
    let mut backends: Vec<&str> = Vec::new();
    for r in &ns {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
        if !backends.contains(&r.backend.as_str()) {
            backends.push(&r.backend);
        }
    }
    let colors = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    ];
    let (bar, gap, left, width) = (12.0, 10.0, 230.0, 560.0);
    let group = bar * backends.len() as f64 + gap;
    let height = 60.0 + group * names.len() as f64 + 20.0 * backends.len() as f64;
    let (lo, hi) = (0.0f64, 6.0f64); // log10 ns: 1 ns .. 1 ms
    let x = |v: f64| left + width * ((v.max(1.0).log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"10\" y=\"18\" font-size=\"14\">\
         cost per operation by backend (ns, log scale; umn bench --backends)</text>\n",
        left + width + 40.0
    );
    for d in 0..=6 {
        let gx = x(10f64.powi(d));
        s += &format!(
            "<line x1=\"{gx}\" y1=\"30\" x2=\"{gx}\" y2=\"{}\" stroke=\"#ddd\"/>\
             <text x=\"{gx}\" y=\"28\" text-anchor=\"middle\">1e{d}</text>\n",
            40.0 + group * names.len() as f64
        );
    }
    for (i, name) in names.iter().enumerate() {
        let y0 = 40.0 + group * i as f64;
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{name}</text>\n",
            left - 6.0,
            y0 + group / 2.0
        );
        for (j, b) in backends.iter().enumerate() {
            if let Some(r) = ns.iter().find(|r| r.name == *name && r.backend == *b) {
                s += &format!(
                    "<rect x=\"{left}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"{}\">\
                     <title>{b} {name}: {:.1} ns</title></rect>\n",
                    y0 + bar * j as f64,
                    x(r.ns_per_op) - left,
                    bar - 2.0,
                    colors[j % colors.len()],
                    r.ns_per_op
                );
            }
        }
    }
    let ly = 50.0 + group * names.len() as f64;
    for (j, b) in backends.iter().enumerate() {
        let y = ly + 20.0 * j as f64;
        s += &format!(
            "<rect x=\"{left}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\">{b}</text>\n",
            colors[j % colors.len()],
            left + 18.0,
            y + 10.0
        );
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI greps `"backend": "uffd", "name": "munmap_registered_4k_cold"` (those spaces) and
    /// docs/DESIGNS.md quotes the output: the bytes are kept.
    #[test]
    fn json_is_unchanged() {
        let rows = vec![
            Row::new(
                "uffd",
                "munmap_registered_4k_cold",
                1234.5678,
                "munmap_unregistered_4k",
                1000.0,
                "ns",
            ),
            Row::new("ucx", "region \"bytes\"", 64.0, "hashmap", 0.333, "bytes"),
        ];
        let json = to_json(&rows);
        assert_eq!(json, GOLDEN, "\n{json}");
        assert_eq!(to_json(&[]), EMPTY);
    }

    const GOLDEN: &str = r#"{"results": [
  {"backend": "uffd", "name": "munmap_registered_4k_cold", "ns_per_op": 1234.57, "baseline": "munmap_unregistered_4k", "baseline_ns": 1000.00, "ratio": 1.235, "unit": "ns"},
  {"backend": "ucx", "name": "region \"bytes\"", "ns_per_op": 64.00, "baseline": "hashmap", "baseline_ns": 0.33, "ratio": 192.192, "unit": "bytes"}
]}"#;
    const EMPTY: &str = r#"{"results": [
  
]}"#;
}
