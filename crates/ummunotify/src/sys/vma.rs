//! The process's own mappings (VMAs): where they start and end, how many there are, and how
//! many the kernel allows (`vm.max_map_count`). Used by the watch policy (`crate::notifier`):
//! over its VMA budget a region is watched as the whole VMAs it lies in, which splits nothing.
//!
//! Lookups use the `PROCMAP_QUERY` ioctl on `/proc/self/maps` (Linux 6.11+, O(log n) per
//! query) and fall back to reading `/proc/self/maps` where the kernel lacks it: O(VMAs) per call,
//! so no per-miss path may need that fallback (issue 41). Who asks what, and how each is
//! answered without `PROCMAP_QUERY` (docs/architecture/regions.md, "Every VMA lookup"):
//! - the fresh-watch window's "is it shared": the backend first (`Watcher::maybe_shared`:
//!   userfaultfd ioctls, O(log VMAs)), this file's `any_shared` only when that can not tell;
//! - "still mapped after the watch": `covering`, else the backend's probe (`Watcher::covering`,
//!   the same ioctls as `maybe_shared`) or, for one page on userfaultfd, the watch itself, else
//!   `sys::is_mapped` (`msync`, O(pages));
//! - the mapped parts of a range with holes: `for_each_mapped`, page by page up to
//!   `Vmas::PAGE_WALK` pages;
//! - the whole VMAs of a widened watch (`extent`): the file, only past the VMA budget;
//! - the VMA budget's `count`: the file, amortized over 1/64 of the budget's changes.
#![allow(unsafe_code)] // One ioctl with a kernel-defined struct.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;

/// `struct procmap_query` (include/uapi/linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30) | (104 << 16) | ((b'f' as libc::c_ulong) << 8) | 17;
/// Return the VMA covering the address, or the next one after it.
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;
/// `vma_flags`: the mapping is shared (`MAP_SHARED`).
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;

/// A handle on the process's mapping list.
#[derive(Debug)]
pub(crate) struct Vmas {
    maps: File,
    /// Whether `PROCMAP_QUERY` works here (else every lookup reads the whole list).
    query: bool,
}

impl Vmas {
    /// Opens `/proc/self/maps` and probes `PROCMAP_QUERY`.
    pub(crate) fn open() -> io::Result<Vmas> {
        let maps = File::open("/proc/self/maps")?;
        let mut v = Vmas { maps, query: true };
        // A probe on the lowest address: any process has some mapping above it.
        v.query = v.query_at(0).is_ok();
        Ok(v)
    }

    /// Whether `PROCMAP_QUERY` works here (Linux 6.11+, not filtered).
    pub(crate) fn has_query(&self) -> bool {
        self.query
    }

    /// The first VMA ending above `addr` (covering it or after it), if any.
    fn query_at(&self, addr: u64) -> io::Result<Option<(u64, u64)>> {
        Ok(self.query_shared_at(addr)?.map(|(s, e, _)| (s, e)))
    }

    /// As [`query_at`](Self::query_at), with whether the VMA is shared.
    fn query_shared_at(&self, addr: u64) -> io::Result<Option<(u64, u64, bool)>> {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
            query_addr: addr,
            ..ProcmapQuery::default()
        };
        // SAFETY: the ioctl reads and writes exactly one `procmap_query`, whose size it is told;
        // name and build-id buffers are not requested (sizes 0).
        let r = super::timed(super::Call::Query, || unsafe {
            libc::ioctl(self.maps.as_raw_fd(), PROCMAP_QUERY, &mut q)
        });
        if r == 0 {
            let shared = q.vma_flags & PROCMAP_QUERY_VMA_SHARED != 0;
            return Ok(Some((q.vma_start, q.vma_end, shared)));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        }
    }

    /// Every VMA, in address order, from a fresh read of `/proc/self/maps`.
    fn all() -> io::Result<Vec<(u64, u64)>> {
        Ok(Self::all_shared()?
            .into_iter()
            .map(|(s, e, _)| (s, e))
            .collect())
    }

    /// As [`all`](Self::all), with whether each VMA is shared (`s` in its permissions).
    fn all_shared() -> io::Result<Vec<(u64, u64, bool)>> {
        let mut text = String::new();
        File::open("/proc/self/maps")?.read_to_string(&mut text)?;
        Ok(text
            .lines()
            .filter_map(|l| {
                let mut fields = l.split(' ');
                let (s, e) = fields.next()?.split_once('-')?;
                let shared = fields.next()?.as_bytes().get(3) == Some(&b's');
                Some((
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                    shared,
                ))
            })
            .collect())
    }

    /// If one VMA covers all of `[start, end)` now: whether it is shared. `None` when it takes
    /// more than one (or there is a hole), or where `PROCMAP_QUERY` is missing. One ioctl: a
    /// registration's "still mapped after the watch" check and the fresh-watch lookup at once.
    pub(crate) fn covering(&self, start: u64, end: u64) -> io::Result<Option<bool>> {
        if !self.query {
            return Ok(None);
        }
        Ok(match self.query_shared_at(start)? {
            Some((s, e, shared)) if s <= start && end <= e => Some(shared),
            _ => None,
        })
    }

    /// Whether a shared mapping (`MAP_SHARED`) lies in `[start, end)`. Allocates nothing where
    /// `PROCMAP_QUERY` works; reads the whole list where it does not.
    pub(crate) fn any_shared(&self, start: u64, end: u64) -> io::Result<bool> {
        if !self.query {
            return Ok(Self::all_shared()?
                .iter()
                .any(|&(s, e, shared)| shared && s < end && start < e));
        }
        let mut pos = start;
        while pos < end {
            match self.query_shared_at(pos)? {
                Some((s, e, shared)) if s < end => {
                    if shared {
                        return Ok(true);
                    }
                    pos = e;
                }
                _ => break,
            }
        }
        Ok(false)
    }

    /// Ranges of at most this many pages are walked page by page where `PROCMAP_QUERY` is
    /// missing (an `msync` each, about 0.4 µs) rather than by reading all of `/proc/self/maps`.
    pub(crate) const PAGE_WALK: u64 = 256;

    /// Calls `f(s, e)` for each mapped part of `[start, end)` (VMAs clipped to it, in address
    /// order; adjacent VMAs are separate parts, except where `PROCMAP_QUERY` is missing and the
    /// range is small: then mapped runs). Returns whether the parts cover the range (no
    /// hole). No allocation where `PROCMAP_QUERY` works.
    pub(crate) fn for_each_mapped(
        &self,
        start: u64,
        end: u64,
        mut f: impl FnMut(u64, u64),
    ) -> io::Result<bool> {
        let mut pos = start;
        let mut whole = true;
        let mut part = |s: u64, e: u64, pos: &mut u64| {
            let (s, e) = (s.max(*pos), e.min(end));
            if s > *pos {
                whole = false;
            }
            if s < e {
                f(s, e);
            }
            *pos = e.max(*pos);
        };
        if self.query {
            while pos < end {
                match self.query_at(pos)? {
                    Some((s, e)) if s < end => part(s, e, &mut pos),
                    _ => break,
                }
            }
        } else if (end - start) / super::page_size() as u64 <= Self::PAGE_WALK {
            // A small range (a re-arm after an unmap, a `register_any` with a hole): one `msync`
            // per page (`ENOMEM`: not mapped) finds its mapped runs in O(pages), not the whole
            // file per call (issue 41; 500,000 re-arms after one munmap read it 500,000 times).
            // A run may span several VMAs: a watch of it covers them all the same.
            let pg = super::page_size() as u64;
            let mut run: Option<u64> = None;
            let mut at = start & !(pg - 1);
            while at < end {
                let next = (at + pg).min(end);
                let mapped = super::is_mapped(at as usize, next as usize)?;
                match (mapped, run) {
                    (true, None) => run = Some(at),
                    (false, Some(s)) => {
                        part(s, at, &mut pos);
                        run = None;
                    }
                    _ => {}
                }
                at = next;
            }
            if let Some(s) = run {
                part(s, end, &mut pos);
            }
        } else {
            for (s, e) in Self::all()?.into_iter().filter(|&(_, e)| e > start) {
                if pos >= end || s >= end {
                    break;
                }
                part(s, e, &mut pos);
            }
        }
        Ok(whole && pos >= end)
    }

    /// The extent `[first VMA start, last VMA end)` of the VMAs covering `[start, end)`, if
    /// they cover it with no hole; `None` if part of the range is unmapped.
    pub(crate) fn extent(&self, start: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        let mut first = None;
        let mut pos = start;
        if self.query {
            while pos < end {
                match self.query_at(pos)? {
                    Some((s, e)) if s <= pos => {
                        first.get_or_insert(s);
                        pos = e;
                    }
                    _ => return Ok(None),
                }
            }
        } else {
            for (s, e) in Self::all()?.into_iter().filter(|&(_, e)| e > start) {
                if pos >= end {
                    break;
                }
                if s > pos {
                    return Ok(None);
                }
                first.get_or_insert(s);
                pos = e;
            }
            if pos < end {
                return Ok(None);
            }
        }
        Ok(first.map(|s| (s, pos)))
    }
}

/// How many VMAs the process has now (lines of `/proc/self/maps`).
///
/// Streams the file through a stack buffer: with tens of thousands of VMAs the text is megabytes,
/// and a buffer that size, freed, would stay in the allocator (and in RSS).
pub(crate) fn count() -> io::Result<usize> {
    let mut f = File::open("/proc/self/maps")?;
    let mut buf = [0u8; 16 * 1024];
    let mut lines = 0;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(lines),
            Ok(n) => lines += buf[..n].iter().filter(|&&b| b == b'\n').count(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `vm.max_map_count`, or the kernel's default (65,530) if it can not be read.
pub(crate) fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(65_530)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both lookups tell a shared mapping from a private one next to it.
    #[test]
    fn shared_mappings_are_told_apart() {
        let pg = 4096u64;
        let map = |flags| -> u64 {
            // SAFETY: a fresh mapping at an address the kernel picks; only this test uses it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    (2 * pg) as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            p as u64
        };
        let private = map(libc::MAP_PRIVATE);
        let shared = map(libc::MAP_SHARED);
        let mut v = Vmas::open().unwrap();
        for query in [v.query, false] {
            v.query = query;
            assert!(!v.any_shared(private, private + 2 * pg).unwrap());
            assert!(v.any_shared(shared, shared + 2 * pg).unwrap());
            assert!(v.any_shared(shared + pg, shared + pg + 1).unwrap());
        }
        if v.query {
            v.query = true;
            assert_eq!(v.covering(private, private + 2 * pg).unwrap(), Some(false));
            assert_eq!(v.covering(shared, shared + pg).unwrap(), Some(true));
        }
        for p in [private, shared] {
            // SAFETY: our own mappings.
            unsafe { libc::munmap(p as *mut libc::c_void, (2 * pg) as usize) };
        }
    }

    /// `PROCMAP_QUERY` and the fallback agree on a real mapping split in three.
    #[test]
    fn extent_of_a_split_mapping() {
        let pg = 4096u64;
        // SAFETY: a fresh private mapping; only this test touches it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                (5 * pg) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as u64;
        // Inaccessible pages at both ends: a neighbour the kernel happens to place next to it
        // (another test's mapping) can not merge with the three pages under test.
        for guard in [base, base + 4 * pg] {
            // SAFETY: changes the protection of a page of our own mapping.
            unsafe { libc::mprotect(guard as *mut libc::c_void, pg as usize, libc::PROT_NONE) };
        }
        let p = base + pg;
        // SAFETY: changes the protection of the middle page of our own mapping (a split).
        unsafe { libc::mprotect((p + pg) as *mut libc::c_void, pg as usize, libc::PROT_READ) };
        let mut v = Vmas::open().unwrap();
        eprintln!("PROCMAP_QUERY works here: {}", v.query);
        for query in [v.query, false] {
            v.query = query;
            assert_eq!(
                v.extent(p + pg, p + 2 * pg).unwrap(),
                Some((p + pg, p + 2 * pg))
            );
            assert_eq!(v.extent(p, p + 3 * pg).unwrap(), Some((p, p + 3 * pg)));
            assert_eq!(v.extent(p + 10, p + 20).unwrap(), Some((p, p + pg)));
        }
        // SAFETY: unmaps the last page: now a hole.
        unsafe { libc::munmap((p + 2 * pg) as *mut libc::c_void, pg as usize) };
        for query in [true, false] {
            v.query = query && Vmas::open().unwrap().query;
            assert_eq!(v.extent(p, p + 3 * pg).unwrap(), None);
        }
        for query in [true, false] {
            v.query = query && Vmas::open().unwrap().query;
            let mut parts = Vec::new();
            let whole = v
                .for_each_mapped(p + 10, p + 3 * pg, |s, e| parts.push((s, e)))
                .unwrap();
            assert!(!whole);
            if v.query {
                assert_eq!(parts, [(p + 10, p + pg), (p + pg, p + 2 * pg)]);
            } else {
                // Without PROCMAP_QUERY a small range is walked page by page: mapped runs.
                assert_eq!(parts, [(p + 10, p + 2 * pg)]);
            }
            parts.clear();
            assert!(v
                .for_each_mapped(p, p + 2 * pg, |s, e| parts.push((s, e)))
                .unwrap());
            if v.query {
                assert_eq!(parts, [(p, p + pg), (p + pg, p + 2 * pg)]);
            } else {
                assert_eq!(parts, [(p, p + 2 * pg)]);
            }
            parts.clear();
            // Wholly unmapped: no part, not whole.
            assert!(!v
                .for_each_mapped(p + 2 * pg, p + 3 * pg, |s, e| parts.push((s, e)))
                .unwrap());
            assert!(parts.is_empty());
        }
        // SAFETY: our own mapping.
        unsafe { libc::munmap(base as *mut libc::c_void, (5 * pg) as usize) };
        assert!(count().unwrap() > 3);
        assert!(max_map_count() > 1000);
    }
}
