//! Another monitor imported first (Open MPI imports its memory patcher this way): [`import`]
//! reports `Busy` and changes nothing. Its own process: the other import is irreversible.
use std::ffi::c_void;
use std::ptr;

use ummunotify_fabric::abi::{self, FiOpenFn};
use ummunotify_fabric::{import, imported_monitor, ImportError, Monitor};
use ummunotify_testkit::require::skip_or_fail;

#[test]
fn import_after_another_monitor_reports_busy() {
    // SAFETY: dlopen/dlsym with NUL-terminated names; the handle stays open.
    let open = unsafe {
        let h = libc::dlopen(
            c"libfabric.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        );
        let f = if h.is_null() {
            ptr::null_mut()
        } else {
            libc::dlsym(h, c"fi_open".as_ptr())
        };
        (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, FiOpenFn>(f))
    };
    let Some(open) = open else {
        skip_or_fail(
            "import_busy",
            "libfabric (libfabric.so.1: apt-get install libfabric1)",
        );
        return;
    };
    // The first monitor: a second ummunotify monitor object, imported directly.
    let first = Box::leak(Box::new(Monitor::new()));
    let mut cache: *mut abi::Fid = ptr::null_mut();
    // SAFETY: fi_open's documented arguments; bind is fi_import_fid, close is fi_close.
    let rc = unsafe {
        assert_eq!(
            open(
                abi::IMPORT_MIN_VERSION,
                c"mr_cache".as_ptr(),
                ptr::null_mut(),
                0,
                0,
                &mut cache,
                ptr::null_mut()
            ),
            0
        );
        let ops = &*(*cache).ops;
        let rc = (ops.bind.unwrap())(cache, first.as_raw().cast(), 0);
        (ops.close.unwrap())(cache);
        rc
    };
    assert_eq!(rc, 0, "the first import");
    let err = import().unwrap_err();
    assert!(matches!(err, ImportError::Busy { .. }), "{err:?}");
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains("-FI_EBUSY") && msg.contains("patcher"),
        "{msg}"
    );
    assert!(imported_monitor().is_none(), "nothing recorded as imported");
}
