//! [`Stats`]: the notifier's counters for diagnostics.

use super::*;

/// Counters for diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Regions registered now.
    pub regions: usize,
    /// Kernel messages delivered to this notifier. On userfaultfd every notifier of the process
    /// shares one context, so this counts the messages of the others' pages too (as do the
    /// `removes_*` counters); the rest of the counters are this notifier's own.
    pub messages: u64,
    /// Region invalidations applied (one message can hit many regions).
    pub invalidations: u64,
    /// Events read by the user.
    pub events_read: u64,
    /// Events pending now.
    pub pending: usize,
    /// Disjoint page ranges the kernel watches for us.
    pub coverage_segments: usize,
    /// Moved watches that could not be cleaned up because the stray ring overflowed.
    pub stray_overflows: u64,
    /// Bytes the kernel watches for this notifier (registered pages, and over the VMA budget the
    /// rest of their VMAs).
    pub watched_bytes: u64,
    /// Regions watched as their whole VMAs because exact watches would exceed the VMA budget.
    pub wide_regions: usize,
    /// The VMA budget: exact watches stop when the process's VMAs would pass this (half of
    /// `vm.max_map_count`).
    pub vma_budget: usize,
    /// The process's VMA count as the watch policy estimates it (an over-estimate).
    pub vma_estimate: usize,
    /// `REMOVE`s held in flight until their zap was confirmed (the sender acknowledged or exited).
    pub removes_confirmed: u64,
    /// `REMOVE`s that left the in-flight state by a grace period, unconfirmed: the residual
    /// window of `crate::inflight` (io_uring workers, other processes, signal-blocking threads).
    pub removes_by_grace: u64,
    /// `REMOVE`s in flight now (fresh-watch windows included).
    pub removes_in_flight: usize,
    /// Fresh-watch windows (a registration watched shared memory, see `docs/architecture/in-flight.md`,
    /// "Fresh watches of shared memory") ended by confirmation. Not counted as `REMOVE`s above.
    pub fresh_windows_confirmed: u64,
    /// Fresh-watch windows ended by a grace period (signals off, or a member that never
    /// acknowledged): the residual, as for `removes_by_grace`.
    pub fresh_windows_by_grace: u64,
    /// Successful watch calls (`UFFDIO_REGISTER`, or the hooks' filter insertions) made by
    /// registrations and re-arms (on a backend whose `Watcher::watch_persists`, a registration
    /// over pages already watched, with no unmap over them delivered since, makes none; no
    /// backend qualifies now).
    pub watch_calls: u64,
    /// Watch requests userfaultfd refused because another context owns the pages (`EBUSY`),
    /// taken by the hooks alone (hybrid backend only; raw syscalls on them are not seen).
    pub hooks_only_watches: u64,
    /// Signals sent to the process's threads to learn that a `REMOVE`'s sender is back in user
    /// space, and handlers of it that ran (process-wide, every notifier; 0 with `UMN_SIGNAL=0`
    /// or where the signal could not be installed). See the README's "One signal".
    pub signals_sent: u64,
    /// See [`signals_sent`](Self::signals_sent).
    pub signals_handled: u64,
    /// Times a pull backend could not say what changed and invalidated every region (a perf
    /// ring found nearly full, a call's end seen without its start).
    pub all_changed: u64,
}

impl Notifier {
    /// Counters for diagnostics.
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        let (regions, coverage_segments, watched_bytes, wide_regions, vma_budget, vma_estimate) = {
            let reg = sh.lock_registry();
            let segments = reg.coverage.segments();
            (
                reg.cookies.len(),
                segments,
                reg.coverage.bytes(),
                reg.budget.wide_regions,
                reg.budget.limit,
                reg.budget.estimate(segments),
            )
        };
        let watch_calls = sh.lock_registry().watch_calls;
        let (pending, stray_overflows, inflight) = {
            let mut l = sh.lock_index_blocked();
            l.st.inflight.sweep();
            let f = &l.st.inflight;
            let inflight = (
                f.confirmed,
                f.by_grace,
                f.len(),
                f.fresh_confirmed,
                f.fresh_by_grace,
            );
            (l.st.queued, l.st.stray_overflow, inflight)
        };
        Stats {
            regions,
            messages: sh.messages.load(Relaxed),
            invalidations: sh.invalidations.load(Relaxed),
            events_read: sh.events_read.load(Relaxed),
            pending,
            coverage_segments,
            stray_overflows,
            watched_bytes,
            wide_regions,
            vma_budget,
            vma_estimate,
            removes_confirmed: inflight.0,
            removes_by_grace: inflight.1,
            removes_in_flight: inflight.2,
            fresh_windows_confirmed: inflight.3,
            fresh_windows_by_grace: inflight.4,
            watch_calls,
            hooks_only_watches: sh.watcher.hooks_only(),
            all_changed: sh.all_changed.load(Relaxed),
            signals_sent: crate::inflight::signal_counts().0,
            signals_handled: crate::inflight::signal_counts().1,
        }
    }
}
