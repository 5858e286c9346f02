//! Shared helpers of the cache end-to-end tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd};
use std::os::unix::fs::FileExt;

use ummunotify::cache::Cache;
use ummunotify::registrar::{FixedBuf, IoUringRegistrar, Registrar};
use ummunotify_testkit::require::skip_or_fail;

pub const OLD: u8 = b'A';
pub const NEW: u8 = b'B';

pub use crate::common::{madvise, page, replace};

/// A fresh anonymous mapping (not touched).
pub fn map(len: usize) -> usize {
    crate::common::map_untouched(len)
}

/// Maps new memory exactly at `addr` (which must be free).
pub fn map_at(addr: usize, len: usize) {
    assert!(
        crate::common::map_at(addr, len),
        "could not map at the old address"
    );
}

/// `munmap`, ignoring failure (cleanup after a case that may have unmapped already).
pub fn unmap(addr: usize, len: usize) {
    // SAFETY: test-owned mapping.
    unsafe { libc::munmap(addr as *mut _, len) };
}

pub fn memfd_file(len: usize) -> File {
    // SAFETY: NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"cache-e2e".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fresh fd owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len as u64).unwrap();
    f
}

pub fn map_shared(f: &File, len: usize) -> usize {
    use std::os::fd::AsRawFd;
    // SAFETY: no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

pub fn fill(r: &std::ops::Range<usize>, b: u8) {
    // SAFETY: test-owned, writable; no Rust reference into it.
    unsafe { std::ptr::write_bytes(r.start as *mut u8, b, r.len()) };
}

pub fn read(r: &std::ops::Range<usize>) -> Vec<u8> {
    let mut v = vec![0; r.len()];
    // SAFETY: test-owned, readable.
    unsafe { std::ptr::copy_nonoverlapping(r.start as *const u8, v.as_mut_ptr(), r.len()) };
    v
}

/// The io_uring registrar, or a loud SKIP.
pub fn uring_registrar(test: &str) -> Option<IoUringRegistrar> {
    match IoUringRegistrar::new(256) {
        Ok(r) => Some(r),
        Err(e) => {
            skip_or_fail(test, &format!("io_uring sparse fixed buffers ({e})"));
            None
        }
    }
}

/// The "device": a scratch file the registrar writes to.
pub struct Out {
    file: File,
    path: std::path::PathBuf,
}

impl Out {
    pub fn new() -> Out {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("umn-cache-e2e-{}-{n}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        Out { file, path }
    }
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.file.read_exact_at(&mut v, off).unwrap();
        v
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Something that writes memory to the device through a cached registration.
pub trait DeviceCache {
    fn write(&mut self, addr: usize, len: usize, out: &Out, off: u64) -> std::io::Result<()>;
    /// Drops whatever this cache keeps for finished cases.
    fn forget(&mut self) {}
}

/// What a registration cache without notifications does: cache by address, never invalidate.
pub struct NaiveCache<'r> {
    registrar: &'r IoUringRegistrar,
    map: HashMap<(usize, usize), FixedBuf>,
}

impl<'r> NaiveCache<'r> {
    pub fn new(registrar: &'r IoUringRegistrar) -> Self {
        NaiveCache {
            registrar,
            map: HashMap::new(),
        }
    }
    pub fn key(&mut self, addr: usize, len: usize) -> std::io::Result<&FixedBuf> {
        if !self.map.contains_key(&(addr, len)) {
            let k = self.registrar.register(addr..addr + len)?;
            self.map.insert((addr, len), k);
        }
        Ok(&self.map[&(addr, len)])
    }
}

impl DeviceCache for NaiveCache<'_> {
    fn write(&mut self, addr: usize, len: usize, out: &Out, off: u64) -> std::io::Result<()> {
        let r = self.registrar;
        let key = self.key(addr, len)?;
        r.write_fixed(key, addr, len, out.fd(), off)?;
        Ok(())
    }
    fn forget(&mut self) {
        for ((a, l), k) in self.map.drain() {
            self.registrar.deregister(&k, a..a + l).unwrap();
        }
    }
}

impl Drop for NaiveCache<'_> {
    fn drop(&mut self) {
        self.forget();
    }
}

/// The ummunotify cache.
pub struct RealCache<'c>(pub &'c Cache<IoUringRegistrar>);

impl DeviceCache for RealCache<'_> {
    fn write(&mut self, addr: usize, len: usize, out: &Out, off: u64) -> std::io::Result<()> {
        let h = self.0.get(addr, len).map_err(std::io::Error::other)?;
        self.0
            .registrar()
            .write_fixed(h.key(), addr, len, out.fd(), off)?;
        Ok(())
    }
    fn forget(&mut self) {
        self.0.flush();
    }
}
