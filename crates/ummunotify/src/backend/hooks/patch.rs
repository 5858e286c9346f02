//! Patching glibc's syscall sites (x86-64 only).
//!
//! A *site* is the 7-byte sequence `b8 NR 00 00 00 0f 05` (`mov $NR, %eax; syscall`) inside one
//! of the libc functions of [`TARGETS`](super::calls::TARGETS), found by scanning that function's
//! bytes (its address and `st_size` come from the dynamic symbol table through `dlsym` and
//! `dladdr1`). The 5-byte `mov` is replaced by a `jmp rel32` to a *stub* in a page of ours mapped
//! within ±2 GiB; the stub saves the syscall's argument registers, calls the Rust hook with them
//! (`rdi, rsi, rdx, r10, r8, r9`) and jumps back to the instruction after the `syscall`, with the
//! hook's raw result (`-errno` on failure) in `rax`. glibc's own code then does what it always
//! does with the result: sets `errno`, and for `brk` stores the new break in `__curbrk`.
//!
//! # Why the site, and why this is safe while other threads run through it
//! * The replaced instruction is exactly one whole instruction of five bytes, so a thread can
//!   never be *inside* the patched bytes: it is before the `mov` (and takes the jump) or past it
//!   (and makes the original `syscall`, a call that began before the hooks were in).
//! * The five bytes are written by **one** locked 8-byte `xchg` (the 3 bytes around them are
//!   written back unchanged) that does not cross a cache line; such an access is atomic on every
//!   x86-64 CPU (Intel SDM vol. 3 §9.1.1), so an instruction fetch sees the old `mov` or the
//!   whole `jmp`, never a mix. A site whose 5 bytes straddle a cache line is refused.
//! * Afterwards `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)` makes every thread of
//!   the process execute a core-serializing instruction (SDM §9.1.3's cross-modifying-code
//!   protocol), so from then on every thread fetches the new bytes.
//! * The bytes of each site are checked to be glibc's before writing: anything else (another
//!   hooking library got there first, an unknown glibc build) refuses to install, naming it.
//! * Nothing is ever unpatched: the hooks stay for the life of the process and cost one load
//!   each when no hooks notifier exists.
#![allow(unsafe_code)] // Writing machine code into libc's text and our stub page.

use std::ffi::CStr;

/// One function to patch: its name in libc, the syscall number of its site(s), and the hook.
pub(crate) struct Target {
    pub(crate) name: &'static CStr,
    pub(crate) nr: u32,
    pub(crate) hook: usize,
    /// Whether install fails when this function has no site (optional ones are only noted).
    pub(crate) required: bool,
}

/// What was patched, for `umn doctor` and [`Notifier::backend_reason`](crate::Notifier).
#[derive(Debug)]
pub(crate) struct Patched {
    pub(crate) sites: Vec<(&'static str, usize)>,
    pub(crate) notes: Vec<String>,
}

/// Most sites remembered for [`intact`] (glibc 2.36 has 12).
const KEPT: usize = 32;
/// Each patched site's 8-byte window and the bytes we left there (0: unused).
static KEPT_AT: [std::sync::atomic::AtomicUsize; KEPT] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; KEPT];
static KEPT_BYTES: [std::sync::atomic::AtomicU64; KEPT] =
    [const { std::sync::atomic::AtomicU64::new(0) }; KEPT];

/// Whether `[addr, addr + len)` touches a page holding one of our sites. Hook path: loads only.
pub(crate) fn touches_sites(addr: u64, len: u64) -> bool {
    let (lo, hi) = (addr & !(PAGE as u64 - 1), addr.saturating_add(len));
    KEPT_AT.iter().any(|w| {
        let w = w.load(std::sync::atomic::Ordering::Relaxed) as u64;
        w != 0 && w + 8 > lo && w < hi
    })
}

/// Whether every site still holds the jump we wrote (another library may have written over
/// it since: UCX's memory hooks patch the same instruction at a function's entry). Loads only.
pub(crate) fn intact() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    KEPT_AT.iter().zip(&KEPT_BYTES).all(|(w, b)| {
        let w = w.load(Relaxed);
        // SAFETY: a window of libc's text that install patched; libc is never unloaded.
        w == 0 || unsafe { (w as *const u64).read_unaligned() } == b.load(Relaxed)
    })
}

/// What a function's bytes say when glibc's site is not in them: another library's jump where
/// the site's `mov` was (a `jmp rel32` right before the `syscall`, or one at the entry).
fn patched_by_another(code: &[u8]) -> bool {
    let jmp_before_syscall = code
        .windows(SITE_LEN)
        .any(|w| w[0] == 0xe9 && w[5] == 0x0f && w[6] == 0x05);
    let jmp_at_entry = matches!(code, [0xe9, ..] | [0xff, 0x25, ..] | [0x49, 0xbb, ..]);
    jmp_before_syscall || jmp_at_entry
}

const PAGE: usize = 4096;
/// `<dlfcn.h>`: `dladdr1` returns the `ElfW(Sym)` of the symbol (not in the libc crate).
const RTLD_DL_SYMENT: libc::c_int = 1;
const STUB: usize = 0x50;
const SITE_LEN: usize = 7;

/// The stub's machine code (see the module doc); `hook` at 0x40, return address at 0x48.
const STUB_CODE: [u8; 0x3a] = [
    0x48, 0x8d, 0x64, 0x24, 0x80, // lea -0x80(%rsp),%rsp   (skip the red zone)
    0x55, // push %rbp
    0x48, 0x89, 0xe5, // mov %rsp,%rbp
    0x48, 0x83, 0xe4, 0xf0, // and $-16,%rsp
    0x57, 0x56, 0x52, // push %rdi; push %rsi; push %rdx
    0x41, 0x50, 0x41, 0x51, 0x41,
    0x52, // push %r8; push %r9; push %r10 (rsp stays 16-aligned)
    0x4c, 0x89, 0xd1, // mov %r10,%rcx  (4th syscall argument -> 4th C argument)
    0xff, 0x15, 0x21, 0x00, 0x00, 0x00, // call *0x21(%rip)  -> [0x40]
    0x41, 0x5a, 0x41, 0x59, 0x41, 0x58, // pop %r10; pop %r9; pop %r8
    0x5a, 0x5e, 0x5f, // pop %rdx; pop %rsi; pop %rdi
    0x48, 0x89, 0xec, // mov %rbp,%rsp
    0x5d, // pop %rbp
    0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00, // lea 0x80(%rsp),%rsp
    0xff, 0x25, 0x0e, 0x00, 0x00, 0x00, // jmp *0x0e(%rip)  -> [0x48]
];

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Address and size of `name` in libc.so.6 (libc's own definition, not an interposer's).
fn lookup(libc_handle: *mut libc::c_void, name: &CStr) -> Result<(usize, usize), String> {
    // SAFETY: `libc_handle` is a live handle from dlopen; `name` is NUL-terminated.
    let addr = unsafe { libc::dlsym(libc_handle, name.as_ptr()) };
    if addr.is_null() {
        return Err(format!("{name:?} not found in libc.so.6"));
    }
    // SAFETY: plain-data structs filled by dladdr1; `sym` receives a pointer into the dynamic
    // symbol table of the loaded object, valid while it stays loaded (libc never unloads).
    let (info, sym) = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let mut sym: *const libc::Elf64_Sym = std::ptr::null();
        let ok = libc::dladdr1(
            addr,
            &mut info,
            (&mut sym as *mut *const libc::Elf64_Sym).cast(),
            RTLD_DL_SYMENT,
        );
        if ok == 0 || sym.is_null() {
            return Err(format!("dladdr1 found no symbol for {name:?}"));
        }
        (info, *sym)
    };
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic linker.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    if !file.contains("libc.so") {
        return Err(format!("{name:?} resolves into {file}, not libc.so.6"));
    }
    Ok((addr as usize, sym.st_size as usize))
}

/// The sites of syscall `nr` in `[start, start + len)`.
///
/// # Safety
/// `[start, start + len)` must be readable (a function's bytes in a loaded text segment).
unsafe fn find_sites(start: usize, len: usize, nr: u32) -> Vec<usize> {
    // SAFETY: readable per the caller's contract.
    let code = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
    let n = nr.to_le_bytes();
    let pat = [0xb8, n[0], n[1], n[2], n[3], 0x0f, 0x05];
    code.windows(SITE_LEN)
        .enumerate()
        .filter(|(_, w)| *w == pat)
        .map(|(i, _)| start + i)
        .collect()
}

/// The 8-byte window to write for a site at `site`: contains the 5 bytes, within a cache line.
fn window(site: usize) -> Option<usize> {
    (site.saturating_sub(3)..=site)
        .rev()
        .find(|w| w / 64 == (w + 7) / 64 && *w <= site && site + 5 <= w + 8)
}

/// Maps one stub page within ±2 GiB of every site (libc's text is a few MiB).
fn stub_page(lo: usize, hi: usize) -> Result<usize, String> {
    const STEP: usize = 1 << 20;
    let base = lo & !(STEP - 1);
    for k in 1..=512usize {
        for cand in [
            base.checked_sub(k * STEP),
            base.checked_add(k * STEP + STEP),
        ] {
            let Some(cand) = cand else { continue };
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the result is
            // checked and unmapped again if it is not where we asked or too far.
            let p = unsafe {
                libc::mmap(
                    cand as *mut libc::c_void,
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                continue;
            }
            let p = p as usize;
            let near =
                |a: usize| (p as i64 - a as i64).unsigned_abs() < (1u64 << 31) - 2 * PAGE as u64;
            if near(lo) && near(hi) {
                return Ok(p);
            }
            // SAFETY: the page we just mapped, unused.
            unsafe { libc::munmap(p as *mut libc::c_void, PAGE) };
        }
    }
    Err("no free page within ±2 GiB of libc's text for the hook stubs".into())
}

/// Sets the protection of the pages holding `[addr, addr + len)`.
fn protect(addr: usize, len: usize, prot: libc::c_int) -> Result<(), String> {
    let start = addr & !(PAGE - 1);
    let end = (addr + len + PAGE - 1) & !(PAGE - 1);
    // SAFETY: changes the protection of pages of libc's text (or our stub page); the caller
    // restores read+execute right after writing. A raw syscall: libc's `mprotect` is hooked
    // once its site is patched, and its hook watches for writes to our sites (`calls`).
    let r = unsafe {
        super::calls::syscall6(
            libc::SYS_mprotect as u64,
            [start as u64, (end - start) as u64, prot as u64, 0, 0, 0],
        )
    };
    if r != 0 {
        return Err(format!(
            "mprotect({start:#x}, {}): {}",
            end - start,
            std::io::Error::from_raw_os_error(-r as i32)
        ));
    }
    Ok(())
}

/// Writes `val` to `[w, w + 8)` with one locked `xchg`.
///
/// # Safety
/// `w..w + 8` is writable, lies within one cache line, and every byte of `val` that differs
/// from memory belongs to one whole instruction no thread can be inside of.
unsafe fn store8(w: usize, val: u64) {
    // SAFETY: per the contract; xchg with memory is implicitly locked (atomic, full barrier).
    unsafe {
        std::arch::asm!(
            "xchg qword ptr [{p}], {v}",
            p = in(reg) w,
            v = inout(reg) val => _,
            options(nostack),
        );
    }
}

/// Makes every thread of the process execute a core-serializing instruction.
fn sync_cores() -> Result<(), String> {
    const REGISTER_SYNC_CORE: libc::c_long = 1 << 6;
    const SYNC_CORE: libc::c_long = 1 << 5;
    // SAFETY: membarrier takes integers only.
    unsafe {
        if libc::syscall(libc::SYS_membarrier, REGISTER_SYNC_CORE, 0, 0) != 0 {
            return Err(os_err("membarrier(REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)"));
        }
        if libc::syscall(libc::SYS_membarrier, SYNC_CORE, 0, 0) != 0 {
            return Err(os_err("membarrier(PRIVATE_EXPEDITED_SYNC_CORE)"));
        }
    }
    Ok(())
}

/// Finds every site of `targets`, maps the stubs, and patches the sites. All or nothing: a
/// refusal found before the first write leaves libc untouched.
pub(crate) fn install(targets: &[Target]) -> Result<Patched, String> {
    // SAFETY: RTLD_NOLOAD only returns a handle when libc.so.6 is already loaded.
    let h = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return Err("libc.so.6 is not loaded (a static binary?): nothing to patch".into());
    }
    let mut notes = Vec::new();
    let mut sites: Vec<(&'static str, usize, usize)> = Vec::new(); // (name, site, hook)
    for t in targets {
        let name = t.name.to_str().unwrap_or("?");
        let (addr, size) = lookup(h, t.name)?;
        // SAFETY: `[addr, addr + size)` is the function's code in libc's loaded text.
        let found = unsafe { find_sites(addr, size, t.nr) };
        if found.is_empty() {
            let msg = format!(
                "{name} at {addr:#x} ({size} bytes): no `mov ${}, %eax; syscall` in it",
                t.nr
            );
            // SAFETY: as for `find_sites`.
            let code = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
            if t.required && patched_by_another(code) {
                return Err(format!(
                    "another library patched libc first: {msg}, a jump where glibc has it (UCX's \
                     memory hooks do this when libucs loads: start UCX with UCX_MEM_EVENTS=n, or \
                     use the userfaultfd backend, UMN_BACKEND=auto or uffd)"
                ));
            }
            if t.required {
                return Err(format!("unknown glibc layout: {msg}"));
            }
            notes.push(format!("not hooked: {msg}"));
        }
        for s in found {
            if window(s).is_none() {
                let msg = format!("{name}: the site at {s:#x} straddles a cache line");
                if t.required {
                    return Err(msg);
                }
                notes.push(format!("not hooked: {msg}"));
                continue;
            }
            sites.push((name, s, t.hook));
        }
    }
    // SAFETY: the handle from dlopen above; libc stays loaded (this only drops our reference).
    unsafe { libc::dlclose(h) };
    if sites.len() * STUB > PAGE {
        return Err(format!("{} sites do not fit one stub page", sites.len()));
    }
    let lo = sites.iter().map(|s| s.1).min().unwrap_or(0);
    let hi = sites.iter().map(|s| s.1).max().unwrap_or(0);
    let page = stub_page(lo, hi)?;
    for (i, &(_, site, hook)) in sites.iter().enumerate() {
        let stub = page + i * STUB;
        // SAFETY: `stub..stub + STUB` lies in the page we mapped read-write above.
        unsafe {
            let p = stub as *mut u8;
            std::ptr::copy_nonoverlapping(STUB_CODE.as_ptr(), p, STUB_CODE.len());
            std::ptr::write_bytes(p.add(STUB_CODE.len()), 0xcc, 0x40 - STUB_CODE.len());
            (p.add(0x40) as *mut u64).write_unaligned(hook as u64);
            (p.add(0x48) as *mut u64).write_unaligned((site + SITE_LEN) as u64);
        }
    }
    protect(page, PAGE, libc::PROT_READ | libc::PROT_EXEC)?;
    for (i, &(_, site, _)) in sites.iter().enumerate() {
        let stub = page + i * STUB;
        let w = window(site).expect("checked above");
        let rel = (stub as i64 - (site as i64 + 5)) as i32;
        // SAFETY: libc's text is readable.
        let old = unsafe { (w as *const u64).read_unaligned() };
        let mut bytes = old.to_le_bytes();
        let at = site - w;
        bytes[at] = 0xe9;
        bytes[at + 1..at + 5].copy_from_slice(&rel.to_le_bytes());
        protect(w, 8, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC)?;
        // SAFETY: the window is writable now, within one cache line (`window`), and the bytes
        // that change are exactly the 5-byte `mov` checked by `find_sites` (one instruction).
        unsafe { store8(w, u64::from_le_bytes(bytes)) };
        protect(w, 8, libc::PROT_READ | libc::PROT_EXEC)?;
        if i < KEPT {
            KEPT_BYTES[i].store(
                u64::from_le_bytes(bytes),
                std::sync::atomic::Ordering::Relaxed,
            );
            KEPT_AT[i].store(w, std::sync::atomic::Ordering::Release);
        }
    }
    if let Err(e) = sync_cores() {
        notes.push(format!(
            "{e}: threads may run the old instruction until their next context switch"
        ));
    }
    Ok(Patched {
        sites: sites.iter().map(|&(n, s, _)| (n, s)).collect(),
        notes,
    })
}
