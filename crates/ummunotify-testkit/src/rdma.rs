//! The wire: an RC queue pair to a peer process that RDMA-READs and RDMA-WRITEs this process's
//! registered memory on command, so a test sees the bytes an RDMA device actually moved.
//!
//! The peer is `kernel/rxe/rxe_peer.c` (built with gcc against rdma-core's headers); the
//! protocol is described in `kernel/rxe/pair.h`. This side makes its own queue pair on the
//! protection domain that holds the memory regions under test (the registration cache's) and
//! connects it to the peer's. libibverbs is loaded at run time, as the library does, so the
//! test binaries build and start where rdma-core is absent.
#![allow(unsafe_code)] // dlopen/dlsym and the verbs calls behind them.

use std::ffi::{c_int, c_void, CStr};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// `union ibv_gid`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Gid([u8; 16]);

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GlobalRoute {
    dgid: Gid,
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
struct AhAttr {
    grh: GlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct QpCap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct QpAttr {
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    cap: QpCap,
    ah_attr: AhAttr,
    alt_ah_attr: AhAttr,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
struct QpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    cap: QpCap,
    qp_type: u32,
    sq_sig_all: c_int,
}

/// Byte offset of `qp_num` in `struct ibv_qp` (after six pointers and `handle`).
const QP_NUM_OFFSET: usize = 6 * 8 + 4;

// The layouts of rdma-core's x86-64 ABI; the peer, built with the real header, reports its sizes
// at start and `Wire::connect` compares them.
const _: () = assert!(std::mem::size_of::<AhAttr>() == 32);
const _: () = assert!(std::mem::size_of::<QpAttr>() == 144);
const _: () = assert!(std::mem::offset_of!(QpAttr, ah_attr) == 56);
const _: () = assert!(std::mem::offset_of!(QpAttr, max_rd_atomic) == 126);
const _: () = assert!(std::mem::size_of::<QpInitAttr>() == 64);

const QPS_INIT: u32 = 1;
const QPS_RTR: u32 = 2;
const QPS_RTS: u32 = 3;
const QPT_RC: u32 = 2;
const ACCESS_LOCAL_WRITE: u32 = 1;
const ACCESS_REMOTE_WRITE: u32 = 2;
const ACCESS_REMOTE_READ: u32 = 4;
const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;
const PORT: u8 = 1;

/// The queue-pair calls of libibverbs.
struct QpLib {
    create_cq:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    create_qp: unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void,
    destroy_qp: unsafe extern "C" fn(*mut c_void) -> c_int,
    modify_qp: unsafe extern "C" fn(*mut c_void, *mut QpAttr, c_int) -> c_int,
    query_gid: unsafe extern "C" fn(*mut c_void, u8, c_int, *mut Gid) -> c_int,
}

fn dlerror() -> String {
    // SAFETY: NULL or a NUL-terminated string valid until the next dl* call; copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlsym` of `name` in libibverbs' handle `h`, as a function pointer of type `F`.
///
/// # Safety
/// `h` is a live handle; `F` is the function's real type.
unsafe fn sym<F: Copy>(h: *mut c_void, name: &CStr) -> Result<F, String> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: (caller) a live handle; a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        return Err(format!(
            "libibverbs.so.1: {}: {}",
            name.to_string_lossy(),
            dlerror()
        ));
    }
    // SAFETY: (caller) `F` is the function's type, of a pointer's size (asserted above).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl QpLib {
    fn get() -> io::Result<&'static QpLib> {
        static LIB: OnceLock<Result<QpLib, String>> = OnceLock::new();
        LIB.get_or_init(|| {
            // SAFETY: a NUL-terminated name; never closed.
            let h = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
            if h.is_null() {
                return Err(format!("libibverbs.so.1: {}", dlerror()));
            }
            // SAFETY (each `sym`): the libibverbs function of that name, whose prototype in
            // infiniband/verbs.h the field's type spells.
            unsafe {
                Ok(QpLib {
                    create_cq: sym(h, c"ibv_create_cq")?,
                    destroy_cq: sym(h, c"ibv_destroy_cq")?,
                    create_qp: sym(h, c"ibv_create_qp")?,
                    destroy_qp: sym(h, c"ibv_destroy_qp")?,
                    modify_qp: sym(h, c"ibv_modify_qp")?,
                    query_gid: sym(h, c"ibv_query_gid")?,
                })
            }
        })
        .as_ref()
        .map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e.clone()))
    }
}

/// What the peer says at start (see `kernel/rxe/pair.h`).
struct Hello {
    qpn: u32,
    psn: u32,
    gidx: i32,
    gid: Gid,
    mtu: u32,
}

fn parse_gid(s: &str) -> Option<Gid> {
    if s.len() != 32 {
        return None;
    }
    let mut g = Gid::default();
    for (i, b) in g.0.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(g)
}

fn gid_hex(g: &Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn os_check(rc: c_int, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        // Verbs calls return an errno value (some return -1 and set errno).
        let e = if rc > 0 {
            io::Error::from_raw_os_error(rc)
        } else {
            io::Error::last_os_error()
        };
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// An RC queue pair of this process, connected to a peer process's, and the peer's pipes.
pub struct Wire {
    lib: &'static QpLib,
    cq: NonNull<c_void>,
    qp: NonNull<c_void>,
    child: Child,
    to_peer: ChildStdin,
    from_peer: BufReader<ChildStdout>,
}

impl Wire {
    /// Starts the peer program `peer` on `device`, makes this side's queue pair on `pd` (a
    /// `struct ibv_pd *` of the same device, the one that registers the memory under test) and
    /// connects the two.
    ///
    /// # Safety
    /// `pd` must be a live protection domain that outlives the returned `Wire`.
    ///
    /// # Errors
    /// libibverbs missing, the peer failing to start or to connect, a verbs call's errno.
    pub unsafe fn connect(peer: &Path, device: &str, pd: *mut c_void) -> io::Result<Wire> {
        let lib = QpLib::get()?;
        let mut child = Command::new(peer)
            .arg(device)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", peer.display())))?;
        let to_peer = child.stdin.take().expect("piped stdin");
        let from_peer = BufReader::new(child.stdout.take().expect("piped stdout"));
        // SAFETY: (caller) a live `struct ibv_pd`, whose first field is its context.
        let ctx = unsafe { *pd.cast::<*mut c_void>() };
        // SAFETY: a live context; no completion channel.
        let cq = unsafe { (lib.create_cq)(ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        let cq = NonNull::new(cq).ok_or_else(|| {
            let e = io::Error::last_os_error();
            io::Error::new(e.kind(), format!("ibv_create_cq: {e}"))
        })?;
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut init = QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap,
            qp_type: QPT_RC,
            sq_sig_all: 1,
        };
        // SAFETY: a live pd and CQ, and an init_attr laid out as rdma-core's.
        let qp = unsafe { (lib.create_qp)(pd, &mut init) };
        let Some(qp) = NonNull::new(qp) else {
            let e = io::Error::last_os_error();
            // SAFETY: the CQ made above, destroyed once.
            unsafe { (lib.destroy_cq)(cq.as_ptr()) };
            return Err(io::Error::new(e.kind(), format!("ibv_create_qp: {e}")));
        };
        let mut wire = Wire {
            lib,
            cq,
            qp,
            child,
            to_peer,
            from_peer,
        };
        wire.handshake(ctx)?;
        Ok(wire)
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.from_peer.read_line(&mut l)? == 0 {
            let st = self.child.try_wait()?;
            return Err(io::Error::other(format!("the peer ended ({st:?})")));
        }
        Ok(l.trim_end().to_owned())
    }

    fn modify(&self, attr: &mut QpAttr, mask: c_int, what: &str) -> io::Result<()> {
        // SAFETY: this wire's live QP and an attr laid out as rdma-core's.
        os_check(
            unsafe { (self.lib.modify_qp)(self.qp.as_ptr(), attr, mask) },
            what,
        )
    }

    fn handshake(&mut self, ctx: *mut c_void) -> io::Result<()> {
        let hello = self.line()?;
        let f: Vec<&str> = hello.split_whitespace().collect();
        let bad = || io::Error::other(format!("the peer said {hello:?}"));
        if f.len() != 9 || f[0] != "PEER" {
            return Err(bad());
        }
        let sizes = (f[6], f[7], f[8]);
        let ours = (
            std::mem::size_of::<QpAttr>().to_string(),
            std::mem::size_of::<QpInitAttr>().to_string(),
            QP_NUM_OFFSET.to_string(),
        );
        if sizes != (ours.0.as_str(), ours.1.as_str(), ours.2.as_str()) {
            return Err(io::Error::other(format!(
                "layout differs from the peer's rdma-core headers: peer {sizes:?}, ours {ours:?}"
            )));
        }
        let peer = Hello {
            qpn: f[1].parse().map_err(|_| bad())?,
            psn: f[2].parse().map_err(|_| bad())?,
            gidx: f[3].parse().map_err(|_| bad())?,
            gid: parse_gid(f[4]).ok_or_else(bad)?,
            mtu: f[5].parse().map_err(|_| bad())?,
        };
        let mut gid = Gid::default();
        // SAFETY: a live context; `gid` is a writable 16-byte union.
        os_check(
            unsafe { (self.lib.query_gid)(ctx, PORT, peer.gidx, &mut gid) },
            "ibv_query_gid",
        )?;
        // SAFETY: a live QP: `qp_num` at its fixed offset (checked against the peer's header).
        let qpn = unsafe {
            *self
                .qp
                .as_ptr()
                .cast::<u8>()
                .add(QP_NUM_OFFSET)
                .cast::<u32>()
        };
        let psn = (std::process::id() ^ qpn) & 0xff_ffff;
        let mut a = QpAttr {
            qp_state: QPS_INIT,
            port_num: PORT,
            qp_access_flags: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE,
            ..QpAttr::default()
        };
        self.modify(
            &mut a,
            QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;
        let mut a = QpAttr {
            qp_state: QPS_RTR,
            path_mtu: peer.mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                grh: GlobalRoute {
                    dgid: peer.gid,
                    sgid_index: u8::try_from(peer.gidx).map_err(|_| bad())?,
                    hop_limit: 64,
                    ..GlobalRoute::default()
                },
                is_global: 1,
                port_num: PORT,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        self.modify(
            &mut a,
            QP_STATE
                | QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;
        let mut a = QpAttr {
            qp_state: QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: psn,
            max_rd_atomic: 4,
            ..QpAttr::default()
        };
        self.modify(
            &mut a,
            QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )?;
        writeln!(self.to_peer, "CONNECT {qpn} {psn} {}", gid_hex(&gid))?;
        match self.line()?.as_str() {
            "OK" => Ok(()),
            other => Err(io::Error::other(format!("peer CONNECT: {other}"))),
        }
    }

    /// The peer RDMA-READs `[addr, addr + len)` through `rkey` and returns the bytes that came
    /// over the wire.
    ///
    /// # Errors
    /// The peer's completion error (e.g. a remote access error), or a broken pipe.
    pub fn read(&mut self, addr: usize, len: usize, rkey: u32) -> io::Result<Vec<u8>> {
        writeln!(self.to_peer, "READ {addr:#x} {len} {rkey:#x}")?;
        let l = self.line()?;
        match l.strip_prefix("DATA ").map(str::parse::<usize>) {
            Some(Ok(n)) if n == len => {
                let mut buf = vec![0; n];
                self.from_peer.read_exact(&mut buf)?;
                Ok(buf)
            }
            _ => Err(io::Error::other(format!("peer READ: {l}"))),
        }
    }

    /// The peer RDMA-WRITEs `len` bytes of `byte` to `[addr, addr + len)` through `rkey`, and
    /// answers once the write completed (the data is placed).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn write(&mut self, addr: usize, len: usize, rkey: u32, byte: u8) -> io::Result<()> {
        writeln!(self.to_peer, "WRITE {addr:#x} {len} {rkey:#x} {byte:x}")?;
        match self.line()?.as_str() {
            "OK" => Ok(()),
            other => Err(io::Error::other(format!("peer WRITE: {other}"))),
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = writeln!(self.to_peer, "QUIT");
        let _ = self.to_peer.flush();
        let _ = self.child.wait();
        // SAFETY: this wire's QP and CQ, destroyed once, the QP first.
        unsafe {
            (self.lib.destroy_qp)(self.qp.as_ptr());
            (self.lib.destroy_cq)(self.cq.as_ptr());
        }
    }
}
