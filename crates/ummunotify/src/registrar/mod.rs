//! Registrars: what a [`Cache`](crate::cache::Cache) calls to register memory with a device.
//!
//! A registrar turns an address range into a device *key* (an RDMA memory region, an io_uring
//! fixed-buffer slot, a GPU host registration) and back. The cache decides *when*: it registers
//! on a miss, and deregisters only once a region is out of the cache **and** no handle holds it.
//!
//! Shipped registrars:
//!
//! * [`IoUringRegistrar`] — a sparse io_uring fixed-buffer table; each cached region gets a slot,
//!   pinned by the kernel like an RDMA memory region, usable with `READ_FIXED` / `WRITE_FIXED`.
//! * [`VerbsRegistrar`] — RDMA memory regions (`ibv_reg_mr`/`ibv_dereg_mr`) on your protection
//!   domain or one of its own; libibverbs is loaded at run time, so nothing needs rdma-core to
//!   build or run without it. The key is a [`MemoryRegion`] with the lkey and rkey.
//! * [`MlockRegistrar`] — `mlock`/`munlock`.
//! * [`NoopRegistrar`] — registers nothing, to measure the cache itself.
//!
//! # Plugging in your own (cudaHostRegister, a verbs binding of your own, ...)
//!
//! Implement [`Registrar`]. The key is whatever your device needs to use the memory later; the
//! cache hands it out through [`Handle::key`](crate::cache::Handle::key). The sketch below is the
//! shape of [`VerbsRegistrar`] over a binding crate of your own:
//!
//! ```no_run
//! use std::io;
//! use std::ops::Range;
//! use ummunotify::registrar::Registrar;
//!
//! /// Stand-ins for the C calls (from an `rdma-core` binding crate in a real program).
//! mod ibv {
//!     pub struct Mr { pub lkey: u32, pub rkey: u32 }
//!     pub unsafe fn reg_mr(_pd: usize, _addr: usize, _len: usize) -> *mut Mr { std::ptr::null_mut() }
//!     pub unsafe fn dereg_mr(_mr: *mut Mr) -> i32 { 0 }
//! }
//!
//! /// An `ibv_mr*`, owned: `ibv_dereg_mr` may be called from any thread.
//! struct MrKey(*mut ibv::Mr);
//! // SAFETY (for the example): libibverbs objects may be used from any thread.
//! unsafe impl Send for MrKey {}
//! unsafe impl Sync for MrKey {}
//!
//! struct Verbs { pd: usize }
//!
//! impl Registrar for Verbs {
//!     type Key = MrKey;
//!     fn register(&self, range: Range<usize>) -> io::Result<MrKey> {
//!         // SAFETY (for the example): the cache passes a mapped range it watches.
//!         let mr = unsafe { ibv::reg_mr(self.pd, range.start, range.len()) };
//!         if mr.is_null() { Err(io::Error::last_os_error()) } else { Ok(MrKey(mr)) }
//!     }
//!     fn deregister(&self, key: &MrKey, _range: Range<usize>) -> io::Result<()> {
//!         // SAFETY (for the example): the cache calls this once per key, after its last use.
//!         match unsafe { ibv::dereg_mr(key.0) } { 0 => Ok(()), e => Err(io::Error::from_raw_os_error(e)) }
//!     }
//! }
//! ```
//!
//! `cudaHostRegister` / `cudaHostUnregister` fit the same shape (the key can be `()`, or the
//! device pointer from `cudaHostGetDevicePointer`).
//!
//! # Rules for implementations
//!
//! * `register` and `deregister` run on user threads only (the thread calling
//!   [`Cache::get`](crate::cache::Cache::get), [`Cache::flush`](crate::cache::Cache::flush) or
//!   dropping the cache), never on the notifier's monitor thread. They may allocate, log, make
//!   syscalls and take their own locks.
//! * They run with no cache lock held, so misses on several threads call `register` (and
//!   `deregister`) concurrently. They must not call back into the same cache (a miss inside a
//!   miss's registration would recurse).
//! * `deregister` is called exactly once per key returned by `register`, with the same range,
//!   after every [`Handle`](crate::cache::Handle) to it was dropped. The key value itself is
//!   dropped later (when the cache frees its bookkeeping).
//! * The memory may already be unmapped when `deregister` runs (that is why it is being
//!   deregistered): do not touch it.

mod io_uring;
mod mlock;
mod verbs;

use std::io;
use std::ops::Range;

pub use io_uring::{FixedBuf, IoUringRegistrar};
pub use mlock::MlockRegistrar;
pub use verbs::{
    devices as verbs_devices, Access, MemoryRegion, VerbsError, VerbsRegistrar, IBVERBS_LIBRARY,
};

/// Registers memory ranges with a device, for a [`Cache`](crate::cache::Cache).
///
/// See the [module documentation](self) for the contract, and [`VerbsRegistrar`] for
/// `ibv_reg_mr`.
pub trait Registrar: Send + Sync {
    /// What the device needs to use a registered range (an MR's lkey/rkey, a fixed-buffer slot).
    type Key: Send + Sync;

    /// Registers `range` (page-aligned, mapped, watched by the cache's notifier).
    ///
    /// # Errors
    /// Whatever the device reports; the cache returns it to the caller of `get` as
    /// [`cache::Error::Register`](crate::cache::Error::Register).
    fn register(&self, range: Range<usize>) -> io::Result<Self::Key>;

    /// Releases the registration `key` of `range`. Called once per key, after its last use.
    ///
    /// # Errors
    /// Reported in [`cache::Stats::deregister_errors`](crate::cache::Stats::deregister_errors);
    /// the cache forgets the key either way.
    fn deregister(&self, key: &Self::Key, range: Range<usize>) -> io::Result<()>;

    /// The largest range this registrar accepts (the cache never merges regions beyond it).
    fn max_len(&self) -> usize {
        usize::MAX
    }

    /// How many registrations can exist at once, if limited (io_uring: the table size). The cache
    /// keeps at most this many regions, evicting unused ones first.
    fn max_registrations(&self) -> Option<usize> {
        None
    }
}

/// Registers nothing: measures the cache itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopRegistrar;

impl Registrar for NoopRegistrar {
    type Key = ();
    fn register(&self, _range: Range<usize>) -> io::Result<()> {
        Ok(())
    }
    fn deregister(&self, _key: &(), _range: Range<usize>) -> io::Result<()> {
        Ok(())
    }
}

impl<R: Registrar + ?Sized> Registrar for std::sync::Arc<R> {
    type Key = R::Key;
    fn register(&self, range: Range<usize>) -> io::Result<R::Key> {
        (**self).register(range)
    }
    fn deregister(&self, key: &R::Key, range: Range<usize>) -> io::Result<()> {
        (**self).deregister(key, range)
    }
    fn max_len(&self) -> usize {
        (**self).max_len()
    }
    fn max_registrations(&self) -> Option<usize> {
        (**self).max_registrations()
    }
}
