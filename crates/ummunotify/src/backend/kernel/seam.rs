//! `Backend::Kernel`: the `/dev/ummunotify` module behind the seam (`crate::backend`).
//!
//! **Visibility rule (pull).** The module's MMU-notifier callbacks run in the invalidating
//! thread, before the pages go, and bump the module's mapped counter and queue one event per hit
//! region before that thread can return. Every check of the notifier first runs this backend's
//! [`Probe`]: one load of that counter; when it moved, the probe reads the module's events and
//! applies each through the sink (between one `begin` and `end`, so a concurrent check waits
//! the batch out) before the check's own load. A check made after the unmapping call returned
//! therefore sees the invalidation.
//!
//! **Watching.** A watch of `[start, end)` registers a module region for exactly that range,
//! every time (the core asks for the whole page range of every registration): a registration
//! made while an overlapping invalidation is in progress is then invalidated by the module at
//! `invalidate_range_end` (its "tentative" regions), so the REMOVE window of userfaultfd does not
//! exist here and no window is opened in the core. Module regions may overlap; an unwatch
//! removes those inside the range and re-registers the parts outside it of those that stick out,
//! the new region before the old one goes, with the pending events pulled in between, so no
//! event of the remaining pages is dropped with the old registration.
//!
//! **Re-arming.** An event is read (and its region may be re-armed and pinned again) while the
//! invalidation that queued it may still be in progress: the module queues at
//! `invalidate_range_start`, the zap follows. So events are delivered as unmaps, whose regions
//! the core watches again before it makes them valid: that watch is a new module registration,
//! which the module invalidates at `invalidate_range_end` if an overlapping invalidation is still
//! in progress, and a check after the unmapping call returned pulls that. (Delivered as page drops,
//! a re-armed region was valid over frames still being zapped: the REMOVE race found 90-337
//! stale uses per 5 s on the re-arm path in the guest.) A watch of a range already registered
//! exactly replaces that registration (new first, events pulled, then the old one goes), so
//! re-arms do not pile up module regions.
//!
//! **Events** carry the hint range (the invalidation clipped to the module region) or the whole
//! module region; the core stabs its own index with that range, which hits every core region
//! the invalidation hit (and, for a no-hint record, possibly a neighbour: conservative).
#![allow(unsafe_code)] // The module's mapped counter is read as an atomic.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

use super::sys;
use crate::backend::{Delivery, Invalidation, Watcher};
use crate::sink::{Count, Probe, Sink};
use crate::{Error, Unsupported};

/// The device: its fd and its mapped counter page.
struct Device {
    fd: OwnedFd,
    counter: usize,
    /// The notifier's sink, from `deliver` until `stop`.
    sink: Mutex<Option<Arc<dyn Sink>>>,
    /// Serialises pullers (one reads the module's queue at a time).
    pulling: Mutex<()>,
    /// The counter value whose events have been delivered (or are being, inside begin/end).
    seen: AtomicU64,
}

// SAFETY: `counter` is the address of a read-only shared mapping owned by the device, read only
// through atomic loads.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        sys::unmap(self.counter, crate::sys::page_size());
    }
}

impl Device {
    fn counter(&self) -> &AtomicU64 {
        // SAFETY: one mapped page for the life of `self`; the module writes the first 8 bytes
        // with WRITE_ONCE, we only load.
        unsafe { &*(self.counter as *const AtomicU64) }
    }

    fn lock_sink(&self) -> MutexGuard<'_, Option<Arc<dyn Sink>>> {
        self.sink.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers every event the module has queued (see the module doc). `force` reads even when
    /// the counter did not move (before a module region is unregistered).
    fn pull_into(&self, sink: &dyn Sink, force: bool) {
        let now = self.counter().load(Acquire);
        if !force && self.seen.load(Acquire) == now {
            return;
        }
        let _one = self.pulling.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.counter().load(Acquire);
        if !force && self.seen.load(Acquire) == now {
            return; // another puller delivered it meanwhile
        }
        // Busy before `seen` moves: a check that finds `seen` current waits for `end`.
        sink.begin(Count::Known);
        self.seen.store(now, SeqCst);
        let mut raw = [sys::RawEvent::default(); 128];
        loop {
            match sys::read(self.fd.as_fd(), &mut raw) {
                Ok(0) => break,
                Ok(n) => {
                    let mut last = false;
                    for r in &raw[..n] {
                        match r.kind {
                            // As an unmap: the core then re-watches a region before it re-arms
                            // (see the module doc), so the re-arm is a fresh module registration.
                            sys::EVENT_TYPE_INVAL => sink.apply(Invalidation::Unmap {
                                start: r.hint_start,
                                end: r.hint_end,
                            }),
                            sys::EVENT_TYPE_LAST => last = true,
                            _ => {}
                        }
                    }
                    if last {
                        break;
                    }
                }
                Err(_) => {
                    // EIO: another mm (a forked child); never trust anything again.
                    sink.kill();
                    break;
                }
            }
        }
        sink.end();
    }
}

/// One module region this watcher registered.
#[derive(Clone, Copy, Debug)]
struct ModuleRegion {
    end: u64,
    cookie: u64,
}

pub(crate) struct KernelWatcher {
    dev: Arc<Device>,
    /// Module regions by (start, cookie).
    regions: Mutex<BTreeMap<(u64, u64), ModuleRegion>>,
    next_cookie: AtomicU64,
}

/// Opens the module for a notifier.
pub(crate) fn open() -> Result<Box<dyn Watcher>, Unsupported> {
    let missing = |reason: String| Unsupported::NoKernelModule { reason };
    let fd = sys::open().map_err(|e| missing(format!("open /dev/ummunotify: {e}")))?;
    let counter = sys::map(fd.as_fd(), crate::sys::page_size(), 0)
        .map_err(|e| missing(format!("mmap of the counter page: {e}")))?;
    Ok(Box::new(KernelWatcher {
        dev: Arc::new(Device {
            fd,
            counter,
            sink: Mutex::new(None),
            pulling: Mutex::new(()),
            seen: AtomicU64::new(0),
        }),
        regions: Mutex::new(BTreeMap::new()),
        next_cookie: AtomicU64::new(1),
    }))
}

impl KernelWatcher {
    fn register(
        &self,
        regions: &mut BTreeMap<(u64, u64), ModuleRegion>,
        start: u64,
        end: u64,
    ) -> crate::Result<()> {
        let cookie = self.next_cookie.fetch_add(1, SeqCst);
        match sys::register(self.dev.fd.as_fd(), start, end, cookie) {
            Ok(_) => {
                regions.insert((start, cookie), ModuleRegion { end, cookie });
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Err(Error::CoverageLimit(e)),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Err(Error::Forked),
            Err(source) => Err(Error::Os {
                op: "UMMUNOTIFY_REGISTER_REGION_SLOT",
                source,
            }),
        }
    }

    fn pull_now(&self) {
        let sink = self.dev.lock_sink().clone();
        if let Some(sink) = sink {
            self.dev.pull_into(&*sink, true);
        }
    }
}

impl Watcher for KernelWatcher {
    fn watch(&self, start: u64, end: u64) -> crate::Result<()> {
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        let same: Vec<(u64, u64)> = regions
            .range((start, 0)..(start, u64::MAX))
            .filter(|(_, r)| r.end == end)
            .map(|(&k, _)| k)
            .collect();
        self.register(&mut regions, start, end)?;
        if !same.is_empty() {
            // What the old registrations saw is delivered before they go.
            self.pull_now();
            for key in same {
                if let Some(r) = regions.remove(&key) {
                    let _ = sys::unregister(self.dev.fd.as_fd(), r.cookie);
                }
            }
        }
        Ok(())
    }

    fn unwatch(&self, start: u64, end: u64) {
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        let hit: Vec<((u64, u64), ModuleRegion)> = regions
            .range(..(end, 0))
            .filter(|(&(s, _), r)| s < end && start < r.end)
            .map(|(&k, &r)| (k, r))
            .collect();
        if hit.is_empty() {
            return;
        }
        // The parts that stay watched, registered before the old regions go.
        for &((s, _), r) in &hit {
            if s < start {
                let _ = self.register(&mut regions, s, start);
            }
            if r.end > end {
                let _ = self.register(&mut regions, end, r.end);
            }
        }
        // Whatever the old regions saw until now is delivered; later hits of the remaining
        // pages are seen by the new regions too.
        self.pull_now();
        for (key, r) in hit {
            let _ = sys::unregister(self.dev.fd.as_fd(), r.cookie);
            regions.remove(&key);
        }
    }

    fn splits_vmas(&self) -> bool {
        false // module regions are address ranges: no VMA is touched
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        Some(Box::new(KernelProbe(self.dev.clone())))
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        self.dev
            .seen
            .store(self.dev.counter().load(Acquire), SeqCst);
        *self.dev.lock_sink() = Some(sink);
        Ok(Box::new(Running(self.dev.clone())))
    }
}

struct KernelProbe(Arc<Device>);

impl Probe for KernelProbe {
    fn pull(&self, sink: &dyn Sink) {
        self.0.pull_into(sink, false);
    }
}

/// Delivery runs in the checking threads: stopping only forgets the sink.
struct Running(Arc<Device>);

impl Delivery for Running {
    fn stop(self: Box<Self>, _forked: bool) {
        self.0.lock_sink().take();
    }
}
