//! Time spent in the kernel calls a cache miss makes, by kind (feature `call-times`).
//!
//! `umn bench --miss` built with the feature compares these with the same calls made back to
//! back (its floor), to split a miss's time above its floor into "the same calls cost more
//! inside the miss" and "the library's own work" (docs/DESIGNS.md, "The miss against the kernel
//! calls it makes"). Without the feature `timed` is the bare call and nothing is counted.

/// A kernel call a miss on never-watched memory makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `UFFDIO_REGISTER` (the watch).
    Register = 0,
    /// One half of the signal-mask pair around the index lock (`rt_sigprocmask`).
    Mask = 1,
    /// `PROCMAP_QUERY` (is the watched range shared memory).
    Query = 2,
}

#[cfg(feature = "call-times")]
static NANOS: [std::sync::atomic::AtomicU64; 3] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 3];

/// Runs `f`, the call `call`; with the feature, adds its wall time to `call`'s total. No
/// allocation and no lock either way (two clock reads and an atomic add with the feature).
#[inline(always)]
pub(crate) fn timed<T>(call: Call, f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "call-times")]
    {
        let t = std::time::Instant::now();
        let r = f();
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        NANOS[call as usize].fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        r
    }
    #[cfg(not(feature = "call-times"))]
    {
        let _ = call;
        f()
    }
}

/// Nanoseconds spent so far in each [`Call`] by this process, indexed by `Call as usize`.
#[cfg(feature = "call-times")]
pub fn totals() -> [u64; 3] {
    NANOS
        .each_ref()
        .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
}

#[cfg(all(test, feature = "call-times"))]
mod tests {
    use super::*;

    #[test]
    fn a_masked_section_counts_two_mask_calls() {
        let before = totals();
        // Two clock reads around each half: at least 1 ns each on any clock this runs on.
        drop(crate::sys::SignalsBlocked::new());
        let after = totals();
        assert!(after[Call::Mask as usize] > before[Call::Mask as usize]);
    }
}
