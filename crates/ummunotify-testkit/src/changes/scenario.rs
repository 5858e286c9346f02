//! Per-kind setup, the change itself, the x == y refill, and cleanup.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use super::mapping::{check, fill, map_anon, map_rw, Owned};
use super::{
    ChangeKind, MADV_DONTNEED_LOCKED, MREMAP_DONTUNMAP, SYS_PIDFD_OPEN, SYS_PROCESS_MADVISE,
};
use crate::pagemap::page_size;
use crate::require::MissingFeature;
use crate::uring::UringMadvise;

/// Content before the change.
pub(super) const OLD_BYTE: u8 = b'A';
/// Content put at the old address after the change (x == y).
pub(super) const NEW_BYTE: u8 = b'B';
/// Size of the malloc block of [`ChangeKind::FreeMallocBlock`]: above glibc's largest dynamic
/// mmap threshold (32 MiB on 64-bit), so `malloc` always `mmap`s it and `free` always unmaps it.
const MALLOC_BLOCK: usize = 40 << 20;
/// glibc's chunk header bit for "this chunk was mmapped".
const CHUNK_IS_MMAPPED: usize = 0x2;

/// The program break a [`ChangeKind::BrkShrink`] case moved.
#[derive(Debug)]
struct Brk {
    /// The break before the case.
    original: usize,
    /// Where the case believes the break is now.
    top: usize,
}

/// One case's memory: what is watched, what it expects, and everything to release.
#[derive(Debug)]
pub(super) struct Scenario {
    kind: ChangeKind,
    /// The watched (and pinned) range.
    pub(super) range: Range<usize>,
    /// The event hint a correct watcher reports: the changed range clipped to `range`.
    pub(super) expected: Option<Range<usize>>,
    /// Remarks for the report.
    pub(super) notes: Vec<String>,
    owned: Owned,
    /// Spans the change unmapped and the refill maps again.
    unmapped: Vec<Range<usize>>,
    /// Destination of the mremap kinds.
    dest: usize,
    /// Extent of the mapping the change works on (for the whole-mapping calls).
    mapping: Range<usize>,
    file: Option<File>,
    file_path: Option<PathBuf>,
    pidfd: Option<OwnedFd>,
    uring: Option<UringMadvise>,
    malloc_block: Option<usize>,
    brk: Option<Brk>,
}

fn pages(n: usize) -> usize {
    n * page_size()
}

fn rw() -> libc::c_int {
    libc::PROT_READ | libc::PROT_WRITE
}

/// Maps `len` bytes of `fd` shared, read-write.
fn map_shared(fd: &impl AsRawFd, len: usize) -> io::Result<usize> {
    // SAFETY: no fixed address, so no existing mapping is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            rw(),
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

/// A `len`-byte regular file in `/tmp`, and its path.
fn tmp_file(len: usize) -> io::Result<(File, PathBuf)> {
    let mut template = *b"/tmp/umn-testkit-map-XXXXXX\0";
    // SAFETY: template is a writable NUL-terminated buffer ending in XXXXXX.
    let fd = unsafe { libc::mkstemp(template.as_mut_ptr().cast()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: mkstemp returned a fresh descriptor owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    let path: PathBuf = CStr::from_bytes_until_nul(&template)
        .map_err(io::Error::other)?
        .to_str()
        .map_err(io::Error::other)?
        .into();
    if let Err(e) = file.set_len(len as u64) {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok((file, path))
}

/// Maps an EINVAL/ENOSYS/EOPNOTSUPP from a newer interface to a [`MissingFeature`].
fn feature(e: io::Error, name: &str) -> io::Error {
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => MissingFeature::error(name, e),
        _ => e,
    }
}

fn sbrk(increment: isize) -> io::Result<usize> {
    // SAFETY: only BrkShrink calls this, in a process that runs nothing else (see
    // ChangeKind::needs_own_process), after checking the break is where the case left it.
    let p = unsafe { libc::sbrk(increment) };
    if p as isize == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

impl Scenario {
    fn new(kind: ChangeKind, mapping: Range<usize>, range: Range<usize>) -> Self {
        let mut owned = Owned::default();
        owned.add(mapping.clone());
        Scenario {
            kind,
            expected: Some(range.clone()),
            range,
            notes: Vec::new(),
            owned,
            unmapped: Vec::new(),
            dest: 0,
            mapping,
            file: None,
            file_path: None,
            pidfd: None,
            uring: None,
            malloc_block: None,
            brk: None,
        }
    }

    /// Sets up the memory for `kind` and fills it with [`OLD_BYTE`].
    pub(super) fn setup(kind: ChangeKind) -> io::Result<Scenario> {
        let four = pages(4);
        let mut sc = match kind {
            ChangeKind::MremapShrink => {
                let base = map_rw(pages(8))?;
                let mut sc = Scenario::new(kind, base..base + pages(8), base..base + pages(8));
                sc.expected = Some(base + four..base + pages(8));
                sc
            }
            ChangeKind::PartialOverlap | ChangeKind::UntouchedNeighbour => {
                let base = map_rw(pages(12))?;
                let mut sc = Scenario::new(
                    kind,
                    base..base + pages(12),
                    base + pages(2)..base + pages(6),
                );
                sc.expected = match kind {
                    ChangeKind::PartialOverlap => Some(base + four..base + pages(6)),
                    _ => None,
                };
                sc
            }
            ChangeKind::MadvRemoveShmem => {
                // SAFETY: the name is a NUL-terminated literal.
                let fd = unsafe { libc::memfd_create(c"umn-testkit".as_ptr(), libc::MFD_CLOEXEC) };
                check(fd.into()).map_err(|e| feature(e, "memfd_create"))?;
                // SAFETY: memfd_create returned a fresh descriptor owned by nobody else.
                let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                file.set_len(four as u64)?;
                let base = map_shared(&file, four)?;
                let mut sc = Scenario::new(kind, base..base + four, base..base + four);
                sc.file = Some(file);
                sc
            }
            ChangeKind::FileBacked => {
                let (file, path) = tmp_file(four)?;
                let base = match map_shared(&file, four) {
                    Ok(base) => base,
                    Err(e) => {
                        let _ = std::fs::remove_file(&path);
                        return Err(e);
                    }
                };
                let mut sc = Scenario::new(kind, base..base + four, base..base + four);
                sc.file = Some(file);
                sc.file_path = Some(path);
                sc
            }
            ChangeKind::FreeMallocBlock => {
                // SAFETY: plain allocation; freed exactly once, by the change or by cleanup.
                let block = unsafe { libc::malloc(MALLOC_BLOCK) } as usize;
                if block == 0 {
                    return Err(io::Error::from(io::ErrorKind::OutOfMemory));
                }
                // SAFETY: glibc keeps the chunk size word right before the user pointer.
                let size_word = unsafe { *(block as *const usize).sub(1) };
                let first = (block.div_ceil(page_size()) + 1) * page_size();
                let mut sc = Scenario::new(kind, 0..0, first..first + four);
                sc.owned = Owned::default();
                sc.malloc_block = Some(block);
                if size_word & CHUNK_IS_MMAPPED == 0 {
                    sc.notes
                        .push("malloc did not mmap the block (not glibc?)".into());
                }
                sc
            }
            ChangeKind::BrkShrink => {
                let original = sbrk(0)?;
                let start = original.next_multiple_of(page_size());
                sbrk((start - original + four) as isize)?;
                let mut sc = Scenario::new(kind, 0..0, start..start + four);
                sc.owned = Owned::default();
                sc.brk = Some(Brk {
                    original,
                    top: start + four,
                });
                sc
            }
            _ => {
                let base = map_rw(four)?;
                Scenario::new(kind, base..base + four, base..base + four)
            }
        };
        if sc.mapping.is_empty() {
            fill(&sc.range.clone(), OLD_BYTE);
        } else {
            fill(&sc.mapping.clone(), OLD_BYTE);
        }
        if let Err(e) = sc.prepare() {
            sc.cleanup();
            return Err(e);
        }
        Ok(sc)
    }

    /// Per-kind preparation that is not the change itself (so the change stays one call).
    fn prepare(&mut self) -> io::Result<()> {
        let len = self.range.len();
        match self.kind {
            ChangeKind::MremapMove | ChangeKind::MremapDontunmap => {
                self.dest = map_anon(None, len, libc::PROT_NONE)?;
                self.owned.add(self.dest..self.dest + len);
            }
            ChangeKind::MadvDontneedLocked => {
                // SAFETY: mlock only changes residency of our own mapping.
                let r = unsafe { libc::mlock(self.range.start as *const libc::c_void, len) };
                check(r.into())?;
            }
            ChangeKind::ProcessMadvise => {
                // SAFETY: pidfd_open takes a pid and flags; no memory is passed.
                let fd = unsafe { libc::syscall(SYS_PIDFD_OPEN, libc::getpid(), 0) };
                let fd = check(fd).map_err(|e| feature(e, "pidfd_open"))?;
                let fd = i32::try_from(fd).map_err(io::Error::other)?;
                // SAFETY: pidfd_open returned a fresh descriptor owned by nobody else.
                self.pidfd = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            ChangeKind::UringMadvise => self.uring = Some(UringMadvise::new()?),
            _ => {}
        }
        Ok(())
    }

    /// Applies the change: exactly one call of the kind.
    pub(super) fn apply(&mut self) -> io::Result<()> {
        let addr = self.range.start;
        let ptr = addr as *mut libc::c_void;
        let len = self.range.len();
        let page = page_size();
        match self.kind {
            ChangeKind::LibcMunmap | ChangeKind::FileBacked => {
                // SAFETY: the range is this case's own mapping; nothing references it.
                check(unsafe { libc::munmap(ptr, len) }.into())?;
                self.lost(self.range.clone());
            }
            ChangeKind::SyscallMunmap => {
                // SAFETY: as for munmap above, bypassing libc on purpose.
                check(unsafe { libc::syscall(libc::SYS_munmap, addr, len) })?;
                self.lost(self.range.clone());
            }
            ChangeKind::MmapFixedOver => {
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                // SAFETY: MAP_FIXED replaces only this case's own mapping.
                let p = unsafe { libc::mmap(ptr, len, rw(), flags, -1, 0) };
                if p == libc::MAP_FAILED {
                    return Err(io::Error::last_os_error());
                }
            }
            ChangeKind::MremapMove | ChangeKind::MremapDontunmap => {
                let mut flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
                if self.kind == ChangeKind::MremapDontunmap {
                    flags |= MREMAP_DONTUNMAP;
                }
                let dest = self.dest as *mut libc::c_void;
                // SAFETY: moves our own mapping onto our own reserved destination.
                let p = unsafe { libc::mremap(ptr, len, len, flags, dest) };
                if p == libc::MAP_FAILED {
                    let e = io::Error::last_os_error();
                    return Err(match self.kind {
                        ChangeKind::MremapDontunmap => feature(e, "MREMAP_DONTUNMAP"),
                        _ => e,
                    });
                }
                if self.kind == ChangeKind::MremapMove {
                    self.lost(self.range.clone());
                }
            }
            ChangeKind::MremapShrink => {
                // SAFETY: shrinks our own mapping in place.
                let p = unsafe { libc::mremap(ptr, len, pages(4), 0) };
                if p == libc::MAP_FAILED {
                    return Err(io::Error::last_os_error());
                }
                self.lost(addr + pages(4)..self.range.end);
            }
            ChangeKind::MadvDontneed => self.madvise(libc::MADV_DONTNEED, "MADV_DONTNEED")?,
            ChangeKind::MadvFree => self.madvise(libc::MADV_FREE, "MADV_FREE")?,
            ChangeKind::MadvDontneedLocked => {
                self.madvise(MADV_DONTNEED_LOCKED, "MADV_DONTNEED_LOCKED")?;
            }
            ChangeKind::MadvRemoveShmem => self.madvise(libc::MADV_REMOVE, "MADV_REMOVE")?,
            ChangeKind::BrkShrink => {
                self.check_brk()?;
                sbrk(-(len as isize))?;
                if let Some(brk) = &mut self.brk {
                    brk.top -= len;
                }
            }
            ChangeKind::ProcessMadvise => {
                let pidfd = self.pidfd.as_ref().map_or(-1, AsRawFd::as_raw_fd);
                let iov = libc::iovec {
                    iov_base: ptr,
                    iov_len: len,
                };
                // SAFETY: iov is a valid iovec array of length 1 for the duration of the call.
                let r = unsafe {
                    libc::syscall(SYS_PROCESS_MADVISE, pidfd, &iov, 1, libc::MADV_DONTNEED, 0)
                };
                check(r).map_err(|e| feature(e, "process_madvise(MADV_DONTNEED)"))?;
            }
            ChangeKind::UringMadvise => {
                let uring = self
                    .uring
                    .as_mut()
                    .ok_or_else(|| io::Error::other("no ring"))?;
                uring.madvise(addr, len, libc::MADV_DONTNEED)?;
            }
            ChangeKind::FreeMallocBlock => {
                if let Some(block) = self.malloc_block.take() {
                    // SAFETY: the block came from malloc and is freed exactly once (taken here).
                    unsafe { libc::free(block as *mut libc::c_void) };
                    self.unmapped.push(self.range.clone());
                }
            }
            ChangeKind::PartialOverlap => {
                let cut = self.mapping.start + pages(4)..self.mapping.start + pages(10);
                // SAFETY: unmaps part of this case's own mapping.
                check(unsafe { libc::munmap(cut.start as *mut libc::c_void, cut.len()) }.into())?;
                self.lost(cut);
            }
            ChangeKind::UntouchedNeighbour => {
                let cut = self.range.end..self.range.end + 2 * page;
                // SAFETY: unmaps part of this case's own mapping, outside the watched range.
                check(unsafe { libc::munmap(cut.start as *mut libc::c_void, cut.len()) }.into())?;
                self.lost(cut);
            }
        }
        Ok(())
    }

    fn madvise(&self, advice: libc::c_int, name: &str) -> io::Result<()> {
        let ptr = self.range.start as *mut libc::c_void;
        // SAFETY: advice on our own mapping; no Rust reference into it exists.
        let r = unsafe { libc::madvise(ptr, self.range.len(), advice) };
        check(r.into()).map_err(|e| feature(e, name))?;
        Ok(())
    }

    /// Records that the kernel unmapped `span`.
    fn lost(&mut self, span: Range<usize>) {
        self.owned.remove(&span);
        self.unmapped.push(span);
    }

    fn check_brk(&self) -> io::Result<()> {
        let top = self.brk.as_ref().map_or(0, |b| b.top);
        let now = sbrk(0)?;
        if now != top {
            return Err(io::Error::other(format!(
                "program break moved behind the case's back ({now:#x}, expected {top:#x}): \
                 brk-shrink is not running in a process of its own"
            )));
        }
        Ok(())
    }

    /// After the change: new memory at the old address (x == y), filled with [`NEW_BYTE`]
    /// together with the whole watched range.
    pub(super) fn refill(&mut self) -> io::Result<()> {
        if self.kind == ChangeKind::BrkShrink {
            self.check_brk()?;
            let len = self.range.len();
            sbrk(len as isize)?;
            if let Some(brk) = &mut self.brk {
                brk.top += len;
            }
        }
        for span in std::mem::take(&mut self.unmapped) {
            map_anon(Some(span.start), span.len(), rw()).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "could not map new memory at the old address {:#x}: {e}",
                        span.start
                    ),
                )
            })?;
            self.owned.add(span.clone());
            fill(&span, NEW_BYTE);
        }
        fill(&self.range.clone(), NEW_BYTE);
        Ok(())
    }

    /// Releases everything the case still holds; returns problems (a break it could not restore).
    pub(super) fn cleanup(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        self.owned.unmap_all();
        if let Some(block) = self.malloc_block.take() {
            // SAFETY: the block came from malloc and was not freed (the change takes it).
            unsafe { libc::free(block as *mut libc::c_void) };
        }
        if let Some(brk) = self.brk.take() {
            match sbrk(0) {
                Ok(now) if now == brk.top => {
                    if let Err(e) = sbrk(-((brk.top - brk.original) as isize)) {
                        problems.push(format!("could not restore the program break: {e}"));
                    }
                }
                Ok(now) => problems.push(format!(
                    "program break at {now:#x}, not {:#x}: left as is (heap not ours)",
                    brk.top
                )),
                Err(e) => problems.push(format!("could not read the program break: {e}")),
            }
        }
        if let Some(path) = self.file_path.take() {
            let _ = std::fs::remove_file(path);
        }
        self.file = None;
        self.pidfd = None;
        self.uring = None;
        problems
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = self.cleanup();
    }
}
