//! The kernel ABI the eBPF backend uses: `bpf(2)` (maps, program load), `perf_event_open(2)`
//! on a tracepoint (attach), tracefs (tracepoint ids and record layout) and `SCM_RIGHTS`.
//!
//! Like the crate's `sys`: functions named after the syscall or command they wrap, fds created
//! as `OwnedFd` on the line that gets them, `-1` turned into `io::Error`.
#![allow(unsafe_code)] // bpf(2), perf_event_open(2), mmap of a map, sendmsg/recvmsg.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::asm::Insn;

pub(crate) const BPF_MAP_TYPE_HASH: u32 = 1;
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_MAP_TYPE_HASH_OF_MAPS: u32 = 13;
pub(crate) const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;

/// `union bpf_attr`, as one zeroed block large enough for every command used here; each
/// command writes its own fields at the kernel's offsets.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, off: usize, name: &str) -> &mut Self {
        let n = name.len().min(15);
        self.0[off..off + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, writable block of the size passed; the kernel reads only the
    // fields of `cmd` and the pointers stored in them, which the callers keep alive.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel as a new descriptor owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// `BPF_MAP_CREATE`. `inner` is the template of a map-in-map.
pub(crate) fn map_create(
    name: &str,
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    inner: Option<BorrowedFd<'_>>,
) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, map_type)
        .u32(4, key_size)
        .u32(8, value_size)
        .u32(12, max_entries)
        .u32(16, flags)
        .u32(20, inner.map_or(0, |f| f.as_raw_fd() as u32))
        .name(28, name);
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

fn elem_attr(map: BorrowedFd<'_>, key: *const u8, value: u64, flags: u64) -> Attr {
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, key as u64)
        .u64(16, value)
        .u64(24, flags);
    a
}

/// `BPF_MAP_UPDATE_ELEM` (`flags`: `BPF_ANY` 0, `BPF_NOEXIST` 1).
pub(crate) fn map_update(
    map: BorrowedFd<'_>,
    key: &[u8],
    value: &[u8],
    flags: u64,
) -> io::Result<()> {
    let mut a = elem_attr(map, key.as_ptr(), value.as_ptr() as u64, flags);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

/// `BPF_MAP_DELETE_ELEM`.
pub(crate) fn map_delete(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    let mut a = elem_attr(map, key.as_ptr(), 0, 0);
    bpf(BPF_MAP_DELETE_ELEM, &mut a).map(drop)
}

/// `BPF_MAP_LOOKUP_ELEM` (for a map-in-map the value is the inner map's id).
pub(crate) fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    let mut a = elem_attr(map, key.as_ptr(), value.as_mut_ptr() as u64, 0);
    bpf(BPF_MAP_LOOKUP_ELEM, &mut a).map(drop)
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first with `None`); `ENOENT` at the end.
pub(crate) fn map_next_key(
    map: BorrowedFd<'_>,
    key: Option<&[u8]>,
    next: &mut [u8],
) -> io::Result<()> {
    let k = key.map_or(std::ptr::null(), |k| k.as_ptr());
    let mut a = elem_attr(map, k, next.as_mut_ptr() as u64, 0);
    bpf(BPF_MAP_GET_NEXT_KEY, &mut a).map(drop)
}

/// `BPF_PROG_LOAD` of a tracepoint program; on a verifier refusal the error carries its log.
pub(crate) fn prog_load_tracepoint(name: &str, insns: &[Insn]) -> io::Result<OwnedFd> {
    let license = b"GPL\0";
    let mut log = vec![0u8; 1 << 16];
    let load = |log: &mut [u8], level: u32| {
        let mut a = Attr::new();
        a.u32(0, BPF_PROG_TYPE_TRACEPOINT)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(24, level)
            .u32(28, if level > 0 { log.len() as u32 } else { 0 })
            .u64(
                32,
                if level > 0 {
                    log.as_mut_ptr() as u64
                } else {
                    0
                },
            )
            .name(48, name);
        bpf(BPF_PROG_LOAD, &mut a).map(owned)
    };
    match load(&mut log, 0) {
        Ok(fd) => Ok(fd),
        Err(e) if e.raw_os_error() != Some(libc::EPERM) => {
            // Again with the log, to say why.
            let _ = load(&mut log, 1);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(io::Error::new(
                e.kind(),
                format!("BPF_PROG_LOAD {name}: {e}; verifier: {}", tail.join(" | ")),
            ))
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("BPF_PROG_LOAD {name}: {e}"),
        )),
    }
}

/// Where tracefs is (mounting it at `/sys/kernel/tracing` when it is not, which needs root).
pub(crate) fn tracefs() -> io::Result<&'static str> {
    const PATHS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
    for p in PATHS {
        if std::path::Path::new(&format!("{p}/events")).is_dir() {
            return Ok(p);
        }
    }
    let src = c"nodev";
    let dst = c"/sys/kernel/tracing";
    let fs = c"tracefs";
    // SAFETY: all arguments are NUL-terminated strings; no data argument.
    let r = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "tracefs is not mounted and mount -t tracefs nodev /sys/kernel/tracing failed: {e}"
            ),
        ));
    }
    Ok(PATHS[0])
}

/// A syscall tracepoint's id and the offset of its first field after `__syscall_nr` (the first
/// argument for `sys_enter_*`, `ret` for `sys_exit_*`), from its `format` file.
pub(crate) fn tracepoint(name: &str) -> io::Result<(u64, i16)> {
    let dir = format!("{}/events/syscalls/{name}", tracefs()?);
    let (id, format) = tracepoint_files(&dir)?;
    let mut after_nr = false;
    for line in format.lines() {
        if line.contains("__syscall_nr") {
            after_nr = true;
            continue;
        }
        if after_nr && line.contains("field:") {
            let off = line
                .split("offset:")
                .nth(1)
                .and_then(|s| s.split(';').next())
                .and_then(|s| s.parse::<i16>().ok());
            if let Some(off) = off {
                return Ok((id, off));
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{dir}/format: no field after __syscall_nr"),
    ))
}

/// The id of tracepoint `group:name` (the programs on it read no field of its record).
pub(crate) fn tracepoint_id(group: &str, name: &str) -> io::Result<u64> {
    let dir = format!("{}/events/{group}/{name}", tracefs()?);
    tracepoint_files(&dir).map(|(id, _)| id)
}

fn tracepoint_files(dir: &str) -> io::Result<(u64, String)> {
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .map_err(|e| io::Error::new(e.kind(), format!("{dir}/{f}: {e}")))
    };
    let id: u64 = read("id")?
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{dir}/id")))?;
    Ok((id, read("format")?))
}

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// `perf_event_open` on tracepoint `id` for every process (pid -1, cpu 0: a BPF program on a
/// tracepoint event runs for every task on every CPU; the event's own filter applies only to
/// samples) and `PERF_EVENT_IOC_SET_BPF` of `prog`. Closing the returned fd detaches.
pub(crate) fn attach_tracepoint(id: u64, prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16]; // struct perf_event_attr, 128 bytes, zero past `config`
    attr[0] = u64::from(PERF_TYPE_TRACEPOINT) | (128u64 << 32); // type, size
    attr[1] = id; // config
                  // SAFETY: `attr` is a zeroed perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1 as libc::c_int,
            8 as libc::c_ulong, // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("perf_event_open(tracepoint {id}): {e}"),
        ));
    }
    let fd = owned(fd);
    // SAFETY: SET_BPF takes the program fd as its integer argument; ENABLE takes none.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) } != 0
        // SAFETY: as above.
        || unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } != 0
    {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("PERF_EVENT_IOC_SET_BPF: {e}"),
        ));
    }
    Ok(fd)
}

/// Sends `data` and `fd` on a connected Unix socket (`SCM_RIGHTS`).
pub(crate) fn send_fd(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
        // SAFETY: the control buffer is 32 bytes, enough for one header and one fd, and
        // aligned for cmsghdr.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
        }
    }
    // SAFETY: msg points at live buffers for the duration of the call.
    let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Receives up to `buf.len()` bytes and at most one fd from a Unix socket.
pub(crate) fn recv_fd(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of cmsg records.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS
        {
            let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
            fd = Some(OwnedFd::from_raw_fd(raw));
        }
    }
    Ok((n as usize, fd))
}

/// `getsockopt(SO_PEERCRED)`: the pid, uid and gid of the process at the other end of a
/// connected Unix socket, as they were when it connected.
pub(crate) fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<libc::ucred> {
    // SAFETY: ucred is plain data; zero is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writing the option value.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// The uid of system user `name` (`getpwnam_r`), `None` when there is no such user.
pub(crate) fn user_uid(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data; zero is a valid value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf outlives the use of pw's strings (none).
    let r = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    (r == 0 && !out.is_null()).then_some(pw.pw_uid)
}
