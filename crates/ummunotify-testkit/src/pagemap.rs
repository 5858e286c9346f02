//! The PFN oracle: which physical frame backs a virtual page, from `/proc/self/pagemap`.
//!
//! Root reads real page frame numbers; an unprivileged process reads 0 for every present page.
//! That case is reported as a [`PfnUnavailable`] error rather than a bogus frame number.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

const PAGEMAP: &str = "/proc/self/pagemap";
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;

/// Present pages read with PFN 0: the process lacks `CAP_SYS_ADMIN`, so the oracle is unusable.
///
/// Carried inside an [`io::Error`] of kind [`io::ErrorKind::PermissionDenied`]; test for it with
/// [`is_pfn_unavailable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfnUnavailable;

impl fmt::Display for PfnUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("pagemap reports PFN 0 for a present page (needs CAP_SYS_ADMIN)")
    }
}

impl std::error::Error for PfnUnavailable {}

/// Whether `err` is the [`PfnUnavailable`] error.
pub fn is_pfn_unavailable(err: &io::Error) -> bool {
    err.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<PfnUnavailable>().is_some())
}

/// The system page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// The PFN of the page containing `addr`: `Ok(None)` if no page is present there (never touched,
/// zapped, swapped out or unmapped).
///
/// # Errors
///
/// The OS error if pagemap can not be opened or read, or [`PfnUnavailable`] if it hides PFNs.
pub fn pfn(addr: usize) -> io::Result<Option<u64>> {
    let file = File::open(PAGEMAP)?;
    entry_pfn(&file, addr)
}

/// The PFN of every page overlapping `range`, in order (see [`pfn`]).
///
/// # Errors
///
/// As for [`pfn`].
pub fn pfns(range: Range<usize>) -> io::Result<Vec<Option<u64>>> {
    let file = File::open(PAGEMAP)?;
    let page = page_size();
    let first = range.start / page;
    let end = range.end.div_ceil(page);
    (first..end).map(|p| entry_pfn(&file, p * page)).collect()
}

fn entry_pfn(file: &File, addr: usize) -> io::Result<Option<u64>> {
    let mut raw = [0u8; 8];
    let offset = (addr / page_size()) as u64 * 8;
    file.read_exact_at(&mut raw, offset)?;
    let entry = u64::from_ne_bytes(raw);
    if entry & PRESENT == 0 {
        return Ok(None);
    }
    match entry & PFN_MASK {
        0 => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            PfnUnavailable,
        )),
        frame => Ok(Some(frame)),
    }
}
