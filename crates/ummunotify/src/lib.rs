//! # ummunotify: know before you reuse a registration
//!
//! Registration caches (RDMA memory regions, io_uring fixed buffers, GPU host registrations) map
//! virtual addresses to pinned pages. The hazard they face:
//!
//! ```text
//! x = mmap(); register(x); send(x); munmap(x);
//! y = mmap();            // y == x by chance
//! send(y)                // cache hit on x's registration: the device reads x's old pages
//! ```
//!
//! A [`Notifier`] tells the process, before the unmapping call returns, that the mappings behind
//! a registered range changed, whatever made the change: libc or raw syscalls, `munmap`,
//! `mremap`, `madvise`, `MAP_FIXED`, `brk`, io_uring's `IORING_OP_MADVISE`, `free()` in glibc.
//! It is the 2010 `/dev/ummunotify` kernel patch, rebuilt in user space on userfaultfd:
//!
//! * register `[start, end)` with a 64-bit [`Cookie`]; overlapping ranges are fine;
//! * check one region in O(1) with [`Notifier::is_valid`], or everything at once with one load
//!   of the generation counter ([`Notifier::unchanged_since`]);
//! * read coalesced [`Event`]s (at most one pending per region, never lost, bounded memory);
//! * wait with `poll`/`epoll` on the notifier's fd ([`AsFd`](std::os::fd::AsFd)).
//!
//! ```
//! use ummunotify::{Cookie, Notifier};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let notifier = Notifier::new()?;
//! let buf = vec![0u8; 1 << 20];
//! let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
//! let region = notifier.register(range, Cookie(7))?;
//! let seen = notifier.generation()?;
//!
//! assert!(notifier.is_valid(region));     // two loads
//! assert!(notifier.unchanged_since(seen)); // one load
//! drop(buf);                               // free() unmaps the block...
//! assert!(!notifier.is_valid(region));     // ...and the check sees it already
//!
//! for event in notifier.events()? {
//!     println!("cookie {} changed in {:#x?} (hint: {})", event.cookie, event.range(), event.hint);
//! }
//! notifier.unregister(Cookie(7))?;
//! # Ok(()) }
//! ```
//!
//! Where userfaultfd is denied (containers' default seccomp profiles), [`Notifier::new`] runs on
//! the hooks [`Backend`] instead (x86-64 glibc): libc's unmapping calls, glibc's internal ones
//! from `free`, `realloc`, `malloc_trim` and thread exit included, invalidate the regions in the
//! calling thread before they return; raw syscalls and io_uring are not seen.
//! [`Notifier::backend`] says which backend runs and why; `UMN_BACKEND` chooses.
//!
//! See `docs/ARCHITECTURE.md` for the protocol that makes the invalidation visible before the
//! unmapping call returns, and the rules that keep the event path deadlock-free.
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

/// The crate's README (what crates.io shows): its example is compiled with the doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Fuzzing entry point (feature `fuzzing`); not part of the API.
#[cfg(all(not(loom), any(test, feature = "fuzzing")))]
#[doc(hidden)]
#[path = "fuzz.rs"]
pub mod __fuzz;
/// Test-only switches; not part of the API.
#[cfg(not(loom))]
#[doc(hidden)]
pub mod __testing {
    /// Turns the REMOVE-in-flight protection (issue 9) off for the rest of the process, to show
    /// what it prevents. Breaks guarantee 1.
    pub use crate::inflight::disable_for_tests as disable_remove_in_flight;
    /// The signal the library sends for `REMOVE` windows, if it is installed (README, "One
    /// signal").
    pub use crate::inflight::signal as remove_signal;
}
/// Time spent in the kernel calls a cache miss makes (feature `call-times`), for
/// `umn bench --miss`; not part of the API.
#[cfg(all(not(loom), feature = "call-times"))]
#[doc(hidden)]
pub use sys::call_times;
#[cfg(not(loom))]
mod backend;
#[cfg(not(loom))]
pub mod cache;
#[cfg(not(loom))]
mod cookies;
#[cfg(not(loom))]
mod coverage;
mod env;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod event;
#[cfg(not(loom))]
mod fork;
mod generation;
#[cfg(not(loom))]
mod index;
mod inflight;
#[cfg(not(loom))]
mod notifier;
mod primitive;
#[cfg(not(loom))]
mod queue;
#[cfg(not(loom))]
mod region;
#[cfg(not(loom))]
pub mod registrar;
#[cfg(not(loom))]
mod segvec;
#[cfg(not(loom))]
mod sink;
#[cfg(not(loom))]
mod sorted_map;
#[cfg(not(loom))]
mod sys;

#[cfg(not(loom))]
pub use backend::ebpf;
#[cfg(not(loom))]
pub use backend::kernel::KernelNotifier;
#[cfg(not(loom))]
pub use backend::{probe, Backend, BackendReport, BACKEND_ENV};
#[cfg(not(loom))]
pub use cache::Cache;
#[cfg(not(loom))]
pub use error::{Error, Result, Unsupported};
#[cfg(not(loom))]
pub use event::Event;
pub use generation::Generation;
#[cfg(not(loom))]
pub use notifier::{Notifier, ReadEvents, Stats};
#[cfg(not(loom))]
pub use region::{Cookie, Region};
#[cfg(not(loom))]
pub use registrar::{IoUringRegistrar, MlockRegistrar, NoopRegistrar, Registrar, VerbsRegistrar};
