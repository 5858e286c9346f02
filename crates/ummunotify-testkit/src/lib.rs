//! Real-kernel test support for ummunotify.
//!
//! This crate proves, on the running kernel, that a watcher really notices every way the memory
//! behind a registered range can change, and that the hazard it guards against is real:
//!
//! * [`pagemap`]: the PFN oracle. Reading `/proc/self/pagemap` tells which physical frame backs a
//!   page. While the old frame is pinned (see [`uring`]) a replaced page always gets a different
//!   frame, so "PFN differs" is an exact oracle.
//! * [`uring`]: the device-side view. A [`uring::Pinner`] registers one io_uring fixed buffer, which
//!   pins its pages exactly like an RDMA memory registration, and writes through it to a scratch
//!   file: what lands in the file is what a device would read.
//! * [`changes`]: the catalogue of mapping changes ([`changes::ChangeKind`]), the [`changes::Watcher`]
//!   trait that drives the thing under test, and [`changes::run_case`], which applies one change and
//!   judges the watcher with both oracles.
//! * [`cprog`]: building and running the C test programs of the C crates.
//! * [`rdma`]: the wire. A queue pair to a peer process that RDMA-READs and RDMA-WRITEs this
//!   process's registered memory (soft-RoCE in the QEMU guest: `kernel/rxe/`).
//! * [`remove_race`]: the ways to make the kernel send a userfaultfd `REMOVE` (issue 9), buffers
//!   and the seqlock of the REMOVE-race stress.
//! * [`require`]: how a missing kernel feature is reported (a loud SKIP, or a failure when
//!   `UMN_REQUIRE_ALL=1`).
//!
//! The crate deliberately does not depend on the `ummunotify` library: the same catalogue runs
//! against the real notifier, against [`changes::NaiveWatcher`] (which never invalidates, to show
//! the hazard), and from the `umn` command line.

#![warn(missing_docs)]

pub mod changes;
pub mod cprog;
pub mod pagemap;
pub mod rdma;
pub mod remove_race;
pub mod require;
pub mod uring;
