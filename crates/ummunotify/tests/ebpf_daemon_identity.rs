//! The daemon gives an area to a program, not to a pid (issue 40): an unprivileged attacker
//! (`nobody`) against a real `umn daemon` never reads, through an area it holds, the events of
//! another program: not after the client execs (a setuid program too), not after its pid is
//! reused, not when the hello's sender execs before arming; and the owner learns when its
//! leader exits (every check fails).
//!
//! Each test runs as root: it starts a daemon on a socket in a fresh directory and runs a copy
//! of this binary as `nobody` in one of the roles below (they do nothing unless run so). The
//! attacker's *helper* is a forked child that keeps the connection and maps the raw area fd
//! itself (found in /proc/self/fd, as any attacker would): it snapshots the area, waits until
//! the victim is done, and compares. Needs root with bpf(2) and tracefs; skips loudly without.
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use ummunotify::ebpf::{Area, Daemon, Programs, SLOTS};

const PAGE: usize = 4096;
const ROLE: &str = "UMN_IDENTITY_ROLE";
const SOCK: &str = "UMN_IDENTITY_SOCKET";
/// A range covering nearly all user space: the attacker's net for any unmapping call.
const NET: (u64, u64) = (0x10000, 0x7fff_ffff_0000);

// The area's layout (crates/ummunotify/src/backend/ebpf/layout.rs).
const OFF_GEN: usize = 0;
const OFF_COUNT: usize = 8;
const OFF_LO: usize = 16;
const OFF_HI: usize = 24;
const OFF_BRK: usize = 32;
const OFF_DEAD: usize = 56;
const OFF_RANGES: usize = 128;
const OFF_WORDS: usize = OFF_RANGES + 16 * SLOTS;

// ---- root side ----

struct Served {
    dir: PathBuf,
    sock: PathBuf,
    exe: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(test: &str) -> Option<Served> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        ummunotify_testkit::require::skip_or_fail(test, "root to run the daemon");
        return None;
    }
    let daemon = match Daemon::new() {
        Ok(d) => Arc::new(d),
        Err(e) => {
            ummunotify_testkit::require::skip_or_fail(test, &format!("eBPF programs: {e}"));
            return None;
        }
    };
    let dir = std::env::temp_dir().join(format!("umn-identity-{}-{test}", std::process::id()));
    let sock = dir.join("ebpf.sock");
    let listener = Daemon::bind(&sock).expect("bind");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::thread::spawn(move || daemon.serve(listener));
    // nobody may not be able to reach the test binary's own path.
    let exe = dir.join("client");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).expect("copy the test binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(Served { dir, sock, exe })
}

fn as_nobody(s: &Served, role: &str) -> Command {
    let mut c = Command::new(&s.exe);
    c.args(["--exact", role, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCK, &s.sock)
        .uid(65534)
        .gid(65534);
    c
}

fn run(c: &mut Command) -> String {
    let out = c.output().expect("run the role as nobody");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_area_sees_nothing_of_the_program_its_client_execs() {
    let Some(s) = serve("exec") else { return };
    let text = run(as_nobody(&s, "role_exec_client").env("UMN_IDENTITY_TARGET", "self"));
    assert!(
        text.contains("target: done") && text.contains("helper: unchanged"),
        "after exec, the helper must see no change in the area:\n{text}"
    );
    if Path::new("/usr/bin/passwd").exists() {
        let text = run(as_nobody(&s, "role_exec_client").env("UMN_IDENTITY_TARGET", "passwd"));
        assert!(
            text.contains("helper: unchanged"),
            "after exec of setuid /usr/bin/passwd, the helper must see no change:\n{text}"
        );
    } else {
        eprintln!("exec: no /usr/bin/passwd, its case not run");
    }
}

#[test]
fn an_area_sees_nothing_of_a_process_that_reuses_its_pid() {
    let Some(s) = serve("pid_reuse") else { return };
    let mut child = as_nobody(&s, "role_reuse_client")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the client as nobody");
    // Held until the helper may compare (Child::wait would close it).
    let mut go = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    let mut pid = 0;
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the client ended before its helper was ready:\n{text}");
        }
        text.push_str(&line);
        if let Some((_, p)) = line.trim().split_once("client pid=") {
            pid = p.parse::<i32>().unwrap();
        }
        if line.contains("helper: ready") {
            break;
        }
    }
    assert!(child.wait().unwrap().success(), "client:\n{text}");
    assert!(pid > 1, "no client pid in:\n{text}");
    // The client is gone and reaped; put a root process on its pid (the helper keeps the
    // connection and the area).
    let mut landed = false;
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1))
            .expect("write ns_last_pid");
        // SAFETY: the child makes raw syscalls only and leaves with _exit.
        let f = unsafe { libc::fork() };
        if f == 0 {
            // SAFETY: raw syscalls on this child's own fresh mapping and break.
            unsafe {
                if libc::getpid() != pid {
                    libc::_exit(1);
                }
                unmap_and_brk();
                libc::_exit(0);
            }
        }
        let mut st = 0;
        // SAFETY: waits for our child.
        unsafe { libc::waitpid(f, &mut st, 0) };
        if f == pid && libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
            landed = true;
            break;
        }
    }
    // The helper compares now.
    go.write_all(b"g").unwrap();
    drop(go);
    out.read_to_string(&mut text).unwrap();
    assert!(
        landed,
        "no process landed on pid {pid} in 200 forks:\n{text}"
    );
    assert!(
        text.contains("helper: unchanged"),
        "a process reusing the client's pid must not reach its area:\n{text}"
    );
}

#[test]
fn a_hello_whose_sender_execs_before_arming_records_nothing() {
    let Some(s) = serve("unarmed") else { return };
    let text = run(&mut as_nobody(&s, "role_unarmed_client"));
    assert!(
        text.contains("target: done") && text.contains("helper: unchanged"),
        "an area never armed must never be written:\n{text}"
    );
}

#[test]
fn the_leaders_exit_marks_the_area_dead() {
    let Some(s) = serve("leader_exit") else {
        return;
    };
    let text = run(&mut as_nobody(&s, "role_leader_client"));
    assert!(
        text.contains("leader: area dead"),
        "after the leader thread exits every check must fail:\n{text}"
    );
}

#[test]
fn the_daemon_refuses_to_run_in_another_pid_namespace() {
    let Some(s) = serve("pid_namespace") else {
        return;
    };
    if !Path::new("/usr/bin/unshare").exists() {
        ummunotify_testkit::require::skip_or_fail("pid_namespace", "/usr/bin/unshare");
        return;
    }
    let out = Command::new("/usr/bin/unshare")
        .args(["--pid", "--fork"])
        .arg(&s.exe)
        .args([
            "--exact",
            "role_ns_daemon",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "role_ns_daemon")
        .output()
        .expect("unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("ns daemon: refused:")
            && text.contains("pid namespace other than the host's"),
        "a daemon in its own pid namespace must refuse to start, saying why:\n{text}"
    );
}

/// Root, in a new pid namespace: `Daemon::new` must refuse.
#[test]
fn role_ns_daemon() {
    if std::env::var(ROLE).ok().as_deref() != Some("role_ns_daemon") {
        return;
    }
    match Daemon::new() {
        Ok(_) => println!("ns daemon: started (pid {})", std::process::id()),
        Err(e) => println!("ns daemon: refused: {e}"),
    }
}

#[test]
fn an_area_is_replaced_only_when_gone_or_unarmed_and_removed_only_with_its_nonce() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        ummunotify_testkit::require::skip_or_fail("programs_api", "root to load the programs");
        return;
    }
    let p = match Programs::load() {
        Ok(p) => p,
        Err(e) => {
            ummunotify_testkit::require::skip_or_fail("programs_api", &format!("{e}"));
            return;
        }
    };
    let me = std::process::id();
    let _a1 = p.new_area(me, 1).expect("a first area");
    let _a2 = p
        .new_area(me, 2)
        .expect("a never-armed area is replaced by a new hello");
    assert!(p.remove(me, 1).is_err(), "a stale nonce removes nothing");
    assert!(p.has_area(me));
    // Arm it as a client does.
    // SAFETY: an option no kernel defines: EINVAL, nothing changes.
    unsafe { libc::syscall(libc::SYS_prctl, 0x554d_4e31u64, 2u64, 0, 0, 0) };
    let e = p.new_area(me, 3).expect_err("an armed live area is kept");
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    p.remove(me, 2).expect("removed with its nonce");
    assert!(!p.has_area(me));
    // A process that exits is gone: listed, and its pid's area replaceable.
    let mut child = Command::new("/bin/sh")
        .args(["-c", "echo up; read x"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Past its exec (which would mark an area created before it gone).
    let mut up = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut up)
        .unwrap();
    assert_eq!(up, "up\n");
    let _c = p.new_area(pid, 7).expect("an area for the child");
    assert!(!p.gone().contains(&(pid, 7)));
    drop(child.stdin.take());
    child.wait().unwrap();
    assert!(
        p.gone().contains(&(pid, 7)),
        "the exited child's area is gone"
    );
    let _c2 = p.new_area(pid, 8).expect("a gone area is replaced");
    assert!(!p.gone().contains(&(pid, 8)));
    p.remove(pid, 8).unwrap();
}

// ---- the roles, run as nobody ----

fn role(name: &str) -> Option<PathBuf> {
    if std::env::var(ROLE).ok()? != name {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    assert_ne!(unsafe { libc::geteuid() }, 0, "roles run unprivileged");
    Some(std::env::var_os(SOCK).expect("socket").into())
}

/// A fresh mapping unmapped, the break grown and shrunk: calls the programs watch.
///
/// # Safety
/// Raw syscalls only (fit for a forked child); changes nothing the caller uses.
unsafe fn unmap_and_brk() {
    // SAFETY: a fresh mapping, unmapped; the break moved and put back.
    unsafe {
        let p = libc::syscall(
            libc::SYS_mmap,
            0usize,
            3 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        libc::syscall(libc::SYS_munmap, p, 3 * PAGE);
        let cur = libc::syscall(libc::SYS_brk, 0usize);
        libc::syscall(libc::SYS_brk, cur + 64 * PAGE as libc::c_long);
        libc::syscall(libc::SYS_brk, cur);
    }
}

/// The bpf-map fd in this process (the area) and its mapping length, as an attacker finds it.
fn find_area_fd() -> (RawFd, usize) {
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let e = e.unwrap();
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        if link.to_string_lossy() != "anon_inode:bpf-map" {
            continue;
        }
        let fd: RawFd = e.file_name().to_string_lossy().parse().unwrap();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let size: usize = info
            .lines()
            .find_map(|l| l.strip_prefix("value_size:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        return (fd, size.div_ceil(PAGE) * PAGE);
    }
    panic!("no bpf-map fd in this process");
}

fn map_raw(fd: RawFd, len: usize) -> *mut u64 {
    // SAFETY: a new shared mapping of the area fd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap the area fd");
    p.cast()
}

fn say(s: &[u8]) {
    // SAFETY: writes a live buffer to stdout.
    unsafe { libc::write(1, s.as_ptr().cast(), s.len()) };
}

/// The first byte offset where `after` shows a change the area's own death does not explain:
/// when `dead` is set, the counter may have moved by `count + 1` and each word by one (the
/// marking); nothing else may differ. No allocation (runs in a forked child).
fn first_leak(before: &[u64], after: &[u64]) -> Option<usize> {
    let dead = after[OFF_DEAD / 8] != 0;
    let count = after[OFF_COUNT / 8] & 0xffff_ffff;
    let words = OFF_WORDS / 8..OFF_WORDS / 8 + SLOTS;
    for i in 0..before.len() {
        let d = after[i].wrapping_sub(before[i]);
        let ok = d == 0
            || dead
                && (i == OFF_DEAD / 8
                    || i == OFF_GEN / 8 && d == count + 1
                    || words.contains(&i) && d == 1);
        if !ok {
            return Some(i * 8);
        }
    }
    None
}

/// Forks the attacker's helper: it maps the raw area fd, snapshots it, writes to `ready_w`,
/// waits for EOF on `wait_fd` (stdin: after at least one byte), and reports whether anything
/// changed. Buffers are allocated before the fork; the child makes syscalls only.
fn fork_helper(ready_w: RawFd, wait_fd: RawFd, close: &[RawFd]) -> libc::pid_t {
    let (fd, len) = find_area_fd();
    let mut before = vec![0u64; len / 8];
    let mut after = vec![0u64; len / 8];
    let ready: &[u8] = b"r";
    // SAFETY: the child uses pre-allocated buffers, raw syscalls, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        return pid;
    }
    // SAFETY: as above.
    unsafe {
        for &c in close {
            libc::close(c);
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        ) as *const u64;
        if p as *mut libc::c_void == libc::MAP_FAILED {
            say(b"helper: mmap failed\n");
            libc::_exit(1);
        }
        for (i, b) in before.iter_mut().enumerate() {
            *b = p.add(i).read_volatile();
        }
        libc::write(ready_w, ready.as_ptr().cast(), ready.len());
        let mut buf = [0u8; 16];
        let mut got = 0;
        loop {
            let n = libc::read(wait_fd, buf.as_mut_ptr().cast(), buf.len());
            if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                break;
            }
            got += n.max(0);
        }
        if wait_fd == 0 && got == 0 {
            say(b"helper: stdin closed without the go byte\n");
            libc::_exit(1);
        }
        for (i, a) in after.iter_mut().enumerate() {
            *a = p.add(i).read_volatile();
        }
        match first_leak(&before, &after) {
            None => say(b"helper: unchanged\n"),
            Some(off) => {
                let mut s = *b"helper: CHANGED at byte 0000000000\n";
                let mut v = off;
                for k in (24..34).rev() {
                    s[k] = b'0' + (v % 10) as u8;
                    v /= 10;
                }
                say(&s);
                if before[OFF_BRK / 8] != after[OFF_BRK / 8] {
                    say(b"helper: the brk word changed: the victim's break leaked\n");
                }
            }
        }
        libc::_exit(0);
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut p = [0; 2];
    // SAFETY: p has room for two fds.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: fresh fds owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Forks the helper, waits for its snapshot, then execs the victim program in this pid; the
/// victim holds the write end of the "done" pipe until it exits. Between the snapshot and the
/// exec this process makes no call the programs watch (everything is allocated before).
fn exec_victim_with_helper(target: &str) -> ! {
    use std::ffi::CString;
    let (ready_r, ready_w) = pipe();
    let (done_r, done_w) = pipe();
    set_cloexec(ready_r.as_raw_fd());
    set_cloexec(ready_w.as_raw_fd());
    set_cloexec(done_r.as_raw_fd());
    let exe = std::env::current_exe().unwrap();
    let (path, args): (CString, Vec<&str>) = if target == "passwd" {
        (c"/usr/bin/passwd".into(), vec!["passwd"])
    } else {
        (
            CString::new(exe.to_str().unwrap()).unwrap(),
            vec![
                "client",
                "--exact",
                "role_target",
                "--nocapture",
                "--test-threads=1",
            ],
        )
    };
    let argv: Vec<CString> = args.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut envp: Vec<CString> = std::env::vars()
        .filter(|(k, _)| k != ROLE)
        .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
        .collect();
    envp.push(CString::new(format!("{ROLE}=role_target")).unwrap());
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    fork_helper(
        ready_w.as_raw_fd(),
        done_r.as_raw_fd(),
        &[done_w.as_raw_fd(), ready_r.as_raw_fd()],
    );
    let mut b = [0u8; 1];
    // SAFETY: reads into a live buffer; execve gets NUL-terminated arrays built above.
    unsafe {
        libc::close(ready_w.as_raw_fd());
        libc::close(done_r.as_raw_fd());
        assert_eq!(libc::read(ready_r.as_raw_fd(), b.as_mut_ptr().cast(), 1), 1);
        libc::execve(path.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr());
    }
    panic!("exec {target}: {}", std::io::Error::last_os_error());
}

/// The program exec'd in the client's pid: unmaps and moves its break.
#[test]
fn role_target() {
    if std::env::var(ROLE).ok().as_deref() != Some("role_target") {
        return;
    }
    // SAFETY: see unmap_and_brk.
    unsafe { unmap_and_brk() };
    println!("target: done");
}

/// (a) Connects, registers, forks the helper, execs a program in the same pid.
#[test]
fn role_exec_client() {
    let Some(sock) = role("role_exec_client") else {
        return;
    };
    let a = Area::connect(&sock).expect("connect");
    let t = a.register(NET.0, NET.1).expect("register");
    assert!(a.is_valid(t));
    let target = std::env::var("UMN_IDENTITY_TARGET").unwrap();
    exec_victim_with_helper(&target);
}

/// (b) Connects, registers, forks the helper (which keeps the connection and waits for EOF
/// on stdin), and exits.
#[test]
fn role_reuse_client() {
    let Some(sock) = role("role_reuse_client") else {
        return;
    };
    // (a is never dropped: the process leaves with _exit, without telling the daemon.)
    let a = Area::connect(&sock).expect("connect");
    let t = a.register(NET.0, NET.1).expect("register");
    assert!(a.is_valid(t));
    println!("client pid={}", std::process::id());
    let (ready_r, ready_w) = pipe();
    fork_helper(ready_w.as_raw_fd(), 0, &[ready_r.as_raw_fd()]);
    let mut b = [0u8; 1];
    // SAFETY: reads into a live buffer, writes a static one, and leaves at once: no call the
    // programs watch after the helper's snapshot.
    unsafe {
        libc::close(ready_w.as_raw_fd());
        assert_eq!(libc::read(ready_r.as_raw_fd(), b.as_mut_ptr().cast(), 1), 1);
        say(b"helper: ready\n");
        libc::_exit(0);
    }
}

/// (c) Sends the hello by hand, fills the area with a net, forks the helper and execs before
/// arming.
#[test]
fn role_unarmed_client() {
    let Some(sock) = role("role_unarmed_client") else {
        return;
    };
    let mut s = UnixStream::connect(&sock).expect("connect");
    s.write_all(b"umn-ebpf 1\n").unwrap();
    let (reply, fd) = recv_fd(&s);
    assert!(reply.starts_with("ok "), "daemon: {reply:?}");
    let fd = fd.expect("an area fd");
    let (_, len) = find_area_fd();
    let p = map_raw(fd.as_raw_fd(), len);
    // SAFETY: the area's words, written as the programs read them.
    unsafe {
        p.add(OFF_RANGES / 8).write_volatile(NET.0);
        p.add(OFF_RANGES / 8 + 1).write_volatile(NET.1);
        p.add(OFF_LO / 8).write_volatile(NET.0);
        p.add(OFF_HI / 8).write_volatile(NET.1);
        p.add(OFF_COUNT / 8).write_volatile(1);
    }
    exec_victim_with_helper("self");
}

/// (d) Connects, registers, makes its leader thread exit, and waits for the area to die.
#[test]
fn role_leader_client() {
    let Some(sock) = role("role_leader_client") else {
        return;
    };
    let a = Area::connect(&sock).expect("connect");
    let buf = vec![0u8; PAGE];
    let start = buf.as_ptr() as u64;
    let t = a.register(start, start + PAGE as u64).expect("register");
    extern "C" fn leave(_: libc::c_int) {
        // SAFETY: ends this thread only (not the group); it runs no more code.
        unsafe { libc::syscall(libc::SYS_exit, 0) };
    }
    // SAFETY: installs a handler that ends the receiving thread; sent to the leader only.
    unsafe {
        libc::signal(
            libc::SIGUSR1,
            leave as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        let pid = libc::getpid();
        libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGUSR1);
    }
    for _ in 0..2000 {
        if !a.is_valid(t) {
            let refused = a.register(start, start + PAGE as u64).is_err();
            println!("leader: area dead (register refused: {refused})");
            std::process::exit(if refused { 0 } else { 1 });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    println!("leader: area still valid 20 s after the leader exited");
    std::process::exit(1);
}

fn recv_fd(s: &UnixStream) -> (String, Option<OwnedFd>) {
    let mut buf = [0u8; 256];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points at live buffers.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    assert!(n > 0, "recvmsg");
    // SAFETY: the kernel filled msg_control.
    let fd = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (!c.is_null() && (*c).cmsg_type == libc::SCM_RIGHTS).then(|| {
            OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>()))
        })
    };
    (String::from_utf8_lossy(&buf[..n as usize]).into_owned(), fd)
}
