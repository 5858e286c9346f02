//! The registration cache: C registrar callbacks, get/put, flush, stats, limits.
//!
//! A C program supplies its device's register/deregister calls (`ibv_reg_mr`/`ibv_dereg_mr`,
//! `cudaHostRegister`, ...) as callbacks with a context pointer; the cache decides when to call
//! them and never hands out a registration whose memory changed.
use std::ffi::{c_int, c_void};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use core_api::cache::{Cache, Config, Error as CacheError, Handle};
use core_api::registrar::Registrar;

use crate::boundary::guard;
use crate::error::{fail, fail_arg, set_last_error, ummunotify_result, ummunotify_result::*};
use crate::notifier::ummunotify_notifier;

/// Registers `[start, start + len)` (page-aligned, mapped) with the device and stores the
/// device's 64-bit key for it (an `ibv_mr *` cast to an integer, an lkey, a slot) in `*key_out`.
/// Returns 0, or a positive `errno` value that `ummunotify_cache_get()` reports as
/// `UMMUNOTIFY_ERR_REGISTER`. Called on the thread calling `ummunotify_cache_get()`; must not call
/// back into the same cache.
pub type ummunotify_register_fn = Option<
    unsafe extern "C" fn(ctx: *mut c_void, start: usize, len: usize, key_out: *mut u64) -> c_int,
>;

/// Releases the registration `key` of `[start, start + len)`; called exactly once per key, after
/// the last handle to it was put. The memory may already be unmapped: do not touch it. Returns 0
/// or a positive `errno` value (counted in `deregister_errors`; the key is forgotten either way).
pub type ummunotify_deregister_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, start: usize, len: usize, key: u64) -> c_int>;

/// The device side of a cache: two callbacks and the context passed to both.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ummunotify_registrar {
    /// Required.
    pub register_fn: ummunotify_register_fn,
    /// Required.
    pub deregister_fn: ummunotify_deregister_fn,
    /// Passed to both callbacks unchanged; must stay valid until `ummunotify_cache_free()`.
    pub ctx: *mut c_void,
    /// Largest range the device accepts (the cache never merges regions beyond it); 0: no limit.
    pub max_len: usize,
    /// Most registrations the device can hold at once; 0: no limit.
    pub max_registrations: usize,
}

/// Limits and policy of a cache. Start from `ummunotify_cache_config_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ummunotify_cache_config {
    /// Most regions kept cached (unused ones are evicted, least recently used first).
    pub max_regions: usize,
    /// Most bytes kept registered by cached regions (`SIZE_MAX`: no limit).
    pub max_bytes: usize,
    /// Merge a miss with adjacent cached regions, not only overlapping ones.
    pub merge_adjacent: bool,
}

/// Counters of a cache, filled by `ummunotify_cache_get_stats()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ummunotify_cache_stats {
    /// `get` calls served by a cached region.
    pub hits: u64,
    /// `get` calls that registered a region.
    pub misses: u64,
    /// Regions dropped because their memory changed.
    pub invalidations: u64,
    /// Unused regions evicted to stay under the limits.
    pub evictions: u64,
    /// Cached regions absorbed into a larger one by a miss.
    pub merges: u64,
    /// Registrations released through `deregister_fn`.
    pub deregistrations: u64,
    /// Of those, how many `deregister_fn` reported an error for.
    pub deregister_errors: u64,
    /// Regions in the cache now.
    pub regions: u64,
    /// Regions out of the cache but still registered (held, or awaiting a flush).
    pub retired: u64,
    /// Bytes registered now.
    pub bytes_registered: u64,
}

/// A registration cache (opaque). Create with `ummunotify_cache_new()`, release with
/// `ummunotify_cache_free()`. All functions may be called from any thread concurrently.
pub struct ummunotify_cache {
    _private: [u8; 0],
}

/// One use of a cached registration (opaque), from `ummunotify_cache_get()`; release it with
/// `ummunotify_cache_put()`. While held, its registration stays registered.
pub struct ummunotify_cache_handle {
    _private: [u8; 0],
}

/// The C callbacks as a [`Registrar`].
struct CRegistrar(ummunotify_registrar);

// SAFETY: the C caller promises (documented on `ummunotify_cache_new`) that the callbacks and
// `ctx` may be used from any thread, which is what the cache requires of a registrar.
unsafe impl Send for CRegistrar {}
// SAFETY: as above.
unsafe impl Sync for CRegistrar {}

impl Registrar for CRegistrar {
    type Key = u64;

    fn register(&self, range: Range<usize>) -> io::Result<u64> {
        let f = self.0.register_fn.expect("checked in ummunotify_cache_new");
        let mut key = 0u64;
        // SAFETY: the C callback's contract (see `ummunotify_register_fn`); `key` is a local.
        let rc = unsafe { f(self.0.ctx, range.start, range.len(), &mut key) };
        match rc {
            0 => Ok(key),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    fn deregister(&self, key: &u64, range: Range<usize>) -> io::Result<()> {
        let f = self
            .0
            .deregister_fn
            .expect("checked in ummunotify_cache_new");
        // SAFETY: the C callback's contract (see `ummunotify_deregister_fn`).
        match unsafe { f(self.0.ctx, range.start, range.len(), *key) } {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    fn max_len(&self) -> usize {
        match self.0.max_len {
            0 => usize::MAX,
            n => n,
        }
    }

    fn max_registrations(&self) -> Option<usize> {
        (self.0.max_registrations != 0).then_some(self.0.max_registrations)
    }
}

/// What a `ummunotify_cache *` points to.
struct CCache {
    cache: Cache<CRegistrar>,
    /// Handles not yet put: the cache can not be freed while any exists.
    handles: AtomicUsize,
}

/// What a `ummunotify_cache_handle *` points to. The `'static` is a promise kept by `CCache`'s
/// handle count: `ummunotify_cache_free` refuses to free a cache with live handles.
struct CHandle {
    handle: Handle<'static, CRegistrar>,
    owner: *const CCache,
}

fn cache_fail(e: CacheError) -> ummunotify_result {
    match e {
        CacheError::Notifier(e) => fail(e),
        CacheError::Register(e) => {
            set_last_error(format!("the registrar's register_fn failed: {e}"));
            UMMUNOTIFY_ERR_REGISTER
        }
        CacheError::Unstable => {
            set_last_error(e.to_string());
            UMMUNOTIFY_ERR_UNSTABLE
        }
        e => {
            set_last_error(e.to_string());
            UMMUNOTIFY_ERR_OS
        }
    }
}

/// # Safety
/// `c` must be NULL or a live cache handle.
unsafe fn borrow<'a>(c: *const ummunotify_cache) -> Option<&'a CCache> {
    // SAFETY: (caller) a non-NULL handle points to a live `CCache` boxed by `_new`.
    unsafe { c.cast::<CCache>().as_ref() }
}

macro_rules! cache_or_null {
    ($c:expr) => {
        // SAFETY: (caller of the exported fn) `$c` is NULL or a live handle.
        match unsafe { borrow($c) } {
            Some(c) => c,
            None => return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "cache is NULL"),
        }
    };
}

/// Fills `*out` with the default limits (65536 regions, no byte limit, merge adjacent).
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_config_default(out: *mut ummunotify_cache_config) {
    guard((), || {
        let d = Config::default();
        if !out.is_null() {
            // SAFETY: (caller) non-NULL `out` is writable.
            unsafe {
                out.write(ummunotify_cache_config {
                    max_regions: d.max_regions,
                    max_bytes: d.max_bytes,
                    merge_adjacent: d.merge_adjacent,
                })
            };
        }
    })
}

/// Creates a cache (and its own notifier) over the C registrar `*registrar` (copied), with the
/// limits `*config` (NULL: defaults), and stores it in `*out`.
///
/// The callbacks may be called from any thread that calls into the cache (never from the
/// notifier's monitor thread), possibly concurrently: they and `ctx` must be thread-safe.
///
/// Errors: `UMMUNOTIFY_ERR_NULL_ARGUMENT` (NULL `registrar`, callback or `out`),
/// `UMMUNOTIFY_ERR_UNSUPPORTED` (no userfaultfd here), `UMMUNOTIFY_ERR_OS`.
///
/// # Safety
/// `registrar` and `config` must be NULL or readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_new(
    registrar: *const ummunotify_registrar,
    config: *const ummunotify_cache_config,
    out: *mut *mut ummunotify_cache,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        // SAFETY: (caller) NULL or readable.
        let Some(r) = (unsafe { registrar.as_ref() }).copied() else {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "registrar is NULL");
        };
        if r.register_fn.is_none() || r.deregister_fn.is_none() {
            return fail_arg(
                UMMUNOTIFY_ERR_NULL_ARGUMENT,
                "registrar.register_fn or registrar.deregister_fn is NULL",
            );
        }
        let mut cfg = Config::default();
        // SAFETY: (caller) NULL or readable.
        if let Some(c) = unsafe { config.as_ref() } {
            if c.max_regions == 0 {
                return fail_arg(UMMUNOTIFY_ERR_INVALID_ARGUMENT, "config.max_regions is 0");
            }
            cfg = cfg
                .max_regions(c.max_regions)
                .max_bytes(c.max_bytes)
                .merge_adjacent(c.merge_adjacent);
        }
        match Cache::new(CRegistrar(r), cfg) {
            Ok(cache) => {
                let c = Box::new(CCache {
                    cache,
                    handles: AtomicUsize::new(0),
                });
                // SAFETY: (caller) `out` is writable.
                unsafe { out.write(Box::into_raw(c).cast()) };
                UMMUNOTIFY_OK
            }
            Err(e) => cache_fail(e),
        }
    })
}

/// Frees a cache: deregisters every registration it still holds (through `deregister_fn`) and
/// stops its notifier. NULL is a no-op. Refused with `UMMUNOTIFY_ERR_CACHE_BUSY` (nothing freed)
/// while handles from `ummunotify_cache_get()` have not been put.
///
/// # Safety
/// `c` must be NULL or a live cache, not used by other threads during or after a successful call.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_free(c: *mut ummunotify_cache) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        if c.is_null() {
            return UMMUNOTIFY_OK;
        }
        // SAFETY: (caller) a live cache.
        let live = unsafe { &*c.cast::<CCache>() }.handles.load(SeqCst);
        if live != 0 {
            return fail_arg(
                UMMUNOTIFY_ERR_CACHE_BUSY,
                &format!("{live} handle(s) not yet put"),
            );
        }
        // SAFETY: (caller) `c` came from `Box::into_raw` in `_new` and is freed only here.
        drop(unsafe { Box::from_raw(c.cast::<CCache>()) });
        UMMUNOTIFY_OK
    })
}

/// A registration covering `[addr, addr + len)`: a cached one whose memory is unchanged (a hit,
/// a few nanoseconds), or a new one made through `register_fn` (a miss). Stores a handle in
/// `*out`; read the key with `ummunotify_cache_handle_key()` and release it with
/// `ummunotify_cache_put()`.
///
/// Errors: `UMMUNOTIFY_ERR_EMPTY_RANGE`, `_WRAPPING_RANGE`, `_UNMAPPED` (bad range),
/// `UMMUNOTIFY_ERR_REGISTER` (`register_fn` failed; `ummunotify_last_error()` has its errno),
/// `UMMUNOTIFY_ERR_UNSTABLE` (the memory kept changing), `_FORKED`, `_MONITOR_DEAD`.
///
/// # Safety
/// `c` must be NULL or a live cache; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_get(
    c: *const ummunotify_cache,
    addr: usize,
    len: usize,
    out: *mut *mut ummunotify_cache_handle,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let cc = cache_or_null!(c);
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        // Counted before the handle exists, so a racing (buggy) free is refused, never UB.
        cc.handles.fetch_add(1, SeqCst);
        let cache: &'static Cache<CRegistrar> = {
            let p: *const Cache<CRegistrar> = &cc.cache;
            // SAFETY: the cache outlives every handle: `ummunotify_cache_free` refuses while
            // `handles` is non-zero, and `ummunotify_cache_put` decrements it only after
            // dropping the handle.
            unsafe { &*p }
        };
        match cache.get(addr, len) {
            Ok(handle) => {
                let h = Box::new(CHandle { handle, owner: cc });
                // SAFETY: (caller) `out` is writable.
                unsafe { out.write(Box::into_raw(h).cast()) };
                UMMUNOTIFY_OK
            }
            Err(e) => {
                cc.handles.fetch_sub(1, SeqCst);
                cache_fail(e)
            }
        }
    })
}

/// # Safety
/// `h` must be NULL or a live handle.
unsafe fn borrow_handle<'a>(h: *const ummunotify_cache_handle) -> Option<&'a CHandle> {
    // SAFETY: (caller) a non-NULL handle points to a live `CHandle` boxed by `_get`.
    unsafe { h.cast::<CHandle>().as_ref() }
}

/// Releases a handle from `ummunotify_cache_get()` (any thread). NULL is a no-op. If its region
/// was invalidated or evicted meanwhile, it is deregistered in a later cache call or flush.
///
/// # Safety
/// `h` must be NULL or a live handle, not used after this call.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_put(h: *mut ummunotify_cache_handle) {
    guard((), || {
        if h.is_null() {
            return;
        }
        // SAFETY: (caller) `h` came from `Box::into_raw` in `_get` and is released only here.
        let h = unsafe { Box::from_raw(h.cast::<CHandle>()) };
        let owner = h.owner;
        drop(h);
        // SAFETY: the owner is alive: its handle count included this handle until now.
        unsafe { &*owner }.handles.fetch_sub(1, SeqCst);
    })
}

/// The device key `register_fn` returned for the handle's registration (0 for NULL).
///
/// # Safety
/// `h` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_handle_key(h: *const ummunotify_cache_handle) -> u64 {
    guard(0, || {
        // SAFETY: (caller) NULL or a live handle.
        unsafe { borrow_handle(h) }.map_or(0, |h| *h.handle.key())
    })
}

/// The registered range (page-aligned, covering the range passed to `get`): stores its start in
/// `*start` and length in `*len` (either may be NULL). Zeros for a NULL handle.
///
/// # Safety
/// `h` must be NULL or a live handle; `start`, `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_handle_range(
    h: *const ummunotify_cache_handle,
    start: *mut usize,
    len: *mut usize,
) {
    guard((), || {
        // SAFETY: (caller) NULL or a live handle.
        let r = unsafe { borrow_handle(h) }.map_or(0..0, |h| h.handle.range());
        // SAFETY: (caller) each is NULL or writable.
        unsafe {
            if !start.is_null() {
                start.write(r.start);
            }
            if !len.is_null() {
                len.write(r.len());
            }
        }
    })
}

/// Whether the memory behind the handle's registration is unchanged since it was registered (two
/// loads). False once a change of its pages returned to its caller, in any thread: I/O through
/// this registration would use the old pages. False for NULL.
///
/// # Safety
/// `h` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_handle_is_valid(
    h: *const ummunotify_cache_handle,
) -> bool {
    guard(false, || {
        // SAFETY: (caller) NULL or a live handle.
        unsafe { borrow_handle(h) }.is_some_and(|h| h.handle.is_valid())
    })
}

/// Drops every region whose memory changed and deregisters every registration no handle holds
/// any more (invalidated, evicted). Cached valid regions stay.
///
/// # Safety
/// `c` must be NULL or a live cache.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_flush(c: *const ummunotify_cache) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let cc = cache_or_null!(c);
        cc.cache.flush();
        UMMUNOTIFY_OK
    })
}

/// Fills `*out` with the cache's counters.
///
/// # Safety
/// `c` must be NULL or a live cache; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_get_stats(
    c: *const ummunotify_cache,
    out: *mut ummunotify_cache_stats,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let cc = cache_or_null!(c);
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        let s = cc.cache.stats();
        let stats = ummunotify_cache_stats {
            hits: s.hits,
            misses: s.misses,
            invalidations: s.invalidations,
            evictions: s.evictions,
            merges: s.merges,
            deregistrations: s.deregistrations,
            deregister_errors: s.deregister_errors,
            regions: s.regions as u64,
            retired: s.retired as u64,
            bytes_registered: s.bytes_registered as u64,
        };
        // SAFETY: `out` is non-NULL and (caller) writable.
        unsafe { out.write(stats) };
        UMMUNOTIFY_OK
    })
}

/// The cache's own notifier, borrowed (valid until the cache is freed; never pass it to
/// `ummunotify_notifier_free()`). Register your own regions on it with cookies below `1 << 63`
/// (the cache uses the upper half): a second notifier could not watch the same memory. NULL for
/// a NULL cache.
///
/// # Safety
/// `c` must be NULL or a live cache.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_notifier(
    c: *const ummunotify_cache,
) -> *const ummunotify_notifier {
    guard(std::ptr::null(), || {
        // SAFETY: (caller) NULL or a live cache.
        match unsafe { borrow(c) } {
            Some(cc) => (cc.cache.notifier() as *const core_api::Notifier).cast(),
            None => std::ptr::null(),
        }
    })
}
