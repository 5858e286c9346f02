//! The perf ABI this backend uses: `perf_event_attr`, `perf_event_open`, the ring's metadata
//! page, and tracefs's tracepoint ids. Typed wrappers; no policy.
#![allow(unsafe_code)] // perf_event_open, ioctl, mmap of the rings.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// `struct perf_event_attr` (`PERF_ATTR_SIZE_VER8`, 136 bytes).
#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_watermark: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved2: u16,
    aux_sample_size: u32,
    reserved3: u32,
    sig_data: u64,
    config3: u64,
}

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
const PERF_SAMPLE_RAW: u64 = 1 << 10;
/// The sample layout [`super::decode`] parses: pid/tid, time, raw tracepoint data.
pub(super) const SAMPLE_TYPE: u64 = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_RAW;

const PERF_FORMAT_LOST: u64 = 1 << 4;

// attr.flags bits.
const DISABLED: u64 = 1;
const INHERIT: u64 = 1 << 1;
const WATERMARK: u64 = 1 << 14;
const USE_CLOCKID: u64 = 1 << 25;
const INHERIT_THREAD: u64 = 1 << 35;

const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;

/// Opens tracepoint `id` for thread `tid` on `cpu`: every sample it takes, with the thread's
/// later threads (`inherit` + `inherit_thread`: threads, not forked children), goes to the
/// ring of `output` (this CPU's ring) or, without one, to a ring mapped on this fd.
/// `wakeup` is the ring's poll watermark in bytes.
pub(super) fn open_tracepoint(
    id: u64,
    tid: i32,
    cpu: i32,
    output: Option<&OwnedFd>,
    wakeup: u32,
) -> io::Result<OwnedFd> {
    let fd = open_raw(
        id,
        tid,
        cpu,
        INHERIT | INHERIT_THREAD | WATERMARK | USE_CLOCKID,
        wakeup,
    )?;
    if let Some(out) = output {
        set_output(&fd, out)?;
    }
    Ok(fd)
}

/// `PERF_EVENT_IOC_SET_OUTPUT`: `fd`'s samples go to `out`'s ring.
fn set_output(fd: &OwnedFd, out: &OwnedFd) -> io::Result<()> {
    // SAFETY: both are perf event fds; the ioctl takes the output fd by value.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_OUTPUT, out.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const PERF_EVENT_IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;

/// Opens tracepoint `id` on every task that runs on `cpu` (`pid = -1`: a CPU-wide event, which
/// needs `CAP_PERFMON` or `perf_event_paranoid` <= 0) and sets `filter` on it before anything
/// is recorded that should not be (the event is opened disabled and enabled after the filter).
/// Its samples go to the ring of `output` or, without one, to a ring mapped on this fd.
pub(super) fn open_cpu_wide(
    id: u64,
    cpu: i32,
    output: Option<&OwnedFd>,
    wakeup: u32,
    filter: &std::ffi::CStr,
) -> io::Result<OwnedFd> {
    let fd = open_raw(id, -1, cpu, DISABLED | WATERMARK | USE_CLOCKID, wakeup)?;
    // SAFETY: a perf event fd and a NUL-terminated filter string that outlives the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_FILTER, filter.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(out) = output {
        set_output(&fd, out)?;
    }
    enable(&fd)?;
    Ok(fd)
}

/// Opens tracepoint `id` for the calling thread only (no inheritance), on any CPU: mappable,
/// used once at open to learn what the kernel records for this process.
pub(super) fn open_self(id: u64) -> io::Result<OwnedFd> {
    open_raw(id, 0, -1, WATERMARK | USE_CLOCKID, 1)
}

/// `PERF_EVENT_IOC_ENABLE`.
pub(super) fn enable(fd: &OwnedFd) -> io::Result<()> {
    const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
    // SAFETY: a perf event fd; the ioctl takes no pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn open_raw(id: u64, pid: i32, cpu: i32, flags: u64, wakeup: u32) -> io::Result<OwnedFd> {
    let attr = Attr {
        type_: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<Attr>() as u32,
        config: id,
        sample_period: 1,
        sample_type: SAMPLE_TYPE,
        // Tests read each event's count of samples the kernel dropped (Linux 6.0+; older
        // kernels refuse the bit, so the library itself never asks).
        read_format: if cfg!(test) { PERF_FORMAT_LOST } else { 0 },
        flags,
        wakeup_watermark: wakeup,
        clockid: libc::CLOCK_MONOTONIC,
        ..Attr::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it says; the kernel only reads it
    // (and may write `size` back on E2BIG, which it owns for the call).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd the kernel just gave us, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// How many samples the kernel dropped for event `fd` (its ring had no room), from `read`
/// with `PERF_FORMAT_LOST`: the kernel's own count, to check the rings' loss detection against.
#[cfg(test)]
pub(super) fn lost_samples(fd: &OwnedFd) -> io::Result<u64> {
    let mut v = [0u64; 2];
    // SAFETY: reads at most 16 bytes into `v`, which has 16.
    let n = unsafe { libc::read(fd.as_raw_fd(), v.as_mut_ptr().cast(), 16) };
    if n != 16 {
        return Err(io::Error::last_os_error());
    }
    Ok(v[1])
}

/// Where tracefs is mounted (the first of the two usual places with an `events` directory).
pub(super) fn tracefs() -> Option<&'static str> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find(|p| std::path::Path::new(&format!("{p}/events")).is_dir())
}

/// Why [`tracefs`] found none, in words a user can act on: not mounted, or mounted where this
/// user can not look (tracefs is root-only by default).
pub(super) fn tracefs_missing() -> String {
    let denied = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find(|p| std::fs::read_dir(p).is_err_and(|e| e.kind() == io::ErrorKind::PermissionDenied));
    match denied {
        Some(p) => format!(
            "tracefs at {p} is not readable by this user ({p} is root-only unless an \
             administrator opens it); the tracepoint ids live there"
        ),
        None => "tracefs is not mounted (as root: mount -t tracefs nodev /sys/kernel/tracing); \
                 the tracepoint ids live there"
            .to_string(),
    }
}

/// The id of tracepoint `syscalls/NAME` under tracefs `root`.
pub(super) fn tracepoint_id(root: &str, name: &str) -> io::Result<u64> {
    event_id(root, "syscalls", name)
}

/// The id of tracepoint `SYSTEM/NAME` under tracefs `root`.
pub(super) fn event_id(root: &str, system: &str, name: &str) -> io::Result<u64> {
    let s = std::fs::read_to_string(format!("{root}/events/{system}/{name}/id"))?;
    s.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{name}/id: {s:?}")))
}

/// One CPU's ring: a metadata page then `DATA_PAGES` pages of records, mapped read-write (we
/// write `data_tail`: the kernel never overwrites what we have not consumed).
pub(super) struct RingMap {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory read with atomics (head, tail) or as plain bytes between
// head snapshots the kernel has finished writing; the owner serializes consumers.
unsafe impl Send for RingMap {}
// SAFETY: as above.
unsafe impl Sync for RingMap {}

/// Data pages per ring (a power of two, as perf requires).
pub(super) const DATA_PAGES: usize = 64;
const PAGE: usize = 4096;

impl RingMap {
    /// Maps the ring of `fd` (the first event opened on its CPU). Not inherited by `fork`:
    /// a child must never consume its parent's records.
    pub(super) fn map(fd: &OwnedFd) -> io::Result<RingMap> {
        let len = (1 + DATA_PAGES) * PAGE;
        let p = crate::sys::mmap_shared(fd.as_fd(), len)?;
        let ring = RingMap {
            base: p.as_ptr(),
            len,
        };
        // SAFETY: our own mapping.
        if unsafe { libc::madvise(p.as_ptr().cast(), len, libc::MADV_DONTFORK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ring)
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: `offset` is one of the 8-aligned u64 fields of `perf_event_mmap_page`, inside
        // the metadata page, which lives as long as `self`.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }

    /// `data_head`: how many bytes the kernel has written (monotonic). Acquire: the records
    /// below it are complete (the kernel's `smp_wmb` before the store pairs with it).
    #[inline]
    pub(super) fn head(&self) -> u64 {
        self.word(1024).load(Ordering::Acquire)
    }

    /// Publishes `data_tail`: the kernel may reuse the bytes below it.
    pub(super) fn set_tail(&self, tail: u64) {
        self.word(1032).store(tail, Ordering::Release);
    }

    /// Bytes of record space.
    pub(super) fn size(&self) -> u64 {
        (DATA_PAGES * PAGE) as u64
    }

    /// Copies `out.len()` bytes starting at stream position `pos` (wrapping).
    pub(super) fn copy(&self, pos: u64, out: &mut [u8]) {
        let size = self.size() as usize;
        let data = PAGE;
        let mut off = (pos % size as u64) as usize;
        let mut done = 0;
        while done < out.len() {
            let n = (size - off).min(out.len() - done);
            // SAFETY: `[data + off, data + off + n)` lies in the data pages; the kernel wrote
            // these bytes before the head we read (Acquire) and will not overwrite them before
            // we move the tail past them.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.add(data + off),
                    out[done..].as_mut_ptr(),
                    n,
                );
            }
            done += n;
            off = 0;
        }
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, not used after this.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The process's threads (`/proc/self/task`), read with std (not on any event path).
pub(super) fn threads() -> io::Result<Vec<i32>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task")? {
        if let Some(tid) = e?.file_name().to_str().and_then(|s| s.parse().ok()) {
            v.push(tid);
        }
    }
    Ok(v)
}

/// Online CPUs perf can open events on (`/sys/devices/system/cpu/online`, e.g. `0-3,6`).
pub(super) fn online_cpus() -> io::Result<Vec<i32>> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {s:?}"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (i32, i32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                v.extend(a..=b);
            }
            None => v.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(v)
}

/// The current program break (`brk(0)` changes nothing).
pub(super) fn current_brk() -> u64 {
    // SAFETY: brk(0) only returns the break.
    unsafe { libc::syscall(libc::SYS_brk, 0) as u64 }
}

/// Every traced syscall once, with arguments the kernel refuses before it changes anything
/// (the canary, see `Perf::canary`): unaligned addresses (`EINVAL`), a bad fd or id.
pub(super) fn refused_calls() {
    let calls: [(libc::c_long, [u64; 6]); 9] = [
        (libc::SYS_munmap, [1, 4096, 0, 0, 0, 0]),
        (libc::SYS_mremap, [1, 4096, 4096, 0, 0, 0]),
        (
            libc::SYS_madvise,
            [1, 4096, libc::MADV_DONTNEED as u64, 0, 0, 0],
        ),
        // brk(0) only reads the break.
        (libc::SYS_brk, [0; 6]),
        // Length 0: EINVAL.
        (
            libc::SYS_mmap,
            [
                0,
                0,
                0,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        ),
        (libc::SYS_shmdt, [1, 0, 0, 0, 0, 0]),
        (libc::SYS_shmat, [u64::MAX, 0, 0, 0, 0, 0]),
        (libc::SYS_process_madvise, [u64::MAX, 0, 0, 0, 0, 0]),
        (libc::SYS_remap_file_pages, [1, 0, 0, 0, 0, 0]),
    ];
    for (nr, a) in calls {
        // SAFETY: each call is refused by the kernel (unaligned address, zero length, bad fd
        // or id) or only reads (brk(0)): no memory changes.
        unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    }
}

/// `madvise(MADV_DONTNEED)` of one page of ours (the MMU-notifier canary: the kernel announces
/// the zap on the invalidation path whether or not the page is populated).
pub(super) fn zap(page: *mut u8) {
    // SAFETY: `page` is a private anonymous page this backend mapped and owns; dropping its
    // contents changes nothing anyone reads.
    unsafe { libc::madvise(page.cast(), 4096, libc::MADV_DONTNEED) };
}
