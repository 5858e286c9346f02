//! The 2010 `/dev/ummunotify` ABI, byte for byte (see `shared/PRIOR-ART.md`).
use std::ffi::c_ulong;

/// `struct ummunotify_register_ioctl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RegisterIoctl {
    pub start: u64,
    pub end: u64,
    pub user_cookie: u64,
    pub flags: u32,
    pub reserved: u32,
}

/// `struct ummunotify_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Event2010 {
    pub kind: u32,
    pub flags: u32,
    pub hint_start: u64,
    pub hint_end: u64,
    pub user_cookie_counter: u64,
}

const _: () = assert!(std::mem::size_of::<RegisterIoctl>() == 32);
const _: () = assert!(std::mem::size_of::<Event2010>() == 32);
const _: () = assert!(std::mem::offset_of!(Event2010, user_cookie_counter) == 24);

/// `_IOC(dir, 'U', nr, size)` as the kernel's asm-generic ioctl.h encodes it.
const fn ioc(dir: c_ulong, nr: c_ulong, size: c_ulong) -> c_ulong {
    (dir << 30) | (size << 16) | ((b'U' as c_ulong) << 8) | nr
}
const IOC_WRITE: c_ulong = 1;
const IOC_READ: c_ulong = 2;

/// `_IOWR('U', 1, __u32)`.
pub(crate) const EXCHANGE_FEATURES: c_ulong = ioc(IOC_READ | IOC_WRITE, 1, 4);
/// `_IOW('U', 2, struct ummunotify_register_ioctl)`.
pub(crate) const REGISTER_REGION: c_ulong = ioc(IOC_WRITE, 2, 32);
/// `_IOW('U', 3, __u64)`.
pub(crate) const UNREGISTER_REGION: c_ulong = ioc(IOC_WRITE, 3, 8);

const _: () = assert!(EXCHANGE_FEATURES == 0xC004_5501);
const _: () = assert!(REGISTER_REGION == 0x4020_5502);
const _: () = assert!(UNREGISTER_REGION == 0x4008_5503);

/// `UMMUNOTIFY_EVENT_TYPE_INVAL`.
pub(crate) const EVENT_TYPE_INVAL: u32 = 0;
/// `UMMUNOTIFY_EVENT_TYPE_LAST`.
pub(crate) const EVENT_TYPE_LAST: u32 = 1;
/// `UMMUNOTIFY_EVENT_FLAG_HINT`.
pub(crate) const EVENT_FLAG_HINT: u32 = 1;

/// The device path a 2010 program opens.
pub(crate) const DEVICE_PATH: &[u8] = b"/dev/ummunotify";

/// What a forked child's counter views read: bit 63 set, so it never equals a LAST counter
/// (those are even counts below 2^62) — the same word the core library writes in a child.
pub(crate) const FORKED_COUNTER: u64 = (1 << 63) | (1 << 62);
