//! The import into this machine's libfabric (Debian 12: 1.17), from Rust, and the delivery path
//! into libfabric's own `notify` (which takes its `mm_list_rwlock` and `mm_lock`).
//!
//! One process, one import: these steps are one test, in order.
use std::ffi::c_void;
use std::ptr;
use std::time::{Duration, Instant};

use ummunotify_fabric::abi::{self, FiOpenFn};
use ummunotify_fabric::{import, imported_monitor, imported_stats, Imported, Monitor};
use ummunotify_testkit::require::skip_or_fail;

/// `fi_getinfo(version, node, service, flags, hints, info)`.
type FiGetinfoFn = unsafe extern "C" fn(
    u32,
    *const libc::c_char,
    *const libc::c_char,
    u64,
    *const c_void,
    *mut *mut c_void,
) -> i32;
/// `fi_freeinfo(info)`.
type FiFreeinfoFn = unsafe extern "C" fn(*mut c_void);

/// libfabric's `fi_open`, `fi_getinfo` and `fi_freeinfo`, if libfabric is installed.
fn libfabric() -> Option<(FiOpenFn, FiGetinfoFn, FiFreeinfoFn)> {
    // SAFETY: dlopen/dlsym with NUL-terminated names; the handle stays open; the types are the
    // functions' documented signatures.
    unsafe {
        let h = libc::dlopen(
            c"libfabric.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        );
        if h.is_null() {
            return None;
        }
        let open = libc::dlsym(h, c"fi_open".as_ptr());
        let getinfo = libc::dlsym(h, c"fi_getinfo".as_ptr());
        let freeinfo = libc::dlsym(h, c"fi_freeinfo".as_ptr());
        if open.is_null() || getinfo.is_null() || freeinfo.is_null() {
            return None;
        }
        Some((
            std::mem::transmute::<*mut c_void, FiOpenFn>(open),
            std::mem::transmute::<*mut c_void, FiGetinfoFn>(getinfo),
            std::mem::transmute::<*mut c_void, FiFreeinfoFn>(freeinfo),
        ))
    }
}

/// Imports `raw` the documented way (`fi_open("mr_cache")`, `fi_import_fid`); libfabric's code.
fn import_raw(open: FiOpenFn, raw: *mut abi::FidMemMonitor) -> i32 {
    let mut cache: *mut abi::Fid = ptr::null_mut();
    // SAFETY: fi_open's documented arguments.
    let rc = unsafe {
        open(
            abi::IMPORT_MIN_VERSION,
            c"mr_cache".as_ptr(),
            ptr::null_mut(),
            0,
            0,
            &mut cache,
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "fi_open(mr_cache)");
    // SAFETY: the cache fid's ops: bind is fi_import_fid, close is fi_close.
    unsafe {
        let ops = &*(*cache).ops;
        let rc = (ops.bind.unwrap())(cache, raw.cast(), 0);
        (ops.close.unwrap())(cache);
        rc
    }
}

#[test]
fn import_into_this_libfabric_and_deliver_into_its_notify() {
    let Some((open, getinfo, freeinfo)) = libfabric() else {
        skip_or_fail(
            "import",
            "libfabric (libfabric.so.1: apt-get install libfabric1)",
        );
        return;
    };
    let version = match import() {
        Ok(Imported::Now { version }) => version,
        other => panic!("import: {other:?}"),
    };
    eprintln!(
        "imported into libfabric {}",
        ummunotify_fabric::version_string(version)
    );
    assert!(version >= abi::IMPORT_MIN_VERSION);
    assert_eq!(import(), Ok(Imported::Already { version }));

    let raw = imported_monitor().expect("imported");
    // SAFETY: libfabric filled these in on import.
    unsafe {
        assert!(!(*raw).import_ops.is_null(), "libfabric set import_ops");
        assert!((*(*raw).import_ops).notify.is_some(), "with its notify");
        assert!(!(*raw).fid.ops.is_null(), "and its fid ops");
    }
    // A second monitor is refused: libfabric holds ours.
    let other = Monitor::new();
    assert_eq!(import_raw(open, other.as_raw()), -abi::FI_EBUSY);

    // The program goes on as usual: fi_getinfo initializes libfabric (its monitor lists among
    // others; libfabric starts a monitor only after that, when a domain creates an MR cache).
    let mut info: *mut c_void = ptr::null_mut();
    // SAFETY: fi_getinfo without hints; the list is freed with fi_freeinfo.
    let rc = unsafe {
        getinfo(
            abi::IMPORT_MIN_VERSION,
            ptr::null(),
            ptr::null(),
            0,
            ptr::null(),
            &mut info,
        )
    };
    eprintln!("fi_getinfo after the import: {rc}");
    assert!(rc == 0 || rc == -61, "fi_getinfo: {rc}"); // 0 or -FI_ENODATA
    if !info.is_null() {
        // SAFETY: the list fi_getinfo returned.
        unsafe { freeinfo(info) };
    }
    assert_eq!(
        import_raw(open, other.as_raw()),
        -abi::FI_EBUSY,
        "still ours after init"
    );

    // What libfabric does when its first MR cache appears, and on registration.
    // SAFETY: the imported monitor's own ops, with its pointer.
    let ops = unsafe { &*(*raw).export_ops };
    // SAFETY: as above.
    assert_eq!(unsafe { (ops.start.unwrap())(raw) }, 0);
    let len = 4 * 4096;
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: subscribe/valid with the imported monitor, on mapped memory.
    unsafe {
        assert_eq!((ops.subscribe.unwrap())(raw, p, len), 0);
        assert!((ops.valid.unwrap())(raw, p, len));
        assert_eq!(libc::munmap(p, len), 0);
        assert!(
            !(ops.valid.unwrap())(raw, p, len),
            "valid() after munmap returned"
        );
    }
    // The delivery thread calls libfabric's notify (no MR cache listens: it takes libfabric's
    // locks, walks an empty cache list and returns).
    let deadline = Instant::now() + Duration::from_secs(30);
    while imported_stats().unwrap().notifies == 0 {
        assert!(
            Instant::now() < deadline,
            "no notify into libfabric within 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = imported_stats().unwrap();
    assert_eq!(s.notifies, 1, "{s:?}");
    assert_eq!(s.subscriptions, 0, "{s:?}");
    // SAFETY: as libfabric's last MR cache closing.
    unsafe { (ops.stop.unwrap())(raw) };
    assert!(!imported_stats().unwrap().started);
}
