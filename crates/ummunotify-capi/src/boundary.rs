//! The panic boundary every exported function runs behind.
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::set_last_error;

/// Runs `f`; if it panics, records the panic as the thread's last error and returns `on_panic`.
///
/// `AssertUnwindSafe` is sound here: a panic never leaves a half-updated object behind that C can
/// reach again through a handle (the core crate's state is behind its own locks and stays
/// consistent across a panic), and the caller only sees `on_panic`.
#[inline(always)] // the hit path of `ummunotify_cache_get` runs inside it
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            set_last_error(format!(
                "internal error (panic caught at the C boundary): {msg}"
            ));
            on_panic
        }
    }
}
