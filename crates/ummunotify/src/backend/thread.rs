//! The thread a push backend delivers from (userfaultfd's monitor, perf's drainer).
//!
//! # Ready when [`EventThread::spawn`] returns
//! A new thread maps memory when it *starts running*, not when it is spawned: Rust's runtime
//! gives it an alternate signal stack (a guard page plus `max(SIGSTKSZ, AT_MINSIGSTKSZ)`, four
//! pages on CPUs with AMX) just before the closure runs, and the kernel puts that mapping in the
//! freshest hole, often the one the caller's first munmap just left. A notifier whose thread was
//! still starting when `new()` returned would plant it in a hole the caller is about to map
//! again. So the thread first records its tid, then tells the spawner it runs, and `spawn` waits
//! for that: every mapping the thread will make (its stack, TLS, signal stack) exists before the
//! notifier is handed out. The event path makes none afterwards (it never allocates).
//!
//! # Signals
//! The thread starts with every signal blocked (the mask is inherited at thread creation), so no
//! signal ever runs a handler on it; the kernel routes process signals to other threads.
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::sys::{gettid, SignalsBlocked};

/// What the thread and its owner share: the stop request and the thread's tid.
pub(crate) struct Control {
    stop_fd: OwnedFd,
    /// Set before `stop_fd` is signalled (read by a loop whose poll itself failed).
    stopping: AtomicBool,
    /// 0 until the thread runs (the "running" flag the spawner waits for).
    tid: AtomicI32,
}

impl Control {
    /// Readable once a stop was requested (poll it with the backend's own fds).
    pub(crate) fn stop_fd(&self) -> BorrowedFd<'_> {
        self.stop_fd.as_fd()
    }

    /// Whether a stop was requested.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(SeqCst)
    }
}

/// A running event thread.
pub(crate) struct EventThread {
    handle: JoinHandle<()>,
    control: Arc<Control>,
}

impl EventThread {
    /// Starts `body(control, tid)` on a thread named `name`, with every signal blocked, and
    /// returns once it runs. The thread is known to `crate::inflight` as a monitor from then on.
    pub(crate) fn spawn(
        name: &str,
        body: impl FnOnce(&Control, i32) + Send + 'static,
    ) -> io::Result<EventThread> {
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
                .name(name.into())
                .spawn(move || {
                    let tid = gettid();
                    crate::inflight::note_monitor(tid);
                    control.tid.store(tid, SeqCst);
                    spawner.unpark();
                    body(&control, tid);
                    // Dropped only now: the last reference to a thread handle frees it, and the
                    // event path never frees.
                    drop(spawner);
                })?
        };
        // `park` may return spuriously, or at once for an earlier `unpark`: the tid decides.
        while control.tid.load(SeqCst) == 0 {
            std::thread::park();
        }
        Ok(EventThread { handle, control })
    }

    /// The thread's tid.
    pub(crate) fn tid(&self) -> i32 {
        self.control.tid.load(SeqCst)
    }

    /// Asks the thread to stop and waits for it. Not in a forked child: the thread does not
    /// exist there.
    pub(crate) fn stop(self) {
        self.control.stopping.store(true, SeqCst);
        crate::sys::eventfd_signal(self.control.stop_fd.as_fd());
        let _ = self.handle.join();
        crate::inflight::forget_monitor(self.control.tid.load(SeqCst));
    }
}
