//! [`IoUringRegistrar`]: each cached region gets a slot of a sparse io_uring fixed-buffer table.
#![allow(unsafe_code)] // Buffer registration and fixed-buffer I/O hand raw addresses to the kernel.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use io_uring::{opcode, types, IoUring};

use super::Registrar;

/// The kernel's limit on one registered buffer (`io_buffer_validate`: at most 1 GiB).
const MAX_BUFFER: usize = 1 << 30;

/// A registered range: the slot index to put in `READ_FIXED` / `WRITE_FIXED` (`buf_index`), and
/// the range the slot covers (any address inside it may be used).
#[derive(Debug, PartialEq, Eq)]
pub struct FixedBuf {
    index: u16,
    range: Range<usize>,
    ring: u64,
}

impl FixedBuf {
    /// The fixed-buffer index (`sqe->buf_index`) of this registration.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The registered range.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
}

/// Registers cached regions as io_uring fixed buffers (`IORING_REGISTER_BUFFERS2` with
/// `IORING_RSRC_REGISTER_SPARSE`, then `IORING_REGISTER_BUFFERS_UPDATE` per region).
///
/// The kernel pins the pages of each slot exactly like an RDMA memory registration: after the
/// memory is unmapped, I/O through the slot still reads (and writes) the *old* pages. That is the
/// stale-registration hazard the [`Cache`](crate::cache::Cache) and its notifier prevent.
///
/// I/O: [`write_fixed`](Self::write_fixed) and [`read_fixed`](Self::read_fixed) submit one
/// operation and wait for it; for your own submissions use [`ring`](Self::ring) with
/// [`FixedBuf::index`] as the buffer index.
pub struct IoUringRegistrar {
    ring: IoUring,
    /// Serializes use of the submission and completion queues.
    io: Mutex<()>,
    free: Mutex<Vec<u16>>,
    slots: u32,
    id: u64,
}

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);

impl IoUringRegistrar {
    /// The kernel's limit on the fixed-buffer table (`IORING_MAX_REG_BUFFERS`).
    pub const MAX_SLOTS: u32 = 1 << 14;

    /// Creates a ring with a sparse table of `slots` fixed buffers (at most [`MAX_SLOTS`](Self::MAX_SLOTS)).
    ///
    /// # Errors
    /// The OS error of `io_uring_setup` (`ENOSYS`/`EPERM`: io_uring unavailable) or of the sparse
    /// registration (`EINVAL` before Linux 5.13).
    pub fn new(slots: u32) -> io::Result<IoUringRegistrar> {
        let slots = slots.clamp(1, Self::MAX_SLOTS);
        let ring = IoUring::new(32)?;
        ring.submitter().register_buffers_sparse(slots)?;
        let free = (0..slots).rev().map(|i| i as u16).collect();
        Ok(IoUringRegistrar {
            ring,
            io: Mutex::new(()),
            free: Mutex::new(free),
            slots,
            id: NEXT_RING_ID.fetch_add(1, Relaxed),
        })
    }

    /// The ring, for submitting your own `READ_FIXED` / `WRITE_FIXED` (synchronize access to its
    /// queues with your own code; this type's I/O methods use them under an internal lock).
    pub fn ring(&self) -> &IoUring {
        &self.ring
    }

    /// Number of slots in the table.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    fn lock_free(&self) -> MutexGuard<'_, Vec<u16>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self, buf: &FixedBuf, addr: usize, len: usize) -> io::Result<u32> {
        let inside = addr >= buf.range.start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= buf.range.end);
        if buf.ring != self.id || !inside {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range outside the fixed buffer, or buffer of another ring",
            ));
        }
        u32::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    }

    /// Submits one entry and waits for its completion; returns the non-negative result.
    ///
    /// # Safety
    /// Every buffer `entry` names must stay valid until this returns (it waits for completion).
    unsafe fn submit_one(&self, entry: &io_uring::squeue::Entry) -> io::Result<u32> {
        let _io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `self.io` is held, so this is the only live handle on the submission queue; the
        // caller keeps the entry's buffers valid until we return after its completion.
        unsafe {
            let mut sq = self.ring.submission_shared();
            sq.push(entry)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            sq.sync();
        }
        // Wait until the completion is there: a signal can end the wait early (EINTR, or a
        // return with nothing completed). Giving up then would leave this operation's completion
        // for the next caller, who would take it for its own (found by tests/signals.rs).
        let cqe = loop {
            match self.ring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            // SAFETY: `self.io` is held: the only live handle on the completion queue.
            if let Some(cqe) = unsafe { self.ring.completion_shared() }.next() {
                break cqe;
            }
        };
        u32::try_from(cqe.result()).map_err(|_| io::Error::from_raw_os_error(-cqe.result()))
    }

    /// `WRITE_FIXED`: writes `[addr, addr + len)` of the registration `buf` to `fd` at `offset`.
    /// The bytes come from the pages pinned at registration time, not from whatever is mapped at
    /// `addr` now. Returns the number of bytes written.
    ///
    /// # Errors
    /// `InvalidInput` if the range is not inside `buf` or `buf` belongs to another ring; the
    /// operation's OS error.
    pub fn write_fixed(
        &self,
        buf: &FixedBuf,
        addr: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        offset: u64,
    ) -> io::Result<usize> {
        let len = self.check(buf, addr, len)?;
        let entry =
            opcode::WriteFixed::new(types::Fd(fd.as_raw_fd()), addr as *const u8, len, buf.index)
                .offset(offset)
                .build();
        // SAFETY: the kernel only reads the pages pinned in slot `buf.index`, which stay pinned
        // until the slot is cleared (never while the caller holds `buf`); we wait for completion.
        Ok(unsafe { self.submit_one(&entry) }? as usize)
    }

    /// `READ_FIXED`: reads from `fd` at `offset` into `[addr, addr + len)` of the registration
    /// `buf`. Returns the number of bytes read.
    ///
    /// # Safety
    /// The kernel writes the pinned pages, which are the pages mapped at `addr` unless the mapping
    /// changed: no Rust reference to `[addr, addr + len)` may be alive during the call.
    ///
    /// # Errors
    /// As [`write_fixed`](Self::write_fixed).
    pub unsafe fn read_fixed(
        &self,
        buf: &FixedBuf,
        addr: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        offset: u64,
    ) -> io::Result<usize> {
        let len = self.check(buf, addr, len)?;
        let entry =
            opcode::ReadFixed::new(types::Fd(fd.as_raw_fd()), addr as *mut u8, len, buf.index)
                .offset(offset)
                .build();
        // SAFETY: the caller guarantees nothing else references the destination; the pages stay
        // pinned while `buf` is held; we wait for completion.
        Ok(unsafe { self.submit_one(&entry) }? as usize)
    }
}

impl Registrar for IoUringRegistrar {
    type Key = FixedBuf;

    fn register(&self, range: Range<usize>) -> io::Result<FixedBuf> {
        if range.len() > MAX_BUFFER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "io_uring fixed buffers are limited to 1 GiB",
            ));
        }
        let index = self.lock_free().pop().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                "io_uring fixed-buffer table full",
            )
        })?;
        let iov = libc::iovec {
            iov_base: range.start as *mut libc::c_void,
            iov_len: range.len(),
        };
        // SAFETY: the kernel pins the pages behind the range (or fails); it never touches
        // unpinned memory afterwards. The only ways to make it write process memory are
        // `read_fixed` (unsafe, caller's obligation) and the caller's own submissions.
        let r = unsafe {
            self.ring
                .submitter()
                .register_buffers_update(u32::from(index), &[iov], None)
        };
        match r {
            Ok(()) => Ok(FixedBuf {
                index,
                range,
                ring: self.id,
            }),
            Err(e) => {
                self.lock_free().push(index);
                Err(e)
            }
        }
    }

    fn deregister(&self, key: &FixedBuf, _range: Range<usize>) -> io::Result<()> {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: a null iovec clears the slot (the kernel unpins the pages once no request uses
        // them); no memory is handed to the kernel.
        let r = unsafe {
            self.ring
                .submitter()
                .register_buffers_update(u32::from(key.index), &[empty], None)
        };
        if r.is_ok() {
            self.lock_free().push(key.index);
        }
        r
    }

    fn max_len(&self) -> usize {
        MAX_BUFFER
    }

    fn max_registrations(&self) -> Option<usize> {
        Some(self.slots as usize)
    }
}

impl std::fmt::Debug for IoUringRegistrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoUringRegistrar")
            .field("slots", &self.slots)
            .field("free", &self.lock_free().len())
            .finish_non_exhaustive()
    }
}
