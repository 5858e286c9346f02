//! ummunotify as libfabric's memory monitor.
//!
//! An MPI job's registration cache lives in libfabric (`ofi_mr_cache`, used by the verbs, efa,
//! cxi and opx providers). It hits the x == y hazard like any other cache:
//!
//! ```text
//! x = mmap(); fi_mr_reg(x); send(x); munmap(x);
//! y = mmap();            // y == x by chance
//! fi_mr_reg(y)           // cache hit on x's registration: the NIC reads x's old pages
//! ```
//!
//! libfabric (1.13 and newer) lets a program replace its memory monitor by importing a
//! `struct fid_mem_monitor`. This crate is such a monitor on top of a [`ummunotify::Notifier`]:
//!
//! * `subscribe(addr, len)` registers the range; identical and overlapping subscriptions (one
//!   per MR cache) are counted per range, each with a region of its own on the memory mapped at
//!   the time, and `unsubscribe` ends one of them;
//! * `valid(addr, len)` is true only if every subscription on the range passes the notifier's
//!   O(1) region check, so false from the moment any unmapping call touching the range has
//!   returned (no syscall, no allocation);
//! * invalidations reach libfabric as `import_ops->notify(addr, len)` from a delivery thread of
//!   this crate, never from inside a libfabric callback and never from the notifier's monitor
//!   thread (see `docs/architecture/interfaces.md`, "libfabric monitor");
//! * `start`/`stop` create and destroy the notifier with libfabric's first and last MR cache.
//!
//! Turn it on with [`import`] (Rust), `ummunotify_fabric_import()` (C, `include/ummunotify-fabric.h`)
//! before the first `fi_getinfo`, or `LD_PRELOAD=libummunotify-fabric.so` for unmodified programs.
//!
//! ```no_run
//! ummunotify_fabric::import().expect("ummunotify as libfabric's monitor");
//! // ... fi_getinfo, fi_fabric, fi_domain, fi_mr_reg as usual
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
mod capi;
mod import;
mod monitor;

pub use import::{
    import, imported_backend, imported_monitor, imported_stats, version_string, ImportError,
    Imported, LIBRARY_ENV,
};
pub use monitor::{Monitor, Stats, DEFAULT_MAX_SUBSCRIPTIONS, MAX_SUBSCRIPTIONS_ENV};
