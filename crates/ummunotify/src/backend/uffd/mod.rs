//! The userfaultfd backend: write-protect-mode registration (never write-protected, so no faults)
//! with the non-cooperative `UNMAP`, `REMOVE` and `REMAP` events.
#![allow(unsafe_code)] // Only `Uffd::close_from_monitor`/`Drop`: closing the fd from the monitor thread.
pub(crate) mod monitor;
pub(crate) mod sys;

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

use super::{BackendReport, Delivery, Invalidation, Watcher};
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
    /// offered (it lets file-backed and SysV-shm mappings be watched).
    pub(crate) fn open() -> Result<Uffd, Unsupported> {
        let offered = offered()?;
        if offered & REQUIRED != REQUIRED {
            return Err(Unsupported::MissingFeatures {
                missing: names(REQUIRED & !offered),
            });
        }
        let wanted = REQUIRED | (offered & feature::WP_ASYNC);
        let (fd, how) = create()?;
        // The kernel answers with every feature it has, not the ones enabled: remember ours.
        sys::api(fd.as_fd(), wanted).map_err(Unsupported::Other)?;
        Ok(Uffd {
            fd: ManuallyDrop::new(fd),
            closed: AtomicBool::new(false),
            features: wanted,
            how,
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

    /// Whether file-backed and shm mappings can be watched.
    pub(crate) fn has_wp_async(&self) -> bool {
        self.features & feature::WP_ASYNC != 0
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

/// The userfaultfd backend of one notifier: its context and (once delivering) its monitor.
///
/// Visibility rule: the busy protocol. The monitor marks the sink busy before each
/// single-message `read()`; that read is what releases the unmapping thread.
struct UffdWatcher {
    uffd: Arc<Uffd>,
}

/// The [`Watcher`] for an opened context.
pub(crate) fn watcher(uffd: Uffd) -> Box<dyn Watcher> {
    Box::new(UffdWatcher {
        uffd: Arc::new(uffd),
    })
}

impl Watcher for UffdWatcher {
    fn watch(&self, start: u64, end: u64) -> crate::Result<()> {
        self.uffd.watch(start, end).map_err(watch_error)
    }

    fn unwatch(&self, start: u64, end: u64) {
        // Parts may be unmapped already; the kernel dropped those watches itself.
        let _ = self.uffd.unwatch(start, end);
    }

    fn splits_vmas(&self) -> bool {
        true
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        // REMOVE in flight: the signal that tells a remover is back in user space.
        crate::inflight::install();
        let m = monitor::spawn(self.uffd.clone(), sink).map_err(|source| Error::Os {
            op: "spawn monitor thread",
            source,
        })?;
        Ok(Box::new(m))
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
        format!(
            "ok: opened with {}; features in use: {}",
            u.how(),
            names(u.features).join(" ")
        )
    });
    if let Ok(v) = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd") {
        notes.push(format!("vm.unprivileged_userfaultfd = {}", v.trim()));
    }
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
