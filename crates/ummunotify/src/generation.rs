//! The shared generation counter and the invalidation-visibility protocol.
//!
//! This module is the protocol of `docs/ARCHITECTURE.md`, written once. The monitor calls
//! [`begin_message`] before each single-message `read()` and [`end_message`] after it has applied
//! the message; checkers call [`unchanged`] and [`region_valid`]. The `loom_model` module below
//! runs these same functions under loom (`RUSTFLAGS="--cfg loom" cargo test -p ummunotify --lib
//! --release loom`) inside a transcription of the monitor's and reader's sequences (see there).
//!
//! Counter word: bit 63 `DEAD`, bit 62 `FORKED`, bit 0 `BUSY`, and a count that grows by two per
//! message. A stable snapshot is always even and never has `DEAD`.
use crate::primitive::{backoff, AtomicU64};
use std::sync::atomic::Ordering::{Acquire, Release, SeqCst};

/// The monitor is between committing to dequeue a message and finishing applying it.
pub(crate) const BUSY: u64 = 1;
/// No more events will be applied: every check fails.
pub(crate) const DEAD: u64 = 1 << 63;
/// Set together with `DEAD` in a forked child.
pub(crate) const FORKED: u64 = 1 << 62;
/// Set for good at start on a notifier whose backend delivers by pull (`crate::sink::Probe`):
/// every check sees it in the value it loaded anyway and runs the probe before comparing. A
/// push-only backend never sets it, so its checks stay one load and one compare.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const PULL: u64 = 1 << 61;

/// A snapshot of a notifier's generation counter: "nothing changed since" is one load and compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Generation(pub(crate) u64);

impl Generation {
    /// The raw counter value (even; the same value the C API and 2010 ABI expose).
    pub fn value(self) -> u64 {
        self.0
    }

    /// A snapshot from a raw value taken earlier with [`value`](Self::value) (the C API's
    /// `uint64_t`). Not part of the stable API.
    #[doc(hidden)]
    pub fn from_value(value: u64) -> Generation {
        Generation(value)
    }
}

/// Monitor, step 2: mark busy. Called with the index lock held, right before the
/// single-message `read()` that releases the unmapping thread.
#[inline]
pub(crate) fn begin_message(counter: &AtomicU64) {
    // SeqCst: ordered before the read() syscall (itself a full barrier) that releases the
    // unmapping thread, so every load made after that thread returns sees BUSY or later.
    counter.fetch_add(BUSY, SeqCst);
}

/// Monitor, step 6: the message has been applied; publish with Release so a checker that
/// Acquire-loads the even value sees every validity word the message changed.
#[inline]
pub(crate) fn end_message(counter: &AtomicU64) {
    counter.fetch_add(BUSY, Release);
}

/// Monitor, instead of [`end_message`] for a message that changed nothing this notifier's
/// checks can see (it hit none of its regions): the counter returns to its value before
/// [`begin_message`]. A checker that waited the busy value out compares equal again, which is
/// right: no validity word changed. Release, as `end_message`: the message's bookkeeping
/// (in-flight windows, moved watches) is published to a reader that Acquire-loads the value.
#[inline]
pub(crate) fn cancel_message(counter: &AtomicU64) {
    counter.fetch_sub(BUSY, Release);
}

/// The 2010 notification count (a word of its own, see [`Notifier::notifications`]) moves on by
/// one. It never goes down: a program that loaded it before an unmapping call compares it with
/// `==` after the call (the 2010 contract), so a value taken back could equal an old one again.
/// The monitor counts *ahead*, before the `read()` that releases the unmapping thread (SeqCst:
/// ordered before that syscall, as `begin_message` is), so the increment is visible when the
/// call returns; a message that then hits no region stays counted ([`crate::sink::Count`]).
///
/// [`Notifier::notifications`]: crate::Notifier::notifications
#[inline]
pub(crate) fn count_notification(word: &AtomicU64) {
    word.fetch_add(1, SeqCst);
}

/// Marks the counter dead (monitor gone): every check from now on fails.
pub(crate) fn kill(counter: &AtomicU64) {
    counter.fetch_or(DEAD, SeqCst);
}

/// The one-load fast path: true iff no message that hit a region was applied since `snapshot`
/// was taken.
///
/// One load and one compare when nothing happened. When the counter reads `snapshot` plus
/// [`BUSY`], a message is being applied (on userfaultfd the process's one context hands every
/// notifier every message, most of them for other notifiers' pages): the check waits for its end
/// (microseconds, as [`region_valid`] does) instead of failing, because a message that hits no
/// region gives the counter back unchanged (`cancel_message`).
///
/// `pull` runs only when the counter carries [`PULL`] (a pull backend): it delivers what the
/// backend recorded, and the counter is loaded again.
#[inline]
pub(crate) fn unchanged(counter: &AtomicU64, snapshot: Generation, pull: impl FnOnce()) -> bool {
    let mut c = counter.load(Acquire);
    if c != snapshot.0 {
        if c != snapshot.0 | BUSY {
            return false;
        }
        c = match wait_out_message(counter) {
            Some(c) if c == snapshot.0 => c,
            _ => return false,
        };
    }
    if c & PULL == 0 {
        return true;
    }
    pull();
    counter.load(Acquire) == snapshot.0
}

/// The slow path of [`unchanged`]: the counter once the message being applied has ended, or
/// `None` if the notifier died meanwhile.
#[cold]
fn wait_out_message(counter: &AtomicU64) -> Option<u64> {
    wait_idle(counter).ok()
}

/// [`wait_idle`] after running `pull` if the counter carries [`PULL`].
#[inline]
pub(crate) fn wait_idle_pulled(counter: &AtomicU64, pull: impl FnOnce()) -> Result<u64, u64> {
    let c = wait_idle(counter)?;
    if c & PULL == 0 {
        return Ok(c);
    }
    pull();
    wait_idle(counter)
}

/// Waits until the monitor is not busy; returns the even counter value, or `Err(value)` if dead.
#[inline]
pub(crate) fn wait_idle(counter: &AtomicU64) -> Result<u64, u64> {
    let mut round = 0;
    loop {
        let c = counter.load(Acquire);
        if c & DEAD != 0 {
            return Err(c);
        }
        if c & BUSY == 0 {
            return Ok(c);
        }
        backoff(&mut round);
    }
}

/// The per-region check: waits out a busy monitor, then one load of the region's word (`pull`
/// first on a pull backend, as in [`unchanged`]).
#[inline]
pub(crate) fn region_valid(
    counter: &AtomicU64,
    word: &AtomicU64,
    expected: u64,
    pull: impl FnOnce(),
) -> bool {
    if wait_idle_pulled(counter, pull).is_err() {
        return false;
    }
    // Ordered after the Acquire load of an even counter value: sees every INVALID bit set by
    // messages whose end_message that value includes.
    word.load(Acquire) == expected
}

/// The protocol under loom: the monitor's steps against a checker that runs after the unmapping
/// call returned. Run with `RUSTFLAGS="--cfg loom" cargo test -p ummunotify --lib --release loom`.
///
/// What is production code here and what is not: the counter functions above (`begin_message`,
/// `end_message`, `unchanged`, `wait_idle`, `region_valid`) are called as they are, on loom
/// atomics. The monitor's sequence (lock, mark busy, make readable, "read", lock, set INVALID,
/// queue, end) and the reader's readiness clearing are hand transcriptions of
/// `Shared`'s `Sink::begin`/`apply`/`end` and `read_events` in `notifier.rs`, with a loom
/// `Mutex` for the index lock, an atomic for the eventfd's count and one for the kernel's
/// release of the unmapping thread. A change to those functions must be mirrored here; the
/// model checks the protocol's ordering argument, not their code.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use crate::primitive::{AtomicBool, AtomicU64};
    use loom::sync::{Arc, Mutex};
    use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};

    /// What the index lock guards, reduced to the protocol's part.
    #[derive(Default)]
    struct Locked {
        queued: bool,
        ready: bool,
    }

    /// One notifier with one region, and the kernel's side of one unmapping call.
    struct World {
        counter: AtomicU64,
        word: AtomicU64,
        index: Mutex<Locked>,
        /// The eventfd's counter (readable iff non-zero).
        fd: AtomicU64,
        /// The kernel's wake-up of the unmapping thread, done by the monitor's read().
        released: AtomicBool,
    }

    fn world(ready: bool) -> Arc<World> {
        Arc::new(World {
            counter: AtomicU64::new(0),
            word: AtomicU64::new(2),
            index: Mutex::new(Locked {
                queued: false,
                ready,
            }),
            fd: AtomicU64::new(ready as u64),
            released: AtomicBool::new(false),
        })
    }

    /// The monitor handling one message that invalidates the region (notifier.rs, in order).
    fn monitor(w: &World) {
        {
            let mut l = w.index.lock().unwrap();
            begin_message(&w.counter);
            if !l.ready {
                l.ready = true;
                w.fd.fetch_add(1, SeqCst);
            }
        }
        // read(): dequeues the message and releases the unmapping thread (a full barrier).
        w.released.store(true, SeqCst);
        {
            let mut l = w.index.lock().unwrap();
            w.word.fetch_or(1, Relaxed);
            l.queued = true;
            if !l.ready {
                l.ready = true;
                w.fd.fetch_add(1, SeqCst);
            }
        }
        end_message(&w.counter);
    }

    /// A reader that finds the queue empty and clears readiness (notifier.rs `read_events`).
    fn reader(w: &World) {
        let mut l = w.index.lock().unwrap();
        if !l.queued && w.counter.load(SeqCst) & BUSY == 0 && l.ready {
            w.fd.store(0, SeqCst);
            l.ready = false;
        }
    }

    /// Guarantee 1: once the unmapping call returned, both checks fail.
    #[test]
    fn no_stale_check_after_return() {
        loom::model(|| {
            let w = world(false);
            let snapshot = Generation(0);
            let m = {
                let w = w.clone();
                loom::thread::spawn(move || monitor(&w))
            };
            // The unmapping thread, or any thread that synchronised with it after it returned.
            if w.released.load(SeqCst) {
                assert!(
                    !unchanged(&w.counter, snapshot, || {}),
                    "stale counter check"
                );
                assert!(
                    !region_valid(&w.counter, &w.word, 2, || {}),
                    "stale region check"
                );
            }
            m.join().unwrap();
            assert!(!region_valid(&w.counter, &w.word, 2, || {}));
            assert_eq!(w.counter.load(Acquire) & BUSY, 0);
        });
    }

    /// A message for another notifier's pages (it hits none of this one's regions): the counter
    /// check made while it is applied waits for its end and passes, and the region stays valid.
    #[test]
    fn a_message_that_hits_nothing_fails_no_check() {
        loom::model(|| {
            let w = world(false);
            let snapshot = Generation(0);
            let m = {
                let w = w.clone();
                loom::thread::spawn(move || {
                    begin_message(&w.counter);
                    w.released.store(true, SeqCst);
                    cancel_message(&w.counter);
                })
            };
            assert!(
                unchanged(&w.counter, snapshot, || {}),
                "a miss failed the check"
            );
            assert!(region_valid(&w.counter, &w.word, 2, || {}));
            m.join().unwrap();
            assert_eq!(w.counter.load(Acquire), snapshot.0);
        });
    }

    /// Hybrid: a hooked call invalidates the region in its own thread (`invalidate_in_thread`,
    /// under the index lock) while the monitor applies a message for other pages, which hits
    /// nothing and would give the counter back (`end`'s cancel). A checker takes its snapshot
    /// and validates the region meanwhile, as a cache miss does. Once the hooked call returned,
    /// that snapshot must not pass with the region valid: `overlapped` (set under the lock when
    /// the counter is busy) makes the message's end move the counter on instead.
    #[test]
    fn an_invalidation_in_thread_during_a_message_that_hits_nothing() {
        loom::model(|| {
            let w = world(false);
            let overlapped = Arc::new(AtomicBool::new(false));
            let m = {
                let (w, overlapped) = (w.clone(), overlapped.clone());
                loom::thread::spawn(move || {
                    {
                        let _l = w.index.lock().unwrap();
                        begin_message(&w.counter);
                    }
                    // read(), apply: no region hit. Then `end`, the cancel path.
                    let _l = w.index.lock().unwrap();
                    if overlapped.swap(false, Relaxed) {
                        end_message(&w.counter);
                    } else {
                        cancel_message(&w.counter);
                    }
                })
            };
            let c = {
                let w = w.clone();
                loom::thread::spawn(move || {
                    let snapshot = wait_idle(&w.counter).unwrap();
                    (snapshot, region_valid(&w.counter, &w.word, 2, || {}))
                })
            };
            // The hooked call's thread: invalidate, then return.
            {
                let _l = w.index.lock().unwrap();
                if w.counter.load(Relaxed) & BUSY != 0 {
                    overlapped.store(true, Relaxed);
                }
                begin_message(&w.counter);
                w.word.fetch_or(1, Relaxed);
                end_message(&w.counter);
            }
            let (snapshot, valid) = c.join().unwrap();
            m.join().unwrap();
            assert!(
                !(valid && unchanged(&w.counter, Generation(snapshot), || {})),
                "a snapshot that saw the region valid passes after the invalidation returned"
            );
        });
    }

    /// The 2010 count (`count_notification`, `event_path.rs`'s `begin`/`end` with
    /// `Count::Ahead`): the monitor takes two messages in order, a first one (another thread's)
    /// that hits none of this notifier's regions, then the unmapping thread's, which hits. Each
    /// is counted before the read that releases its sender and never taken back. A poller never
    /// sees the count go down, and the unmapping thread, which loaded the count before its call
    /// (possibly right after the first message's count), finds it moved when the call returns.
    /// (With the count taken back for a message that hit nothing, loom finds the unmapping
    /// thread's "before" equal to its "after".)
    #[test]
    fn the_2010_count_never_goes_back_and_has_moved_when_the_call_returns() {
        loom::model(|| {
            let w = world(false);
            let count = Arc::new(AtomicU64::new(0));
            // queued[i]: message i is in the kernel's queue; released[i]: its sender woke.
            let queued = Arc::new([AtomicBool::new(true), AtomicBool::new(false)]);
            let released = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
            let m = {
                let (w, count, queued, released) =
                    (w.clone(), count.clone(), queued.clone(), released.clone());
                loom::thread::spawn(move || {
                    for (i, hits) in [(0, false), (1, true)] {
                        // poll(): the monitor begins only once a message is queued, so the
                        // read takes a message queued before the count (FIFO).
                        while !queued[i].load(SeqCst) {
                            loom::thread::yield_now();
                        }
                        {
                            let _l = w.index.lock().unwrap();
                            begin_message(&w.counter);
                            count_notification(&count); // Count::Ahead, the notifier has regions
                        }
                        released[i].store(true, SeqCst); // read()
                        if hits {
                            w.word.fetch_or(1, Relaxed);
                            end_message(&w.counter);
                        } else {
                            cancel_message(&w.counter); // the count stays
                        }
                    }
                })
            };
            let p = {
                let count = count.clone();
                loom::thread::spawn(move || {
                    let a = count.load(SeqCst);
                    let b = count.load(SeqCst);
                    assert!(b >= a, "the 2010 count went down");
                })
            };
            // The unmapping thread: the 2010 program's check around its own call.
            let before = count.load(SeqCst);
            queued[1].store(true, SeqCst); // its munmap queues the message and sleeps
            while !released[1].load(SeqCst) {
                loom::thread::yield_now();
            }
            assert_ne!(
                count.load(SeqCst),
                before,
                "a 2010 check missed an invalidation"
            );
            m.join().unwrap();
            p.join().unwrap();
        });
    }

    /// A pull backend (`crate::sink::Probe`): the change is recorded (a word the "kernel"
    /// bumps, as an eBPF program or the module does) before the unmapping call returns; every
    /// check pulls first, serialized among pullers, and delivers through begin/apply/end
    /// (`Count::Known`). A check made after the call returned, on any thread, fails, whether
    /// its own pull delivered the change or another thread's pull is delivering it meanwhile.
    #[test]
    fn a_pulled_change_fails_every_check_after_the_call_returned() {
        loom::model(|| {
            let w = world(false);
            let kernel = Arc::new(AtomicU64::new(0));
            let seen = Arc::new(Mutex::new(0u64));
            let pull = {
                let (w, kernel, seen) = (w.clone(), kernel.clone(), seen.clone());
                move || {
                    let mut s = seen.lock().unwrap();
                    let now = kernel.load(SeqCst);
                    if *s != now {
                        {
                            let _l = w.index.lock().unwrap();
                            begin_message(&w.counter);
                        }
                        *s = now;
                        w.word.fetch_or(1, Relaxed);
                        end_message(&w.counter);
                    }
                }
            };
            w.counter.fetch_or(PULL, SeqCst);
            let snapshot = Generation(PULL);
            let released = Arc::new(AtomicBool::new(false));
            let other = {
                let (w, released, pull) = (w.clone(), released.clone(), pull.clone());
                loom::thread::spawn(move || {
                    let after = released.load(SeqCst);
                    let unchanged = unchanged(&w.counter, snapshot, &pull);
                    assert!(!(after && unchanged), "a check after the call missed it");
                })
            };
            // The unmapping call: the kernel side records the change, then the call returns.
            kernel.fetch_add(1, SeqCst);
            released.store(true, SeqCst);
            assert!(
                !unchanged(&w.counter, snapshot, &pull),
                "stale counter check"
            );
            assert!(
                !region_valid(&w.counter, &w.word, 2, &pull),
                "stale region check"
            );
            other.join().unwrap();
        });
    }

    /// Readiness: from the moment the unmapping call returns, the fd is readable, even with a
    /// reader concurrently clearing readiness left over from an earlier event.
    #[test]
    fn readable_once_the_unmap_returned() {
        loom::model(|| {
            let w = world(true);
            let r = {
                let w = w.clone();
                loom::thread::spawn(move || reader(&w))
            };
            let m = {
                let w = w.clone();
                loom::thread::spawn(move || monitor(&w))
            };
            if w.released.load(SeqCst) {
                assert!(
                    w.fd.load(SeqCst) != 0,
                    "fd not readable after the unmap returned"
                );
            }
            r.join().unwrap();
            m.join().unwrap();
            assert!(w.fd.load(SeqCst) != 0, "event queued but fd not readable");
        });
    }
}
