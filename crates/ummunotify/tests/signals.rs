//! Signal storm: SIGPROF (setitimer, process CPU time) and SIGALRM (timer_create, every 100 µs)
//! at a high rate to the whole process while the torture engine runs. The SIGALRM handler itself
//! changes registered memory (madvise DONTNEED on a watched page): a handler that runs while its
//! thread holds the notifier's index lock would deadlock, which is why user threads hold it only
//! with signals blocked. The monitor (all signals blocked) must keep working: no oracle failure,
//! no hang, and every handler-made change invalidates the region before the handler returns.
//!
//! `UMN_SIGNAL_SECS` (default 15), `UMN_TORTURE_SEED` as for the torture run.
mod common;
mod torture_kit;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use torture_kit::engine::{report, run, Params};
use torture_kit::*;
use ummunotify::{Cookie, Notifier};

static PROF: AtomicU64 = AtomicU64::new(0);
static ALRM: AtomicU64 = AtomicU64::new(0);
/// The page the SIGALRM handler zaps (0: none).
static VICTIM: AtomicUsize = AtomicUsize::new(0);
static ZAPS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_prof(_: libc::c_int) {
    PROF.fetch_add(1, Relaxed);
}

extern "C" fn on_alrm(_: libc::c_int) {
    ALRM.fetch_add(1, Relaxed);
    let v = VICTIM.load(Relaxed);
    if v != 0 {
        // SAFETY: madvise is async-signal-safe; `v` is a page the test mapped and never unmaps
        // while VICTIM names it.
        unsafe { libc::madvise(v as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
        ZAPS.fetch_add(1, Relaxed);
    }
}

fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int), flags: libc::c_int) {
    // SAFETY: a zeroed sigaction is valid; the handler only uses atomics and madvise.
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
    let secs = env_u64("UMN_SIGNAL_SECS", 15);
    // A notifier of its own for the handler's victim page (the engine has its own notifier).
    let n = Notifier::new().unwrap();
    let pg = page();
    let victim = map(pg);
    fill(victim, pg, 1);
    n.register(victim..victim + pg, Cookie(1)).unwrap();

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
    VICTIM.store(victim, SeqCst);

    let p = Params {
        seed: seed("UMN_TORTURE_SEED"),
        threads: env_u64("UMN_TORTURE_THREADS", 3).clamp(1, 8) as usize,
        duration: Duration::from_secs(secs),
        fork_every: Duration::from_millis(250),
        uring_madvise: false,
    };
    let t = run(p.clone());

    VICTIM.store(0, SeqCst);
    // SAFETY: stops the timers created above.
    unsafe {
        let zero: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_PROF, &zero, std::ptr::null_mut());
        libc::timer_delete(timer);
    }
    report("signal storm", &p, &t);
    let (prof, alrm, zaps) = (PROF.load(SeqCst), ALRM.load(SeqCst), ZAPS.load(SeqCst));
    eprintln!("signal storm: {prof} SIGPROF, {alrm} SIGALRM, {zaps} zaps of a watched page from the handler");
    assert!(prof > 0 && alrm > 0, "the storm did not happen");
    if zaps > 0 {
        // Every zap invalidated the page before the handler went on; the last one is unread.
        assert!(!n.is_valid(n.region(Cookie(1)).unwrap()));
        let ev = n.events().unwrap();
        assert_eq!(ev.len(), 1, "one coalesced event for the victim");
        assert!(n.stats().messages >= zaps.min(1));
    }
    let s = n.stats();
    eprintln!("victim notifier: {s:?}");
    assert_eq!(s.pending, 0);
}
