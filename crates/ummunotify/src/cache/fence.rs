//! Asymmetric fences: a free light side on the hit path, a heavy side (`membarrier(2)`) on the
//! rare path that retires regions.
//!
//! The hit path publishes a hazard (a store to its own thread slot) and then loads the cache
//! epoch; a retirer bumps the epoch and then loads every hazard. That is Dekker's pattern: each
//! side needs a StoreLoad barrier between its store and its load, or both may miss the other.
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every running thread of the process
//! execute a full memory barrier before it returns (threads not running pass through a context
//! switch, itself a full barrier), so the heavy side pays for both and the light side needs only
//! a compiler barrier that keeps its store before its load in program order. Where membarrier is
//! unavailable both sides use a `SeqCst` fence.
#![allow(unsafe_code)] // The membarrier syscall.

use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

const UNKNOWN: u8 = 0;
const ASYMMETRIC: u8 = 1;
const SYMMETRIC: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes two integers (cmd, flags) and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) }
}

/// Decides the mode once per process (before any cache can be used). Returns whether the
/// asymmetric mode is in use.
pub(super) fn init() -> bool {
    match MODE.load(SeqCst) {
        ASYMMETRIC => return true,
        SYMMETRIC => return false,
        _ => {}
    }
    let q = membarrier(MEMBARRIER_CMD_QUERY);
    let ok = q >= 0
        && q & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
    // Once asymmetric, always asymmetric: a racing initializer that failed must not switch a
    // process whose hit paths already rely on the heavy side.
    let mode = if ok { ASYMMETRIC } else { SYMMETRIC };
    let _ = MODE.compare_exchange(UNKNOWN, mode, SeqCst, SeqCst);
    MODE.load(SeqCst) == ASYMMETRIC
}

/// Light side: between publishing a hazard and loading the epoch.
#[inline(always)]
pub(super) fn light() {
    if MODE.load(Relaxed) == ASYMMETRIC {
        compiler_fence(SeqCst);
    } else {
        fence(SeqCst);
    }
}

/// Heavy side: between bumping the epoch and loading the hazards.
pub(super) fn heavy() {
    fence(SeqCst);
    if MODE.load(Relaxed) == ASYMMETRIC && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 {
        // Registered at init, so this can not fail; if it ever does, the hit paths only had a
        // compiler barrier: there is no safe way on, and a silent stale registration is worse.
        std::process::abort();
    }
}
