//! Finding libfabric at run time and importing the monitor into it.
//!
//! libfabric is opened with `dlopen` (by its soname, `libfabric.so.1`, or the path in
//! `UMMUNOTIFY_FABRIC_LIBRARY`): a program already linked with libfabric gets the copy it runs on
//! (the loader matches the soname), a program without it gets a clear "absent" instead of a
//! loader failure, and nothing in this crate links libfabric at build time.
use std::ffi::{c_int, CStr, CString};
use std::fmt;
use std::ptr;
use std::sync::Mutex;

use crate::abi::{self, FiOpenFn, FiStrerrorFn, FiVersionFn};
use crate::monitor::{Monitor, MonitorObject};

/// Environment variable: the libfabric shared object to use instead of `libfabric.so.1`.
pub const LIBRARY_ENV: &str = "UMMUNOTIFY_FABRIC_LIBRARY";

/// What [`import`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Imported {
    /// The monitor is now libfabric's default monitor for host memory.
    Now {
        /// `fi_version()` of the libfabric it went into (`FI_VERSION(major, minor)`).
        version: u32,
    },
    /// An earlier call of this process already imported it (nothing changed).
    Already {
        /// `fi_version()` of that libfabric.
        version: u32,
    },
}

/// Why [`import`] could not make ummunotify libfabric's monitor. Nothing was changed in libfabric.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportError {
    /// No libfabric could be loaded (the `dlopen` message says what was tried).
    Absent(String),
    /// libfabric is older than 1.13 (no import monitor).
    TooOld {
        /// Its `fi_version()`.
        version: u32,
    },
    /// libfabric refused with `-FI_EBUSY`: another monitor was imported first (Open MPI imports
    /// its memory patcher unless disabled), or an MR cache already runs on the built-in monitor
    /// (the import came after the first domain was opened).
    Busy {
        /// Its `fi_version()`.
        version: u32,
    },
    /// `FI_MR_CACHE_MONITOR` is set: libfabric applies it when it initializes (at the first
    /// `fi_getinfo`), over an imported monitor, so the import would be silently undone.
    Overridden {
        /// The variable's value.
        value: String,
    },
    /// Any other refusal: the libfabric call and its error.
    Failed {
        /// What was called.
        call: &'static str,
        /// The negative `FI_E*` value it returned.
        code: c_int,
        /// `fi_strerror(-code)`.
        message: String,
    },
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::Absent(why) => write!(
                f,
                "libfabric is absent ({why}); install it (Debian: libfabric1) or set \
                 {LIBRARY_ENV}=/path/to/libfabric.so.1"
            ),
            ImportError::TooOld { version } => write!(
                f,
                "libfabric {} is too old: the import monitor needs 1.13 or newer",
                version_string(*version)
            ),
            ImportError::Busy { version } => write!(
                f,
                "libfabric {} refused the monitor (-FI_EBUSY): another memory monitor was \
                 imported first (Open MPI imports its memory patcher: run with --mca memory \
                 ^patcher, see docs/MPI.md), or an MR cache is already active (import before \
                 the first fi_getinfo/fi_domain)",
                version_string(*version)
            ),
            ImportError::Overridden { value } => write!(
                f,
                "FI_MR_CACHE_MONITOR={value} is set: libfabric would replace an imported \
                 monitor with it at initialization; unset it to use ummunotify"
            ),
            ImportError::Failed {
                call,
                code,
                message,
            } => write!(f, "{call} failed: {code} ({message})"),
        }
    }
}

impl std::error::Error for ImportError {}

/// `major.minor` of an `FI_VERSION` value.
pub fn version_string(v: u32) -> String {
    format!("{}.{}", v >> 16, v & 0xffff)
}

/// The imported monitor and the libfabric it went into (one per process).
struct Global {
    monitor: &'static MonitorObject,
    version: u32,
}

// SAFETY: the monitor object is Sync + Send.
unsafe impl Send for Global {}

static GLOBAL: Mutex<Option<Global>> = Mutex::new(None);

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by the loader.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlsym` of `name` in `handle`, as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the function's real type.
unsafe fn sym<F: Copy>(handle: *mut libc::c_void, name: &CStr) -> Option<F> {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    // SAFETY: the caller guarantees the type; a function pointer has a pointer's size.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut libc::c_void, F>(&p) })
}

/// Makes ummunotify the memory monitor of this process's libfabric (its MR caches for host
/// memory then ask ummunotify whether a cached registration is still valid).
///
/// Call it before the first `fi_getinfo` (strictly: before the first domain with an MR cache is
/// opened). Idempotent. The notifier starts only when libfabric creates its first MR cache, so a
/// process that never registers memory pays nothing.
///
/// ```no_run
/// match ummunotify_fabric::import() {
///     Ok(done) => eprintln!("ummunotify is libfabric's memory monitor: {done:?}"),
///     Err(e) => eprintln!("libfabric keeps its own monitor: {e}"),
/// }
/// ```
///
/// # Errors
/// [`ImportError`]: libfabric absent, too old, busy (another monitor first), overridden by
/// The environment variable `name`, unless the process runs in secure-execution mode
/// (`AT_SECURE`: setuid, setgid, file capabilities), where none is read, as with glibc's
/// `secure_getenv`: a user can not make a privileged program load another library
/// ([`LIBRARY_ENV`]) or change its monitor (docs/SECURITY.md).
pub(crate) fn env_var(name: &str) -> Option<String> {
    // SAFETY: getauxval has no preconditions.
    if unsafe { libc::getauxval(libc::AT_SECURE) } != 0 {
        return None;
    }
    std::env::var(name).ok()
}

/// `FI_MR_CACHE_MONITOR`, or another refusal.
pub fn import() -> Result<Imported, ImportError> {
    let mut global = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = &*global {
        return Ok(Imported::Already { version: g.version });
    }
    if let Some(value) = env_var("FI_MR_CACHE_MONITOR") {
        return Err(ImportError::Overridden { value });
    }
    let path = env_var(LIBRARY_ENV).unwrap_or_else(|| "libfabric.so.1".into());
    let cpath = CString::new(path.clone()).map_err(|_| ImportError::Absent(path.clone()))?;
    // SAFETY: a NUL-terminated name. The handle is never closed: libfabric keeps our monitor.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(ImportError::Absent(dlerror()));
    }
    // SAFETY: the documented signatures of libfabric's exported functions.
    let (fi_version, fi_open, fi_strerror) = unsafe {
        (
            sym::<FiVersionFn>(handle, c"fi_version"),
            sym::<FiOpenFn>(handle, c"fi_open"),
            sym::<FiStrerrorFn>(handle, c"fi_strerror"),
        )
    };
    let Some(fi_version) = fi_version else {
        return Err(ImportError::Absent(format!("{path} has no fi_version")));
    };
    // SAFETY: no arguments, returns a value.
    let version = unsafe { fi_version() };
    let (Some(fi_open), true) = (fi_open, version >= abi::IMPORT_MIN_VERSION) else {
        return Err(ImportError::TooOld { version });
    };
    let strerror = |code: c_int| match fi_strerror {
        // SAFETY: fi_strerror returns a static string for any value.
        Some(f) => unsafe { CStr::from_ptr(f(-code)) }
            .to_string_lossy()
            .into_owned(),
        None => format!("error {code}"),
    };
    let mut cache: *mut abi::Fid = ptr::null_mut();
    // SAFETY: fi_open's documented arguments; `cache` receives a fid on success.
    let rc = unsafe {
        fi_open(
            abi::IMPORT_MIN_VERSION,
            c"mr_cache".as_ptr(),
            ptr::null_mut(),
            0,
            0,
            &mut cache,
            ptr::null_mut(),
        )
    };
    if rc == -abi::FI_ENOSYS {
        return Err(ImportError::TooOld { version });
    }
    if rc != 0 || cache.is_null() {
        return Err(ImportError::Failed {
            call: "fi_open(\"mr_cache\")",
            code: rc,
            message: strerror(rc),
        });
    }
    let monitor = Monitor::new();
    // SAFETY: `cache` is the fid fi_open returned, with its ops table; `fi_import_fid` is
    // `ops->bind(cache, &monitor->fid, 0)`, and `fi_close` is `ops->close(cache)`.
    let rc = unsafe {
        let ops = &*(*cache).ops;
        let rc = match ops.bind {
            Some(bind) => bind(cache, monitor.as_raw().cast(), 0),
            None => -abi::FI_ENOSYS,
        };
        if let Some(close) = ops.close {
            close(cache);
        }
        rc
    };
    match rc {
        0 => {
            let monitor = monitor.leak();
            *global = Some(Global { monitor, version });
            Ok(Imported::Now { version })
        }
        rc if rc == -abi::FI_EBUSY => Err(ImportError::Busy { version }),
        rc => Err(ImportError::Failed {
            call: "fi_import_fid",
            code: rc,
            message: strerror(rc),
        }),
    }
}

/// Counters of the imported monitor, if [`import`] succeeded in this process.
pub fn imported_stats() -> Option<crate::Stats> {
    let global = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    global
        .as_ref()
        .map(|g| crate::monitor::object_stats(g.monitor))
}

/// The backend of the imported monitor's notifier, once libfabric started the monitor (its
/// first MR cache) in this process.
pub fn imported_backend() -> Option<ummunotify::Backend> {
    let global = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    global
        .as_ref()
        .and_then(|g| crate::monitor::object_backend(g.monitor))
}

/// The imported monitor's `struct fid_mem_monitor *`, if [`import`] succeeded in this process
/// (libfabric holds the same pointer; its `import_ops` is libfabric's).
pub fn imported_monitor() -> Option<*mut abi::FidMemMonitor> {
    let global = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    global.as_ref().map(|g| g.monitor.raw())
}
