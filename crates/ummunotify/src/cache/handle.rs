//! [`Handle`]: a use of a cached registration, one word that says how it keeps its entry alive
//! (a hazard slot of the calling thread, or the entry's shared count).
#![allow(unsafe_code)] // The word is a raw pointer: a hazard slot's or a tagged entry's.

use std::fmt;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{Relaxed, Release};

use super::entry::Entry;
use super::Cache;
use crate::registrar::Registrar;

/// A use of a cached registration; dropping it releases the use.
///
/// While a handle exists its registration stays registered, even if the region is invalidated or
/// evicted meanwhile (the device may still be using it). [`is_valid`](Self::is_valid) says whether
/// the memory still is what was registered.
pub struct Handle<'c, R: Registrar> {
    /// How the handle keeps its entry alive, in one word: the address of the hazard slot that
    /// names the entry (bit 0 clear), or the entry's own address with bit 0 set when the handle
    /// holds it through the entry's shared count. Two words in all, so that moving a handle out
    /// of a `Result` is two plain moves (a wider handle was copied with a 16-byte load spanning
    /// two 8-byte stores, which stalls store forwarding: most of a hit's cost).
    hold: NonNull<()>,
    cache: &'c Cache<R>,
}

/// Bit 0 of [`Handle::hold`]: held through the entry's shared count.
const SHARED_HOLD: usize = 1;

// SAFETY: a handle is a shared reference to an entry (kept alive by its hazard or shared hold)
// plus atomics; `R::Key: Send + Sync` by the `Registrar` contract.
unsafe impl<R: Registrar> Send for Handle<'_, R> {}
// SAFETY: as above; every method takes `&self` and only reads.
unsafe impl<R: Registrar> Sync for Handle<'_, R> {}

impl<'c, R: Registrar> Handle<'c, R> {
    /// A handle held by `hazard` (which names the entry).
    #[inline(always)]
    pub(super) fn by_hazard(cache: &'c Cache<R>, hazard: &'c AtomicPtr<()>) -> Self {
        Handle {
            hold: NonNull::from(hazard).cast(),
            cache,
        }
    }

    /// A handle held through `entry`'s shared count (already raised).
    #[inline]
    pub(super) fn by_shared_count(cache: &'c Cache<R>, entry: *const Entry<R::Key>) -> Self {
        let tagged = (entry as usize | SHARED_HOLD) as *mut ();
        Handle {
            // An Arc's pointer, tagged: never null.
            hold: NonNull::new(tagged).expect("entry pointer is never null"),
            cache,
        }
    }

    #[inline]
    pub(super) fn entry_ptr(&self) -> *const Entry<R::Key> {
        let w = self.hold.as_ptr() as usize;
        if w & SHARED_HOLD != 0 {
            (w & !SHARED_HOLD) as *const Entry<R::Key>
        } else {
            // SAFETY: an untagged hold is the address of a hazard slot of the cache's thread
            // slots (alive as long as the cache); it names this handle's entry until the handle
            // clears it in `drop` (only the slot's owner sets it, and only while it is null).
            unsafe { (*self.hold.as_ptr().cast::<AtomicPtr<()>>()).load(Relaxed) }.cast()
        }
    }

    #[inline]
    pub(super) fn entry(&self) -> &Entry<R::Key> {
        // SAFETY: the entry is freed only after no hazard slot and no shared hold names it (see
        // `Cache::reclaim`); this handle's hold is one of those until it drops.
        unsafe { &*self.entry_ptr() }
    }

    /// The device key of the registration (io_uring: the fixed-buffer slot).
    pub fn key(&self) -> &R::Key {
        &self.entry().key
    }

    /// The registered range (page-aligned; covers the range passed to `get`).
    pub fn range(&self) -> Range<usize> {
        self.entry().range()
    }

    /// Whether the memory behind the registration is unchanged since it was registered (two
    /// loads). False once a change of its pages returned to its caller, in any thread: I/O
    /// through this handle would then use the *old* pages.
    pub fn is_valid(&self) -> bool {
        self.cache.notifier.is_valid(self.entry().token)
    }
}

impl<R: Registrar> Drop for Handle<'_, R> {
    fn drop(&mut self) {
        // Release: every use of the registration happens before the reclaimer (which loads
        // hazards and shared counts with Acquire) deregisters it.
        if self.hold.as_ptr() as usize & SHARED_HOLD != 0 {
            self.entry().shared_holds.fetch_sub(1, Release);
        } else {
            // SAFETY: an untagged hold is a hazard slot of the cache (see `entry_ptr`).
            unsafe { &*self.hold.as_ptr().cast::<AtomicPtr<()>>() }
                .store(std::ptr::null_mut(), Release);
        }
    }
}

impl<R: Registrar> fmt::Debug for Handle<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("range", &self.range())
            .field("cookie", &self.entry().cookie)
            .finish_non_exhaustive()
    }
}
