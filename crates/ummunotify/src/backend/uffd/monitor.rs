//! The monitor thread: the event path.
//!
//! # Rules (guarantee 4)
//! Between the kernel telling us of a change and the region state being updated, this code:
//! never allocates (the message buffer is on the stack, slots were reserved at registration),
//! never frees, never unmaps, never logs, runs with every signal blocked, and takes only the index
//! lock, which no user thread holds while it could be waiting for us. It marks itself busy before
//! *each* single-message `read()` (see `crate::generation`). If it can not continue it marks the
//! counter dead (every check fails) and keeps draining messages so no unmapping thread hangs.
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use super::{decode, sys, Inner, MAX_SINKS};
use crate::backend::table::Held;
use crate::backend::thread::{Control, EventThread};
use crate::backend::Invalidation;
use crate::sink::{Count, WindowEnd};
use crate::sys::poll_readable;

/// The running monitor thread of a context (one per process).
pub(crate) struct Monitor(EventThread);

impl Monitor {
    pub(crate) fn tid(&self) -> i32 {
        self.0.tid()
    }

    /// Stops the thread (it closes the context first) and waits for it. Not in a forked child:
    /// the thread does not exist there.
    pub(crate) fn stop(self) {
        self.0.stop();
    }
}

/// Starts the monitor (every signal blocked) and returns only once the thread is running its
/// loop: see `crate::backend::thread` for why both matter.
pub(crate) fn spawn(inner: Arc<Inner>) -> io::Result<Monitor> {
    EventThread::spawn("ummunotify-mon", move |control, _tid| {
        run(&inner, control);
        // Before this thread exits (unmapping its stack, freeing its TLS): see `Uffd`.
        inner.uffd.close_from_monitor();
    })
    .map(Monitor)
}

/// The loop: every message goes to every sink the context serves at that moment, each with
/// its own begin before the read and its end after the message was applied.
fn run(inner: &Inner, control: &Control) {
    let uffd = &inner.uffd;
    let mut msg = sys::UffdMsg::default();
    // Allocated once, before the loop (MAX_SINKS pointer pairs): the event path never does.
    let mut held = Box::new(Held::<MAX_SINKS>::new());
    let mut dead = false;
    let kernel_ends = inner.uffd.has_remove_done();
    // The loop ends only when the context is dropped: exiting earlier would close it under
    // user threads that still use its fd (see `Uffd`), so failures make it dead instead.
    loop {
        let (uffd_ready, stop) = match poll_readable(uffd.fd(), control.stop_fd()) {
            Ok(r) => r,
            Err(_) => {
                // Can not happen while our fds are open; if it does, every check fails from now
                // on and we keep trying (slowly) so that unmapping threads are still released.
                die(inner, &mut dead);
                std::thread::sleep(std::time::Duration::from_millis(1));
                (true, control.stopping())
            }
        };
        if uffd_ready && !(dead && stop) {
            if dead {
                // Keep releasing unmapping threads; every sink's counter says DEAD already,
                // and one that joined since is killed too.
                inner.sinks.for_each(|s| s.kill());
                let _ = sys::read_one(uffd.fd(), &mut msg);
                continue;
            }
            // The set of sinks for this message: one joining after this point missed nothing
            // it could have watched (its watch came after the change the message reports).
            inner.sinks.hold_all(&mut held);
            held.each(|s| s.begin(Count::Ahead));
            match sys::read_one(uffd.fd(), &mut msg) {
                Ok(Some(())) => {
                    let inv = decode(&msg);
                    // Sink by sink, so each one's end (which takes back what `begin` showed
                    // when the message hit none of its regions) comes as early as it can.
                    held.each(|s| {
                        // A REMOVE's zap comes after this read: a window the in-flight
                        // protocol ends (stock userfaultfd sends no "end").
                        // (`__testing::disable_remove_in_flight` turns this off, as before
                        // issue 9.)
                        // A patched kernel sends REMOVE_DONE after the zap (same range): then
                        // the window is one the backend closes.
                        if let Invalidation::Remove { start, end } = inv {
                            if !crate::inflight::disabled() {
                                let how = if kernel_ends {
                                    WindowEnd::Closed
                                } else {
                                    WindowEnd::Learnt
                                };
                                s.window_open(start, end, how);
                            }
                        } else if msg.event == sys::event::REMOVE_DONE {
                            s.window_close_range(msg.arg[0], msg.arg[1]);
                        }
                        // A panic (fault injection) kills that notifier only.
                        if catch_unwind(AssertUnwindSafe(|| s.apply(inv))).is_err() {
                            s.kill();
                        }
                        s.end();
                    });
                }
                Ok(None) => held.each(|s| s.end()),
                Err(_) => {
                    held.each(|s| {
                        s.kill();
                        s.end();
                    });
                    die(inner, &mut dead);
                }
            }
            inner.sinks.release(&mut held);
            // Messages first: a stop request waits until no unmapping thread is left waiting.
            continue;
        }
        if stop {
            return;
        }
    }
}

/// The context can not deliver any more: every sink is dead, and no new notifier joins it.
fn die(inner: &Inner, dead: &mut bool) {
    inner.dead.store(true, SeqCst);
    inner.sinks.for_each(|s| s.kill());
    *dead = true;
}
