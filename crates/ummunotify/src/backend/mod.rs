//! Kernel backends: where invalidation messages come from.
//!
//! # The contract every backend meets
//!
//! A backend watches page ranges and turns every change to the mappings behind them into a
//! [`Invalidation`] message, delivered to exactly one monitor thread, with these properties:
//!
//! 1. **Synchronous**: the thread making the change does not return from its call before the
//!    monitor has *dequeued* the message (userfaultfd's non-cooperative events have this).
//!    The monitor's side of the visibility protocol (`crate::generation`) turns "dequeued" into
//!    "visible to every later check".
//! 2. **One message per dequeue**: the monitor can take messages one at a time, so it can mark
//!    itself busy before each.
//! 3. **Free when unused**: pages that are not watched cost nothing on any path.
//! 4. **Watching is idempotent** and may be asked for ranges that are already watched.
//! 5. **Fail loudly**: a backend that can not start returns [`Unsupported`](crate::Unsupported)
//!    naming what is missing (errno, sysctl, privilege), never a silent degraded mode.
//!
//! Backends are chosen at run time by probing the kernel, not by cargo features.
pub(crate) mod uffd;

/// A change to the mappings behind a watched range, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Invalidation {
    /// `[start, end)` was unmapped (munmap, `MAP_FIXED` over it, mremap shrink, brk shrink, the
    /// old range of an mremap move). The range is the whole syscall range, not clipped; the
    /// kernel's watch on it is gone with the mapping.
    Unmap { start: u64, end: u64 },
    /// The pages of `[start, end)` are being dropped (madvise `DONTNEED`/`FREE`/`REMOVE`, ...);
    /// the mapping and its watch stay.
    Remove { start: u64, end: u64 },
    /// The pages of `[from, from + len)` moved to `to` (mremap); the watch moved with them.
    Remap { from: u64, to: u64, len: u64 },
    /// Anything else the backend reports (ignored).
    Other,
}

/// What a backend reports about itself, for `umn doctor`.
#[derive(Debug)]
#[non_exhaustive]
pub struct BackendReport {
    /// The backend's name.
    pub name: &'static str,
    /// `Ok` with how it was opened, or why it can not start.
    pub status: Result<String, crate::Unsupported>,
    /// Feature names the kernel advertises for this backend.
    pub kernel_features: Vec<&'static str>,
    /// Notes: what works, what is degraded and why.
    pub notes: Vec<String>,
}

/// Probes every backend this build knows.
pub fn probe() -> Vec<BackendReport> {
    vec![uffd::probe()]
}
