//! The kernel backend: this project's `/dev/ummunotify` module (`kernel/module/`), where it is
//! loaded.
//!
//! The module does in the kernel what the other backends rebuild in user space: its MMU-notifier
//! callbacks run in the invalidating thread, before the pages go, for every cause the kernel
//! has (munmap, mremap, madvise, `MAP_FIXED`, brk, io_uring, `fallocate`/`ftruncate` of a shared
//! file, `shmdt`, migration, ...), and a registration made while an overlapping invalidation is
//! in progress is invalidated when that invalidation ends. So there is no monitor thread, no
//! round trip, and no REMOVE window. What this client does:
//!
//! * **register / unregister** through the module's ioctls (`UMMUNOTIFY_REGISTER_REGION_SLOT`,
//!   `UMMUNOTIFY_UNREGISTER_REGION`);
//! * **the check** is one load of the region's validity word in the module's mapped slot area,
//!   compared with the generation the registration answered; **"anything changed?"** is one load
//!   of the module's mapped 2010 counter;
//! * **events** come from `read()` of the module's 32-byte records (INVAL with or without HINT,
//!   LAST with the counter).
//!
//! **Re-arming.** The module increments a region's word on every invalidation and never makes it
//! valid again, and its records carry no generation. So reading a region's event re-registers it
//! (unregister and register again, under the client's lock, after the read): the new
//! registration answers a generation taken under the module's lock, and any invalidation after
//! it changes that word. An invalidation between the read and the re-registration is folded
//! into the event just read (its own record is dropped with the old registration); the
//! re-armed region describes the mappings as they are after it. Two ioctls per event read: the
//! price of the module's ABI.
//!
//! Differences from the user-space backends, all the module's: any range may be registered,
//! mapped or not (the 2010 ABI; an unmapped range is invalidated when something is mapped and
//! changed there, not refused with `Unmapped`); the region limits are the module's
//! `max_regions` per open file and `max_regions_per_user` over a user's open files (`ENOSPC`,
//! reported as [`Error::CoverageLimit`]); a forked child's descriptor
//! answers `EIO` ([`Error::Forked`]) and its view of the words never matches a generation.
#![allow(unsafe_code)] // The module's mapped counter and slot words are read as atomics.

mod seam;
pub(crate) mod sys;

pub(crate) use seam::open as watcher;

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Acquire};
use std::sync::{Mutex, MutexGuard};

use crate::region::Span;
use crate::{Cookie, Error, Event, Generation, ReadEvents, Region, Result, Unsupported};

/// Bit 63 of the module's counter: what a forked child's view of it reads (never a LAST value).
const ORPHAN: u64 = 1 << 63;

/// One registered region as the client remembers it.
#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    end: u64,
    slot: u32,
    generation: u64,
}

/// A notifier on the `/dev/ummunotify` kernel module: the same calls as
/// [`Notifier`](crate::Notifier) (register, the O(1) check, the one-load "anything changed?",
/// coalesced events, an fd to poll), answered by the module.
///
/// ```no_run
/// use ummunotify::{Cookie, KernelNotifier};
///
/// let n = KernelNotifier::open()?; // fails unless the module is loaded
/// let buf = vec![0u8; 1 << 20];
/// let start = buf.as_ptr() as usize;
/// let region = n.register(start..start + buf.len(), Cookie(7))?;
/// let seen = n.generation();
/// assert!(n.is_valid(region));
/// drop(buf); // free() unmaps the block: the module saw it before munmap returned
/// assert!(!n.is_valid(region) && !n.unchanged_since(seen));
/// assert_eq!(n.events()?.len(), 1);
/// # Ok::<(), ummunotify::Error>(())
/// ```
pub struct KernelNotifier {
    fd: OwnedFd,
    counter: usize,
    slots: usize,
    slot_count: usize,
    registry: Mutex<HashMap<u64, Entry>>,
}

// SAFETY: `counter` and `slots` are addresses of read-only shared mappings owned by this value and
// read only through atomic loads; the rest is `Send + Sync` already.
unsafe impl Send for KernelNotifier {}
// SAFETY: as above.
unsafe impl Sync for KernelNotifier {}

fn os(op: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| match source.raw_os_error() {
        Some(libc::EIO) => Error::Forked,
        _ => Error::Os { op, source },
    }
}

impl KernelNotifier {
    /// Opens `/dev/ummunotify` and maps its counter page and slot area.
    ///
    /// # Errors
    /// [`Error::Unsupported`] with [`Unsupported::NoKernelModule`] when the device can not be
    /// opened (the module is not loaded, or is not this project's); [`Error::Os`] when mapping
    /// fails.
    pub fn open() -> Result<KernelNotifier> {
        let missing = |reason: String| Error::Unsupported(Unsupported::NoKernelModule { reason });
        let fd = sys::open().map_err(|e| missing(format!("open /dev/ummunotify: {e}")))?;
        let slot_count =
            sys::max_regions().map_err(|e| missing(format!("{}: {e}", sys::MAX_REGIONS_PARAM)))?;
        let page = crate::sys::page_size();
        let counter = sys::map(fd.as_fd(), page, 0).map_err(os("mmap of the counter page"))?;
        let slots_len = (slot_count * 8).next_multiple_of(page);
        let slots = match sys::map(fd.as_fd(), slots_len, sys::SLOTS_OFFSET) {
            Ok(s) => s,
            Err(e) => {
                sys::unmap(counter, page);
                return Err(missing(format!(
                    "mmap of the slot area (offset 1 << 32): {e}; not this project's module?"
                )));
            }
        };
        Ok(KernelNotifier {
            fd,
            counter,
            slots,
            slot_count,
            registry: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn word(&self, slot: u32) -> Option<&AtomicU64> {
        if (slot as usize) < self.slot_count {
            // SAFETY: `slots` maps `slot_count` u64 words (page-rounded), aligned, for the life
            // of `self`; the module writes them with WRITE_ONCE, we only load.
            Some(unsafe { &*(self.slots as *const AtomicU64).add(slot as usize) })
        } else {
            None
        }
    }

    /// The module's mapped 2010 counter: one more per MMU notification that hit a region.
    pub fn counter(&self) -> &AtomicU64 {
        // SAFETY: `counter` maps one page whose first 8 bytes are the counter, for the life of
        // `self`; read only with atomic loads.
        unsafe { &*(self.counter as *const AtomicU64) }
    }

    /// Registers `range` under `cookie`.
    ///
    /// # Errors
    /// [`Error::EmptyRange`], [`Error::WrappingRange`], [`Error::DuplicateCookie`],
    /// [`Error::CoverageLimit`] (the module's `max_regions`), [`Error::Forked`]; nothing changes
    /// on error.
    pub fn register(&self, range: Range<usize>, cookie: Cookie) -> Result<Region> {
        let span = Span::new(range, crate::sys::page_size())?;
        let mut reg = self.lock();
        if reg.contains_key(&cookie.0) {
            return Err(Error::DuplicateCookie(cookie));
        }
        reg.reserve(1);
        let entry = self.kernel_register(span.start, span.end, cookie)?;
        reg.insert(cookie.0, entry);
        Ok(Region {
            slot: entry.slot,
            expected: entry.generation,
        })
    }

    fn kernel_register(&self, start: u64, end: u64, cookie: Cookie) -> Result<Entry> {
        match sys::register(self.fd.as_fd(), start, end, cookie.0) {
            Ok((slot, generation)) => Ok(Entry {
                start,
                end,
                slot,
                generation,
            }),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Err(Error::CoverageLimit(e)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(Error::DuplicateCookie(cookie)),
            Err(e) => Err(os("UMMUNOTIFY_REGISTER_REGION_SLOT")(e)),
        }
    }

    /// Unregisters the region named `cookie`; a pending event for it is discarded.
    ///
    /// # Errors
    /// [`Error::UnknownCookie`], [`Error::Forked`].
    pub fn unregister(&self, cookie: Cookie) -> Result<()> {
        let mut reg = self.lock();
        if !reg.contains_key(&cookie.0) {
            return Err(Error::UnknownCookie(cookie));
        }
        sys::unregister(self.fd.as_fd(), cookie.0).map_err(os("UMMUNOTIFY_UNREGISTER_REGION"))?;
        reg.remove(&cookie.0);
        Ok(())
    }

    /// A fresh token for the region named `cookie` (after its event was read and it re-armed).
    ///
    /// # Errors
    /// [`Error::UnknownCookie`].
    pub fn region(&self, cookie: Cookie) -> Result<Region> {
        let reg = self.lock();
        let e = reg.get(&cookie.0).ok_or(Error::UnknownCookie(cookie))?;
        Ok(Region {
            slot: e.slot,
            expected: e.generation,
        })
    }

    /// The per-region check, one load: false once any invalidation of the region's pages began
    /// (the module increments the word in the invalidating thread, before the pages go).
    #[inline]
    pub fn is_valid(&self, region: Region) -> bool {
        self.word(region.slot)
            .is_some_and(|w| w.load(Acquire) == region.expected)
    }

    /// The counter now (the module's counter has no busy state: nothing to wait for).
    pub fn generation(&self) -> Generation {
        Generation(self.counter().load(Acquire))
    }

    /// One load: true iff no notification hit a region since `snapshot` (false in a child).
    #[inline]
    pub fn unchanged_since(&self, snapshot: Generation) -> bool {
        snapshot.0 & ORPHAN == 0 && self.counter().load(Acquire) == snapshot.0
    }

    /// Moves pending events to the front of `buf`, re-arming their regions (see the module
    /// doc), and reports whether the queue was drained, with the counter of the LAST record.
    ///
    /// # Errors
    /// [`Error::Forked`]; [`Error::Os`] if a re-registration fails (the region then stays
    /// invalid and is forgotten: register it again).
    pub fn read_events(&self, buf: &mut [Event]) -> Result<ReadEvents> {
        let mut raw = [sys::RawEvent::default(); 128];
        // Never more records than `buf` holds events: every INVAL read must be handed out (a
        // LAST that does not fit is owed by the module to the next read).
        let want = buf.len().min(raw.len());
        if want == 0 {
            return Ok(ReadEvents {
                count: 0,
                drained: None,
                drained_notifications: None,
            });
        }
        let mut reg = self.lock();
        let got =
            sys::read(self.fd.as_fd(), &mut raw[..want]).map_err(os("read /dev/ummunotify"))?;
        let mut n = 0;
        let mut drained = None;
        let mut failed = None;
        for r in &raw[..got] {
            match r.kind {
                sys::EVENT_TYPE_LAST => drained = Some(r.cookie_or_counter),
                sys::EVENT_TYPE_INVAL => {
                    let cookie = Cookie(r.cookie_or_counter);
                    buf[n] = Event {
                        cookie,
                        start: r.hint_start as usize,
                        end: r.hint_end as usize,
                        hint: r.flags & sys::EVENT_FLAG_HINT != 0,
                    };
                    n += 1;
                    if let Err(e) = self.rearm(&mut reg, cookie) {
                        failed.get_or_insert(e);
                    }
                }
                _ => {}
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if got == 0 {
            // Nothing queued: the queue is drained as of the counter now.
            drained = Some(self.counter().load(Acquire));
        }
        Ok(ReadEvents {
            count: n,
            drained: drained.map(Generation),
            drained_notifications: drained,
        })
    }

    /// Re-registers `cookie` after its event was read: a fresh generation (registry lock held).
    fn rearm(&self, reg: &mut HashMap<u64, Entry>, cookie: Cookie) -> Result<()> {
        let Some(old) = reg.get(&cookie.0).copied() else {
            return Ok(()); // unregistered meanwhile (not possible under the lock, but harmless)
        };
        sys::unregister(self.fd.as_fd(), cookie.0).map_err(os("UMMUNOTIFY_UNREGISTER_REGION"))?;
        match self.kernel_register(old.start, old.end, cookie) {
            Ok(e) => {
                reg.insert(cookie.0, e);
                Ok(())
            }
            Err(e) => {
                reg.remove(&cookie.0);
                Err(e)
            }
        }
    }

    /// Reads every pending event into a new vector.
    pub fn events(&self) -> Result<Vec<Event>> {
        ReadEvents::collect(|buf| self.read_events(buf))
    }

    /// Regions registered now.
    pub fn regions(&self) -> usize {
        self.lock().len()
    }
}

impl AsFd for KernelNotifier {
    /// The device itself: readable while events are pending (`POLLERR` in a forked child).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl std::fmt::Debug for KernelNotifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelNotifier")
            .field("counter", &self.counter().load(Acquire))
            .field("slot_count", &self.slot_count)
            .finish_non_exhaustive()
    }
}

impl Drop for KernelNotifier {
    fn drop(&mut self) {
        let page = crate::sys::page_size();
        sys::unmap(self.counter, page);
        sys::unmap(self.slots, (self.slot_count * 8).next_multiple_of(page));
    }
}

/// What `umn doctor` says about the kernel backend.
pub(crate) fn probe() -> super::BackendReport {
    let status = match KernelNotifier::open() {
        Ok(n) => Ok(format!(
            "/dev/ummunotify (this project's module), {} regions per open file",
            n.slot_count
        )),
        Err(Error::Unsupported(u)) => Err(u),
        Err(e) => Err(Unsupported::NoKernelModule {
            reason: e.to_string(),
        }),
    };
    super::BackendReport {
        name: "kernel",
        status,
        kernel_features: Vec::new(),
        notes: vec![
            "the module's MMU notifiers see every cause of change, in the invalidating thread"
                .into(),
        ],
    }
}
