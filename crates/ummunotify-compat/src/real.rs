//! The next definitions of the functions this library interposes (`dlsym(RTLD_NEXT)`), resolved
//! once at load time: the event path (the notifier's monitor thread calls `read`, which lands in
//! our `read`) must never call `dlsym`, which may allocate or take the loader's lock.
use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

macro_rules! reals {
    ($($field:ident: $name:literal => fn($($arg:ty),*) -> $ret:ty;)*) => {
        $(
            static $field: AtomicUsize = AtomicUsize::new(0);
        )*

        /// Resolves every pointer (idempotent).
        pub(crate) fn resolve() {
            $(
                if $field.load(Relaxed) == 0 {
                    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the definition
                    // after this library (libc's).
                    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) };
                    $field.store(p as usize, Relaxed);
                }
            )*
        }

        /// Typed accessors: `None` when the symbol does not exist in this libc.
        pub(crate) mod get {
            use super::{c_char, c_int, c_long, c_uint, c_ulong, c_void, resolve, Relaxed};
            $(
                #[allow(non_snake_case, dead_code)]
                pub(crate) fn $field() -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
                    let mut p = super::$field.load(Relaxed);
                    if p == 0 {
                        resolve();
                        p = super::$field.load(Relaxed);
                    }
                    // SAFETY: a non-zero value is the address of the libc function of that name,
                    // whose C prototype is the one spelled here.
                    (p != 0).then(|| unsafe {
                        std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                    })
                }
            )*
        }
    };
}

reals! {
    OPEN: "open" => fn(*const c_char, c_int, c_uint) -> c_int;
    OPEN64: "open64" => fn(*const c_char, c_int, c_uint) -> c_int;
    OPENAT: "openat" => fn(c_int, *const c_char, c_int, c_uint) -> c_int;
    OPENAT64: "openat64" => fn(c_int, *const c_char, c_int, c_uint) -> c_int;
    OPEN_2: "__open_2" => fn(*const c_char, c_int) -> c_int;
    OPEN64_2: "__open64_2" => fn(*const c_char, c_int) -> c_int;
    OPENAT_2: "__openat_2" => fn(c_int, *const c_char, c_int) -> c_int;
    OPENAT64_2: "__openat64_2" => fn(c_int, *const c_char, c_int) -> c_int;
    READ: "read" => fn(c_int, *mut c_void, usize) -> isize;
    READ_CHK: "__read_chk" => fn(c_int, *mut c_void, usize, usize) -> isize;
    IOCTL: "ioctl" => fn(c_int, c_ulong, *mut c_void) -> c_int;
    MMAP: "mmap" => fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
    MMAP64: "mmap64" => fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
    MUNMAP: "munmap" => fn(*mut c_void, usize) -> c_int;
    MREMAP: "mremap" => fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void;
    SHMAT: "shmat" => fn(c_int, *const c_void, c_int) -> *mut c_void;
    BRK: "brk" => fn(*mut c_void) -> c_int;
    SBRK: "sbrk" => fn(isize) -> *mut c_void;
    CLOSE: "close" => fn(c_int) -> c_int;
    CLOSE_RANGE: "close_range" => fn(c_uint, c_uint, c_int) -> c_int;
    DUP: "dup" => fn(c_int) -> c_int;
    DUP2: "dup2" => fn(c_int, c_int) -> c_int;
    DUP3: "dup3" => fn(c_int, c_int, c_int) -> c_int;
    FCNTL: "fcntl" => fn(c_int, c_int, c_long) -> c_int;
    FCNTL64: "fcntl64" => fn(c_int, c_int, c_long) -> c_int;
}

/// Resolves everything when the library is loaded, before `main` and before any notifier thread.
#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = {
    extern "C" fn at_load() {
        resolve();
    }
    at_load
};
