//! [`MlockRegistrar`]: `mlock(2)` / `munlock(2)`.
#![allow(unsafe_code)] // mlock and munlock take raw addresses.

use std::io;
use std::ops::Range;

use super::Registrar;

/// Locks cached ranges in memory with `mlock(2)`; deregistering calls `munlock(2)`.
///
/// `mlock` does not nest: `munlock` of one range unlocks every page in it, even pages another
/// cached range also locked. The cache keeps its live regions disjoint, but a region replaced
/// (merged or invalidated) while a handle held it overlaps its successor until the handle drops.
/// Use this registrar for measurements and for memory that must not be swapped out, not as a
/// page-exact pin (use [`IoUringRegistrar`](super::IoUringRegistrar) for that).
#[derive(Debug, Default, Clone, Copy)]
pub struct MlockRegistrar;

impl Registrar for MlockRegistrar {
    type Key = ();

    fn register(&self, range: Range<usize>) -> io::Result<()> {
        // SAFETY: mlock only changes page residency; it reads and writes no memory of ours and
        // fails with ENOMEM for unmapped addresses.
        if unsafe { libc::mlock(range.start as *const libc::c_void, range.len()) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn deregister(&self, _key: &(), range: Range<usize>) -> io::Result<()> {
        // SAFETY: as for mlock; the range may be unmapped by now (ENOMEM, harmless).
        if unsafe { libc::munlock(range.start as *const libc::c_void, range.len()) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
