//! The registration cache: C registrar callbacks, get/put, flush, stats, limits.
//!
//! A C program supplies its device's register/deregister calls (`ibv_reg_mr`/`ibv_dereg_mr`,
//! `cudaHostRegister`, ...) as callbacks with a context pointer; the cache decides when to call
//! them and never hands out a registration whose memory changed.
use std::ffi::{c_int, c_void};
use std::io;
use std::ops::Range;

use core_api::cache::{Cache, Config, Error as CacheError, Handle};
use core_api::registrar::Registrar;

use crate::boundary::guard;
use crate::error::{fail, fail_arg, set_last_error, ummunotify_result, ummunotify_result::*};
use crate::notifier::{ummunotify_notifier, CNotifier};

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

/// Limits and policy of a cache. Set `size`, then fill the rest with
/// `ummunotify_cache_config_default()`:
///
/// ```c
/// ummunotify_cache_config cfg = {.size = sizeof cfg};
/// ummunotify_cache_config_default(&cfg);
/// cfg.max_regions = 1024;
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ummunotify_cache_config {
    /// `sizeof(ummunotify_cache_config)` as the caller was compiled (the struct may grow in later
    /// versions; fields a newer program sets that this library lacks must be zero).
    pub size: usize,
    /// Most regions kept cached (unused ones are evicted, least recently used first).
    pub max_regions: usize,
    /// Most bytes kept registered by cached regions (`SIZE_MAX`: no limit).
    pub max_bytes: usize,
    /// Merge a miss with adjacent cached regions, not only overlapping ones.
    pub merge_adjacent: bool,
}

/// Counters of a cache, filled by `ummunotify_cache_get_stats()` (set `size` first:
/// `ummunotify_cache_stats st = {.size = sizeof st};`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ummunotify_cache_stats {
    /// `sizeof(ummunotify_cache_stats)` as the caller was compiled (the struct may grow; the
    /// library fills what both know).
    pub size: usize,
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

/// One use of a cached registration: storage the caller provides (on its stack, in its request
/// struct), filled by `ummunotify_cache_get()` and released with `ummunotify_cache_put()`. While
/// held, its registration stays registered. Its contents are opaque; an all-zero handle is an
/// empty one (`put` of it does nothing). Do not copy a live handle: use it where `get` put it.
#[repr(C)]
#[derive(Debug)]
pub struct ummunotify_cache_handle {
    /// Opaque.
    pub opaque: [u64; 4],
}

/// `opaque[3]` of a live handle.
const LIVE: u64 = 0x756d_6e68_616e_646c; // "umnhandl"

type RustHandle = Handle<'static, CRegistrar>;
const _: () = assert!(std::mem::size_of::<RustHandle>() <= 3 * 8);
const _: () = assert!(std::mem::align_of::<RustHandle>() <= 8);

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
        crate::verbs::clear_detail();
        // SAFETY: the C callback's contract (see `ummunotify_register_fn`); `key` is a local.
        let rc = unsafe { f(self.0.ctx, range.start, range.len(), &mut key) };
        match rc {
            0 => Ok(key),
            e => {
                let err = io::Error::from_raw_os_error(e);
                // A ready-made registrar (verbs) says which call failed and how.
                Err(match crate::verbs::take_detail() {
                    Some(detail) => io::Error::new(err.kind(), detail),
                    None => err,
                })
            }
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
pub(crate) struct CCache {
    cache: Cache<CRegistrar>,
    /// What `ummunotify_cache_notifier()` hands out (borrows `cache`'s notifier; set once the
    /// cache is boxed, so the address is stable).
    notifier: std::sync::OnceLock<CNotifier>,
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

/// The first version's size of `ummunotify_cache_config`.
const CONFIG_V1: usize = std::mem::size_of::<ummunotify_cache_config>();
/// The first version's size of `ummunotify_cache_stats`.
const STATS_V1: usize = std::mem::size_of::<ummunotify_cache_stats>();
const _: () = assert!(std::mem::offset_of!(ummunotify_cache_config, size) == 0);
const _: () = assert!(std::mem::offset_of!(ummunotify_cache_stats, size) == 0);

/// Fills `*out` (whose `size` the caller set) with the default limits (65536 regions, no byte
/// limit, merge adjacent).
///
/// Errors: `UMMUNOTIFY_ERR_NULL_ARGUMENT`, `UMMUNOTIFY_ERR_INVALID_ARGUMENT` (`out->size` not
/// set; nothing written).
///
/// # Safety
/// `out` must be NULL or point to `out->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_config_default(
    out: *mut ummunotify_cache_config,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        let d = Config::default();
        let v = ummunotify_cache_config {
            size: CONFIG_V1,
            max_regions: d.max_regions,
            max_bytes: d.max_bytes,
            merge_adjacent: d.merge_adjacent,
        };
        // SAFETY: (caller) `out->size` writable bytes.
        match unsafe { crate::sized::write(out, &v, CONFIG_V1) } {
            Ok(()) => UMMUNOTIFY_OK,
            Err(e) => fail_arg(
                UMMUNOTIFY_ERR_INVALID_ARGUMENT,
                &e.message("ummunotify_cache_config"),
            ),
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
        if !config.is_null() {
            // SAFETY: (caller) `config->size` readable bytes.
            let d = Config::default();
            let defaults = ummunotify_cache_config {
                size: CONFIG_V1,
                max_regions: d.max_regions,
                max_bytes: d.max_bytes,
                merge_adjacent: d.merge_adjacent,
            };
            let c = match unsafe { crate::sized::read(config, defaults, CONFIG_V1) } {
                Ok(c) => c,
                Err(e) => {
                    return fail_arg(
                        UMMUNOTIFY_ERR_INVALID_ARGUMENT,
                        &e.message("ummunotify_cache_config"),
                    )
                }
            };
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
                    notifier: std::sync::OnceLock::new(),
                });
                let n: *const core_api::Notifier = c.cache.notifier();
                // SAFETY: the notifier lives inside the boxed cache, as long as this handle.
                let _ = c.notifier.set(unsafe { CNotifier::borrowed(n) });
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
        if unsafe { &*c.cast::<CCache>() }.cache.handles_alive() {
            return fail_arg(UMMUNOTIFY_ERR_CACHE_BUSY, "handles not yet put");
        }
        // SAFETY: (caller) `c` came from `Box::into_raw` in `_new` and is freed only here.
        drop(unsafe { Box::from_raw(c.cast::<CCache>()) });
        UMMUNOTIFY_OK
    })
}

/// A registration covering `[addr, addr + len)`: a cached one whose memory is unchanged (a hit,
/// a few nanoseconds: no lock, no allocation, no write to memory other threads use), or a new one
/// made through `register_fn` (a miss). Fills the caller's `*out`; read the key with
/// `ummunotify_cache_handle_key()` and release it with `ummunotify_cache_put()`. On error `*out`
/// is left empty (all zero).
///
/// Errors: `UMMUNOTIFY_ERR_EMPTY_RANGE`, `_WRAPPING_RANGE`, `_UNMAPPED` (bad range),
/// `UMMUNOTIFY_ERR_REGISTER` (`register_fn` failed; `ummunotify_last_error()` has its errno),
/// `UMMUNOTIFY_ERR_UNSTABLE` (the memory kept changing), `_FORKED`, `_MONITOR_DEAD`.
///
/// # Safety
/// `c` must be NULL or a live cache; `out` NULL or writable, and not a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_get(
    c: *const ummunotify_cache,
    addr: usize,
    len: usize,
    out: *mut ummunotify_cache_handle,
) -> ummunotify_result {
    // The hit path first, outside the panic boundary: `get_cached` can not panic (nor lock,
    // allocate or make a syscall). Everything else is out of line, so the hit pays for no
    // more registers and stack than it uses.
    if !out.is_null() {
        // SAFETY: (caller) `c` is NULL or a live cache.
        if let Some(cc) = unsafe { borrow(c) } {
            if let Some(handle) = for_handles(cc).get_cached(addr, len) {
                // SAFETY: (caller) `out` is writable handle storage.
                unsafe { fill(out, handle) };
                return UMMUNOTIFY_OK;
            }
        }
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { get_slow(c, addr, len, out) }
}

/// `ummunotify_cache_get` past its hit path.
///
/// # Safety
/// As for `ummunotify_cache_get`.
#[cold]
#[inline(never)]
unsafe fn get_slow(
    c: *const ummunotify_cache,
    addr: usize,
    len: usize,
    out: *mut ummunotify_cache_handle,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let cc = cache_or_null!(c);
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        match for_handles(cc).get(addr, len) {
            Ok(handle) => {
                // SAFETY: (caller) `out` is writable handle storage.
                unsafe { fill(out, handle) };
                UMMUNOTIFY_OK
            }
            Err(e) => {
                // SAFETY: (caller) `out` is writable.
                unsafe { out.write(ummunotify_cache_handle { opaque: [0; 4] }) };
                cache_fail(e)
            }
        }
    })
}

/// The cache, for as long as any handle lives.
#[inline(always)]
fn for_handles(cc: &CCache) -> &'static Cache<CRegistrar> {
    let p: *const Cache<CRegistrar> = &cc.cache;
    // SAFETY: the cache outlives every handle: `ummunotify_cache_free` refuses while any
    // handle is alive (`Cache::handles_alive`).
    unsafe { &*p }
}

/// Fills `out` with a live handle.
///
/// # Safety
/// `out` is writable storage of 32 bytes, 8-byte aligned.
#[inline(always)]
unsafe fn fill(out: *mut ummunotify_cache_handle, handle: RustHandle) {
    // SAFETY: (caller) writable; the Rust handle fits in its first 24 bytes (asserted above).
    unsafe {
        out.cast::<RustHandle>().write(handle);
        (*out).opaque[3] = LIVE;
    }
}

/// # Safety
/// `h` must be NULL or point to a handle (live or empty).
unsafe fn borrow_handle<'a>(h: *const ummunotify_cache_handle) -> Option<&'a RustHandle> {
    // SAFETY: (caller) NULL or a handle; a live one holds a `RustHandle` at its start, written by
    // `ummunotify_cache_get`.
    unsafe {
        match h.as_ref() {
            Some(s) if s.opaque[3] == LIVE => Some(&*h.cast::<RustHandle>()),
            _ => None,
        }
    }
}

/// Releases a handle from `ummunotify_cache_get()` (any thread) and marks it empty. NULL or an empty
/// handle is a no-op. If its region was invalidated or evicted meanwhile, it is deregistered in a
/// later cache call or flush. Async-signal-safe (one store).
///
/// # Safety
/// `h` must be NULL or a handle (live or empty) not used by another thread during the call.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_put(h: *mut ummunotify_cache_handle) {
    // No panic boundary needed: nothing here can panic (a handle's drop is one atomic store, or
    // one atomic decrement for a handle held outside the hazard slots).
    // SAFETY: (caller) NULL or a handle.
    if unsafe { borrow_handle(h) }.is_none() {
        return;
    }
    // SAFETY: a live handle holds a `RustHandle` (see `borrow_handle`); it is read out once and
    // the storage marked empty first, so it is dropped exactly once.
    unsafe {
        (*h).opaque[3] = 0;
        drop(h.cast::<RustHandle>().read());
    }
}

/// The device key `register_fn` returned for the handle's registration (0 for NULL or an empty
/// handle). Async-signal-safe.
///
/// # Safety
/// `h` must be NULL or a handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_handle_key(h: *const ummunotify_cache_handle) -> u64 {
    guard(0, || {
        // SAFETY: (caller) NULL or a handle.
        unsafe { borrow_handle(h) }.map_or(0, |h| *h.key())
    })
}

/// The registered range (page-aligned, covering the range passed to `get`): stores its start in
/// `*start` and length in `*len` (either may be NULL). Zeros for NULL or an empty handle.
/// Async-signal-safe.
///
/// # Safety
/// `h` must be NULL or a handle; `start`, `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_handle_range(
    h: *const ummunotify_cache_handle,
    start: *mut usize,
    len: *mut usize,
) {
    guard((), || {
        // SAFETY: (caller) NULL or a handle.
        let r = unsafe { borrow_handle(h) }.map_or(0..0, |h| h.range());
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
/// this registration would use the old pages. False for NULL or an empty handle.
/// Async-signal-safe.
///
/// # Safety
/// `h` must be NULL or a handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_handle_is_valid(
    h: *const ummunotify_cache_handle,
) -> bool {
    guard(false, || {
        // SAFETY: (caller) NULL or a handle.
        unsafe { borrow_handle(h) }.is_some_and(|h| h.is_valid())
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
/// Errors: `UMMUNOTIFY_ERR_NULL_ARGUMENT`, `UMMUNOTIFY_ERR_INVALID_ARGUMENT` (`out->size` not
/// set).
///
/// # Safety
/// `c` must be NULL or a live cache; `out` NULL or `out->size` writable bytes.
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
            size: STATS_V1,
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
        // SAFETY: `out` is non-NULL and (caller) `out->size` writable bytes.
        match unsafe { crate::sized::write(out, &stats, STATS_V1) } {
            Ok(()) => UMMUNOTIFY_OK,
            Err(e) => fail_arg(
                UMMUNOTIFY_ERR_INVALID_ARGUMENT,
                &e.message("ummunotify_cache_stats"),
            ),
        }
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
            Some(cc) => cc.notifier.get().map_or(std::ptr::null(), |h| {
                (h.want_fd() as *const CNotifier).cast()
            }),
            None => std::ptr::null(),
        }
    })
}

/// Moves up to `capacity` events of *your* regions on `ummunotify_cache_notifier()` into
/// `events` and stores their number in `*count` (0: none pending). The cache reads the
/// notifier's queue for its own regions and sets yours aside: at most one per region (a region
/// hit again before you read its event gets one event without `UMMUNOTIFY_EVENT_FLAG_HINT`
/// whose range covers every hit), and the events of regions you unregistered are dropped, so the
/// memory this takes is bounded by your regions. Read them here, not with
/// `ummunotify_notifier_read_events()` on the cache's notifier (that would take the cache's own
/// events too). Call again while `*count == capacity`.
///
/// Errors: `UMMUNOTIFY_ERR_NULL_ARGUMENT`, `_FORKED`, `_MONITOR_DEAD`.
///
/// # Safety
/// `c` must be NULL or a live cache; `events` NULL or `capacity` writable elements; `count`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_cache_read_events(
    c: *const ummunotify_cache,
    events: *mut crate::notifier::ummunotify_event,
    capacity: usize,
    count: *mut usize,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let cc = cache_or_null!(c);
        if count.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "count is NULL");
        }
        if events.is_null() && capacity > 0 {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "events is NULL");
        }
        let mut buf = [core_api::Event::default(); 64];
        let mut done = 0usize;
        while done < capacity {
            let want = (capacity - done).min(buf.len());
            let n = match cc.cache.take_events_into(&mut buf[..want]) {
                Ok(n) => n,
                Err(e) if done == 0 => return fail(e),
                Err(_) => break, // events already moved out must reach the caller
            };
            for (i, e) in buf[..n].iter().enumerate() {
                // SAFETY: `done + i < capacity`, and (caller) `events` has `capacity` elements.
                unsafe { events.add(done + i).write(crate::notifier::to_c_event(e)) };
            }
            done += n;
            if n < want {
                break;
            }
        }
        // SAFETY: (caller) `count` is writable.
        unsafe { count.write(done) };
        UMMUNOTIFY_OK
    })
}
