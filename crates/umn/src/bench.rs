//! `umn bench`: the cache's and the notifier's costs, each as a ratio to a baseline measured in
//! the same run (the machine is noisy; absolute numbers only make sense next to their baseline).
//!
//! Every timed quantity is the median over many batches of the mean cost per operation in a batch
//! (the same statistic as the UCX rcache harness's "batch-1000 mean/call" lines).
#![allow(unsafe_code)] // mmap/munmap/madvise of benchmark memory.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::Instant;

use serde::Serialize;

use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::{MlockRegistrar, NoopRegistrar, Registrar};
use ummunotify::{Backend, Cookie, Notifier};

/// One result row (serialized in this field order by `--json`).
#[derive(Serialize, Debug, Clone)]
pub struct Row {
    /// Stable name (see the module doc of the command).
    pub name: &'static str,
    /// Cost of one operation, ns (for `cache_hit_2threads_speedup`: ns per op with 2 threads;
    /// for `region_bytes`: bytes of RSS per registered region).
    #[serde(serialize_with = "crate::rows_json::fixed2")]
    pub ns_per_op: f64,
    /// The baseline's cost, ns (for `region_bytes`: bytes per entry).
    #[serde(serialize_with = "crate::rows_json::fixed2")]
    pub baseline: f64,
    /// What the baseline is.
    pub baseline_name: &'static str,
    /// `ns_per_op / baseline` (for the speedup row: `baseline / ns_per_op`).
    #[serde(serialize_with = "crate::rows_json::fixed3")]
    pub ratio: f64,
}

pub(crate) fn row(name: &'static str, ns: f64, baseline_name: &'static str, base: f64) -> Row {
    Row {
        name,
        ns_per_op: ns,
        baseline: base,
        baseline_name,
        ratio: ns / base,
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median over `batches` of the mean ns per call of `f` in a batch of `per` calls.
pub(crate) fn batched(batches: usize, per: usize, mut f: impl FnMut()) -> f64 {
    let mut v = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..per {
            f();
        }
        v.push(t.elapsed().as_nanos() as f64 / per as f64);
    }
    median(v)
}

/// `n.unchanged_since` against an atomic load, paired batch by batch: (check ns, load ns).
pub(crate) fn check_vs_load(
    n: &Notifier,
    batches: usize,
    per: usize,
) -> Result<(f64, f64), ummunotify::Error> {
    let g = n.generation()?;
    let word = AtomicU64::new(1);
    Ok(paired(
        batches,
        per,
        || {
            black_box(n.unchanged_since(black_box(g)));
        },
        || {
            black_box(word.load(Relaxed));
        },
    ))
}

/// Two closures measured alternately, batch by batch (so noise hits both alike).
pub(crate) fn paired(
    batches: usize,
    per: usize,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (f64, f64) {
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        va.push(batched(1, per, &mut a));
        vb.push(batched(1, per, &mut b));
    }
    (median(va), median(vb))
}

pub(crate) fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

pub(crate) fn map(len: usize, at: usize) -> usize {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if at != 0 {
        flags |= libc::MAP_FIXED_NOREPLACE;
    }
    // SAFETY: a fresh anonymous mapping; NOREPLACE never clobbers an existing one.
    let p = unsafe {
        libc::mmap(
            at as *mut _,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    assert!(
        p != libc::MAP_FAILED && (at == 0 || p as usize == at),
        "mmap failed"
    );
    p as usize
}

pub(crate) fn unmap(addr: usize, len: usize) {
    // SAFETY: benchmark-owned mapping.
    unsafe { libc::munmap(addr as *mut _, len) };
}

pub(crate) fn touch(addr: usize, len: usize) {
    // SAFETY: benchmark-owned writable mapping.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 1, len) };
}

/// Runs every benchmark; `quick` shortens them (for tests).
pub fn run(quick: bool) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let scale = if quick { 10 } else { 1 };
    let batches = 101;
    let per = 20_000 / scale;
    let pg = page();
    let mut rows = Vec::new();
    // First, before other benchmarks leave freed memory in the allocator for it to reuse.
    let region_bytes_row = region_bytes(if quick { 100_000 } else { 1_000_000 })?;

    // Hits on a warm region, against an atomic load and a HashMap lookup.
    let cache = Cache::new(NoopRegistrar, Config::default().merge_adjacent(false))?;
    let buf = map(1 << 20, 0);
    touch(buf, 1 << 20);
    drop(cache.get(buf, 1 << 20)?);
    let word = AtomicU64::new(1);
    let map1k: HashMap<usize, usize> = (0..1000).map(|i| (i * 4096, i)).collect();
    let mut key = 0usize;
    let mut hit_ns = Vec::new();
    let mut load_ns = Vec::new();
    let mut hash_ns = Vec::new();
    for _ in 0..batches {
        hit_ns.push(batched(1, per, || {
            let h = cache
                .get(black_box(buf + 8192), black_box(4096))
                .expect("hit");
            black_box(&h);
        }));
        load_ns.push(batched(1, per, || {
            black_box(word.load(Relaxed));
        }));
        hash_ns.push(batched(1, per, || {
            key = (key + 4096) % (1000 * 4096);
            black_box(map1k.get(&black_box(key)));
        }));
    }
    let (hit, load, hash) = (median(hit_ns), median(load_ns), median(hash_ns));
    rows.push(row("cache_hit", hit, "atomic_load", load));
    rows.push(row("cache_hit_vs_hashmap", hit, "hashmap_lookup_1k", hash));

    // Counter check vs a plain load.
    let (check, load2) = check_vs_load(cache.notifier(), batches, per)?;
    rows.push(row("counter_check", check, "atomic_load", load2));

    // Two threads hitting the same region of the same cache.
    let ops = 2_000_000 / scale;
    let one = threads_hit(&cache, buf, 1, ops);
    let two = threads_hit(&cache, buf, 2, ops);
    rows.push(Row {
        name: "cache_hit_2threads_speedup",
        ns_per_op: two,
        baseline: one,
        baseline_name: "cache_hit_1thread_throughput",
        ratio: one / two,
    });

    // Misses: get + drop of a never-seen page, one every other page of one mapping (regions
    // stay cached), as the UCX harness's "MISS get+put" (bench/ucx_compare.sh): with the no-op
    // registrar against the hit, and with the mlock registrar against mlock + munlock of a page.
    // 2,000 of them, as bench/miss_floor.c's default: the process stays far below the watch
    // policy's VMA budget (20,000 single pages one every other page take it to the budget,
    // where the policy counts the process's VMAs every few hundred watches: cache_miss_20k).
    let nmiss = 2_000 / scale;
    let miss = misses(NoopRegistrar, nmiss)?;
    rows.push(row("cache_miss", miss, "cache_hit", hit));
    let miss_20k = misses(NoopRegistrar, 20_000 / scale)?;
    rows.push(row("cache_miss_20k", miss_20k, "cache_miss", miss));
    // The miss against the kernel calls it makes (issue 23), batch by batch in this process.
    let f = miss_vs_floor(40 / scale.min(4), 50, None, Misser::Cache)?;
    rows.push(row("cache_miss_vs_floor", f.miss, "miss_floor3", f.floor3));
    rows.push(row("cache_miss_vs_floor4", f.miss, "miss_floor4", f.floor4));
    let miss_mlock = misses(MlockRegistrar, nmiss)?;
    let p = map(pg, 0);
    touch(p, pg);
    let lock = batched(batches, per / 10, || {
        // SAFETY: benchmark-owned page.
        unsafe {
            libc::mlock(p as *const _, pg);
            libc::munlock(p as *const _, pg);
        }
    });
    unmap(p, pg);
    rows.push(row("cache_miss_mlock", miss_mlock, "mlock_munlock", lock));

    // Invalidation cycle: munmap + mmap at the same address + get, vs the same on memory the
    // cache does not know (interleaved).
    let cycles = 5_000 / scale;
    let (a, b) = (map(pg, 0), map(pg, 0));
    touch(a, pg);
    drop(cache.get(a, pg)?);
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for _ in 0..cycles {
        let t = Instant::now();
        unmap(a, pg);
        map(pg, a);
        drop(cache.get(a, pg)?);
        va.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        unmap(b, pg);
        map(pg, b);
        vb.push(t.elapsed().as_nanos() as f64);
    }
    rows.push(row(
        "cache_invalidate_cycle",
        median(va),
        "munmap_mmap_unregistered",
        median(vb),
    ));
    cache.flush();

    // munmap / madvise of a registered 4 KiB page vs an unregistered one.
    let (mut mr, mut mu, mut dr, mut du) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..cycles {
        let (r, u) = (map(pg, 0), map(pg, 0));
        touch(r, pg);
        touch(u, pg);
        drop(cache.get(r, pg)?);
        let t = Instant::now();
        // SAFETY: benchmark-owned pages.
        unsafe { libc::madvise(r as *mut _, pg, libc::MADV_DONTNEED) };
        dr.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { libc::madvise(u as *mut _, pg, libc::MADV_DONTNEED) };
        du.push(t.elapsed().as_nanos() as f64);
        cache.flush();
        drop(cache.get(r, pg)?);
        let t = Instant::now();
        unmap(r, pg);
        mr.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        unmap(u, pg);
        mu.push(t.elapsed().as_nanos() as f64);
    }
    cache.flush();
    rows.push(row(
        "munmap_registered_4k",
        median(mr),
        "munmap_unregistered_4k",
        median(mu),
    ));
    rows.push(row(
        "madvise_registered_4k",
        median(dr),
        "madvise_unregistered_4k",
        median(du),
    ));

    // Guarantee 3 over the VMA budget: a region watched as its whole VMA makes the other,
    // unregistered pages of that VMA pay the round trip too. madvise and munmap of such a page
    // vs a page of an unwatched mapping (the notifier is told to widen every watch).
    let wide = Notifier::new()?;
    wide.set_vma_budget(0);
    // Adjacent anonymous mappings merge into one VMA: fence each with a PROT_NONE page on both
    // sides so that the widened watch covers w's pages only.
    let vpages = cycles + 2;
    let fenced = || {
        let m = map((vpages + 2) * pg, 0);
        for g in [m, m + (vpages + 1) * pg] {
            // SAFETY: changes the protection of a benchmark-owned page.
            unsafe { libc::mprotect(g as *mut _, pg, libc::PROT_NONE) };
        }
        m + pg
    };
    let (w, u) = (fenced(), fenced());
    touch(w, vpages * pg);
    touch(u, vpages * pg);
    wide.register(w..w + pg, Cookie(1))?;
    assert!(wide.stats().wide_regions == 1, "the watch was not widened");
    let (mut wd, mut ud, mut wm, mut um) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 1..=cycles {
        let (a, b) = (w + i * pg, u + i * pg);
        let t = Instant::now();
        // SAFETY: benchmark-owned pages.
        unsafe { libc::madvise(a as *mut _, pg, libc::MADV_DONTNEED) };
        wd.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { libc::madvise(b as *mut _, pg, libc::MADV_DONTNEED) };
        ud.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        unmap(a, pg);
        wm.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        unmap(b, pg);
        um.push(t.elapsed().as_nanos() as f64);
    }
    rows.push(row(
        "madvise_unregistered_in_widened_vma_4k",
        median(wd),
        "madvise_unregistered_4k",
        median(ud),
    ));
    rows.push(row(
        "munmap_unregistered_in_widened_vma_4k",
        median(wm),
        "munmap_unregistered_4k",
        median(um),
    ));
    drop(wide);
    unmap(w - pg, (vpages + 2) * pg);
    unmap(u - pg, (vpages + 2) * pg);

    // Notifier register + unregister of one page, vs mlock + munlock of it.
    let p = map(pg, 0);
    touch(p, pg);
    let notifier: &Notifier = cache.notifier();
    let mut cookie = 1u64;
    let (reg, lock) = paired(
        51,
        200 / scale.min(10),
        || {
            cookie += 1;
            notifier
                .register(p..p + pg, Cookie(cookie))
                .expect("register");
            notifier.unregister(Cookie(cookie)).expect("unregister");
        },
        || {
            // SAFETY: benchmark-owned page.
            unsafe {
                libc::mlock(p as *const _, pg);
                libc::munlock(p as *const _, pg);
            }
        },
    );
    rows.push(row("register_unregister", reg, "mlock_munlock", lock));
    unmap(p, pg);
    drop(cache);
    unmap(buf, 1 << 20);

    // The C library's hit against the Rust hit, batch by batch (same region size, own caches).
    match crate::bench_c::CCache::new() {
        Ok(c) => {
            let rcache = Cache::new(NoopRegistrar, Config::default().merge_adjacent(false))?;
            let rb = map(1 << 20, 0);
            let cb = map(1 << 20, 0);
            touch(rb, 1 << 20);
            touch(cb, 1 << 20);
            drop(rcache.get(rb, 1 << 20)?);
            c.hit(cb, 1 << 20);
            let (c_ns, rust_ns) = paired(
                batches,
                per,
                || c.hit(cb + 8192, 4096),
                || {
                    let h = rcache
                        .get(black_box(rb + 8192), black_box(4096))
                        .expect("hit");
                    black_box(&h);
                },
            );
            rows.push(row("cache_hit_c", c_ns, "cache_hit_rust_paired", rust_ns));
            drop(c);
            drop(rcache);
            unmap(rb, 1 << 20);
            unmap(cb, 1 << 20);
        }
        Err(why) => eprintln!("umn bench: no cache_hit_c row: {why}"),
    }

    // 1K vs 1M cached regions: the same warm hit, and a hit rotating over 64 regions (the MRU
    // misses, so it goes through the index).
    let big = if quick { 20_000 } else { 1 << 20 };
    let (h1k, r1k) = hit_with_regions(1000, per, batches)?;
    let (h1m, r1m) = hit_with_regions(big, per, batches)?;
    rows.push(row("cache_hit_1m_vs_1k", h1m, "cache_hit_1k_regions", h1k));
    rows.push(row(
        "cache_hit_index_1m_vs_1k",
        r1m,
        "cache_hit_index_1k_regions",
        r1k,
    ));
    rows.push(region_bytes_row);
    // The eBPF programs (root): loaded and detached twice.
    match crate::bench_ebpf::rows(2_000 / scale) {
        Ok(r) => rows.extend(r),
        Err(e) => eprintln!("umn bench: no ebpf rows: {e}"),
    }
    // Each backend's munmap/madvise rows (registered vs unregistered, libc vs raw syscall):
    // `umn bench --backends`, every backend in a process of its own.
    Ok(rows)
}

/// ns per hit (aggregate over `threads` threads hitting the same region, `ops` hits each).
fn threads_hit(cache: &Cache<NoopRegistrar>, buf: usize, threads: usize, ops: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        let barrier = Barrier::new(threads);
        // Each thread times itself; the run lasts from the first start to the last end.
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        drop(cache.get(buf, 4096).expect("warm"));
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..ops {
                            let h = cache
                                .get(black_box(buf + 8192), black_box(4096))
                                .expect("hit");
                            black_box(&h);
                        }
                        (start, Instant::now())
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("worker"))
                .collect()
        });
        let first = spans.iter().map(|s| s.0).min().expect("threads");
        let last = spans.iter().map(|s| s.1).max().expect("threads");
        best = best.min((last - first).as_nanos() as f64 / (ops * threads) as f64);
    }
    best
}

/// With `n` one-page regions cached: (warm hit ns, hit rotating over 64 regions ns).
fn hit_with_regions(
    n: usize,
    per: usize,
    batches: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let pg = page();
    let cache = Cache::new(
        NoopRegistrar,
        Config::default().merge_adjacent(false).max_regions(n + 1),
    )?;
    let arena = map(n * pg, 0);
    for i in 0..n {
        drop(cache.get(arena + i * pg, pg)?);
    }
    let warm = arena + (n / 2) * pg;
    drop(cache.get(warm, 64)?);
    let stride = (n / 64).max(1);
    let mut i = 0usize;
    let (hit, rot) = paired(
        batches,
        per,
        || {
            let h = cache.get(black_box(warm), black_box(64)).expect("hit");
            black_box(&h);
        },
        || {
            i = (i + 1) % 64;
            let h = cache
                .get(black_box(arena + (i * stride) * pg), black_box(64))
                .expect("hit");
            black_box(&h);
        },
    );
    drop(cache);
    unmap(arena, n * pg);
    Ok((hit, rot))
}

/// Mean ns of a miss (get + drop) on `n` never-seen pages, one every other page of one mapping,
/// through a fresh cache over `registrar` that keeps them all.
fn misses<R: Registrar>(registrar: R, n: usize) -> Result<f64, Box<dyn std::error::Error>>
where
    R::Key: Send + Sync,
{
    let pg = page();
    let arena = map(2 * n * pg, 0);
    let cache = Cache::new(registrar, Config::default().max_regions(1 << 21))?;
    let t = Instant::now();
    for i in 0..n {
        drop(cache.get(arena + 2 * i * pg, pg)?);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(cache.stats().misses, n as u64, "every get was a miss");
    drop(cache);
    unmap(arena, 2 * n * pg);
    Ok(ns)
}

/// `cache_miss_vs_floor{,4}` only, `rounds` times over (each round a fresh cache and fresh
/// mappings, as in `run`), with the medians of the rounds' figures: the miss's one figure
/// (issue 23) without the minutes of the whole bench. Then `cache_miss_hybrid_vs_floor`, the
/// same miss on the hybrid backend against the same three calls (its watch makes them too; the
/// filter's update is user-space work), where hybrid starts: last, since it patches this
/// process's libc for good. After each backend's miss rows, `register_vs_floor` and
/// `register_hybrid_vs_floor`: the notifier's registration of the same pages alone, against the
/// same floor, so that what the cache's own bookkeeping adds is the difference. Each round's
/// ratio goes to stderr.
pub fn miss_rows(rounds: usize) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let uffd = miss_rounds(rounds, Backend::Userfaultfd, Misser::Cache)?;
    let uffd_reg = miss_rounds(rounds, Backend::Userfaultfd, Misser::Notifier)?;
    let mut rows = vec![
        row("cache_miss_vs_floor", uffd.miss, "miss_floor3", uffd.floor3),
        row(
            "cache_miss_vs_floor4",
            uffd.miss,
            "miss_floor4",
            uffd.floor4,
        ),
    ];
    breakdown_rows(
        &mut rows,
        &uffd,
        ["uffd_miss_calls_inside", "uffd_miss_own_work"],
    );
    rows.push(row(
        "register_vs_floor",
        uffd_reg.miss,
        "miss_floor3",
        uffd_reg.floor3,
    ));
    match Notifier::with_backend(Backend::Hybrid) {
        Ok(n) => drop(n),
        Err(e) => {
            eprintln!("hybrid does not start here ({e}): no hybrid miss row");
            return Ok(rows);
        }
    }
    let hybrid = miss_rounds(rounds, Backend::Hybrid, Misser::Cache)?;
    let hybrid_reg = miss_rounds(rounds, Backend::Hybrid, Misser::Notifier)?;
    rows.push(row(
        "cache_miss_hybrid_vs_floor",
        hybrid.miss,
        "miss_floor3",
        hybrid.floor3,
    ));
    breakdown_rows(
        &mut rows,
        &hybrid,
        ["hybrid_miss_calls_inside", "hybrid_miss_own_work"],
    );
    rows.push(row(
        "register_hybrid_vs_floor",
        hybrid_reg.miss,
        "miss_floor3",
        hybrid_reg.floor3,
    ));
    Ok(rows)
}

/// With the `call-times` feature: the miss's ratio to its floor, split in two rows against the
/// same floor, which add up to it: the three calls as the miss made them, and the rest (the
/// library's own work).
fn breakdown_rows(rows: &mut Vec<Row>, f: &MissFloor, names: [&'static str; 2]) {
    if let Some(inside) = f.inside {
        let calls: f64 = inside.iter().sum();
        rows.push(row(names[0], calls, "miss_floor3", f.floor3));
        rows.push(row(names[1], f.miss - calls, "miss_floor3", f.floor3));
    }
}

/// `rounds` rounds of [`miss_vs_floor`] on `backend`: the medians of the rounds' figures.
fn miss_rounds(
    rounds: usize,
    backend: Backend,
    what: Misser,
) -> Result<MissFloor, Box<dyn std::error::Error>> {
    let mut all = Vec::new();
    for r in 0..rounds {
        let f = miss_vs_floor(40, 50, Some(backend), what)?;
        eprintln!(
            "{backend:?} {} round {r}: {:.0} ns, floor3 {:.0} ns, ratio {:.2}",
            what.name(),
            f.miss,
            f.floor3,
            f.miss / f.floor3
        );
        if let Some(inside) = f.inside {
            eprintln!(
                "  the calls inside the miss (back to back): register {:.0} ({:.0}), mask pair \
                 {:.0} ({:.0}), query {:.0} ({:.0}) ns; the library's own work {:.0} ns",
                inside[0],
                f.calls[0],
                inside[1],
                f.calls[1],
                inside[2],
                f.calls[2],
                f.miss - inside.iter().sum::<f64>()
            );
        }
        all.push(f);
    }
    let med = |get: &dyn Fn(&MissFloor) -> f64| median(all.iter().map(get).collect());
    let part = |i: usize| med(&|f| f.calls[i]);
    Ok(MissFloor {
        miss: med(&|f| f.miss),
        floor3: med(&|f| f.floor3),
        floor4: med(&|f| f.floor4),
        calls: [part(0), part(1), part(2)],
        inside: all[0].inside.map(|_| {
            let inside = |i: usize| med(&|f| f.inside.map_or(0.0, |c| c[i]));
            [inside(0), inside(1), inside(2)]
        }),
    })
}

/// What [`miss_vs_floor`] times against the floor.
#[derive(Clone, Copy, Debug)]
enum Misser {
    /// A cache miss (`get` + drop, no-op registrar).
    Cache,
    /// The notifier's registration alone (`Notifier::register` of the same page, kept),
    /// through the cache's own notifier: what the cache's bookkeeping adds is the difference.
    Notifier,
}

impl Misser {
    fn name(self) -> &'static str {
        match self {
            Misser::Cache => "cache miss",
            Misser::Notifier => "notifier register",
        }
    }
}

/// A cache miss and its kernel floor, measured in alternating batches (medians of the batches'
/// means, ns).
struct MissFloor {
    /// The timed operation ([`Misser`]), ns.
    miss: f64,
    /// `UFFDIO_REGISTER` of a fresh page, a signal-mask pair and `PROCMAP_QUERY`: the kernel
    /// calls a miss on never-watched memory makes (bench/miss_floor.c).
    floor3: f64,
    /// The same and the `msync` mapped check a miss made before issue 23.
    floor4: f64,
    /// floor3's parts: `UFFDIO_REGISTER`, the mask pair, `PROCMAP_QUERY`.
    calls: [f64; 3],
    /// The same calls as the misses made them (feature `call-times`), per miss.
    inside: Option<[f64; 3]>,
}

/// `batches` rounds of `per` misses (no-op registrar, one page every other page, regions kept)
/// and `per` floor rounds (the same calls made directly, watched through a userfaultfd context
/// of the bench's own, as the library opens its own), one batch of each after the other: both
/// see the machine in the same state, and the per-batch ratio does not drift with it. The
/// cache's notifier runs on `backend`, `None`: `Notifier::new()`.
///
/// The floor's pages and the misses' pages are interleaved in one mapping ([`LANES`]): what
/// `UFFDIO_REGISTER` costs depends on where the mapping lies among the process's others
/// (`bench/register_placement.c`: the same calls on two mappings of one process differ by up to
/// 2×, either way round), so a floor measured on a mapping of its own measured that mapping's
/// place as much as the calls. The floor's three calls are timed as a batch, as the misses
/// are, so the clock is read as often on both sides; the per-call parts (and `msync`, for
/// `floor4`) come from a pass of their own, on pages of their own lane.
fn miss_vs_floor(
    batches: usize,
    per: usize,
    backend: Option<Backend>,
    what: Misser,
) -> Result<MissFloor, Box<dyn std::error::Error>> {
    const PROCMAP_QUERY: libc::c_ulong = 0xc068_6611; // _IOWR('f', 17, struct procmap_query)
    /// Pages of the mapping per index `k`: the floor and the miss at `LANES * k` and `+ 4`
    /// (which at which alternates every two batches), the per-call pass at `+ 2`; the odd
    /// pages stay unwatched, so every registration splits one page out of its VMA, as a miss
    /// on every other page does.
    const LANES: usize = 6;
    #[repr(C)]
    #[derive(Default)]
    struct Query {
        size: u64,
        flags: u64,
        addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        page_size: u64,
        offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        name_size: u32,
        build_id_size: u32,
        name_addr: u64,
        build_id_addr: u64,
    }
    let pg = page();
    let n = batches * per;
    // The library's events and WP_ASYNC, non-blocking: nobody reads its messages.
    let uffd = crate::floors::RawUffd::open(true)?;
    let maps = std::fs::File::open("/proc/self/maps")?;
    let query = |at: usize| -> Result<(), Box<dyn std::error::Error>> {
        let mut q = Query {
            size: std::mem::size_of::<Query>() as u64,
            flags: 0x10,
            addr: at as u64,
            ..Query::default()
        };
        // SAFETY: PROCMAP_QUERY reads and writes one struct (no name buffers asked for).
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&maps),
                PROCMAP_QUERY,
                &mut q,
            )
        };
        // ENOTTY: a kernel before 6.11 (or `umn no-procmap-query`): the floor's third call is
        // the failing ioctl, which the library's misses then no longer make.
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOTTY) {
            return Err(format!(
                "PROCMAP_QUERY (Linux 6.11+): {}",
                std::io::Error::last_os_error()
            )
            .into());
        }
        Ok(())
    };
    let arena = map(LANES * n * pg, 0);
    let page_at = |lane: usize, k: usize| arena + (LANES * k + 2 * lane) * pg;
    let cache = Cache::with_notifier(
        match backend {
            Some(b) => Notifier::with_backend(b)?,
            None => Notifier::new()?,
        },
        NoopRegistrar,
        Config::default().max_regions(1 << 21),
    );
    let (mut misses_ns, mut f3, mut f4) = (Vec::new(), Vec::new(), Vec::new());
    let (mut calls, mut inside) = (Vec::new(), Vec::new());
    for b in 0..batches {
        let ks = b * per..(b + 1) * per;
        let per_f = per as f64;
        // Which side goes first alternates every batch, and which lane each takes every two,
        // so neither always finds the other's pages split, nor always has the same lane.
        let (floor_lane, miss_lane) = if b / 2 % 2 == 0 { (0, 2) } else { (2, 0) };
        let floor_pass = || -> Result<f64, Box<dyn std::error::Error>> {
            let t = Instant::now();
            for k in ks.clone() {
                let at = page_at(floor_lane, k);
                uffd.register(at)?;
                crate::floors::restore_signals(&crate::floors::block_signals());
                query(at)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / per_f)
        };
        let floor_first = b % 2 == 0;
        if floor_first {
            f3.push(floor_pass()?);
        }
        let before = call_times();
        let t = Instant::now();
        match what {
            Misser::Cache => {
                for k in ks.clone() {
                    drop(cache.get(page_at(miss_lane, k), pg)?);
                }
            }
            Misser::Notifier => {
                for k in ks.clone() {
                    let at = page_at(miss_lane, k);
                    // Kept, as the cache keeps its regions; cookies without the cache's bit.
                    black_box(
                        cache
                            .notifier()
                            .register(at..at + pg, Cookie(k as u64 + 1))?,
                    );
                }
            }
        }
        misses_ns.push(t.elapsed().as_nanos() as f64 / per_f);
        if let (Some(before), Some(after)) = (before, call_times()) {
            inside.push([0, 1, 2].map(|i| (after[i] - before[i]) as f64 / per_f));
        }
        if !floor_first {
            f3.push(floor_pass()?);
        }
        // The parts, call by call, and msync (floor4), on the lane between.
        let (mut reg, mut sync, mut mask, mut qry) = (0u128, 0u128, 0u128, 0u128);
        for k in ks.clone() {
            let at = page_at(1, k);
            let t = Instant::now();
            let rc = uffd.register(at);
            reg += t.elapsed().as_nanos();
            rc?;
            let t = Instant::now();
            // SAFETY: msync with flags 0 only checks the range is mapped.
            unsafe { libc::msync(at as *mut libc::c_void, pg, 0) };
            sync += t.elapsed().as_nanos();
            let t = Instant::now();
            crate::floors::restore_signals(&crate::floors::block_signals());
            mask += t.elapsed().as_nanos();
            let t = Instant::now();
            let rc = query(at);
            qry += t.elapsed().as_nanos();
            rc?;
        }
        let last = *f3.last().expect("pushed above");
        f4.push(last + sync as f64 / per_f);
        calls.push([reg, mask, qry].map(|ns| ns as f64 / per_f));
    }
    drop(cache);
    // The context first: it asked for unmap events, and nobody reads them here, so a munmap of
    // pages it still watches would wait for a reader forever.
    drop(uffd);
    unmap(arena, LANES * n * pg);
    let part = |v: &[[f64; 3]], i: usize| median(v.iter().map(|c| c[i]).collect());
    Ok(MissFloor {
        miss: median(misses_ns),
        floor3: median(f3),
        floor4: median(f4),
        calls: [0, 1, 2].map(|i| part(&calls, i)),
        inside: (!inside.is_empty()).then(|| [0, 1, 2].map(|i| part(&inside, i))),
    })
}

/// The library's time in the calls a miss makes so far (feature `call-times`): register, mask
/// (both halves), query.
fn call_times() -> Option<[u64; 3]> {
    #[cfg(feature = "call-times")]
    return Some(ummunotify::call_times::totals());
    #[cfg(not(feature = "call-times"))]
    None
}

/// `VmRSS` of this process, bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// RSS per registered one-page region with `n` regions on adjacent untouched pages, against a
/// `HashMap<u64, (u64, u64)>` of the same cookies and ranges (what a plain map of the bare
/// facts costs), measured one after the other.
fn region_bytes(n: usize) -> Result<Row, Box<dyn std::error::Error>> {
    // glibc raises its mmap threshold when a large block is freed, and then serves large blocks
    // from memory already resident, which RSS does not see: fix it at its default.
    // SAFETY: mallopt only changes the allocator's tuning.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
    let pg = page();
    let notifier = Notifier::new()?;
    let arena = map(n * pg, 0);
    notifier.register(arena..arena + pg, Cookie(u64::MAX))?;
    notifier.unregister(Cookie(u64::MAX))?;
    let before = rss();
    for i in 0..n {
        let a = arena + i * pg;
        notifier.register(a..a + pg, Cookie(i as u64))?;
    }
    let ours = rss().saturating_sub(before) as f64 / n as f64;
    drop(notifier);
    unmap(arena, n * pg);
    let before = rss();
    let mut m: HashMap<u64, (u64, u64)> = HashMap::new();
    for i in 0..n as u64 {
        let a = arena as u64 + i * pg as u64;
        m.insert(i, (a, a + pg as u64));
    }
    let theirs = rss().saturating_sub(before) as f64 / n as f64;
    black_box(&m);
    Ok(row("region_bytes", ours, "hashmap_cookie_to_range", theirs))
}

/// The rows as a table.
pub fn to_table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<28} {:>12}  {:<30} {:>10} {:>8}\n",
        "name", "ns/op", "baseline", "ns", "ratio"
    );
    for r in rows {
        s += &format!(
            "{:<28} {:>12.1}  {:<30} {:>10.1} {:>8.2}\n",
            r.name, r.ns_per_op, r.baseline_name, r.baseline, r.ratio
        );
    }
    s
}

/// The rows as `{"results": [{"name", "ns_per_op", "baseline", "baseline_name", "ratio"}]}`, one
/// row per line ([`crate::rows_json`]).
pub fn to_json(rows: &[Row]) -> String {
    crate::rows_json::results(rows)
}

/// `n` extra mappings (VMAs) in the process while it lives: one mapping of `n` pages whose
/// every other page is made read-only, so the kernel keeps `n` VMAs, read-only and read-write
/// in turn (neighbours with different protections never merge). What a miss costs as
/// the process's mappings grow (issue 41): without `PROCMAP_QUERY`, a lookup that reads
/// `/proc/self/maps` grows with them.
pub(crate) struct ExtraMappings {
    addr: usize,
    len: usize,
}

impl ExtraMappings {
    pub(crate) fn new(n: usize) -> ExtraMappings {
        if n == 0 {
            return ExtraMappings { addr: 0, len: 0 };
        }
        let pg = page();
        let len = n * pg;
        let addr = map(len, 0);
        for i in (1..n).step_by(2) {
            // SAFETY: changes the protection of a page of our own mapping (never touched).
            let rc = unsafe {
                libc::mprotect((addr + i * pg) as *mut libc::c_void, pg, libc::PROT_READ)
            };
            assert_eq!(rc, 0, "mprotect: {}", std::io::Error::last_os_error());
        }
        eprintln!("{n} extra mappings in the process");
        ExtraMappings { addr, len }
    }
}

impl Drop for ExtraMappings {
    fn drop(&mut self) {
        if self.len > 0 {
            unmap(self.addr, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bench/ucx_compare.sh and docs read this: the bytes are kept.
    #[test]
    fn json_is_unchanged() {
        let rows = vec![
            row("cache_hit", 12.3456, "hashmap_lookup", 10.0),
            row("region_bytes", 48.0, "hashmap_cookie_to_range", 96.0),
        ];
        let json = to_json(&rows);
        assert_eq!(json, GOLDEN, "\n{json}");
        assert_eq!(to_json(&[]), EMPTY);
    }

    const GOLDEN: &str = r#"{"results": [
  {"name": "cache_hit", "ns_per_op": 12.35, "baseline": 10.00, "baseline_name": "hashmap_lookup", "ratio": 1.235},
  {"name": "region_bytes", "ns_per_op": 48.00, "baseline": 96.00, "baseline_name": "hashmap_cookie_to_range", "ratio": 0.500}
]}"#;
    const EMPTY: &str = r#"{"results": [
  
]}"#;
}
