//! `umn daemon`'s server: loads the programs once per node and hands each connecting process
//! its area's fd (issue 40, part 3: no client can starve or kill it, no client goes stale
//! silently).
//!
//! # One event loop
//! No thread per connection: one `poll(2)` loop over the listener, every connection and a
//! self-pipe the stop signals write to. A connection first owes the hello, within
//! [`DaemonConfig::hello_timeout`] (closed after); a served one is only watched for its EOF
//! (the client holds it for its life), which drops the area.
//!
//! # Limits (all in [`DaemonConfig`], defaults documented there)
//! Per uid (`SO_PEERCRED` at accept): open connections ([`DaemonConfig::per_uid_connections`])
//! and connections still owing the hello ([`DaemonConfig::per_uid_pending`]); in all
//! ([`DaemonConfig::max_clients`], never above [`MAX_PROCESSES`](super::MAX_PROCESSES) nor
//! above what `RLIMIT_NOFILE` leaves: two fds per client, the connection and the area). The
//! daemon raises its soft `RLIMIT_NOFILE` to the hard one at start. A connection over a limit
//! is accepted, told `err limit: ...` and closed at once (so its `connect` never hangs on a
//! full backlog). `accept` failing with `EMFILE`/`ENFILE`/`ENOMEM`/`ENOBUFS` pauses accepting
//! for 100 ms; every failure is logged to stderr at most once a second (with the number of
//! messages held back) and none ends the daemon: every per-client error stays with that
//! client.
//!
//! # Stop
//! On `SIGTERM`, `SIGINT` or `SIGHUP` [`Daemon::serve`] marks every served area dead (the dead
//! marker, then every slot's word and the counter bumped: every check its client makes fails,
//! every later registration returns [`MonitorDead`](crate::Error::MonitorDead)) before it
//! returns, while the programs are still attached. A daemon killed otherwise (`SIGKILL`, a
//! crash) leaves that to its clients: each one's watcher thread sees the connection's EOF and
//! marks its own area (see `Area::connect`).
//!
//! # Socket
//! [`Daemon::bind`] creates the socket's directory (mode 0755) when missing, refuses one that
//! is a symlink, is not owned by the daemon's euid (or root) or is writable by group or others,
//! removes a stale socket only when `lstat` says it is one, and binds with umask 0111 (mode
//! 0666: any local process may ask for its own area): no `chmod` on a path.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering::SeqCst};
use std::time::{Duration, Instant};

use super::layout::{LAYOUT_VERSION, SLOTS};
use super::{ctx, map_len, mark_dead, random_nonce, sys, Programs, HELLO, MAX_PROCESSES};

/// The daemon's limits. [`Default`] gives the documented values.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DaemonConfig {
    /// How long a new connection may take to send the hello before it is closed: 2 s.
    pub hello_timeout: Duration,
    /// Connections one uid may hold open (each served one is an area): 1024.
    pub per_uid_connections: usize,
    /// Connections of one uid still owing the hello: 16.
    pub per_uid_pending: usize,
    /// Connections in all: [`MAX_PROCESSES`] (4096), lowered at [`Daemon::serve`] to what
    /// `RLIMIT_NOFILE` leaves (two fds per client, 32 kept in reserve).
    pub max_clients: usize,
}

impl Default for DaemonConfig {
    fn default() -> DaemonConfig {
        DaemonConfig {
            hello_timeout: Duration::from_secs(2),
            per_uid_connections: 1024,
            per_uid_pending: 16,
            max_clients: MAX_PROCESSES as usize,
        }
    }
}

/// `umn daemon`'s server: the programs, and one area per connected process.
pub struct Daemon {
    programs: Programs,
    config: DaemonConfig,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("programs", &self.programs)
            .field("config", &self.config)
            .finish()
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one; returns the soft limit now in force.
fn raise_nofile() -> u64 {
    // SAFETY: rlimit is plain data.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: rl is valid for writing.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    if rl.rlim_cur < rl.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: raised is a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            rl.rlim_cur = rl.rlim_max;
        }
    }
    rl.rlim_cur
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count())
}

/// The write end of the stop pipe, for the signal handler (-1: none yet).
static STOP_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The read end: readable for good once a stop signal came (nobody drains it, so every loop
/// serving in this process sees it).
static STOP_READ: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop_signal(_: libc::c_int) {
    let fd = STOP_WRITE.load(SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; the pipe is non-blocking (a full pipe is
        // already readable). errno is saved and restored around it.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, b"x".as_ptr().cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Installs the handlers of SIGTERM, SIGINT and SIGHUP (once per process); returns the pipe's
/// read end.
fn stop_pipe() -> io::Result<i32> {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let r = STOP_READ.load(SeqCst);
    if r >= 0 {
        return Ok(r);
    }
    let mut fds = [0; 2];
    // SAFETY: fds is valid for two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(ctx("pipe2", io::Error::last_os_error()));
    }
    STOP_WRITE.store(fds[1], SeqCst);
    STOP_READ.store(fds[0], SeqCst);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: sigaction is plain data; the handler only calls write(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(ctx("sigaction", io::Error::last_os_error()));
            }
        }
    }
    Ok(fds[0])
}

/// At most one line a second on stderr; the lines held back are counted in the next one.
struct Log {
    last: Option<Instant>,
    held: u64,
}

impl Log {
    fn say(&mut self, now: Instant, what: std::fmt::Arguments<'_>) {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.held += 1;
            return;
        }
        if self.held > 0 {
            eprintln!("umn daemon: {what} ({} more messages held back)", self.held);
        } else {
            eprintln!("umn daemon: {what}");
        }
        self.last = Some(now);
        self.held = 0;
    }
}

enum State {
    /// Owes the hello: `got` bytes of it so far.
    Hello {
        deadline: Instant,
        buf: [u8; HELLO.len()],
        got: usize,
    },
    /// Served: holds its area, and the nonce it was created with, until EOF.
    Served { area: OwnedFd, nonce: u64 },
}

struct Conn {
    sock: UnixStream,
    uid: u32,
    pid: u32,
    state: State,
}

#[derive(Default)]
struct PerUid {
    open: usize,
    pending: usize,
}

/// What to do with a connection after an event.
enum Next {
    Keep,
    Close,
}

impl Daemon {
    /// Loads the programs (root), with the default [`DaemonConfig`].
    pub fn new() -> io::Result<Daemon> {
        Daemon::with_config(DaemonConfig::default())
    }

    /// Raises the soft `RLIMIT_NOFILE` to the hard one, loads the programs (root) and checks
    /// that they see this process's pid ([`Programs::check_pid_namespace`]: a daemon in a pid
    /// namespace other than the host's refuses to start).
    pub fn with_config(config: DaemonConfig) -> io::Result<Daemon> {
        raise_nofile();
        let programs = Programs::load()?;
        programs.check_pid_namespace()?;
        Ok(Daemon { programs, config })
    }

    /// The programs served.
    pub fn programs(&self) -> &Programs {
        &self.programs
    }

    /// The limits in force (before [`Daemon::serve`] lowers `max_clients` to the fd limit).
    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// Binds `path` safely (see the module doc): the directory is created (0755) when missing
    /// and must be a real directory owned by this euid or root and not writable by group or
    /// others; a stale socket there is removed; the socket is created with mode 0666.
    ///
    /// # Errors
    /// The directory or the path fails a check (`PermissionDenied`, `AlreadyExists`, in
    /// words naming the path), or `mkdir`/`bind` fails.
    pub fn bind(path: &Path) -> io::Result<UnixListener> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if std::fs::symlink_metadata(dir).is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| ctx(&format!("mkdir {}", dir.display()), e))?;
        }
        let md = std::fs::symlink_metadata(dir).map_err(|e| ctx(&dir.display().to_string(), e))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let refuse = |why: &str| {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refusing to serve on {}: its directory {} {why}",
                    path.display(),
                    dir.display()
                ),
            ))
        };
        if md.file_type().is_symlink() {
            return refuse("is a symlink");
        }
        if !md.is_dir() {
            return refuse("is not a directory");
        }
        if md.uid() != euid && md.uid() != 0 {
            return refuse(&format!(
                "is owned by uid {}, not by this daemon (uid {euid}) or root",
                md.uid()
            ));
        }
        if md.mode() & 0o022 != 0 {
            return refuse(&format!(
                "is writable by group or others (mode {:o})",
                md.mode() & 0o7777
            ));
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
                .map_err(|e| ctx(&format!("remove stale socket {}", path.display()), e))?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "refusing to serve on {}: it exists and is not a socket",
                        path.display()
                    ),
                ))
            }
            Err(_) => {}
        }
        // The socket's mode comes from the umask at bind (0777 & !0111 = 0666). The umask is
        // the process's: set and restored around the one call.
        // SAFETY: umask has no preconditions.
        let old = unsafe { libc::umask(0o111) };
        let l = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        l.map_err(|e| ctx(&format!("bind {}", path.display()), e))
    }

    /// Serves connections on `listener` until `SIGTERM`, `SIGINT` or `SIGHUP` (this installs
    /// their handlers for the process): each process gets its own area (keyed by the pid
    /// `SO_PEERCRED` reports, one per process), dropped when it disconnects. On the signal
    /// every served area is marked dead before this returns `Ok`.
    ///
    /// # Errors
    /// Only what is not any client's doing: the stop pipe or `poll` itself failing.
    pub fn serve(&self, listener: UnixListener) -> io::Result<()> {
        let stop = stop_pipe()?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ctx("listener O_NONBLOCK", e))?;
        // SAFETY: rlimit is plain data; getrlimit writes it.
        let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: rl is valid for writing.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
        let spare = (rl.rlim_cur as usize).saturating_sub(open_fds() + 32) / 2;
        let max_clients = self
            .config
            .max_clients
            .min(MAX_PROCESSES as usize)
            .min(spare)
            .max(1);
        let mut conns: Vec<Conn> = Vec::new();
        let mut uids: HashMap<u32, PerUid> = HashMap::new();
        let mut log = Log {
            last: None,
            held: 0,
        };
        let mut accept_paused_until: Option<Instant> = None;
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            if accept_paused_until.is_some_and(|t| now >= t) {
                accept_paused_until = None;
            }
            pfds.clear();
            let ev = |fd: i32, events: i16| libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            pfds.push(ev(stop, libc::POLLIN));
            pfds.push(ev(
                if accept_paused_until.is_some() {
                    -1 // poll ignores a negative fd
                } else {
                    listener.as_raw_fd()
                },
                libc::POLLIN,
            ));
            let mut wake = accept_paused_until;
            for c in &conns {
                pfds.push(ev(c.sock.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP));
                if let State::Hello { deadline, .. } = c.state {
                    wake = Some(wake.map_or(deadline, |w| w.min(deadline)));
                }
            }
            let timeout = wake.map_or(-1, |w| {
                let d = w.saturating_duration_since(now);
                (d.as_millis() as i32).saturating_add(1).min(60_000)
            });
            // SAFETY: pfds is a valid array of its length.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ENOMEM) | Some(libc::EAGAIN) => {
                        log.say(Instant::now(), format_args!("poll: {e}"));
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    _ => return Err(ctx("poll", e)),
                }
            }
            let now = Instant::now();
            if pfds[0].revents != 0 {
                for c in &conns {
                    if let State::Served { area, .. } = &c.state {
                        self.mark(area);
                    }
                }
                for c in conns.drain(..) {
                    self.close(c, &mut uids);
                }
                return Ok(());
            }
            // Reverse order: swap_remove(i) moves in an element already handled.
            for i in (0..conns.len()).rev() {
                let revents = pfds[2 + i].revents;
                let next = if revents != 0 {
                    self.on_event(&mut conns[i], revents, &mut uids, &mut log, now)
                } else {
                    match conns[i].state {
                        State::Hello { deadline, .. } if now >= deadline => Next::Close,
                        _ => Next::Keep,
                    }
                };
                if let Next::Close = next {
                    let c = conns.swap_remove(i);
                    self.close(c, &mut uids);
                }
            }
            if pfds[1].revents != 0 {
                self.accept(
                    &listener,
                    &mut conns,
                    &mut uids,
                    &mut log,
                    &mut accept_paused_until,
                    max_clients,
                );
            }
        }
    }

    /// Marks a served area dead (the daemon stops: its clients must learn).
    fn mark(&self, area: &OwnedFd) {
        let len = map_len();
        if let Ok(p) = crate::sys::mmap_shared(area.as_fd(), len) {
            // SAFETY: p is a fresh writable mapping of an area, len bytes, unmapped below.
            unsafe {
                mark_dead(p.as_ptr());
                libc::munmap(p.as_ptr().cast(), len);
            }
        }
    }

    fn close(&self, c: Conn, uids: &mut HashMap<u32, PerUid>) {
        if let Some(u) = uids.get_mut(&c.uid) {
            u.open -= 1;
            if let State::Hello { .. } = c.state {
                u.pending -= 1;
            }
            if u.open == 0 {
                uids.remove(&c.uid);
            }
        }
        // Only with its nonce: a stale connection never removes its pid's next area.
        if let State::Served { nonce, .. } = c.state {
            let _ = self.programs.remove(c.pid, nonce);
        }
    }

    fn accept(
        &self,
        listener: &UnixListener,
        conns: &mut Vec<Conn>,
        uids: &mut HashMap<u32, PerUid>,
        log: &mut Log,
        paused: &mut Option<Instant>,
        max_clients: usize,
    ) {
        // A bounded batch per wakeup: the connections already open get their turn.
        for _ in 0..64 {
            // SAFETY: null address pointers are allowed; the result is a new fd or -1.
            let fd = unsafe {
                libc::accept4(
                    listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            let now = Instant::now();
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return,
                    Some(libc::EINTR) | Some(libc::ECONNABORTED) | Some(libc::EPROTO) => continue,
                    Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOMEM)
                    | Some(libc::ENOBUFS) => {
                        log.say(now, format_args!("accept: {e}; pausing accepts for 100 ms"));
                        *paused = Some(now + Duration::from_millis(100));
                        return;
                    }
                    _ => {
                        log.say(now, format_args!("accept: {e}"));
                        *paused = Some(now + Duration::from_millis(100));
                        return;
                    }
                }
            }
            // SAFETY: fd is a new connected socket owned by nobody else.
            let sock = unsafe { UnixStream::from_raw_fd(fd) };
            let cred = match sys::peer_cred(sock.as_fd()) {
                Ok(c) => c,
                Err(e) => {
                    log.say(now, format_args!("SO_PEERCRED: {e}"));
                    continue;
                }
            };
            let u = uids.get(&cred.uid);
            let (open, pending) = u.map_or((0, 0), |u| (u.open, u.pending));
            let refusal = if conns.len() >= max_clients {
                Some(format!("{max_clients} connections in all"))
            } else if open >= self.config.per_uid_connections {
                Some(format!(
                    "{} connections of uid {}",
                    self.config.per_uid_connections, cred.uid
                ))
            } else if pending >= self.config.per_uid_pending {
                Some(format!(
                    "{} connections of uid {} owing the hello",
                    self.config.per_uid_pending, cred.uid
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                log.say(now, format_args!("refused pid {}: {why}", cred.pid));
                let msg = format!("err limit: {why}\n");
                let _ = sys::send_fd(sock.as_fd(), msg.as_bytes(), None);
                continue;
            }
            let u = uids.entry(cred.uid).or_default();
            u.open += 1;
            u.pending += 1;
            conns.push(Conn {
                sock,
                uid: cred.uid,
                pid: cred.pid as u32,
                state: State::Hello {
                    deadline: now + self.config.hello_timeout,
                    buf: [0; HELLO.len()],
                    got: 0,
                },
            });
        }
    }

    fn on_event(
        &self,
        c: &mut Conn,
        revents: i16,
        uids: &mut HashMap<u32, PerUid>,
        log: &mut Log,
        now: Instant,
    ) -> Next {
        match &mut c.state {
            State::Served { .. } => {
                if revents & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL) != 0
                {
                    return Next::Close;
                }
                // A client says nothing after the hello; read and drop whatever it sends.
                let mut sink = [0u8; 256];
                loop {
                    match c.sock.read(&mut sink) {
                        Ok(0) => return Next::Close,
                        Ok(_) => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => return Next::Close,
                    }
                }
            }
            State::Hello { deadline, buf, got } => {
                if now >= *deadline {
                    return Next::Close;
                }
                match c.sock.read(&mut buf[*got..]) {
                    Ok(0) => return Next::Close,
                    Ok(n) => *got += n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) =>
                    {
                        return Next::Keep
                    }
                    Err(_) => return Next::Close,
                }
                if *got < HELLO.len() {
                    return Next::Keep;
                }
                let ok_hello = buf[..] == *HELLO;
                match self.hello(c, ok_hello, log, now) {
                    Some((area, nonce)) => {
                        if let Some(u) = uids.get_mut(&c.uid) {
                            u.pending -= 1;
                        }
                        c.state = State::Served { area, nonce };
                        Next::Keep
                    }
                    None => Next::Close,
                }
            }
        }
    }

    /// Answers a complete hello: the area's fd and the nonce the client arms it with, or an
    /// error line. `None`: not served.
    fn hello(
        &self,
        c: &Conn,
        ok_hello: bool,
        log: &mut Log,
        now: Instant,
    ) -> Option<(OwnedFd, u64)> {
        if !ok_hello {
            let _ = sys::send_fd(c.sock.as_fd(), b"err protocol: want umn-ebpf 1\n", None);
            return None;
        }
        let nonce = match random_nonce() {
            Ok(n) => n,
            Err(e) => {
                log.say(now, format_args!("nonce for pid {}: {e}", c.pid));
                return None;
            }
        };
        // Areas whose process exec'd or whose leader exited: their entries go, so they hold no
        // slot of `procs` (the programs already write nothing there).
        for (tgid, gone) in self.programs.gone() {
            let _ = self.programs.remove(tgid, gone);
        }
        let area = match self.programs.new_area(c.pid, nonce) {
            Ok(a) => a,
            Err(e) => {
                log.say(now, format_args!("area for pid {}: {e}", c.pid));
                let msg = format!("err area for pid {}: {e}\n", c.pid);
                let _ = sys::send_fd(c.sock.as_fd(), msg.as_bytes(), None);
                return None;
            }
        };
        let ok = format!("ok {LAYOUT_VERSION} {SLOTS} {nonce:016x}\n");
        match sys::send_fd(c.sock.as_fd(), ok.as_bytes(), Some(area.as_fd())) {
            Ok(()) => Some((area, nonce)),
            Err(e) => {
                log.say(now, format_args!("reply to pid {}: {e}", c.pid));
                let _ = self.programs.remove(c.pid, nonce);
                None
            }
        }
    }
}
