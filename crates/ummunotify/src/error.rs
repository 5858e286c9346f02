//! The error type of the public API.
use std::fmt;
use std::io;

use crate::Cookie;

/// Why a backend could not start, in terms a user can act on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unsupported {
    /// The kernel has no `userfaultfd` syscall (`CONFIG_USERFAULTFD=n`, `ENOSYS`).
    NoUserfaultfd,
    /// `userfaultfd` was refused with `EPERM`: a seccomp filter (containers block it by default),
    /// or an unprivileged process with `vm.unprivileged_userfaultfd = 0` on a kernel without
    /// `UFFD_USER_MODE_ONLY`, and no access to `/dev/userfaultfd`.
    PermissionDenied {
        /// What was tried, in order, and what each attempt returned.
        attempts: String,
    },
    /// The kernel lacks event features this crate needs.
    MissingFeatures {
        /// Names of the missing `UFFD_FEATURE_*` bits.
        missing: Vec<&'static str>,
    },
    /// Any other failure of the handshake.
    Other(io::Error),
    /// The hooks backend can not patch libc here (not x86-64, no dynamic glibc, an unknown
    /// glibc build, another library's patch in the way, `mprotect` of libc's text refused).
    Hooks {
        /// What was found, in words.
        reason: String,
    },
    /// `UMN_BACKEND` names no backend.
    UnknownBackend {
        /// The value found.
        value: String,
    },
    /// The eBPF backend can not start: no `umn daemon` to ask, and this process may not load
    /// BPF programs (or the kernel lacks what they need).
    Ebpf {
        /// What was tried and what each attempt returned.
        reason: String,
    },
    /// The kernel backend: `/dev/ummunotify` (this project's module, `kernel/module/`) is not
    /// there or is not usable.
    NoKernelModule {
        /// What was tried and what it returned.
        reason: String,
    },
    /// The perf tracepoint backend can not run: what is missing (tracefs, a tracepoint, the
    /// privilege for raw tracepoint samples, a CPU's ring), or, from a notifier it killed,
    /// which tracepoints stopped recording after it started (a BPF program attached to them
    /// that returns 0 suppresses their perf samples system-wide).
    Perf {
        /// What is missing, in words a user can act on.
        missing: String,
    },
    /// `Backend::Auto`: neither backend can start.
    NoBackend {
        /// Why userfaultfd can not.
        userfaultfd: Box<Unsupported>,
        /// Why the hooks can not.
        hooks: String,
    },
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::NoUserfaultfd => write!(
                f,
                "the kernel has no userfaultfd (ENOSYS): it was built without CONFIG_USERFAULTFD"
            ),
            Unsupported::PermissionDenied { attempts } => write!(
                f,
                "userfaultfd is not permitted here ({attempts}); a seccomp profile may block it \
                 (docker/podman: --security-opt seccomp=... allowing userfaultfd), or set \
                 vm.unprivileged_userfaultfd=1, or grant access to /dev/userfaultfd"
            ),
            Unsupported::MissingFeatures { missing } => write!(
                f,
                "the kernel's userfaultfd lacks required features: {}",
                missing.join(", ")
            ),
            Unsupported::Other(e) => write!(f, "userfaultfd handshake failed: {e}"),
            Unsupported::Hooks { reason } => {
                write!(f, "the hooks backend can not patch libc: {reason}")
            }
            Unsupported::Ebpf { reason } => write!(f, "the eBPF backend can not start: {reason}"),
            Unsupported::NoKernelModule { reason } => {
                write!(f, "the ummunotify kernel module is not usable: {reason}")
            }
            Unsupported::UnknownBackend { value } => write!(
                f,
                "UMN_BACKEND={value:?} names no backend (expected auto, uffd, hooks, hybrid, ebpf, kernel, perf or tracepoint)"
            ),
            Unsupported::Perf { missing } => {
                write!(f, "the perf tracepoint backend can not run: {missing}")
            }
            Unsupported::NoBackend { userfaultfd, hooks } => write!(
                f,
                "no backend can start: {userfaultfd}; and the hooks backend can not patch \
                 libc: {hooks}"
            ),
        }
    }
}

/// Errors of the public API.
///
/// Every fallible call leaves the notifier exactly as it was when it returns an error.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The range is empty (`start == end`).
    EmptyRange,
    /// The range wraps (`end < start`), or rounding it out to pages overflows.
    WrappingRange,
    /// Part of the range is not mapped (from [`Notifier::register`](crate::Notifier::register);
    /// [`Notifier::register_any`](crate::Notifier::register_any) accepts holes).
    Unmapped,
    /// The kernel refused to watch this kind of mapping (for example `[vdso]`, or a file mapping
    /// on a kernel without `UFFD_FEATURE_WP_ASYNC`).
    UnsupportedMapping(io::Error),
    /// Another userfaultfd context already watches part of the range (`EBUSY`).
    RangeBusy,
    /// The kernel ran out of room for watched mappings (`ENOMEM`: usually `vm.max_map_count`).
    CoverageLimit(io::Error),
    /// A region with this cookie is already registered.
    DuplicateCookie(Cookie),
    /// No region with this cookie is registered.
    UnknownCookie(Cookie),
    /// This process is a fork of the one that created the notifier; create a new one.
    Forked,
    /// The monitor thread could not continue, or the eBPF backend lost its `umn daemon`
    /// (stopped, restarted or killed); every region reads invalid. Create a new notifier.
    MonitorDead,
    /// The backend can not start on this system.
    Unsupported(Unsupported),
    /// Any other operating-system failure, with the operation that failed.
    Os {
        /// The failed operation.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EmptyRange => f.write_str("empty range"),
            Error::WrappingRange => f.write_str("range wraps around the address space"),
            Error::Unmapped => f.write_str("part of the range is not mapped"),
            Error::UnsupportedMapping(e) => {
                write!(f, "the kernel can not watch this mapping: {e}")
            }
            Error::RangeBusy => {
                f.write_str("another userfaultfd context already watches part of the range")
            }
            Error::CoverageLimit(e) => write!(
                f,
                "the kernel ran out of room for watched mappings (vm.max_map_count?): {e}"
            ),
            Error::DuplicateCookie(c) => write!(f, "cookie {c} is already registered"),
            Error::UnknownCookie(c) => write!(f, "cookie {c} is not registered"),
            Error::Forked => f.write_str(
                "this process is a fork of the notifier's creator; registrations do not survive fork",
            ),
            Error::MonitorDead => f.write_str(
                "the monitor stopped (its thread, or the eBPF backend's umn daemon went away); \
                 every region is invalid",
            ),
            Error::Unsupported(u) => write!(f, "backend unavailable: {u}"),
            Error::Os { op, source } => write!(f, "{op} failed: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::UnsupportedMapping(e)
            | Error::CoverageLimit(e)
            | Error::Os { source: e, .. } => Some(e),
            Error::Unsupported(Unsupported::Other(e)) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::EmptyRange
            | Error::WrappingRange
            | Error::DuplicateCookie(_)
            | Error::UnknownCookie(_) => io::ErrorKind::InvalidInput,
            Error::Unmapped => io::ErrorKind::InvalidInput,
            Error::Unsupported(_) => io::ErrorKind::Unsupported,
            Error::RangeBusy => io::ErrorKind::ResourceBusy,
            Error::CoverageLimit(_) => io::ErrorKind::OutOfMemory,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
