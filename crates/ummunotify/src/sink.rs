//! The one interface through which a backend delivers invalidations into the notifier core.
//!
//! A backend ([`crate::backend`]) knows *where* changes come from (a userfaultfd context, libc's
//! calls, a ring buffer, a kernel module's words); the core knows *what they hit* (the interval
//! index, the validity words, the event queue, the counters). [`Sink`] is everything a backend
//! may ask of the core, and it carries the visibility protocol of [`crate::generation`]: the
//! generation counter is odd from [`Sink::begin`] to [`Sink::end`], so a checker that loads it
//! after the unmapping call returned either waits the message out or sees its effect.
//!
//! The notifier's shared state implements this trait; backends hold an `Arc<dyn Sink>` (or a
//! table of them) and never see the core's internals. Nothing here imports a backend.
//!
//! # Delivery shapes
//! * **Push from a monitor thread** (userfaultfd): for each message, [`begin`](Sink::begin)
//!   *before* the read that releases the unmapping thread, then [`apply`](Sink::apply) and
//!   [`end`](Sink::end).
//! * **Push from the calling thread** (hooks): [`invalidate_in_thread`](Sink::invalidate_in_thread)
//!   before the unmapping syscall (and again after it), which does begin/apply/end under one hold
//!   of the index lock and touches nothing when no region overlaps.
//! * **Pull at check time** (perf rings, an eBPF array, a kernel module's words): the backend
//!   gives the core a [`Probe`]; every check of the notifier calls [`Probe::pull`] first, which
//!   pushes what it finds through the same sink methods (or
//!   [`invalidate_all`](Sink::invalidate_all) when it can not tell what changed) before the
//!   check's own load. See [`crate::generation::PULL`] for how push-only backends keep the
//!   one-load fast path.
//!
//! # Invalidation windows
//! Some changes are announced before they happen (a userfaultfd `REMOVE` is dequeued before the
//! pages are zapped; a kernel module sees `invalidate_range_start` and later `_end`). Between
//! [`window_open`](Sink::window_open) and the end of the window no registration or re-arm over the
//! range is valid (`crate::inflight`). A backend that learns the end calls
//! [`window_close`](Sink::window_close); one that does not (userfaultfd) leaves the end to the core's
//! in-flight protocol (the sender is named and signalled, or a grace period runs out).
//!
//! # Event-path rules (guarantee 4)
//! Every method here may run on a monitor thread or inside a hooked libc call (inside malloc,
//! at thread exit, in a signal handler with every signal blocked): implementations never
//! allocate, free, unmap or log, and take only the core's index lock.

/// A change to the mappings behind a watched range, as a backend reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Invalidation {
    /// `[start, end)` was unmapped (munmap, `MAP_FIXED` over it, mremap shrink, brk shrink, the
    /// old range of an mremap move). The range is the whole syscall range, not clipped; the
    /// backend's watch on it is gone with the mapping.
    Unmap { start: u64, end: u64 },
    /// The pages of `[start, end)` are being dropped (madvise `DONTNEED`/`FREE`/`REMOVE`, ...);
    /// the mapping and its watch stay.
    Remove { start: u64, end: u64 },
    /// The pages of `[from, from + len)` moved to `to` (mremap); the watch moved with them.
    Remap { from: u64, to: u64, len: u64 },
    /// Anything else the backend reports (ignored).
    Other,
}

/// When a delivered change is counted in the 2010 notification count
/// ([`Notifier::notifications`](crate::Notifier::notifications)), which never goes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    /// Before the read that releases the unmapping thread (userfaultfd's monitor): what the
    /// message says is not known yet, so a notifier with a region counts it now, for good. A
    /// message that then hits none of its regions leaves the count one too high, never low.
    Ahead,
    /// The change is known already (a pull backend delivering what it read): counted at
    /// [`Sink::end`], once, if it hit a region.
    Known,
}

/// Who ends an invalidation window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WindowEnd {
    /// The backend never says (userfaultfd's `REMOVE`): the core names the threads that may be
    /// in the call and waits until each is back in user space or gone (`crate::inflight`), or a
    /// grace period ran out.
    Learnt,
    /// The backend calls [`Sink::window_close`] (a kernel module's `invalidate_range_end`);
    /// a window never closed ends after `inflight::CLOSED_GRACE`.
    Closed,
}

/// An open invalidation window ([`Sink::window_open`]), to be passed to [`Sink::window_close`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window(pub(crate) u64);

/// What a backend may ask of the notifier core. Implemented by the notifier's shared state.
pub(crate) trait Sink: Send + Sync {
    /// The start of one delivered change: the counter becomes odd (busy) and the readiness fd
    /// readable. Must be paired with [`end`](Sink::end). The monitor calls it before the read
    /// that releases the unmapping thread ([`Count::Ahead`]); a pull backend after it read what
    /// changed ([`Count::Known`]).
    fn begin(&self, count: Count);

    /// Monitor, between [`begin`](Sink::begin) and [`end`](Sink::end): marks every region the
    /// change hits invalid and queues its event. May panic only by fault injection; the caller
    /// then calls [`kill`](Sink::kill) (and still [`end`](Sink::end)).
    fn apply(&self, inv: Invalidation);

    /// Monitor, after [`apply`](Sink::apply): the counter becomes even again, publishing the
    /// message's effect (a [`Count::Known`] change that hit a region is counted first).
    fn end(&self);

    /// The calling thread's whole delivery (hooks): begin, apply an unmap (`unmap`) or a page
    /// drop of `[start, end)`, end, under one hold of the index lock; nothing at all (counter
    /// included) when no region overlaps. `again` marks the second pass of one call (after its
    /// syscall): a region the first pass left pending is not hit twice. The caller has blocked
    /// every signal.
    fn invalidate_in_thread(&self, start: u64, end: u64, unmap: bool, again: bool);

    /// Every region is invalid from now on (a pull backend that lost track: perf's ring found
    /// nearly full, a lost record, a call's end seen without its start): begin, invalidate all,
    /// end. Regions stay registered and re-arm on read.
    fn invalidate_all(&self);

    /// An invalidation of `[start, end)` is announced and not yet done (called between
    /// [`begin`](Sink::begin) and [`end`](Sink::end) of the message announcing it, before
    /// [`apply`](Sink::apply)). `how` says who ends it.
    fn window_open(&self, start: u64, end: u64, how: WindowEnd) -> Window;

    /// The invalidation of a [`WindowEnd::Closed`] window is done. A window merged with another
    /// (the table was full) stays open until the merged one ends.
    #[cfg_attr(not(test), allow(dead_code))]
    fn window_close(&self, window: Window);

    /// The invalidation of the oldest open [`WindowEnd::Closed`] window over exactly
    /// `[start, end)` is done (a backend whose end names the range, not the window: the patched
    /// kernel's `UFFD_EVENT_REMOVE_DONE`, delivered to every notifier of the shared context).
    /// Nothing happens when no such window is open (this notifier did not exist at the start, or
    /// the window was merged: it then ends by grace).
    fn window_close_range(&self, start: u64, end: u64);

    /// The backend can not deliver any more: every check fails from now on.
    fn kill(&self);
    /// Another library is rewriting libc's code where the hooks are (`backend::hooks`): from
    /// now on the hooked calls may bypass them. A notifier that sees libc's calls only through
    /// the hooks is killed (every check fails: safe and loud); hybrid, whose userfaultfd watch
    /// stays on every page no hook unwatched, carries on without them.
    fn hooks_overwritten(&self) {
        self.kill();
    }
}

/// A backend's "has anything changed" check, consulted by every check of the notifier before its
/// own loads (pull delivery). Push-only backends have none.
pub(crate) trait Probe: Send + Sync {
    /// Delivers into `sink`, before returning, every change the backend has recorded so far
    /// (through [`Sink::begin`]/[`apply`](Sink::apply)/[`end`](Sink::end), or
    /// [`Sink::invalidate_all`] when it can not say which). Called from user threads, often,
    /// concurrently: it should cost a few loads when nothing changed.
    fn pull(&self, sink: &dyn Sink);
}

/// The seam's extension points (pull delivery, windows with an end) under the core, with a
/// backend whose "kernel side" is a word the test bumps, as an eBPF program or a kernel module
/// would bump a mapped counter. What is tested is the core's side of the contract: a probe runs
/// before every check and what it delivers is visible to that check; a closed window ends the
/// in-flight state at once. The push backends are tested against the real kernel elsewhere.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Delivery, Watcher};
    use crate::{Cookie, Notifier};
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Kernel {
        /// Bumped by the "program" for every change it saw.
        word: AtomicU64,
        sink: Mutex<Option<Arc<dyn Sink>>>,
    }

    struct WordWatcher(Arc<Kernel>);
    struct WordProbe {
        kernel: Arc<Kernel>,
        seen: AtomicU64,
    }
    struct Running(Arc<Kernel>);

    impl Watcher for WordWatcher {
        fn watch(&self, _: u64, _: u64) -> crate::Result<()> {
            Ok(())
        }
        fn unwatch(&self, _: u64, _: u64) {}
        fn splits_vmas(&self) -> bool {
            false
        }
        fn probe(&self) -> Option<Box<dyn Probe>> {
            Some(Box::new(WordProbe {
                kernel: self.0.clone(),
                seen: AtomicU64::new(0),
            }))
        }
        fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
            *self.0.sink.lock().unwrap() = Some(sink);
            Ok(Box::new(Running(self.0.clone())))
        }
    }

    impl Probe for WordProbe {
        fn pull(&self, sink: &dyn Sink) {
            let now = self.kernel.word.load(SeqCst);
            if self.seen.swap(now, SeqCst) != now {
                sink.invalidate_all(); // a bare counter says "something", not what
            }
        }
    }

    impl Delivery for Running {
        fn stop(self: Box<Self>, _forked: bool) {
            self.0.sink.lock().unwrap().take();
        }
    }

    fn notifier() -> (Notifier, Arc<Kernel>) {
        let k = Arc::new(Kernel::default());
        let w = Box::new(WordWatcher(k.clone()));
        let n = Notifier::start(w, (Backend::Hooks, "test: word backend".into())).unwrap();
        (n, k)
    }

    #[test]
    fn a_probe_runs_before_every_check() {
        let (n, k) = notifier();
        let buf = vec![0u8; 3 * 4096];
        let at = buf.as_ptr() as usize;
        let r = n.register(at..at + buf.len(), Cookie(1)).unwrap();
        let g = n.generation().unwrap();
        assert!(n.is_valid(r) && n.unchanged_since(g));
        k.word.fetch_add(1, SeqCst); // the program saw a change
        assert!(!n.unchanged_since(g), "the counter check did not pull");
        assert!(!n.is_valid(r));
        let ev = n.events().unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].cookie, ev[0].start, ev[0].end),
            (Cookie(1), at, at + buf.len())
        );
        let r = n.region(Cookie(1)).unwrap();
        assert!(n.is_valid(r), "re-armed after the read");
        // The region check pulls on its own too.
        k.word.fetch_add(1, SeqCst);
        assert!(!n.is_valid(r), "the region check did not pull");
        assert_ne!(n.generation().unwrap().value() & crate::generation::PULL, 0);
    }

    #[test]
    fn a_closed_window_ends_the_in_flight_state() {
        let (n, k) = notifier();
        let buf = vec![0u8; 2 * 4096];
        let at = buf.as_ptr() as u64;
        let sink = k.sink.lock().unwrap().clone().unwrap();
        let r = n
            .register(at as usize..at as usize + 4096, Cookie(1))
            .unwrap();
        // Announced, not done.
        sink.begin(Count::Known);
        let w = sink.window_open(at, at + 4096, WindowEnd::Closed);
        sink.apply(Invalidation::Remove {
            start: at,
            end: at + 4096,
        });
        sink.end();
        assert!(!n.is_valid(r));
        assert_eq!(n.stats().removes_in_flight, 1);
        // A registration over the window waits for its end, which the backend gives.
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let closer = {
            let (sink, closed) = (sink.clone(), closed.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                closed.store(true, SeqCst);
                sink.window_close(w);
            })
        };
        let r = n
            .register(at as usize..at as usize + 4096, Cookie(2))
            .unwrap();
        assert!(closed.load(SeqCst), "registered over an open window");
        assert!(n.is_valid(r));
        closer.join().unwrap();
        let st = n.stats();
        assert_eq!(
            (st.removes_confirmed, st.removes_by_grace),
            (1, 0),
            "not ended by close"
        );
        assert_eq!(st.removes_in_flight, 0);
        drop(buf);
    }
}
