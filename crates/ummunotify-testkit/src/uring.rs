//! The device-side view: an io_uring fixed buffer pins pages the way an RDMA memory registration
//! does, and `WRITE_FIXED` shows what a device reading through that registration would see.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use io_uring::{opcode, types, IoUring};

use crate::require::MissingFeature;

const RING_ENTRIES: u32 = 8;

/// Creates an io_uring, reporting "io_uring" as a [`MissingFeature`] when the kernel refuses.
fn new_ring() -> io::Result<IoUring> {
    IoUring::new(RING_ENTRIES).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSYS | libc::EPERM | libc::EACCES) => MissingFeature::error("io_uring", e),
        _ => e,
    })
}

/// Submits one entry on `ring` and waits for its completion; returns the non-negative result.
///
/// # Safety
///
/// Every buffer `entry` points to must stay valid until this returns (it waits for completion).
unsafe fn submit_one(ring: &mut IoUring, entry: &io_uring::squeue::Entry) -> io::Result<u32> {
    // SAFETY: the caller guarantees the entry's buffers outlive the operation, and we wait for
    // its completion below before returning.
    unsafe { ring.submission().push(entry) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    // A signal can end the wait early (EINTR, or a return with nothing completed): wait again,
    // or the completion would be taken for the next operation's.
    let cqe = loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if let Some(cqe) = ring.completion().next() {
            break cqe;
        }
    };
    u32::try_from(cqe.result()).map_err(|_| io::Error::from_raw_os_error(-cqe.result()))
}

/// An io_uring with at most one registered (pinned) buffer, and a scratch file in `/tmp` that
/// `WRITE_FIXED` writes to. The file is removed when the pinner drops.
pub struct Pinner {
    ring: IoUring,
    file: File,
    path: PathBuf,
    registered: Option<Range<usize>>,
}

impl Pinner {
    /// Creates the ring and the scratch file.
    ///
    /// # Errors
    ///
    /// [`MissingFeature`] `"io_uring"` if the kernel refuses io_uring; any OS error otherwise.
    pub fn new() -> io::Result<Self> {
        let ring = new_ring()?;
        let mut template = *b"/tmp/umn-testkit-XXXXXX\0";
        // SAFETY: template is a writable NUL-terminated buffer ending in XXXXXX, as mkstemp needs.
        let fd = unsafe { libc::mkstemp(template.as_mut_ptr().cast()) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mkstemp returned a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        let path = CStr::from_bytes_until_nul(&template)
            .map_err(io::Error::other)?
            .to_str()
            .map_err(io::Error::other)?
            .into();
        Ok(Self {
            ring,
            file,
            path,
            registered: None,
        })
    }

    /// Registers `[addr, addr + len)` as fixed buffer 0 (`IORING_REGISTER_BUFFERS`), pinning its
    /// pages until [`Pinner::unregister`] (or drop). Replaces an earlier registration.
    ///
    /// # Errors
    ///
    /// The OS error of the registration, e.g. `EFAULT` for memory that can not be long-term
    /// pinned (file-backed shared mappings of ordinary file systems).
    pub fn register(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.unregister()?;
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: the kernel pins the pages behind the buffer, so it never touches freed memory
        // even if the range is unmapped later; and this type only ever submits WRITE_FIXED, in
        // which the kernel reads those pinned frames and never writes process memory.
        unsafe { self.ring.submitter().register_buffers(&[iov]) }?;
        self.registered = Some(addr..addr + len);
        Ok(())
    }

    /// Unregisters the buffer (unpinning its pages); does nothing if none is registered.
    ///
    /// # Errors
    ///
    /// The OS error of `IORING_UNREGISTER_BUFFERS`.
    pub fn unregister(&mut self) -> io::Result<()> {
        if self.registered.take().is_some() {
            self.ring.submitter().unregister_buffers()?;
        }
        Ok(())
    }

    /// The registered range, if any.
    pub fn registered(&self) -> Option<Range<usize>> {
        self.registered.clone()
    }

    /// Writes `[addr, addr + len)` of the registered buffer to the scratch file at `file_offset`
    /// with `WRITE_FIXED` (buffer index 0): the bytes come from the pinned pages, not from
    /// whatever is mapped at `addr` now. Returns the number of bytes written.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if the range is not inside the registered buffer; the operation's error.
    pub fn write_fixed(&mut self, addr: usize, len: usize, file_offset: u64) -> io::Result<usize> {
        let inside = self
            .registered
            .as_ref()
            .is_some_and(|r| addr >= r.start && addr.checked_add(len).is_some_and(|e| e <= r.end));
        let len32 = u32::try_from(len).ok().filter(|_| inside).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "write_fixed range outside the registered buffer",
            )
        })?;
        let entry = opcode::WriteFixed::new(
            types::Fd(self.file.as_raw_fd()),
            addr as *const u8,
            len32,
            0,
        )
        .offset(file_offset)
        .build();
        // SAFETY: the address lies inside registered buffer 0, whose pages the kernel holds
        // pinned; the kernel only reads them. submit_one waits for the completion.
        let written = unsafe { submit_one(&mut self.ring, &entry) }?;
        Ok(written as usize)
    }

    /// Reads `len` bytes of the scratch file at `offset` (what the "device" wrote).
    ///
    /// # Errors
    ///
    /// The OS error of `pread`, or `UnexpectedEof` if the file is shorter.
    pub fn read_back(&self, len: usize, offset: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }
}

impl Drop for Pinner {
    fn drop(&mut self) {
        // Dropping the ring unregisters the buffer as well; the file is what needs removing.
        let _ = std::fs::remove_file(&self.path);
    }
}

impl std::fmt::Debug for Pinner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinner")
            .field("path", &self.path)
            .field("registered", &self.registered)
            .finish_non_exhaustive()
    }
}

/// A one-shot io_uring used to issue `IORING_OP_MADVISE`: a mapping change made by the kernel on
/// the process's behalf, which no system-call interposer or syscall tracepoint sees.
pub struct UringMadvise {
    ring: IoUring,
}

impl UringMadvise {
    /// Creates the ring (do it before the change, so the change itself is one submission).
    ///
    /// # Errors
    ///
    /// [`MissingFeature`] `"io_uring"` if the kernel refuses io_uring.
    pub fn new() -> io::Result<Self> {
        Ok(Self { ring: new_ring()? })
    }

    /// `madvise(addr, len, advice)` through the ring; returns when the operation completed.
    ///
    /// # Errors
    ///
    /// [`MissingFeature`] `"IORING_OP_MADVISE"` for `EINVAL`/`EOPNOTSUPP`; other OS errors as is.
    pub fn madvise(&mut self, addr: usize, len: usize, advice: i32) -> io::Result<()> {
        let len = i64::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let entry = opcode::Madvise::new(addr as *const libc::c_void, len, advice).build();
        // SAFETY: MADVISE reads no user buffer; the address range is only advice to the kernel.
        match unsafe { submit_one(&mut self.ring, &entry) } {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                Err(MissingFeature::error("IORING_OP_MADVISE", e))
            }
            Err(e) => Err(e),
        }
    }
}

impl std::fmt::Debug for UringMadvise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringMadvise").finish_non_exhaustive()
    }
}
