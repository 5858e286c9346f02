//! Backends: where invalidations come from, behind one contract.
//!
//! # The seam
//! A backend is one module here plus one arm in [`open`]. It implements [`Watcher`] (watch and
//! unwatch page ranges; start delivering) and delivers every change to the mappings behind the
//! watched pages into the notifier core through [`crate::sink::Sink`], the one narrow
//! interface the core implements. A backend never imports `crate::notifier`; the core
//! ([`crate::notifier`]) never sees a backend's types, fds or errnos (a backend maps its own
//! refusals to [`Error`](crate::Error) in [`Watcher::watch`]).
//!
//! ```text
//!  Notifier (core) ──watch/unwatch──▶ Box<dyn Watcher> ──▶ kernel / libc / rings
//!        ▲                                  │
//!        └──── Sink: begin/apply/end, ◀─────┘  deliver(): a monitor thread, the hooked
//!              invalidate_in_thread,            calling thread, or a Probe pulled by checks
//!              window_open/close, kill
//! ```
//!
//! # The contract every backend meets
//! 1. **Visible before the unmapping call returns** (guarantee 1), by one of three shapes:
//!    push from a monitor thread that the unmapping thread waits for, push from the unmapping
//!    thread itself, or pull at check time ([`crate::sink::Probe`]). How each backend does it
//!    is written below and in `docs/ARCHITECTURE.md`, "Backends".
//! 2. **Free when unused** (guarantee 3): pages that are not watched cost nothing on any path;
//!    a push-only backend leaves the check's one-load fast path alone.
//! 3. **Watching is idempotent** and may be asked for ranges already watched; unwatching a
//!    range that is (partly) unmapped is not an error.
//! 4. **The event path** (everything that calls the sink) never allocates, frees, unmaps or
//!    logs and takes no lock but the core's index lock (through the sink).
//! 5. **Fail loudly**: a backend that can not start returns [`Unsupported`](crate::Unsupported)
//!    naming what is missing (errno, sysctl, privilege), never a silent degraded mode.
//! 6. **Stopping** ([`Delivery::stop`]) returns only once no delivery into the sink is in
//!    progress or can start; in a forked child it must not wait for threads that do not exist.
//!
//! Backends are chosen at run time by probing the kernel, not by cargo features.
//!
//! # Each backend's visibility rule
//! * **userfaultfd** ([`uffd`]): the kernel queues a non-cooperative `UNMAP`/`REMOVE`/`REMAP`
//!   message and the unmapping thread sleeps until the monitor thread *dequeues* it. The monitor
//!   calls [`Sink::begin`](crate::sink::Sink::begin) (counter odd) *before* each single-message
//!   `read()`, so every check made after the unmapping thread was released waits for
//!   [`Sink::end`](crate::sink::Sink::end) and then sees the region invalid (the busy protocol
//!   of `crate::generation`). A `REMOVE` is dequeued before its pages are zapped: the monitor
//!   opens a window ([`Sink::window_open`](crate::sink::Sink::window_open)) that the in-flight
//!   protocol ends.
//! * **hooks** ([`hooks`]): libc's unmapping functions are patched; the calling thread
//!   invalidates the regions on the affected pages itself
//!   ([`Sink::invalidate_in_thread`](crate::sink::Sink::invalidate_in_thread)), before it makes
//!   the syscall and again after it. No monitor, no message, no window needed (the second pass
//!   is the window's end).
//! * **ebpf** ([`ebpf`]): programs on the syscall-entry tracepoints bump, in the calling thread
//!   before the syscall changes anything, a word per watched range in an mmapped BPF array and
//!   the array's counter; the watcher's [`Probe`](crate::sink::Probe) compares the counter with
//!   the last value it delivered (one load when nothing changed) and delivers the moved words.
//!   The programs on the `sys_exit_*` tracepoints bump again for ranges watched while the call
//!   ran, so a registration inside a call's window never stays valid (the window's end).
//! * **perf** ([`perf`]): the kernel writes a record of each traced syscall's entry (and exit)
//!   into the per-CPU rings in the calling thread, before the syscall returns; the probe loads
//!   each ring's head (N loads when nothing changed), applies new records through the sink
//!   (an entry opens a window, the exit closes it) and calls
//!   [`Sink::invalidate_all`](crate::sink::Sink::invalidate_all) for a ring found nearly full.
//! * **kernel** ([`kernel`]): this project's `/dev/ummunotify` module bumps its mapped counter
//!   and queues the event from its MMU notifier, in the invalidating thread; the probe loads
//!   that counter and, when it moved, reads the module's events into the sink. Every watch is a
//!   module region, which the module itself invalidates at `invalidate_range_end` if it was
//!   registered while an invalidation was in progress: no window in the core.
//! * **hybrid** (`hybrid`): the hooks' rule for libc calls (whose hook also removes the
//!   userfaultfd watch, so the kernel sends nothing), the busy protocol for the rest.
//!
//! # Adding a backend
//! One module (`backend/NAME/`) with a type implementing [`Watcher`], one [`Backend`] variant
//! and its arm in [`open`], [`Backend::name`]/[`c_name`](Backend::c_name)/
//! [`from_name`](Backend::from_name) and [`probe`].
//!
//! With a probe, the notifier's counter carries [`crate::generation::PULL`] and every check
//! pulls first; without one the fast path stays one load and one compare.
pub mod ebpf;
pub(crate) mod hooks;
mod hybrid;
pub(crate) mod kernel;
#[cfg(target_arch = "x86_64")]
pub(crate) mod perf;
pub(crate) mod syscalls;
pub(crate) mod table;
pub(crate) mod thread;
pub(crate) mod uffd;

use std::sync::Arc;

pub(crate) use crate::sink::Invalidation;
use crate::sink::{Probe, Sink};

/// Which backend a [`Notifier`](crate::Notifier) runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The kernel module where it is loaded, else userfaultfd where it starts, else hooks
    /// (what [`Notifier::new`](crate::Notifier::new) uses unless `UMN_BACKEND` says otherwise).
    Auto,
    /// userfaultfd's non-cooperative events: sees every kind of change the kernel reports,
    /// libc or raw syscall; one monitor thread.
    Userfaultfd,
    /// libc's unmapping calls patched in the calling thread (x86-64, dynamic glibc): works
    /// where userfaultfd is denied; misses raw syscalls and io_uring.
    Hooks,
    /// Hooks in front of userfaultfd: libc's calls are caught in the calling thread, which
    /// removes the userfaultfd watch from their pages before calling through (no message, no
    /// round trip); userfaultfd still sees raw syscalls, io_uring and `process_madvise`; pages
    /// another userfaultfd owns are watched by the hooks alone.
    Hybrid,
    /// BPF programs on the syscall tracepoints bump a word per watched range in a mapped
    /// array, in the calling thread; checks pull (one load when nothing changed). Needs a
    /// running `umn daemon`, or root to load the programs; misses io_uring and file-level
    /// changes.
    Ebpf,
    /// This project's `/dev/ummunotify` kernel module (`kernel/module/`) where it is loaded:
    /// MMU notifiers in the invalidating thread, every cause, no window; checks pull its
    /// mapped counter. [`Auto`](Backend::Auto) prefers it.
    Kernel,
    /// perf `syscalls:sys_enter_*`/`sys_exit_*` tracepoints of this process's threads, one ring
    /// per CPU, pulled by every check (x86-64; needs tracefs and `CAP_PERFMON`): sees raw
    /// syscalls, `shmdt` and `MADV_GUARD_INSTALL`; misses io_uring and file hole punching.
    /// Never chosen by `Auto`.
    Perf,
    /// perf on the `mmu_notifier_invalidate_range_start`/`_end` tracepoints (the 2009
    /// counter-proposal as proposed; `kernel/patches/mmu-notifier-trace/`, no released kernel
    /// has them), one CPU-wide event per CPU filtered to this mm, pulled by every check
    /// (x86-64; needs tracefs and `CAP_PERFMON`): sees every invalidation of the process's
    /// pages, whichever task makes it. Never chosen by `Auto`.
    Tracepoint,
}

/// The environment variable [`Notifier::new`](crate::Notifier::new) reads.
pub const BACKEND_ENV: &str = "UMN_BACKEND";

impl Backend {
    /// The name `UMN_BACKEND` and `umn` use: `auto`, `uffd`, `hooks`, `hybrid`, `ebpf`, `kernel`,
    /// `perf`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Userfaultfd => "uffd",
            Backend::Hooks => "hooks",
            Backend::Hybrid => "hybrid",
            Backend::Ebpf => "ebpf",
            Backend::Kernel => "kernel",
            Backend::Perf => "perf",
            Backend::Tracepoint => "tracepoint",
        }
    }

    /// [`name`](Self::name) as a static C string (for the C API).
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Backend::Auto => c"auto",
            Backend::Userfaultfd => c"uffd",
            Backend::Hooks => c"hooks",
            Backend::Hybrid => c"hybrid",
            Backend::Ebpf => c"ebpf",
            Backend::Kernel => c"kernel",
            Backend::Perf => c"perf",
            Backend::Tracepoint => c"tracepoint",
        }
    }

    /// Parses `auto`, `uffd` (or `userfaultfd`), `hooks`, `hybrid`, `ebpf` (or `bpf`), `kernel`,
    /// `perf`, `tracepoint`.
    pub fn from_name(name: &str) -> Option<Backend> {
        match name.trim() {
            "auto" | "" => Some(Backend::Auto),
            "uffd" | "userfaultfd" => Some(Backend::Userfaultfd),
            "hooks" => Some(Backend::Hooks),
            "hybrid" => Some(Backend::Hybrid),
            "ebpf" | "bpf" => Some(Backend::Ebpf),
            "kernel" => Some(Backend::Kernel),
            "perf" => Some(Backend::Perf),
            "tracepoint" => Some(Backend::Tracepoint),
            _ => None,
        }
    }

    /// The backend `UMN_BACKEND` names ([`Auto`](Backend::Auto) when unset).
    ///
    /// # Errors
    /// [`Unsupported::UnknownBackend`](crate::Unsupported::UnknownBackend) for any other value.
    pub fn from_env() -> Result<Backend, crate::Unsupported> {
        match crate::env::var(BACKEND_ENV).map(|v| v.into_string()) {
            None => Ok(Backend::Auto),
            Some(Ok(v)) => {
                Backend::from_name(&v).ok_or(crate::Unsupported::UnknownBackend { value: v })
            }
            Some(Err(v)) => Err(crate::Unsupported::UnknownBackend {
                value: v.to_string_lossy().into_owned(),
            }),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A running backend as the core sees it: watches pages, starts delivery. One per notifier.
pub(crate) trait Watcher: Send + Sync {
    /// Starts watching `[start, end)` (page aligned, mapped when asked; idempotent).
    ///
    /// # Errors
    /// The backend's refusal as a typed [`Error`](crate::Error) (`RangeBusy`, `CoverageLimit`,
    /// `UnsupportedMapping`, `Os`); the core turns it into `Unmapped` when the range turns out
    /// to be unmapped.
    fn watch(&self, start: u64, end: u64) -> crate::Result<()>;

    /// Stops watching `[start, end)`. Parts may be unmapped already (their watch went with the
    /// mapping); that is not an error and nothing is reported.
    fn unwatch(&self, start: u64, end: u64);

    /// Whether a watch splits the VMA it lies in (so the watch policy's VMA budget applies).
    fn splits_vmas(&self) -> bool;

    /// Whether `[start, end)`, just watched, may hold shared memory (the fresh-watch window's
    /// question), when the backend can tell without `/proc/self/maps`: `Some(false)` only when
    /// it is sure there is none. `None`: not known (the core looks it up). Issue 41.
    fn maybe_shared(&self, _start: u64, _end: u64) -> Option<bool> {
        None
    }

    /// Right after a successful watch of `[start, end)`: `Some(shared)` when the backend can
    /// prove, with the calls [`maybe_shared`](Self::maybe_shared) makes anyway, that one VMA
    /// holds all of the range now and every unmap of it since the watch was reported (so the
    /// registration's "still mapped" check needs no call of its own), with the answer to
    /// `maybe_shared`. `None`: not proved (the core checks with `msync`). Issue 41.
    fn covering(&self, _start: u64, _end: u64) -> Option<bool> {
        None
    }

    /// Whether a successful watch of a one-page range proves that the page was mapped then
    /// (and so watched: every later unmap of it is reported), so that a one-page registration
    /// needs no "still mapped" check after its watch. Issue 41.
    fn watch_maps_one_page(&self) -> bool {
        false
    }

    /// Whether the core may skip the watch call for a registration over pages this notifier
    /// counts, with no unmap of them delivered since (issue 12: no syscall for the watch on a
    /// cache miss over watched pages). That needs every unmap of a watched page to be delivered
    /// before the memory can be mapped again, and userfaultfd does not give it: the kernel
    /// removes the VMA and drops `mmap_lock` *before* it queues the `UNMAP` message
    /// (`userfaultfd_unmap_complete`), so another thread can map the same addresses and register
    /// them while the message is still unread; skipping the watch then leaves the new mapping
    /// unwatched, and its own munmap returns with the region valid (guarantee 1; the C API's
    /// `threads` test failed every run with the skip on). No backend says yes now: every
    /// registration watches. The core keeps the bookkeeping (`Registry::lost` and the unmapped
    /// ring) for a backend that can.
    fn watch_persists(&self) -> bool {
        false
    }

    /// Whether a watch of shared memory leaves a `REMOVE` the backend never reports: a
    /// `madvise(MADV_REMOVE)` that looked for a watch before it existed sends no message, yet
    /// zaps afterwards, `mmap_lock` dropped (userfaultfd). The core then opens an in-flight
    /// window over the newly watched shared range and waits for it, as for a `REMOVE` read
    /// (`docs/architecture/in-flight.md`, "REMOVE in flight", the fresh-watch case).
    fn fresh_watch_window(&self) -> bool {
        false
    }

    /// Watch requests the kernel refused because another userfaultfd owns the pages and that
    /// the hooks took alone (hybrid only).
    fn hooks_only(&self) -> u64 {
        0
    }

    /// The pull-at-check-time probe, for backends that need one (see [`crate::sink::Probe`]).
    /// `None` (push delivery only) keeps the checks' one-load fast path.
    fn probe(&self) -> Option<Box<dyn Probe>> {
        None
    }

    /// Starts delivering into `sink`; returns once delivery runs (a delivery thread has made
    /// every mapping it will ever make, see `backend::thread::EventThread::spawn`).
    ///
    /// # Errors
    /// Why delivery can not start (for example, no thread could be spawned).
    /// Why the backend stopped serving its notifiers, when it killed them for a reason the
    /// caller can act on (the hooks overwritten by another library); `None` otherwise.
    fn stopped_because(&self) -> Option<crate::Unsupported> {
        None
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>>;
}

/// Delivery into one notifier's sink, running; [`stop`](Delivery::stop) ends it.
pub(crate) trait Delivery: Send + Sync {
    /// The monitor thread's kernel tid (0 when delivery runs in the calling threads).
    fn monitor_tid(&self) -> i32 {
        0
    }

    /// Ends delivery: returns once no call into the sink is in progress or can start. In a
    /// forked child (`forked`) it must not wait for threads that exist only in the parent.
    fn stop(self: Box<Self>, forked: bool);
}

/// Starts the watcher for `backend`: which backend runs, and why, in words.
pub(crate) fn open(
    backend: Backend,
) -> Result<(Box<dyn Watcher>, Backend, String), crate::Unsupported> {
    let hooks = || {
        let how = hooks::install().clone()?;
        if !hooks::intact() {
            return Err(hooks::OVERWRITTEN_REASON.to_owned());
        }
        Ok((hooks::watcher(), Backend::Hooks, how))
    };
    let uffd = |c: Arc<uffd::Context>, why: &str| {
        let how = format!(
            "{why}userfaultfd, the process's one context, opened with {}",
            c.how()
        );
        (uffd::watcher(c), Backend::Userfaultfd, how)
    };
    // Auto prefers the module where it is loaded (and answers; else on to userfaultfd).
    if backend == Backend::Auto {
        if let Ok(w) = kernel::watcher() {
            let how = "auto: /dev/ummunotify (this project's module) is loaded".to_owned();
            return Ok((w, Backend::Kernel, how));
        }
    }
    match backend {
        #[cfg(target_arch = "x86_64")]
        Backend::Perf => perf::open_watcher().map(|(w, how)| (w, Backend::Perf, how)),
        #[cfg(not(target_arch = "x86_64"))]
        Backend::Perf => Err(crate::Unsupported::Perf {
            missing: "this build's perf backend is x86-64 only".into(),
        }),
        #[cfg(target_arch = "x86_64")]
        Backend::Tracepoint => {
            perf::open_mmu_watcher().map(|(w, how)| (w, Backend::Tracepoint, how))
        }
        #[cfg(not(target_arch = "x86_64"))]
        Backend::Tracepoint => Err(crate::Unsupported::Perf {
            missing: "this build's perf backends are x86-64 only".into(),
        }),
        Backend::Kernel => kernel::watcher().map(|w| {
            let how = "asked for kernel: /dev/ummunotify (this project's module)".to_owned();
            (w, Backend::Kernel, how)
        }),
        Backend::Userfaultfd => Ok(uffd(uffd::Context::shared()?, "asked for ")),
        Backend::Hybrid => {
            let ctx = uffd::Context::shared()?;
            let how = hooks::install()
                .clone()
                .map_err(|reason| crate::Unsupported::Hooks { reason })?;
            let mut why = format!(
                "asked for hybrid: hooks in front of userfaultfd (the process's one context, \
                 opened with {}); {how}",
                ctx.how()
            );
            if !hooks::intact() {
                // Still correct: every watch stays with userfaultfd until a hook removes it.
                why.push_str(
                    "; the hooks were overwritten by another library: runs as userfaultfd",
                );
            }
            Ok((hybrid::watcher(ctx), Backend::Hybrid, why))
        }
        Backend::Ebpf => {
            let area = ebpf::Area::shared().map_err(|e| crate::Unsupported::Ebpf {
                reason: e.to_string(),
            })?;
            let how = if area.is_local() {
                "asked for ebpf: programs loaded in this process"
            } else {
                "asked for ebpf: area from umn daemon"
            };
            Ok((
                Box::new(ebpf::EbpfWatcher::new(area)),
                Backend::Ebpf,
                how.to_string(),
            ))
        }
        Backend::Hooks => hooks()
            .map(|(w, b, how)| (w, b, format!("asked for hooks: {how}")))
            .map_err(|reason| crate::Unsupported::Hooks { reason }),
        Backend::Auto => match uffd::Context::shared() {
            Ok(u) => Ok(uffd(u, "auto: ")),
            Err(e) => match hooks() {
                Ok((w, b, how)) => Ok((
                    w,
                    b,
                    format!("auto: userfaultfd can not start ({e}); hooks: {how}"),
                )),
                Err(hooks) => Err(crate::Unsupported::NoBackend {
                    userfaultfd: Box::new(e),
                    hooks,
                }),
            },
        },
    }
}

/// How many libc calls went through the hooks in this process (0 when never installed).
pub(crate) fn hooked_calls() -> usize {
    hooks::hooked_calls()
}

/// What a backend reports about itself, for `umn doctor`.
#[derive(Debug)]
#[non_exhaustive]
pub struct BackendReport {
    /// The backend's name.
    pub name: &'static str,
    /// `Ok` with how it was opened, or why it can not start.
    pub status: Result<String, crate::Unsupported>,
    /// Feature names the kernel advertises for this backend.
    pub kernel_features: Vec<&'static str>,
    /// Notes: what works, what is degraded and why.
    pub notes: Vec<String>,
}

/// Probes every backend this build knows.
///
/// Probing the hooks backend installs it (patches libc in this process, for good: with no hooks
/// notifier alive that costs each hooked libc call a few loads).
pub fn probe() -> Vec<BackendReport> {
    let (u, h) = (uffd::probe(), hooks::probe());
    let status = match (&u.status, &h.status) {
        (Ok(_), Ok(_)) => Ok("ok: hooks in front of userfaultfd (both below work)".to_string()),
        (Err(e), _) => Err(crate::Unsupported::Hooks {
            reason: format!("needs userfaultfd, which can not start: {e}"),
        }),
        (_, Err(e)) => Err(crate::Unsupported::Hooks {
            reason: format!("needs the hooks, which can not be installed: {e}"),
        }),
    };
    let auto = match (&u.status, &h.status) {
        (Ok(_), _) => {
            "auto picks userfaultfd (it starts here); hybrid is chosen by name".to_string()
        }
        (Err(_), Ok(_)) => "auto picks hooks: userfaultfd can not start here".to_string(),
        (Err(_), Err(_)) => "auto has no backend here".to_string(),
    };
    let hybrid = BackendReport {
        name: "hybrid",
        status,
        kernel_features: Vec::new(),
        notes: vec![
            "libc calls caught in the calling thread, which removes the userfaultfd watch from \
             their pages before calling through (no message, no round trip); raw syscalls, \
             io_uring, process_madvise still reach userfaultfd; shmdt seen by the hooks"
                .to_string(),
            "pages another userfaultfd owns (EBUSY: another library's monitor) are watched by \
             the hooks alone: each notifier counts them in Stats::hooks_only_watches"
                .to_string(),
            auto,
        ],
    };
    let mut v = vec![kernel::probe(), u, h, hybrid, ebpf::probe()];
    #[cfg(target_arch = "x86_64")]
    v.push(perf::probe());
    #[cfg(target_arch = "x86_64")]
    v.push(perf::mmu::probe());
    v
}

#[cfg(test)]
mod tests {
    use super::Backend;

    #[test]
    fn names_round_trip_and_the_c_name_is_the_name() {
        for b in [
            Backend::Auto,
            Backend::Userfaultfd,
            Backend::Hooks,
            Backend::Hybrid,
            Backend::Ebpf,
            Backend::Kernel,
            Backend::Perf,
            Backend::Tracepoint,
        ] {
            assert_eq!(Backend::from_name(b.name()), Some(b));
            assert_eq!(b.c_name().to_str(), Ok(b.name()));
        }
    }
}
