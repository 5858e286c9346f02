//! Naming the senders: which threads of the process may be inside the call that sent a
//! `REMOVE`, read from `/proc/self/task` with stack and preallocated buffers only.
#![allow(unsafe_code)] // /proc reads with stack buffers.

use super::*;

/// Candidates kept per scan.
const MAX_CANDIDATES: usize = 64;

/// Lists the threads of this process blocked in `madvise`/`process_madvise`. Owned by the
/// monitor; its buffers are allocated once, when the monitor starts. Keeps each thread's
/// `syscall` file open (up to [`THREADS`]), so a scan is one `getdents64` plus one `pread` per
/// thread.
pub(crate) struct Scanner {
    dir: Option<OwnedFd>,
    dents: Box<[u8; 8192]>,
    /// Open `TID/syscall` files: (tid, fd, seen in this scan, io_uring worker).
    open: Box<[(i32, i32, bool, bool); THREADS]>,
    n_open: usize,
    found: [Candidate; MAX_CANDIDATES],
    n: usize,
    overflowed: bool,
}

impl Scanner {
    /// Opens `/proc/self/task` (without it every entry is unnamed and ends by grace).
    pub(crate) fn new() -> Scanner {
        // SAFETY: a NUL-terminated path; the fd returned is owned by nobody else.
        let fd = unsafe {
            libc::open(
                c"/proc/self/task".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        Scanner {
            // SAFETY: a fresh descriptor from open.
            dir: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
            dents: Box::new([0; 8192]),
            open: Box::new([(0, -1, false, false); THREADS]),
            n_open: 0,
            found: [Candidate::default(); MAX_CANDIDATES],
            n: 0,
            overflowed: false,
        }
    }

    /// Whether io_uring worker `tid` is idle (waiting for work: see [`look_at_worker`]) or gone.
    /// A worker that is running, or blocked anywhere else, is not.
    pub(crate) fn worker_idle(&self, tid: i32) -> bool {
        let Some(dir) = &self.dir else { return false };
        let name = itoa_digits(tid as u32);
        let len = name.iter().position(|&d| d == 0).unwrap_or(name.len());
        look_at_worker(dir.as_raw_fd(), &name[..len]) != WorkerLook::Busy
    }

    /// The candidates of the last scan, and whether some could not be kept (or the scan failed).
    pub(crate) fn candidates(&self) -> (&[Candidate], bool) {
        (&self.found[..self.n], self.overflowed)
    }

    /// Scans the threads but `own_tid`: those blocked in `madvise` (with its range), in
    /// `process_madvise`, or running. Stack and preallocated buffers only.
    pub(crate) fn scan(&mut self, own_tid: i32) {
        self.n = 0;
        self.overflowed = false;
        let Some(dir) = &self.dir else {
            self.overflowed = true;
            return;
        };
        let dfd = dir.as_raw_fd();
        for o in &mut self.open[..self.n_open] {
            o.2 = false;
        }
        // SAFETY: rewinds our own directory fd.
        unsafe { libc::lseek(dfd, 0, libc::SEEK_SET) };
        loop {
            // SAFETY: getdents64 writes at most `len` bytes into our buffer.
            let got = unsafe {
                libc::syscall(
                    libc::SYS_getdents64,
                    dfd,
                    self.dents.as_mut_ptr(),
                    self.dents.len(),
                )
            };
            if got <= 0 {
                self.overflowed |= got < 0;
                break;
            }
            let mut off = 0usize;
            while off + 19 < got as usize {
                let reclen = u16::from_ne_bytes([self.dents[off + 16], self.dents[off + 17]]);
                if reclen == 0 {
                    break;
                }
                let end = (off + reclen as usize).min(got as usize);
                let mut name = [0u8; 24];
                let raw = &self.dents[off + 19..end];
                let raw = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
                off += reclen as usize;
                if raw.len() > 16 {
                    continue;
                }
                name[..raw.len()].copy_from_slice(raw);
                let Some(tid) = parse_dec(raw) else { continue };
                let tid = tid as i32;
                if tid == own_tid {
                    continue;
                }
                let c = self.read_thread(dfd, &name[..raw.len()], tid);
                if let Some(c) = c {
                    if self.n == MAX_CANDIDATES {
                        self.overflowed = true;
                    } else {
                        self.found[self.n] = c;
                        self.n += 1;
                    }
                }
            }
        }
        // Close the files of threads that are gone.
        let mut i = 0;
        while i < self.n_open {
            if self.open[i].2 {
                i += 1;
            } else {
                // SAFETY: an fd this scanner opened and still owns.
                unsafe { libc::close(self.open[i].1) };
                self.n_open -= 1;
                self.open[i] = self.open[self.n_open];
            }
        }
    }

    /// Reads one thread's `syscall` file (kept open when there is room). A thread that is
    /// running may be a sender between its wake-up and its zap: a candidate for any range.
    fn read_thread(&mut self, dfd: i32, name: &[u8], tid: i32) -> Option<Candidate> {
        if is_monitor(tid) {
            return None;
        }
        let slot = match self.open[..self.n_open].iter().position(|o| o.0 == tid) {
            Some(i) => Some(i),
            None if self.n_open < THREADS => {
                let Some(fd) = open_syscall(dfd, name) else {
                    self.overflowed |= !last_error_is_gone();
                    return None;
                };
                self.open[self.n_open] = (tid, fd, false, is_io_worker(dfd, name));
                self.n_open += 1;
                Some(self.n_open - 1)
            }
            None => None,
        };
        let (fd, owned, io_worker) = match slot {
            Some(i) => {
                self.open[i].2 = true;
                if !task_file_live(self.open[i].1) {
                    // The file is of a thread that is gone, and `tid` (listed just now) was
                    // given to a new one (pid_max is often 32768): reading the old file would
                    // call the new thread gone and never look at it. Open its own.
                    // SAFETY: an fd this scanner opened and owns; replaced below.
                    unsafe { libc::close(self.open[i].1) };
                    let Some(fd) = open_syscall(dfd, name) else {
                        self.n_open -= 1;
                        self.open[i] = self.open[self.n_open];
                        self.overflowed |= !last_error_is_gone();
                        return None;
                    };
                    self.open[i] = (tid, fd, true, is_io_worker(dfd, name));
                }
                (self.open[i].1, false, self.open[i].3)
            }
            None => match open_syscall(dfd, name) {
                Some(fd) => (fd, true, is_io_worker(dfd, name)),
                None => {
                    self.overflowed |= !last_error_is_gone();
                    return None;
                }
            },
        };
        // An io_uring worker's `syscall` file shows registers copied from the thread that made
        // it, not what it does: a worker that is not idle (or gone) is a possible sender that
        // can not be named.
        let r = if io_worker {
            match look_at_worker(dfd, name) {
                WorkerLook::Busy => Err(true),
                WorkerLook::Idle | WorkerLook::Gone => Ok(None),
            }
        } else {
            read_syscall(fd, tid)
        };
        if owned {
            // SAFETY: the fd opened just above for this read.
            unsafe { libc::close(fd) };
        }
        let c = match r {
            Ok(c) => c,
            Err(true) => Some(Candidate {
                tid,
                start: 0,
                end: u64::MAX,
                io_worker: false,
            }),
            Err(false) => {
                // Gone since the listing: not a sender any more. Unreadable: can not be named.
                if !last_error_is_gone() {
                    self.overflowed = true;
                }
                None
            }
        };
        c.map(|c| Candidate { io_worker, ..c })
    }
}

/// Whether an open `/proc/TID/syscall` file still belongs to a live thread (a read of a file
/// whose thread is gone fails with `ESRCH`, even when the tid was given to a new thread since).
pub(super) fn task_file_live(fd: i32) -> bool {
    let mut buf = [0u8; 256];
    // SAFETY: reads into our stack buffer at offset 0.
    let got = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    got > 0 || !last_error_is_gone()
}

/// Whether the last failed call failed because the thread is gone.
fn last_error_is_gone() -> bool {
    matches!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOENT | libc::ESRCH)
    )
}

/// `PF_IO_WORKER` (include/linux/sched.h), in the flags field of `/proc/TID/stat`.
pub(super) const PF_IO_WORKER: u64 = 0x10;

/// Whether thread `name` is an io_uring worker: `PF_IO_WORKER` in its `stat` flags, set when
/// the kernel creates it (its `comm` becomes `iou-wrk-*` only once it runs, so a worker seen
/// right after its creation carries its creator's name). Unreadable: not one.
pub(super) fn is_io_worker(dfd: i32, name: &[u8]) -> bool {
    let mut buf = [0u8; 512];
    let (got, _) = read_task(dfd, name, b"/stat\0", &mut buf);
    stat_flags(&buf[..got]).is_some_and(|f| f & PF_IO_WORKER != 0)
}

/// What a look at an io_uring worker found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WorkerLook {
    /// Waiting for work: not inside any call.
    Idle,
    /// Running, or blocked somewhere else (or unreadable): maybe inside a call.
    Busy,
    /// Exited.
    Gone,
}

/// Whether io_uring worker `name` waits for work. It does so in `io_wq_worker`, in an
/// interruptible `schedule_timeout` (state `S`). Its `wchan` names where it sleeps, as the
/// kernel's unwinder finds it: `io_wq_worker` with the ORC or frame-pointer unwinder (this
/// machine's 6.18); with the "guess" unwinder (`CONFIG_UNWINDER_GUESS`, the 6.1 guests) the first
/// text address on its stack, which for that sleep is the on-stack timer's `process_timeout`.
/// `process_timeout` alone proves nothing (any `schedule_timeout` leaves it there, and a guess
/// may read a stale word), so it counts only with state `S`: every sleep of a worker inside the
/// calls that send a `REMOVE` — the wait for the message's read (killable), `mmap_lock`, the
/// inode and `i_mmap` locks of a punch — is uninterruptible (`D`), or it runs (`R`).
fn look_at_worker(dfd: i32, name: &[u8]) -> WorkerLook {
    let wchan = read_small(dfd, name, b"/wchan\0");
    if wchan.1 == 0 {
        return if wchan.2 {
            WorkerLook::Gone
        } else {
            WorkerLook::Busy
        };
    }
    if wchan.starts_with(b"io_wq_worker") {
        return WorkerLook::Idle;
    }
    if wchan.0[..wchan.1] != *b"process_timeout" {
        return WorkerLook::Busy;
    }
    let mut buf = [0u8; 512];
    match read_task(dfd, name, b"/stat\0", &mut buf) {
        (0, true) => WorkerLook::Gone,
        (got, _) if stat_state(&buf[..got]) == Some(b'S') => WorkerLook::Idle,
        _ => WorkerLook::Busy,
    }
}

/// The state letter of a `/proc/TID/stat` line (the first field after the `)` that ends the
/// command name).
pub(super) fn stat_state(line: &[u8]) -> Option<u8> {
    let close = line.iter().rposition(|&b| b == b')')?;
    line[close + 1..].iter().copied().find(|&b| b != b' ')
}

/// The flags field of a `/proc/TID/stat` line (the 9th; counted after the `)` that ends the
/// command name, which may itself hold spaces and parentheses).
pub(super) fn stat_flags(line: &[u8]) -> Option<u64> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line[close + 1..]
        .split(|&b| b == b' ')
        .filter(|w| !w.is_empty());
    // state ppid pgrp session tty_nr tpgid flags
    let flags = fields.nth(6)?;
    parse_dec(flags).map(|v| v as u64)
}

/// The first bytes of `NAME` + `suffix` (NUL-terminated) under the task directory (empty on
/// failure).
fn read_small(dfd: i32, name: &[u8], suffix: &[u8]) -> SmallBuf {
    let mut out = SmallBuf([0; 32], 0, false);
    (out.1, out.2) = read_task(dfd, name, suffix, &mut out.0);
    out
}

/// Reads `NAME` + `suffix` (NUL-terminated) under the task directory into `buf`: the bytes
/// read (0 on failure), and whether it failed because the thread is gone.
fn read_task(dfd: i32, name: &[u8], suffix: &[u8], buf: &mut [u8]) -> (usize, bool) {
    let Some(fd) = open_task(dfd, name, suffix) else {
        return (0, last_error_is_gone());
    };
    // SAFETY: reads into the caller's buffer and closes the fd opened above.
    let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    let gone = got < 0 && last_error_is_gone();
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
    (got.max(0) as usize, gone)
}

/// A few bytes read from a `/proc` file, and whether it failed because the thread is gone.
struct SmallBuf([u8; 32], usize, bool);

impl SmallBuf {
    fn starts_with(&self, p: &[u8]) -> bool {
        self.0[..self.1].starts_with(p)
    }
}

impl Drop for Scanner {
    fn drop(&mut self) {
        for o in &self.open[..self.n_open] {
            // SAFETY: fds this scanner opened and owns.
            unsafe { libc::close(o.1) };
        }
    }
}

/// Opens `NAME/syscall` under the task directory.
fn open_syscall(dfd: i32, name: &[u8]) -> Option<i32> {
    open_task(dfd, name, b"/syscall\0")
}

/// Opens `NAME` + `suffix` (NUL-terminated) under the task directory, read-only.
fn open_task(dfd: i32, name: &[u8], suffix: &[u8]) -> Option<i32> {
    let mut path = [0u8; 40];
    if name.len() + suffix.len() > path.len() {
        return None;
    }
    path[..name.len()].copy_from_slice(name);
    path[name.len()..name.len() + suffix.len()].copy_from_slice(suffix);
    // SAFETY: a NUL-terminated relative path under our directory fd.
    let fd = unsafe { libc::openat(dfd, path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// `Ok(candidate or not)`, `Err(true)` if the thread was running, `Err(false)` on failure.
fn read_syscall(fd: i32, tid: i32) -> Result<Option<Candidate>, bool> {
    let mut buf = [0u8; 256];
    // SAFETY: reads into our stack buffer; offset 0 makes the kernel generate the line afresh.
    let got = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if got <= 0 {
        return Err(false);
    }
    let line = &buf[..got as usize];
    if line.starts_with(b"running") {
        return Err(true);
    }
    Ok(parse_syscall(line, tid))
}

fn parse_dec(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 18 {
        return None;
    }
    let mut v = 0i64;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (b - b'0') as i64;
    }
    Some(v)
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    let s = s.strip_prefix(b"0x")?;
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &b in s {
        let d = (b as char).to_digit(16)?;
        v = v << 4 | d as u64;
    }
    Some(v)
}

/// Parses a `/proc/TID/syscall` line: `nr arg1 .. arg6 sp pc`, or `running`, or `-1 sp pc`.
pub(crate) fn parse_syscall(line: &[u8], tid: i32) -> Option<Candidate> {
    let mut it = line
        .split(|&b| b == b' ' || b == b'\n')
        .filter(|w| !w.is_empty());
    let nr = parse_dec(it.next()?)?;
    match nr {
        NR_MADVISE => {
            let addr = parse_hex(it.next()?)?;
            let len = parse_hex(it.next()?)?;
            Some(Candidate {
                tid,
                start: addr,
                end: addr.saturating_add(len.max(1)),
                io_worker: false,
            })
        }
        // Its ranges are in an iovec of the caller: any range may be its.
        NR_PROCESS_MADVISE => Some(Candidate {
            tid,
            start: 0,
            end: u64::MAX,
            io_worker: false,
        }),
        _ => None,
    }
}
