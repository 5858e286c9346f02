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
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{decode, sys};
use crate::backend::Invalidation;
use crate::notifier::Shared;
use crate::sys::{gettid, poll_readable, SignalsBlocked};

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
pub(crate) fn spawn(shared: Arc<Shared>) -> io::Result<JoinHandle<()>> {
    let _blocked = SignalsBlocked::new();
    let spawner = std::thread::current();
    let handle = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("ummunotify-mon".into())
            .spawn(move || {
                // The tid doubles as the "running" flag the spawner waits for.
                shared.set_monitor_tid(gettid());
                spawner.unpark();
                run(&shared);
                // Before this thread exits (unmapping its stack, freeing its TLS): see `Uffd`.
                shared.close_uffd();
                // Dropped only now: the last reference to a thread handle frees it, and the
                // event path never frees.
                drop(spawner);
            })?
    };
    // `park` may return spuriously, or at once for an earlier `unpark`: the tid decides.
    while shared.monitor_tid() == 0 {
        std::thread::park();
    }
    Ok(handle)
}

fn run(shared: &Shared) {
    let mut msg = sys::UffdMsg::default();
    let mut dead = false;
    // The loop ends only when the notifier is dropped: exiting earlier would close the context
    // under user threads that still use its fd (see `Uffd`), so failures make it dead instead.
    loop {
        let (uffd_ready, stop) = match poll_readable(shared.uffd_fd(), shared.stop_fd()) {
            Ok(r) => r,
            Err(_) => {
                // Can not happen while our fds are open; if it does, every check fails from now
                // on and we keep trying (slowly) so that unmapping threads are still released.
                shared.kill();
                dead = true;
                std::thread::sleep(std::time::Duration::from_millis(1));
                (true, shared.stopping())
            }
        };
        if uffd_ready && !(dead && stop) {
            if dead {
                // Keep releasing unmapping threads; the counter says DEAD already.
                let _ = sys::read_one(shared.uffd_fd(), &mut msg);
                continue;
            }
            shared.begin_message();
            match sys::read_one(shared.uffd_fd(), &mut msg) {
                Ok(Some(())) => {
                    let inv = decode(&msg);
                    // A REMOVE's zap comes after this read: in flight until its sender is back.
                    match inv {
                        Invalidation::Remove { start, end } => shared.record_remove(start, end),
                        // The patched kernel's end of a REMOVE: its zap is over.
                        Invalidation::RemoveDone { start, end } => shared.remove_done(start, end),
                        _ => {}
                    }
                    if catch_unwind(AssertUnwindSafe(|| shared.apply(inv))).is_err() {
                        shared.kill();
                        dead = true;
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    shared.kill();
                    dead = true;
                }
            }
            shared.end_message();
            // Messages first: a stop request waits until no unmapping thread is left waiting.
            continue;
        }
        if stop {
            return;
        }
    }
}
