//! userfaultfd unavailable: a child process installs a seccomp filter (raw BPF) that answers
//! `EPERM` to `userfaultfd(2)` and to `ioctl(USERFAULTFD_IOC_NEW)` on `/dev/userfaultfd` (what
//! container runtimes do by default). The userfaultfd backend must then fail at once with
//! `Error::Unsupported(PermissionDenied)` whose message names the cause, and `Notifier::new()`
//! (Auto) and `Cache::new()` must fall back to the hooks backend, say why, and see libc munmap,
//! madvise and free() of a registered mmapped malloc block before they return.
//!
//! Opening `/dev/userfaultfd` itself can not be filtered by path in seccomp (BPF sees pointers, not
//! strings); blocking the ioctl is what makes the device useless, and that is what is tested.
mod common;
mod torture_kit;

use std::time::Duration;

use torture_kit::*;
use ummunotify::cache::{Cache, Config};
use ummunotify::{Backend, Cookie, Error, NoopRegistrar, Notifier, Unsupported};

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const USERFAULTFD_IOC_NEW: u32 = 0xAA00;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_SET_MODE_FILTER: libc::c_long = 1;
const SECCOMP_FILTER_FLAG_TSYNC: libc::c_long = 1;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG1_LOW: u32 = 24;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Installs the filter on every thread of this process (TSYNC).
fn deny_userfaultfd() {
    let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let mut prog = [
        insn(BPF_LD_W_ABS, 0, 0, ARCH),
        insn(BPF_JEQ_K, 0, 5, AUDIT_ARCH_X86_64), // other arch: allow
        insn(BPF_LD_W_ABS, 0, 0, NR),
        insn(BPF_JEQ_K, 4, 0, libc::SYS_userfaultfd as u32), // -> deny
        insn(BPF_JEQ_K, 0, 2, libc::SYS_ioctl as u32),       // not ioctl -> allow
        insn(BPF_LD_W_ABS, 0, 0, ARG1_LOW),
        insn(BPF_JEQ_K, 1, 0, USERFAULTFD_IOC_NEW), // -> deny
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        insn(BPF_RET_K, 0, 0, eperm),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(
        r,
        0,
        "PR_SET_NO_NEW_PRIVS: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fprog` points to a valid BPF program that lives until the call returns (the
    // kernel copies it).
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            SECCOMP_FILTER_FLAG_TSYNC,
            &fprog as *const libc::sock_fprog,
        )
    };
    assert_eq!(r, 0, "seccomp: {}", std::io::Error::last_os_error());
}

/// `mallopt` parameter: the mmap threshold (setting it also turns glibc's dynamic one off).
const M_MMAP_THRESHOLD: libc::c_int = -3;

fn child() {
    deny_userfaultfd();
    // The filter works: the raw syscall is refused.
    // SAFETY: userfaultfd with flags only; a returned fd (there should be none) is closed.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!((fd, errno), (-1, Some(libc::EPERM)), "filter not in force");

    // Asked for by name, userfaultfd fails at once with a message naming the cause.
    let err = Notifier::with_backend(Backend::Userfaultfd)
        .expect_err("the userfaultfd backend must fail under the filter");
    let msg = err.to_string();
    eprintln!("Notifier::with_backend(Userfaultfd): {msg}");
    match &err {
        Error::Unsupported(Unsupported::PermissionDenied { attempts }) => {
            assert!(attempts.contains("userfaultfd(2)"), "{attempts}");
            assert!(attempts.contains("/dev/userfaultfd"), "{attempts}");
            assert!(
                attempts.contains("Operation not permitted"),
                "attempts should show EPERM: {attempts}"
            );
        }
        other => panic!("expected Unsupported(PermissionDenied), got {other:?}"),
    }
    assert!(
        msg.contains("seccomp"),
        "message should name seccomp: {msg}"
    );
    assert!(msg.contains("not permitted"), "{msg}");
    assert_eq!(
        std::io::Error::from(err).kind(),
        std::io::ErrorKind::Unsupported
    );
    // Nothing was left half-started: a second try fails the same.
    assert!(matches!(
        Notifier::with_backend(Backend::Userfaultfd),
        Err(Error::Unsupported(Unsupported::PermissionDenied { .. }))
    ));

    // Auto (what `new()`, the C library and the 2010 preload use) falls back to the hooks and
    // says why.
    let n = Notifier::new().expect("Notifier::new() must fall back to the hooks backend");
    eprintln!("Notifier::new(): {}: {}", n.backend(), n.backend_reason());
    assert_eq!(n.backend(), Backend::Hooks);
    assert!(
        n.backend_reason().contains("userfaultfd can not start")
            && n.backend_reason().contains("not permitted"),
        "{}",
        n.backend_reason()
    );

    // It works: libc munmap, madvise and free() of a registered mmapped malloc block are seen
    // before they return.
    let p = common::page();
    let a = common::map(2 * p);
    let r1 = n.register(a..a + p, Cookie(1)).unwrap();
    let r2 = n.register(a + p..a + 2 * p, Cookie(2)).unwrap();
    assert!(n.is_valid(r1) && n.is_valid(r2));
    common::madvise(a + p, p, libc::MADV_DONTNEED);
    assert!(
        !n.is_valid(r2),
        "madvise(DONTNEED) not seen before it returned"
    );
    assert!(n.is_valid(r1));
    common::unmap(a, p);
    assert!(!n.is_valid(r1), "munmap not seen before it returned");

    // SAFETY: mallopt only changes the allocator's tuning (this child is single-threaded).
    unsafe { libc::mallopt(M_MMAP_THRESHOLD, 128 << 10) };
    let len = 1 << 20;
    // SAFETY: plain allocation, freed once below.
    let block = unsafe { libc::malloc(len) } as usize;
    assert_ne!(block, 0);
    let inner = (block + p).next_multiple_of(p);
    let r3 = n.register(inner..inner + p, Cookie(3)).unwrap();
    assert!(n.is_valid(r3));
    // SAFETY: the block from malloc above, freed once; glibc unmaps an mmapped chunk.
    unsafe { libc::free(block as *mut libc::c_void) };
    assert!(
        !n.is_valid(r3),
        "free() of an mmapped block not seen before it returned"
    );
    let cookies: Vec<u64> = n.events().unwrap().iter().map(|e| e.cookie.0).collect();
    for c in [1, 2, 3] {
        assert!(cookies.contains(&c), "no event for cookie {c}: {cookies:?}");
    }
    drop(n);

    match Cache::new(NoopRegistrar, Config::default()) {
        Ok(c) => assert_eq!(c.notifier().backend(), Backend::Hooks),
        Err(e) => panic!("Cache::new under the filter: {e:?}"),
    }
    println!("SECCOMP-CHILD-OK");
}

#[test]
fn userfaultfd_denied_by_seccomp_falls_back_to_hooks() {
    if child_role().as_deref() == Some("seccomp") {
        child();
        return;
    }
    // Make sure the notifier works without the filter (otherwise the test proves nothing).
    if let Err(e) = Notifier::new() {
        skip_or_fail_here(&format!("a working userfaultfd ({e})"));
        return;
    }
    let out = run_child(
        "userfaultfd_denied_by_seccomp_falls_back_to_hooks",
        "seccomp",
        Duration::from_secs(60),
    );
    eprintln!("{}", out.stderr);
    assert!(
        out.success && out.stdout.contains("SECCOMP-CHILD-OK"),
        "child failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

fn skip_or_fail_here(what: &str) {
    ummunotify_testkit::require::skip_or_fail("seccomp", what);
}
