//! A ready-made registrar for RDMA verbs: `ibv_reg_mr` / `ibv_dereg_mr` through libibverbs,
//! loaded at run time (nothing links rdma-core).
use std::cell::RefCell;
use std::ffi::{c_int, c_void};

use core_api::registrar::{Access, MemoryRegion, VerbsError, VerbsRegistrar};

use crate::boundary::guard;
use crate::cache::ummunotify_registrar;
use crate::error::{fail_arg, ummunotify_result, ummunotify_result::*};

/// libibverbs' protection domain (`struct ibv_pd` of `<infiniband/verbs.h>`), opaque here: the
/// header only declares it, so it works with or without `<infiniband/verbs.h>` included.
pub struct ibv_pd {
    _private: [u8; 0],
}

thread_local! {
    /// The message of the verbs call that failed in this thread's last register callback, for
    /// the cache's error (the callback itself can only return an errno).
    static DETAIL: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Takes the message a failing verbs callback left in this thread, if any.
pub(crate) fn take_detail() -> Option<String> {
    DETAIL.try_with(|d| d.borrow_mut().take()).ok().flatten()
}

/// Clears it (before a callback runs).
pub(crate) fn clear_detail() {
    let _ = DETAIL.try_with(|d| d.borrow_mut().take());
}

fn errno_of(e: &VerbsError) -> c_int {
    match e {
        VerbsError::Call { error, .. } => error.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

unsafe extern "C" fn verbs_register(
    ctx: *mut c_void,
    start: usize,
    len: usize,
    key_out: *mut u64,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: `ctx` is the boxed registrar of `ummunotify_verbs_registrar_new`, alive until
        // `_free`, which the caller calls after `ummunotify_cache_free`.
        let verbs = unsafe { &*ctx.cast::<VerbsRegistrar>() };
        match verbs.reg_mr(start..start + len) {
            Ok(mr) => {
                // SAFETY: (cache) `key_out` is writable.
                unsafe { key_out.write(mr.into_raw() as u64) };
                0
            }
            Err(e) => {
                let errno = errno_of(&e);
                let _ = DETAIL.try_with(|d| *d.borrow_mut() = Some(e.to_string()));
                errno
            }
        }
    })
}

unsafe extern "C" fn verbs_deregister(
    ctx: *mut c_void,
    _start: usize,
    _len: usize,
    key: u64,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: as in `verbs_register`.
        let verbs = unsafe { &*ctx.cast::<VerbsRegistrar>() };
        // SAFETY: the cache passes each key `verbs_register` made exactly once.
        match unsafe { MemoryRegion::from_raw(key as usize as *mut c_void) } {
            Some(mr) => match verbs.dereg_mr(mr) {
                Ok(()) => 0,
                Err(e) => errno_of(&e),
            },
            None => libc::EINVAL,
        }
    })
}

/// Fills `*out` with a registrar for `ummunotify_cache_new()` that registers each cached range
/// as an RDMA memory region in the protection domain `pd`: `ibv_reg_mr(pd, addr, len, access)`
/// on a miss, `ibv_dereg_mr` once the range left the cache and no handle holds it. `access` is
/// a set of `IBV_ACCESS_*` flags (e.g. `IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ`).
///
/// A handle's key is the `struct ibv_mr *`:
///
/// ```c
/// ummunotify_registrar reg;
/// if (ummunotify_verbs_registrar_new(pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &reg))
///     return -1;                                           // ummunotify_last_error() says why
/// ummunotify_cache *cache;
/// ummunotify_cache_new(&reg, NULL, &cache);
/// ummunotify_cache_handle h;
/// ummunotify_cache_get(cache, (uintptr_t)buf, len, &h);   // miss: ibv_reg_mr
/// struct ibv_mr *mr = (struct ibv_mr *)(uintptr_t)ummunotify_cache_handle_key(&h);
/// // sge.lkey = mr->lkey; send mr->rkey to the peer; ... post, poll ...
/// ummunotify_cache_put(&h);
/// ummunotify_cache_free(cache);                            // ibv_dereg_mr of what is left
/// ummunotify_verbs_registrar_free(&reg);
/// ```
///
/// libibverbs (`libibverbs.so.1`) is loaded at the first call, never linked: it is the same
/// library the program uses, so `pd` may come from the program's own verbs calls. A failing
/// `ibv_reg_mr` makes `ummunotify_cache_get()` return `UMMUNOTIFY_ERR_REGISTER`, with the call,
/// its arguments and errno in `ummunotify_last_error()`.
///
/// Errors: `UMMUNOTIFY_ERR_NULL_ARGUMENT` (`pd` or `out`), `UMMUNOTIFY_ERR_VERBS_UNAVAILABLE`
/// (libibverbs could not be loaded; `ummunotify_last_error()` has the loader's message).
///
/// # Safety
/// `pd` must be NULL or a live `struct ibv_pd *` that outlives the cache; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_verbs_registrar_new(
    pd: *mut ibv_pd,
    access: c_int,
    out: *mut ummunotify_registrar,
) -> ummunotify_result {
    guard(UMMUNOTIFY_ERR_PANIC, || {
        if out.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "out is NULL");
        }
        if pd.is_null() {
            return fail_arg(UMMUNOTIFY_ERR_NULL_ARGUMENT, "pd is NULL");
        }
        let access = Access::from_bits_retain(access as u32);
        // SAFETY: (caller) a live protection domain that outlives the cache.
        match unsafe { VerbsRegistrar::from_pd(pd.cast(), access) } {
            Ok(verbs) => {
                let r = ummunotify_registrar {
                    register_fn: Some(verbs_register),
                    deregister_fn: Some(verbs_deregister),
                    ctx: Box::into_raw(Box::new(verbs)).cast(),
                    max_len: 0,
                    max_registrations: 0,
                };
                // SAFETY: (caller) `out` is writable.
                unsafe { out.write(r) };
                UMMUNOTIFY_OK
            }
            Err(e @ VerbsError::Unavailable { .. }) => {
                fail_arg(UMMUNOTIFY_ERR_VERBS_UNAVAILABLE, &e.to_string())
            }
            Err(e) => fail_arg(UMMUNOTIFY_ERR_INVALID_ARGUMENT, &e.to_string()),
        }
    })
}

/// Releases a registrar from `ummunotify_verbs_registrar_new()` (after `ummunotify_cache_free()`
/// of every cache made with it) and clears `*r`. NULL, or a registrar already released, is a
/// no-op. The protection domain stays the caller's.
///
/// # Safety
/// `r` must be NULL or point to a registrar filled by `ummunotify_verbs_registrar_new()` (or
/// cleared by this call), whose caches are all freed.
#[no_mangle]
pub unsafe extern "C" fn ummunotify_verbs_registrar_free(r: *mut ummunotify_registrar) {
    guard((), || {
        // SAFETY: (caller) NULL or a registrar.
        let Some(r) = (unsafe { r.as_mut() }) else {
            return;
        };
        let ours = r.register_fn.map(|f| f as *const ()) == Some(verbs_register as *const ());
        if !ours || r.ctx.is_null() {
            return;
        }
        // SAFETY: `ctx` is the box `_new` made (the callback says whose registrar this is), not
        // yet released (released ones are cleared below).
        drop(unsafe { Box::from_raw(r.ctx.cast::<VerbsRegistrar>()) });
        r.ctx = std::ptr::null_mut();
        r.register_fn = None;
        r.deregister_fn = None;
    })
}
