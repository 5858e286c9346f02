//! The library inside a host with signal handling of its own (issue 20): the library's signal
//! (the acknowledgement of a `REMOVE` window, README "One signal") must never be the reason such
//! a host crashes, on any CPU.
//!
//! Every thread runs on an alternate signal stack sized for the host's own worst case and no
//! more, relative to this CPU's `AT_MINSIGSTKSZ` (1,776 bytes with AVX2, 3,376 with AVX-512,
//! 11,952 with AMX): two nested frames (`SIGPROF` inside the `SIGALRM` handler) plus the
//! `SIGALRM` handler's 3 KiB, plus 1 KiB, above a guard page. The kernel refuses a frame that
//! would leave an alternate stack, so a third frame (ours, nested on the host's) is a `SIGSEGV`.
//! `SIGPROF` comes on every thread from a per-thread CPU-time timer at 10 kHz, `SIGALRM` to the
//! process at 5 kHz; the `SIGALRM` handler uses 3 KiB of stack and changes registered memory
//! (`madvise(DONTNEED)`, or `munmap` and a new mapping at the same address). Meanwhile workers
//! register, change and check buffers of their own, and register a shared pool that a changer
//! drops without pause (libc and raw `madvise`): registrations race `REMOVE`s in flight, which
//! is when the library signals the threads that may have sent them.
//!
//! Run once with the host's handlers on the alternate stack (`SA_ONSTACK`) and once on the
//! thread's own stack. Passes if the process survives, every check held, the host's handlers
//! ran, and the library's signal was sent and handled (unless `UMN_SIGNAL=0`).
//! `UMN_HOST_SECS` (default 3) sets the seconds per run.
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{map, page, replace, unmap};
use ummunotify::{Cookie, Notifier};

/// One run at a time: the handlers and timers are the process's.
static SERIAL: Mutex<()> = Mutex::new(());

const HANDLER_STACK: usize = 3072;
const WORKERS: usize = 3;
const POOL: usize = 8;
const VICTIMS: usize = 4;

static PROF: AtomicU64 = AtomicU64::new(0);
static ALRM: AtomicU64 = AtomicU64::new(0);
/// The `SIGALRM` handler's pages (registered), 0 when none.
static VICTIM_AT: AtomicUsize = AtomicUsize::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_prof(_: libc::c_int) {
    PROF.fetch_add(1, Relaxed);
}

/// Uses `HANDLER_STACK` bytes of stack (as an unwinder would) and changes registered memory.
extern "C" fn on_alrm(_: libc::c_int) {
    let mut work = [0u8; HANDLER_STACK];
    for i in (0..HANDLER_STACK).step_by(64) {
        work[i] = i as u8;
    }
    std::hint::black_box(&mut work);
    let n = ALRM.fetch_add(1, Relaxed);
    let base = VICTIM_AT.load(SeqCst);
    if base == 0 {
        return;
    }
    let pg = 4096;
    let v = base + (n as usize % VICTIMS) * pg;
    // SAFETY: the victim pages belong to this test while VICTIM_AT names them; madvise, munmap
    // and mmap are system calls (async-signal-safe in practice, as the test needs).
    unsafe {
        if n % 2 == 0 {
            libc::madvise(v as *mut libc::c_void, pg, libc::MADV_DONTNEED);
        } else {
            libc::munmap(v as *mut libc::c_void, pg);
            libc::mmap(
                v as *mut libc::c_void,
                pg,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
    }
}

fn handle(sig: libc::c_int, f: extern "C" fn(libc::c_int), onstack: bool) {
    // SAFETY: a zeroed sigaction is valid; the handlers are async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = f as usize;
        sa.sa_flags = libc::SA_RESTART | if onstack { libc::SA_ONSTACK } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

/// The host's alternate stack: its own worst case (two frames and the handler) and 1 KiB.
fn altstack_size() -> usize {
    // SAFETY: getauxval has no preconditions.
    let min = unsafe { libc::getauxval(libc::AT_MINSIGSTKSZ) } as usize;
    2 * min.max(libc::MINSIGSTKSZ) + HANDLER_STACK + 1024
}

/// This thread's alternate stack for the run (replacing std's), exactly `altstack_size()` bytes
/// above a guard page; the previous one comes back when it drops.
struct AltStack {
    map: usize,
    len: usize,
    old: libc::stack_t,
}

impl AltStack {
    fn install() -> AltStack {
        let size = altstack_size();
        let len = size.next_multiple_of(page()) + page();
        let m = map(len);
        // SAFETY: our own mapping; the guard page, then the stack at its top.
        unsafe {
            assert_eq!(
                libc::mprotect(m as *mut libc::c_void, page(), libc::PROT_NONE),
                0
            );
            let ss = libc::stack_t {
                ss_sp: (m + len - size) as *mut libc::c_void,
                ss_flags: 0,
                ss_size: size,
            };
            let mut old: libc::stack_t = std::mem::zeroed();
            assert_eq!(libc::sigaltstack(&ss, &mut old), 0);
            AltStack { map: m, len, old }
        }
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        // SAFETY: restores the stack std installed (or none), then frees ours.
        unsafe { libc::sigaltstack(&self.old, std::ptr::null_mut()) };
        unmap(self.map, self.len);
    }
}

/// `SIGPROF` on this thread every 100 µs of its CPU time; deleted on drop.
struct ProfTimer(libc::timer_t);

impl ProfTimer {
    fn start() -> ProfTimer {
        // SAFETY: a zeroed sigevent is valid; SIGEV_THREAD_ID names this thread.
        unsafe {
            let mut sev: libc::sigevent = std::mem::zeroed();
            sev.sigev_notify = libc::SIGEV_THREAD_ID;
            sev.sigev_signo = libc::SIGPROF;
            sev.sigev_notify_thread_id = libc::gettid();
            let mut t: libc::timer_t = std::ptr::null_mut();
            assert_eq!(
                libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut t),
                0
            );
            arm(t, 100_000);
            ProfTimer(t)
        }
    }
}

impl Drop for ProfTimer {
    fn drop(&mut self) {
        // SAFETY: our timer.
        unsafe { libc::timer_delete(self.0) };
    }
}

/// Arms `t` to fire every `ns` nanoseconds.
///
/// # Safety
/// `t` must be a live timer.
unsafe fn arm(t: libc::timer_t, ns: i64) {
    let every = libc::timespec {
        tv_sec: 0,
        tv_nsec: ns,
    };
    let spec = libc::itimerspec {
        it_interval: every,
        it_value: every,
    };
    // SAFETY: (caller) a live timer.
    assert_eq!(
        unsafe { libc::timer_settime(t, 0, &spec, std::ptr::null_mut()) },
        0
    );
}

fn drop_pages(at: usize, len: usize, raw: bool) {
    // SAFETY: the test's own mapping.
    let r = unsafe {
        if raw {
            libc::syscall(libc::SYS_madvise, at, len, libc::MADV_DONTNEED) as i32
        } else {
            libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTNEED)
        }
    };
    assert_eq!(r, 0);
}

/// Registers, changes and checks its own buffers; registers the shared pool racing the changer.
fn worker(n: &Notifier, id: u64, pool: usize) -> u64 {
    let _alt = AltStack::install();
    let _prof = ProfTimer::start();
    let len = 2 * page();
    let own = map(len);
    let mut rounds = 0;
    let mut seed = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while !STOP.load(Relaxed) {
        let cookie = Cookie(id << 40 | rounds);
        let r = n.register(own..own + len, cookie).unwrap();
        let g = n.generation().unwrap();
        match rounds % 3 {
            0 => drop_pages(own, len, false),
            1 => drop_pages(own, len, true),
            _ => replace(own, len),
        }
        assert!(
            !n.is_valid(r),
            "a region read valid after its change returned"
        );
        assert!(
            !n.unchanged_since(g),
            "the counter missed a change that returned"
        );
        n.events().unwrap();
        n.unregister(cookie).unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let b = pool + (seed as usize % POOL) * len;
        let shared = Cookie(id << 40 | 1 << 39 | rounds);
        if n.register(b..b + len, shared).is_ok() {
            n.unregister(shared).unwrap();
        }
        rounds += 1;
    }
    unmap(own, len);
    rounds
}

fn changer(pool: usize) {
    let _alt = AltStack::install();
    let _prof = ProfTimer::start();
    let len = 2 * page();
    let mut i = 0usize;
    while !STOP.load(Relaxed) {
        drop_pages(pool + (i % POOL) * len, len, (i / POOL) % 2 == 1);
        i += 1;
    }
}

fn run(onstack: bool) {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let secs = std::env::var("UMN_HOST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let n = Notifier::new().unwrap();
    let len = 2 * page();
    let pool = map(POOL * len);
    let victims = map(VICTIMS * page());
    for i in 0..VICTIMS {
        let at = victims + i * page();
        n.register(at..at + page(), Cookie(1 << 50 | i as u64))
            .unwrap();
    }
    STOP.store(false, SeqCst);
    let (prof0, alrm0) = (PROF.load(SeqCst), ALRM.load(SeqCst));
    let (sent0, handled0) = (n.stats().signals_sent, n.stats().signals_handled);

    let _alt = AltStack::install();
    handle(libc::SIGPROF, on_prof, onstack);
    handle(libc::SIGALRM, on_alrm, onstack);
    VICTIM_AT.store(victims, SeqCst);
    let _prof = ProfTimer::start();
    let mut alrm: libc::timer_t = std::ptr::null_mut();
    // SAFETY: a zeroed sigevent is valid; SIGEV_SIGNAL to the process.
    unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_SIGNAL;
        sev.sigev_signo = libc::SIGALRM;
        assert_eq!(
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut alrm),
            0
        );
        arm(alrm, 200_000);
    }
    let rounds: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS as u64)
            .map(|id| {
                let n = &n;
                s.spawn(move || worker(n, id + 1, pool))
            })
            .collect();
        s.spawn(|| changer(pool));
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            n.events().unwrap(); // re-arms the victims the handler hits
            std::thread::sleep(Duration::from_millis(1));
        }
        STOP.store(true, SeqCst);
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    // SAFETY: our timer.
    unsafe { libc::timer_delete(alrm) };
    VICTIM_AT.store(0, SeqCst);
    // Pending SIGALRMs may still run: their handler finds no victim now.
    std::thread::sleep(Duration::from_millis(5));

    let st = n.stats();
    let (prof, alrm_runs) = (PROF.load(SeqCst) - prof0, ALRM.load(SeqCst) - alrm0);
    let (sent, handled) = (st.signals_sent - sent0, st.signals_handled - handled0);
    let ours = ummunotify::__testing::remove_signal();
    eprintln!(
        "host_signals {}: altstack {} bytes (AT_MINSIGSTKSZ {}), {prof} SIGPROF, {alrm_runs} \
         SIGALRM, rounds {rounds:?}, removes confirmed {} by grace {}, library signal {ours:?} \
         sent {sent} handled {handled}",
        if onstack { "onstack" } else { "normal" },
        altstack_size(),
        // SAFETY: getauxval has no preconditions.
        unsafe { libc::getauxval(libc::AT_MINSIGSTKSZ) },
        st.removes_confirmed,
        st.removes_by_grace,
    );
    assert!(prof > 0 && alrm_runs > 0, "the host's timers did not run");
    assert!(rounds.iter().all(|&r| r > 0), "a worker made no progress");
    if let Some(sig) = ours {
        assert!(
            sent > 0 && handled > 0,
            "the library's signal was never used"
        );
        if onstack {
            // SAFETY: reads the disposition.
            let blocks = unsafe {
                let mut cur: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGALRM, std::ptr::null(), &mut cur);
                libc::sigismember(&cur.sa_mask, sig) == 1
            };
            assert!(
                blocks,
                "the host's SA_ONSTACK handler does not block the library's signal"
            );
        }
    }
    for sig in [libc::SIGALRM, libc::SIGPROF] {
        // SAFETY: back to the default (nothing is pending: the timers are gone).
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    drop(n);
    unmap(pool, POOL * len);
    unmap(victims, VICTIMS * page());
}

#[test]
fn host_handlers_on_the_alternate_stack() {
    run(true);
}

#[test]
fn host_handlers_on_the_thread_stack() {
    run(false);
}
