//! The catalogue of mapping changes, and how a watcher is judged against each.
//!
//! Every [`ChangeKind`] is one way the memory behind a registered range can be replaced, released
//! or moved (plus one control case, [`ChangeKind::UntouchedNeighbour`], where it must not be).
//! [`run_case`] sets the memory up, lets the [`Watcher`] under test watch it, pins it through an
//! io_uring fixed buffer, applies exactly one change, asks the watcher right after the call
//! returned, and judges the answer with two oracles (PFNs and the device view); the result is a
//! [`CaseReport`].
//!
//! [`ChangeKind::BrkShrink`] moves the program break, which glibc malloc owns, so it must run in a
//! process that does nothing else: see [`run_in_child`].

mod child;
mod json;
mod mapping;
mod report;
mod run;
mod scenario;
mod watcher;

pub use child::{
    child_case_from_env, print_child_report, run_in_child, CHILD_CASE_ENV, OWN_PROCESS_ENV,
    REPORT_PREFIX,
};
pub use json::{case_json, parse_case_json, quote as json_string, CaseJson};
pub use report::CaseReport;
pub use run::{run_case, TRIES};
pub use watcher::{NaiveWatcher, WatchError, Watcher};

use std::fmt;
use std::io;
use std::ops::Range;

use scenario::Scenario;

/// `MADV_DONTNEED_LOCKED` (Linux 5.18): like `MADV_DONTNEED`, also for `mlock`ed pages.
pub const MADV_DONTNEED_LOCKED: libc::c_int = 24;
/// `MREMAP_DONTUNMAP` (Linux 5.7): move the pages, leave the old range mapped but empty.
pub const MREMAP_DONTUNMAP: libc::c_int = 4;
/// `MADV_COLLAPSE` (Linux 6.1): collapse the range into transparent huge pages (new frames).
pub const MADV_COLLAPSE: libc::c_int = 25;
/// `MADV_GUARD_INSTALL` (Linux 6.13): zap the pages and make any access fault.
pub const MADV_GUARD_INSTALL: libc::c_int = 102;
/// `MADV_GUARD_REMOVE` (Linux 6.13): remove guard markers (the pages come back empty).
pub const MADV_GUARD_REMOVE: libc::c_int = 103;
/// System call number of `process_madvise(2)` on this architecture.
pub const SYS_PROCESS_MADVISE: libc::c_long = libc::SYS_process_madvise;
/// System call number of `pidfd_open(2)` on this architecture.
pub const SYS_PIDFD_OPEN: libc::c_long = libc::SYS_pidfd_open;

/// One way the memory behind a registered range can change.
///
/// Names ([`ChangeKind::name`]) are stable, kebab-case, and used by the command line and in JSON.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// `munmap` through libc, then a new page mapped at the same address.
    LibcMunmap,
    /// A raw `syscall(SYS_munmap)` (invisible to an interposed `munmap`), then a remap.
    SyscallMunmap,
    /// `mmap(MAP_FIXED)` of a new anonymous mapping directly over the range.
    MmapFixedOver,
    /// `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` to a reserved destination, then a remap of the
    /// old address.
    MremapMove,
    /// `mremap` shrinking an 8-page mapping to 4 pages: the tail is unmapped.
    MremapShrink,
    /// `mremap(MREMAP_DONTUNMAP)`: the pages move, the old range stays mapped but empty.
    MremapDontunmap,
    /// `madvise(MADV_DONTNEED)`: pages zapped, refaulted as new zero pages.
    MadvDontneed,
    /// `madvise(MADV_FREE)`: lazy free. The kernel may drop the contents at any time, so an event
    /// is expected, but pinned frames stay: the oracles are not asserted.
    MadvFree,
    /// `madvise(MADV_DONTNEED_LOCKED)` on `mlock`ed memory.
    MadvDontneedLocked,
    /// `madvise(MADV_REMOVE)` on a shared memfd (shmem) mapping: the backing is punched out.
    MadvRemoveShmem,
    /// `sbrk` grow and touch, then `sbrk` shrink (and grow again). Needs its own process.
    BrkShrink,
    /// `process_madvise(pidfd_open(getpid()), MADV_DONTNEED)`.
    ProcessMadvise,
    /// `IORING_OP_MADVISE(MADV_DONTNEED)` issued through io_uring.
    UringMadvise,
    /// A `MAP_SHARED` mapping of a real file in `/tmp`, then `munmap` and a remap.
    FileBacked,
    /// A `malloc` block large enough to be `mmap`ed, watched in part, then `free()`d.
    FreeMallocBlock,
    /// A region covering pages 2..6 of a 12-page mapping, `munmap` of pages 4..10: the event's
    /// hint must be the clipped intersection, pages 4..6.
    PartialOverlap,
    /// `munmap` of the pages right after the region (6..8 of 12; region 2..6): nothing may be
    /// reported. "Detected" means correctly silent: still valid, no event.
    UntouchedNeighbour,
    /// `shmdt` of a SysV shared-memory segment (userfaultfd sends no event for it).
    Shmdt,
    /// `madvise(MADV_GUARD_INSTALL)`: the pages are zapped and guard markers installed
    /// (userfaultfd sends no event). The refill removes the guards first.
    MadvGuardInstall,
    /// `madvise(MADV_COLLAPSE)` over a 2 MiB-aligned mapping: the small pages are copied into a
    /// new huge page (new frames; userfaultfd sends no event). Pinned pages can not be
    /// collapsed, so this case is judged by PFNs alone, unpinned.
    MadvCollapse,
    /// `fallocate(PUNCH_HOLE)` on the memfd behind a shared mapping: the pages are zapped
    /// (userfaultfd sends no event).
    PunchHole,
    /// `ftruncate` to 0 of the memfd behind a shared mapping (the refill restores the size): the
    /// pages are zapped (userfaultfd sends no event).
    FtruncateShared,
}

impl ChangeKind {
    /// Every kind, in catalogue order.
    pub const ALL: &'static [ChangeKind] = &[
        ChangeKind::LibcMunmap,
        ChangeKind::SyscallMunmap,
        ChangeKind::MmapFixedOver,
        ChangeKind::MremapMove,
        ChangeKind::MremapShrink,
        ChangeKind::MremapDontunmap,
        ChangeKind::MadvDontneed,
        ChangeKind::MadvFree,
        ChangeKind::MadvDontneedLocked,
        ChangeKind::MadvRemoveShmem,
        ChangeKind::BrkShrink,
        ChangeKind::ProcessMadvise,
        ChangeKind::UringMadvise,
        ChangeKind::FileBacked,
        ChangeKind::FreeMallocBlock,
        ChangeKind::PartialOverlap,
        ChangeKind::UntouchedNeighbour,
        ChangeKind::Shmdt,
        ChangeKind::MadvGuardInstall,
        ChangeKind::MadvCollapse,
        ChangeKind::PunchHole,
        ChangeKind::FtruncateShared,
    ];

    /// The stable kebab-case name, e.g. `"libc-munmap"`.
    pub const fn name(self) -> &'static str {
        match self {
            ChangeKind::LibcMunmap => "libc-munmap",
            ChangeKind::SyscallMunmap => "syscall-munmap",
            ChangeKind::MmapFixedOver => "mmap-fixed-over",
            ChangeKind::MremapMove => "mremap-move",
            ChangeKind::MremapShrink => "mremap-shrink",
            ChangeKind::MremapDontunmap => "mremap-dontunmap",
            ChangeKind::MadvDontneed => "madv-dontneed",
            ChangeKind::MadvFree => "madv-free",
            ChangeKind::MadvDontneedLocked => "madv-dontneed-locked",
            ChangeKind::MadvRemoveShmem => "madv-remove-shmem",
            ChangeKind::BrkShrink => "brk-shrink",
            ChangeKind::ProcessMadvise => "process-madvise",
            ChangeKind::UringMadvise => "uring-madvise",
            ChangeKind::FileBacked => "file-backed",
            ChangeKind::FreeMallocBlock => "free-malloc-block",
            ChangeKind::PartialOverlap => "partial-overlap",
            ChangeKind::UntouchedNeighbour => "untouched-neighbour",
            ChangeKind::Shmdt => "shmdt",
            ChangeKind::MadvGuardInstall => "madv-guard-install",
            ChangeKind::MadvCollapse => "madv-collapse",
            ChangeKind::PunchHole => "punch-hole",
            ChangeKind::FtruncateShared => "ftruncate-shared",
        }
    }

    /// The kind named `name` (as returned by [`ChangeKind::name`]).
    pub fn from_name(name: &str) -> Option<ChangeKind> {
        ChangeKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// Whether the case must run in a fresh process that does nothing else (see [`run_in_child`]).
    ///
    /// True for [`ChangeKind::BrkShrink`]: it moves the program break, which glibc malloc owns; a
    /// concurrent heap extension by any thread would make the shrink cut malloc's memory.
    pub const fn needs_own_process(self) -> bool {
        matches!(self, ChangeKind::BrkShrink)
    }

    /// Whether the change must show up in both oracles (new frames, stale device bytes).
    ///
    /// False for [`ChangeKind::MadvFree`] (lazy: pinned frames stay until reclaim) and for
    /// [`ChangeKind::UntouchedNeighbour`] (nothing in the range changes).
    pub const fn replaces_memory(self) -> bool {
        !matches!(self, ChangeKind::MadvFree | ChangeKind::UntouchedNeighbour)
    }

    /// Whether a correct watcher must report an event (all kinds but the control case).
    pub const fn expects_event(self) -> bool {
        !matches!(self, ChangeKind::UntouchedNeighbour)
    }

    /// Whether the kernel sends userfaultfd an event for this kind (KERNEL-FACTS: none for
    /// `shmdt`, `MADV_GUARD_INSTALL`, `MADV_COLLAPSE`, hole punching and truncation of a shared
    /// file mapping). A watcher built on userfaultfd alone can not see the others: they stay in
    /// the table as missed, with `expected: false`.
    pub const fn userfaultfd_reports(self) -> bool {
        !matches!(
            self,
            ChangeKind::Shmdt
                | ChangeKind::MadvGuardInstall
                | ChangeKind::MadvCollapse
                | ChangeKind::PunchHole
                | ChangeKind::FtruncateShared
        )
    }

    /// Whether libc hooks (the hooks backend, which patches glibc's syscall sites) see this
    /// kind: every kind made by a libc call (`munmap`, `mremap`, `madvise`, `mmap(MAP_FIXED)`,
    /// `sbrk`, `shmdt`, `free`), none made by a raw syscall, `process_madvise`, io_uring or a
    /// change to the file behind a mapping (`fallocate`, `ftruncate`).
    pub const fn hooks_report(self) -> bool {
        !matches!(
            self,
            ChangeKind::SyscallMunmap
                | ChangeKind::ProcessMadvise
                | ChangeKind::UringMadvise
                | ChangeKind::PunchHole
                | ChangeKind::FtruncateShared
        )
    }

    /// Whether the hybrid backend (hooks in front of userfaultfd) sees this kind: what either
    /// half sees. Only changes to the file behind a shared mapping stay missed.
    pub const fn hybrid_reports(self) -> bool {
        self.userfaultfd_reports() || self.hooks_report()
    }

    /// Whether the eBPF backend (programs on the `sys_enter_*`/`sys_exit_*` tracepoints of
    /// munmap, mremap, madvise, brk, mmap, shmdt, shmat, process_madvise) sees this kind: every
    /// kind made by one of those syscalls, libc or raw, including `shmdt`,
    /// `MADV_GUARD_INSTALL` and `MADV_COLLAPSE`; none made through io_uring or by a change to
    /// the file behind a mapping (`fallocate`, `ftruncate`). (ia32 `int $0x80` calls are not in
    /// the catalogue; eBPF misses them too.)
    pub const fn ebpf_reports(self) -> bool {
        !matches!(
            self,
            ChangeKind::UringMadvise | ChangeKind::PunchHole | ChangeKind::FtruncateShared
        )
    }

    /// Whether the perf tracepoint backend (`syscalls:sys_enter_*` of this process's threads)
    /// sees this kind: every kind made by a traced syscall, libc or raw (`munmap`, `mremap`,
    /// `madvise` including `MADV_GUARD_INSTALL` and `MADV_COLLAPSE`, `mmap(MAP_FIXED)`, `brk`,
    /// `shmdt`, `process_madvise`); none made without one (io_uring `IORING_OP_MADVISE`) or by a
    /// change to the file behind a mapping (`fallocate(PUNCH_HOLE)`, `ftruncate`: not traced,
    /// and the call names no address).
    /// (The same set as [`ebpf_reports`](Self::ebpf_reports): the same tracepoints.)
    pub const fn perf_reports(self) -> bool {
        self.ebpf_reports()
    }

    /// Whether the backend named `backend` (`umn`'s and `UMN_BACKEND`'s names: `uffd`, `hooks`,
    /// `hybrid`, `ebpf`, `kernel`, `perf`, `tracepoint`) is expected to see this kind; `None` for
    /// a name this catalogue does not know. The module's MMU notifiers (`kernel`) and the
    /// tracepoints on their path (`tracepoint`) see every kind.
    pub fn expected_on(self, backend: &str) -> Option<bool> {
        Some(match backend {
            "uffd" => self.userfaultfd_reports(),
            "hooks" => self.hooks_report(),
            "hybrid" => self.hybrid_reports(),
            "ebpf" => self.ebpf_reports(),
            "perf" => self.perf_reports(),
            // Both see every invalidation of the mm: the MMU notifiers, and the tracepoints on
            // their path (kernel/patches/mmu-notifier-trace/).
            "kernel" | "tracepoint" => true,
            _ => return None,
        })
    }

    /// Whether the case pins its range with an io_uring fixed buffer (the device oracle).
    /// False for [`ChangeKind::MadvCollapse`]: the kernel does not collapse pinned pages.
    pub const fn pins(self) -> bool {
        !matches!(self, ChangeKind::MadvCollapse)
    }
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Content of the memory before a [`Change`].
pub const OLD_BYTE: u8 = scenario::OLD_BYTE;
/// Content of the new memory a [`Change`] puts at the old address (x == y).
pub const NEW_BYTE: u8 = scenario::NEW_BYTE;

/// One change of the catalogue, step by step, for tests that bring their own device instead of
/// [`run_case`]'s io_uring pin (an RDMA memory registration served by a cache, say).
///
/// [`setup`](Self::setup) maps the kind's memory and fills it with [`OLD_BYTE`]; the test
/// registers [`range`](Self::range) its own way; [`apply`](Self::apply) makes exactly one
/// change of the kind; [`refill`](Self::refill) puts new memory at the old address (x == y)
/// and fills the range with [`NEW_BYTE`]. Dropping it releases what is left.
#[derive(Debug)]
pub struct Change {
    sc: Scenario,
}

impl Change {
    /// Sets up `kind`'s memory, filled with [`OLD_BYTE`].
    ///
    /// # Errors
    /// A [`crate::require::MissingFeature`] where the kernel lacks what the kind needs;
    /// `InvalidInput` for a kind that needs a process of its own
    /// ([`ChangeKind::needs_own_process`]) unless [`OWN_PROCESS_ENV`] declares one; the OS
    /// error of a step.
    pub fn setup(kind: ChangeKind) -> io::Result<Change> {
        if kind.needs_own_process() && !child::in_own_process() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{kind} moves the program break: only in a process of its own ({OWN_PROCESS_ENV}=1)"),
            ));
        }
        Ok(Change {
            sc: Scenario::setup(kind)?,
        })
    }

    /// The range to register (and to read back over the wire).
    pub fn range(&self) -> Range<usize> {
        self.sc.range.clone()
    }

    /// The part of [`range`](Self::range) the change replaces (`None` for the control case,
    /// which changes only a neighbour).
    pub fn changed(&self) -> Option<Range<usize>> {
        self.sc.expected.clone()
    }

    /// Makes the change: exactly one call of the kind.
    ///
    /// # Errors
    /// A [`crate::require::MissingFeature`] where the kernel refuses the call as unknown
    /// (`process_madvise(MADV_DONTNEED)` on Linux 6.1, say); the call's OS error.
    pub fn apply(&mut self) -> io::Result<()> {
        self.sc.apply()
    }

    /// New memory at the old address, and the whole range filled with [`NEW_BYTE`].
    ///
    /// # Errors
    /// When the old address can not be mapped again (taken by another mapping).
    pub fn refill(&mut self) -> io::Result<()> {
        self.sc.refill()
    }

    /// Releases the memory; returns problems (a program break it could not restore).
    pub fn cleanup(mut self) -> Vec<String> {
        self.sc.cleanup()
    }
}
