//! Hand-written mirrors of the few libfabric types the import monitor touches
//! (`rdma/fabric.h`, `rdma/fi_ext.h`, `rdma/fi_errno.h`).
//!
//! These layouts have been stable since the import monitor appeared (1.13) and are the same in
//! 2.x. `tests/layout.rs` compiles a C program against the installed headers and compares every
//! size, offset and constant below with what the C compiler says, so a drift fails a test instead
//! of corrupting memory.
use std::ffi::{c_char, c_int, c_void};

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The first libfabric version with the import monitor (`fi_open("mr_cache")`).
pub const IMPORT_MIN_VERSION: u32 = fi_version(1, 13);

/// `FI_CLASS_MEM_MONITOR` (enum position in `rdma/fabric.h`).
pub const FI_CLASS_MEM_MONITOR: usize = 23;
/// `FI_CLASS_MR_CACHE`.
pub const FI_CLASS_MR_CACHE: usize = 22;

/// `FI_SUCCESS`.
pub const FI_SUCCESS: c_int = 0;
/// `FI_EBUSY` (libfabric's errno values are the kernel's).
pub const FI_EBUSY: c_int = libc::EBUSY;
/// `FI_EINVAL`.
pub const FI_EINVAL: c_int = libc::EINVAL;
/// `FI_ENOMEM`.
pub const FI_ENOMEM: c_int = libc::ENOMEM;
/// `FI_ENOSYS`.
pub const FI_ENOSYS: c_int = libc::ENOSYS;
/// `FI_EFAULT`.
pub const FI_EFAULT: c_int = libc::EFAULT;
/// `FI_EAGAIN`.
pub const FI_EAGAIN: c_int = libc::EAGAIN;

/// `struct fi_ops`.
#[repr(C)]
#[derive(Debug)]
pub struct FiOps {
    /// `sizeof(struct fi_ops)`.
    pub size: usize,
    /// `close(fid)`.
    pub close: Option<unsafe extern "C" fn(*mut Fid) -> c_int>,
    /// `bind(fid, bfid, flags)`: what `fi_import_fid` calls.
    pub bind: Option<unsafe extern "C" fn(*mut Fid, *mut Fid, u64) -> c_int>,
    /// `control(fid, command, arg)`.
    pub control: Option<unsafe extern "C" fn(*mut Fid, c_int, *mut c_void) -> c_int>,
    /// `ops_open(fid, name, flags, ops, context)`.
    pub ops_open: Option<
        unsafe extern "C" fn(*mut Fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int,
    >,
    /// `tostr(fid, buf, len)`.
    pub tostr: Option<unsafe extern "C" fn(*const Fid, *mut c_char, usize) -> c_int>,
    /// `ops_set(fid, name, flags, ops, context)`.
    pub ops_set: Option<
        unsafe extern "C" fn(*mut Fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int,
    >,
}

/// `struct fid`: the header of every libfabric object.
#[repr(C)]
#[derive(Debug)]
pub struct Fid {
    /// `FI_CLASS_*`.
    pub fclass: usize,
    /// Owner's context (libfabric sets it to its import record on import).
    pub context: *mut c_void,
    /// Operations (libfabric installs its own on import).
    pub ops: *mut FiOps,
}

/// `struct fi_ops_mem_monitor`: what the monitor exports to libfabric.
#[repr(C)]
#[derive(Debug)]
pub struct FiOpsMemMonitor {
    /// `sizeof(struct fi_ops_mem_monitor)`; libfabric refuses smaller tables (`-FI_EINVAL`).
    pub size: usize,
    /// `start(monitor)`: the first MR cache using the monitor was created.
    pub start: Option<unsafe extern "C" fn(*mut FidMemMonitor) -> c_int>,
    /// `stop(monitor)`: the last MR cache using it went away.
    pub stop: Option<unsafe extern "C" fn(*mut FidMemMonitor)>,
    /// `subscribe(monitor, addr, len)`: called with libfabric's `mm_lock` held.
    pub subscribe: Option<unsafe extern "C" fn(*mut FidMemMonitor, *const c_void, usize) -> c_int>,
    /// `unsubscribe(monitor, addr, len)`: with `mm_lock` held (libfabric >= 2.1 only).
    pub unsubscribe: Option<unsafe extern "C" fn(*mut FidMemMonitor, *const c_void, usize)>,
    /// `valid(monitor, addr, len)`: on every cache hit, with `mm_lock` held.
    pub valid: Option<unsafe extern "C" fn(*mut FidMemMonitor, *const c_void, usize) -> bool>,
}

/// `struct fi_ops_mem_notify`: what libfabric gives the monitor on import.
#[repr(C)]
#[derive(Debug)]
pub struct FiOpsMemNotify {
    /// `sizeof(struct fi_ops_mem_notify)`.
    pub size: usize,
    /// `notify(monitor, addr, len)`: takes `mm_list_rwlock` (read) and `mm_lock`, then drops
    /// every cache entry overlapping the range.
    pub notify: Option<unsafe extern "C" fn(*mut FidMemMonitor, *const c_void, usize)>,
}

/// `struct fid_mem_monitor`.
#[repr(C)]
#[derive(Debug)]
pub struct FidMemMonitor {
    /// The object header (`fclass = FI_CLASS_MEM_MONITOR`).
    pub fid: Fid,
    /// The monitor's operations.
    pub export_ops: *mut FiOpsMemMonitor,
    /// libfabric's callback table, set by libfabric on import.
    pub import_ops: *mut FiOpsMemNotify,
}

/// `fi_version()`.
pub type FiVersionFn = unsafe extern "C" fn() -> u32;
/// `fi_open(version, name, attr, attr_len, flags, fid, context)`.
pub type FiOpenFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *mut c_void,
    usize,
    u64,
    *mut *mut Fid,
    *mut c_void,
) -> c_int;
/// `fi_strerror(errnum)`.
pub type FiStrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
