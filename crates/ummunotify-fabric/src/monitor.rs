//! The monitor object libfabric calls: subscriptions on top of one [`Notifier`], the six
//! `export_ops`, and the delivery thread that turns notifier events into `import_ops->notify`.
//!
//! # Locks, and why nothing here can deadlock against libfabric
//!
//! libfabric calls `subscribe`, `valid` and (from 2.1 on) `unsubscribe` with its `mm_lock`
//! held; its `notify` takes `mm_list_rwlock` (read) and then `mm_lock`. This module has one lock
//! of its own, the subscription `table`, and the notifier's internal locks.
//!
//! * `mm_lock` → `table` → notifier: the callbacks. `subscribe` registers with the notifier under
//!   `table` (it may allocate and make syscalls: that is allowed there, it is not the event path).
//! * The delivery thread takes `table` only for a short, allocation-free section, and **releases it
//!   before** calling `notify`; it holds no lock of ours while it waits for `mm_lock`. So
//!   `notify`'s path into libfabric, and libfabric's re-entry into `unsubscribe` from inside
//!   `notify` (2.1+ uncaches entries there and unsubscribes each), find `table` free.
//! * The notifier's monitor thread (the event path) takes none of these locks, so a user thread
//!   that holds `mm_lock` or `table` while it unmaps (libfabric frees, the allocator trims) is
//!   released as soon as the monitor thread reads the message. The delivery thread then waits for
//!   `mm_lock` like any other libfabric user: it is not on the unmapping thread's critical path.
//!
//! # Fork
//!
//! A `pthread_atfork` child handler bumps a process-wide fork count. State made before the fork
//! (its table lock may have been held by the delivery thread, which does not exist in the child)
//! is never touched again in the child: `valid` answers false, `subscribe` fails (libfabric then
//! uses the registration uncached), `stop` forgets it. A `start` in the child builds fresh state
//! with a fresh notifier.
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use ummunotify::{Cookie, Error, Event, Notifier, Region};

use crate::abi::{self, FiOpsMemMonitor, FidMemMonitor};

/// Forks seen by this process (bumped by the `pthread_atfork` child handler).
static FORKS: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();
/// Whether [`on_fork_child`] is registered in this process.
static REGISTERED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_fork_child() {
    FORKS.fetch_add(1, SeqCst);
}

fn register_atfork() {
    // SAFETY: registers a handler that only does an atomic add (async-signal-safe, no locks).
    // A failure (ENOMEM) leaves fork detection off; report it rather than pretend.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) };
    if rc == 0 {
        REGISTERED.store(true, SeqCst);
    } else {
        eprintln!("ummunotify-fabric: pthread_atfork failed ({rc}): fork safety is off");
    }
}

/// Registers [`on_fork_child`] when the library is loaded, before `main` and any thread of the
/// program: no thread can then be half-way through registering it when another forks (a child
/// would inherit a `Once` half-run and wait in it for ever: guarantee 6).
#[used]
#[link_section = ".init_array"]
static REGISTER_AT_LOAD: extern "C" fn() = {
    extern "C" fn at_load() {
        register_atfork();
    }
    at_load
};

/// Makes sure [`on_fork_child`] is registered: done at load ([`REGISTER_AT_LOAD`]); the `Once`
/// is only the fallback for a link that dropped the load-time entry.
fn install_atfork() {
    if !REGISTERED.load(SeqCst) {
        ATFORK.call_once(register_atfork);
    }
}

/// Default limit of subscriptions per monitor (8 times libfabric's default
/// `FI_MR_CACHE_MAX_COUNT` of 1024 entries per cache).
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 8192;
/// Environment variable overriding [`DEFAULT_MAX_SUBSCRIPTIONS`].
pub const MAX_SUBSCRIPTIONS_ENV: &str = "UMMUNOTIFY_FABRIC_MAX_SUBSCRIPTIONS";

/// Counters of one monitor, for diagnostics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Whether the monitor is started (owns a notifier and a delivery thread).
    pub started: bool,
    /// Subscriptions now (each its own notifier region; identical ranges each count).
    pub subscriptions: usize,
    /// `subscribe` calls that succeeded.
    pub subscribes: u64,
    /// `subscribe` calls that failed (libfabric then uses the registration uncached).
    pub subscribe_failures: u64,
    /// `unsubscribe` calls.
    pub unsubscribes: u64,
    /// `unsubscribe` calls for a range with no live subscription (already invalidated).
    pub unsubscribes_unknown: u64,
    /// `notify` calls made into libfabric.
    pub notifies: u64,
    /// Events that found their subscription gone (unsubscribed after the change).
    pub events_dropped: u64,
    /// Subscriptions ended (with a `notify`) to stay under the limit.
    pub evictions: u64,
}

/// One subscription: one `subscribe` call, one notifier region on the memory mapped at the
/// range when it was made.
///
/// Identical subscriptions are not shared: the memory at a range may be replaced while the
/// unmapping thread is still blocked in the kernel (userfaultfd frees the address before it
/// waits for the monitor), so an older subscription may watch a mapping that is already gone,
/// and sharing it would leave the new memory unwatched.
struct Sub {
    cookie: u64,
    region: Region,
    /// Its `notify` is owed or under way (invalidated, or evicted by the limit). It stays in the
    /// table until that `notify` returned, so that meanwhile `valid` answers false for the range:
    /// another MR cache may still hold an entry on the old pages until the `notify` reached it.
    ending: bool,
}

/// A hasher for addresses and cookies (the keys come from libfabric and from us, not from an
/// adversary, so SipHash's flood resistance buys nothing here; it was most of `valid()`'s cost).
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing, folded so the high bits (where hashbrown looks) see every input bit.
        let x = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type AddrMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;

/// The live subscriptions, by exact range and by cookie.
struct Table {
    notifier: Option<Arc<Notifier>>,
    /// Subscriptions by exact range, oldest first.
    by_range: AddrMap<(usize, usize), Vec<Sub>>,
    by_cookie: AddrMap<u64, (usize, usize)>,
    /// Subscriptions in `by_range`.
    subs: usize,
    next_cookie: u64,
    /// Subscriptions in the order they were made (entries of ended ones are skipped, and
    /// compacted away when the queue grows past twice the limit).
    order: VecDeque<(u64, (usize, usize))>,
    /// Subscriptions ended to stay under the limit, owed a `notify` by the delivery thread.
    evicted: Vec<(u64, usize, usize)>,
    /// Wakes the delivery thread for `evicted` (while started).
    wake: Option<OwnedFd>,
    /// Subscriptions in `by_range` that are `ending`.
    ending: usize,
}

impl Table {
    /// The subscription named `cookie`.
    fn sub_mut(&mut self, cookie: u64) -> Option<&mut Sub> {
        let range = self.by_cookie.get(&cookie)?;
        self.by_range
            .get_mut(range)?
            .iter_mut()
            .find(|s| s.cookie == cookie)
    }

    /// Removes the subscription named `cookie` from the table; false if there was none.
    fn remove(&mut self, cookie: u64) -> bool {
        let Some(range) = self.by_cookie.remove(&cookie) else {
            return false;
        };
        let Some(v) = self.by_range.get_mut(&range) else {
            return false;
        };
        let Some(i) = v.iter().position(|s| s.cookie == cookie) else {
            return false;
        };
        if v.remove(i).ending {
            self.ending -= 1;
        }
        if v.is_empty() {
            self.by_range.remove(&range);
        }
        self.subs -= 1;
        true
    }
}

/// The delivery thread of a started monitor.
struct Delivery {
    thread: JoinHandle<()>,
    stop: OwnedFd,
}

/// State of one monitor in one process (replaced in a forked child by `start`).
struct Inner {
    born: u64,
    /// At most this many subscriptions (see [`Monitor::with_max_subscriptions`]).
    limit: usize,
    table: Mutex<Table>,
    running: Mutex<Option<Delivery>>,
    delivery_thread: Mutex<Option<ThreadId>>,
    /// Set by the delivery thread from before it reads events until their `notify` calls returned.
    in_flight: AtomicBool,
    subscribes: AtomicU64,
    subscribe_failures: AtomicU64,
    unsubscribes: AtomicU64,
    unsubscribes_unknown: AtomicU64,
    notifies: AtomicU64,
    events_dropped: AtomicU64,
    evictions: AtomicU64,
}

impl Inner {
    fn new(limit: usize) -> Inner {
        Inner {
            born: FORKS.load(SeqCst),
            limit,
            table: Mutex::new(Table {
                notifier: None,
                by_range: AddrMap::default(),
                by_cookie: AddrMap::default(),
                subs: 0,
                next_cookie: 1,
                order: VecDeque::new(),
                evicted: Vec::new(),
                wake: None,
                ending: 0,
            }),
            running: Mutex::new(None),
            delivery_thread: Mutex::new(None),
            in_flight: AtomicBool::new(false),
            subscribes: AtomicU64::new(0),
            subscribe_failures: AtomicU64::new(0),
            unsubscribes: AtomicU64::new(0),
            unsubscribes_unknown: AtomicU64::new(0),
            notifies: AtomicU64::new(0),
            events_dropped: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// Whether this state was made by a parent process (never touch its locks then).
    fn inherited(&self) -> bool {
        FORKS.load(Relaxed) != self.born
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic under the lock (caught at the FFI boundary) leaves the table consistent: every
        // section below finishes its map updates before anything that can panic.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The object handed to libfabric: a `struct fid_mem_monitor` first (libfabric passes a pointer
/// to it back to every callback), then our state.
#[repr(C)]
pub(crate) struct MonitorObject {
    raw: UnsafeCell<FidMemMonitor>,
    export_ops: UnsafeCell<FiOpsMemMonitor>,
    inner: AtomicPtr<Inner>,
    limit: usize,
}

// SAFETY: `raw` and `export_ops` are written only before the object is shared (construction) and
// by libfabric during import (before `start`, which publishes them to the delivery thread through
// the thread spawn); everything else is atomics and locks.
unsafe impl Sync for MonitorObject {}
// SAFETY: as above; the raw pointers inside point to the object itself or to libfabric's statics.
unsafe impl Send for MonitorObject {}

impl MonitorObject {
    fn new(limit: usize) -> Box<MonitorObject> {
        install_atfork();
        let limit = limit.max(1);
        let obj = Box::new(MonitorObject {
            raw: UnsafeCell::new(FidMemMonitor {
                fid: abi::Fid {
                    fclass: abi::FI_CLASS_MEM_MONITOR,
                    context: ptr::null_mut(),
                    ops: ptr::null_mut(),
                },
                export_ops: ptr::null_mut(),
                import_ops: ptr::null_mut(),
            }),
            export_ops: UnsafeCell::new(FiOpsMemMonitor {
                size: std::mem::size_of::<FiOpsMemMonitor>(),
                start: Some(start),
                stop: Some(stop),
                subscribe: Some(subscribe),
                unsubscribe: Some(unsubscribe),
                valid: Some(valid),
            }),
            inner: AtomicPtr::new(Box::into_raw(Box::new(Inner::new(limit)))),
            limit,
        });
        // SAFETY: the object is not shared yet; the pointer targets its own field, which never
        // moves (boxed).
        unsafe { (*obj.raw.get()).export_ops = obj.export_ops.get() };
        obj
    }

    /// The `struct fid_mem_monitor *` to give libfabric.
    pub(crate) fn raw(&self) -> *mut FidMemMonitor {
        self.raw.get()
    }

    fn inner(&self) -> &Inner {
        // SAFETY: `inner` always points to a live `Inner`: replaced ones are leaked, never freed,
        // and the current one is freed only by `Monitor::drop`, which owns the object.
        unsafe { &*self.inner.load(Acquire) }
    }

    /// # Safety
    /// `mon` must be the `raw()` of a live `MonitorObject` (what libfabric passes back).
    unsafe fn from_raw<'a>(mon: *mut FidMemMonitor) -> &'a MonitorObject {
        // SAFETY: `raw` is the first field of a `repr(C)` struct, so the pointers coincide; the
        // caller guarantees the object is alive.
        unsafe { &*mon.cast::<MonitorObject>() }
    }
}

/// A ummunotify memory monitor for libfabric: a `struct fid_mem_monitor` whose `export_ops` are
/// implemented on a [`Notifier`].
///
/// [`crate::import`] makes one and imports it into libfabric; tests and programs that drive the
/// monitor themselves (as libfabric's MR cache would) make their own with [`Monitor::new`] and
/// call the function pointers behind [`Monitor::as_raw`].
///
/// ```no_run
/// use ummunotify_fabric::Monitor;
///
/// let monitor = Monitor::new();
/// let raw = monitor.as_raw();
/// // SAFETY: `raw` is live while `monitor` is; the ops table is set.
/// let ops = unsafe { &*(*raw).export_ops };
/// // SAFETY: start with the monitor's own pointer.
/// assert_eq!(unsafe { (ops.start.unwrap())(raw) }, 0);
/// let buf = vec![0u8; 1 << 20];
/// // SAFETY: as above; the range is mapped.
/// unsafe {
///     assert_eq!((ops.subscribe.unwrap())(raw, buf.as_ptr().cast(), buf.len()), 0);
///     assert!((ops.valid.unwrap())(raw, buf.as_ptr().cast(), buf.len()));
///     (ops.unsubscribe.unwrap())(raw, buf.as_ptr().cast(), buf.len());
///     (ops.stop.unwrap())(raw);
/// }
/// ```
pub struct Monitor {
    obj: *mut MonitorObject,
}

// SAFETY: the object is Sync + Send (see `MonitorObject`); `Monitor` only owns the allocation.
unsafe impl Send for Monitor {}
// SAFETY: as above.
unsafe impl Sync for Monitor {}

impl Default for Monitor {
    fn default() -> Self {
        Monitor::new()
    }
}

impl Monitor {
    /// A monitor that is not started and not imported; its `import_ops` is null until libfabric
    /// (or the caller) sets it. No notifier exists until `start`. At most
    /// [`DEFAULT_MAX_SUBSCRIPTIONS`] subscriptions (or `UMMUNOTIFY_FABRIC_MAX_SUBSCRIPTIONS`).
    pub fn new() -> Monitor {
        let limit = crate::import::env_var(MAX_SUBSCRIPTIONS_ENV)
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MAX_SUBSCRIPTIONS);
        Monitor::with_max_subscriptions(limit)
    }

    /// A monitor that keeps at most `limit` (at least 1) subscriptions.
    ///
    /// libfabric up to 2.0 never unsubscribes: a range stays subscribed after its cache entry was
    /// evicted, until its memory changes. To keep memory bounded by the limit, a subscribe that
    /// would exceed it ends the oldest subscription, and libfabric is told with a `notify` for
    /// that range (which drops the entry if it is still cached: a spurious, safe invalidation).
    pub fn with_max_subscriptions(limit: usize) -> Monitor {
        Monitor {
            obj: Box::into_raw(MonitorObject::new(limit)),
        }
    }

    /// Leaks the monitor (libfabric keeps the pointer for the life of the process).
    pub(crate) fn leak(self) -> &'static MonitorObject {
        let obj = self.obj;
        std::mem::forget(self);
        // SAFETY: the allocation is never freed now.
        unsafe { &*obj }
    }

    fn obj(&self) -> &MonitorObject {
        // SAFETY: owned, alive until drop.
        unsafe { &*self.obj }
    }

    /// The `struct fid_mem_monitor *` (its `export_ops` filled in, `fid.fclass` set).
    pub fn as_raw(&self) -> *mut FidMemMonitor {
        self.obj().raw()
    }

    /// The notifier, while the monitor is started (in this process).
    pub fn notifier(&self) -> Option<Arc<Notifier>> {
        stats_notifier(self.obj()).1
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        stats_notifier(self.obj()).0
    }

    /// Waits until every invalidation the notifier has dequeued so far has been delivered
    /// (`notify` returned) or dropped, at most `timeout`. Returns whether it got there.
    ///
    /// For tests and diagnostics: after an unmapping call returned, this returning `true` means
    /// every `notify` that call owes has been made.
    pub fn wait_delivered(&self, timeout: Duration) -> bool {
        let Some(n) = self.notifier() else {
            return true;
        };
        let deadline = Instant::now() + timeout;
        // Waits while the notifier is mid-message, so the message's events are queued now.
        if n.generation().is_err() {
            return true;
        }
        let inner = self.obj().inner();
        loop {
            let evicted = inner.table().evicted.len();
            if n.stats().pending == 0 && evicted == 0 && !inner.in_flight.load(SeqCst) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn stats_notifier(obj: &MonitorObject) -> (Stats, Option<Arc<Notifier>>) {
    let inner = obj.inner();
    let mut s = Stats {
        subscribes: inner.subscribes.load(Relaxed),
        subscribe_failures: inner.subscribe_failures.load(Relaxed),
        unsubscribes: inner.unsubscribes.load(Relaxed),
        unsubscribes_unknown: inner.unsubscribes_unknown.load(Relaxed),
        notifies: inner.notifies.load(Relaxed),
        events_dropped: inner.events_dropped.load(Relaxed),
        evictions: inner.evictions.load(Relaxed),
        ..Stats::default()
    };
    if inner.inherited() {
        return (s, None);
    }
    let t = inner.table();
    s.started = t.notifier.is_some();
    s.subscriptions = t.subs;
    (s, t.notifier.clone())
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let obj = self.obj();
        let inner_ptr = obj.inner.load(Acquire);
        if obj.inner().inherited() {
            return; // a forked child: the parent's state is never touched (leaked)
        }
        // SAFETY: our own object's pointer.
        unsafe { stop(obj.raw()) };
        // SAFETY: stopped (no delivery thread), and `&mut self` means no callback is running; the
        // object and its current state were allocated by `Box` in `new`/`start`.
        unsafe {
            drop(Box::from_raw(inner_ptr));
            drop(Box::from_raw(self.obj));
        }
    }
}

/// Runs `f` behind a panic boundary (a panic must never unwind into libfabric).
fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Page range check: `[addr, addr + len)` non-empty and not wrapping.
fn span(addr: *const c_void, len: usize) -> Option<(usize, usize)> {
    let start = addr as usize;
    let end = start.checked_add(len)?;
    (len > 0).then_some((start, end))
}

fn fi_error(e: &Error) -> c_int {
    -match e {
        Error::EmptyRange | Error::WrappingRange | Error::UnsupportedMapping(_) => abi::FI_EINVAL,
        Error::Unmapped => abi::FI_EFAULT,
        Error::RangeBusy => abi::FI_EBUSY,
        Error::CoverageLimit(_) => abi::FI_ENOMEM,
        _ => abi::FI_ENOSYS,
    }
}

unsafe extern "C" fn start(mon: *mut FidMemMonitor) -> c_int {
    // SAFETY: libfabric passes back the pointer it was given.
    let obj = unsafe { MonitorObject::from_raw(mon) };
    guarded(-abi::FI_ENOMEM, || {
        let mut inner = obj.inner();
        if inner.inherited() {
            // A child: fresh state; the parent's is leaked (its locks may be held forever).
            let fresh = Box::into_raw(Box::new(Inner::new(obj.limit)));
            obj.inner.store(fresh, Release);
            inner = obj.inner();
        }
        let mut running = inner.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.is_some() {
            return abi::FI_SUCCESS;
        }
        let notifier = match Notifier::new() {
            Ok(n) => Arc::new(n),
            Err(e) => {
                eprintln!("ummunotify-fabric: the memory monitor cannot start: {e}");
                return -abi::FI_ENOSYS;
            }
        };
        // `Notifier::new` returns only once its monitor thread runs (its start-up mappings are
        // made by then); a hooks-backend notifier has no monitor thread at all.
        // SAFETY: eventfd with valid flags; the fd is owned on the same line.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop_fd < 0 {
            return -abi::FI_ENOMEM;
        }
        // SAFETY: a fresh fd we own.
        let stop_fd = unsafe { OwnedFd::from_raw_fd(stop_fd) };
        let Ok(stop_dup) = stop_fd.try_clone() else {
            return -abi::FI_ENOMEM;
        };
        // SAFETY: as for the stop eventfd.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake_fd < 0 {
            return -abi::FI_ENOMEM;
        }
        // SAFETY: a fresh fd we own.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(wake_fd) };
        let Ok(wake_dup) = wake_fd.try_clone() else {
            return -abi::FI_ENOMEM;
        };
        {
            let mut t = inner.table();
            t.notifier = Some(notifier.clone());
            t.wake = Some(wake_fd);
        }
        let obj_addr = obj as *const MonitorObject as usize;
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("umn-fabric-deliver".into())
            .spawn(move || {
                // SAFETY: the object outlives the thread: `stop` (called before the object is
                // freed) joins it.
                let obj = unsafe { &*(obj_addr as *const MonitorObject) };
                // The thread's first allocation makes glibc map a malloc arena for it (a large
                // mapping). Made now, not on the first event: else it would be mapped right
                // after an unmap, often over the hole the unmap left, and the program's own
                // mmap at that address (x == y) would find it taken.
                drop(std::hint::black_box(Box::new(0u64)));
                let _ = ready_tx.send(());
                deliver(obj, &notifier, stop_dup, wake_dup);
            });
        match spawned {
            Ok(thread) => {
                let _ = ready_rx.recv();
                *inner
                    .delivery_thread
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(thread.thread().id());
                *running = Some(Delivery {
                    thread,
                    stop: stop_fd,
                });
                abi::FI_SUCCESS
            }
            Err(e) => {
                eprintln!("ummunotify-fabric: cannot start the delivery thread: {e}");
                let mut t = inner.table();
                t.notifier = None;
                t.wake = None;
                -abi::FI_ENOMEM
            }
        }
    })
}

unsafe extern "C" fn stop(mon: *mut FidMemMonitor) {
    // SAFETY: libfabric passes back the pointer it was given.
    let obj = unsafe { MonitorObject::from_raw(mon) };
    guarded((), || {
        let inner = obj.inner();
        if inner.inherited() {
            return;
        }
        let mut running = inner.running.lock().unwrap_or_else(|p| p.into_inner());
        let Some(d) = running.take() else {
            return;
        };
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(d.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        let on_delivery_thread = *inner
            .delivery_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            == Some(std::thread::current().id());
        if !on_delivery_thread {
            let _ = d.thread.join();
        }
        let notifier = {
            let mut t = inner.table();
            t.by_range.clear();
            t.by_cookie.clear();
            t.subs = 0;
            t.order.clear();
            t.evicted.clear();
            t.wake = None;
            t.ending = 0;
            t.notifier.take()
        };
        drop(notifier); // outside the table lock: joins the notifier's monitor thread
    })
}

unsafe extern "C" fn subscribe(mon: *mut FidMemMonitor, addr: *const c_void, len: usize) -> c_int {
    // SAFETY: libfabric passes back the pointer it was given.
    let obj = unsafe { MonitorObject::from_raw(mon) };
    let inner = obj.inner();
    let rc = guarded(-abi::FI_ENOMEM, || {
        if inner.inherited() {
            return -abi::FI_ENOSYS;
        }
        let Some(range) = span(addr, len) else {
            return -abi::FI_EINVAL;
        };
        let mut t = inner.table();
        let Some(notifier) = t.notifier.clone() else {
            return -abi::FI_ENOSYS; // not started
        };
        let cookie = t.next_cookie;
        t.next_cookie += 1;
        match notifier.register(range.0..range.1, Cookie(cookie)) {
            Ok(region) => {
                if t.subs - t.ending >= inner.limit {
                    evict_oldest(inner, &mut t);
                }
                t.order.push_back((cookie, range));
                t.by_range.entry(range).or_default().push(Sub {
                    cookie,
                    region,
                    ending: false,
                });
                t.by_cookie.insert(cookie, range);
                t.subs += 1;
                abi::FI_SUCCESS
            }
            Err(e) => fi_error(&e),
        }
    });
    if rc == abi::FI_SUCCESS {
        inner.subscribes.fetch_add(1, Relaxed);
    } else {
        inner.subscribe_failures.fetch_add(1, Relaxed);
    }
    rc
}

/// Ends the oldest live subscription (its `notify` is owed: the delivery thread makes it, since
/// this runs under libfabric's `mm_lock`, which `notify` takes).
fn evict_oldest(inner: &Inner, t: &mut Table) {
    while let Some((cookie, range)) = t.order.pop_front() {
        let Some(sub) = t.sub_mut(cookie) else {
            continue; // ended already
        };
        if sub.ending {
            continue; // its notify is on the way already
        }
        sub.ending = true;
        t.ending += 1;
        t.evicted.push((cookie, range.0, range.1));
        inner.evictions.fetch_add(1, Relaxed);
        if let Some(w) = &t.wake {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(w.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
        break;
    }
    if t.order.len() > 2 * inner.limit {
        let Table {
            order, by_cookie, ..
        } = t;
        order.retain(|(c, r)| by_cookie.get(c) == Some(r));
    }
}

unsafe extern "C" fn unsubscribe(mon: *mut FidMemMonitor, addr: *const c_void, len: usize) {
    // SAFETY: libfabric passes back the pointer it was given.
    let obj = unsafe { MonitorObject::from_raw(mon) };
    let inner = obj.inner();
    guarded((), || {
        if inner.inherited() {
            return;
        }
        inner.unsubscribes.fetch_add(1, Relaxed);
        let Some(range) = span(addr, len) else {
            inner.unsubscribes_unknown.fetch_add(1, Relaxed);
            return;
        };
        let mut t = inner.table();
        // libfabric does not say which entry leaves, so the newest subscription on the range
        // ends. Always safe: the ones left are older, so each watches the memory of the leaving
        // entry or memory that was replaced since, which reads invalid once that unmap returned.
        // (Ending the oldest could leave an older, stale entry looking valid.)
        let Some(cookie) = t
            .by_range
            .get(&range)
            .and_then(|v| v.last())
            .map(|s| s.cookie)
        else {
            inner.unsubscribes_unknown.fetch_add(1, Relaxed);
            return;
        };
        t.remove(cookie);
        if let Some(n) = &t.notifier {
            // Its pending event (if any) is discarded with it.
            let _ = n.unregister(Cookie(cookie));
        }
    })
}

unsafe extern "C" fn valid(mon: *mut FidMemMonitor, addr: *const c_void, len: usize) -> bool {
    // SAFETY: libfabric passes back the pointer it was given.
    let obj = unsafe { MonitorObject::from_raw(mon) };
    guarded(false, || {
        let inner = obj.inner();
        if inner.inherited() {
            return false;
        }
        let Some(range) = span(addr, len) else {
            return false;
        };
        // No allocation, no syscall: a hash lookup and the notifier's two-load region check.
        let t = inner.table();
        // Every subscription on the range must read valid: an older one may be the only watch of
        // the memory some MR cache's entry was registered on.
        match (&t.notifier, t.by_range.get(&range)) {
            (Some(n), Some(subs)) => subs.iter().all(|s| !s.ending && n.is_valid(s.region)),
            // Not subscribed (any more): its notify is delivered or on the way. Never "valid".
            _ => false,
        }
    })
}

/// Events taken from the notifier per round (fixed buffers: the loop does not allocate while
/// it handles events).
const BATCH: usize = 64;

/// The delivery thread: waits for notifier events (and evictions) and hands each ended
/// subscription's range to libfabric's `notify`, with no lock of ours held.
fn deliver(obj: &MonitorObject, notifier: &Notifier, stop: OwnedFd, wake: OwnedFd) {
    let inner = obj.inner();
    let mut events = [Event::default(); BATCH];
    let mut owed = [(0u64, 0usize, 0usize); BATCH];
    let mut evicted = Vec::new();
    let mut ended: Vec<u64> = Vec::with_capacity(BATCH);
    let mut broken = false;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: notifier.as_fd().as_raw_fd(),
                events: if broken { 0 } else { libc::POLLIN },
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: three live pollfds.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) };
        if rc < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            return;
        }
        inner.in_flight.store(true, SeqCst);
        let mut n = 0;
        if fds[2].revents != 0 {
            let mut buf = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from our (non-blocking) eventfd.
            unsafe { libc::read(wake.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
            std::mem::swap(&mut evicted, &mut inner.table().evicted);
        }
        if fds[1].revents != 0 {
            match notifier.read_events(&mut events) {
                Ok(r) => {
                    let mut t = inner.table();
                    for ev in &events[..r.count] {
                        match t.sub_mut(ev.cookie.0) {
                            Some(sub) if !sub.ending => {
                                sub.ending = true;
                                t.ending += 1;
                                owed[n] = (ev.cookie.0, ev.start, ev.end);
                                n += 1;
                            }
                            // Unsubscribed meanwhile (its entries are gone), or already ending
                            // (evicted: that notify covers the range).
                            _ => {
                                inner.events_dropped.fetch_add(1, Relaxed);
                            }
                        }
                    }
                }
                Err(e) => {
                    // Forked or monitor dead: every region reads invalid, so valid() is false for
                    // every entry; nothing more will come. Wait for stop (and evictions) only.
                    eprintln!("ummunotify-fabric: the notifier stopped delivering events: {e}");
                    broken = true;
                }
            }
        }
        // SAFETY: `import_ops` was written by libfabric's import (or the caller) before `start`,
        // which spawned this thread: the spawn orders it before this read.
        let ops = unsafe { ptr::read_volatile(&(*obj.raw()).import_ops) };
        // SAFETY: non-null `import_ops` points to libfabric's static table.
        let notify = (!ops.is_null()).then(|| unsafe { (*ops).notify }).flatten();
        for &(_, start, end) in owed[..n].iter().chain(evicted.iter()) {
            if let Some(notify) = notify {
                // SAFETY: libfabric's notify with its monitor pointer and the invalidated range;
                // no lock of ours is held (it takes mm_lock and may call unsubscribe).
                unsafe { notify(obj.raw(), start as *const c_void, end - start) };
                inner.notifies.fetch_add(1, Relaxed);
            }
        }
        // Every MR cache dropped its entries on these ranges: the subscriptions end now (unless
        // an unsubscribe inside notify ended them already), and a later subscribe of a range
        // registers it afresh. Entries subscribed after the notify took mm_lock find no
        // subscription and read invalid: libfabric registers them again.
        ended.clear();
        {
            let mut t = inner.table();
            for &(cookie, _, _) in owed[..n].iter().chain(evicted.iter()) {
                if t.remove(cookie) {
                    ended.push(cookie);
                }
            }
        }
        for &cookie in &ended {
            let _ = notifier.unregister(Cookie(cookie));
        }
        evicted.clear();
        inner.in_flight.store(false, SeqCst);
    }
}

/// Counters of a monitor object (the imported one has no `Monitor` owner).
pub(crate) fn object_stats(obj: &MonitorObject) -> Stats {
    stats_notifier(obj).0
}

/// The backend of the notifier of a started monitor object.
pub(crate) fn object_backend(obj: &MonitorObject) -> Option<ummunotify::Backend> {
    stats_notifier(obj).1.map(|n| n.backend())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child handler is in place before any monitor exists: registered at load, so no
    /// thread of the program can be half-way through a `Once` when another forks.
    #[test]
    fn the_fork_handler_is_registered_at_load() {
        assert!(
            REGISTERED.load(SeqCst),
            "on_fork_child was not registered at load"
        );
        assert!(
            !ATFORK.is_completed(),
            "the fallback Once ran although the load did"
        );
    }
}
