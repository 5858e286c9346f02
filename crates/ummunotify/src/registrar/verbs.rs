//! [`VerbsRegistrar`]: RDMA memory regions, `ibv_reg_mr` / `ibv_dereg_mr`, from libibverbs
//! loaded at run time.
//!
//! libibverbs (rdma-core) is opened with `dlopen("libibverbs.so.1")` the first time a verbs
//! registrar is made, never linked: this crate builds and runs where rdma-core is not installed,
//! and a program that asks for a verbs registrar there gets
//! [`VerbsError::Unavailable`] naming what is absent. A program that links libibverbs itself
//! gets the same library instance (the loader returns the loaded object), so its protection
//! domains, queue pairs and our memory regions belong together.
//!
//! The registrar only registers and deregisters; queue pairs, completion queues and work requests
//! are the caller's, made with the caller's own verbs binding on [`VerbsRegistrar::pd`]. A cached
//! registration's [`MemoryRegion::lkey`] goes in the caller's scatter/gather entries and
//! [`MemoryRegion::rkey`] to the peer for its RDMA READ and WRITE.
#![allow(unsafe_code)] // dlopen/dlsym, and the C calls of libibverbs through their pointers.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::io;
use std::ops::{BitOr, BitOrAssign, Range};
use std::ptr::NonNull;
use std::sync::OnceLock;

use super::Registrar;

/// The library this module loads (rdma-core's SONAME).
pub const IBVERBS_LIBRARY: &str = "libibverbs.so.1";

/// Access flags of a memory region (`enum ibv_access_flags`), chosen by the caller: what the
/// local device and remote peers may do with the registered memory.
///
/// ```
/// use ummunotify::registrar::Access;
/// let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
/// assert_eq!(access.bits(), 0b111);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// No remote access; the device may only read the memory (e.g. a send buffer).
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the memory (receives, RDMA READ targets).
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into it (needs `LOCAL_WRITE`).
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on it (needs `LOCAL_WRITE`).
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// `IBV_ACCESS_RELAXED_ORDERING` (an optional flag: ignored by devices without it).
    pub const RELAXED_ORDERING: Access = Access(1 << 20);

    /// Flags from their `ibv_access_flags` value, including flags this type has no name for;
    /// libibverbs judges them at registration.
    pub const fn from_bits_retain(bits: u32) -> Access {
        Access(bits)
    }

    /// The `ibv_access_flags` value passed to `ibv_reg_mr`.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set here.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

/// Why a verbs registrar could not be made, or a verbs call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs could not be loaded, or lacks a function this module calls.
    Unavailable {
        /// What was looked for (the library, or `library: symbol`).
        what: String,
        /// The loader's message (`dlerror`).
        reason: String,
    },
    /// No RDMA device (or not the one asked for).
    NoDevice {
        /// The device asked for, if any.
        wanted: Option<String>,
        /// The devices libibverbs lists.
        found: Vec<String>,
        /// The error of `ibv_get_device_list`, when it failed (ENOSYS: no RDMA support in the
        /// kernel).
        list_error: Option<io::Error>,
    },
    /// A verbs call failed.
    Call {
        /// The call and its arguments, e.g. `ibv_reg_mr(0x7f.., 4096, access 0x7)`.
        call: String,
        /// Its errno.
        error: io::Error,
    },
    /// A NULL protection domain was passed to [`VerbsRegistrar::from_pd`].
    NullPd,
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::Unavailable { what, reason } => {
                write!(
                    f,
                    "libibverbs is not usable: {what}: {reason} (install rdma-core's libibverbs1)"
                )
            }
            VerbsError::NoDevice {
                wanted,
                found,
                list_error,
            } => {
                match wanted {
                    Some(w) => write!(f, "no RDMA device named {w:?}")?,
                    None => write!(f, "no RDMA device")?,
                }
                write!(f, " (ibv_get_device_list: ")?;
                match list_error {
                    Some(e) => write!(f, "{e}")?,
                    None if found.is_empty() => write!(f, "none")?,
                    None => write!(f, "{}", found.join(", "))?,
                }
                write!(f, ")")
            }
            VerbsError::Call { call, error } => write!(f, "{call} failed: {error}"),
            VerbsError::NullPd => write!(f, "the protection domain (struct ibv_pd *) is NULL"),
        }
    }
}

impl std::error::Error for VerbsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VerbsError::Call { error, .. } => Some(error),
            VerbsError::NoDevice {
                list_error: Some(e),
                ..
            } => Some(e),
            _ => None,
        }
    }
}

impl From<VerbsError> for io::Error {
    /// Keeps the message; the kind follows the error (`Unsupported` for a missing library,
    /// `NotFound` for a missing device, the errno's kind for a failed call).
    fn from(e: VerbsError) -> io::Error {
        let kind = match &e {
            VerbsError::Unavailable { .. } => io::ErrorKind::Unsupported,
            VerbsError::NoDevice { .. } => io::ErrorKind::NotFound,
            VerbsError::Call { error, .. } => error.kind(),
            VerbsError::NullPd => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// The start of `struct ibv_mr` (rdma-core's ABI, stable since libibverbs 1.1).
#[repr(C)]
struct IbvMr {
    context: *mut c_void,
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// The start of `struct ibv_pd`.
#[repr(C)]
struct IbvPd {
    context: *mut c_void,
    handle: u32,
}

/// The start of `struct ibv_device` is not used; devices are named with `ibv_get_device_name`.
type Device = c_void;

/// The libibverbs functions this module calls, resolved once per process.
struct Lib {
    get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut Device,
    free_device_list: unsafe extern "C" fn(*mut *mut Device),
    get_device_name: unsafe extern "C" fn(*mut Device) -> *const c_char,
    open_device: unsafe extern "C" fn(*mut Device) -> *mut c_void,
    close_device: unsafe extern "C" fn(*mut c_void) -> c_int,
    alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr,
    dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call in
    // this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlsym` of `symbol` in the library `name` opened as `h`, as a function pointer of type `F`.
///
/// # Safety
/// `h` is a live handle; `F` is the function's real type.
unsafe fn sym<F: Copy>(h: *mut c_void, name: &str, symbol: &CStr) -> Result<F, VerbsError> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: (caller) a live handle; a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, symbol.as_ptr()) };
    if p.is_null() {
        return Err(VerbsError::Unavailable {
            what: format!("{name}: {}", symbol.to_string_lossy()),
            reason: dlerror(),
        });
    }
    // SAFETY: (caller) `F` is the function's type; a function pointer has a pointer's size
    // (asserted above).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Lib {
    /// Opens `name` and resolves every function, or says which one is missing.
    fn load(name: &str) -> Result<Lib, VerbsError> {
        let cname = CString::new(name).map_err(|_| VerbsError::Unavailable {
            what: name.to_owned(),
            reason: "the name contains a NUL byte".to_owned(),
        })?;
        // SAFETY: a NUL-terminated name; the library's constructors run (rdma-core has none that
        // matter here). The handle is never closed: the functions stay valid for the process.
        let h = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(VerbsError::Unavailable {
                what: name.to_owned(),
                reason: dlerror(),
            });
        }
        // SAFETY (each `sym`): the symbol is the libibverbs function of that name, whose C
        // prototype (infiniband/verbs.h) the field's type spells.
        unsafe {
            Ok(Lib {
                get_device_list: sym(h, name, c"ibv_get_device_list")?,
                free_device_list: sym(h, name, c"ibv_free_device_list")?,
                get_device_name: sym(h, name, c"ibv_get_device_name")?,
                open_device: sym(h, name, c"ibv_open_device")?,
                close_device: sym(h, name, c"ibv_close_device")?,
                alloc_pd: sym(h, name, c"ibv_alloc_pd")?,
                dealloc_pd: sym(h, name, c"ibv_dealloc_pd")?,
                reg_mr: sym(h, name, c"ibv_reg_mr")?,
                dereg_mr: sym(h, name, c"ibv_dereg_mr")?,
            })
        }
    }

    /// The process's libibverbs, loaded on first use. A failure is kept: libibverbs does not
    /// appear later in a running process.
    fn get() -> Result<&'static Lib, VerbsError> {
        static LIB: OnceLock<Result<Lib, (String, String)>> = OnceLock::new();
        match LIB.get_or_init(|| {
            Lib::load(IBVERBS_LIBRARY).map_err(|e| match e {
                VerbsError::Unavailable { what, reason } => (what, reason),
                other => (IBVERBS_LIBRARY.to_owned(), other.to_string()),
            })
        }) {
            Ok(lib) => Ok(lib),
            Err((what, reason)) => Err(VerbsError::Unavailable {
                what: what.clone(),
                reason: reason.clone(),
            }),
        }
    }

    /// The devices libibverbs lists: their names and the list (to free with `free_device_list`).
    fn devices(&self) -> Result<(Vec<String>, *mut *mut Device), io::Error> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a writable int; the list is freed by the caller.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(io::Error::last_os_error());
        }
        let mut names = Vec::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list has `n` entries (then a NULL); each is a live device.
            let dev = unsafe { *list.add(i) };
            // SAFETY: ibv_get_device_name returns the device's NUL-terminated name (or NULL).
            let name = unsafe { (self.get_device_name)(dev) };
            names.push(if name.is_null() {
                String::new()
            } else {
                // SAFETY: non-NULL, NUL-terminated, owned by the device.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            });
        }
        Ok((names, list))
    }
}

/// The names of the RDMA devices libibverbs lists here (`ibv_devices`), e.g. `["rxe0"]`.
///
/// # Errors
/// [`VerbsError::Unavailable`] without libibverbs; [`VerbsError::NoDevice`] when
/// `ibv_get_device_list` fails (ENOSYS: no RDMA support in the kernel).
pub fn devices() -> Result<Vec<String>, VerbsError> {
    let lib = Lib::get()?;
    match lib.devices() {
        Ok((names, list)) => {
            // SAFETY: the list from `devices`, freed once.
            unsafe { (lib.free_device_list)(list) };
            Ok(names)
        }
        Err(e) => Err(VerbsError::NoDevice {
            wanted: None,
            found: Vec::new(),
            list_error: Some(e),
        }),
    }
}

/// A registered memory region (an `ibv_mr`), the key a [`VerbsRegistrar`] gives a cached range.
///
/// Put [`lkey`](Self::lkey) in your work requests' scatter/gather entries and send
/// [`rkey`](Self::rkey) with [`addr`](Self::addr) to the peer for its RDMA READ / WRITE. Valid
/// while the cache's [`Handle`](crate::cache::Handle) that hands it out lives; check
/// [`Handle::is_valid`](crate::cache::Handle::is_valid) before a long-running use.
#[derive(Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    mr: NonNull<c_void>,
    addr: usize,
    len: usize,
    lkey: u32,
    rkey: u32,
}

// SAFETY: an `ibv_mr` handle may be used and deregistered from any thread (libibverbs is
// thread-safe); this type only reads its own copies of the keys and passes the pointer on.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; every method takes `&self` and reads plain copies.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// The local key, for this process's scatter/gather entries (`ibv_sge.lkey`).
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key, for a peer's RDMA READ / WRITE (`wr.rdma.rkey`).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The registered start address (also the region's I/O virtual address).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The registered length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never, for a region the cache registered).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `struct ibv_mr *` itself, for the caller's own verbs calls (memory windows, say).
    /// Owned by the registrar: never pass it to `ibv_dereg_mr`.
    pub fn as_ptr(&self) -> *mut c_void {
        self.mr.as_ptr()
    }

    /// Gives up the Rust value for the `struct ibv_mr *` (to hand to C as a 64-bit key, say);
    /// [`from_raw`](Self::from_raw) takes it back. The region stays registered.
    pub fn into_raw(self) -> *mut c_void {
        self.mr.as_ptr()
    }

    /// The region behind a pointer from [`into_raw`](Self::into_raw) (its keys, address and
    /// length are read from the `struct ibv_mr`); `None` for NULL.
    ///
    /// # Safety
    /// `mr` must be NULL or a live region registered by a [`VerbsRegistrar`] and given up with
    /// `into_raw`, taken back once.
    pub unsafe fn from_raw(mr: *mut c_void) -> Option<MemoryRegion> {
        let mr = NonNull::new(mr)?;
        // SAFETY: (caller) a live `struct ibv_mr`.
        let m = unsafe { &*mr.as_ptr().cast::<IbvMr>() };
        Some(MemoryRegion {
            mr,
            addr: m.addr as usize,
            len: m.length,
            lkey: m.lkey,
            rkey: m.rkey,
        })
    }
}

/// What a [`VerbsRegistrar`] opened itself (and closes on drop).
struct Owned {
    context: NonNull<c_void>,
    device: String,
}

/// Registers cached ranges as RDMA memory regions: `ibv_reg_mr(pd, addr, len, access)` on a
/// miss, `ibv_dereg_mr` once the region left the cache and no handle holds it.
///
/// `ibv_reg_mr` pins the pages: after the memory is unmapped (or zapped, moved, replaced) the
/// device keeps reading and writing the *old* pages through the region. That is the hazard the
/// [`Cache`](crate::cache::Cache) and its notifier keep away from the wire.
///
/// ```no_run
/// use ummunotify::cache::{Cache, Config};
/// use ummunotify::registrar::{Access, VerbsRegistrar};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Your own protection domain (the one your queue pairs use) ...
/// # let my_pd: *mut std::ffi::c_void = std::ptr::null_mut();
/// let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
/// // SAFETY: `my_pd` is a live `struct ibv_pd *` that outlives the cache.
/// let verbs = unsafe { VerbsRegistrar::from_pd(my_pd, access) }?;
/// // ... or one of the registrar's own: VerbsRegistrar::open(Some("mlx5_0"), access)?
/// let cache = Cache::new(verbs, Config::default())?;
///
/// let buf = vec![0u8; 1 << 20];
/// let mr = cache.get(buf.as_ptr() as usize, buf.len())?; // miss: ibv_reg_mr
/// let (lkey, rkey) = (mr.key().lkey(), mr.key().rkey());  // for your sge / the peer
/// # let _ = (lkey, rkey);
/// drop(mr);                                              // the registration stays cached
/// drop(buf); // free() unmaps it: the next get() of this address registers anew
/// # Ok(()) }
/// ```
pub struct VerbsRegistrar {
    lib: &'static Lib,
    pd: NonNull<c_void>,
    access: Access,
    owned: Option<Owned>,
}

// SAFETY: libibverbs' registration calls are thread-safe on a shared protection domain; the
// raw pointers are handles this registrar passes to them (and, if owned, closes once on drop).
unsafe impl Send for VerbsRegistrar {}
// SAFETY: as above; `&self` methods only make thread-safe verbs calls.
unsafe impl Sync for VerbsRegistrar {}

impl VerbsRegistrar {
    /// A registrar on the caller's protection domain `pd` (a `struct ibv_pd *` from the
    /// caller's libibverbs), registering with `access`.
    ///
    /// # Safety
    /// `pd` must be a live protection domain of the process's libibverbs and stay alive until
    /// the registrar is dropped (after the cache that owns it, which deregisters everything
    /// first).
    ///
    /// # Errors
    /// [`VerbsError::NullPd`]; [`VerbsError::Unavailable`] if libibverbs can not be loaded.
    pub unsafe fn from_pd(pd: *mut c_void, access: Access) -> Result<VerbsRegistrar, VerbsError> {
        let pd = NonNull::new(pd).ok_or(VerbsError::NullPd)?;
        Ok(VerbsRegistrar {
            lib: Lib::get()?,
            pd,
            access,
            owned: None,
        })
    }

    /// A registrar with a protection domain of its own on `device` (by name, e.g. `"rxe0"`;
    /// `None`: the first device libibverbs lists). Create your queue pairs on
    /// [`pd`](Self::pd), so that they may use its regions.
    ///
    /// # Errors
    /// [`VerbsError::Unavailable`] without libibverbs, [`VerbsError::NoDevice`],
    /// [`VerbsError::Call`] naming `ibv_open_device` or `ibv_alloc_pd` and the errno.
    pub fn open(device: Option<&str>, access: Access) -> Result<VerbsRegistrar, VerbsError> {
        let lib = Lib::get()?;
        let (names, list) = lib.devices().map_err(|e| VerbsError::NoDevice {
            wanted: device.map(str::to_owned),
            found: Vec::new(),
            list_error: Some(e),
        })?;
        let pick = match device {
            Some(want) => names.iter().position(|n| n == want),
            None => (!names.is_empty()).then_some(0),
        };
        let Some(i) = pick else {
            // SAFETY: the list from `devices`, freed once.
            unsafe { (lib.free_device_list)(list) };
            return Err(VerbsError::NoDevice {
                wanted: device.map(str::to_owned),
                found: names,
                list_error: None,
            });
        };
        // SAFETY: `i` indexes a live device of the list, which stays allocated until freed
        // below (an opened context keeps its own reference to the device).
        let ctx = unsafe { (lib.open_device)(*list.add(i)) };
        let open_err = io::Error::last_os_error();
        // SAFETY: the list from `devices`, freed once.
        unsafe { (lib.free_device_list)(list) };
        let name = names[i].clone();
        let Some(context) = NonNull::new(ctx) else {
            return Err(VerbsError::Call {
                call: format!("ibv_open_device({name})"),
                error: open_err,
            });
        };
        // SAFETY: a live context from ibv_open_device.
        let pd = unsafe { (lib.alloc_pd)(context.as_ptr()) };
        let Some(pd) = NonNull::new(pd) else {
            let error = io::Error::last_os_error();
            // SAFETY: the context opened above, closed once.
            unsafe { (lib.close_device)(context.as_ptr()) };
            return Err(VerbsError::Call {
                call: format!("ibv_alloc_pd({name})"),
                error,
            });
        };
        Ok(VerbsRegistrar {
            lib,
            pd,
            access,
            owned: Some(Owned {
                context,
                device: name,
            }),
        })
    }

    /// The protection domain (`struct ibv_pd *`) regions are registered in.
    pub fn pd(&self) -> *mut c_void {
        self.pd.as_ptr()
    }

    /// The device context (`struct ibv_context *`) of [`pd`](Self::pd), for your queue pairs and
    /// completion queues.
    pub fn context(&self) -> *mut c_void {
        // SAFETY: `pd` is a live `struct ibv_pd`, whose first field is its context.
        unsafe { (*self.pd.as_ptr().cast::<IbvPd>()).context }
    }

    /// The device name, if the registrar opened the device itself ([`open`](Self::open)).
    pub fn device(&self) -> Option<&str> {
        self.owned.as_ref().map(|o| o.device.as_str())
    }

    /// The access flags every region is registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// `ibv_reg_mr(pd, range.start, range.len(), access)`, without a cache.
    ///
    /// # Errors
    /// [`VerbsError::Call`] with the call, its arguments and the errno (`ENOMEM` past the
    /// locked-memory limit, `EFAULT` for unmapped memory, `EINVAL` for refused flags).
    pub fn reg_mr(&self, range: Range<usize>) -> Result<MemoryRegion, VerbsError> {
        let len = range.len();
        // SAFETY: the kernel pins the pages behind the range or fails; it reads or writes them
        // only through work requests, which are the caller's business. `pd` is live (contract
        // of `from_pd`, or owned).
        let mr = unsafe {
            (self.lib.reg_mr)(
                self.pd.as_ptr(),
                range.start as *mut c_void,
                len,
                self.access.bits() as c_int,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            return Err(VerbsError::Call {
                call: format!(
                    "ibv_reg_mr({:#x}, {len}, access {:#x})",
                    range.start,
                    self.access.bits()
                ),
                error: io::Error::last_os_error(),
            });
        };
        // SAFETY: a live `struct ibv_mr` just returned; its keys are fixed for its lifetime.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(MemoryRegion {
            mr: mr.cast(),
            addr: range.start,
            len,
            lkey,
            rkey,
        })
    }

    /// `ibv_dereg_mr` of a region from [`reg_mr`](Self::reg_mr) of this registrar.
    ///
    /// # Errors
    /// [`VerbsError::Call`] with the errno (`EBUSY`: a memory window is still bound to it).
    pub fn dereg_mr(&self, mr: MemoryRegion) -> Result<(), VerbsError> {
        self.dereg(&mr)
    }

    fn dereg(&self, mr: &MemoryRegion) -> Result<(), VerbsError> {
        // SAFETY: a live region registered by this registrar; the cache (or `dereg_mr`, which
        // takes it by value) deregisters each exactly once, and never reads it afterwards.
        match unsafe { (self.lib.dereg_mr)(mr.mr.as_ptr().cast()) } {
            0 => Ok(()),
            e => Err(VerbsError::Call {
                call: format!("ibv_dereg_mr({:#x}, {})", mr.addr, mr.len),
                error: io::Error::from_raw_os_error(e),
            }),
        }
    }
}

impl Registrar for VerbsRegistrar {
    type Key = MemoryRegion;

    fn register(&self, range: Range<usize>) -> io::Result<MemoryRegion> {
        self.reg_mr(range).map_err(io::Error::from)
    }

    fn deregister(&self, key: &MemoryRegion, _range: Range<usize>) -> io::Result<()> {
        self.dereg(key).map_err(io::Error::from)
    }
}

impl Drop for VerbsRegistrar {
    fn drop(&mut self) {
        if let Some(o) = self.owned.take() {
            // SAFETY: the protection domain and context this registrar opened, each released
            // once. A domain the caller still uses (queue pairs on it) fails with EBUSY and is
            // left to the process's exit, like the context then.
            unsafe {
                if (self.lib.dealloc_pd)(self.pd.as_ptr()) == 0 {
                    (self.lib.close_device)(o.context.as_ptr());
                }
            }
        }
    }
}

impl fmt::Debug for VerbsRegistrar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsRegistrar")
            .field("pd", &self.pd)
            .field("device", &self.device())
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_typed_error_naming_it() {
        let e = Lib::load("libibverbs-not-here.so.1")
            .err()
            .expect("no such library");
        assert!(matches!(e, VerbsError::Unavailable { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("libibverbs-not-here.so.1"), "{msg}");
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::Unsupported);
    }

    #[test]
    fn a_library_without_the_verbs_calls_names_the_missing_symbol() {
        // libc loads, but has no ibv_get_device_list.
        let e = Lib::load("libc.so.6").err().expect("not libibverbs");
        let msg = e.to_string();
        assert!(msg.contains("ibv_get_device_list"), "{msg}");
    }

    #[test]
    fn from_pd_refuses_null() {
        // SAFETY: NULL is refused before anything is called.
        let e = unsafe { VerbsRegistrar::from_pd(std::ptr::null_mut(), Access::NONE) };
        assert!(matches!(e, Err(VerbsError::NullPd)));
    }

    #[test]
    fn access_flags_are_ibv_access_flags() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        assert_eq!(a.bits(), 7);
        assert!(a.contains(Access::REMOTE_READ));
        assert!(!a.contains(Access::REMOTE_ATOMIC));
        assert_eq!(Access::from_bits_retain(1 << 20), Access::RELAXED_ORDERING);
    }
}
