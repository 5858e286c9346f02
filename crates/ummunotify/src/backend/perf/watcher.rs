//! The perf backend behind the seam: a [`Watcher`] that watches nothing (the rings record every
//! traced call of the process), a [`Probe`] every check pulls through, and a delivery thread that
//! drains the rings when they fill to the wake-up watermark, and every [`TICK`] so that exits
//! close their windows without waiting for a check. Each tick it also runs the canary
//! ([`Perf::canary`]): a tracepoint that stopped recording kills the notifier, and the
//! notifier's errors then name it (`stopped_because`).
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::{Perf, Target};
use crate::backend::thread::{Control, EventThread};
use crate::backend::{Delivery, Invalidation, Watcher};
use crate::sink::{Count, Probe, Sink, Window, WindowEnd};
use crate::sys::SignalsBlocked;

/// How often the delivery thread pulls when no ring reached its watermark (ms).
const TICK: i32 = 10;

/// The sink, seen as the mechanism's [`Target`] (one to one).
struct To<'a>(&'a dyn Sink);

impl Target for To<'_> {
    fn begin(&self) {
        self.0.begin(Count::Known);
    }
    fn apply(&self, inv: Invalidation) {
        self.0.apply(inv);
    }
    fn end(&self) {
        self.0.end();
    }
    fn window_open(&self, start: u64, end: u64) -> u64 {
        self.0.window_open(start, end, WindowEnd::Closed).0
    }
    fn window_close(&self, window: u64) {
        self.0.window_close(Window(window));
    }
    fn invalidate_all(&self) {
        self.0.invalidate_all();
    }
    fn invalidate_again(&self, start: u64, end: u64, unmap: bool) {
        self.0.invalidate_in_thread(start, end, unmap, true);
    }
}

/// The perf backend of one notifier.
pub(crate) struct PerfWatcher(Arc<Perf>);

/// Opens the rings (see [`Perf::open`]) and says how.
pub(crate) fn open() -> Result<(Box<dyn Watcher>, String), crate::Unsupported> {
    let perf = Perf::open()?;
    let (threads, cpus, events) = perf.shape();
    let how = format!(
        "perf tracepoints: {cpus} rings (one per CPU), {events} events for {threads} threads"
    );
    Ok((Box::new(PerfWatcher(Arc::new(perf))), how))
}

/// Opens the MMU-notifier tracepoints' rings (`Backend::Tracepoint`, see [`super::mmu`]) and
/// says how.
pub(crate) fn open_mmu() -> Result<(Box<dyn Watcher>, String), crate::Unsupported> {
    let perf = super::mmu::open()?;
    let (_, cpus, events) = perf.shape();
    let how = format!(
        "mmu_notifier tracepoints: {cpus} rings (one per CPU), {events} CPU-wide events \
         filtered to this mm"
    );
    Ok((Box::new(PerfWatcher(Arc::new(perf))), how))
}

impl Watcher for PerfWatcher {
    fn watch(&self, _start: u64, _end: u64) -> crate::Result<()> {
        // Every traced call of the process is recorded, watched or not.
        Ok(())
    }

    fn unwatch(&self, _start: u64, _end: u64) {}

    fn splits_vmas(&self) -> bool {
        false
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        Some(Box::new(PerfProbe(self.0.clone())))
    }

    fn stopped_because(&self) -> Option<crate::Unsupported> {
        self.0
            .quiet_reason()
            .map(|missing| crate::Unsupported::Perf { missing })
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        spawn(self.0.clone(), sink).map_err(|source| crate::Error::Os {
            op: "spawn perf delivery thread",
            source,
        })
    }
}

struct PerfProbe(Arc<Perf>);

impl Probe for PerfProbe {
    #[inline]
    fn pull(&self, sink: &dyn Sink) {
        if self.0.pending() {
            // Delivery takes the index lock: no signal handler may run on this thread
            // meanwhile (the core's rule for its lock holders).
            let _blocked = SignalsBlocked::new();
            self.0.pull(&To(sink));
        }
    }
}

struct Drainer(EventThread);

impl Delivery for Drainer {
    fn monitor_tid(&self) -> i32 {
        self.0.tid()
    }

    fn stop(self: Box<Self>, forked: bool) {
        if forked {
            // The thread does not exist in a child.
            std::mem::forget(self);
            return;
        }
        self.0.stop();
    }
}

/// Starts the delivery thread (signals blocked, ready when this returns: see
/// `crate::backend::thread`).
fn spawn(perf: Arc<Perf>, sink: Arc<dyn Sink>) -> std::io::Result<Box<dyn Delivery>> {
    let t = EventThread::spawn("ummunotify-perf", move |control, tid| {
        run(&perf, &*sink, control, tid)
    })?;
    Ok(Box::new(Drainer(t)))
}

/// Polls the rings (at most 63 of them; the others are drained every tick) and the stop fd.
/// Event path: no allocation (the poll set is on the stack).
fn run(perf: &Perf, sink: &dyn Sink, control: &Control, tid: i32) {
    const MAX: usize = 64;
    let mut fds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; MAX];
    fds[0].fd = control.stop_fd().as_raw_fd();
    let mut n = 1;
    for f in perf.ring_fds().take(MAX - 1) {
        fds[n].fd = f.as_raw_fd();
        n += 1;
    }
    while !control.stopping() {
        // SAFETY: `fds[..n]` are valid pollfds on fds that outlive this loop.
        unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, TICK) };
        for f in &mut fds[1..n] {
            // A ring whose lead thread exited reports POLLHUP for good: the tick drains it.
            if f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                f.fd = -1;
            }
        }
        // The canary pulls too; a tracepoint gone quiet makes every check fail from now on.
        if let super::Canary::Suppressed(which) = perf.canary(tid, &To(sink)) {
            perf.went_quiet(which);
            sink.kill();
        }
    }
}
