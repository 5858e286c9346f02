//! What the monitor costs libfabric, as ratios to baselines measured in the same run:
//!
//! * `valid()` through the export_ops (hash lookup + region check) against the notifier's bare
//!   `is_valid` and against one uncontended mutex lock/unlock (libfabric holds `mm_lock` around
//!   every `valid` anyway), with 1, 1024 and 8192 subscriptions;
//! * the delivery delay (`munmap` called → `notify` called) and the watched `munmap` itself,
//!   against an unwatched `munmap` of the same size.
//!
//! `cargo run --release -p ummunotify-fabric --example monitor_cost` (needs userfaultfd).
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ummunotify_fabric::abi::{FiOpsMemNotify, FidMemMonitor};
use ummunotify_fabric::Monitor;

static EPOCH: OnceLock<Instant> = OnceLock::new();
static NOTIFIED_AT: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn notify(_: *mut FidMemMonitor, _: *const c_void, _: usize) {
    let t = EPOCH.get().unwrap().elapsed().as_nanos() as u64;
    NOTIFIED_AT.store(t.max(1), SeqCst);
}

fn ns_per<F: FnMut()>(iters: u32, mut f: F) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(iters)
}

fn map(len: usize) -> *mut c_void {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p
}

fn main() {
    EPOCH.get_or_init(Instant::now);
    let monitor = Monitor::new();
    let raw = monitor.as_raw();
    let mut import_ops = FiOpsMemNotify {
        size: std::mem::size_of::<FiOpsMemNotify>(),
        notify: Some(notify),
    };
    // SAFETY: not started yet; libfabric's import does this write.
    let ops = unsafe {
        (*raw).import_ops = &mut import_ops;
        &*(*raw).export_ops
    };
    // SAFETY: the monitor's own entry points with its pointer, on mapped memory.
    assert_eq!(unsafe { (ops.start.unwrap())(raw) }, 0);
    let page = 4096;
    let pool = map(8192 * page);
    let iters = 2_000_000;
    let mm_lock = Mutex::new(());
    println!("valid() per call, ratios to baselines measured in this run:");
    for &n in &[1usize, 1024, 8192] {
        for i in 0..n {
            // SAFETY: as above.
            let rc = unsafe {
                (ops.subscribe.unwrap())(raw, pool.cast::<u8>().add(i * page).cast(), page)
            };
            assert_eq!(rc, 0);
        }
        let at = pool
            .cast::<u8>()
            .wrapping_add((n / 2) * page)
            .cast::<c_void>();
        // SAFETY: as above.
        let valid = ns_per(iters, || unsafe {
            black_box((ops.valid.unwrap())(raw, black_box(at), page));
        });
        let notifier = monitor.notifier().unwrap();
        let region = notifier.register(at as usize..at as usize + 1, ummunotify::Cookie(u64::MAX));
        let region = region.expect("register");
        let bare = ns_per(iters, || {
            black_box(notifier.is_valid(black_box(region)));
        });
        notifier.unregister(ummunotify::Cookie(u64::MAX)).unwrap();
        let lock = ns_per(iters, || {
            drop(black_box(mm_lock.lock().unwrap()));
        });
        println!(
            "  {n:5} subscriptions: valid {valid:6.1} ns = {:4.1} x notifier is_valid ({bare:.1} ns), \
             {:4.1} x a mutex lock+unlock ({lock:.1} ns)",
            valid / bare,
            valid / lock
        );
        for i in 0..n {
            // SAFETY: as above.
            unsafe {
                (ops.unsubscribe.unwrap())(raw, pool.cast::<u8>().add(i * page).cast(), page)
            };
        }
    }

    let rounds = 2000;
    let (mut delay, mut watched, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let p = map(16 * page);
        // SAFETY: as above.
        assert_eq!(unsafe { (ops.subscribe.unwrap())(raw, p, 16 * page) }, 0);
        NOTIFIED_AT.store(0, SeqCst);
        let called = EPOCH.get().unwrap().elapsed().as_nanos() as u64;
        // SAFETY: our own mapping.
        unsafe { libc::munmap(p, 16 * page) };
        let returned = EPOCH.get().unwrap().elapsed().as_nanos() as u64;
        watched.push((returned - called) as f64);
        let deadline = Instant::now() + Duration::from_secs(10);
        while NOTIFIED_AT.load(SeqCst) == 0 {
            assert!(Instant::now() < deadline, "no notify");
            std::hint::spin_loop();
        }
        delay.push(NOTIFIED_AT.load(SeqCst).saturating_sub(called) as f64);
        let q = map(16 * page);
        let t = Instant::now();
        // SAFETY: our own mapping, not subscribed.
        unsafe { libc::munmap(q, 16 * page) };
        plain.push(t.elapsed().as_nanos() as f64);
    }
    for v in [&mut delay, &mut watched, &mut plain] {
        v.sort_by(f64::total_cmp);
    }
    let med = |v: &[f64]| v[v.len() / 2];
    let p90 = |v: &[f64]| v[v.len() * 9 / 10];
    println!(
        "16-page munmap, {rounds} rounds, medians (p90) as ratios to an unwatched munmap of \
         {:.1} us:\n  watched munmap {:.1} x ({:.1} us, p90 {:.1} us)\n  munmap called -> \
         notify called {:.1} x ({:.1} us, p90 {:.1} us)",
        med(&plain) / 1e3,
        med(&watched) / med(&plain),
        med(&watched) / 1e3,
        p90(&watched) / 1e3,
        med(&delay) / med(&plain),
        med(&delay) / 1e3,
        p90(&delay) / 1e3
    );
    // SAFETY: as above.
    unsafe { (ops.stop.unwrap())(raw) };
}
