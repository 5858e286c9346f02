//! The monitor's `export_ops`, driven in the order and under the locking libfabric's MR cache
//! uses (see `tests/common/mod.rs`), against the real kernel: every change kind of the
//! catalogue, overlapping and identical subscriptions, unsubscribe racing an invalidation,
//! unsubscribe from inside `notify` (libfabric 2.1+), a user thread unmapping while it holds
//! `mm_lock`, and fork.
mod common;

use std::process::Command;
use std::sync::{Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{map, page, unmap, Driver, FabricWatcher, Flavour};
use ummunotify_fabric::Monitor;
use ummunotify_testkit::changes::{
    case_json, child_case_from_env, print_child_report, run_case, run_in_child, CaseReport,
    ChangeKind,
};
use ummunotify_testkit::require::or_skip;

/// One test at a time: several map and unmap memory and count notifications, and a child spawned
/// by one keeps the others' userfaultfd contexts alive until its exec.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each case on a fresh monitor, so no subscription of one case can notify in another.
fn run_one(kind: ChangeKind) -> std::io::Result<CaseReport> {
    let driver = Driver::new(Flavour::V1_17);
    let report = run_case(kind, &mut FabricWatcher::new(&driver));
    // Whatever the case left subscribed (libfabric 1.17 never unsubscribes) is delivered or
    // dropped before the monitor stops: stop must not hang on it.
    driver.settle();
    report
}

fn check(report: &CaseReport) {
    let text = case_json(report);
    eprintln!("{text}");
    assert!(
        report.passed(),
        "{}: {:?}\n{text}",
        report.kind,
        report.problems
    );
    if report.expected {
        assert!(report.detected, "{}: {text}", report.kind);
        assert_eq!(report.stale_uses, 0, "{text}");
    } else {
        // A kind userfaultfd is never told of (shmdt, MADV_GUARD_INSTALL, ...): libfabric can
        // not learn of it through this monitor either, and the table says so.
        assert!(!report.detected && report.stale_uses > 0, "{text}");
    }
}

/// Runs `kind` in a fresh process of this test binary (only `child_entry` runs there): the
/// case maps new memory at the address it just unmapped (x == y), and in a shared process
/// another test's thread stack or malloc arena may land in that hole first.
fn in_child(kind: ChangeKind) -> Option<CaseReport> {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"]);
    or_skip(kind.name(), run_in_child(kind, cmd))
}

#[test]
fn every_catalogue_change_reaches_valid_and_notify() {
    if child_case_from_env().is_some() {
        return;
    }
    // Serial too: a child being spawned holds copies of this process's fds until its exec, and a
    // userfaultfd context closed meanwhile by another test stays alive (and keeps its pages
    // registered: the next registration there gets EBUSY) until the copy is closed.
    let _g = serial();
    for &kind in ChangeKind::ALL {
        if let Some(report) = in_child(kind) {
            check(&report);
        }
    }
}

/// Entry point of the child process `run_in_child` starts; a no-op in a normal test run.
#[test]
fn child_entry() {
    if let Some(kind) = child_case_from_env() {
        print_child_report(&run_one(kind));
    }
}

#[test]
fn identical_subscriptions_each_get_one_notify() {
    let _g = serial();
    let d = Driver::new(Flavour::V1_17);
    let r = map(4);
    // Two MR caches (two domains) cache the same buffer: two subscribes of one range.
    assert_eq!(d.register(r.clone()), 0);
    assert_eq!(d.register(r.clone()), 0);
    // Not shared: each watches the memory mapped when it was made (see `Sub` in monitor.rs).
    assert_eq!(d.monitor.stats().subscriptions, 2);
    assert_eq!(d.monitor.notifier().unwrap().stats().regions, 2);
    assert!(d.valid(r.clone()));
    unmap(r.start + page()..r.start + 2 * page());
    assert!(!d.valid(r.clone()), "valid() after munmap returned");
    d.settle();
    let hole = r.start + page()..r.start + 2 * page();
    assert_eq!(
        d.notified(),
        vec![hole.clone(), hole],
        "one notify per subscription, with the unmapped range"
    );
    assert_eq!(d.mm_lock().dropped.len(), 2, "both cache entries dropped");
    assert_eq!(d.monitor.stats().subscriptions, 0);
    assert_eq!(d.monitor.notifier().unwrap().stats().regions, 0);
    unmap(r.start..r.start + page());
    unmap(r.start + 2 * page()..r.end);
}

#[test]
fn overlapping_subscriptions_each_get_their_clipped_range() {
    let _g = serial();
    let d = Driver::new(Flavour::V1_17);
    let m = map(12);
    let p = page();
    let a = m.start..m.start + 8 * p;
    let b = m.start + 4 * p..m.start + 12 * p;
    assert_eq!(d.register(a.clone()), 0);
    assert_eq!(d.register(b.clone()), 0);
    assert_eq!(d.monitor.stats().subscriptions, 2);
    // Only `a` is touched.
    unmap(m.start..m.start + 2 * p);
    assert!(!d.valid(a.clone()));
    assert!(d.valid(b.clone()), "b does not cover the unmapped pages");
    d.settle();
    assert_eq!(d.notified(), vec![m.start..m.start + 2 * p]);
    // Both are touched; `a` is gone already.
    unmap(m.start + 6 * p..m.start + 7 * p);
    assert!(!d.valid(b.clone()));
    d.settle();
    assert_eq!(
        d.notified(),
        vec![m.start..m.start + 2 * p, m.start + 6 * p..m.start + 7 * p]
    );
    assert_eq!(d.monitor.stats().subscriptions, 0);
    unmap(m.start + 2 * p..m.start + 6 * p);
    unmap(m.start + 7 * p..m.end);
}

#[test]
fn unsubscribe_inside_notify_as_libfabric_2_1_does() {
    let _g = serial();
    let d = Driver::new(Flavour::V2_1);
    let r = map(4);
    let p = page();
    let inner = r.start + p..r.start + 3 * p;
    assert_eq!(d.register(r.clone()), 0);
    assert_eq!(d.register(inner.clone()), 0);
    unmap(r.start + 2 * p..r.start + 3 * p);
    d.settle();
    let mut got = d.notified();
    got.sort_by_key(|n| n.start);
    // One notify per subscription, each with the unmapped page (clipped to it).
    assert_eq!(
        got,
        vec![
            r.start + 2 * p..r.start + 3 * p,
            r.start + 2 * p..r.start + 3 * p
        ]
    );
    let s = d.monitor.stats();
    assert_eq!(s.subscriptions, 0);
    assert_eq!(
        (s.unsubscribes, s.unsubscribes_unknown),
        (2, 0),
        "the re-entrant unsubscribes found their subscriptions (kept until notify returned) and \
         ended them: {s:?}"
    );
    unmap(r.start..r.start + 2 * p);
    unmap(r.start + 3 * p..r.end);
}

#[test]
fn unsubscribe_racing_an_invalidation() {
    let _g = serial();
    let d = Driver::new(Flavour::V2_1);
    let rounds = 200;
    let mut raced_notifies = 0;
    for _ in 0..rounds {
        let r = map(2);
        assert_eq!(d.register(r.clone()), 0);
        let before = d.notified().len();
        let start = Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                start.wait();
                d.evict(r.clone()); // unsubscribe under mm_lock
            });
            s.spawn(|| {
                start.wait();
                unmap(r.clone());
            });
        });
        d.settle();
        let n = d.notified().len() - before;
        assert!(n <= 1, "at most one notify per subscription, got {n}");
        raced_notifies += n;
        assert_eq!(d.monitor.stats().subscriptions, 0);
        assert!(!d.valid(r.clone()));
    }
    assert_eq!(d.monitor.notifier().unwrap().stats().regions, 0);
    eprintln!(
        "unsubscribe vs munmap: {raced_notifies} of {rounds} rounds delivered a notify (the \
         invalidation came first), the others ended by unsubscribe"
    );
}

#[test]
fn a_thread_holding_mm_lock_can_unmap_registered_memory() {
    let _g = serial();
    let d = Driver::new(Flavour::V1_17);
    let r = map(4);
    assert_eq!(d.register(r.clone()), 0);
    {
        // libfabric frees (and the allocator trims) under mm_lock: the unmapping call must
        // return (the notifier's monitor thread needs no lock of libfabric's), the delivery
        // thread waits for mm_lock.
        let tree = d.mm_lock();
        unmap(r.clone());
        assert!(
            !d.valid_locked(r.clone()),
            "valid() under mm_lock after munmap returned"
        );
        assert!(
            tree.notified.is_empty(),
            "notify cannot run while mm_lock is held"
        );
        // A new entry on the same address range (x == y) is a fresh subscription once the old
        // one is delivered; before that, valid() stays false for the range.
        let again = map(4);
        drop(tree);
        d.settle();
        assert_eq!(d.notified(), vec![r.clone()]);
        unmap(again);
    }
}

#[test]
fn valid_is_false_for_ranges_never_subscribed_and_bad_input() {
    let _g = serial();
    let d = Driver::new(Flavour::V1_17);
    let r = map(2);
    assert!(!d.valid(r.clone()), "never subscribed");
    assert_eq!(d.register(r.start..r.start), -libc::EINVAL, "empty range");
    // Page 1: below vm.mmap_min_addr, nothing is ever mapped there without MAP_FIXED.
    let hole = page()..2 * page();
    assert_eq!(d.register(hole), -libc::EFAULT, "unmapped range");
    assert_eq!(d.monitor.stats().subscriptions, 0);
    assert_eq!(d.register(r.clone()), 0);
    assert!(d.valid(r.clone()));
    assert!(
        !d.valid(r.start..r.start + page()),
        "a sub-range is not a subscription"
    );
    unmap(r);
}

#[test]
fn the_oldest_subscription_makes_room_past_the_limit() {
    let _g = serial();
    // libfabric 1.17 never unsubscribes: without a limit, ranges evicted from its cache would
    // stay subscribed until their memory changed.
    let d = Driver::with_monitor(Flavour::V1_17, Monitor::with_max_subscriptions(4));
    let m = map(6);
    let p = page();
    let ranges: Vec<_> = (0..6)
        .map(|i| m.start + i * p..m.start + (i + 1) * p)
        .collect();
    for r in &ranges {
        assert_eq!(d.register(r.clone()), 0);
    }
    d.settle();
    let s = d.monitor.stats();
    assert_eq!((s.subscriptions, s.evictions), (4, 2), "{s:?}");
    assert_eq!(
        d.notified(),
        ranges[..2].to_vec(),
        "the two oldest, with their ranges"
    );
    assert_eq!(
        d.mm_lock().dropped,
        ranges[..2].to_vec(),
        "their cache entries dropped"
    );
    for (i, r) in ranges.iter().enumerate() {
        assert_eq!(d.valid(r.clone()), i >= 2, "range {i}");
    }
    assert_eq!(d.monitor.notifier().unwrap().stats().regions, 4);
    unmap(m);
}

#[test]
fn stop_and_start_again() {
    let _g = serial();
    let d = Driver::new(Flavour::V1_17);
    let r = map(2);
    assert_eq!(d.register(r.clone()), 0);
    // SAFETY: the monitor's own stop/start, as libfabric's last cache closing and a new one.
    unsafe { (d.ops().stop.unwrap())(d.raw()) };
    assert!(!d.monitor.stats().started);
    assert!(!d.valid(r.clone()), "nothing is valid while stopped");
    assert_ne!(
        d.register(r.clone()),
        0,
        "subscribe while stopped fails (entry uncached)"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { (d.ops().start.unwrap())(d.raw()) }, 0);
    assert_eq!(d.register(r.clone()), 0);
    assert!(d.valid(r.clone()));
    unmap(r.clone());
    assert!(!d.valid(r.clone()));
    d.settle();
    assert_eq!(d.notified_for(&r), vec![r]);
}

/// Waits for `pid` at most 60 s (a hang guard); its exit status.
fn wait_child(pid: libc::pid_t) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if rc == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
        if Instant::now() >= deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn fork_child_never_trusts_the_parent_and_starts_afresh() {
    let _g = serial();
    let d = Driver::new(Flavour::V1_17);
    let r = map(2);
    assert_eq!(d.register(r.clone()), 0);
    assert!(d.valid(r.clone()));
    // SAFETY: the child only calls the monitor, mmap/munmap, and _exit; malloc is fork-safe in
    // glibc.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = (|| {
            // SAFETY: the monitor's own entry points.
            let ops = d.ops();
            let raw = d.raw();
            let at = r.start as *const libc::c_void;
            unsafe {
                if (ops.valid.unwrap())(raw, at, r.len()) {
                    return 1; // trusted the parent's registration
                }
                if (ops.subscribe.unwrap())(raw, at, r.len()) == 0 {
                    return 2; // subscribed on the parent's state
                }
                (ops.stop.unwrap())(raw); // must not hang on the parent's delivery thread
                if (ops.start.unwrap())(raw) != 0 {
                    return 3;
                }
                if (ops.subscribe.unwrap())(raw, at, r.len()) != 0 {
                    return 4;
                }
                if !(ops.valid.unwrap())(raw, at, r.len()) {
                    return 5;
                }
                libc::munmap(r.start as *mut libc::c_void, r.len());
                if (ops.valid.unwrap())(raw, at, r.len()) {
                    return 6;
                }
                (ops.stop.unwrap())(raw);
            }
            0
        })();
        // SAFETY: leave without running the parent's destructors or test harness.
        unsafe { libc::_exit(code) };
    }
    assert_eq!(wait_child(pid), 0, "child failed (see the codes above)");
    // The parent is unaffected by the child's munmap of its own copy.
    assert!(d.valid(r.clone()));
    unmap(r.clone());
    assert!(!d.valid(r.clone()));
    d.settle();
    assert_eq!(d.notified_for(&r), vec![r]);
}

#[test]
fn concurrent_caches_never_see_a_stale_entry() {
    let _g = serial();
    // Four threads act as users of libfabric's caches at once (2.1's flavour, so unsubscribes
    // happen too): each maps a buffer, registers it (subscribe under mm_lock), hits it, then
    // unmaps it or evicts it. The kernel hands freed addresses out again, so threads register
    // ranges other threads just unmapped (x == y across caches). The stale use libfabric must
    // never make: an entry made before an unmapping call returned is still cached and valid()
    // says true for its range. At the end nothing may be left registered.
    let d = Driver::new(Flavour::V2_1);
    let threads = 4;
    let rounds = 300;
    let stats = Mutex::new((0u64, 0u64)); // (unmapped, fresh entries read invalid)
    std::thread::scope(|s| {
        for t in 0..threads {
            let (d, stats) = (&d, &stats);
            s.spawn(move || {
                for i in 0..rounds {
                    let r = map(1 + (i + t) % 3);
                    let entry = d.register_entry(r.clone()).expect("subscribe");
                    if !d.valid(r.clone()) {
                        // The range's previous subscription still awaits its notify: its
                        // entries, possibly in another cache, may be stale; ours waits too.
                        stats.lock().unwrap().1 += 1;
                    }
                    if (i + t) % 2 == 0 {
                        // Entries numbered below `before` were made before the munmap below
                        // returned (entries made while it runs may be too; they are not judged).
                        let before = d.mm_lock().next_seq;
                        unmap(r.clone());
                        let tree = d.mm_lock();
                        let stale = tree.entries.iter().any(|(e, seq)| *e == r && *seq < before);
                        if stale {
                            assert!(
                                !d.valid_locked(r.clone()),
                                "an entry made before munmap returned is cached and valid: \
                                 thread {t} round {i} {r:x?}, entries {:?}",
                                tree.entries
                                    .iter()
                                    .filter(|(e, _)| *e == r)
                                    .collect::<Vec<_>>()
                            );
                        }
                        drop(tree);
                        stats.lock().unwrap().0 += 1;
                    } else {
                        d.evict_entry(entry);
                        unmap(r.clone());
                    }
                }
            });
        }
    });
    d.settle();
    let s = d.monitor.stats();
    let (unmapped, waited) = stats.into_inner().unwrap();
    assert_eq!(s.subscriptions, 0, "{s:?}");
    assert_eq!(
        d.mm_lock().entries.len(),
        0,
        "every entry was unmapped or evicted"
    );
    assert_eq!(d.monitor.notifier().unwrap().stats().regions, 0);
    eprintln!(
        "{threads} threads x {rounds} rounds: {unmapped} unmapped, {} notifies, {waited} fresh \
         entries read invalid until an older notify, {} subscribes, {} unsubscribes",
        s.notifies, s.subscribes, s.unsubscribes
    );
}

#[test]
fn fork_while_another_thread_holds_the_table_lock_never_hangs_the_child() {
    let _g = serial();
    // A thread hammers valid() (which takes the table lock) while the main thread forks: some
    // children are born with the lock held by a thread they do not have. They must never touch
    // it (and so never hang), and must start afresh when libfabric starts the monitor.
    let d = Driver::new(Flavour::V1_17);
    let r = map(2);
    assert_eq!(d.register(r.clone()), 0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::black_box(d.valid_locked(r.clone()));
            }
        });
        for _ in 0..50 {
            // SAFETY: the child calls only the monitor's entry points and _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                let ops = d.ops();
                let raw = d.raw();
                let at = r.start as *const libc::c_void;
                // SAFETY: the monitor's own entry points, with its pointer, on mapped memory.
                let code = unsafe {
                    if (ops.valid.unwrap())(raw, at, r.len()) {
                        1
                    } else if (ops.subscribe.unwrap())(raw, at, r.len()) == 0 {
                        2
                    } else {
                        (ops.stop.unwrap())(raw);
                        0
                    }
                };
                // SAFETY: leave without running the parent's destructors or test harness.
                unsafe { libc::_exit(code) };
            }
            assert_eq!(wait_child(pid), 0, "child failed");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(d.valid(r.clone()), "the parent is unaffected");
    unmap(r);
}
