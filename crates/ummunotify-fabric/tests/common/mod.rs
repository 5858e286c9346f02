//! A driver that calls a monitor's `export_ops` the way libfabric's MR cache does
//! (`prov/util/src/util_mr_cache.c`, `util_mem_monitor.c`), for tests.
//!
//! What it reproduces, from libfabric 1.17 (Debian 12) and 2.1+:
//! * `mm_lock` (here [`Driver::mm_lock`]) is held around `subscribe` (after the entry was put in
//!   the cache tree), around `valid` (on every hit, with the entry's range), and, from 2.1 on,
//!   around `unsubscribe` (each time an entry leaves the tree, including inside `notify`);
//! * libfabric's `import_ops->notify` takes `mm_lock`, then drops every cache entry overlapping
//!   the range (`ofi_mr_cache_notify`); in 2.1+ each dropped entry is unsubscribed right there;
//! * `start` when the first cache appears, `stop` when the last goes (without `mm_lock`).
//!
//! The monitor, the notifier and the kernel are the real ones; only libfabric's bookkeeping of
//! its cache tree is modelled here, so the tests can see which entries `notify` dropped.
#![allow(dead_code)]

use std::ffi::c_void;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ummunotify::Generation;
use ummunotify_fabric::abi::{FiOpsMemMonitor, FiOpsMemNotify, FidMemMonitor};
use ummunotify_fabric::Monitor;
use ummunotify_testkit::changes::{WatchError, Watcher};

/// Which libfabric's cache behaviour to reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// 1.17 .. 2.0: entries leave the tree without `unsubscribe`.
    V1_17,
    /// 2.1 and newer: every entry leaving the tree is unsubscribed under `mm_lock`, also inside
    /// `notify`.
    V2_1,
}

/// The cache tree libfabric keeps under `mm_lock`, reduced to what the monitor sees.
#[derive(Debug, Default)]
pub struct CacheTree {
    /// Cached entries: their ranges, as subscribed, and the order in which they were made.
    pub entries: Vec<(Range<usize>, u64)>,
    /// The order number the next entry gets.
    pub next_seq: u64,
    /// Every `notify(addr, len)` received, in order.
    pub notified: Vec<Range<usize>>,
    /// Entries `notify` dropped.
    pub dropped: Vec<Range<usize>>,
}

pub struct Shared {
    pub mm_lock: Mutex<CacheTree>,
    flavour: Flavour,
    ops: *mut FiOpsMemMonitor,
}

// SAFETY: `ops` points into the monitor object, which outlives the driver's use of it.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// Drivers by monitor pointer: libfabric's `notify` gets only the monitor.
static DRIVERS: Mutex<Vec<(usize, Arc<Shared>)>> = Mutex::new(Vec::new());

unsafe extern "C" fn notify(mon: *mut FidMemMonitor, addr: *const c_void, len: usize) {
    let shared = {
        let d = DRIVERS.lock().unwrap();
        d.iter()
            .find(|(m, _)| *m == mon as usize)
            .map(|(_, s)| s.clone())
            .expect("notify for a monitor no driver owns")
    };
    let range = addr as usize..addr as usize + len;
    let mut tree = shared.mm_lock.lock().unwrap();
    tree.notified.push(range.clone());
    // ofi_mr_cache_notify: drop every entry overlapping the range.
    while let Some(i) = tree
        .entries
        .iter()
        .position(|(e, _)| e.start < range.end && range.start < e.end)
    {
        let (e, _) = tree.entries.remove(i);
        tree.dropped.push(e.clone());
        if shared.flavour == Flavour::V2_1 {
            // SAFETY: the monitor's own unsubscribe, with mm_lock held as libfabric holds it.
            unsafe { ((*shared.ops).unsubscribe.unwrap())(mon, e.start as *const c_void, e.len()) };
        }
    }
}

/// One monitor driven like libfabric drives its imported monitor.
pub struct Driver {
    pub monitor: Monitor,
    pub shared: Arc<Shared>,
    raw: *mut FidMemMonitor,
    _import_ops: Box<FiOpsMemNotify>,
}

// SAFETY: the raw pointers point into `monitor` and `_import_ops`, owned by the driver.
unsafe impl Send for Driver {}
// SAFETY: as above; every call through them is thread-safe by the monitor's contract.
unsafe impl Sync for Driver {}

impl Driver {
    /// A started monitor (as on libfabric's first MR cache).
    pub fn new(flavour: Flavour) -> Driver {
        Driver::with_monitor(flavour, Monitor::new())
    }

    /// A started `monitor`.
    pub fn with_monitor(flavour: Flavour, monitor: Monitor) -> Driver {
        let raw = monitor.as_raw();
        let mut import_ops = Box::new(FiOpsMemNotify {
            size: std::mem::size_of::<FiOpsMemNotify>(),
            notify: Some(notify),
        });
        // SAFETY: the monitor is not started or shared yet; libfabric's import does this write.
        let ops = unsafe {
            (*raw).import_ops = &mut *import_ops;
            (*raw).export_ops
        };
        let shared = Arc::new(Shared {
            mm_lock: Mutex::new(CacheTree::default()),
            flavour,
            ops,
        });
        DRIVERS.lock().unwrap().push((raw as usize, shared.clone()));
        let d = Driver {
            monitor,
            shared,
            raw,
            _import_ops: import_ops,
        };
        // SAFETY: start with the monitor's own pointer (ofi_monitors_update, no mm_lock).
        let rc = unsafe { (d.ops().start.unwrap())(raw) };
        assert_eq!(rc, 0, "start failed: {rc}");
        d
    }

    pub fn ops(&self) -> &FiOpsMemMonitor {
        // SAFETY: the table lives in the monitor object.
        unsafe { &*(*self.raw).export_ops }
    }

    pub fn raw(&self) -> *mut FidMemMonitor {
        self.raw
    }

    pub fn mm_lock(&self) -> MutexGuard<'_, CacheTree> {
        self.shared.mm_lock.lock().unwrap()
    }

    /// `util_mr_cache_create` after the device registration: under `mm_lock`, insert the entry,
    /// subscribe; on failure the entry is used uncached. Returns subscribe's result.
    pub fn register(&self, range: Range<usize>) -> i32 {
        let mut tree = self.mm_lock();
        self.register_locked(&mut tree, range)
    }

    pub fn register_locked(&self, tree: &mut CacheTree, range: Range<usize>) -> i32 {
        let seq = tree.next_seq;
        tree.next_seq += 1;
        tree.entries.push((range.clone(), seq));
        // SAFETY: the monitor's subscribe with mm_lock held.
        let rc = unsafe {
            (self.ops().subscribe.unwrap())(self.raw, range.start as *const c_void, range.len())
        };
        if rc != 0 {
            let i = tree.entries.iter().position(|e| e.1 == seq).unwrap();
            tree.entries.remove(i);
        }
        rc
    }

    /// `ofi_mr_cache_search`'s hit check: `valid` with the entry's range under `mm_lock`.
    pub fn valid(&self, range: Range<usize>) -> bool {
        let _tree = self.mm_lock();
        self.valid_locked(range)
    }

    pub fn valid_locked(&self, range: Range<usize>) -> bool {
        // SAFETY: the monitor's valid with mm_lock held (by the caller).
        unsafe { (self.ops().valid.unwrap())(self.raw, range.start as *const c_void, range.len()) }
    }

    /// `register`, returning the entry's number (for [`Driver::evict_entry`]) or subscribe's error.
    pub fn register_entry(&self, range: Range<usize>) -> Result<u64, i32> {
        let mut tree = self.mm_lock();
        let seq = tree.next_seq;
        match self.register_locked(&mut tree, range) {
            0 => Ok(seq),
            rc => Err(rc),
        }
    }

    /// Entry `seq` leaves the tree, if `notify` has not dropped it: unsubscribed in 2.1+.
    pub fn evict_entry(&self, seq: u64) {
        let mut tree = self.mm_lock();
        let Some(i) = tree.entries.iter().position(|(_, s)| *s == seq) else {
            return;
        };
        let (range, _) = tree.entries.remove(i);
        if self.shared.flavour == Flavour::V2_1 {
            self.unsubscribe_locked(range);
        }
    }

    /// An entry leaves the tree (eviction, or purge after a failed `valid`): unsubscribed in 2.1+.
    /// The first entry with this range (tests where ranges are unique).
    pub fn evict(&self, range: Range<usize>) {
        let mut tree = self.mm_lock();
        if let Some(i) = tree.entries.iter().position(|(e, _)| *e == range) {
            tree.entries.remove(i);
        }
        if self.shared.flavour == Flavour::V2_1 {
            self.unsubscribe_locked(range);
        }
    }

    pub fn unsubscribe_locked(&self, range: Range<usize>) {
        // SAFETY: the monitor's unsubscribe with mm_lock held (by the caller).
        unsafe {
            (self.ops().unsubscribe.unwrap())(self.raw, range.start as *const c_void, range.len())
        }
    }

    /// Waits until every invalidation so far has been delivered (a hang guard, not a timing).
    pub fn settle(&self) {
        assert!(
            self.monitor.wait_delivered(Duration::from_secs(30)),
            "the monitor did not deliver within 30 s"
        );
    }

    pub fn notified(&self) -> Vec<Range<usize>> {
        self.mm_lock().notified.clone()
    }

    /// Notifications that overlap `range`.
    pub fn notified_for(&self, range: &Range<usize>) -> Vec<Range<usize>> {
        self.notified()
            .into_iter()
            .filter(|n| n.start < range.end && range.start < n.end)
            .collect()
    }

    pub fn generation(&self) -> Generation {
        self.monitor
            .notifier()
            .expect("started")
            .generation()
            .expect("generation")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: stop with the monitor's own pointer (as on libfabric's last cache).
        unsafe { (self.ops().stop.unwrap())(self.raw) };
        DRIVERS
            .lock()
            .unwrap()
            .retain(|(m, _)| *m != self.raw as usize);
    }
}

/// The catalogue's view of one cache entry on a [`Driver`].
pub struct FabricWatcher<'d> {
    pub driver: &'d Driver,
    range: Option<Range<usize>>,
    since: Option<Generation>,
}

impl<'d> FabricWatcher<'d> {
    pub fn new(driver: &'d Driver) -> Self {
        FabricWatcher {
            driver,
            range: None,
            since: None,
        }
    }
}

impl Watcher for FabricWatcher<'_> {
    fn watch(&mut self, range: Range<usize>) -> Result<(), WatchError> {
        let rc = self.driver.register(range.clone());
        if rc != 0 {
            return Err(format!("subscribe returned {rc}").into());
        }
        self.since = Some(self.driver.generation());
        self.range = Some(range);
        Ok(())
    }

    fn is_valid(&mut self) -> bool {
        self.range.clone().is_some_and(|r| self.driver.valid(r))
    }

    fn counter_moved(&mut self) -> bool {
        let n = self.driver.monitor.notifier().expect("started");
        self.since.is_some_and(|g| !n.unchanged_since(g))
    }

    /// libfabric's `notify` carries a range and no hint flag: each notify is reported with the
    /// flag set, so the catalogue's check reads "exactly one notify, with exactly the clipped
    /// range".
    fn events(&mut self) -> Vec<(Range<usize>, bool)> {
        self.driver.settle();
        let Some(range) = self.range.clone() else {
            return Vec::new();
        };
        self.driver
            .notified_for(&range)
            .into_iter()
            .map(|r| (r, true))
            .collect()
    }

    fn unwatch(&mut self) {
        if let Some(r) = self.range.take() {
            self.driver.evict(r);
        }
    }
}

/// Maps `pages` fresh anonymous pages, touched.
pub fn map(pages: usize) -> Range<usize> {
    let len = pages * page();
    // SAFETY: a fresh anonymous mapping, no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p as usize..p as usize + len
}

/// `munmap(range)`.
pub fn unmap(range: Range<usize>) {
    // SAFETY: the tests unmap only mappings they made.
    let rc = unsafe { libc::munmap(range.start as *mut c_void, range.len()) };
    assert_eq!(rc, 0, "munmap");
}

pub fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}
