//! Issue 40, part 3: the eBPF backend's daemon can not be starved or killed by its clients, no
//! client goes stale silently when it stops or dies, clients trust only a real daemon's area,
//! and the socket is bound without following anyone's symlink.
//!
//! Each test runs a real daemon (this binary re-run in the `role` test, as root) and the
//! attacker or client as `nobody` (the same binary, copied where `nobody` can run it). Needs
//! root with bpf(2) and the syscall tracepoints; a missing feature skips loudly (and fails under
//! `UMN_REQUIRE_ALL=1`, as in CI).
//!
//! Only API that main already had is used (`Daemon::{new, bind, serve}`, `Area::connect`), so
//! the file runs unchanged against main's code.
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ummunotify::ebpf::{Area, Daemon, SLOTS};

const PAGE: usize = 4096;
const ROLE: &str = "UMN_ROBUST_ROLE";
const SOCK: &str = "UMN_ROBUST_SOCK";
const NOBODY: u32 = 65534;
/// Bytes of one area (layout.rs): 128 + SLOTS * (16 + 8 + 24).
const AREA_SIZE: usize = 128 + 48 * SLOTS;

fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// A temp dir nobody can enter, holding a copy of this binary nobody can run.
struct Scene {
    dir: PathBuf,
    exe: PathBuf,
    sock: PathBuf,
}

impl Scene {
    fn new(name: &str) -> Option<Scene> {
        if euid() != 0 {
            ummunotify_testkit::require::skip_or_fail(name, "root to run the daemon");
            return None;
        }
        if let Err(e) = Daemon::new() {
            ummunotify_testkit::require::skip_or_fail(name, &format!("eBPF programs: {e}"));
            return None;
        }
        let dir = std::env::temp_dir().join(format!("umn-robust-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.join("run"), PermissionsExt::from_mode(0o755)).unwrap();
        let exe = dir.join("t");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, PermissionsExt::from_mode(0o755)).unwrap();
        let sock = dir.join("run/ebpf.sock");
        Some(Scene { dir, exe, sock })
    }

    /// This binary in `role`, as `uid` (0 or nobody), stdin and stdout piped.
    fn run(&self, role: &str, uid: u32) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(["--exact", "role", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(SOCK, &self.sock)
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if uid != 0 {
            c.uid(uid).gid(uid);
        }
        c
    }

    /// The daemon, with `RLIMIT_NOFILE` at `nofile` (soft and hard) when given; returns once
    /// its socket is there.
    fn daemon(&self, nofile: Option<u64>) -> Reaped {
        let mut c = self.run("daemon", 0);
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the pre-exec child.
            unsafe {
                c.pre_exec(move || {
                    let rl = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        c.stdout(Stdio::null());
        let mut d = Reaped(c.spawn().expect("start the daemon"));
        until("the daemon's socket", || {
            assert!(
                d.0.try_wait().unwrap().is_none(),
                "the daemon exited at start"
            );
            std::fs::symlink_metadata(&self.sock).is_ok()
        });
        d
    }
}

/// A child killed and reaped when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `cond` until it holds; fails after a generous 60 s.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads `child`'s stdout up to a line holding `marker` (libtest may print "test role ... "
/// before it); fails on EOF first.
fn expect_line(out: &mut impl BufRead, marker: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("no {marker:?} line; the child said:\n{seen}");
        }
        if line.contains(marker) {
            return line;
        }
        seen.push_str(&line);
    }
}

fn kill(child: &Child, sig: i32) {
    // SAFETY: kill has no memory preconditions; the child is ours and not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// One client served end to end: connect, register a page, unmap it, see it invalid.
fn served_once(scene: &Scene, uid: u32) {
    let out = scene.run("client_once", uid).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("client once: ok"),
        "a client as uid {uid}:\n{text}"
    );
}

fn map_pages(n: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// A line to the parent, flushed at once (stdout to a pipe may be block-buffered).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// Every child side of the tests; does nothing unless run by one.
#[test]
fn role() {
    let Some(role) = std::env::var_os(ROLE) else {
        return;
    };
    let sock = PathBuf::from(std::env::var_os(SOCK).unwrap());
    let mut stdin = std::io::stdin().lock();
    match role.to_str().unwrap() {
        "daemon" => {
            let d = Daemon::new().expect("load the programs");
            let l = Daemon::bind(&sock).expect("bind");
            d.serve(l).expect("serve");
            println!("daemon: stopped");
        }
        "client_once" => {
            let a = Area::connect(&sock).expect("connect to the daemon");
            let p = map_pages(1);
            let t = a.register(p as u64, p as u64 + PAGE as u64).unwrap();
            assert!(a.is_valid(t));
            // SAFETY: our mapping.
            assert_eq!(unsafe { libc::munmap(p.cast(), PAGE) }, 0);
            assert!(!a.is_valid(t), "munmap of a registered page");
            say("client once: ok");
        }
        "client_hold" => {
            let a = Area::connect(&sock).expect("connect to the daemon");
            let p = map_pages(2);
            let t = a.register(p as u64, p as u64 + PAGE as u64).unwrap();
            say("registered");
            let mut line = String::new();
            stdin.read_line(&mut line).unwrap();
            // The daemon is gone now (the parent waited for it). The page was not touched:
            // only the daemon's (SIGTERM) or the watcher's (SIGKILL) marking moves its word.
            until("the ticket to read invalid", || !a.is_valid(t));
            until("registering to fail", || {
                matches!(
                    a.register(p as u64 + PAGE as u64, p as u64 + 2 * PAGE as u64),
                    Err(ummunotify::Error::MonitorDead)
                )
            });
            say("client hold: ok");
        }
        "notifier_hold" => {
            // The same through the notifier (Area::shared, from UMN_EBPF_SOCKET).
            std::env::set_var("UMN_EBPF_SOCKET", &sock);
            let n = ummunotify::Notifier::with_backend(ummunotify::Backend::Ebpf)
                .expect("a notifier served by the daemon");
            let p = map_pages(2) as usize;
            let r = n.register(p..p + PAGE, ummunotify::Cookie(1)).unwrap();
            say("registered");
            let mut line = String::new();
            stdin.read_line(&mut line).unwrap();
            until("the region to read invalid", || !n.is_valid(r));
            until("registering to fail", || {
                matches!(
                    n.register(p + PAGE..p + 2 * PAGE, ummunotify::Cookie(2)),
                    Err(ummunotify::Error::MonitorDead)
                )
            });
            say("notifier hold: ok");
        }
        "flood" => {
            // More connections than the daemon's RLIMIT_NOFILE and than the per-uid limits,
            // none ever sending the hello.
            let n: usize = 1500;
            let mut conns = Vec::new();
            for _ in 0..n {
                conns.push(UnixStream::connect(&sock).expect("connect (flood)"));
            }
            say(&format!("flooded {}", conns.len()));
            let mut line = String::new();
            stdin.read_line(&mut line).unwrap();
            // Every one of them is closed by the daemon: refused over a limit at once, or
            // after the hello deadline.
            for c in &mut conns {
                c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let mut sink = Vec::new();
                match c.read_to_end(&mut sink) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {}
                    Err(e) => panic!("a flood connection is still open: {e}"),
                }
            }
            say("flood: all closed");
        }
        "fake_nobody" => {
            // A forged server as nobody: a memfd laid out as an area, layout word included.
            let _ = std::fs::remove_file(&sock);
            let l = UnixListener::bind(&sock).unwrap();
            std::fs::set_permissions(&sock, PermissionsExt::from_mode(0o666)).unwrap();
            say("listening");
            let (c, _) = l.accept().unwrap();
            let fd = memfd(AREA_SIZE, true);
            serve_fake(&c, &fd);
            let mut sink = [0u8; 16];
            let _ = (&c).read(&mut sink);
        }
        other => panic!("unknown role {other}"),
    }
}

/// A memfd of `len` bytes, with the layout version (2) at offset 40 when `layout`.
fn memfd(len: usize, layout: bool) -> OwnedFd {
    // SAFETY: a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"fake-area".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is new and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let f = std::fs::File::from(fd.try_clone().unwrap());
    f.set_len(len as u64).unwrap();
    if layout {
        std::os::unix::fs::FileExt::write_at(&f, &3u64.to_ne_bytes(), 40).unwrap();
    }
    fd
}

/// Reads the hello and answers what a real daemon answers (layout 3, a nonce), with `fd`.
fn serve_fake(c: &UnixStream, fd: &OwnedFd) {
    let mut hello = [0u8; 11];
    let _ = (&*c).read_exact(&mut hello);
    let reply = format!("ok 3 {SLOTS} 0123456789abcdef\n");
    let mut iov = libc::iovec {
        iov_base: reply.as_ptr() as *mut libc::c_void,
        iov_len: reply.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: pure computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
    // SAFETY: cbuf holds one header and one fd, aligned; msg points at live buffers.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        (*h).cmsg_level = libc::SOL_SOCKET;
        (*h).cmsg_type = libc::SCM_RIGHTS;
        (*h).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<i32>(), fd.as_raw_fd());
        assert!(libc::sendmsg(c.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) > 0);
    }
}

/// A root fake on `sock` in a thread: hands `fd` to one client.
fn root_fake(sock: &Path, fd: OwnedFd) -> std::thread::JoinHandle<()> {
    let _ = std::fs::remove_file(sock);
    let l = UnixListener::bind(sock).unwrap();
    std::thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        serve_fake(&c, &fd);
        let mut sink = [0u8; 16];
        let _ = (&c).read(&mut sink);
    })
}

/// `bpf(BPF_MAP_CREATE)` of an mmapable array of one `value_size`-byte element, with the
/// layout version at offset 40: a real BPF map, of the wrong size.
fn bpf_array(value_size: u32) -> OwnedFd {
    let mut attr = [0u32; 32];
    attr[0] = 2; // BPF_MAP_TYPE_ARRAY
    attr[1] = 4;
    attr[2] = value_size;
    attr[3] = 1;
    attr[4] = 1 << 10; // BPF_F_MMAPABLE
                       // SAFETY: attr is a zeroed bpf_attr prefix of the size passed.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_mut_ptr(), 128usize) };
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fd is new and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let len = (value_size as usize).div_ceil(PAGE) * PAGE;
    // SAFETY: a shared mapping of the map, unmapped below.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        (p.cast::<u8>().add(40) as *mut u64).write(2);
        libc::munmap(p, len);
    }
    fd
}

#[test]
fn a_hello_flood_as_nobody_neither_kills_nor_starves_the_daemon() {
    let Some(scene) = Scene::new("flood") else {
        return;
    };
    // 1,500 connections against a daemon allowed 256 fds, a per-uid limit of 16 pending.
    let mut daemon = scene.daemon(Some(256));
    let mut flood = Reaped(scene.run("flood", NOBODY).spawn().unwrap());
    let mut out = BufReader::new(flood.0.stdout.take().unwrap());
    expect_line(&mut out, "flooded");
    assert!(
        daemon.0.try_wait().unwrap().is_none(),
        "the daemon died of the flood"
    );
    served_once(&scene, 0);
    // Idle connections are closed after the hello deadline, refused ones at once.
    writeln!(flood.0.stdin.as_mut().unwrap(), "go").unwrap();
    expect_line(&mut out, "flood: all closed");
    assert!(flood.0.wait().unwrap().success());
    served_once(&scene, NOBODY);
    assert!(daemon.0.try_wait().unwrap().is_none(), "the daemon died");
}

#[test]
fn an_idle_connection_is_closed_after_the_hello_deadline() {
    let Some(scene) = Scene::new("idle") else {
        return;
    };
    let _daemon = scene.daemon(None);
    let mut c = UnixStream::connect(&scene.sock).unwrap();
    // Generous: the deadline is 2 s; a daemon that never closes fails here.
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut sink = Vec::new();
    let r = c.read_to_end(&mut sink);
    assert!(
        r.is_ok() || r.as_ref().unwrap_err().raw_os_error() == Some(libc::ECONNRESET),
        "the idle connection stayed open: {r:?}"
    );
}

fn client_learns_the_daemon_is_gone(name: &str, sig: i32) {
    let Some(scene) = Scene::new(name) else {
        return;
    };
    let mut daemon = scene.daemon(None);
    let mut clients = Vec::new();
    for role in ["client_hold", "notifier_hold"] {
        let mut c = Reaped(scene.run(role, NOBODY).spawn().unwrap());
        let mut out = BufReader::new(c.0.stdout.take().unwrap());
        expect_line(&mut out, "registered");
        clients.push((role, c, out));
    }
    kill(&daemon.0, sig);
    let st = daemon.0.wait().unwrap();
    if sig == libc::SIGTERM {
        assert!(st.success(), "the daemon's exit on SIGTERM: {st:?}");
    }
    for (role, c, out) in &mut clients {
        writeln!(c.0.stdin.as_mut().unwrap(), "check").unwrap();
        expect_line(out, &format!("{}: ok", role.replace('_', " ")));
        assert!(c.0.wait().unwrap().success(), "{role}");
    }
}

#[test]
fn a_daemon_stopped_with_sigterm_leaves_no_client_stale() {
    client_learns_the_daemon_is_gone("sigterm", libc::SIGTERM);
}

#[test]
fn a_sigkilled_daemon_leaves_no_client_stale() {
    client_learns_the_daemon_is_gone("sigkill", libc::SIGKILL);
}

#[test]
fn a_forged_daemon_gets_a_typed_error_never_a_crash() {
    let Some(scene) = Scene::new("fake") else {
        return;
    };
    // As nobody, in a directory nobody owns: a memfd laid out like an area.
    let nd = scene.dir.join("nobody");
    std::fs::create_dir(&nd).unwrap();
    std::os::unix::fs::chown(&nd, Some(NOBODY), Some(NOBODY)).unwrap();
    let sock = nd.join("fake.sock");
    let mut fake = scene
        .run("fake_nobody", NOBODY)
        .env(SOCK, &sock)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(fake.stdout.take().unwrap());
    expect_line(&mut out, "listening");
    let e = Area::connect(&sock).expect_err("a daemon run by nobody is trusted");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let _ = fake.kill();
    let _ = fake.wait();

    // As root: a 0-byte memfd (main's client died of SIGBUS on it).
    let sock = scene.dir.join("run/fake0.sock");
    let t = root_fake(&sock, memfd(0, false));
    let e = Area::connect(&sock).expect_err("a 0-byte memfd taken as an area");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    t.join().unwrap();

    // As root: a real mmapable BPF array with the layout word, one page too large.
    let sock = scene.dir.join("run/fakebpf.sock");
    let t = root_fake(&sock, bpf_array((AREA_SIZE + PAGE) as u32));
    let e = Area::connect(&sock).expect_err("a wrong-size BPF map taken as an area");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    t.join().unwrap();
}

#[test]
fn bind_refuses_a_symlinked_socket_path_in_a_directory_others_can_write() {
    let Some(scene) = Scene::new("bind") else {
        return;
    };
    // An attacker's world-writable directory, the socket path a symlink to a root file.
    let target = scene.dir.join("target");
    std::fs::write(&target, b"root's").unwrap();
    std::fs::set_permissions(&target, PermissionsExt::from_mode(0o600)).unwrap();
    let open = scene.dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, PermissionsExt::from_mode(0o777)).unwrap();
    let sock = open.join("ebpf.sock");
    std::os::unix::fs::symlink(&target, &sock).unwrap();
    let e = Daemon::bind(&sock).expect_err("bound in a directory anyone can write");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let md = std::fs::symlink_metadata(&sock).unwrap();
    assert!(md.file_type().is_symlink(), "the symlink was replaced");
    assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o600);

    // The same directory owned by nobody, not writable by others: still refused.
    std::fs::set_permissions(&open, PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&open, Some(NOBODY), Some(NOBODY)).unwrap();
    let e = Daemon::bind(&sock).expect_err("bound in a directory nobody owns");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");

    // A safe directory with a symlink at the socket path: refused, not followed.
    std::fs::set_permissions(scene.dir.join("run"), PermissionsExt::from_mode(0o755)).unwrap();
    let sock = scene.dir.join("run/link.sock");
    std::os::unix::fs::symlink(&target, &sock).unwrap();
    assert!(
        Daemon::bind(&sock).is_err(),
        "a symlink at the socket path was replaced"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"root's");

    // A missing directory is created 0755; the socket is 0666 with no chmod.
    let sock = scene.dir.join("new/dir/ebpf.sock");
    let l = Daemon::bind(&sock).expect("bind in a new directory");
    assert_eq!(
        std::fs::metadata(scene.dir.join("new/dir")).unwrap().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::symlink_metadata(&sock).unwrap().mode() & 0o777,
        0o666
    );
    drop(l);
}
