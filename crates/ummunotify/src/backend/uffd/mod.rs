//! The userfaultfd backend: write-protect-mode registration (never write-protected, so no faults)
//! with the non-cooperative `UNMAP`, `REMOVE` and `REMAP` events.
#![allow(unsafe_code)] // Closing the fd from the monitor thread (`Uffd`), the context's fork-safe lock.
pub(crate) mod monitor;
pub(crate) mod sys;

use std::cell::UnsafeCell;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::table::{Place, SinkTable};
use super::{BackendReport, Delivery, Invalidation, Watcher};
use crate::coverage::{Coverage, Ranges};
use crate::sink::Sink;
use crate::{Error, Unsupported};
use sys::feature;

const REQUIRED: u64 = feature::EVENT_UNMAP | feature::EVENT_REMOVE | feature::EVENT_REMAP;

/// An initialised userfaultfd context.
///
/// The monitor closes the fd itself just before its thread exits ([`Uffd::close_from_monitor`]):
/// a thread's exit unmaps and frees memory (its stack, its TLS), and if any of that memory is
/// watched by this very context (an address reused after an unmap and re-watched on re-arm), the
/// exiting monitor would wait forever for an event only it could read. With the context closed,
/// there is nothing to wait for.
pub(crate) struct Uffd {
    fd: ManuallyDrop<OwnedFd>,
    closed: AtomicBool,
    features: u64,
    how: &'static str,
    /// Only private anonymous memory can be registered in write-protect mode here.
    anonymous_only: bool,
    /// The kernel offers `WP_ASYNC` (Linux 6.7+): VMAs of any kind can be registered, by this
    /// context or another; without it only anonymous, shmem and hugetlbfs ones.
    files: bool,
}

/// Opens a context the first way that works: the syscall, the syscall with
/// `UFFD_USER_MODE_ONLY` (unprivileged), then `/dev/userfaultfd`.
fn create() -> Result<(OwnedFd, &'static str), Unsupported> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let mut attempts = Vec::new();
    let mut enosys = false;
    for (how, res) in [
        ("userfaultfd(2)", sys::userfaultfd(flags)),
        (
            "userfaultfd(2) with UFFD_USER_MODE_ONLY",
            sys::userfaultfd(flags | sys::UFFD_USER_MODE_ONLY),
        ),
        ("/dev/userfaultfd", sys::userfaultfd_dev(flags)),
    ] {
        match res {
            Ok(fd) => return Ok((fd, how)),
            Err(e) => {
                enosys |= e.raw_os_error() == Some(libc::ENOSYS);
                attempts.push(format!("{how}: {e}"));
            }
        }
    }
    if enosys && !std::path::Path::new("/dev/userfaultfd").exists() {
        return Err(Unsupported::NoUserfaultfd);
    }
    Err(Unsupported::PermissionDenied {
        attempts: attempts.join("; "),
    })
}

/// The features the kernel offers (a handshake on a throw-away context: `UFFDIO_API` may be
/// issued only once per context).
fn offered() -> Result<u64, Unsupported> {
    let (fd, _) = create()?;
    sys::api(fd.as_fd(), 0)
        .map(|a| a.features)
        .map_err(Unsupported::Other)
}

fn names(bits: u64) -> Vec<&'static str> {
    (0..feature::NAMES.len())
        .filter(|i| bits & (1 << i) != 0)
        .map(|i| feature::NAMES[i])
        .collect()
}

impl Uffd {
    /// Opens and initialises a context with the events this crate needs, plus `WP_ASYNC` when
    /// offered (it lets file-backed and SysV-shm mappings be watched) and `EVENT_REMOVE_DONE`
    /// when offered (a patched kernel: every `REMOVE` then has an end, see `crate::inflight`).
    pub(crate) fn open() -> Result<Uffd, Unsupported> {
        let offered = offered()?;
        if offered & REQUIRED != REQUIRED {
            return Err(Unsupported::MissingFeatures {
                missing: names(REQUIRED & !offered),
            });
        }
        let wanted = REQUIRED | (offered & (feature::WP_ASYNC | feature::EVENT_REMOVE_DONE));
        let (fd, how) = create()?;
        // The kernel answers with every feature it has, not the ones enabled: remember ours.
        sys::api(fd.as_fd(), wanted).map_err(Unsupported::Other)?;
        Ok(Uffd {
            fd: ManuallyDrop::new(fd),
            closed: AtomicBool::new(false),
            features: wanted,
            how,
            anonymous_only: offered & (feature::WP_ASYNC | feature::WP_HUGETLBFS_SHMEM) == 0,
            files: offered & feature::WP_ASYNC != 0,
        })
    }

    /// Starts watching `[start, end)` (page aligned). Idempotent for ranges this context watches.
    pub(crate) fn watch(&self, start: u64, end: u64) -> io::Result<()> {
        sys::register_wp(self.fd.as_fd(), start, end - start)
    }

    /// Stops watching `[start, end)`.
    pub(crate) fn unwatch(&self, start: u64, end: u64) -> io::Result<()> {
        sys::unregister(self.fd.as_fd(), start, end - start)
    }

    /// Whether the VMA holding `[start, end)`, which this context watches, is anything but
    /// private anonymous memory (see [`sys::anonymous_probe`]); `None` when unknown. Where
    /// write-protect registration works only on anonymous memory (no `WP_ASYNC`, no
    /// `WP_HUGETLBFS_SHMEM`: Linux 5.7 to 5.19, and later kernels built without
    /// `CONFIG_PTE_MARKER_UFFD_WP`), a watch that succeeded says so already: no call at all.
    pub(crate) fn maybe_shared(&self, start: u64, end: u64) -> Option<bool> {
        if self.anonymous_only {
            return Some(false);
        }
        self.probe(start, end).shared
    }

    /// Right after this context watched `[start, end)`: `Some(shared)` when the probe proved
    /// that one registered VMA still holds all of it (no hole, nothing unmapped since the
    /// watch without a message to this context), with whether it may be shared; `None` when
    /// it did not (several VMAs, a kernel where the probe is not made). The probe the
    /// fresh-watch window needs anyway, so the check that the range is still mapped costs no
    /// call of its own (issue 41).
    pub(crate) fn covering(&self, start: u64, end: u64) -> Option<bool> {
        if self.anonymous_only {
            return None;
        }
        match self.probe(start, end) {
            sys::Probe {
                shared: Some(shared),
                one_vma: true,
            } => Some(shared),
            _ => None,
        }
    }

    fn probe(&self, start: u64, end: u64) -> sys::Probe {
        sys::anonymous_probe(
            self.fd.as_fd(),
            start,
            end - start,
            crate::sys::page_size() as u64,
            self.files,
        )
    }

    /// Whether file-backed and shm mappings can be watched.
    pub(crate) fn has_wp_async(&self) -> bool {
        self.features & feature::WP_ASYNC != 0
    }

    /// Whether the kernel ends every `REMOVE` with a `REMOVE_DONE` (this project's patch).
    pub(crate) fn has_remove_done(&self) -> bool {
        self.features & feature::EVENT_REMOVE_DONE != 0
    }

    pub(crate) fn how(&self) -> &'static str {
        self.how
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Closes the context: every watch is dropped and every waiting unmapper released.
    ///
    /// Called only by the monitor thread as it exits, which happens only when the notifier's
    /// `Drop` stops it (exclusive access: no user thread can be using the fd).
    pub(crate) fn close_from_monitor(&self) {
        if !self.closed.swap(true, SeqCst) {
            // SAFETY: the fd is open (closed was false) and, per the contract above, no other
            // thread uses it any more; `Drop` will not close it again.
            // A raw syscall: an interposed `close` (the 2010 compat preload) must not run here.
            unsafe { libc::syscall(libc::SYS_close, self.fd.as_raw_fd()) };
        }
    }
}

impl Drop for Uffd {
    fn drop(&mut self) {
        if !self.closed.swap(true, SeqCst) {
            // SAFETY: not closed yet, and we have exclusive access.
            unsafe { ManuallyDrop::drop(&mut self.fd) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One context per process (issue 10, item 4).

/// Notifiers one context serves at once (as many as `crate::fork` tracks).
pub(crate) const MAX_SINKS: usize = 1024;

/// What the monitor thread shares with the context.
pub(crate) struct Inner {
    pub(crate) uffd: Uffd,
    /// Every live notifier on this context: each message goes to all of them.
    pub(crate) sinks: SinkTable<MAX_SINKS>,
    /// The monitor could not read: it drains messages but delivers none (its sinks are dead).
    pub(crate) dead: AtomicBool,
}

/// The process's userfaultfd context, shared by every notifier on the userfaultfd backend
/// (Rust, C, the cache's, each 2010 descriptor): one kernel context, so no notifier's watch is
/// refused (`EBUSY`) for pages another of ours watches, and one monitor thread that hands each
/// message to every notifier's sink (each applies it to its own regions only).
///
/// Watches are counted per page across notifiers ([`Watches`]): a notifier that stops watching
/// a page unwatches it in the kernel only when no other notifier watches it. The context goes (its monitor stops, the fd closes) with the last
/// notifier on it; the next notifier opens a new one.
pub(crate) struct Context {
    inner: Arc<Inner>,
    /// Started by the first `deliver`.
    monitor: Mutex<Option<monitor::Monitor>>,
    /// The process that opened it (a forked child must neither join nor touch it).
    pid: i32,
    /// The pages each notifier watches, and how many watch each page.
    watched: Mutex<Watches>,
    /// Watchers on this context that are not hybrid: while any lives, the hooks must not remove
    /// watches (that notifier would not see the change), see [`Context::unwatch_in_hook`].
    plain: AtomicUsize,
}

fn getpid() -> i32 {
    // SAFETY: no preconditions.
    unsafe { libc::getpid() }
}

/// The current context: a spin lock of our own (a forked child resets it, so it never inherits
/// it held) around a weak reference.
struct Current {
    busy: AtomicBool,
    ctx: UnsafeCell<Option<Weak<Context>>>,
}

// SAFETY: `ctx` is only reached while `busy` is held (`Current::with`), or by the atfork child
// handler, when this is the only thread.
unsafe impl Sync for Current {}

static CURRENT: Current = Current {
    busy: AtomicBool::new(false),
    ctx: UnsafeCell::new(None),
};

impl Current {
    fn with<T>(&self, f: impl FnOnce(&mut Option<Weak<Context>>) -> T) -> T {
        while self
            .busy
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        // SAFETY: `busy` is held: no other reference to the cell exists.
        let r = f(unsafe { &mut *self.ctx.get() });
        self.busy.store(false, Release);
        r
    }
}

static ATFORK: crate::fork::AtforkOnce = crate::fork::AtforkOnce::new();

extern "C" fn forget_context_in_child() {
    ATFORK.registered_in_child();
    // SAFETY: the only thread of the child. The parent's weak reference is leaked, not dropped
    // (dropping may free, and a parent's thread may have held the allocator's lock).
    unsafe { std::ptr::write(CURRENT.ctx.get(), None) };
    CURRENT.busy.store(false, Release);
}

impl Context {
    /// The process's context: the current one, or a new one opened now.
    pub(crate) fn shared() -> Result<Arc<Context>, Unsupported> {
        ATFORK.register(None, None, Some(forget_context_in_child));
        let pid = getpid();
        let live = |w: &Option<Weak<Context>>| {
            w.as_ref()
                .and_then(Weak::upgrade)
                .filter(|c| c.pid == pid && !c.inner.dead.load(SeqCst))
        };
        if let Some(c) = CURRENT.with(|w| live(w)) {
            return Ok(c);
        }
        // Opened outside the lock (it takes syscalls); the first to install wins.
        let new = Arc::new(Context {
            inner: Arc::new(Inner {
                uffd: Uffd::open()?,
                sinks: SinkTable::new(),
                dead: AtomicBool::new(false),
            }),
            monitor: Mutex::new(None),
            pid,
            watched: Mutex::new(Watches::default()),
            plain: AtomicUsize::new(0),
        });
        Ok(CURRENT.with(|w| match live(w) {
            Some(c) => (c, Some(new)),
            None => {
                *w = Some(Arc::downgrade(&new));
                (new, None)
            }
        }))
        .map(|(c, spare)| {
            drop(spare); // outside the lock: it closes a context
            c
        })
    }

    pub(crate) fn how(&self) -> &'static str {
        self.inner.uffd.how()
    }

    fn forked(&self) -> bool {
        self.pid != getpid()
    }

    /// Hybrid's hook, before a libc call changes `[start, end)`: removes this context's watch
    /// from those pages, so the kernel sends no message and the calling thread does not wait
    /// for the monitor (the hybrid notifiers were invalidated in this thread). Returns whether
    /// the watch was removed (then the regions' coverage is lost, as with an unmap). Not while a
    /// non-hybrid notifier shares the context: it sees changes through messages only.
    ///
    /// Hook path: one ioctl, no allocation, no lock. Never in a forked child: the hooks
    /// deliver nothing there (they check they run in the publishing process before calling any sink).
    pub(crate) fn unwatch_in_hook(&self, start: u64, end: u64) -> bool {
        if self.plain.load(SeqCst) != 0 {
            return false;
        }
        sys::unregister(self.inner.uffd.fd(), start, end - start).is_ok()
    }

    /// The watches of every notifier on this context (the only lock on them).
    fn watches(&self) -> MutexGuard<'_, Watches> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn monitor_tid(&self) -> i32 {
        let m = self.monitor.lock().unwrap_or_else(|p| p.into_inner());
        m.as_ref().map_or(0, |m| m.tid())
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let monitor = self
            .monitor
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if self.forked() {
            // The monitor thread does not exist here; the fd is this child's copy.
            std::mem::forget(monitor);
            self.inner.uffd.close_from_monitor();
            return;
        }
        match monitor {
            // It closes the context itself before its thread exits (see `Uffd`).
            Some(m) => m.stop(),
            None => self.inner.uffd.close_from_monitor(),
        }
    }
}

/// The pages the notifiers on one context watch.
///
/// Each watcher's pages are a set (a page counts once per notifier, however many of its regions
/// hold it). The per-page count across watchers, which says whether a page a notifier stops
/// watching is still needed, is kept only while more than one watcher lives: most processes
/// have one notifier, and their misses then update one map, not two (issue 23).
#[derive(Default)]
pub(crate) struct Watches {
    /// Per watcher (by its place), the pages it watches; empty at a free place.
    sets: Vec<Coverage>,
    /// Free places in `sets`.
    free: Vec<usize>,
    /// Per page, how many watchers watch it: `Some` exactly while more than one watcher lives.
    all: Option<Coverage>,
}

impl Watches {
    fn live(&self) -> usize {
        self.sets.len() - self.free.len()
    }

    /// A place for a new watcher; counts pages per watcher from now on if it is the second.
    fn join(&mut self) -> usize {
        let at = match self.free.pop() {
            Some(at) => at,
            None => {
                self.sets.push(Coverage::new());
                self.sets.len() - 1
            }
        };
        if self.live() == 2 && self.all.is_none() {
            let mut all = Coverage::new();
            for set in &self.sets {
                set.for_each_covered(0, !4095, |s, e| {
                    all.add(s, e);
                });
            }
            self.all = Some(all);
        }
        at
    }

    /// The watcher at `at` is gone (its pages removed already).
    fn leave(&mut self, at: usize) {
        self.sets[at] = Coverage::new();
        self.free.push(at);
        if self.live() < 2 {
            self.all = None;
        }
    }

    /// Calls `f` for each part of `[start, end)` that `at` watches.
    fn covered_by(&self, at: usize, start: u64, end: u64, f: impl FnMut(u64, u64)) {
        self.sets[at].for_each_covered(start, end, f);
    }

    /// `at` watches `[start, end)` now.
    fn add(&mut self, at: usize, start: u64, end: u64) {
        let filled = self.sets[at].fill(start, end);
        if let Some(all) = &mut self.all {
            for (s, e) in filled {
                all.add(s, e);
            }
        }
    }

    /// `at` stops watching `[start, end)`.
    fn remove(&mut self, at: usize, start: u64, end: u64) {
        for (s, e) in self.sets[at].covered(start, end) {
            self.sets[at].remove(s, e);
            if let Some(all) = &mut self.all {
                all.remove(s, e);
            }
        }
    }

    /// The parts of `[start, end)` no watcher watches (`at`, when it is the only one).
    fn unneeded(&self, at: usize, start: u64, end: u64) -> Ranges {
        match &self.all {
            Some(all) => all.uncovered(start, end),
            None => self.sets[at].uncovered(start, end),
        }
    }
}

/// The userfaultfd backend of one notifier: the process's context, and its place among the
/// context's [`Watches`].
///
/// Visibility rule: the busy protocol. The monitor marks every sink busy before each
/// single-message `read()`; that read is what releases the unmapping thread.
pub(crate) struct UffdWatcher {
    ctx: Arc<Context>,
    /// This watcher's place in the context's `watched`.
    at: usize,
    /// Counted in the context's `plain` (not part of a hybrid watcher).
    plain: bool,
}

/// The [`Watcher`] of one notifier on the process's context.
pub(crate) fn watcher(ctx: Arc<Context>) -> Box<dyn Watcher> {
    Box::new(UffdWatcher::new(ctx, true))
}

impl UffdWatcher {
    /// A watcher on `ctx`; `plain` unless it is the userfaultfd half of a hybrid watcher.
    pub(crate) fn new(ctx: Arc<Context>, plain: bool) -> UffdWatcher {
        if plain {
            ctx.plain.fetch_add(1, SeqCst);
        }
        let at = ctx.watches().join();
        UffdWatcher { ctx, at, plain }
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Whether this watcher counts every page of `[start, end)`: the probe's ioctls must never
    /// touch pages another library's userfaultfd context owns (the hybrid's hooks-only ranges).
    fn watches_all(&self, start: u64, end: u64) -> bool {
        let mut watched = 0;
        self.ctx
            .watches()
            .covered_by(self.at, start, end, |s, e| watched += e - s);
        watched == end - start
    }

    /// Unwatches what of `[start, end)` no notifier watches any more.
    fn unwatch_unneeded(&self, w: &Watches, start: u64, end: u64) {
        for (s, e) in w.unneeded(self.at, start, end) {
            // Parts may be unmapped already; the kernel dropped those watches itself.
            let _ = self.ctx.inner.uffd.unwatch(s, e);
        }
    }
}

impl Watcher for UffdWatcher {
    fn watch(&self, start: u64, end: u64) -> crate::Result<()> {
        let mut w = self.ctx.watches();
        // The whole range, even pages already counted: a watch lost with an unmap may have been
        // replaced by a new mapping since (watching is idempotent on one context).
        self.ctx.inner.uffd.watch(start, end).map_err(watch_error)?;
        w.add(self.at, start, end);
        Ok(())
    }

    fn maybe_shared(&self, start: u64, end: u64) -> Option<bool> {
        if !self.watches_all(start, end) {
            return None;
        }
        self.ctx.inner.uffd.maybe_shared(start, end)
    }

    fn covering(&self, start: u64, end: u64) -> Option<bool> {
        if !self.watches_all(start, end) {
            return None;
        }
        self.ctx.inner.uffd.covering(start, end)
    }

    /// `UFFDIO_REGISTER` fails unless a VMA overlaps the range (every kernel since 4.3: the
    /// first VMA ending above `start` must begin below `end`), and one page overlapped is one
    /// page covered.
    fn watch_maps_one_page(&self) -> bool {
        true
    }

    fn unwatch(&self, start: u64, end: u64) {
        let mut w = self.ctx.watches();
        w.remove(self.at, start, end);
        // Also pages no notifier counts (the moved watch of an mremap): nobody needs them.
        self.unwatch_unneeded(&w, start, end);
    }

    fn splits_vmas(&self) -> bool {
        true
    }

    fn fresh_watch_window(&self) -> bool {
        true
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        // REMOVE in flight: the signal that tells a remover is back in user space.
        crate::inflight::install();
        {
            let mut m = self.ctx.monitor.lock().unwrap_or_else(|p| p.into_inner());
            if m.is_none() {
                let spawned =
                    monitor::spawn(self.ctx.inner.clone()).map_err(|source| Error::Os {
                        op: "spawn monitor thread",
                        source,
                    })?;
                *m = Some(spawned);
            }
        }
        let place = self.ctx.inner.sinks.publish(sink).ok_or(Error::Os {
            op: "userfaultfd registration",
            source: io::Error::other("too many live notifiers on this process's context"),
        })?;
        Ok(Box::new(Published {
            ctx: self.ctx.clone(),
            place: Some(place),
        }))
    }
}

impl Drop for UffdWatcher {
    /// The notifier is gone: its pages are unwatched unless another notifier watches them.
    fn drop(&mut self) {
        if self.plain {
            self.ctx.plain.fetch_sub(1, SeqCst);
        }
        if self.ctx.forked() {
            // A child's ioctls would act on the parent's address space (the context's mm).
            return;
        }
        let mut w = self.ctx.watches();
        for (s, e) in w.sets[self.at].covered(0, !4095) {
            w.remove(self.at, s, e);
            self.unwatch_unneeded(&w, s, e);
        }
        w.leave(self.at);
    }
}

/// A notifier's place among the context's sinks ([`Delivery`] of the userfaultfd backend).
struct Published {
    ctx: Arc<Context>,
    place: Option<Place>,
}

impl Delivery for Published {
    fn monitor_tid(&self) -> i32 {
        self.ctx.monitor_tid()
    }

    fn stop(mut self: Box<Self>, forked: bool) {
        if forked {
            // The monitor does not exist here, and may have held this slot at fork time.
            std::mem::forget(self);
            return;
        }
        if let Some(p) = self.place.take() {
            // Returns once the monitor is not delivering to this sink (one message at most).
            self.ctx.inner.sinks.retire(p);
        }
    }
}

/// Maps a refused `UFFDIO_REGISTER` on a mapped range to a typed error.
fn watch_error(e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EBUSY) => Error::RangeBusy,
        Some(libc::ENOMEM) => Error::CoverageLimit(e),
        Some(libc::EINVAL) | Some(libc::EPERM) => Error::UnsupportedMapping(e),
        _ => Error::Os {
            op: "UFFDIO_REGISTER",
            source: e,
        },
    }
}

/// Decodes a message into an [`Invalidation`]. Event path: no allocation.
pub(crate) fn decode(msg: &sys::UffdMsg) -> Invalidation {
    match msg.event {
        sys::event::UNMAP => Invalidation::Unmap {
            start: msg.arg[0],
            end: msg.arg[1],
        },
        sys::event::REMOVE => Invalidation::Remove {
            start: msg.arg[0],
            end: msg.arg[1],
        },
        // The end of a REMOVE (the patched kernel): not a change; the monitor closes its window.
        sys::event::REMAP => Invalidation::Remap {
            from: msg.arg[0],
            to: msg.arg[1],
            len: msg.arg[2],
        },
        _ => Invalidation::Other,
    }
}

/// What `umn doctor` prints about userfaultfd.
pub(crate) fn probe() -> BackendReport {
    let mut notes = Vec::new();
    let kernel_features = offered().map(names).unwrap_or_default();
    let status = Uffd::open().map(|u| {
        if !u.has_wp_async() {
            notes.push(
                "no UFFD_FEATURE_WP_ASYNC: file-backed and SysV shm mappings can not be watched"
                    .to_string(),
            );
        }
        notes.push(
            "not seen by userfaultfd (kernel sends no event): shmdt, MADV_GUARD_INSTALL, \
             MADV_COLLAPSE, fallocate(PUNCH_HOLE)/ftruncate of a mapped file"
                .to_string(),
        );
        if u.has_remove_done() {
            notes.push(
                "EVENT_REMOVE_DONE (this project's kernel patch): every REMOVE ends with a \
                 REMOVE_DONE after its zap, which closes its window; no sender is named or \
                 signalled"
                    .to_string(),
            );
        }
        let mut used = names(u.features);
        if u.has_remove_done() {
            used.push("EVENT_REMOVE_DONE");
        }
        format!(
            "ok: opened with {}; features in use: {}",
            u.how(),
            used.join(" ")
        )
    });
    if let Ok(v) = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd") {
        notes.push(format!("vm.unprivileged_userfaultfd = {}", v.trim()));
    }
    notes.push(match std::env::var("UMN_SIGNAL").ok().as_deref() {
        Some("0") => "REMOVE windows: no signal (UMN_SIGNAL=0): a registration racing a \
                      madvise waits until a later look or 200 ms"
            .to_owned(),
        v => format!(
            "REMOVE windows: signal {} to the threads that may be in a racing madvise, only while \
             a registration waits for one (installed if unused, without SA_ONSTACK; added to \
             the sa_mask of the process's SA_ONSTACK handlers; README \"One signal\"; \
             UMN_SIGNAL=0 turns it off)",
            v.and_then(|s| s.parse::<i32>().ok())
                .unwrap_or(libc::SIGRTMAX() - crate::inflight::SIGNAL_OFFSET)
        ),
    });
    let query = crate::sys::vma::Vmas::open().is_ok_and(|v| v.has_query());
    notes.push(if query {
        "PROCMAP_QUERY works: a watch's shared-memory check is one ioctl".to_owned()
    } else {
        {
            let u = Uffd::open().ok();
            format!(
                "no PROCMAP_QUERY (Linux < 6.11): a watch's shared-memory check is {} (issue 41); \
                 over the VMA budget, and for ranges with holes, each VMA lookup reads all of \
                 /proc/self/maps (about 0.3 µs per VMA the process has)",
                match u {
                    Some(u) if u.anonymous_only => {
                        "free: only anonymous memory can be watched here"
                    }
                    Some(u) if !u.files => {
                        "UFFDIO_CONTINUE, O(log VMAs), which also proves the range still mapped; \
                         ranges over several VMAs read all of /proc/self/maps"
                    }
                    _ => {
                        "UFFDIO_CONTINUE + UFFDIO_ZEROPAGE, O(log VMAs), which also prove the \
                         range still mapped; ranges over several VMAs read all of \
                         /proc/self/maps"
                    }
                }
            )
        }
    });
    let max = crate::sys::vma::max_map_count();
    let vmas = crate::sys::vma::count().map_or("?".to_owned(), |n| n.to_string());
    notes.push(format!(
        "vm.max_map_count = {max}: a notifier watches regions' own pages while the process has \
         under {} VMAs (half, less a margin of 1024; this process has {vmas}), and past that \
         the whole VMAs they lie in (which splits none; their other pages then pay a round trip)",
        max / 2 - 1024.min(max / 2)
    ));
    BackendReport {
        name: "userfaultfd",
        status,
        kernel_features,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(flags: libc::c_int, fd: libc::c_int) -> u64 {
        // SAFETY: a fresh mapping at an address the kernel picks; only this test uses it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as u64
    }

    /// The probe that replaces `/proc/self/maps` for the fresh-watch window (issue 41) tells
    /// private anonymous memory from shmem (`MAP_SHARED` anonymous, memfd shared or private)
    /// and from a file on disk, populated or not; and the second registered VMA after a first
    /// one is "not known", never "anonymous".
    #[test]
    fn anonymous_probe_tells_mappings_apart() {
        let Ok(u) = Uffd::open() else {
            eprintln!("SKIP: no userfaultfd here");
            return;
        };
        let pg = crate::sys::page_size() as u64;
        // SAFETY: memfd_create with a literal name.
        let memfd = unsafe { libc::memfd_create(c"probe".as_ptr(), 0) };
        assert!(memfd >= 0);
        // SAFETY: sizes our own memfd.
        assert_eq!(unsafe { libc::ftruncate(memfd, 2 * pg as i64) }, 0);
        let path = std::env::temp_dir().join(format!("umn-probe-{}", std::process::id()));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(2 * pg).unwrap();
        let _ = std::fs::remove_file(&path);
        let ffd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let cases = [
            (
                "private anonymous",
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                false,
            ),
            (
                "shared anonymous",
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                true,
            ),
            ("memfd shared", libc::MAP_SHARED, memfd, true),
            ("memfd private", libc::MAP_PRIVATE, memfd, true),
            ("file shared", libc::MAP_SHARED, ffd, true),
        ];
        for touch in [false, true] {
            for &(name, flags, fd, shared) in &cases {
                let p = map(flags, fd);
                if touch {
                    // SAFETY: our own writable mapping.
                    unsafe { (p as *mut u8).write_volatile(1) };
                }
                if u.watch(p, p + 2 * pg).is_err() {
                    eprintln!("{name}: not watchable here");
                    assert!(fd >= 0 || flags & libc::MAP_SHARED != 0, "{name}");
                } else {
                    let got = u.maybe_shared(p, p + 2 * pg);
                    eprintln!("{name} (touched {touch}): {got:?}");
                    if shared {
                        assert_ne!(got, Some(false), "{name}");
                    } else {
                        assert_eq!(got, Some(false), "{name}");
                    }
                    // One VMA, just watched: the probe proves it is all there (private
                    // anonymous memory always; shmem when the kernel gets to its pages, which
                    // a second probe of the same pages may not), with a right answer.
                    let covering = u.covering(p, p + 2 * pg);
                    eprintln!("  covering: {covering:?}");
                    if u.anonymous_only {
                        assert_eq!(covering, None, "{name}");
                    } else if shared {
                        assert_ne!(covering, Some(false), "{name}");
                    } else {
                        assert_eq!(covering, Some(false), "{name}");
                    }
                    // Where the kernel lacks WP_ASYNC it registers only anonymous, shmem and
                    // hugetlbfs VMAs, and the probe skips UFFDIO_ZEROPAGE: on those kinds it
                    // must never say "private anonymous" of shared memory, and must of private.
                    if !u.anonymous_only && !name.starts_with("file") {
                        let short = sys::anonymous_probe(u.fd(), p, 2 * pg, pg, false);
                        eprintln!("  without WP_ASYNC: {short:?}");
                        if shared {
                            assert_ne!(short.shared, Some(false), "{name}");
                        } else {
                            assert_eq!(
                                short,
                                sys::Probe {
                                    shared: Some(false),
                                    one_vma: true
                                }
                            );
                        }
                    }
                    // The probe changed no data.
                    // SAFETY: our own mapping.
                    let first = unsafe { (p as *const u8).read_volatile() };
                    assert_eq!(first, u8::from(touch), "{name}");
                }
                // Unwatched first: nobody reads this context, and an unmap of watched memory
                // waits until its message is read.
                let _ = u.unwatch(p, p + 2 * pg);
                // SAFETY: our own mapping.
                unsafe { libc::munmap(p as *mut libc::c_void, 2 * pg as usize) };
            }
        }
        // Two VMAs under one range (different protections): never "anonymous" unless the
        // kernel can only watch anonymous memory anyway.
        let p = map(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        // SAFETY: changes the protection of our own page.
        unsafe { libc::mprotect((p + pg) as *mut libc::c_void, pg as usize, libc::PROT_READ) };
        u.watch(p, p + 2 * pg).unwrap();
        let shared = map(libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1);
        if u.watch(shared, shared + 2 * pg).is_ok() {
            assert_eq!(
                u.maybe_shared(p, p + 2 * pg),
                u.anonymous_only.then_some(false)
            );
        }
        // Nor does it prove them to be one mapping, however it is asked.
        assert_eq!(u.covering(p, p + 2 * pg), None);
        for files in [false, true] {
            let probe = sys::anonymous_probe(u.fd(), p, 2 * pg, pg, files);
            assert!(!probe.one_vma, "{probe:?}");
        }
        // A hole: its two watched pages are no proof for the range around it.
        let holed = map(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        // SAFETY: unmaps the second page of our own (unwatched) mapping.
        unsafe { libc::munmap((holed + pg) as *mut libc::c_void, pg as usize) };
        u.watch(holed, holed + pg).unwrap();
        assert!(u.watch(holed + pg, holed + 2 * pg).is_err());
        assert_eq!(u.covering(holed, holed + 2 * pg), None);
        if !u.anonymous_only {
            assert_eq!(u.covering(holed, holed + pg), Some(false));
        }
        let _ = u.unwatch(holed, holed + pg);
        // SAFETY: our own page.
        unsafe { libc::munmap(holed as *mut libc::c_void, pg as usize) };
        let _ = u.unwatch(p, p + 2 * pg);
        let _ = u.unwatch(shared, shared + 2 * pg);
        // SAFETY: our own mappings and fd.
        unsafe {
            libc::munmap(p as *mut libc::c_void, 2 * pg as usize);
            libc::munmap(shared as *mut libc::c_void, 2 * pg as usize);
            libc::close(memfd);
        }
    }
}
