//! Signal storm: SIGPROF (setitimer, process CPU time) and SIGALRM (timer_create, every 100 µs)
//! at a high rate to the whole process while the torture engine runs. The SIGALRM handler itself
//! changes registered memory (madvise DONTNEED on a watched page) **on the notifier the workers
//! use**: the handler can interrupt a worker anywhere, including inside that notifier's own
//! calls, and its madvise waits for the monitor, which needs the notifier's index lock. A worker
//! interrupted while holding that lock would deadlock the storm; user threads hold it only with
//! signals blocked, and this test is what shows it. After *every* zap the handler checks, before
//! it returns, that the generation counter moved (the one-load check sees the change) and that
//! the page's first token reads invalid. The monitor (all signals blocked) must keep working: no
//! oracle failure, no hang, no stale check.
//!
//! `UMN_SIGNAL_SECS` (default 15), `UMN_TORTURE_SEED` as for the torture run.
mod common;
mod torture_kit;

use std::sync::atomic::{
    AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};
use std::time::Duration;

use torture_kit::engine::{install_crash_report, report, run, Params};
use torture_kit::*;
use ummunotify::{Cookie, Notifier, Region};

static PROF: AtomicU64 = AtomicU64::new(0);
static ALRM: AtomicU64 = AtomicU64::new(0);
/// The page the SIGALRM handler zaps (0: none).
static VICTIM: AtomicUsize = AtomicUsize::new(0);
/// The workers' notifier while `VICTIM` is set.
static NOTIFIER: AtomicPtr<Notifier> = AtomicPtr::new(std::ptr::null_mut());
/// The victim's first token (`Region::to_raw`).
static TOKEN_SLOT: AtomicU32 = AtomicU32::new(0);
static TOKEN_WORD: AtomicU64 = AtomicU64::new(0);
/// Handlers between reading `VICTIM` and finishing with the notifier.
static IN_HANDLER: AtomicI32 = AtomicI32::new(0);
static ZAPS: AtomicU64 = AtomicU64::new(0);
/// Zaps after which the counter had not moved, or the token still read valid.
static STALE: AtomicU64 = AtomicU64::new(0);
/// Far from the engine's cookies (`(thread + 1) << 40`, `0xFF << 40`) and below the cache's.
const VICTIM_COOKIE: Cookie = Cookie(1 << 60);

extern "C" fn on_prof(_: libc::c_int) {
    PROF.fetch_add(1, Relaxed);
}

extern "C" fn on_alrm(_: libc::c_int) {
    ALRM.fetch_add(1, Relaxed);
    IN_HANDLER.fetch_add(1, SeqCst);
    let v = VICTIM.load(SeqCst);
    let n = NOTIFIER.load(SeqCst);
    if v != 0 && !n.is_null() {
        // SAFETY: while VICTIM is set the notifier is alive: teardown clears VICTIM, then waits
        // for IN_HANDLER to drain before the engine drops the notifier.
        let n = unsafe { &*n };
        // Loads only (a spin while the monitor is mid-message): async-signal-safe.
        if let Ok(g) = n.generation() {
            // SAFETY: madvise is async-signal-safe; `v` is a page the test mapped and does not
            // unmap while VICTIM names it.
            unsafe { libc::madvise(v as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
            ZAPS.fetch_add(1, Relaxed);
            let token = Region::from_raw(TOKEN_SLOT.load(SeqCst), TOKEN_WORD.load(SeqCst));
            if n.unchanged_since(g) || n.is_valid(token) {
                STALE.fetch_add(1, SeqCst);
            }
        }
    }
    IN_HANDLER.fetch_sub(1, SeqCst);
}

/// The engine's hook: the victim page goes on the workers' notifier.
fn on_notifier(n: Option<&Notifier>) {
    match n {
        Some(n) => {
            let pg = page();
            let victim = map(pg);
            fill(victim, pg, 1);
            let r = n.register(victim..victim + pg, VICTIM_COOKIE).unwrap();
            let (slot, word) = r.to_raw();
            TOKEN_SLOT.store(slot, SeqCst);
            TOKEN_WORD.store(word, SeqCst);
            NOTIFIER.store(n as *const Notifier as *mut Notifier, SeqCst);
            VICTIM.store(victim, SeqCst);
        }
        None => {
            let victim = VICTIM.swap(0, SeqCst);
            while IN_HANDLER.load(SeqCst) != 0 {
                std::thread::yield_now();
            }
            let n = NOTIFIER.swap(std::ptr::null_mut(), SeqCst);
            if victim != 0 && !n.is_null() {
                // SAFETY: the engine calls the hook with None before dropping its notifier.
                let n = unsafe { &*n };
                n.unregister(VICTIM_COOKIE).unwrap();
                unmap(victim, page());
            }
        }
    }
}

fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int), flags: libc::c_int) {
    // SAFETY: a zeroed sigaction is valid; the handlers only use atomics, loads and madvise.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

#[test]
fn signal_storm_during_torture() {
    install_crash_report();
    let secs = env_u64("UMN_SIGNAL_SECS", 15);

    // SIGPROF restarts interrupted calls, SIGALRM does not (both kinds must be survived).
    install(libc::SIGPROF, on_prof, libc::SA_RESTART);
    install(libc::SIGALRM, on_alrm, 0);
    let it = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 200,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: 200,
        },
    };
    // SAFETY: valid itimerval.
    assert_eq!(
        unsafe { libc::setitimer(libc::ITIMER_PROF, &it, std::ptr::null_mut()) },
        0
    );
    let mut timer: libc::timer_t = std::ptr::null_mut();
    // SAFETY: a zeroed sigevent is valid; SIGEV_SIGNAL to the process.
    unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_SIGNAL;
        sev.sigev_signo = libc::SIGALRM;
        assert_eq!(
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer),
            0
        );
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000,
            },
        };
        assert_eq!(
            libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()),
            0
        );
    }

    let p = Params {
        seed: seed("UMN_TORTURE_SEED"),
        threads: env_u64("UMN_TORTURE_THREADS", 3).clamp(1, 8) as usize,
        duration: Duration::from_secs(secs),
        fork_every: Duration::from_millis(250),
        uring_madvise: false,
        on_notifier: Some(on_notifier),
        remove_churn: false,
    };
    let t = run(p.clone());

    // SAFETY: stops the timers created above.
    unsafe {
        let zero: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_PROF, &zero, std::ptr::null_mut());
        libc::timer_delete(timer);
    }
    report("signal storm", &p, &t);
    let (prof, alrm, zaps) = (PROF.load(SeqCst), ALRM.load(SeqCst), ZAPS.load(SeqCst));
    let stale = STALE.load(SeqCst);
    eprintln!(
        "signal storm: {prof} SIGPROF, {alrm} SIGALRM, {zaps} zaps of a page on the workers' \
         notifier from the handler, {stale} of them not seen before the handler went on"
    );
    assert!(prof > 0 && alrm > 0, "the storm did not happen");
    assert!(zaps > 0, "the handler never zapped the victim page");
    assert_eq!(
        stale, 0,
        "zaps the notifier had not seen when madvise returned"
    );
}
