//! The C library's cache hit (`ummunotify_cache_get` + `ummunotify_cache_put` through
//! `libummunotify.so`, loaded with `dlopen` and called through its exported symbols, as a C
//! program's PLT calls would) against the Rust hit, batch by batch in the same process.
//!
//! The library is looked up in `$UMN_CAPI_LIB`, else next to the `umn` executable (where
//! `cargo build --release -p ummunotify-capi` puts it). Without it, the rows are left out and
//! `umn bench` says why on stderr.
#![allow(unsafe_code)] // dlopen/dlsym and calls through the C ABI.

use std::ffi::{c_int, c_void, CString};
use std::hint::black_box;
use std::path::PathBuf;

#[repr(C)]
struct Registrar {
    register_fn: unsafe extern "C" fn(*mut c_void, usize, usize, *mut u64) -> c_int,
    deregister_fn: unsafe extern "C" fn(*mut c_void, usize, usize, u64) -> c_int,
    ctx: *mut c_void,
    max_len: usize,
    max_registrations: usize,
}

/// `ummunotify_cache_handle`: caller storage.
#[repr(C)]
struct CHandle([u64; 4]);

unsafe extern "C" fn noop_register(_: *mut c_void, start: usize, _: usize, key: *mut u64) -> c_int {
    // SAFETY: the library passes a writable key.
    unsafe { key.write(start as u64) };
    0
}

unsafe extern "C" fn noop_deregister(_: *mut c_void, _: usize, _: usize, _: u64) -> c_int {
    0
}

type New = unsafe extern "C" fn(*const Registrar, *const c_void, *mut *mut c_void) -> u32;
type Free = unsafe extern "C" fn(*mut c_void) -> u32;
type Get = unsafe extern "C" fn(*const c_void, usize, usize, *mut CHandle) -> u32;
type Put = unsafe extern "C" fn(*mut CHandle);

/// A C cache (no-op registrar) in a dlopen-ed `libummunotify.so`.
pub struct CCache {
    cache: *mut c_void,
    get: Get,
    put: Put,
    free: Free,
}

fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("UMN_CAPI_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    Ok(exe.with_file_name("libummunotify.so"))
}

impl CCache {
    /// Loads the library and creates a cache; `Err` says why not.
    pub fn new() -> Result<CCache, String> {
        let path = library()?;
        if !path.exists() {
            return Err(format!(
                "{} not found (cargo build --release -p ummunotify-capi, or set UMN_CAPI_LIB)",
                path.display()
            ));
        }
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated path; the library is never unloaded (its monitor threads
        // would run unmapped code).
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(format!("dlopen {} failed", path.display()));
        }
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let n = CString::new(name).expect("no NUL");
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(lib, n.as_ptr()) };
            if p.is_null() {
                Err(format!("{name} not exported by {}", path.display()))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is the C function of that name, whose prototype in
        // include/ummunotify.h is the one spelled by the type it is cast to.
        let (new, free, get, put) = unsafe {
            (
                std::mem::transmute::<*mut c_void, New>(sym("ummunotify_cache_new")?),
                std::mem::transmute::<*mut c_void, Free>(sym("ummunotify_cache_free")?),
                std::mem::transmute::<*mut c_void, Get>(sym("ummunotify_cache_get")?),
                std::mem::transmute::<*mut c_void, Put>(sym("ummunotify_cache_put")?),
            )
        };
        let r = Registrar {
            register_fn: noop_register,
            deregister_fn: noop_deregister,
            ctx: std::ptr::null_mut(),
            max_len: 0,
            max_registrations: 0,
        };
        let mut cache = std::ptr::null_mut();
        // SAFETY: a valid registrar, default config (NULL), and an out pointer.
        let rc = unsafe { new(&r, std::ptr::null(), &mut cache) };
        if rc != 0 {
            return Err(format!("ummunotify_cache_new failed: result {rc}"));
        }
        Ok(CCache {
            cache,
            get,
            put,
            free,
        })
    }

    /// One get + put of `[addr, addr + len)`; panics if the get fails.
    #[inline(always)]
    pub fn hit(&self, addr: usize, len: usize) {
        let mut h = CHandle([0; 4]);
        // SAFETY: a live cache and caller storage for the handle, put right after.
        unsafe {
            let rc = (self.get)(self.cache, black_box(addr), black_box(len), &mut h);
            assert_eq!(rc, 0, "ummunotify_cache_get");
            black_box(&h);
            (self.put)(&mut h);
        }
    }
}

impl Drop for CCache {
    fn drop(&mut self) {
        // SAFETY: a live cache with no handle out.
        unsafe { (self.free)(self.cache) };
    }
}
