//! The C entry points (`include/ummunotify-fabric.h`) and the `LD_PRELOAD` constructor.
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::catch_unwind;
use std::sync::Mutex;

use crate::import::{import, ImportError, Imported};

/// `UMMUNOTIFY_FABRIC_OK`: imported now, or already by an earlier call.
pub const OK: c_int = 0;
/// `UMMUNOTIFY_FABRIC_ABSENT`: no libfabric could be loaded.
pub const ABSENT: c_int = 1;
/// `UMMUNOTIFY_FABRIC_TOO_OLD`: libfabric older than 1.13.
pub const TOO_OLD: c_int = 2;
/// `UMMUNOTIFY_FABRIC_BUSY`: libfabric said -FI_EBUSY (another monitor first, or a cache active).
pub const BUSY: c_int = 3;
/// `UMMUNOTIFY_FABRIC_FAILED`: any other refusal.
pub const FAILED: c_int = 4;
/// `UMMUNOTIFY_FABRIC_OVERRIDDEN`: `FI_MR_CACHE_MONITOR` is set (libfabric would undo the import).
pub const OVERRIDDEN: c_int = 5;

/// The message of the last `ummunotify_fabric_import` (kept for `ummunotify_fabric_message`).
static MESSAGE: Mutex<Option<CString>> = Mutex::new(None);

fn outcome() -> (c_int, String) {
    match catch_unwind(import) {
        Ok(Ok(Imported::Now { version })) => (
            OK,
            format!(
                "ummunotify is libfabric {}'s memory monitor",
                crate::version_string(version)
            ),
        ),
        Ok(Ok(Imported::Already { version })) => (
            OK,
            format!(
                "ummunotify was already libfabric {}'s memory monitor",
                crate::version_string(version)
            ),
        ),
        Ok(Err(e)) => (
            match e {
                ImportError::Absent(_) => ABSENT,
                ImportError::TooOld { .. } => TOO_OLD,
                ImportError::Busy { .. } => BUSY,
                ImportError::Overridden { .. } => OVERRIDDEN,
                _ => FAILED,
            },
            e.to_string(),
        ),
        Err(_) => (FAILED, "internal error (panic) during import".into()),
    }
}

/// Makes ummunotify libfabric's memory monitor; see `include/ummunotify-fabric.h`.
#[no_mangle]
pub extern "C" fn ummunotify_fabric_import() -> c_int {
    let (code, msg) = outcome();
    let msg = CString::new(msg).unwrap_or_default();
    *MESSAGE.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
    code
}

/// What the last `ummunotify_fabric_import` did or why it failed (NUL-terminated, valid until
/// the next import call); an empty string before the first.
#[no_mangle]
pub extern "C" fn ummunotify_fabric_message() -> *const c_char {
    let m = MESSAGE.lock().unwrap_or_else(|p| p.into_inner());
    match &*m {
        // The CString lives in the static until the next import replaces it.
        Some(s) => s.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// The imported monitor's state in one line (`imported=1 started=1 backend=uffd subscriptions=2
/// subscribes=9 subscribe_failures=0 notifies=7 evictions=0`, or `imported=0`), copied into
/// `buf` like `snprintf`; returns the line's full length.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_fabric_report(buf: *mut c_char, len: usize) -> usize {
    let line = catch_unwind(|| {
        let Some(s) = crate::imported_stats() else {
            return "imported=0".to_owned();
        };
        let backend = crate::imported_backend().map_or("-", |b| b.name());
        format!(
            "imported=1 started={} backend={backend} subscriptions={} subscribes={} \
             subscribe_failures={} notifies={} evictions={}",
            u8::from(s.started),
            s.subscriptions,
            s.subscribes,
            s.subscribe_failures,
            s.notifies,
            s.evictions
        )
    })
    .unwrap_or_else(|_| "internal error".to_owned());
    if !buf.is_null() && len > 0 {
        let n = line.len().min(len - 1);
        // SAFETY: (caller) `len` writable bytes at `buf`; `n + 1 <= len`; our own string can not
        // overlap the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(line.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    line.len()
}

/// A fixed description of a `UMMUNOTIFY_FABRIC_*` code.
#[no_mangle]
pub extern "C" fn ummunotify_fabric_strerror(code: c_int) -> *const c_char {
    match code {
        OK => c"ok: ummunotify is libfabric's memory monitor",
        ABSENT => c"libfabric is absent",
        TOO_OLD => c"libfabric is too old (the import monitor needs 1.13)",
        BUSY => c"libfabric already has an imported or active memory monitor (-FI_EBUSY)",
        FAILED => c"libfabric refused the monitor",
        OVERRIDDEN => c"FI_MR_CACHE_MONITOR is set: libfabric would replace the imported monitor",
        _ => c"unknown ummunotify_fabric code",
    }
    .as_ptr()
}

/// Environment variable: `0` stops the preload constructor from importing.
const PRELOAD_ENV: &str = "UMMUNOTIFY_FABRIC";
/// Environment variable: `1` makes the preload report success too (failures are always reported).
const VERBOSE_ENV: &str = "UMMUNOTIFY_FABRIC_VERBOSE";

/// Whether this object is a shared library named in `LD_PRELOAD` (and not, for example, the rlib
/// linked into a test binary, or a library the program links normally).
fn preloaded() -> bool {
    let Ok(preload) = std::env::var("LD_PRELOAD") else {
        return false;
    };
    let mut info = empty_dl_info();
    // SAFETY: dladdr with the address of a function of this object and a live out-parameter.
    let found = unsafe { libc::dladdr(preload_ctor as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: non-null, NUL-terminated, owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let Some(base) = path.rsplit('/').next() else {
        return false;
    };
    base.ends_with(".so")
        && preload
            .split([' ', ':'])
            .any(|p| !p.is_empty() && p.rsplit('/').next() == Some(base))
}

fn empty_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

extern "C" fn preload_ctor() {
    let _ = catch_unwind(|| {
        if !preloaded() || crate::import::env_var(PRELOAD_ENV).is_some_and(|v| v == "0") {
            return;
        }
        let code = ummunotify_fabric_import();
        // SAFETY: a NUL-terminated string owned by MESSAGE until the next import.
        let msg = unsafe { CStr::from_ptr(ummunotify_fabric_message()) }.to_string_lossy();
        if code != OK {
            eprintln!("ummunotify-fabric (LD_PRELOAD): not libfabric's monitor: {msg}");
        } else if crate::import::env_var(VERBOSE_ENV).is_some_and(|v| v == "1") {
            eprintln!("ummunotify-fabric (LD_PRELOAD): {msg}");
        }
    });
}

/// Runs `preload_ctor` when the shared object is loaded (it returns at once unless this object
/// was preloaded).
#[used]
#[link_section = ".init_array"]
static PRELOAD_CTOR: extern "C" fn() = preload_ctor;
