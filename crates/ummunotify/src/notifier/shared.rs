//! [`Shared`]: the notifier's state shared with the backend's delivery, and what user threads do
//! with it before they change a region (settle, watch, wait out `REMOVE`s in flight).

use super::*;

/// The core's state, shared with the backend's delivery (as its [`Sink`]).
pub(crate) struct Shared {
    pub(super) counter: CounterPage,
    pub(super) ready: Readiness,
    pub(super) slots: SegVec<Slot>,
    /// The event queue: which slots have a pending event (under the index lock).
    pub(super) queue: QueueBits,
    pub(super) index: Mutex<IndexState>,
    pub(super) registry: Mutex<Registry>,
    /// What watches the pages (see `crate::backend`).
    pub(super) watcher: Box<dyn Watcher>,
    /// The backend's pull-at-check-time probe (`None`: push only; the counter then never has
    /// `generation::PULL`).
    pub(super) probe: Option<Box<dyn Probe>>,
    pub(super) strays_pending: AtomicBool,
    pub(super) messages: StdAtomicU64,
    pub(super) invalidations: StdAtomicU64,
    /// `Sink::invalidate_all` calls.
    pub(super) all_changed: StdAtomicU64,
    pub(super) events_read: StdAtomicU64,
    /// Fault injection for tests: the next message makes the event path fail.
    pub(super) fail_next: AtomicBool,
    /// The message being applied hit at least one region (monitor only; see
    /// `generation::count_notification`).
    pub(super) message_hit: AtomicBool,
    /// `REMOVE`s in flight as of the last unlock of the index lock: 0 lets a registration skip
    /// taking that lock (and blocking signals) just to find nothing to wait for.
    pub(super) in_flight: AtomicUsize,
    /// `begin` counted the message being applied in the 2010 count ahead (monitor only).
    pub(super) counted_ahead: AtomicBool,
    /// `Registry::holes`, readable without the lock: [`Notifier::mapped`] returns at once while
    /// it is 0. Raised before the holes are looked for (see `register_impl`).
    pub(super) holes: AtomicUsize,
    /// The message being applied made the readiness fd readable (monitor only).
    pub(super) readied_by_message: AtomicBool,
    /// An invalidation in a user thread (hooks, hybrid) moved the counter while a monitor
    /// message was between `begin` and `end` (set and, in the cancel path, read under the index
    /// lock). That message's `end` must then move the counter on instead of giving it back: a
    /// snapshot taken inside the user thread's invalidation read an even value, and a cancel
    /// would bring the counter back to exactly that value with the invalidation applied.
    pub(super) overlapped: AtomicBool,
}

/// The readiness eventfd, written only once somebody can be waiting on it.
///
/// Until [`Notifier`]'s `as_fd` is first called nobody can poll the fd, so the event path skips
/// the eventfd write (a syscall in the unmapping thread on the hooks and hybrid backends) and
/// the drains. The first `as_fd` marks it wanted under the index lock and makes it readable if
/// the notifier is ready then; every later change writes it. All of this under the index lock.
pub(super) struct Readiness {
    pub(super) fd: OwnedFd,
    pub(super) wanted: AtomicBool,
}

impl Readiness {
    /// Makes the fd readable (index lock held, or the notifier dead).
    pub(super) fn signal(&self) {
        if self.wanted.load(Relaxed) {
            sys::eventfd_signal(self.fd.as_fd());
        }
    }

    /// Makes the fd not readable (index lock held).
    pub(super) fn drain(&self) {
        if self.wanted.load(Relaxed) {
            sys::eventfd_drain(self.fd.as_fd());
        }
    }

    /// Marks the fd wanted from now on, and readable at once if the notifier is `ready` and it
    /// was not wanted before (index lock held).
    pub(super) fn want(&self, ready: bool) {
        if !self.wanted.swap(true, Relaxed) && ready {
            sys::eventfd_signal(self.fd.as_fd());
        }
    }
}

impl Shared {
    pub(super) fn lock_index(&self) -> Locked<'_> {
        Locked {
            st: self.index.lock().unwrap_or_else(|p| p.into_inner()),
            slots: &self.slots,
            queue: &self.queue,
            in_flight: &self.in_flight,
        }
    }

    /// The cookie of slot `id` (registry lock held: cookies change only under it).
    pub(super) fn cookie_of(&self, id: u32) -> u64 {
        self.slots
            .get(id)
            .expect("cookie table id without a slot")
            .cookie
            .load(Relaxed)
    }

    pub(super) fn lock_registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn counter(&self) -> &AtomicU64 {
        self.counter.word()
    }

    /// Makes the readiness fd readable if it is not (index lock held).
    pub(super) fn signal_ready(&self, l: &mut Locked<'_>) {
        if !l.st.ready {
            l.st.ready = true;
            self.ready.signal();
        }
    }

    /// A pull backend's probe, run before a check (see `generation::PULL`).
    #[cold]
    pub(super) fn pull(&self) {
        if let Some(p) = &self.probe {
            p.pull(self);
        }
    }

    pub(super) fn alive(&self) -> Result<()> {
        let c = self.counter().load(Acquire);
        if c & FORKED != 0 {
            Err(Error::Forked)
        } else if c & DEAD != 0 {
            Err(self
                .watcher
                .stopped_because()
                .map_or(Error::MonitorDead, Error::Unsupported))
        } else {
            Ok(())
        }
    }

    /// The first step of every user call that changes state (registry lock held): wait until
    /// the monitor has applied every message it already dequeued, then unwatch the destinations of
    /// moved watches that no region needs.
    ///
    /// Waiting matters twice: a message for an unmap that returned before this call may still be
    /// being applied (and would otherwise hit a region this call is about to insert at the same,
    /// re-mapped addresses), and a `Remap` applied late would leave its moved watch for a later
    /// call to clean up.
    pub(super) fn settle(&self, reg: &mut Registry) -> Result<()> {
        if generation::wait_idle_pulled(self.counter(), || self.pull()).is_err() {
            return self.alive();
        }
        if self.strays_pending.swap(false, Acquire) {
            self.clean_strays(reg);
        }
        Ok(())
    }

    /// Unwatches the destinations of moved watches that no region needs (registry lock held).
    pub(super) fn clean_strays(&self, reg: &mut Registry) {
        let mut strays = [(0u64, 0u64); STRAYS];
        let n = {
            let mut l = self.lock_index_blocked();
            let n = l.st.stray_len;
            strays[..n].copy_from_slice(&l.st.strays[..n]);
            l.st.stray_len = 0;
            n
        };
        for &(s, e) in &strays[..n] {
            for (us, ue) in reg.coverage.uncovered(s, e) {
                // The range may be partly unmapped by now; nothing to undo then.
                self.watcher.unwatch(us, ue);
            }
        }
    }

    /// The index lock for a user thread: with every signal blocked while it is held.
    pub(super) fn lock_index_blocked(&self) -> UserLocked<'_> {
        let signals = SignalsBlocked::new();
        UserLocked {
            locked: self.lock_index(),
            _signals: signals,
        }
    }

    /// After a watch of `[start, end)` (registry lock held): on a backend that needs it
    /// ([`Watcher::fresh_watch_window`](crate::backend::Watcher::fresh_watch_window)), when the
    /// range holds shared memory, records an in-flight window over it, ticketed after the watch,
    /// as if a `REMOVE` of it had just been read. A `madvise(MADV_REMOVE)` that looked for a watch
    /// before this one existed sent no message, and may zap after the watch with `mmap_lock`
    /// dropped; the caller waits for the window ([`wait_inflight`](Self::wait_inflight): the
    /// threads in `madvise` over the range, or running, are named and must come back to user
    /// space) and holds its region invalid if it is still open. Returns the window's ticket, if
    /// one was opened.
    /// `shared` is what the caller learnt already (`None`: look it up).
    pub(super) fn open_fresh_window(
        &self,
        reg: &mut Registry,
        start: u64,
        end: u64,
        shared: Option<bool>,
    ) -> Option<u64> {
        if !self.watcher.fresh_watch_window() || crate::inflight::disabled() {
            return None;
        }
        // A lookup that fails counts as shared: a window costs a wait, a missing one a stale pin.
        // The backend first (two ioctls, O(log VMAs), where `PROCMAP_QUERY` is missing or the
        // range takes several VMAs), then the mapping list (which reads all of
        // /proc/self/maps per call without `PROCMAP_QUERY`: issue 41).
        let shared = shared
            .or_else(|| self.watcher.maybe_shared(start, end))
            .or_else(|| self.maybe_shared_by_runs(reg, start, end))
            .unwrap_or_else(|| {
                reg.budget
                    .vmas()
                    .map_or(true, |v| v.any_shared(start, end).unwrap_or(true))
            });
        shared.then(|| {
            self.lock_index_blocked()
                .st
                .inflight
                .record_fresh(start, end)
        })
    }

    /// Where `PROCMAP_QUERY` is missing: the backend's answer for each mapped run of a small
    /// range (a re-arm or `register_any` with holes, a range unmapped since: no run, nothing
    /// shared), so that such ranges do not read all of `/proc/self/maps` either (issue 41).
    /// `None`: not known.
    fn maybe_shared_by_runs(&self, reg: &mut Registry, start: u64, end: u64) -> Option<bool> {
        let v = reg.budget.vmas().ok()?;
        if v.has_query() {
            return None;
        }
        let mut answer = Some(false);
        v.for_each_mapped(start, end, |s, e| {
            if answer == Some(false) {
                answer = self.watcher.maybe_shared(s, e);
            }
        })
        .ok()?;
        answer
    }

    /// [`Notifier::mapped`]'s fresh-watch window over `[start, end)`, just watched (registry lock
    /// held): waited for as in `register_impl`; if it is still open then, every region over the
    /// range is invalidated with an event, as a message would (the counter moves, the 2010 count
    /// too), since those regions may be cached already.
    pub(super) fn fresh_window_after_mapped(&self, reg: &mut Registry, start: u64, end: u64) {
        let Some(ticket) = self.open_fresh_window(reg, start, end, None) else {
            return;
        };
        let span = Span {
            start,
            end,
            watch_start: start,
            watch_end: end,
        };
        self.wait_inflight(reg, &span);
        let mut l = self.lock_index_blocked();
        l.st.inflight.sweep();
        if !l.st.inflight.overlaps_upto(start, end, ticket) {
            return;
        }
        self.invalidate_as_message(&mut l, start, end, false, false);
    }

    /// Waits until no `REMOVE` in flight overlaps `span` (user threads; registry lock held). The
    /// wait is bounded by the table's grace periods; a registration still overlapping one then
    /// is born invalid with an event (see `register`).
    pub(super) fn wait_inflight(&self, reg: &mut Registry, span: &Span) {
        if self.in_flight.load(Acquire) == 0 {
            return; // (a REMOVE read since is looked at again when the region is inserted)
        }
        let (s, e) = (span.watch_start, span.watch_end);
        self.wait_inflight_until(reg, |l, _, h| !l.st.inflight.overlaps_upto(s, e, h), (s, e));
    }

    /// How often a wait for in-flight entries looks at their members again (a scan of the threads).
    pub(super) const NARROW_EVERY_NS: u64 = 200_000;

    /// Waits (bounded) until `done(locked, horizon)` holds under the index lock, naming the
    /// senders of the unresolved in-flight entries overlapping `range` and signalling them on the
    /// way. `horizon` is the ticket counter at the start: entries recorded later need not be
    /// waited for (they invalidated what they hit; what they overlap at insertion is born
    /// invalid), so a stream of new `REMOVE`s can not starve the caller.
    pub(super) fn wait_inflight_until(
        &self,
        reg: &mut Registry,
        done: impl Fn(&Locked<'_>, &Registry, u64) -> bool,
        range: (u64, u64),
    ) {
        let start = InFlight::horizon();
        let limit = crate::inflight::now_ns()
            + (crate::inflight::STUCK_GRACE.as_nanos() as u64).saturating_mul(2);
        let mut round = 0;
        // When the members were last looked at again (`InFlight::narrow`).
        let mut looked = crate::inflight::now_ns();
        loop {
            let mut workers = [0i32; crate::inflight::WORKERS];
            let (unresolved, n_workers, resend) = {
                let mut l = self.lock_index_blocked();
                if l.st.inflight.is_empty() {
                    return;
                }
                l.st.inflight.sweep();
                if done(&l, reg, start) {
                    return;
                }
                (
                    l.st.inflight.unresolved(range.0, range.1),
                    l.st.inflight.workers(range.0, range.1, &mut workers),
                    l.st.inflight.take_resend(),
                )
            };
            // Members that owe a newer entry an acknowledgement (noted by any sweep, the
            // monitor's included): signalled from here, with no lock held.
            resend.send();
            if unresolved {
                // Scan after reading the horizon: every entry up to it was read before the scan
                // began, so its sender is still in its call (named) or done with it.
                let horizon = InFlight::horizon();
                reg.scanner.scan(sys::gettid());
                let outbox = {
                    let mut l = self.lock_index_blocked();
                    let (c, overflowed) = reg.scanner.candidates();
                    l.st.inflight.resolve(horizon, c, overflowed)
                };
                outbox.send();
                continue;
            }
            if n_workers > 0 {
                // Busy io_uring workers run no handler: look whether they went idle since.
                let horizon = InFlight::horizon();
                let mut idle = [0i32; crate::inflight::WORKERS];
                let mut n_idle = 0;
                for &w in &workers[..n_workers] {
                    if reg.scanner.worker_idle(w) {
                        idle[n_idle] = w;
                        n_idle += 1;
                    }
                }
                if n_idle > 0 {
                    let mut l = self.lock_index_blocked();
                    for &w in &idle[..n_idle] {
                        l.st.inflight.worker_idle(w, horizon);
                    }
                    continue;
                }
            }
            let now = crate::inflight::now_ns();
            if now > limit {
                return;
            }
            if now.saturating_sub(looked) >= Self::NARROW_EVERY_NS {
                // Members blocked elsewhere by now are out of the call: no signal needed.
                looked = now;
                let horizon = InFlight::horizon();
                reg.scanner.scan(sys::gettid());
                let mut l = self.lock_index_blocked();
                let (c, overflowed) = reg.scanner.candidates();
                l.st.inflight.narrow(horizon, c, overflowed);
                continue;
            }
            // A pull backend closes its windows when it delivers the call's end.
            self.pull();
            crate::primitive::backoff(&mut round);
        }
    }

    /// Watches the mapped parts of the page range `[start, end)` (registry lock held). Returns
    /// whether they covered it (no hole); a part unmapped while this runs counts as a hole. No
    /// allocation where `PROCMAP_QUERY` works (it runs inside the 2010 preload's `mmap`).
    pub(super) fn watch_mapped_parts(
        &self,
        budget: &mut WatchBudget,
        start: u64,
        end: u64,
    ) -> Result<bool> {
        // The common case, all mapped: one check and one watch, as `register` (the VMA walk
        // reads all of /proc/self/maps per call where PROCMAP_QUERY is missing, Linux < 6.11).
        let whole = Span {
            start,
            end,
            watch_start: start,
            watch_end: end,
        };
        match self.watch(&whole) {
            Ok(()) if matches!(sys::is_mapped(start as usize, end as usize), Ok(true)) => {
                return Ok(true)
            }
            Ok(()) | Err(Error::Unmapped) => {}
            Err(e) => return Err(e),
        }
        let mut first_err = None;
        let mut raced = false;
        let whole = budget
            .vmas()?
            .for_each_mapped(start, end, |s, e| {
                if first_err.is_some() {
                    return;
                }
                let part = Span {
                    start: s,
                    end: e,
                    watch_start: s,
                    watch_end: e,
                };
                match self.watch(&part) {
                    Ok(()) => {}
                    Err(Error::Unmapped) => raced = true,
                    Err(e) => first_err = Some(e),
                }
            })
            .map_err(|source| Error::Os {
                op: "PROCMAP_QUERY",
                source,
            })?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(whole && !raced),
        }
    }

    /// Watches the page range of `span`, mapping kernel refusals to typed errors; a range not
    /// mapped now is [`Error::Unmapped`] before anything is watched.
    pub(super) fn watch(&self, span: &Span) -> Result<()> {
        let (s, e) = (span.watch_start, span.watch_end);
        if !matches!(sys::is_mapped(s as usize, e as usize), Ok(true)) {
            return Err(Error::Unmapped);
        }
        self.watch_then_check(span)
    }

    /// [`watch`](Self::watch) without the look before it, for a caller that checks the range
    /// is mapped *after* the watch (a racing unmap must be caught there anyway) and rolls the
    /// watch back when it is not: a registration. The look before cost every cache miss an
    /// `msync`, a tenth of the kernel calls a miss can not skip (issue 23).
    pub(super) fn watch_then_check(&self, span: &Span) -> Result<()> {
        let (s, e) = (span.watch_start, span.watch_end);
        let unmapped = || !matches!(sys::is_mapped(s as usize, e as usize), Ok(true));
        self.watcher
            .watch(s, e)
            .map_err(|err| if unmapped() { Error::Unmapped } else { err })
    }
}

/// The index lock held by a user thread. Field order matters: the lock is released before the
/// signal mask is restored.
pub(super) struct UserLocked<'a> {
    pub(super) locked: Locked<'a>,
    pub(super) _signals: SignalsBlocked,
}

impl<'a> std::ops::Deref for UserLocked<'a> {
    type Target = Locked<'a>;
    fn deref(&self) -> &Locked<'a> {
        &self.locked
    }
}
impl std::ops::DerefMut for UserLocked<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.locked
    }
}
