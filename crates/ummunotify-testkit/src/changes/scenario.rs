//! Per-kind setup, the change itself, the x == y refill, and cleanup.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use super::mapping::{check, fill, map_anon, map_rw, Owned};
use super::{
    ChangeKind, MADV_COLLAPSE, MADV_DONTNEED_LOCKED, MADV_GUARD_INSTALL, MADV_GUARD_REMOVE,
    MREMAP_DONTUNMAP, SYS_PIDFD_OPEN, SYS_PROCESS_MADVISE,
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
/// `mallopt` parameter: the mmap threshold (setting it also turns glibc's dynamic threshold off).
const M_MMAP_THRESHOLD: libc::c_int = -3;
/// Huge-page size (x86-64 and the 4 KiB-page AArch64 kernels).
const HUGE: usize = 2 << 20;

/// The case's address was taken by a mapping it did not make: not a verdict on the watcher.
#[derive(Debug)]
pub(crate) struct AddressTaken {
    /// What the case tried to map again.
    pub(crate) span: Range<usize>,
    /// The `/proc/self/maps` lines of the mappings found there.
    pub(crate) intruders: Vec<String>,
}

impl std::fmt::Display for AddressTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "could not map new memory at the old address {:#x}: taken by a mapping the case did \
             not make: {}",
            self.span.start,
            if self.intruders.is_empty() {
                "(gone by the time /proc/self/maps was read)".to_owned()
            } else {
                self.intruders.join(" | ")
            }
        )
    }
}

impl std::error::Error for AddressTaken {}

/// The `/proc/self/maps` lines overlapping `span`.
fn maps_lines(span: &Range<usize>) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter(|l| {
            let Some((s, e)) = l.split(' ').next().and_then(|r| r.split_once('-')) else {
                return false;
            };
            let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16))
            else {
                return false;
            };
            s < span.end && span.start < e
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

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
    /// Failures found while setting up (the case runs, and fails).
    pub(super) problems: Vec<String>,
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

/// A `len`-byte memfd (shmem: its pages can be pinned, punched and truncated).
fn memfd(len: usize) -> io::Result<File> {
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"umn-testkit".as_ptr(), libc::MFD_CLOEXEC) };
    check(fd.into()).map_err(|e| feature(e, "memfd_create"))?;
    // SAFETY: memfd_create returned a fresh descriptor owned by nobody else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len as u64)?;
    Ok(file)
}

/// Attaches a new private SysV shared-memory segment of `len` bytes, already marked for
/// removal (it goes away with its last detach).
fn shm_attach(len: usize) -> io::Result<usize> {
    // SAFETY: shmget takes integers only.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600) };
    check(id.into()).map_err(|e| feature(e, "SysV shared memory (shmget)"))?;
    // SAFETY: attaches the segment just created wherever the kernel likes.
    let p = unsafe { libc::shmat(id, std::ptr::null(), 0) };
    let attached = p as isize != -1;
    let err = io::Error::last_os_error();
    // SAFETY: marks our own segment for removal; no buffer is passed.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    if !attached {
        return Err(err);
    }
    Ok(p as usize)
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
            problems: Vec::new(),
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
            ChangeKind::MadvRemoveShmem | ChangeKind::PunchHole | ChangeKind::FtruncateShared => {
                let file = memfd(four)?;
                let base = map_shared(&file, four)?;
                let mut sc = Scenario::new(kind, base..base + four, base..base + four);
                sc.file = Some(file);
                sc
            }
            ChangeKind::Shmdt => {
                let base = shm_attach(four)?;
                Scenario::new(kind, base..base + four, base..base + four)
            }
            ChangeKind::MadvCollapse => {
                // One 2 MiB-aligned VMA, watched whole: a partly watched VMA is split, and
                // MADV_COLLAPSE needs the aligned 2 MiB inside one VMA.
                let raw = map_rw(2 * HUGE)?;
                let base = raw.next_multiple_of(HUGE);
                super::mapping::unmap(&(raw..base));
                super::mapping::unmap(&(base + HUGE..raw + 2 * HUGE));
                let mut sc = Scenario::new(kind, base..base + HUGE, base..base + HUGE);
                sc.notes.push(
                    "not pinned: the kernel does not collapse pinned pages (judged by PFNs where \
                     visible)"
                        .into(),
                );
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
                // A fixed threshold: glibc's dynamic one rises with every large free (up to
                // 32 MiB), and a process that freed big blocks before would serve this one from
                // the heap. The case owns its process (see `umn coverage`) or its test.
                // SAFETY: mallopt only changes the allocator's tuning.
                unsafe { libc::mallopt(M_MMAP_THRESHOLD, 128 << 10) };
                // SAFETY: plain allocation; freed exactly once, by the change or by cleanup.
                let block = unsafe { libc::malloc(MALLOC_BLOCK) } as usize;
                if block == 0 {
                    return Err(io::Error::from(io::ErrorKind::OutOfMemory));
                }
                // An mmapped chunk is a mapping of its own that starts two words before the
                // pointer. (Reading glibc's size word before the pointer
                // instead would read outside the allocation: undefined behaviour, which the
                // optimizer turned into "never mmapped".)
                let header = block - 2 * std::mem::size_of::<usize>();
                let lines = maps_lines(&(block..block + 1));
                let mmapped = lines.len() == 1 && lines[0].starts_with(&format!("{header:x}-"));
                let first = (block.div_ceil(page_size()) + 1) * page_size();
                let mut sc = Scenario::new(kind, 0..0, first..first + four);
                sc.owned = Owned::default();
                sc.malloc_block = Some(block);
                if !mmapped {
                    sc.problems.push(
                        "malloc did not mmap the 40 MiB block even with M_MMAP_THRESHOLD fixed \
                         at 128 KiB (not glibc?): free() will not unmap it"
                            .into(),
                    );
                }
                sc
            }
            ChangeKind::BrkShrink => {
                // Room at the top of malloc's heap for everything the case allocates (the watcher's
                // registration, the oracle's buffers): with the break moved under it, malloc
                // would extend the heap above our top and the break could not be restored.
                // Heap growth only (no memory is touched); the child process ends after the case.
                // SAFETY: glibc tunables and a malloc/free pair of our own.
                unsafe {
                    libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
                    // Below the mmap threshold, above what the heap's top has free: malloc
                    // extends the heap, and the free leaves it all at the top. `black_box`: the
                    // compiler removes an unused malloc/free pair, and the room with it.
                    libc::mallopt(M_MMAP_THRESHOLD, 32 << 20);
                    libc::free(std::hint::black_box(libc::malloc(16 << 20)));
                    libc::mallopt(M_MMAP_THRESHOLD, 128 << 10);
                }
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
            ChangeKind::Shmdt => {
                // SAFETY: detaches this case's own segment; nothing references it.
                check(unsafe { libc::shmdt(ptr) }.into())?;
                self.lost(self.range.clone());
            }
            ChangeKind::MadvGuardInstall => {
                self.madvise(MADV_GUARD_INSTALL, "MADV_GUARD_INSTALL")?;
            }
            ChangeKind::MadvCollapse => self.madvise(MADV_COLLAPSE, "MADV_COLLAPSE")?,
            ChangeKind::PunchHole => {
                let fd = self.file.as_ref().map_or(-1, AsRawFd::as_raw_fd);
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                // SAFETY: fallocate on our own memfd; no memory is passed.
                let r = unsafe { libc::fallocate(fd, mode, 0, len as libc::off_t) };
                check(r.into()).map_err(|e| feature(e, "fallocate(PUNCH_HOLE) on shmem"))?;
            }
            ChangeKind::FtruncateShared => {
                let file = self
                    .file
                    .as_ref()
                    .ok_or_else(|| io::Error::other("no memfd"))?;
                file.set_len(0)?;
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
        match self.kind {
            // Touching a guard page faults: take the guards off first (the pages come back
            // empty, as new memory).
            ChangeKind::MadvGuardInstall => self.madvise(MADV_GUARD_REMOVE, "MADV_GUARD_REMOVE")?,
            // Touching beyond the end of the file would raise SIGBUS.
            ChangeKind::FtruncateShared => {
                let file = self
                    .file
                    .as_ref()
                    .ok_or_else(|| io::Error::other("no memfd"))?;
                file.set_len(self.range.len() as u64)?;
            }
            _ => {}
        }
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
                if e.raw_os_error() == Some(libc::EEXIST) {
                    let intruders = maps_lines(&span);
                    io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        AddressTaken {
                            span: span.clone(),
                            intruders,
                        },
                    )
                } else {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "could not map new memory at the old address {:#x}: {e}",
                            span.start
                        ),
                    )
                }
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
