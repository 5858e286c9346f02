//! Kernel backends: where invalidation messages come from.
//!
//! # The contract every backend meets
//!
//! A backend watches page ranges and turns every change to the mappings behind them into a
//! [`Invalidation`] message, delivered to exactly one monitor thread, with these properties:
//!
//! 1. **Synchronous**: the thread making the change does not return from its call before the
//!    monitor has *dequeued* the message (userfaultfd's non-cooperative events have this).
//!    The monitor's side of the visibility protocol (`crate::generation`) turns "dequeued" into
//!    "visible to every later check".
//! 2. **One message per dequeue**: the monitor can take messages one at a time, so it can mark
//!    itself busy before each.
//! 3. **Free when unused**: pages that are not watched cost nothing on any path.
//! 4. **Watching is idempotent** and may be asked for ranges that are already watched.
//! 5. **Fail loudly**: a backend that can not start returns [`Unsupported`](crate::Unsupported)
//!    naming what is missing (errno, sysctl, privilege), never a silent degraded mode.
//!
//! Backends are chosen at run time by probing the kernel, not by cargo features.
//!
//! The hooks backend ([`hooks`]) meets the contract differently for point 1: there is no
//! monitor and no message; the thread making the change invalidates the regions itself, before
//! its syscall and again after it (see its module doc).
pub(crate) mod hooks;
#[cfg(target_arch = "x86_64")]
pub(crate) mod perf;
pub(crate) mod uffd;

use std::io;
use std::os::fd::BorrowedFd;

/// Which backend a [`Notifier`](crate::Notifier) runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// userfaultfd where it starts, else hooks (what [`Notifier::new`](crate::Notifier::new)
    /// uses unless `UMN_BACKEND` says otherwise).
    Auto,
    /// userfaultfd's non-cooperative events: sees every kind of change the kernel reports,
    /// libc or raw syscall; one monitor thread.
    Userfaultfd,
    /// libc's unmapping calls patched in the calling thread (x86-64, dynamic glibc): works
    /// where userfaultfd is denied; misses raw syscalls and io_uring.
    Hooks,
}

/// The environment variable [`Notifier::new`](crate::Notifier::new) reads.
pub const BACKEND_ENV: &str = "UMN_BACKEND";

impl Backend {
    /// The name `UMN_BACKEND` and `umn` use: `auto`, `uffd`, `hooks`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Userfaultfd => "uffd",
            Backend::Hooks => "hooks",
        }
    }

    /// Parses `auto`, `uffd` (or `userfaultfd`), `hooks`.
    pub fn from_name(name: &str) -> Option<Backend> {
        match name.trim() {
            "auto" | "" => Some(Backend::Auto),
            "uffd" | "userfaultfd" => Some(Backend::Userfaultfd),
            "hooks" => Some(Backend::Hooks),
            _ => None,
        }
    }

    /// The backend `UMN_BACKEND` names ([`Auto`](Backend::Auto) when unset).
    ///
    /// # Errors
    /// [`Unsupported::UnknownBackend`](crate::Unsupported::UnknownBackend) for any other value.
    pub fn from_env() -> Result<Backend, crate::Unsupported> {
        match std::env::var(BACKEND_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Backend::Auto),
            Ok(v) => Backend::from_name(&v).ok_or(crate::Unsupported::UnknownBackend { value: v }),
            Err(std::env::VarError::NotUnicode(v)) => Err(crate::Unsupported::UnknownBackend {
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

/// What a notifier watches pages with: the kernel (userfaultfd) or the hooks' filter.
pub(crate) enum Watcher {
    Uffd(uffd::Uffd),
    Hooks(hooks::Watch),
}

impl Watcher {
    /// Starts watching `[start, end)` (page aligned; idempotent).
    pub(crate) fn watch(&self, start: u64, end: u64) -> io::Result<()> {
        match self {
            Watcher::Uffd(u) => u.watch(start, end),
            Watcher::Hooks(h) => {
                h.watch(start, end);
                Ok(())
            }
        }
    }

    /// Stops watching `[start, end)`.
    pub(crate) fn unwatch(&self, start: u64, end: u64) -> io::Result<()> {
        match self {
            Watcher::Uffd(u) => u.unwatch(start, end),
            Watcher::Hooks(h) => {
                h.unwatch(start, end);
                Ok(())
            }
        }
    }

    /// The userfaultfd context's fd (only the uffd backend has a monitor that asks).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Watcher::Uffd(u) => u.fd(),
            Watcher::Hooks(_) => unreachable!("no monitor thread runs on the hooks backend"),
        }
    }

    /// See `Uffd::close_from_monitor`.
    pub(crate) fn close_from_monitor(&self) {
        if let Watcher::Uffd(u) = self {
            u.close_from_monitor();
        }
    }
}

/// A change to the mappings behind a watched range, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Invalidation {
    /// `[start, end)` was unmapped (munmap, `MAP_FIXED` over it, mremap shrink, brk shrink, the
    /// old range of an mremap move). The range is the whole syscall range, not clipped; the
    /// kernel's watch on it is gone with the mapping.
    Unmap { start: u64, end: u64 },
    /// The pages of `[start, end)` are being dropped (madvise `DONTNEED`/`FREE`/`REMOVE`, ...);
    /// the mapping and its watch stay.
    Remove { start: u64, end: u64 },
    /// The pages of `[from, from + len)` moved to `to` (mremap); the watch moved with them.
    Remap { from: u64, to: u64, len: u64 },
    /// Anything else the backend reports (ignored).
    Other,
}

/// Starts the watcher for `backend`: which backend runs, and why, in words.
pub(crate) fn open(backend: Backend) -> Result<(Watcher, Backend, String), crate::Unsupported> {
    let hooks = || {
        hooks::install()
            .clone()
            .map(|how| (Watcher::Hooks(hooks::Watch::new()), Backend::Hooks, how))
    };
    let uffd = |u: uffd::Uffd, why: &str| {
        let how = format!("{why}userfaultfd, opened with {}", u.how());
        (Watcher::Uffd(u), Backend::Userfaultfd, how)
    };
    match backend {
        Backend::Userfaultfd => Ok(uffd(uffd::Uffd::open()?, "asked for ")),
        Backend::Hooks => hooks()
            .map(|(w, b, how)| (w, b, format!("asked for hooks: {how}")))
            .map_err(|reason| crate::Unsupported::Hooks { reason }),
        Backend::Auto => match uffd::Uffd::open() {
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
    let mut v = vec![uffd::probe(), hooks::probe()];
    #[cfg(target_arch = "x86_64")]
    v.push(perf::probe());
    v
}
