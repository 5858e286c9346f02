//! `umn no-procmap-query CMD...`: runs a command as a kernel before 6.11 would, as far as the
//! library's mapping lookups go: a seccomp filter answers the `PROCMAP_QUERY` ioctl with
//! `ENOTTY` (what an older kernel answers), so the library takes its fallback paths
//! (`crates/ummunotify/src/sys/vma.rs`; issue 41). The filter is inherited by every thread,
//! child and `exec`; nothing else is filtered. Used by CI (`.ci/run`) so the fallback is never
//! the untested path.
#![allow(unsafe_code)] // prctl, seccomp and execvp.

use std::ffi::CString;
use std::io;

/// `_IOWR('f', 17, struct procmap_query)` (Linux 6.11).
pub const PROCMAP_QUERY: u32 = 0xc068_6611;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Installs the filter on this process (every thread: `SECCOMP_FILTER_FLAG_TSYNC`). For good:
/// a seccomp filter can not be removed.
pub fn install() -> io::Result<()> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    // struct seccomp_data: nr at 0, arch at 4, args[1] (the ioctl's request, low half) at 24.
    let prog = [
        ins(LD_W_ABS, 0, 0, 4),
        ins(JEQ_K, 1, 0, AUDIT_ARCH),
        ins(RET_K, 0, 0, RET_ALLOW),
        ins(LD_W_ABS, 0, 0, 0),
        ins(JEQ_K, 0, 3, libc::SYS_ioctl as u32),
        ins(LD_W_ABS, 0, 0, 24),
        ins(JEQ_K, 0, 1, PROCMAP_QUERY),
        ins(RET_K, 0, 0, RET_ERRNO | libc::ENOTTY as u32),
        ins(RET_K, 0, 0, RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: sets a flag of this process; asks nothing of memory.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel copies the program, which lives until the call returns.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Installs the filter and `exec`s `argv` (searched in `PATH`). Returns only on failure.
pub fn exec(argv: &[&str]) -> io::Error {
    let Some(&prog) = argv.first() else {
        return io::Error::new(io::ErrorKind::InvalidInput, "no command");
    };
    if let Err(e) = install() {
        return e;
    }
    let Ok(args) = argv
        .iter()
        .map(|a| CString::new(*a))
        .collect::<Result<Vec<_>, _>>()
    else {
        return io::Error::new(io::ErrorKind::InvalidInput, "a NUL in an argument");
    };
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let prog = CString::new(prog).expect("checked above");
    // SAFETY: a NUL-terminated array of C strings that outlive the call.
    unsafe { libc::execvp(prog.as_ptr(), ptrs.as_ptr()) };
    io::Error::last_os_error()
}

#[cfg(test)]
mod tests {
    /// Under the filter `PROCMAP_QUERY` fails with ENOTTY and other ioctls still work (in a
    /// child: the filter is for good).
    #[test]
    fn filter_answers_enotty() {
        // SAFETY: fork in a test; the child only makes syscalls and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                super::install().ok()?;
                let f = std::fs::File::open("/proc/self/maps").ok()?;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
                let mut buf = [0u64; 13];
                buf[0] = 104;
                buf[1] = 0x10;
                // SAFETY: PROCMAP_QUERY with a struct of the size it is told (or the filter).
                let rc = unsafe { libc::ioctl(fd, super::PROCMAP_QUERY as _, buf.as_mut_ptr()) };
                let err = std::io::Error::last_os_error().raw_os_error();
                let mut n = 0i32;
                // SAFETY: FIONREAD on a pipe writes one int.
                let mut p = [0i32; 2];
                unsafe { libc::pipe(p.as_mut_ptr()) };
                let other = unsafe { libc::ioctl(p[0], libc::FIONREAD, &mut n) };
                (rc == -1 && err == Some(libc::ENOTTY) && other == 0).then_some(())
            })()
            .map_or(1, |()| 0);
            // SAFETY: ends the child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
