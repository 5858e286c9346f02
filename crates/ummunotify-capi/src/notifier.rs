//! The notifier: create/destroy, register/unregister, checks, the counter, events, the fd.
use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

use core_api::{Cookie, Event, Notifier, Region};

use crate::boundary::guard;
use crate::error::{fail, fail_arg, ummunotify_result, ummunotify_result::*};

/// A notifier (opaque). Create with `ummunotify_notifier_new()`, release with
/// `ummunotify_notifier_free()`. Every function taking a `const ummunotify_notifier *` may be
/// called from any thread concurrently.
pub struct ummunotify_notifier {
    _private: [u8; 0],
}

/// The type of the live counter word: read it through a `const volatile uint64_t *` (the header
/// declares `typedef volatile uint64_t ummunotify_counter_word;`).
pub type ummunotify_counter_word = u64;

/// A token for one registered region: checks it in O(1) with `ummunotify_notifier_is_valid()`.
/// Copy it freely; its fields are opaque (do not interpret or change them). It names the
/// notifier that issued it: checked on any other notifier it reads invalid. An all-zero token
/// never reads valid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ummunotify_region {
    /// Opaque.
    pub slot: u32,
    /// Opaque: the issuing notifier (never 0).
    pub notifier: u32,
    /// Opaque.
    pub tag: u64,
}

/// What a `ummunotify_notifier *` points to: the notifier (owned, or the cache's, borrowed) and
/// the identity its region tokens carry.
pub(crate) struct CNotifier {
    id: u32,
    inner: Inner,
}

enum Inner {
    Owned(Notifier),
    /// A cache's notifier; the cache owns both it and this `CNotifier`.
    Borrowed(*const Notifier),
}

impl CNotifier {
    /// A handle with a fresh identity (process-unique until 2^32 - 1 notifiers were made).
    fn new(inner: Inner) -> CNotifier {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let mut id = NEXT.fetch_add(1, Relaxed);
        if id == 0 {
            id = NEXT.fetch_add(1, Relaxed); // wrapped: 0 is the all-zero token's
        }
        CNotifier { id, inner }
    }

    /// The handle `ummunotify_cache_notifier()` returns for a cache's notifier.
    ///
    /// # Safety
    /// `n` must outlive the returned value.
    pub(crate) unsafe fn borrowed(n: *const Notifier) -> CNotifier {
        CNotifier::new(Inner::Borrowed(n))
    }

    /// Readies the fd for `ummunotify_notifier_fd`, which is async-signal-safe: the core's first
    /// `as_fd` takes the notifier's index lock (it starts writing the readiness eventfd from
    /// then on), so it happens here, in a call that is not, before the handle is handed out.
    pub(crate) fn want_fd(&self) -> &CNotifier {
        let _ = self.get().as_fd();
        self
    }

    fn get(&self) -> &Notifier {
        match &self.inner {
            Inner::Owned(n) => n,
            // SAFETY: (`borrowed`) the cache keeps the notifier alive as long as this handle.
            Inner::Borrowed(p) => unsafe { &**p },
        }
    }
}

// SAFETY: `Notifier` is Send + Sync; a borrowed one is owned by the cache, which is Sync too.
unsafe impl Send for CNotifier {}
// SAFETY: as above.
unsafe impl Sync for CNotifier {}

/// `ummunotify_event.flags`: exactly one invalidation hit the region before its event was read;
/// `[start, end)` is that invalidation clipped to the region (otherwise it is the whole region).
pub const UMMUNOTIFY_EVENT_FLAG_HINT: u32 = 1;

/// Stored in `*drained` by `ummunotify_notifier_read_events()` when the queue was not drained.
/// Never equal to a generation.
pub const UMMUNOTIFY_GENERATION_NONE: u64 = u64::MAX;

/// One invalidation event (at most one pending per region; reading it re-arms the region).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ummunotify_event {
    /// The region's cookie.
    pub cookie: u64,
    /// Start of the reported range.
    pub start: u64,
    /// End (exclusive) of the reported range.
    pub end: u64,
    /// `UMMUNOTIFY_EVENT_FLAG_HINT` or 0.
    pub flags: u32,
    /// Always 0.
    pub reserved: u32,
}

/// An event as C sees it.
pub(crate) fn to_c_event(e: &Event) -> ummunotify_event {
    ummunotify_event {
        cookie: e.cookie.0,
        start: e.start as u64,
        end: e.end as u64,
        flags: if e.hint {
            UMMUNOTIFY_EVENT_FLAG_HINT
        } else {
            0
        },
        reserved: 0,
    }
}

/// Counters for diagnostics, filled by `ummunotify_notifier_get_stats()` (set `size` first:
/// `ummunotify_notifier_stats st = {.size = sizeof st};`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ummunotify_notifier_stats {
    /// `sizeof(ummunotify_notifier_stats)` as the caller was compiled (the struct may grow; the
    /// library fills what both know).
    pub size: usize,
    /// Registered regions.
    pub regions: u64,
    /// Messages the monitor dequeued from the kernel.
    pub messages: u64,
    /// Region invalidations applied.
    pub invalidations: u64,
    /// Events handed to readers.
    pub events_read: u64,
    /// Events pending now.
    pub pending: u64,
    /// Disjoint page ranges watched with the kernel.
    pub coverage_segments: u64,
    /// `REMOVE`s (madvise `DONTNEED`, ...) held in flight until their zap was confirmed, and
    /// those ended by a grace period instead (the residual window). Added after the first version of the struct.
    pub removes_confirmed: u64,
    /// See `removes_confirmed`.
    pub removes_by_grace: u64,
    /// Signals the library sent to this process's threads to learn that a `REMOVE`'s sender is
    /// back in user space, and its handlers that ran (process-wide). Added after the first version.
    pub signals_sent: u64,
    /// See `signals_sent`.
    pub signals_handled: u64,
}

/// Borrows the handle.
///
/// # Safety
/// `n` must be NULL or a live handle (from `ummunotify_notifier_new()` not yet freed, or from
/// `ummunotify_cache_notifier()` of a live cache).
unsafe fn handle<'a>(n: *const ummunotify_notifier) -> Option<&'a CNotifier> {
    // SAFETY: (caller) a non-NULL handle points to a live `CNotifier`.
    unsafe { n.cast::<CNotifier>().as_ref() }
}

/// Borrows the notifier behind a handle.
///
/// # Safety
/// As for [`handle`].
unsafe fn borrow<'a>(n: *const ummunotify_notifier) -> Option<&'a Notifier> {
    // SAFETY: (caller) NULL or a live handle.
    unsafe { handle(n) }.map(CNotifier::get)
}

/// `f(notifier)` for a getter that returns `default` for a NULL handle (or a panic).
///
/// # Safety
/// `n` must be NULL or a live handle.
unsafe fn get_or<T>(n: *const ummunotify_notifier, default: T, f: impl FnOnce(&Notifier) -> T) -> T
where
    T: Copy,
{
    guard(default, || {
        // SAFETY: (caller) `n` is NULL or a live handle.
        match unsafe { borrow(n) } {
            Some(n) => f(n),
            None => default,
        }
    })
}

macro_rules! notifier_or_null {
    ($n:expr) => {
        // SAFETY: (caller of the exported fn) `$n` is NULL or a live handle.
        match unsafe { borrow($n) } {
            Some(n) => n,
            None => return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "notifier is NULL"),
        }
    };
}

/// Starts a notifier (one monitor thread) and stores its handle in `*out`.
///
/// Returns `UMMUNOTIFY_ERR_UNSUPPORTED` when userfaultfd can not be used here;
/// `ummunotify_last_error()` then says exactly why (seccomp,
/// `vm.unprivileged_userfaultfd`, missing kernel features).
///
/// # Safety
/// `out` must be NULL or point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_new(
    out: *mut *mut ummunotify_notifier,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        match Notifier::new() {
            Ok(n) => {
                let c = CNotifier::new(Inner::Owned(n));
                c.want_fd();
                let h = Box::into_raw(Box::new(c)).cast::<ummunotify_notifier>();
                // SAFETY: (caller) `out` is writable.
                unsafe { out.write(h) };
                UMMUNOTIFY_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Stops and releases a notifier (joins its monitor thread). NULL is a no-op. Regions need not
/// be unregistered first. In a forked child this releases the child's copy without waiting for
/// a thread the child does not have.
///
/// # Safety
/// `n` must be NULL or a live handle, not used by any other thread during or after this call.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_free(n: *mut ummunotify_notifier) {
    guard((), || {
        if !n.is_null() {
            // SAFETY: (caller) a live handle.
            if matches!(unsafe { &*n.cast::<CNotifier>() }.inner, Inner::Borrowed(_)) {
                return; // a cache's notifier (a mistake the docs forbid): the cache owns it
            }
            // SAFETY: (caller) an owned handle came from `Box::into_raw` in `_new` and is freed
            // only here.
            drop(unsafe { Box::from_raw(n.cast::<CNotifier>()) });
        }
    })
}

/// Registers `[start, end)` under `cookie` (unique within this notifier; overlapping ranges are
/// fine) and, if `region_out` is not NULL, stores a token for O(1) checks there.
///
/// Errors: `UMMUNOTIFY_ERR_EMPTY_RANGE`, `_WRAPPING_RANGE`, `_UNMAPPED`, `_DUPLICATE_COOKIE`,
/// `_RANGE_BUSY`, `_COVERAGE_LIMIT`, `_UNSUPPORTED_MAPPING`, `_FORKED`, `_MONITOR_DEAD`; the
/// notifier is unchanged after any of them.
///
/// # Safety
/// `n` must be NULL or a live handle; `region_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_register(
    n: *const ummunotify_notifier,
    start: usize,
    end: usize,
    cookie: u64,
    region_out: *mut ummunotify_region,
) -> ummunotify_result {
    // SAFETY: (caller) as `register_with` requires.
    unsafe { register_with(n, start..end, cookie, region_out, Notifier::register) }
}

/// Registers `[start, end)` under `cookie` whether or not it is mapped (the 2010 device's rule),
/// as [`ummunotify_notifier_register`] does otherwise. Mapped parts are watched at once; memory
/// mapped into the range later is watched once [`ummunotify_notifier_mapped`] is told of it
/// (the kernel reports no new mappings: memory mapped there and not announced is not watched).
/// The token is valid from now on, and stays valid when a hole is filled (nothing was there to
/// invalidate); re-arming the region over a hole makes it valid again too.
///
/// Errors: as `ummunotify_notifier_register`, without `_UNMAPPED`.
///
/// # Safety
/// `n` must be NULL or a live handle; `region_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_register_any(
    n: *const ummunotify_notifier,
    start: usize,
    end: usize,
    cookie: u64,
    region_out: *mut ummunotify_region,
) -> ummunotify_result {
    // SAFETY: (caller) as `register_with` requires.
    unsafe { register_with(n, start..end, cookie, region_out, Notifier::register_any) }
}

/// The body of both registration calls.
///
/// # Safety
/// `n` must be NULL or a live handle; `region_out` NULL or writable.
unsafe fn register_with(
    n: *const ummunotify_notifier,
    range: std::ops::Range<usize>,
    cookie: u64,
    region_out: *mut ummunotify_region,
    register: fn(&Notifier, std::ops::Range<usize>, Cookie) -> core_api::Result<Region>,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        // SAFETY: (caller) NULL or a live handle.
        let Some(h) = (unsafe { handle(n) }) else {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "notifier is NULL");
        };
        match register(h.get(), range, Cookie(cookie)) {
            Ok(r) => {
                // SAFETY: (caller) `region_out` is NULL or writable.
                unsafe { write_region(region_out, h.id, r) };
                UMMUNOTIFY_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Tells the notifier that `[start, end)` was just mapped (`mmap`, the target of `mremap`,
/// `shmat`, `brk` growth): the parts of it inside registered regions' holes are watched from
/// now on. Call it after the mapping call returned, before using the memory. One atomic load
/// while no region has holes (holes come from `ummunotify_notifier_register_any`, and from
/// re-arming a region while some of its pages are unmapped).
///
/// Errors: `UMMUNOTIFY_ERR_FORKED`, `_MONITOR_DEAD`.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_mapped(
    n: *const ummunotify_notifier,
    start: usize,
    end: usize,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let n = notifier_or_null!(n);
        match n.mapped(start..end) {
            Ok(()) => UMMUNOTIFY_OK,
            Err(e) => fail(e),
        }
    })
}

/// # Safety
/// `out` must be NULL or writable.
unsafe fn write_region(out: *mut ummunotify_region, notifier: u32, r: Region) {
    if !out.is_null() {
        let (slot, tag) = r.to_raw();
        // SAFETY: (caller) non-NULL `out` is writable.
        unsafe {
            out.write(ummunotify_region {
                slot,
                notifier,
                tag,
            })
        };
    }
}

/// Unregisters the region named `cookie`; a pending event for it is discarded.
/// `UMMUNOTIFY_ERR_UNKNOWN_COOKIE` if there is none.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_unregister(
    n: *const ummunotify_notifier,
    cookie: u64,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let n = notifier_or_null!(n);
        match n.unregister(Cookie(cookie)) {
            Ok(()) => UMMUNOTIFY_OK,
            Err(e) => fail(e),
        }
    })
}

/// Stores in `*out` a fresh token for the region named `cookie` (take one after reading the
/// region's event: a token taken before an invalidation never reads valid again).
///
/// # Safety
/// `n` must be NULL or a live handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_region(
    n: *const ummunotify_notifier,
    cookie: u64,
    out: *mut ummunotify_region,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        // SAFETY: (caller) NULL or a live handle.
        let Some(h) = (unsafe { handle(n) }) else {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "notifier is NULL");
        };
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        match h.get().region(Cookie(cookie)) {
            Ok(r) => {
                // SAFETY: `out` is non-NULL and (caller) writable.
                unsafe { write_region(out, h.id, r) };
                UMMUNOTIFY_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// The per-region check, O(1): false once any invalidation of the region's pages has returned to
/// its caller in any thread (and in a forked child, after the monitor died, for a NULL notifier).
/// May wait microseconds while the monitor is applying a message.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_is_valid(
    n: *const ummunotify_notifier,
    region: ummunotify_region,
) -> bool {
    guard(false, || {
        // SAFETY: (caller) `n` is NULL or a live handle.
        match unsafe { handle(n) } {
            // Another notifier's token (or an all-zero one) is never valid here.
            Some(h) if h.id == region.notifier => {
                h.get().is_valid(Region::from_raw(region.slot, region.tag))
            }
            _ => false,
        }
    })
}

/// Stores a stable snapshot of the generation counter in `*out` (waits while the monitor is
/// mid-message). `UMMUNOTIFY_ERR_FORKED` / `_MONITOR_DEAD` when no snapshot can be valid.
///
/// # Safety
/// `n` must be NULL or a live handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_generation(
    n: *const ummunotify_notifier,
    out: *mut u64,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let n = notifier_or_null!(n);
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        match n.generation() {
            Ok(g) => {
                // SAFETY: `out` is non-NULL and (caller) writable.
                unsafe { out.write(g.value()) };
                UMMUNOTIFY_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// The global fast path, one load: true iff no invalidation of this notifier's regions was
/// applied since `generation` (from `ummunotify_notifier_generation()` or `*drained`) was taken.
/// The same test C code can do inline with `ummunotify_notifier_counter()`: `*counter ==
/// generation` (see there for the rule on snapshots). Waits microseconds while a message is
/// being applied instead of failing.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_unchanged_since(
    n: *const ummunotify_notifier,
    generation: u64,
) -> bool {
    // SAFETY: (caller) `n` is NULL or a live handle.
    unsafe {
        get_or(n, false, |n| {
            // One load on push backends; a pull backend's probe runs first (bit 61).
            n.unchanged_since(core_api::Generation::from_value(generation))
        })
    }
}

/// The live generation counter word, valid until the notifier is freed (NULL for a NULL
/// notifier). `*counter == g` for a `g` from `ummunotify_notifier_generation()` or from `*drained`
/// of `ummunotify_notifier_read_events()` means nothing changed since; any other value (odd: a
/// message is being applied; bit 63: dead or forked; bit 61: a pull backend, call
/// `ummunotify_notifier_unchanged_since()`) means "check again with
/// `ummunotify_notifier_unchanged_since()`, or read events".
///
/// The rule on snapshots: compare `*counter` only with a `g` from those two calls, never with a
/// value you loaded from `*counter` yourself. The word is not monotonic: the process's one
/// userfaultfd context hands every notifier every message, and a message that hit none of this
/// notifier's regions gives the word back its value from before the message (so other libraries'
/// traffic never fails this check). A value loaded while such a message was applied (odd) can
/// therefore come back after a later invalidation; a `g` from `ummunotify_notifier_generation()`
/// is always a settled value, which no invalidation ever returns to. (The 2010 drop-in's counter,
/// by contrast, never goes down: programs written for the device compare raw loads.)
///
/// Read it with acquire semantics (`__atomic_load_n(p, __ATOMIC_ACQUIRE)`) where the compiler
/// may reorder; the `volatile` qualifier guarantees a fresh load each time.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_counter(
    n: *const ummunotify_notifier,
) -> *const ummunotify_counter_word {
    // SAFETY: (caller) `n` is NULL or a live handle.
    unsafe { get_or(n, std::ptr::null(), |n| n.counter().as_ptr().cast_const()) }
}

/// The backend this notifier runs on, as a static NUL-terminated name: `"uffd"`, `"hooks"`,
/// `"hybrid"`, `"perf"`, `"tracepoint"`, `"ebpf"` or `"kernel"` (what `UMN_BACKEND` chose;
/// `auto` resolves to one of them), as `umn doctor` names them. NULL for a NULL notifier. The string lives as long
/// as the process.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_backend(
    n: *const ummunotify_notifier,
) -> *const std::ffi::c_char {
    // SAFETY: (caller) `n` is NULL or a live handle.
    unsafe { get_or(n, std::ptr::null(), |n| n.backend().c_name().as_ptr()) }
}

/// A file descriptor readable while events are pending (and already while the monitor is taking
/// a message, so `poll(fd, 0)` right after an unmapping call returned sees it): use it with
/// `poll`, `select` or `epoll`, never read it directly. Owned by the notifier (do not close it).
/// -1 for a NULL notifier.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_fd(n: *const ummunotify_notifier) -> c_int {
    // SAFETY: (caller) `n` is NULL or a live handle.
    unsafe { get_or(n, -1, |n| n.as_fd().as_raw_fd()) }
}

/// A memfd whose first 8 bytes are the live counter: `mmap(NULL, 8, PROT_READ, MAP_SHARED, fd,
/// 0)` gives another view of `ummunotify_notifier_counter()` (for example in a helper that only
/// has the fd). Owned by the notifier (do not close it). -1 for a NULL notifier.
///
/// # Safety
/// `n` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_counter_fd(n: *const ummunotify_notifier) -> c_int {
    // SAFETY: (caller) `n` is NULL or a live handle.
    unsafe { get_or(n, -1, |n| n.counter_fd().as_raw_fd()) }
}

/// Moves up to `capacity` pending events into `events` (re-arming their regions) and stores their
/// number in `*count`. If the read drained the queue, `*drained` (when not NULL) receives the
/// generation at that moment (the 2010 ABI's LAST counter): while `*counter` equals it there is
/// nothing to read. Otherwise `*drained` receives `UMMUNOTIFY_GENERATION_NONE`: call again.
/// Never blocks; `events` may be NULL only when `capacity` is 0.
///
/// # Safety
/// `n` must be NULL or a live handle; `events` NULL or `capacity` writable elements; `count`
/// NULL or writable; `drained` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_read_events(
    n: *const ummunotify_notifier,
    events: *mut ummunotify_event,
    capacity: usize,
    count: *mut usize,
    drained: *mut u64,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let n = notifier_or_null!(n);
        if count.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "count is NULL");
        }
        if events.is_null() && capacity > 0 {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "events is NULL");
        }
        // Chunks through a stack buffer: no allocation, and the C array keeps its own layout.
        let mut buf = [Event::default(); 64];
        let mut done = 0usize;
        let last = loop {
            let want = (capacity - done).min(buf.len());
            let r = match n.read_events(&mut buf[..want]) {
                Ok(r) => r,
                Err(e) if done == 0 => return fail(e),
                // Events already moved out must reach the caller: report them, not the error.
                Err(_) => break None,
            };
            for (i, e) in buf[..r.count].iter().enumerate() {
                let out = to_c_event(e);
                // SAFETY: `done + i < capacity` (r.count <= want), and (caller) `events` has
                // `capacity` writable elements.
                unsafe { events.add(done + i).write(out) };
            }
            done += r.count;
            if r.drained.is_some() || done == capacity {
                break r.drained;
            }
        };
        // SAFETY: `count` is non-NULL and (caller) writable; `drained` NULL or writable.
        unsafe {
            count.write(done);
            if !drained.is_null() {
                drained.write(last.map_or(UMMUNOTIFY_GENERATION_NONE, |g| g.value()));
            }
        }
        UMMUNOTIFY_OK
    })
}

/// The first version's size of `ummunotify_notifier_stats` (up to `coverage_segments`).
const NOTIFIER_STATS_V1: usize = std::mem::offset_of!(ummunotify_notifier_stats, removes_confirmed);
const _: () = assert!(std::mem::offset_of!(ummunotify_notifier_stats, size) == 0);

/// Fills `*out` (whose `size` the caller set) with diagnostic counters.
///
/// Errors: `UMMUNOTIFY_ERR_NULL_ARGUMENT`, `UMMUNOTIFY_ERR_INVALID_ARGUMENT` (`out->size` not
/// set).
///
/// # Safety
/// `n` must be NULL or a live handle; `out` NULL or `out->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_notifier_get_stats(
    n: *const ummunotify_notifier,
    out: *mut ummunotify_notifier_stats,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        let n = notifier_or_null!(n);
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        let s = n.stats();
        let stats = ummunotify_notifier_stats {
            size: std::mem::size_of::<ummunotify_notifier_stats>(),
            regions: s.regions as u64,
            messages: s.messages,
            invalidations: s.invalidations,
            events_read: s.events_read,
            pending: s.pending as u64,
            coverage_segments: s.coverage_segments as u64,
            removes_confirmed: s.removes_confirmed,
            removes_by_grace: s.removes_by_grace,
            signals_sent: s.signals_sent,
            signals_handled: s.signals_handled,
        };
        // SAFETY: `out` is non-NULL and (caller) `out->size` writable bytes.
        match unsafe { crate::sized::write(out, &stats, NOTIFIER_STATS_V1) } {
            Ok(()) => UMMUNOTIFY_OK,
            Err(e) => fail_arg(
                UMMUNOTIFY_ERR_INVALID_ARGUMENT,
                &e.message("ummunotify_notifier_stats"),
            ),
        }
    })
}
