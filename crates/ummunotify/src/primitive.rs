//! Atomics behind one name, so the counter functions of the visibility protocol
//! (`generation::{begin_message, end_message, unchanged, wait_idle, region_valid}`) are
//! model-checked with loom (`RUSTFLAGS="--cfg loom"`) as the very code that runs in production.
//! The model's monitor and reader *sequences* around them (index lock, readiness flag, eventfd)
//! are transcriptions of `notifier.rs`, not the production code: see `generation::loom_model`.
#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic::AtomicBool;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;

/// Waits a little: spins first (the monitor finishes a message in microseconds), then yields
/// the CPU (on a 2-CPU machine the monitor may need ours).
#[inline]
pub(crate) fn backoff(round: &mut u32) {
    #[cfg(loom)]
    {
        let _ = round;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if *round < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        *round = round.saturating_add(1);
    }
}
