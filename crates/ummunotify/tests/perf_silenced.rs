//! The perf backend when someone silences its tracepoints after it started. A BPF program
//! attached to a syscall tracepoint that returns 0 suppresses every perf sample of that
//! tracepoint, system-wide. The rings then record no munmap: no entry, no exit, no loss. (CI saw
//! that signature once in the mechanism's storm test, and a 50 ms attachment reproduces it.)
//! The defence is the delivery thread's canary. Each tick it makes every traced call once with
//! arguments the kernel refuses, and a tracepoint that records nothing kills the notifier. This
//! test attaches such a program to a running perf notifier and checks three things: the
//! notifier dies (every check fails, even for memory nobody touched), the error names the quiet
//! tracepoints, and no region is trusted again after the program is detached.
//!
//! Checks made between the attachment and that tick can be stale (documented in
//! `src/backend/perf/mod.rs`); this test does not look at them.
//!
//! Needs root (bpf(2), perf tracepoints, tracefs): a loud skip otherwise, a failure under
//! `UMN_REQUIRE_ALL=1` as in CI. Alone in its file: while attached, the program silences
//! munmap for every perf user on the machine.
mod common;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{map, perf_or_skip, unmap, PAGE};
use ummunotify::{Cookie, Error, Unsupported};
use ummunotify_testkit::require::skip_or_fail;

/// The id of tracepoint `syscalls/NAME` under tracefs.
fn tracepoint_id(name: &str) -> io::Result<u64> {
    let path = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(|root| format!("{root}/events/syscalls/{name}/id"))
        .find(|p| std::path::Path::new(p).exists())
        .ok_or_else(|| io::Error::other(format!("no tracefs entry for syscalls/{name}")))?;
    std::fs::read_to_string(&path)?
        .trim()
        .parse()
        .map_err(|_| io::Error::other(format!("{path}: not a number")))
}

fn fd_or_err(r: libc::c_long, what: &str) -> io::Result<OwnedFd> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    // SAFETY: a fresh fd the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Loads `r0 = 0; exit` as a tracepoint program and attaches it to each of `names` (one perf
/// event per tracepoint is enough: a tracepoint's BPF programs serve every CPU). Everything is
/// detached when the returned fds close.
fn silence(names: &[&str]) -> io::Result<Vec<OwnedFd>> {
    // `mov r0, 0` (BPF_ALU64 | BPF_MOV | BPF_K) and `exit` (BPF_JMP | BPF_EXIT), 8 bytes each.
    let insns: [u64; 2] = [0xb7, 0x95];
    let license = c"GPL";
    // `union bpf_attr` for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license; the rest zero.
    let mut attr = [0u64; 16];
    attr[0] = 5 | (insns.len() as u64) << 32; // BPF_PROG_TYPE_TRACEPOINT
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed; the kernel reads the
    // instructions and the license through the pointers while the call runs.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            5, // BPF_PROG_LOAD
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    let prog = fd_or_err(r, "bpf(BPF_PROG_LOAD)")?;
    let mut fds = vec![];
    for name in names {
        // `struct perf_event_attr`: type PERF_TYPE_TRACEPOINT, its size, the tracepoint, a
        // sample per event, raw samples; the rest zero (enabled at once).
        let mut pa = [0u64; 17];
        pa[0] = 2 | (std::mem::size_of_val(&pa) as u64) << 32;
        pa[1] = tracepoint_id(name)?;
        pa[2] = 1;
        pa[3] = 1 << 10;
        // SAFETY: `pa` is a perf_event_attr of the size it says; system-wide on CPU 0.
        let r = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                pa.as_ptr(),
                -1,
                0,
                -1,
                libc::c_ulong::from(8u8), // PERF_FLAG_FD_CLOEXEC
            )
        };
        let ev = fd_or_err(r, &format!("perf_event_open(syscalls:{name})"))?;
        const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
        // SAFETY: both are our fds; the ioctl takes the program fd by value.
        if unsafe { libc::ioctl(ev.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("PERF_EVENT_IOC_SET_BPF: {e}"),
            ));
        }
        fds.push(ev);
    }
    fds.push(prog);
    Ok(fds)
}

#[test]
fn a_tracepoint_silenced_after_start_kills_the_notifier_and_says_which() {
    const TEST: &str = "a_tracepoint_silenced_after_start_kills_the_notifier_and_says_which";
    let Some(n) = perf_or_skip(TEST) else {
        return;
    };
    let a = map(PAGE);
    let r = n.register(a..a + PAGE, Cookie(1)).expect("register");
    let g = n.generation().expect("alive");
    assert!(n.is_valid(r) && n.unchanged_since(g));

    let silencer = match silence(&["sys_enter_munmap", "sys_exit_munmap"]) {
        Ok(fds) => fds,
        Err(e) => {
            skip_or_fail(
                TEST,
                &format!("attaching a BPF program to the tracepoints: {e}"),
            );
            return;
        }
    };
    // The canary runs every tick (10 ms); the deadline only bounds a hang.
    let deadline = Instant::now() + Duration::from_secs(30);
    while n.generation().is_ok() {
        assert!(
            Instant::now() < deadline,
            "{TEST}: the canary never noticed the silenced tracepoints"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(silencer);

    // Dead, with the reason: every check fails, though nobody touched the page.
    assert!(!n.is_valid(r), "a region is valid on a notifier gone blind");
    assert!(!n.unchanged_since(g));
    match n.generation() {
        Err(Error::Unsupported(Unsupported::Perf { missing })) => {
            assert!(
                missing.contains("sys_enter_munmap") && missing.contains("sys_exit_munmap"),
                "the error does not name the quiet tracepoints: {missing}"
            );
            assert!(
                !missing.contains("brk"),
                "a tracepoint that records named: {missing}"
            );
        }
        other => panic!("{TEST}: expected the perf backend's reason, got {other:?}"),
    }
    // The tracepoints record again, but what happened meanwhile is unknown: still dead.
    std::thread::sleep(Duration::from_millis(50));
    assert!(!n.is_valid(r) && n.generation().is_err());
    match n.register(a..a + PAGE, Cookie(2)) {
        Err(Error::Unsupported(Unsupported::Perf { .. })) => {}
        other => panic!("{TEST}: a dead notifier took a registration: {other:?}"),
    }
    drop(n);
    unmap(a, PAGE);
}
