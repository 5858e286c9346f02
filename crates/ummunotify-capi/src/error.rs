//! Result codes, their names, and the per-thread detailed message of the last failure.
use std::cell::RefCell;
use std::ffi::{c_char, CStr};

use crate::boundary::guard;

/// What a fallible call returned. `UMMUNOTIFY_OK` is 0; errors lie in 4100..4299, above every
/// errno value. `ummunotify_strerror()` names a code; `ummunotify_last_error()` has the details.
///
/// Functions return this type; functions that take a code (only `ummunotify_strerror()`) take a
/// plain `uint32_t`, so an unknown value from C is never an invalid Rust enum.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ummunotify_result {
    /// Success.
    UMMUNOTIFY_OK = 0,
    /// A required pointer argument was NULL.
    UMMUNOTIFY_ERR_NULL_ARGUMENT = 4100,
    /// An argument was out of range (for example a NULL array with a non-zero capacity).
    UMMUNOTIFY_ERR_INVALID_ARGUMENT = 4101,
    /// The range is empty (`start == end`).
    UMMUNOTIFY_ERR_EMPTY_RANGE = 4102,
    /// The range wraps (`end < start`) or rounding it out to pages overflows.
    UMMUNOTIFY_ERR_WRAPPING_RANGE = 4103,
    /// Part of the range is not mapped.
    UMMUNOTIFY_ERR_UNMAPPED = 4104,
    /// The kernel refused to watch this kind of mapping.
    UMMUNOTIFY_ERR_UNSUPPORTED_MAPPING = 4105,
    /// Another userfaultfd context (another notifier) already watches part of the range.
    UMMUNOTIFY_ERR_RANGE_BUSY = 4106,
    /// The kernel ran out of room for watched mappings (`vm.max_map_count`).
    UMMUNOTIFY_ERR_COVERAGE_LIMIT = 4107,
    /// A region with this cookie is already registered.
    UMMUNOTIFY_ERR_DUPLICATE_COOKIE = 4108,
    /// No region with this cookie is registered.
    UMMUNOTIFY_ERR_UNKNOWN_COOKIE = 4109,
    /// This process is a fork of the notifier's creator: create a new notifier in the child.
    UMMUNOTIFY_ERR_FORKED = 4110,
    /// The notifier's monitor thread stopped; every region reads invalid. Create a new one.
    UMMUNOTIFY_ERR_MONITOR_DEAD = 4111,
    /// userfaultfd can not be used here (not built in, refused by seccomp or sysctl, missing
    /// features); `ummunotify_last_error()` says exactly why.
    UMMUNOTIFY_ERR_UNSUPPORTED = 4112,
    /// Another operating-system failure; `ummunotify_last_error()` names the call and errno.
    UMMUNOTIFY_ERR_OS = 4113,
    /// A bug inside the library was caught at the C boundary (nothing unwound into C).
    UMMUNOTIFY_ERR_PANIC = 4114,
    /// The cache's `register_fn` callback failed; `ummunotify_last_error()` has its errno.
    UMMUNOTIFY_ERR_REGISTER = 4200,
    /// The memory kept changing while the cache was registering it.
    UMMUNOTIFY_ERR_UNSTABLE = 4201,
    /// The cache still has handles that were not put: it was not freed.
    UMMUNOTIFY_ERR_CACHE_BUSY = 4202,
    /// libibverbs (`libibverbs.so.1`, rdma-core) could not be loaded, or lacks a verbs call;
    /// `ummunotify_last_error()` has the loader's message.
    UMMUNOTIFY_ERR_VERBS_UNAVAILABLE = 4203,
}

use ummunotify_result::*;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `msg` as the calling thread's last error message.
pub(crate) fn set_last_error(msg: String) {
    // try_with: never panic if called while the thread is being torn down.
    let _ = LAST_ERROR.try_with(|m| *m.borrow_mut() = msg);
}

/// Converts a core error to a code, recording its message.
pub(crate) fn fail(e: core_api::Error) -> ummunotify_result {
    use core_api::Error as E;
    let code = match &e {
        E::EmptyRange => UMMUNOTIFY_ERR_EMPTY_RANGE,
        E::WrappingRange => UMMUNOTIFY_ERR_WRAPPING_RANGE,
        E::Unmapped => UMMUNOTIFY_ERR_UNMAPPED,
        E::UnsupportedMapping(_) => UMMUNOTIFY_ERR_UNSUPPORTED_MAPPING,
        E::RangeBusy => UMMUNOTIFY_ERR_RANGE_BUSY,
        E::CoverageLimit(_) => UMMUNOTIFY_ERR_COVERAGE_LIMIT,
        E::DuplicateCookie(_) => UMMUNOTIFY_ERR_DUPLICATE_COOKIE,
        E::UnknownCookie(_) => UMMUNOTIFY_ERR_UNKNOWN_COOKIE,
        E::Forked => UMMUNOTIFY_ERR_FORKED,
        E::MonitorDead => UMMUNOTIFY_ERR_MONITOR_DEAD,
        E::Unsupported(_) => UMMUNOTIFY_ERR_UNSUPPORTED,
        _ => UMMUNOTIFY_ERR_OS,
    };
    set_last_error(e.to_string());
    code
}

/// Records a failure detected at the C boundary itself (NULL or bad argument).
pub(crate) fn fail_arg(code: ummunotify_result, what: &str) -> ummunotify_result {
    set_last_error(format!("{}: {what}", name(code as u32)));
    code
}

/// The static description of a code.
fn name(code: u32) -> &'static str {
    describe(code).to_str().unwrap_or("?")
}

fn describe(code: u32) -> &'static CStr {
    match code {
        0 => c"success",
        4100 => c"a required pointer argument was NULL",
        4101 => c"invalid argument",
        4102 => c"empty range",
        4103 => c"range wraps around the address space",
        4104 => c"part of the range is not mapped",
        4105 => c"the kernel can not watch this mapping",
        4106 => c"another userfaultfd context already watches part of the range",
        4107 => c"the kernel ran out of room for watched mappings (vm.max_map_count?)",
        4108 => c"cookie already registered",
        4109 => c"cookie not registered",
        4110 => c"this process is a fork of the notifier's creator",
        4111 => {
            c"the monitor stopped (its thread, or the eBPF backend's umn daemon went away); every region is invalid"
        }
        4112 => c"userfaultfd is unavailable here",
        4113 => c"operating-system error",
        4114 => c"internal error (panic caught at the C boundary)",
        4200 => c"the registrar's register callback failed",
        4201 => c"the memory kept changing while it was being registered",
        4202 => c"the cache still has handles that were not put",
        4203 => c"libibverbs (rdma-core) could not be loaded",
        _ => c"unknown ummunotify_result code",
    }
}

/// A static, NUL-terminated description of `result` (any value, known or not). Never NULL; the
/// string lives as long as the library is loaded.
#[no_mangle]
pub extern "C" fn ummunotify_strerror(result: u32) -> *const c_char {
    guard(c"internal error".as_ptr(), || describe(result).as_ptr())
}

/// Copies the detailed message of the calling thread's last failed call (what failed and why,
/// with the errno where there is one) into `buf`, truncated to `len - 1` bytes and NUL-terminated.
/// Returns the message's full length without the NUL (like `snprintf`): call with `buf = NULL,
/// len = 0` to size a buffer. Returns 0 if no call failed yet in this thread.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_last_error(buf: *mut c_char, len: usize) -> usize {
    guard(0, || {
        LAST_ERROR
            .try_with(|m| {
                let m = m.borrow();
                let bytes = m.as_bytes();
                if !buf.is_null() && len > 0 {
                    let n = bytes.len().min(len - 1);
                    // SAFETY: (caller) `buf` has `len` writable bytes and `n + 1 <= len`; the
                    // source is our own string, which can not overlap a caller's buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
                        *buf.add(n) = 0;
                    }
                }
                bytes.len()
            })
            .unwrap_or(0)
    })
}

/// The library version, e.g. `"0.1.0"` (static, NUL-terminated).
#[no_mangle]
pub extern "C" fn ummunotify_version() -> *const c_char {
    const V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}
