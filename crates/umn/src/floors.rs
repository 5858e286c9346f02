//! The kernel floor under each backend's registered munmap and madvise (issue 23): the kernel
//! work its design can not skip, made directly on pages of the benchmark's own, in the same
//! process and run as the rows it is the floor of.
//!
//! * userfaultfd: a round trip. A page watched by a userfaultfd context of the benchmark's own
//!   (the library's events), whose messages a bare thread reads in a blocking loop: the call
//!   sends its message, sleeps until the read, then finishes.
//! * hybrid: `UFFDIO_UNREGISTER` of the page, the call, and the signal-mask pair around both
//!   (the hook holds the index lock with every signal blocked: guarantee 4). No message is sent.
//! * hooks: the call and the signal-mask pair.
//! * perf, eBPF and the module: the plain call on a page nobody registered. Their hook runs in
//!   the kernel on every call, registered or not, so the unregistered call is what a registered
//!   one can not be cheaper than.
//!
//! `bench/hybrid_floor.c` measures the hybrid floor from C the same way.
#![allow(unsafe_code)] // userfaultfd ioctls, mmap/munmap/madvise of benchmark pages, sigprocmask.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use crate::backends::lone_page;
use crate::bench::{touch, unmap};

const PG: usize = 4096;

/// What a backend's registered munmap/madvise can not skip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Floor {
    /// userfaultfd: the message's round trip to a reader thread.
    RoundTrip,
    /// hybrid: unregister in the calling thread, the call, with signals blocked.
    Unwatch,
    /// hooks: the call, with signals blocked.
    Masked,
    /// perf, eBPF, the module: the call itself.
    Plain,
}

impl Floor {
    /// The floor of backend `name` (as `umn bench --backends` names them).
    pub(crate) fn of(name: &str) -> Floor {
        match name {
            "uffd" => Floor::RoundTrip,
            "hybrid" => Floor::Unwatch,
            "hooks" => Floor::Masked,
            _ => Floor::Plain,
        }
    }

    /// The baseline's name in the table.
    pub(crate) fn name(self, op: &str) -> String {
        let what = match self {
            Floor::RoundTrip => "uffd_round_trip",
            Floor::Unwatch => "unregister_masked",
            Floor::Masked => "masked",
            Floor::Plain => "plain",
        };
        format!("{op}_floor_4k_{what}")
    }
}

/// Times the floor's calls, one page each, taking turns with the rows' own calls.
pub(crate) struct Probe {
    floor: Floor,
    uffd: Option<RawUffd>,
    reader: Option<Reader>,
}

impl Probe {
    pub(crate) fn new(floor: Floor) -> Result<Probe, String> {
        let uffd = match floor {
            Floor::RoundTrip | Floor::Unwatch => Some(RawUffd::open(floor == Floor::Unwatch)?),
            Floor::Masked | Floor::Plain => None,
        };
        let reader = match (&uffd, floor) {
            (Some(u), Floor::RoundTrip) => Some(Reader::start(u)?),
            _ => None,
        };
        Ok(Probe {
            floor,
            uffd,
            reader,
        })
    }

    /// ns of the floor under a registered 4 KiB munmap.
    pub(crate) fn munmap(&self) -> Result<f64, String> {
        self.time(false)
    }

    /// ns of the floor under a registered 4 KiB madvise(DONTNEED).
    pub(crate) fn madvise(&self) -> Result<f64, String> {
        self.time(true)
    }

    fn time(&self, madvise: bool) -> Result<f64, String> {
        if let Some(r) = &self.reader {
            r.check()?;
        }
        let p = lone_page();
        touch(p, PG);
        if let Some(u) = &self.uffd {
            u.register(p)?;
        }
        let t = Instant::now();
        let mask = matches!(self.floor, Floor::Unwatch | Floor::Masked).then(block_signals);
        let unwatched = match (&self.uffd, self.floor) {
            (Some(u), Floor::Unwatch) => u.unregister(p),
            _ => Ok(()),
        };
        // The raw syscall: a backend's libc hook is the backend's cost, not the kernel's.
        // SAFETY: a page of our own.
        unsafe {
            if madvise {
                libc::syscall(libc::SYS_madvise, p, PG, libc::MADV_DONTNEED);
            } else {
                libc::syscall(libc::SYS_munmap, p, PG);
            }
        }
        if let Some(old) = mask {
            restore_signals(&old);
        }
        let ns = t.elapsed().as_nanos() as f64;
        if madvise {
            unmap(p, PG);
        }
        unwatched.map(|()| ns)
    }

    /// Stops the reader thread, if any.
    pub(crate) fn finish(self) -> Result<(), String> {
        match (self.reader, &self.uffd) {
            (Some(r), Some(u)) => r.stop(u),
            _ => Ok(()),
        }
    }
}

/// Blocks every signal of this thread; returns the old mask (for [`restore_signals`]).
pub(crate) fn block_signals() -> libc::sigset_t {
    // SAFETY: plain sigset_t values; blocks every signal of this thread, keeping the old mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

pub(crate) fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: restores a mask `block_signals` returned.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// A userfaultfd context of the benchmark's own, with the events the library asks for
/// (`UNMAP`, `REMOVE`, `REMAP`, and `WP_ASYNC` where offered), watching in write-protect mode as
/// the library does.
pub(crate) struct RawUffd {
    fd: OwnedFd,
}

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct Register {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_aa01;
const MODE_WP: u64 = 2;
/// EVENT_REMAP | EVENT_REMOVE | EVENT_UNMAP.
const EVENTS: u64 = (1 << 3) | (1 << 4) | (1 << 6);
const WP_ASYNC: u64 = 1 << 15;

impl RawUffd {
    /// A context; `nonblock` for one nobody reads (its calls must not wait for a reader).
    pub(crate) fn open(nonblock: bool) -> Result<RawUffd, String> {
        let offered = Self::open_with(true, 0)?.1;
        Ok(Self::open_with(nonblock, EVENTS | (offered & WP_ASYNC))?.0)
    }

    /// A context asking for `features` exactly, and what the kernel offers.
    fn open_with(nonblock: bool, features: u64) -> Result<(RawUffd, u64), String> {
        let flags = libc::O_CLOEXEC | if nonblock { libc::O_NONBLOCK } else { 0 };
        // SAFETY: userfaultfd with flags only.
        let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
        if raw < 0 {
            return Err(format!("userfaultfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a new fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut api = Api {
            api: 0xaa,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one struct.
        if unsafe { libc::ioctl(raw, UFFDIO_API, &mut api) } != 0 {
            return Err(format!("UFFDIO_API: {}", std::io::Error::last_os_error()));
        }
        Ok((RawUffd { fd }, api.features))
    }

    fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Watches the page at `at`.
    pub(crate) fn register(&self, at: usize) -> Result<(), String> {
        let mut r = Register {
            start: at as u64,
            len: PG as u64,
            mode: MODE_WP,
            ioctls: 0,
        };
        // SAFETY: registers a page of the caller's own mapping with our own context.
        if unsafe { libc::ioctl(self.fd(), UFFDIO_REGISTER, &mut r) } != 0 {
            return Err(format!(
                "UFFDIO_REGISTER: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    fn unregister(&self, at: usize) -> Result<(), String> {
        let mut r = [at as u64, PG as u64];
        // SAFETY: UFFDIO_UNREGISTER reads one range of our own.
        if unsafe { libc::ioctl(self.fd(), UFFDIO_UNREGISTER, r.as_mut_ptr()) } != 0 {
            return Err(format!(
                "UFFDIO_UNREGISTER: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

/// A thread reading a context's messages in a blocking loop, as bare as a reader can be.
struct Reader {
    /// The page whose unmap message ends the loop. It stays mapped from `start` to `stop`, so
    /// no page the floor unmaps meanwhile can have its address: a message for an earlier page
    /// that happened to sit there ended the loop too early once (issue 23), and the stop page's
    /// munmap then waited forever for a reader that was gone.
    stop_page: usize,
    thread: std::thread::JoinHandle<()>,
}

/// `UFFD_EVENT_UNMAP`.
const EVENT_UNMAP: u8 = 0x16;

impl Reader {
    fn start(uffd: &RawUffd) -> Result<Reader, String> {
        let stop_page = lone_page();
        let fd = uffd.fd();
        let thread = std::thread::Builder::new()
            .name("floor-reader".into())
            .spawn(move || {
                let mut msg = [0u8; 32];
                loop {
                    // SAFETY: reads one uffd_msg into our buffer; the fd outlives the thread
                    // (`stop` joins it before the context is closed).
                    if unsafe { libc::read(fd, msg.as_mut_ptr().cast(), msg.len()) } < 0 {
                        let e = std::io::Error::last_os_error();
                        if e.kind() == std::io::ErrorKind::Interrupted {
                            continue;
                        }
                        // Nobody reads this context any more: an unmap of a page it watches
                        // would wait forever. `check` sees the thread gone and fails the bench
                        // before the next one.
                        eprintln!("floor reader: read of its userfaultfd failed: {e}");
                        return;
                    }
                    // Only the stop page's own message ends the loop: a flag checked between
                    // reads could end it before that message is read, and its munmap would
                    // wait forever (it did: CI hung here, issue 23).
                    let start = u64::from_ne_bytes(msg[8..16].try_into().expect("8 bytes"));
                    if msg[0] == EVENT_UNMAP && start == stop_page as u64 {
                        return;
                    }
                }
            })
            .map_err(|e| {
                unmap(stop_page, PG);
                e.to_string()
            })?;
        Ok(Reader { stop_page, thread })
    }

    /// An error if the reader has stopped reading (before `stop`, it returns only when a read
    /// fails).
    fn check(&self) -> Result<(), String> {
        if self.thread.is_finished() {
            return Err("the floor's reader thread is gone: its context is not read".into());
        }
        Ok(())
    }

    /// Stops the reader: the stop page, watched and unmapped, is the message it ends on.
    fn stop(self, uffd: &RawUffd) -> Result<(), String> {
        let checked = self.check().and_then(|()| uffd.register(self.stop_page));
        // Unmapped either way; watched only if the reader is there to read its message.
        unmap(self.stop_page, PG);
        checked?;
        self.thread
            .join()
            .map_err(|_| "floor reader panicked".to_string())
    }
}
