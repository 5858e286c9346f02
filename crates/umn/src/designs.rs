//! `umn designs`: the designs side by side, in one process, each against baselines measured in
//! the same process right before it starts (issue 15, item 5): the `/dev/ummunotify` module
//! used directly (`module`: `KernelNotifier`, the check one load of the module's word), the
//! notifier on the kernel backend (`kernel`: the module behind the seam, checks pull its counter),
//! userfaultfd, hooks. Per design: a registered and an unregistered munmap
//! and madvise(DONTNEED) of a touched 4 KiB page (×plain, no notifier open), the check (×an
//! atomic load), register + unregister of one page (×getpid), and a storm of N one-page regions
//! (register per region and unregister per region ×getpid, one munmap over all ×a plain munmap of
//! as many untouched pages, reading the events per event ×getpid).
//!
//! Timed with the TSC (`rdtsc`), not the clock: the guest kernel of `kernel/ci.sh` has no fine
//! clock under QEMU TCG. Only the ratios mean anything; each is a median over many calls.
#![allow(unsafe_code)] // mmap/munmap/madvise of benchmark memory; rdtsc.

use std::hint::black_box;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Acquire};

use ummunotify::{Backend, Cookie, Error, Event, KernelNotifier, Notifier, ReadEvents, Region};

/// One design under measurement.
trait Design {
    fn register(&self, range: Range<usize>, cookie: u64) -> Result<Region, Error>;
    fn unregister(&self, cookie: u64) -> Result<(), Error>;
    fn is_valid(&self, region: Region) -> bool;
    /// Reads every pending event; how many.
    fn drain(&self) -> Result<usize, Error>;
}

/// Reads every pending event through `read` (a notifier's `read_events`); how many.
fn drain_with(read: impl Fn(&mut [Event]) -> Result<ReadEvents, Error>) -> Result<usize, Error> {
    let mut buf = [Event::default(); 64];
    let mut n = 0;
    loop {
        let r = read(&mut buf)?;
        n += r.count;
        if r.drained.is_some() {
            return Ok(n);
        }
    }
}

macro_rules! design {
    ($t:ty) => {
        impl Design for $t {
            fn register(&self, range: Range<usize>, cookie: u64) -> Result<Region, Error> {
                <$t>::register(self, range, Cookie(cookie))
            }
            fn unregister(&self, cookie: u64) -> Result<(), Error> {
                <$t>::unregister(self, Cookie(cookie))
            }
            fn is_valid(&self, region: Region) -> bool {
                <$t>::is_valid(self, region)
            }
            fn drain(&self) -> Result<usize, Error> {
                drain_with(|b| self.read_events(b))
            }
        }
    };
}
design!(Notifier);
design!(KernelNotifier);

/// No notifier at all: the same loop with nothing registered, for the baselines of the per-call
/// and storm-munmap rows (the same calls on the same kind of pages, in the same order).
struct Plain(AtomicU64);

impl Design for Plain {
    fn register(&self, _: Range<usize>, _: u64) -> Result<Region, Error> {
        Ok(Region::from_raw(0, 0))
    }
    fn unregister(&self, _: u64) -> Result<(), Error> {
        Ok(())
    }
    fn is_valid(&self, _: Region) -> bool {
        self.0.load(Acquire) == 0
    }
    fn drain(&self) -> Result<usize, Error> {
        Ok(0)
    }
}

/// One row: a design's operation against its baseline, in TSC ticks per operation.
#[derive(Debug, Clone)]
pub struct Row {
    /// `module`, `kernel`, `uffd`, `tracepoint`, `hooks`.
    pub design: &'static str,
    /// The operation.
    pub op: &'static str,
    /// Ticks per operation (median).
    pub ticks: f64,
    /// The baseline's ticks per operation (median, same process, just before).
    pub base: f64,
    /// What the baseline is.
    pub base_name: &'static str,
}

impl Row {
    /// `ticks / base`.
    pub fn ratio(&self) -> f64 {
        self.ticks / self.base
    }
}

fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::time::Instant::now().elapsed().as_nanos() as u64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn map(len: usize) -> usize {
    // SAFETY: a fresh anonymous mapping chosen by the kernel.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "mmap failed");
    p as usize
}

fn touch(addr: usize, len: usize) {
    // SAFETY: benchmark-owned writable mapping.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 1, len) };
}

fn time(v: &mut Vec<f64>, f: impl FnOnce()) {
    let t = tsc();
    f();
    v.push((tsc() - t) as f64);
}

fn munmap(a: usize, len: usize) {
    // SAFETY: benchmark-owned mapping.
    unsafe { libc::munmap(a as *mut _, len) };
}

fn dontneed(a: usize, len: usize) {
    // SAFETY: benchmark-owned mapping.
    unsafe { libc::madvise(a as *mut _, len, libc::MADV_DONTNEED) };
}

fn getpid() {
    // SAFETY: no arguments; the raw syscall (glibc does not cache it, but be sure).
    black_box(unsafe { libc::syscall(libc::SYS_getpid) });
}

/// The baselines, with no notifier open: munmap, madvise of a touched page, getpid, an atomic
/// load, a munmap of `storm` untouched pages.
struct Base {
    munmap: f64,
    madvise: f64,
    getpid: f64,
    load: f64,
    storm_munmap: f64,
}

fn baselines(cycles: usize, storm: usize) -> Base {
    let pg = page();
    let (mut mu, mut md, mut gp) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..cycles {
        let a = map(pg);
        touch(a, pg);
        time(&mut md, || dontneed(a, pg));
        touch(a, pg);
        time(&mut mu, || munmap(a, pg));
        time(&mut gp, getpid);
    }
    let word = AtomicU64::new(1);
    let load = checks(cycles, || word.load(Acquire) == 1);
    let big = map(storm * pg);
    let t = tsc();
    munmap(big, storm * pg);
    Base {
        munmap: median(mu),
        madvise: median(md),
        getpid: median(gp),
        load,
        storm_munmap: (tsc() - t) as f64,
    }
}

/// Median ticks per call of `f` over batches of 1000 calls.
fn checks(batches: usize, f: impl Fn() -> bool) -> f64 {
    let mut v = Vec::new();
    for _ in 0..batches.max(11) {
        let t = tsc();
        for _ in 0..1000 {
            black_box(f());
        }
        v.push((tsc() - t) as f64 / 1000.0);
    }
    median(v)
}

fn measure(
    name: &'static str,
    d: &dyn Design,
    b: &Base,
    cycles: usize,
    storm: usize,
) -> Result<Vec<Row>, Error> {
    let pg = page();
    let mut t = [(); 6].map(|_| Vec::with_capacity(cycles));
    let mut cookie = 1u64 << 40;
    // A region elsewhere, so that "unregistered" means: a notifier with regions, not this page.
    let other = map(pg);
    touch(other, pg);
    d.register(other..other + pg, 1)?;
    for _ in 0..cycles {
        let (r, u) = (map(pg), map(pg));
        touch(r, pg);
        touch(u, pg);
        cookie += 1;
        d.register(r..r + pg, cookie)?;
        time(&mut t[0], || dontneed(r, pg));
        time(&mut t[1], || dontneed(u, pg));
        d.unregister(cookie)?;
        touch(r, pg);
        touch(u, pg);
        cookie += 1;
        d.register(r..r + pg, cookie)?;
        time(&mut t[2], || munmap(r, pg));
        time(&mut t[3], || munmap(u, pg));
        d.unregister(cookie)?;
        let p = map(pg);
        touch(p, pg);
        cookie += 1;
        time(&mut t[4], || {
            d.register(p..p + pg, cookie).expect("register");
            d.unregister(cookie).expect("unregister");
        });
        munmap(p, pg);
    }
    d.drain()?;
    let region = d.register(other..other + pg, 2)?;
    let check = checks(cycles, || d.is_valid(region));
    d.unregister(1)?;
    d.unregister(2)?;
    munmap(other, pg);
    let [dr, du, mr, mu, ru, _] = t.map(|v| if v.is_empty() { 0.0 } else { median(v) });

    // The storm: one-page regions over one mapping of `storm` untouched pages.
    let big = map(storm * pg);
    let t0 = tsc();
    for i in 0..storm {
        let a = big + i * pg;
        d.register(a..a + pg, (1 << 48) + i as u64)?;
    }
    let reg = (tsc() - t0) as f64 / storm as f64;
    let t0 = tsc();
    munmap(big, storm * pg);
    let unmap = (tsc() - t0) as f64;
    let t0 = tsc();
    let events = d.drain()?;
    let read = (tsc() - t0) as f64 / events.max(1) as f64;
    let t0 = tsc();
    for i in 0..storm {
        d.unregister((1 << 48) + i as u64)?;
    }
    let unreg = (tsc() - t0) as f64 / storm as f64;
    if events != storm && name != "plain" {
        eprintln!(
            "umn designs: {name}: the storm's munmap gave {events} events for {storm} regions"
        );
    }
    let row = |op, ticks, base, base_name| Row {
        design: name,
        op,
        ticks,
        base,
        base_name,
    };
    Ok(vec![
        row("munmap_unregistered_4k", mu, b.munmap, "plain munmap"),
        row("munmap_registered_4k", mr, b.munmap, "plain munmap"),
        row("madvise_unregistered_4k", du, b.madvise, "plain madvise"),
        row("madvise_registered_4k", dr, b.madvise, "plain madvise"),
        row("check", check, b.load, "atomic load"),
        row("register_unregister", ru, b.getpid, "getpid"),
        row("storm_register_per_region", reg, b.getpid, "getpid"),
        row(
            "storm_munmap_all",
            unmap,
            b.storm_munmap,
            "plain munmap of as many pages",
        ),
        row("storm_read_per_event", read, b.getpid, "getpid"),
        row("storm_unregister_per_region", unreg, b.getpid, "getpid"),
    ])
}

/// Runs every design that starts here (module, kernel, uffd, tracepoint, then hooks, which patch libc for
/// good), each after fresh baselines: getpid, and the same loop with no notifier (`Plain`), whose
/// munmap, madvise, check and storm-munmap ticks are the baselines of those rows. `cycles` calls
/// per per-call row, `storm` regions in the storm. Designs that can not start are reported on
/// stderr and left out.
pub fn run(cycles: usize, storm: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut one = |name: &'static str, open: &dyn Fn() -> Result<Box<dyn Design>, Error>| {
        let b = baselines(cycles, storm);
        let plain = match measure("plain", &Plain(AtomicU64::new(0)), &b, cycles, storm) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("umn designs: no baseline: {e}");
                return;
            }
        };
        match open().and_then(|d| measure(name, &*d, &b, cycles, storm)) {
            Ok(r) => rows.extend(r.into_iter().map(|mut row| {
                if let Some(p) = plain
                    .iter()
                    .find(|p| p.op == row.op && p.base_name != "getpid")
                {
                    row.base = p.ticks;
                    row.base_name = "the same calls, no notifier";
                }
                row
            })),
            Err(e) => eprintln!("umn designs: no {name} rows: {e}"),
        }
    };
    one("module", &|| Ok(Box::new(KernelNotifier::open()?)));
    one("kernel", &|| {
        Ok(Box::new(Notifier::with_backend(Backend::Kernel)?))
    });
    one("uffd", &|| {
        Ok(Box::new(Notifier::with_backend(Backend::Userfaultfd)?))
    });
    // Ingo Molnar's 2009 proposal: perf on tracepoints where the kernel invalidates (a kernel
    // with kernel/patches/mmu-notifier-trace/ only; elsewhere its rows are left out, saying why).
    one("tracepoint", &|| {
        Ok(Box::new(Notifier::with_backend(Backend::Tracepoint)?))
    });
    one("hooks", &|| {
        Ok(Box::new(Notifier::with_backend(Backend::Hooks)?))
    });
    rows
}

/// The table: one line per operation, one column per design (its ratio to its own baseline),
/// and one `UMN-DESIGN design op ticks base ratio` line per row for scripts.
pub fn to_table(rows: &[Row]) -> String {
    let mut designs: Vec<&str> = Vec::new();
    let mut ops: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        if !designs.contains(&r.design) {
            designs.push(r.design);
        }
        if !ops.iter().any(|(o, _)| *o == r.op) {
            ops.push((r.op, r.base_name));
        }
    }
    let mut out = format!("{:<30}", "operation (ratio to baseline)");
    for d in &designs {
        out.push_str(&format!(" {d:>9}"));
    }
    out.push_str("  baseline\n");
    for (op, base) in &ops {
        out.push_str(&format!("{op:<30}"));
        for d in &designs {
            match rows.iter().find(|r| r.design == *d && r.op == *op) {
                Some(r) => out.push_str(&format!(" {:>9.2}", r.ratio())),
                None => out.push_str(&format!(" {:>9}", "-")),
            }
        }
        out.push_str(&format!("  {base}\n"));
    }
    for r in rows {
        out.push_str(&format!(
            "UMN-DESIGN {} {} {:.0} {:.0} {:.3}\n",
            r.design,
            r.op,
            r.ticks,
            r.base,
            r.ratio()
        ));
    }
    out
}
