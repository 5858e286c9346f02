//! Raw memory helpers for the scenarios: anonymous mappings, filling, reading, and the set of
//! address spans a case owns.

use std::io;
use std::ops::Range;

/// Maps `len` bytes of private anonymous memory with `prot`; at exactly `at` if given
/// (`MAP_FIXED_NOREPLACE`: fails with `EEXIST` rather than replacing someone else's mapping).
pub(super) fn map_anon(at: Option<usize>, len: usize, prot: libc::c_int) -> io::Result<usize> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if at.is_some() {
        flags |= libc::MAP_FIXED_NOREPLACE;
    }
    let hint = at.unwrap_or(0) as *mut libc::c_void;
    // SAFETY: without MAP_FIXED the kernel never replaces an existing mapping.
    let p = unsafe { libc::mmap(hint, len, prot, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    if at.is_some_and(|a| a != p as usize) {
        // Kernels before 4.17 treat NOREPLACE as a hint; do not keep a misplaced mapping.
        // SAFETY: p..p+len was mapped just now by this function and nothing else uses it.
        unsafe { libc::munmap(p, len) };
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    Ok(p as usize)
}

/// Read-write anonymous memory, anywhere.
pub(super) fn map_rw(len: usize) -> io::Result<usize> {
    map_anon(None, len, libc::PROT_READ | libc::PROT_WRITE)
}

/// Unmaps `range`, ignoring errors (cleanup path).
pub(super) fn unmap(range: &Range<usize>) {
    // SAFETY: callers pass only spans this case mapped and still owns.
    unsafe { libc::munmap(range.start as *mut libc::c_void, range.len()) };
}

/// Writes `byte` over `range`.
///
/// The caller must only pass spans this case owns that are mapped read-write.
pub(super) fn fill(range: &Range<usize>, byte: u8) {
    // SAFETY: per the contract above, the span is mapped writable and no Rust reference into it
    // exists (the memory is reached only through raw addresses).
    unsafe { std::ptr::write_bytes(range.start as *mut u8, byte, range.len()) };
}

/// Copies `range` out of memory.
///
/// The caller must only pass spans this case owns that are mapped readable.
pub(super) fn read(range: &Range<usize>) -> Vec<u8> {
    let mut out = vec![0; range.len()];
    // SAFETY: per the contract above the span is mapped readable; `out` is a distinct allocation
    // of the same length.
    unsafe { std::ptr::copy_nonoverlapping(range.start as *const u8, out.as_mut_ptr(), out.len()) };
    out
}

/// Converts a C-style return value (`-1` = error in `errno`) to a result.
pub(super) fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The address spans a case has mapped and must unmap at cleanup.
#[derive(Debug, Default)]
pub(super) struct Owned(Vec<Range<usize>>);

impl Owned {
    /// Records a span the case mapped.
    pub(super) fn add(&mut self, span: Range<usize>) {
        self.0.push(span);
    }

    /// Forgets `cut` (the kernel unmapped it), splitting spans as needed.
    pub(super) fn remove(&mut self, cut: &Range<usize>) {
        let mut kept = Vec::with_capacity(self.0.len() + 1);
        for span in self.0.drain(..) {
            if span.end <= cut.start || cut.end <= span.start {
                kept.push(span);
                continue;
            }
            if span.start < cut.start {
                kept.push(span.start..cut.start);
            }
            if cut.end < span.end {
                kept.push(cut.end..span.end);
            }
        }
        self.0 = kept;
    }

    /// Unmaps every span still owned.
    pub(super) fn unmap_all(&mut self) {
        for span in self.0.drain(..) {
            unmap(&span);
        }
    }
}
