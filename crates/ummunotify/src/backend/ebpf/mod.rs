//! The eBPF backend: BPF programs on the syscall tracepoints bump a word per registered range,
//! in the calling thread, before the syscall changes anything: the 2010 device's semantics
//! with a one-load check.
//!
//! # Mechanism
//! Programs (`prog.rs`) on `syscalls:sys_enter_{munmap, mremap, madvise, brk, mmap, shmdt,
//! shmat, process_madvise, remap_file_pages}` (and three for identity, below) compute from the arguments the range the call
//! will change (madvise only for advice that drops frames, mmap only with `MAP_FIXED`, shmat
//! only with `SHM_REMAP`), find the caller's *area* by its tgid (`procs`, a hash of maps), and
//! bump the word of every registered range that overlaps, plus the area's counter. The area
//! (`layout.rs`) is a `BPF_F_MMAPABLE` array the process maps: registering writes a range into a
//! free slot and remembers the slot's word; [`Area::is_valid`] is one load and a compare.
//!
//! # Example
//! Through the notifier: `Notifier::with_backend(Backend::Ebpf)` (or `UMN_BACKEND=ebpf`). The
//! mechanism underneath, directly:
//! ```no_run
//! use ummunotify::ebpf::Area;
//! let area = Area::shared()?; // from `umn daemon`, or the programs loaded here as root
//! let buf = vec![0u8; 1 << 16];
//! let start = buf.as_ptr() as u64;
//! let ticket = area.register(start, start + buf.len() as u64)?;
//! // ... pin `buf` for a device, then before each use:
//! assert!(area.is_valid(ticket)); // one load and a compare
//! area.unregister(ticket);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Visibility rule (guarantee 1)
//! The entry program runs in the calling thread before the syscall does its work, and bumps
//! the word with a locked add: once the call has returned in any thread, a later load of the
//! word in any thread sees the bump.
//!
//! # Start and end (issue 9's problem)
//! An entry program that ran before a range was registered did not see it; if the call's
//! change completes after the registration pinned its frames, the registration would hold the
//! old frames. So the entry program also stores the call's range in `inflight[pid_tgid]`, and
//! one program on the matching `sys_exit_*` tracepoints takes it back and bumps again every
//! range that overlaps *now*. [`Area::register`] writes the range, fences, and only then reads
//! the word it will compare with; any call whose exit comes after that read bumps the word
//! (its change may not be complete), any call whose exit came before it had finished its change
//! before the registration pinned anything. No registration made inside a call's window stays
//! valid after the call returns.
//!
//! # Per-process filtering
//! `procs` is keyed by tgid: one area per process, found with one hash lookup; a call of any
//! other process costs the programs' argument filter and that lookup (a miss). Forked children
//! have another tgid, so their calls never touch the parent's area; a `pthread_atfork` child
//! handler replaces every area mapping with private memory whose words can match no ticket.
//!
//! # Identity: an area belongs to a program, not to a pid (issue 40)
//! A tgid outlives the program that asked (`exec`, a setuid one too) and is reused after it
//! exits, while the connection and the area fd may be kept by a forked helper. So a private
//! map `state[tgid] = {nonce, flags}` (never given to clients) says whose area `procs[tgid]`
//! is. The daemon creates the area with a random nonce, not armed, and sends the nonce with the
//! fd; the client *arms* it from its own process ([`Area::connect`]: `prctl(0x554d4e31,
//! nonce)`, an option no kernel defines, `EINVAL`): a program on `sys_enter_prctl` sets ARMED
//! only for the tgid holding that nonce and not GONE, and writes the tgid into the area's
//! `armed` word, which the client checks. Programs on `sched_process_exec` and
//! `sched_process_exit` (the group leader's) set GONE and mark an armed area dead (the `dead`
//! word, every word and the counter bumped: every check fails, registration is refused). The
//! watched-call programs write into an area only while it is ARMED and not GONE. Hence no
//! event of another program ever reaches an area: not after exec (GONE), not from a process
//! that reuses the pid (GONE, or an area it never armed), not from a hello whose sender exec'd
//! before arming (never armed). The daemon replaces a gone or never-armed area on a new hello
//! for that pid, refuses (`EEXIST`) an armed live one, removes an area only with its nonce (a
//! stale connection never removes its successor's), and sweeps gone ones on each connection
//! ([`Programs::gone`]). Programs only set flags: the verifier lets them look up, not change,
//! a hash of maps, so entries are deleted by the daemon. The area holds its nonce too, and
//! every program writes only when the area's nonce is the state's: a replacement racing a
//! program between its two lookups (a preallocated hash reuses a deleted element at once)
//! never pairs one program's area with another's state.
//!
//! Limits: a process whose main thread exits before its other threads loses its area (every
//! check fails, registration errors); the programs see the initial pid namespace's ids, so a
//! daemon in another pid namespace refuses to start ([`Programs::check_pid_namespace`]);
//! clients in containers are fine (`SO_PEERCRED` gives the daemon host pids).
//!
//! # Privilege: loading needs root, using does not
//! [`Programs::load`] needs `CAP_BPF`+`CAP_PERFMON` (root): it creates the maps, loads and
//! attaches the programs (one perf event per tracepoint, `pid = -1`). A root process can use
//! them itself ([`Area::open_local`]); `umn daemon` loads them once per node and hands each
//! connecting process its area's fd and nonce over a Unix socket (`SCM_RIGHTS`, [`Daemon`],
//! [`Area::connect`], reply `ok <layout> <slots> <nonce: 16 hex digits>`); `mmap` on an fd one
//! holds and the arming `prctl` need no privilege.
//!
//! # A daemon's clients (issue 40)
//! The daemon (`daemon.rs`) serves from one `poll` loop with a hello deadline and per-uid and
//! total limits ([`DaemonConfig`]). A client trusts only a daemon running as root or as the
//! system user `ummunotify`, and only an fd that is an mmapable BPF array of one area. No
//! client goes stale silently: a daemon stopped by `SIGTERM`/`SIGINT`/`SIGHUP` marks every
//! area dead (`OFF_DEAD`, every word and the counter bumped) before it detaches; a killed one
//! is seen by each client's watcher thread (blocked in `poll` on the connection), which marks
//! its own area the same way. [`Area::register`] then fails with
//! [`MonitorDead`](crate::Error::MonitorDead). Residual window: after a `SIGKILL`, between the
//! programs' detaching and the watcher's wakeup, a change is not seen.
//!
//! # What it misses (shown as missed by `umn coverage --backend ebpf`)
//! Calls that do not go through these syscall entries: ia32 `int $0x80`, io_uring
//! `IORING_OP_MADVISE`, `fallocate(PUNCH_HOLE)`/`ftruncate` of a shared file or memfd, kernel
//! internal changes (migration, KSM, THP collapse by khugepaged, reclaim of unpinned pages).
//! `shmdt`/`shmat(SHM_REMAP)` invalidate everything above the address (the segment size is not
//! in the arguments).
//!
//! # Limits
//! [`SLOTS`] ranges per process (the verifier's budget for the scan); [`MAX_PROCESSES`]
//! processes per set of programs; 65,536 threads inside a watched call at once, node-wide (the
//! `inflight` map: a call whose record does not fit is still seen at entry, but a registration
//! inside its window is not caught at its exit).
//!
//! # Costs
//! While the programs are attached, *every* syscall of *every* process on the node pays the
//! syscall-tracepoint entry/exit path (KERNEL-FACTS "eBPF": getpid 240 → 331 ns); a watched
//! call pays the programs (a hash lookup, and a scan of the process's ranges when the call
//! falls inside their bounding box). Ranges per process: [`SLOTS`].
//!
//! # Toolchain
//! The programs are assembled here, in Rust (`asm.rs`), and loaded with the raw `bpf(2)` syscall
//! (`sys.rs`): the build needs no clang, no libbpf, no bpf-linker or nightly toolchain (aya's
//! in-kernel side), no `vmlinux.h`; it builds wherever the crate builds. That is possible
//! because the programs read only the tracepoint record (its offsets parsed from tracefs) and
//! maps, never a kernel structure, so there is nothing for CO-RE to relocate.
#![allow(unsafe_code)] // The area is shared memory written by the kernel; fork handler.

pub(crate) mod asm;
mod daemon;
pub(crate) mod layout;
pub(crate) mod prog;
pub(crate) mod sys;
mod watcher;

pub use daemon::{Daemon, DaemonConfig};
pub(crate) use watcher::EbpfWatcher;

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, Weak};

pub use layout::SLOTS;
use layout::*;

/// The socket `umn daemon` listens on unless `UMN_EBPF_SOCKET` names another.
pub const DEFAULT_SOCKET: &str = "/run/ummunotify/ebpf.sock";
/// The environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "UMN_EBPF_SOCKET";
/// Processes one set of programs serves at once.
pub const MAX_PROCESSES: u32 = 4096;
/// Threads inside a watched call at once, node-wide.
const MAX_INFLIGHT: u32 = 65536;

const HELLO: &[u8] = b"umn-ebpf 1\n";

fn ctx(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The loaded and attached programs and their maps. Dropping it detaches them.
pub struct Programs {
    procs: OwnedFd,
    /// `state[tgid] = {nonce, flags}`: whether the area of `procs[tgid]` is armed or gone.
    state: OwnedFd,
    /// Serializes the userspace changes of `procs` and `state` (the programs only set flags).
    lock: Mutex<()>,
    _inflight: OwnedFd,
    _template: OwnedFd,
    _progs: Vec<OwnedFd>,
    _links: Vec<OwnedFd>,
    attached: Vec<String>,
}

fn area_map() -> io::Result<OwnedFd> {
    sys::map_create(
        "umn_area",
        sys::BPF_MAP_TYPE_ARRAY,
        4,
        AREA_SIZE as u32,
        1,
        sys::BPF_F_MMAPABLE,
        None,
    )
}

impl Programs {
    /// Creates the maps, loads the programs and attaches them to the syscall tracepoints
    /// (mounting tracefs when it is not). Needs root (`CAP_BPF` and `CAP_PERFMON`).
    ///
    /// # Errors
    /// The failing step and its errno (`EPERM` without privilege), or the verifier's words.
    pub fn load() -> io::Result<Programs> {
        let template = area_map().map_err(|e| ctx("bpf(BPF_MAP_CREATE, mmapable array)", e))?;
        let procs = sys::map_create(
            "umn_procs",
            sys::BPF_MAP_TYPE_HASH_OF_MAPS,
            4,
            4,
            MAX_PROCESSES,
            0,
            Some(template.as_fd()),
        )
        .map_err(|e| ctx("bpf(BPF_MAP_CREATE, hash of maps)", e))?;
        let inflight = sys::map_create(
            "umn_inflight",
            sys::BPF_MAP_TYPE_HASH,
            8,
            32,
            MAX_INFLIGHT,
            0,
            None,
        )
        .map_err(|e| ctx("bpf(BPF_MAP_CREATE, hash)", e))?;
        let state = sys::map_create(
            "umn_state",
            sys::BPF_MAP_TYPE_HASH,
            4,
            STATE_SIZE as u32,
            MAX_PROCESSES,
            0,
            None,
        )
        .map_err(|e| ctx("bpf(BPF_MAP_CREATE, hash)", e))?;
        let maps = prog::Maps {
            procs: procs.as_raw_fd(),
            state: state.as_raw_fd(),
            inflight: inflight.as_raw_fd(),
        };
        let mut progs = Vec::new();
        let mut links = Vec::new();
        let mut attached = Vec::new();
        let mut exit_prog: Option<(OwnedFd, i16)> = None;
        for kind in prog::Syscall::ALL {
            let enter_tp = format!("sys_enter_{}", kind.name());
            let exit_tp = format!("sys_exit_{}", kind.name());
            let (id, arg0) = sys::tracepoint(&enter_tp)?;
            let (exit_id, ret) = sys::tracepoint(&exit_tp)?;
            let name = format!("umn_{}", kind.name());
            let fd = sys::prog_load_tracepoint(&name, &prog::enter(kind, arg0, maps))?;
            if exit_prog.is_none() {
                let e = sys::prog_load_tracepoint("umn_exit", &prog::exit(ret, maps))?;
                exit_prog = Some((e, ret));
            }
            let (efd, eret) = exit_prog.as_ref().expect("loaded above");
            if *eret != ret {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{exit_tp}: ret at offset {ret}, other sys_exit records at {eret}"),
                ));
            }
            links.push(sys::attach_tracepoint(id, fd.as_fd()).map_err(|e| ctx(&enter_tp, e))?);
            links.push(sys::attach_tracepoint(exit_id, efd.as_fd()).map_err(|e| ctx(&exit_tp, e))?);
            progs.push(fd);
            attached.push(enter_tp);
            attached.push(exit_tp);
        }
        progs.extend(exit_prog.map(|(fd, _)| fd));
        // Identity: arming (the client's own prctl), exec and leader exit (see "Identity").
        let (prctl_id, option) = sys::tracepoint("sys_enter_prctl")?;
        let identity = [
            (
                "syscalls",
                "sys_enter_prctl",
                "umn_arm",
                prog::arm(option, maps),
                prctl_id,
            ),
            (
                "sched",
                "sched_process_exec",
                "umn_exec",
                prog::gone(false, maps),
                0,
            ),
            (
                "sched",
                "sched_process_exit",
                "umn_gone",
                prog::gone(true, maps),
                0,
            ),
        ];
        for (group, tp, name, insns, id) in identity {
            let id = if id != 0 {
                id
            } else {
                sys::tracepoint_id(group, tp)?
            };
            let fd = sys::prog_load_tracepoint(name, &insns)?;
            links.push(sys::attach_tracepoint(id, fd.as_fd()).map_err(|e| ctx(tp, e))?);
            progs.push(fd);
            attached.push(tp.to_string());
        }
        Ok(Programs {
            procs,
            state,
            lock: Mutex::new(()),
            _inflight: inflight,
            _template: template,
            _progs: progs,
            _links: links,
            attached,
        })
    }

    /// The tracepoints the programs are attached to.
    pub fn tracepoints(&self) -> &[String] {
        &self.attached
    }

    /// Creates an area for process `tgid`, records `nonce` for it in `state` (not armed) and
    /// enters the area in `procs`. An area already there is replaced when it is gone (its
    /// process exec'd or exited) or was never armed; an armed, live one is kept: `EEXIST`.
    pub fn new_area(&self, tgid: u32, nonce: u64) -> io::Result<OwnedFd> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        match self.state(tgid) {
            Some((_, flags)) if flags & (ARMED | GONE) == ARMED => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("pid {tgid} already has an armed area (File exists)"),
                ))
            }
            _ => self.delete(tgid),
        }
        let map = area_map().map_err(|e| ctx("bpf(BPF_MAP_CREATE, area)", e))?;
        let mut init = vec![0u8; AREA_SIZE];
        init[OFF_LO..OFF_LO + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
        init[OFF_LAYOUT..OFF_LAYOUT + 8].copy_from_slice(&LAYOUT_VERSION.to_ne_bytes());
        init[OFF_NONCE..OFF_NONCE + 8].copy_from_slice(&nonce.to_ne_bytes());
        sys::map_update(map.as_fd(), &0u32.to_ne_bytes(), &init, 0)
            .map_err(|e| ctx("bpf(BPF_MAP_UPDATE_ELEM, area)", e))?;
        let mut st = [0u8; STATE_SIZE];
        st[..8].copy_from_slice(&nonce.to_ne_bytes());
        const NOEXIST: u64 = 1;
        // state before procs: the programs find an area only through procs, then its state.
        sys::map_update(self.state.as_fd(), &tgid.to_ne_bytes(), &st, NOEXIST)
            .map_err(|e| ctx("bpf(BPF_MAP_UPDATE_ELEM, state)", e))?;
        let fd = (map.as_raw_fd() as u32).to_ne_bytes();
        if let Err(e) = sys::map_update(self.procs.as_fd(), &tgid.to_ne_bytes(), &fd, NOEXIST) {
            let _ = sys::map_delete(self.state.as_fd(), &tgid.to_ne_bytes());
            return Err(ctx("bpf(BPF_MAP_UPDATE_ELEM, procs)", e));
        }
        Ok(map)
    }

    /// Takes process `tgid`'s area out of `procs` and `state` if it is still the one created
    /// with `nonce` (a connection that outlived its process never removes the area a later
    /// process with the same pid got).
    pub fn remove(&self, tgid: u32, nonce: u64) -> io::Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        match self.state(tgid) {
            Some((n, _)) if n == nonce => {
                self.delete(tgid);
                Ok(())
            }
            _ => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// procs first (the programs stop finding the area), then state.
    fn delete(&self, tgid: u32) {
        let _ = sys::map_delete(self.procs.as_fd(), &tgid.to_ne_bytes());
        let _ = sys::map_delete(self.state.as_fd(), &tgid.to_ne_bytes());
    }

    /// `state[tgid]`: its nonce and flags.
    fn state(&self, tgid: u32) -> Option<(u64, u64)> {
        let mut v = [0u8; STATE_SIZE];
        sys::map_lookup(self.state.as_fd(), &tgid.to_ne_bytes(), &mut v).ok()?;
        let nonce = u64::from_ne_bytes(v[..8].try_into().expect("8 bytes"));
        let flags = u64::from_ne_bytes(v[8..].try_into().expect("8 bytes"));
        Some((nonce, flags))
    }

    /// The areas whose process exec'd or whose leader exited, as `(tgid, nonce)`: no program
    /// writes into them any more; [`Programs::remove`] them to free their entries.
    pub fn gone(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let mut key: Option<[u8; 4]> = None;
        let mut next = [0u8; 4];
        for _ in 0..=MAX_PROCESSES {
            if sys::map_next_key(self.state.as_fd(), key.as_ref().map(|k| &k[..]), &mut next)
                .is_err()
            {
                break;
            }
            let tgid = u32::from_ne_bytes(next);
            if let Some((nonce, flags)) = self.state(tgid) {
                if flags & GONE != 0 {
                    out.push((tgid, nonce));
                }
            }
            key = Some(next);
        }
        out
    }

    /// Whether `tgid` has an area.
    pub fn has_area(&self, tgid: u32) -> bool {
        let mut id = [0u8; 4];
        sys::map_lookup(self.procs.as_fd(), &tgid.to_ne_bytes(), &mut id).is_ok()
    }

    /// Checks that the programs see this process under [`getpid`](libc::getpid): an area for
    /// it, armed with the magic prctl, must report this pid. They see the initial pid
    /// namespace's ids, so a daemon in another pid namespace (a container without the host's
    /// pids) would key its clients by pids the programs never see.
    ///
    /// # Errors
    /// Says that the process runs in a pid namespace other than the host's (with its `NSpid`),
    /// or that the programs did not arm the test area.
    pub fn check_pid_namespace(&self) -> io::Result<()> {
        let pid = getpid();
        let nonce = random_nonce()?;
        let map = self.new_area(pid, nonce)?;
        let seen = (|| {
            let len = map_len();
            let base = crate::sys::mmap_shared(map.as_fd(), len)?.as_ptr();
            arm_prctl(nonce);
            // SAFETY: OFF_ARMED is 8-aligned inside the mapping made above.
            let armed = unsafe { (*(base.add(OFF_ARMED) as *const AtomicU64)).load(SeqCst) };
            // SAFETY: the mapping made above, not used after.
            unsafe { libc::munmap(base.cast(), len) };
            Ok::<u64, io::Error>(armed)
        })();
        let _ = self.remove(pid, nonce);
        let seen = seen.map_err(|e| ctx("mmap(area)", e))?;
        if seen == u64::from(pid) {
            return Ok(());
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default();
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            if nspid.len() > 1 {
                format!(
                    "this process runs in a pid namespace other than the host's (NSpid: {}): the \
                     eBPF programs see host pids, the daemon its namespace's; run it in the \
                     host's pid namespace (a container needs --pid=host)",
                    nspid.join(" ")
                )
            } else {
                format!(
                    "the eBPF programs did not see this process (pid {pid}) arm its area (they \
                     saw {seen}): the daemon must run in the host's pid namespace"
                )
            },
        ))
    }
}

/// A random nonce (never 0).
fn random_nonce() -> io::Result<u64> {
    loop {
        let mut b = [0u8; 8];
        // SAFETY: writes at most 8 bytes into b.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ctx("getrandom", e));
        }
        let v = u64::from_ne_bytes(b);
        if n == 8 && v != 0 {
            return Ok(v);
        }
    }
}

/// The magic prctl the arming program watches (the kernel answers `EINVAL`).
fn arm_prctl(nonce: u64) {
    // SAFETY: an option no kernel defines: nothing changes, the call fails with EINVAL.
    unsafe {
        libc::syscall(
            libc::SYS_prctl,
            ARM_PRCTL as libc::c_ulong,
            nonce as libc::c_ulong,
            0,
            0,
            0,
        )
    };
}

/// A registered range's slot and the word it was registered with. [`Area::is_valid`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    slot: u32,
    word: u64,
}

impl Ticket {
    /// The slot (an index below [`SLOTS`]).
    pub fn slot(self) -> u32 {
        self.slot
    }
}

struct Slots {
    free: Vec<u32>,
    high: u32,
    /// Per slot: the word [`Area::drain`] last reported.
    reported: Vec<u64>,
}

enum Owner {
    Local(Programs),
    /// Served by a daemon: the connection (held open: the daemon drops the area on EOF) and
    /// what the watcher thread shares.
    Daemon(Arc<Link>),
}

/// An area's mapping, unmapped when its last holder (the [`Area`], its watcher thread) is
/// gone.
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in from_map with this length and nothing borrows it
        // (every borrow is tied to an Area or to the watcher, which hold this Mapping).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A daemon-served area's connection, shared with its watcher thread.
struct Link {
    conn: UnixStream,
    /// Set by the watcher when the daemon is gone (after it marked the area dead).
    dead: AtomicBool,
    /// Set by [`Area`]'s drop before it shuts the connection down: the watcher's wakeup is
    /// then no daemon's death.
    closing: AtomicBool,
}

/// Marks the area at `base` dead: the marker first, then every slot's word and the counter
/// bumped, so every ticket reads invalid and a registration that read its word before a bump
/// sees the marker when it checks it after (see [`Area::register`]).
///
/// # Safety
/// `base` is a live, writable mapping of an area of at least [`AREA_SIZE`] bytes.
unsafe fn mark_dead(base: *mut u8) {
    // SAFETY: every offset is 8-aligned inside the area (caller's obligation).
    let at = |off: usize| unsafe { &*(base.add(off) as *const AtomicU64) };
    at(OFF_DEAD).store(DEAD, SeqCst);
    for i in 0..SLOTS {
        at(OFF_WORDS + 8 * i).fetch_add(1, SeqCst);
    }
    at(OFF_GEN).fetch_add(1, SeqCst);
}

/// The watcher thread of a daemon-served area: blocked in `poll(2)` on the connection, and
/// nothing else; on its EOF or error (the daemon died: SIGKILL, a crash) marks the area dead
/// and sets the client's flag. A forked child has no such thread (threads do not survive
/// fork; the child loses the area in the atfork handler anyway).
fn watch(link: Arc<Link>, map: Arc<Mapping>) {
    let fd = link.conn.as_raw_fd();
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL) != 0 {
            break;
        }
        let mut sink = [0u8; 64];
        // SAFETY: sink is valid for its length.
        let n = unsafe { libc::recv(fd, sink.as_mut_ptr().cast(), sink.len(), libc::MSG_DONTWAIT) };
        if n == 0 {
            break;
        }
        if n < 0
            && !matches!(
                io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN) | Some(libc::EINTR)
            )
        {
            break;
        }
    }
    if link.closing.load(SeqCst) {
        return;
    }
    // SAFETY: map is a live area mapping (this thread holds it).
    unsafe { mark_dead(map.base) };
    link.dead.store(true, SeqCst);
}

/// Whether `uid` may serve areas: root, or the system user `ummunotify` (the packaged unit's).
fn trusted_daemon_uid(uid: u32) -> bool {
    uid == 0 || sys::user_uid("ummunotify") == Some(uid)
}

/// Checks that `fd` is what a daemon must hand: a `BPF_F_MMAPABLE` array map of one area
/// (from `/proc/self/fd` and `/proc/self/fdinfo`: no `bpf(2)` call, which unprivileged
/// processes may not make on kernels before 6.5 with `unprivileged_bpf_disabled`).
fn check_area_fd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the daemon's area is not an eBPF area: {why}"),
        )
    };
    let link = std::fs::read_link(format!("/proc/self/fd/{raw}"))
        .map_err(|e| ctx("readlink /proc/self/fd", e))?;
    if link.as_os_str() != "anon_inode:bpf-map" {
        return Err(bad(format!("its fd is {}, not a BPF map", link.display())));
    }
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}"))
        .map_err(|e| ctx("read /proc/self/fdinfo", e))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or("")
    };
    let flags = field("map_flags");
    let flags = u64::from_str_radix(flags.trim_start_matches("0x"), 16).unwrap_or(0);
    let want_size = AREA_SIZE.to_string();
    let want_type = sys::BPF_MAP_TYPE_ARRAY.to_string();
    if field("map_type") != want_type
        || field("value_size") != want_size
        || field("max_entries") != "1"
        || flags & u64::from(sys::BPF_F_MMAPABLE) == 0
    {
        return Err(bad(format!(
            "map_type {}, value_size {}, max_entries {}, map_flags {:#x} (wanted an mmapable \
             array, {want_size} bytes, 1 entry)",
            field("map_type"),
            field("value_size"),
            field("max_entries"),
            flags
        )));
    }
    Ok(())
}

/// One process's area, mapped: register ranges, check them with one load.
pub struct Area {
    base: *mut u8,
    len: usize,
    mapping: Arc<Mapping>,
    _map: OwnedFd,
    slots: Mutex<Slots>,
    pid: u32,
    nonce: u64,
    owner: Owner,
    fork_slot: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics; the slot table is
// behind a Mutex.
unsafe impl Send for Area {}
// SAFETY: as above.
unsafe impl Sync for Area {}

/// Live area mappings, for the fork handler (base address, length).
static FORK_AREAS: [(AtomicUsize, AtomicUsize); 64] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; 64];

static ATFORK: crate::fork::AtforkOnce = crate::fork::AtforkOnce::new();

extern "C" fn fork_child() {
    ATFORK.registered_in_child();
    for (b, l) in &FORK_AREAS {
        let (base, len) = (b.load(SeqCst), l.load(SeqCst));
        if base == 0 {
            continue;
        }
        // SAFETY: [base, base+len) is an area mapping of this (forked) process; replacing it
        // with private memory detaches the child from the parent's area. A raw mmap syscall
        // (never the `mmap` symbol, which a preload may interpose with locks) and plain stores
        // are async-signal-safe.
        unsafe {
            if crate::sys::raw_anon_fixed(base, len) {
                // Words can never reach u64::MAX: no ticket matches.
                let w = (base + OFF_WORDS) as *mut u64;
                for i in 0..SLOTS {
                    w.add(i).write_volatile(u64::MAX);
                }
                ((base + OFF_GEN) as *mut u64).write_volatile(u64::MAX);
            }
        }
    }
}

fn getpid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::getpid() as u32 }
}

fn map_len() -> usize {
    AREA_SIZE.div_ceil(PAGE as usize) * PAGE as usize
}

impl Area {
    /// Loads the programs in this process (root) and opens this process's area.
    ///
    /// # Errors
    /// See [`Programs::load`].
    pub fn open_local() -> io::Result<Area> {
        let programs = Programs::load()?;
        let nonce = random_nonce()?;
        let map = programs.new_area(getpid(), nonce)?;
        let area = Area::from_map(map, nonce, Owner::Local(programs))?;
        area.arm()?;
        Ok(area)
    }

    /// Asks the daemon on `path` for this process's area.
    ///
    /// # Errors
    /// No daemon there, the daemon's refusal (in its words), or a bad reply.
    ///
    /// Trusts only a daemon running as root or as the system user `ummunotify`
    /// (`SO_PEERCRED`), and only an fd that is an mmapable BPF array of one area; then starts
    /// one small thread, blocked in `poll(2)` on the connection, that marks the area dead when
    /// the daemon goes away (every check then fails, [`Area::register`] returns
    /// [`MonitorDead`](crate::Error::MonitorDead)). Between a killed daemon's programs being
    /// detached and that thread's wakeup (microseconds to a scheduling delay) a change goes
    /// unseen: the residual window of `SIGKILL`; a daemon stopped by `SIGTERM`, `SIGINT` or
    /// `SIGHUP` marks its areas before it detaches.
    ///
    /// # Errors
    /// No daemon there; `PermissionDenied` when whoever answers is not a trusted uid;
    /// `InvalidData` when the fd it hands is not an area; the daemon's refusal (in its words),
    /// or a bad reply; `TimedOut` when it does not answer within 10 s.
    pub fn connect(path: &Path) -> io::Result<Area> {
        let mut s = UnixStream::connect(path)
            .map_err(|e| ctx(&format!("connect {}", path.display()), e))?;
        let peer = sys::peer_cred(s.as_fd()).map_err(|e| ctx("SO_PEERCRED", e))?;
        if !trusted_daemon_uid(peer.uid) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is served by uid {} (pid {}), neither root nor the ummunotify user: \
                     not trusted",
                    path.display(),
                    peer.uid,
                    peer.pid
                ),
            ));
        }
        let limit = Some(std::time::Duration::from_secs(10));
        s.set_read_timeout(limit)?;
        s.set_write_timeout(limit)?;
        s.write_all(HELLO)?;
        let mut buf = [0u8; 256];
        let (n, fd) = sys::recv_fd(s.as_fd(), &mut buf)?;
        if let Some(fd) = &fd {
            check_area_fd(fd.as_fd())?;
        }
        let reply = String::from_utf8_lossy(&buf[..n]).trim().to_string();
        let expect = format!("ok {LAYOUT_VERSION} {SLOTS} ");
        let nonce = reply
            .strip_prefix(&expect)
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        let (fd, nonce) = match (fd, nonce) {
            (Some(fd), Some(nonce)) => (fd, nonce),
            _ => {
                return Err(io::Error::other(format!(
                    "umn daemon at {}: {reply:?} (wanted \"{expect}<nonce: 16 hex digits>\")",
                    path.display()
                )))
            }
        };
        let link = Arc::new(Link {
            conn: s,
            dead: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        });
        let area = Area::from_map(fd, nonce, Owner::Daemon(Arc::clone(&link)))?;
        area.arm()
            .map_err(|e| ctx(&format!("umn daemon at {}", path.display()), e))?;
        let map = Arc::clone(&area.mapping);
        std::thread::Builder::new()
            .name("umn-ebpf-daemon".into())
            .stack_size(64 << 10)
            .spawn(move || watch(link, map))
            .map_err(|e| ctx("spawn the daemon watcher thread", e))?;
        Ok(area)
    }

    /// Arms the area from this process (the magic prctl with the daemon's nonce): from here
    /// on the programs write into it, until this process execs or its leader thread exits.
    fn arm(&self) -> io::Result<()> {
        arm_prctl(self.nonce);
        let armed = self.u64_at(OFF_ARMED).load(SeqCst);
        let dead = self.u64_at(OFF_DEAD).load(SeqCst);
        if armed == 0 || dead != 0 {
            return Err(io::Error::other(format!(
                "the eBPF programs did not arm this process's area (armed {armed}, dead {dead}): \
                 the daemon is not in the host's pid namespace, or this process is not the one \
                 it gave the area to"
            )));
        }
        // Let the exit program learn the current break (brk(0) changes nothing).
        // SAFETY: brk(0) only reports the break.
        unsafe { libc::syscall(libc::SYS_brk, 0usize) };
        Ok(())
    }

    /// The daemon's socket if one is listening (`UMN_EBPF_SOCKET` or [`DEFAULT_SOCKET`]), else
    /// the programs loaded here (root); the error says why neither worked.
    pub fn open() -> io::Result<Area> {
        let path = crate::env::var(SOCKET_ENV).unwrap_or_else(|| DEFAULT_SOCKET.into());
        let path = Path::new(&path);
        let daemon = match Area::connect(path) {
            Ok(a) => return Ok(a),
            Err(e) => e,
        };
        Area::open_local().map_err(|local| {
            io::Error::new(
                local.kind(),
                format!("no eBPF daemon ({daemon}), and loading the programs here failed: {local}"),
            )
        })
    }

    /// The process-wide area (`procs` holds one per tgid), opened with [`Area::open`] on
    /// first use and kept while anyone holds it.
    pub fn shared() -> io::Result<Arc<Area>> {
        static SHARED: Mutex<Weak<Area>> = Mutex::new(Weak::new());
        let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = g.upgrade() {
            if a.pid == getpid() {
                return Ok(a);
            }
        }
        let a = Arc::new(Area::open()?);
        *g = Arc::downgrade(&a);
        Ok(a)
    }

    fn from_map(map: OwnedFd, nonce: u64, owner: Owner) -> io::Result<Area> {
        let len = map_len();
        let base = crate::sys::mmap_shared(map.as_fd(), len)
            .map_err(|e| ctx("mmap(area)", e))?
            .as_ptr();
        ATFORK.register(None, None, Some(fork_child));
        let fork_slot = FORK_AREAS
            .iter()
            .position(|(b, _)| b.compare_exchange(0, base as usize, SeqCst, SeqCst).is_ok())
            .unwrap_or(usize::MAX);
        if let Some((_, l)) = FORK_AREAS.get(fork_slot) {
            l.store(len, SeqCst);
        }
        let area = Area {
            base,
            len,
            mapping: Arc::new(Mapping { base, len }),
            _map: map,
            slots: Mutex::new(Slots {
                free: Vec::new(),
                high: 0,
                reported: vec![0; SLOTS],
            }),
            pid: getpid(),
            nonce,
            owner,
            fork_slot,
        };
        if area.u64_at(OFF_LAYOUT).load(Relaxed) != LAYOUT_VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "area layout version differs",
            ));
        }
        Ok(area)
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: off is inside the mapping and 8-aligned (the mapping is page-aligned); the
        // memory lives as long as self and is only accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn word(&self, slot: u32) -> &AtomicU64 {
        self.u64_at(OFF_WORDS + 8 * slot as usize)
    }

    /// Registers `[start, end)` (rounded out to pages): from now on every watched call on it
    /// bumps its word. Compare with [`Area::is_valid`] after pinning.
    ///
    /// # Errors
    /// [`EmptyRange`](crate::Error::EmptyRange), [`WrappingRange`](crate::Error::WrappingRange),
    /// [`Forked`](crate::Error::Forked) in a forked child, and
    /// [`CoverageLimit`](crate::Error::CoverageLimit) when all [`SLOTS`] are in use.
    pub fn register(&self, start: u64, end: u64) -> crate::Result<Ticket> {
        if getpid() != self.pid {
            return Err(crate::Error::Forked);
        }
        if self.is_dead() {
            return Err(crate::Error::MonitorDead);
        }
        if end < start {
            return Err(crate::Error::WrappingRange);
        }
        let s = start & !(PAGE - 1);
        let e = end
            .checked_add(PAGE - 1)
            .ok_or(crate::Error::WrappingRange)?
            & !(PAGE - 1);
        if s == e {
            return Err(crate::Error::EmptyRange);
        }
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.free.pop() {
            Some(s) => s,
            None if (slots.high as usize) < SLOTS => {
                slots.high += 1;
                slots.high - 1
            }
            None => {
                return Err(crate::Error::CoverageLimit(io::Error::other(format!(
                    "the eBPF area holds {SLOTS} ranges"
                ))))
            }
        };
        let h = OFF_HINTS + HINT_SIZE * slot as usize;
        self.u64_at(h).store(EMPTY_LO, Relaxed);
        self.u64_at(h + 8).store(0, Relaxed);
        self.u64_at(h + 16).store(0, Relaxed);
        let r = OFF_RANGES + 16 * slot as usize;
        self.u64_at(r).store(s, Relaxed);
        self.u64_at(r + 8).store(e, Release);
        self.u64_at(OFF_LO).fetch_min(s, SeqCst);
        self.u64_at(OFF_HI).fetch_max(e, SeqCst);
        // SAFETY: OFF_COUNT is 4-aligned inside the mapping.
        let count = unsafe { &*(self.base.add(OFF_COUNT) as *const AtomicU32) };
        count.fetch_max(slot + 1, SeqCst);
        // The range is visible to every program that starts from here on; read the word only
        // now (see "Start and end" in the module doc).
        fence(SeqCst);
        let word = self.word(slot).load(SeqCst);
        // Marked dead after this load (by the programs: this process exec'd or its leader
        // exited; by the daemon or the watcher: the daemon is gone): the marker is stored
        // first, then the word bumped, so the ticket can not stay valid. Marked before: seen
        // here.
        if self.is_dead() {
            self.u64_at(r + 8).store(0, SeqCst);
            self.u64_at(r).store(0, SeqCst);
            slots.free.push(slot);
            return Err(crate::Error::MonitorDead);
        }
        slots.reported[slot as usize] = word;
        Ok(Ticket { slot, word })
    }

    /// Whether the daemon serving this area is gone (stopped, killed, or its connection
    /// lost): every ticket then reads invalid and registering fails with
    /// [`MonitorDead`](crate::Error::MonitorDead).
    pub fn is_dead(&self) -> bool {
        self.u64_at(OFF_DEAD).load(SeqCst) != 0
            || matches!(&self.owner, Owner::Daemon(l) if l.dead.load(SeqCst))
    }

    /// Whether no watched call touched the ticket's range since it was registered: one load.
    #[inline]
    pub fn is_valid(&self, t: Ticket) -> bool {
        self.word(t.slot).load(Acquire) == t.word
    }

    /// The area's counter: changes whenever any word does.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.u64_at(OFF_GEN).load(Acquire)
    }

    /// Stops watching the ticket's range and frees its slot.
    pub fn unregister(&self, t: Ticket) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let r = OFF_RANGES + 16 * t.slot as usize;
        self.u64_at(r + 8).store(0, SeqCst);
        self.u64_at(r).store(0, SeqCst);
        slots.free.push(t.slot);
    }

    /// The part of the ticket's range that watched calls touched since the last call (or the
    /// registration), if any: the 2010 device's event with its hint, never smaller than what
    /// was touched. Resets the hint.
    pub fn take_change(&self, t: Ticket) -> Option<std::ops::Range<u64>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        self.take_locked(&mut slots, t.slot)
    }

    fn take_locked(&self, slots: &mut Slots, slot: u32) -> Option<std::ops::Range<u64>> {
        let w = self.word(slot).load(Acquire);
        if w == slots.reported[slot as usize] {
            return None;
        }
        slots.reported[slot as usize] = w;
        let h = OFF_HINTS + HINT_SIZE * slot as usize;
        let torn = self.u64_at(h + 16).swap(0, SeqCst);
        let lo = self.u64_at(h).swap(EMPTY_LO, SeqCst);
        let hi = self.u64_at(h + 8).swap(0, SeqCst);
        let r = OFF_RANGES + 16 * slot as usize;
        let (s, e) = (
            self.u64_at(r).load(Acquire),
            self.u64_at(r + 8).load(Acquire),
        );
        // The union of the calls' ranges since the last take, clipped; the whole range when two
        // calls raced on the union (torn) or a take raced with a call (empty after clipping).
        let (lo, hi) = (lo.max(s), hi.min(e));
        Some(if torn == 0 && lo < hi { lo..hi } else { s..e })
    }

    /// Whether the programs were loaded by this process (`false`: a daemon's).
    pub fn is_local(&self) -> bool {
        matches!(self.owner, Owner::Local(_))
    }
}

impl std::fmt::Debug for Area {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Area")
            .field("base", &self.base)
            .field("pid", &self.pid)
            .field("local", &self.is_local())
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Programs")
            .field("tracepoints", &self.attached)
            .finish_non_exhaustive()
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Local(p) => {
                let _ = p.remove(self.pid, self.nonce);
            }
            // Not in a forked child: the connection is the parent's too.
            Owner::Daemon(link) if self.pid == getpid() => {
                link.closing.store(true, SeqCst);
                let _ = link.conn.shutdown(std::net::Shutdown::Both);
            }
            Owner::Daemon(_) => {}
        }
        if let Some((b, l)) = FORK_AREAS.get(self.fork_slot) {
            l.store(0, SeqCst);
            b.store(0, SeqCst);
        }
        // The mapping goes with the last of `mapping`'s holders.
    }
}

fn cap_eff() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
}

/// What `umn doctor` says about the eBPF backend: whether a daemon answers, whether this
/// process could load the programs, and exactly what is missing otherwise.
pub(crate) fn probe() -> super::BackendReport {
    let mut notes = Vec::new();
    let mut features = Vec::new();
    let sock = crate::env::var(SOCKET_ENV).unwrap_or_else(|| DEFAULT_SOCKET.into());
    let sock = Path::new(&sock);
    let daemon = Area::connect(sock);
    match std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled") {
        Ok(v) => notes.push(format!("kernel.unprivileged_bpf_disabled = {}", v.trim())),
        Err(e) => notes.push(format!("/proc/sys/kernel/unprivileged_bpf_disabled: {e}")),
    }
    let caps = cap_eff().unwrap_or(0);
    let (bpf, perfmon, admin) = (
        caps >> 39 & 1 == 1,
        caps >> 38 & 1 == 1,
        caps >> 21 & 1 == 1,
    );
    let privileged = admin || (bpf && perfmon);
    notes.push(format!(
        "this process: CAP_BPF {bpf}, CAP_PERFMON {perfmon}, CAP_SYS_ADMIN {admin}{}",
        if privileged {
            ""
        } else {
            " (loading needs CAP_BPF and CAP_PERFMON, or root)"
        }
    ));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let tracing = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fs) = (f.next(), f.next()?, f.next()?);
            (fs == "tracefs").then(|| dir.to_string())
        })
        .next();
    match tracing {
        Some(t) => match std::fs::metadata(format!("{t}/events/syscalls/sys_enter_munmap")) {
            Ok(_) => features.push("syscall-tracepoints"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => notes.push(format!(
                "{t}/events/syscalls/sys_enter_munmap is missing: the kernel lacks \
                 CONFIG_FTRACE_SYSCALLS"
            )),
            Err(e) => notes.push(format!("tracefs at {t}: {e} (the loader needs root)")),
        },
        None => notes.push(
            "tracefs is not mounted (the loader mounts it at /sys/kernel/tracing as root)".into(),
        ),
    }
    let local = if privileged {
        match Programs::load() {
            Ok(p) => {
                features.push("bpf-tracepoint-programs");
                Ok(format!("{} tracepoints attach", p.tracepoints().len()))
            }
            Err(e) => Err(e.to_string()),
        }
    } else {
        Err("not privileged".to_string())
    };
    let status = match (&daemon, &local) {
        (Ok(_), _) => Ok(format!("ok: from umn daemon at {}", sock.display())),
        (Err(_), Ok(how)) => Ok(format!("ok: loads its programs in this process ({how})")),
        (Err(d), Err(l)) => Err(crate::Unsupported::Ebpf {
            reason: format!("no umn daemon ({d}); loading here: {l}"),
        }),
    };
    drop(daemon);
    notes.push(format!(
        "sees munmap, mremap, madvise (dropping advice), brk, mmap(MAP_FIXED), shmdt, \
         shmat(SHM_REMAP), process_madvise, remap_file_pages: libc or raw, in the calling \
         thread; {SLOTS} ranges per process"
    ));
    notes.push(
        "does not see ia32 int $0x80 calls, io_uring IORING_OP_MADVISE, fallocate(PUNCH_HOLE), \
         ftruncate; taxes every syscall of every process while attached"
            .into(),
    );
    super::BackendReport {
        name: "ebpf",
        status,
        kernel_features: features,
        notes,
    }
}
