//! The signal that learns when a `REMOVE`'s sender is back in user space: its handler, its
//! installation, and how it stays harmless to its host (docs/architecture/in-flight.md, "The
//! signal and its host").
#![allow(unsafe_code)] // sigaction, rt_tgsigqueueinfo, the signal handler, /proc reads.

use super::*;

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let info = unsafe { &*info };
    if info.si_code != libc::SI_QUEUE {
        return;
    }
    // SAFETY: SI_QUEUE signals carry the _rt member (pid, uid, value).
    let (pid, value) = unsafe { (info.si_pid(), info.si_value().sival_ptr as usize) };
    // SAFETY: getpid has no preconditions.
    if pid != unsafe { libc::getpid() } || value >= THREADS {
        return;
    }
    stamp(&ACK[value], &NEXT);
    HANDLED.fetch_add(1, Relaxed);
}

/// Signals this process sent, and handled, for `REMOVE` windows (see [`signal_counts`]).
static SENT_COUNT: AtomicU64 = AtomicU64::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// How many of this library's signals the process sent and how many of its handlers ran
/// (process-wide; for `Stats` and the host-safety tests).
pub(crate) fn signal_counts() -> (u64, u64) {
    (SENT_COUNT.load(Relaxed), HANDLED.load(Relaxed))
}

fn handler_addr() -> usize {
    on_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as *const ()
        as usize
}

/// Installs the handler once per process, if the signal is free (its disposition is the
/// default); otherwise signalling stays off and every entry ends by a later look or by grace.
///
/// How the signal stays harmless to its host (docs/architecture/in-flight.md, "The signal and its host"):
/// * no `SA_ONSTACK`: the handler runs on the stack the thread is on, never starting a frame on
///   the thread's alternate stack;
/// * its `sa_mask` blocks every signal, so no handler of the host nests on ours;
/// * ours never nests on a host handler that runs on the alternate stack: [`guard_hosts`] adds
///   our signal to the `sa_mask` of every such handler, and nothing is sent unless a look made
///   right before the send found them all blocking it.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let sig = match crate::env::var("UMN_SIGNAL").and_then(|s| s.to_str()?.parse::<i32>().ok())
        {
            Some(s) => s,
            None => libc::SIGRTMAX() - SIGNAL_OFFSET,
        };
        if sig < libc::SIGRTMIN() || sig > libc::SIGRTMAX() {
            return;
        }
        // SAFETY: sigaction structs are plain data; the first call only reads the current
        // disposition; the handler we install is async-signal-safe (two atomics on statics).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                return;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler_addr();
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigfillset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0 {
                SIGNO.store(sig, Relaxed);
            }
        }
        // The first look at the host's handlers (a second one guards them: see there).
        guard_hosts();
    });
}

/// The signal in use, if any.
pub fn signal() -> Option<i32> {
    Some(SIGNO.load(Relaxed)).filter(|&s| s != 0)
}

/// Makes every handler of the process that runs on the alternate stack (`SA_ONSTACK`) block our
/// signal, so ours is never delivered on top of one (where its frame, 1.7 to 12 KiB by CPU, could
/// overflow a small alternate stack), and returns whether they all do now. Called by user
/// threads right before they send ([`Outbox::send`]; and once at install). The monitor never
/// sends: a host may install a handler at any time, and only a look made just before the
/// signals go can vouch for it.
///
/// A handler lacking our signal in its `sa_mask` is changed (read, then written back with our
/// signal added, nothing else) only when the previous call saw it exactly the same: a host that
/// installs a handler for a moment and restores the old one (a probe) is never written over. If
/// the host changed the handler between our read and our write, its handler is put back as it
/// wrote it and nothing is sent this round. Until then no signal is sent: the entries end by a
/// later look or by grace, which is safe.
pub(crate) fn guard_hosts() -> Option<u64> {
    /// What the last call saw of a handler that lacked our signal (0: nothing lacking).
    static LACKING: [AtomicU64; 65] = [const { AtomicU64::new(0) }; 65];
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let ours = signal()?;
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let mut guarded = true;
    let mut on_stack_set = 0u64;
    for s in 1..=libc::SIGRTMAX().min(64) {
        if s == ours || s == libc::SIGKILL || s == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction reads the disposition into a zeroed struct (glibc's reserved
        // signals answer EINVAL and are skipped); sigismember reads the set.
        let (cur, blocks) = unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, std::ptr::null(), &mut cur) != 0 {
                continue;
            }
            let blocks = libc::sigismember(&cur.sa_mask, ours) == 1;
            (cur, blocks)
        };
        let on_stack = cur.sa_flags & libc::SA_ONSTACK != 0
            && cur.sa_sigaction != libc::SIG_DFL
            && cur.sa_sigaction != libc::SIG_IGN;
        let seen = &LACKING[s as usize];
        if on_stack {
            on_stack_set |= 1 << (s - 1);
        }
        if !on_stack || blocks {
            seen.store(0, Relaxed);
            continue;
        }
        let key = disposition_key(&cur);
        if seen.swap(key, Relaxed) != key {
            guarded = false; // new since the last look: guarded next time if it stays
            continue;
        }
        let mut new = cur;
        // SAFETY: adds one signal to a copy's mask, installs the copy (the same handler,
        // flags and mask but for our signal) and reads what it replaced; if that is not what we
        // read, the host changed it meanwhile, and its handler goes back exactly as it was.
        let installed = unsafe {
            libc::sigaddset(&mut new.sa_mask, ours);
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, &new, &mut prev) != 0 {
                false
            } else if disposition_key(&prev) == key {
                true
            } else {
                libc::sigaction(s, &prev, std::ptr::null_mut());
                seen.store(disposition_key(&prev), Relaxed);
                false
            }
        };
        if installed {
            seen.store(0, Relaxed);
        } else {
            guarded = false;
        }
    }
    guarded.then_some(on_stack_set)
}

/// Whether thread `tid` may be inside a handler of one of `on_stack` (a mask of signals whose
/// handlers run on the alternate stack) that does not block `ours`: its blocked set has such a
/// signal but not ours. A handler entered before [`guard_hosts`] added our signal to its mask
/// runs with the old mask until it returns, so a signal of ours then would nest on its frame.
/// Unknown (no `/proc`) counts as inside. One `/proc/self/task/TID/status` read, stack buffer.
pub(super) fn in_unguarded_handler(tid: i32, on_stack: u64, ours: i32) -> bool {
    let mut path = [0u8; 48];
    let mut w = 0;
    let mut put = |bytes: &[u8]| {
        path[w..w + bytes.len()].copy_from_slice(bytes);
        w += bytes.len();
    };
    put(b"/proc/self/task/");
    let digits = itoa_digits(tid as u32);
    put(&digits[..digits.iter().position(|&d| d == 0).unwrap_or(digits.len())]);
    put(b"/status\0");
    let mut buf = [0u8; 2048];
    // SAFETY: a NUL-terminated path in a stack buffer; the fd is closed below.
    let n = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return true;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let Ok(n) = usize::try_from(n) else {
        return true;
    };
    let text = &buf[..n];
    let Some(at) = text.windows(7).position(|w| w == b"SigBlk:") else {
        return true;
    };
    let mut blocked = 0u64;
    for &c in text[at + 7..]
        .iter()
        .skip_while(|c| c.is_ascii_whitespace())
    {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => break,
        };
        blocked = blocked << 4 | d as u64;
    }
    blocked & on_stack != 0 && blocked & (1 << (ours - 1)) == 0
}

/// A handler, its flags and the kernel's part of its mask (signals 1 to 64: glibc copies only
/// those into a `sigset_t` it returns, the rest of the 128 bytes is whatever was there), hashed
/// (FNV-1a; never 0).
fn disposition_key(sa: &libc::sigaction) -> u64 {
    // SAFETY: `sigset_t` is plain data at least 8 bytes long; its first 8 are the kernel's set.
    let mask = unsafe {
        (&sa.sa_mask as *const libc::sigset_t)
            .cast::<u64>()
            .read_unaligned()
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in (sa.sa_sigaction as u64)
        .to_le_bytes()
        .into_iter()
        .chain((sa.sa_flags as u64).to_le_bytes())
        .chain(mask.to_le_bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

/// The signal, if our handler is still the one installed (someone may have replaced it;
/// sending then could kill the process if it were reset to the default).
pub(super) fn live_signal() -> Option<i32> {
    let sig = signal()?;
    // SAFETY: reads the current disposition into a zeroed struct.
    let ours = unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut cur) == 0 && cur.sa_sigaction == handler_addr()
    };
    ours.then_some(sig)
}

/// `siginfo_t` for `SI_QUEUE` as the kernel lays it out on 64-bit Linux.
#[repr(C)]
struct QueueInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: u64,
    _rest: [u64; 12],
}
const _: () = assert!(std::mem::size_of::<QueueInfo>() == 128);

/// Queues the signal for thread slot `i` unless one is pending already. Event-path safe.
pub(super) fn send(sig: i32, i: usize) {
    if SENT[i].load(Acquire) > ACK[i].load(Acquire) {
        return; // its handler will stamp a value at least as new as ours
    }
    SENT[i].store(NEXT.load(Acquire), Release);
    // SAFETY: getpid/getuid have no preconditions.
    let (pid, uid) = unsafe { (libc::getpid(), libc::getuid()) };
    let info = QueueInfo {
        signo: sig,
        errno: 0,
        code: libc::SI_QUEUE,
        _pad: 0,
        pid,
        uid,
        value: i as u64,
        _rest: [0; 12],
    };
    let tid = TIDS[i].load(Relaxed);
    // SAFETY: rt_tgsigqueueinfo reads one siginfo (128 bytes) from `info`. EAGAIN (queue full)
    // leaves signals pending, whose handlers stamp the ack word all the same.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            pid,
            tid,
            sig,
            &info as *const QueueInfo,
        )
    };
    if r == 0 {
        SENT_COUNT.fetch_add(1, Relaxed);
    }
}

/// Whether thread `tid` of this process still exists.
pub(super) fn thread_alive(tid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    !(r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
}
