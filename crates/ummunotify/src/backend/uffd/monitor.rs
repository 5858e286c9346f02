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
use std::os::fd::{AsFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{decode, sys, Inner, MAX_SINKS};
use crate::backend::table::Held;
use crate::backend::Invalidation;
use crate::sink::WindowEnd;
use crate::sys::{gettid, poll_readable, SignalsBlocked};

/// What the monitor thread and its owner share: the stop request and the thread's tid.
struct Control {
    stop_fd: OwnedFd,
    /// Set before `stop_fd` is signalled (read by the monitor when poll itself fails).
    stopping: AtomicBool,
    tid: AtomicI32,
}

/// The running monitor thread of a context (one per process).
pub(crate) struct Monitor {
    handle: JoinHandle<()>,
    control: Arc<Control>,
}

impl Monitor {
    pub(crate) fn tid(&self) -> i32 {
        self.control.tid.load(SeqCst)
    }

    /// Stops the thread (it closes the context first) and waits for it. Not in a forked child:
    /// the thread does not exist there.
    pub(crate) fn stop(self) {
        self.control.stopping.store(true, SeqCst);
        crate::sys::eventfd_signal(self.control.stop_fd.as_fd());
        let _ = self.handle.join();
        crate::inflight::forget_monitor(self.control.tid.load(SeqCst));
    }
}

/// Starts the monitor with every signal blocked (the mask is inherited at thread creation, so
/// no signal can ever run a handler on it; the kernel routes process signals to other threads),
/// and returns only once the thread is running its loop.
///
/// # Ready when this returns
/// A new thread maps memory when it *starts running*, not when it is spawned: Rust's runtime
/// gives it an alternate signal stack (a guard page plus `max(SIGSTKSZ, AT_MINSIGSTKSZ)`, four
/// pages on CPUs with AMX) just before the closure runs, and the kernel puts that mapping in the
/// freshest hole, often the one the caller's first munmap just left. A notifier whose monitor
/// was still starting when `new()` returned would plant it in a hole the caller is about to map
/// again. So the closure first records its tid, then tells the spawner it runs, and `spawn`
/// waits for that: every mapping the thread will make (its stack, TLS, signal stack) exists
/// before the notifier is handed out. The monitor makes none afterwards (it never allocates).
pub(crate) fn spawn(inner: Arc<Inner>) -> io::Result<Monitor> {
    let control = Arc::new(Control {
        stop_fd: crate::sys::eventfd()?,
        stopping: AtomicBool::new(false),
        tid: AtomicI32::new(0),
    });
    let _blocked = SignalsBlocked::new();
    let spawner = std::thread::current();
    let handle = {
        let control = control.clone();
        std::thread::Builder::new()
            .name("ummunotify-mon".into())
            .spawn(move || {
                // The tid doubles as the "running" flag the spawner waits for.
                let tid = gettid();
                crate::inflight::note_monitor(tid);
                control.tid.store(tid, SeqCst);
                spawner.unpark();
                run(&inner, &control);
                // Before this thread exits (unmapping its stack, freeing its TLS): see `Uffd`.
                inner.uffd.close_from_monitor();
                // Dropped only now: the last reference to a thread handle frees it, and the
                // event path never frees.
                drop(spawner);
            })?
    };
    // `park` may return spuriously, or at once for an earlier `unpark`: the tid decides.
    while control.tid.load(SeqCst) == 0 {
        std::thread::park();
    }
    Ok(Monitor { handle, control })
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
        let (uffd_ready, stop) = match poll_readable(uffd.fd(), control.stop_fd.as_fd()) {
            Ok(r) => r,
            Err(_) => {
                // Can not happen while our fds are open; if it does, every check fails from now
                // on and we keep trying (slowly) so that unmapping threads are still released.
                die(inner, &mut dead);
                std::thread::sleep(std::time::Duration::from_millis(1));
                (true, control.stopping.load(SeqCst))
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
            held.each(|s| s.begin());
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
