//! Atomics behind one name, so the visibility protocol is model-checked with loom
//! (`RUSTFLAGS="--cfg loom"`) using the very code that runs in production.
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
