//! The hooks backend against the real kernel: every change kind hooks can see is invalidated
//! before the call returns, through libc and through glibc's internals (free, realloc,
//! malloc_trim, thread exit, sbrk), in a library `dlopen`ed later, while threads run through the
//! patch, from a signal handler, and across fork; what hooks can not see (raw syscalls, io_uring)
//! is shown as missed, never hidden.
//!
//! Tests that need a process of their own (one that has not installed the hooks yet, or that
//! moves the program break, or tunes malloc) run this binary again with `UMN_HOOKS_CHILD` naming
//! the test.
mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ummunotify::{Backend, Cookie, Error, Notifier, Unsupported};
use ummunotify_testkit::require::skip_or_fail;

/// `mallopt` parameters.
const M_TRIM_THRESHOLD: libc::c_int = -1;
const M_MMAP_THRESHOLD: libc::c_int = -3;
const MADV_GUARD_INSTALL: libc::c_int = 102;
const MADV_GUARD_REMOVE: libc::c_int = 103;
const MADV_DONTNEED_LOCKED: libc::c_int = 24;

/// Set in a fresh process to run a test on the hybrid backend instead (hooks in front of
/// userfaultfd: the same hook paths, plus removing the userfaultfd watch in them).
const AS_HYBRID: &str = "UMN_HOOKS_TEST_AS_HYBRID";

fn hooks() -> Notifier {
    let b = if std::env::var_os(AS_HYBRID).is_some() {
        Backend::Hybrid
    } else {
        Backend::Hooks
    };
    let n = Notifier::with_backend(b).expect("hooks backend");
    assert_eq!(n.backend(), b);
    n
}

// --- a fresh process per test where needed -------------------------------------------------

const ROLE: &str = "UMN_HOOKS_CHILD";

fn role_is(test: &str) -> bool {
    std::env::var(ROLE).is_ok_and(|r| r == test)
}

/// Runs `test` of this binary in a fresh process (with `envs`), failing on a hang.
fn in_fresh_process(test: &str, envs: &[(&str, &str)]) -> String {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, test)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{test}: child hung (deadlock?); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && so.contains("HOOKS-CHILD-OK"),
        "{test}: child failed ({:?}):\n{so}\n{se}",
        out.status
    );
    eprintln!("{se}");
    so
}

fn child_ok() {
    println!("HOOKS-CHILD-OK");
}

// --- what libc calls change, seen before they return ------------------------------------------

#[test]
fn libc_munmap_is_seen_before_it_returns() {
    let n = hooks();
    let p = page();
    let a = map(3 * p);
    let r = n.register(a + p..a + 2 * p, Cookie(1)).unwrap();
    let g = n.generation().unwrap();
    assert!(n.is_valid(r));
    unmap(a + 2 * p, p); // the neighbour: nothing registered there
    unmap(a, p);
    assert!(n.is_valid(r), "an unmap next to the region invalidated it");
    assert!(
        n.unchanged_since(g),
        "an unregistered munmap moved the counter"
    );
    unmap(a + p, p);
    assert!(!n.is_valid(r));
    assert!(!n.unchanged_since(g));
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].cookie, ev[0].start, ev[0].end),
        (Cookie(1), a + p, a + 2 * p)
    );
}

#[test]
fn a_partial_munmap_reports_the_clipped_part() {
    let n = hooks();
    let p = page();
    let a = map(12 * p);
    let r = n.register(a + 2 * p..a + 6 * p, Cookie(1)).unwrap();
    unmap(a + 4 * p, 6 * p);
    assert!(!n.is_valid(r));
    let ev = n.events().unwrap();
    assert_eq!((ev[0].start, ev[0].end), (a + 4 * p, a + 6 * p));
    unmap(a, 4 * p);
    unmap(a + 10 * p, 2 * p);
}

#[test]
fn madvise_that_drops_pages_is_seen_and_other_advice_is_not() {
    let n = hooks();
    let p = page();
    let a = map(8 * p);
    let mut regions = Vec::new();
    for (i, advice) in [libc::MADV_DONTNEED, libc::MADV_FREE, MADV_DONTNEED_LOCKED]
        .into_iter()
        .enumerate()
    {
        let at = a + i * p;
        let r = n.register(at..at + p, Cookie(i as u64)).unwrap();
        madvise(at, p, advice);
        assert!(
            !n.is_valid(r),
            "madvise advice {advice} not seen before it returned"
        );
        regions.push(r);
    }
    let at = a + 4 * p;
    let r = n.register(at..at + p, Cookie(10)).unwrap();
    madvise(at, p, libc::MADV_WILLNEED);
    madvise(at, p, libc::MADV_NORMAL);
    assert!(
        n.is_valid(r),
        "advice that keeps the pages invalidated the region"
    );
    // MADV_GUARD_INSTALL (Linux 6.13): userfaultfd never reports it; hooks do.
    let at = a + 5 * p;
    let r = n.register(at..at + p, Cookie(11)).unwrap();
    // SAFETY: our own mapping.
    if unsafe { libc::madvise(at as *mut libc::c_void, p, MADV_GUARD_INSTALL) } != 0 {
        skip_or_fail(
            "madvise_that_drops_pages_is_seen_and_other_advice_is_not",
            &format!("MADV_GUARD_INSTALL ({})", std::io::Error::last_os_error()),
        );
    } else {
        assert!(!n.is_valid(r), "MADV_GUARD_INSTALL not seen");
        madvise(at, p, MADV_GUARD_REMOVE);
    }
    unmap(a, 8 * p);
}

#[test]
fn madv_remove_on_shared_memory_is_seen() {
    let n = hooks();
    let p = page();
    // SAFETY: memfd_create with a literal name; the fd is closed below.
    let fd = unsafe { libc::memfd_create(c"umn-hooks".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: our own fd.
    assert_eq!(unsafe { libc::ftruncate(fd, 2 * p as i64) }, 0);
    // SAFETY: a new shared mapping of our memfd.
    let a = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * p,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    } as usize;
    assert_ne!(a, libc::MAP_FAILED as usize);
    let r = n.register(a..a + 2 * p, Cookie(1)).unwrap();
    madvise(a, p, libc::MADV_REMOVE);
    assert!(!n.is_valid(r));
    unmap(a, 2 * p);
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
}

#[test]
fn mmap_fixed_over_is_seen_and_plain_mmap_is_not() {
    let n = hooks();
    let p = page();
    let a = map(2 * p);
    let r = n.register(a..a + p, Cookie(1)).unwrap();
    let g = n.generation().unwrap();
    let other = map(p); // no MAP_FIXED: replaces nothing
    assert!(n.is_valid(r) && n.unchanged_since(g));
    replace(a, p);
    assert!(!n.is_valid(r), "mmap(MAP_FIXED) over the region not seen");
    unmap(a, 2 * p);
    unmap(other, p);
}

#[test]
fn mremap_move_shrink_and_dontunmap_are_seen() {
    let n = hooks();
    let p = page();
    // Move to a destination of our own (MAYMOVE | FIXED).
    let a = map(2 * p);
    let dest = map_untouched(2 * p);
    let r = n.register(a..a + 2 * p, Cookie(1)).unwrap();
    let rd = n.register(dest..dest + p, Cookie(2)).unwrap();
    // SAFETY: moves our own mapping onto our own reserved destination.
    let m = unsafe {
        libc::mremap(
            a as *mut libc::c_void,
            2 * p,
            2 * p,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dest as *mut libc::c_void,
        )
    };
    assert_eq!(m as usize, dest);
    assert!(!n.is_valid(r), "the moved range is still valid");
    assert!(!n.is_valid(rd), "the replaced destination is still valid");
    unmap(dest, 2 * p);
    // Shrink in place: the tail goes.
    let a = map(8 * p);
    let head = n.register(a..a + 4 * p, Cookie(3)).unwrap();
    let tail = n.register(a + 4 * p..a + 8 * p, Cookie(4)).unwrap();
    // SAFETY: shrinks our own mapping in place.
    let m = unsafe { libc::mremap(a as *mut libc::c_void, 8 * p, 4 * p, 0) };
    assert_eq!(m as usize, a);
    assert!(!n.is_valid(tail), "the unmapped tail is still valid");
    assert!(n.is_valid(head), "the kept head was invalidated");
    unmap(a, 4 * p);
    // MREMAP_DONTUNMAP: the pages move, the old range stays mapped, empty.
    let a = map(p);
    let r = n.register(a..a + p, Cookie(5)).unwrap();
    // SAFETY: moves our own mapping's pages to a place the kernel chooses.
    let m = unsafe {
        libc::mremap(
            a as *mut libc::c_void,
            p,
            p,
            libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if m == libc::MAP_FAILED {
        skip_or_fail(
            "mremap_move_shrink_and_dontunmap_are_seen",
            &format!("MREMAP_DONTUNMAP ({})", std::io::Error::last_os_error()),
        );
    } else {
        assert!(!n.is_valid(r), "MREMAP_DONTUNMAP not seen");
        unmap(m as usize, p);
    }
    unmap(a, p);
}

#[test]
fn shmdt_is_seen() {
    let n = hooks();
    let p = page();
    // SAFETY: a private SysV segment, removed below.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 3 * p, libc::IPC_CREAT | 0o600) };
    if id < 0 {
        skip_or_fail(
            "shmdt_is_seen",
            &format!("SysV shm ({})", std::io::Error::last_os_error()),
        );
        return;
    }
    // SAFETY: attaches the segment at an address the kernel chooses.
    let a = unsafe { libc::shmat(id, std::ptr::null(), 0) } as usize;
    // SAFETY: marks the segment for removal once detached.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    assert_ne!(a, usize::MAX, "shmat: {}", std::io::Error::last_os_error());
    let r = n.register(a + p..a + 3 * p, Cookie(1)).unwrap();
    // SAFETY: detaches our own segment.
    assert_eq!(unsafe { libc::shmdt(a as *const libc::c_void) }, 0);
    assert!(!n.is_valid(r), "shmdt not seen before it returned");
}

// --- glibc's internal calls ----------------------------------------------------------------

#[test]
fn free_and_realloc_of_mmapped_blocks_are_seen() {
    if !role_is("free_and_realloc_of_mmapped_blocks_are_seen") {
        in_fresh_process("free_and_realloc_of_mmapped_blocks_are_seen", &[]);
        return;
    }
    let n = hooks();
    let p = page();
    // SAFETY: mallopt only tunes the allocator (fixed threshold: every 1 MiB block is mmapped).
    unsafe { libc::mallopt(M_MMAP_THRESHOLD, 128 << 10) };
    // SAFETY: plain allocation, freed once below (by free(), glibc's __munmap).
    let block = unsafe { libc::malloc(1 << 20) } as usize;
    let inner = (block + p).next_multiple_of(p);
    let r = n.register(inner..inner + p, Cookie(1)).unwrap();
    // SAFETY: the block from malloc, freed once.
    unsafe { libc::free(block as *mut libc::c_void) };
    assert!(!n.is_valid(r), "free() of an mmapped block not seen");
    // realloc growing an mmapped block: glibc's __mremap(MREMAP_MAYMOVE).
    // SAFETY: plain allocation; realloc'd once, freed once.
    let block = unsafe { libc::malloc(1 << 20) } as usize;
    let inner = (block + p).next_multiple_of(p);
    let r = n.register(inner..inner + p, Cookie(2)).unwrap();
    // SAFETY: the block from malloc above.
    let grown = unsafe { libc::realloc(block as *mut libc::c_void, 16 << 20) };
    assert!(!grown.is_null());
    assert!(
        !n.is_valid(r),
        "realloc (mremap) of an mmapped block not seen"
    );
    // SAFETY: the block realloc returned.
    unsafe { libc::free(grown) };
    child_ok();
}

#[test]
fn malloc_trim_is_seen() {
    if !role_is("malloc_trim_is_seen") {
        in_fresh_process("malloc_trim_is_seen", &[]);
        return;
    }
    let n = hooks();
    let p = page();
    // SAFETY: allocator tuning: 1 MiB blocks come from the heap, and free() alone trims nothing.
    unsafe {
        libc::mallopt(M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(M_TRIM_THRESHOLD, i32::MAX);
    }
    // SAFETY: plain allocations; `a` is freed below, `guard` (too big for tcache and fast
    // bins, so it comes from the top chunk right after `a`) keeps it from merging into the top.
    let a = unsafe { libc::malloc(1 << 20) } as usize;
    let guard = unsafe { libc::malloc(256 << 10) };
    assert!(
        (guard as usize) > a && (guard as usize) < a + (1 << 20) + 64,
        "the guard block is not right after the freed one: {a:#x} {guard:?}"
    );
    // SAFETY: `a` is ours, 1 MiB.
    unsafe { std::ptr::write_bytes(a as *mut u8, 1, 1 << 20) };
    let inner = (a + 4 * p).next_multiple_of(p);
    // Registered before the free: what `register` allocates must not be carved out of the freed
    // chunk (nothing allocates between the free and the trim).
    let r = n.register(inner..inner + p, Cookie(1)).unwrap();
    // SAFETY: freed once; it stays a free chunk in the heap, still mapped.
    unsafe { libc::free(a as *mut libc::c_void) };
    assert!(
        n.is_valid(r),
        "free() of a heap chunk invalidated its inner page"
    );
    // malloc_trim gives the free chunk's inner pages back with __madvise(MADV_DONTNEED).
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    assert!(!n.is_valid(r), "malloc_trim not seen");
    // SAFETY: the guard block from malloc.
    unsafe { libc::free(guard) };
    child_ok();
}

#[test]
fn sbrk_and_brk_shrinks_are_seen() {
    if !role_is("sbrk_and_brk_shrinks_are_seen") {
        in_fresh_process("sbrk_and_brk_shrinks_are_seen", &[]);
        return;
    }
    let n = hooks();
    let p = page();
    // Warm up what `register` allocates, so the heap does not grow between our sbrk calls.
    let w = map(p);
    n.register(w..w + p, Cookie(99)).unwrap();
    n.unregister(Cookie(99)).unwrap();
    // SAFETY: this process does nothing else while it moves the break and puts it back.
    unsafe {
        let original = libc::sbrk(0) as usize;
        let start = original.next_multiple_of(p);
        assert_ne!(libc::sbrk((start - original + 4 * p) as isize) as isize, -1);
        std::ptr::write_bytes(start as *mut u8, 7, 4 * p);
        let r = n.register(start + 2 * p..start + 4 * p, Cookie(1)).unwrap();
        let low = n.register(start..start + p, Cookie(2)).unwrap();
        assert_ne!(libc::sbrk(-(2 * p as isize)) as isize, -1);
        assert!(!n.is_valid(r), "sbrk shrink not seen");
        assert!(n.is_valid(low), "the kept part was invalidated");
        // brk() directly, and glibc's __curbrk stays right (sbrk(0) reads it).
        assert_eq!(libc::brk(start as *mut libc::c_void), 0);
        assert!(!n.is_valid(low), "brk shrink not seen");
        assert_eq!(libc::sbrk(0) as usize, start, "__curbrk not kept right");
        assert_eq!(libc::brk(original as *mut libc::c_void), 0);
        assert_eq!(libc::sbrk(0) as usize, original);
    }
    child_ok();
}

#[test]
fn a_thread_exit_releasing_its_stack_is_seen() {
    let n = hooks();
    let p = page();
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            // SAFETY: plain-data attr filled by glibc for the calling thread, destroyed below.
            let low = unsafe {
                let mut attr: libc::pthread_attr_t = std::mem::zeroed();
                assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
                let mut addr = std::ptr::null_mut();
                let mut size = 0;
                assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
                libc::pthread_attr_destroy(&mut attr);
                addr as usize
            };
            tx.send(low).unwrap();
            go_rx.recv().unwrap();
        })
        .unwrap();
    let low = rx.recv().unwrap();
    // The lowest stack page (far below the thread's frames): glibc's exiting thread gives it back
    // with __madvise(MADV_DONTNEED) (or the stack cache unmaps it).
    let r = n.register(low..low + p, Cookie(1)).unwrap();
    assert!(n.is_valid(r));
    go_tx.send(()).unwrap();
    t.join().unwrap();
    assert!(!n.is_valid(r), "the exited thread's stack release not seen");
}

#[test]
fn a_library_dlopened_later_is_hooked() {
    let n = hooks();
    let dir = std::env::temp_dir().join(format!("umn-hooks-dl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("late.c");
    let so = dir.join("liblate.so");
    std::fs::write(
        &src,
        "#include <stddef.h>\n#include <sys/mman.h>\n\
         int late_munmap(void *p, size_t n) { return munmap(p, n); }\n\
         int late_madvise(void *p, size_t n) { return madvise(p, n, MADV_DONTNEED); }\n",
    )
    .unwrap();
    ummunotify_testkit::cprog::gcc(&src, &so, ["-shared", "-fPIC"]);
    let path = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loads the library we just built; its symbols are looked up by name below.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen failed");
    type F = unsafe extern "C" fn(*mut libc::c_void, usize) -> libc::c_int;
    // SAFETY: the symbols are the functions defined above with this signature.
    let (unmap_fn, madv_fn): (F, F) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, F>(libc::dlsym(h, c"late_munmap".as_ptr())),
            std::mem::transmute::<*mut libc::c_void, F>(libc::dlsym(h, c"late_madvise".as_ptr())),
        )
    };
    let p = page();
    let a = map(2 * p);
    let r1 = n.register(a..a + p, Cookie(1)).unwrap();
    let r2 = n.register(a + p..a + 2 * p, Cookie(2)).unwrap();
    // SAFETY: our own mapping.
    assert_eq!(unsafe { madv_fn((a + p) as *mut libc::c_void, p) }, 0);
    assert!(!n.is_valid(r2), "madvise from a dlopened library not seen");
    // SAFETY: our own mapping.
    assert_eq!(unsafe { unmap_fn(a as *mut libc::c_void, 2 * p) }, 0);
    assert!(!n.is_valid(r1), "munmap from a dlopened library not seen");
    // SAFETY: the handle from dlopen; nothing of the library is used any more.
    unsafe { libc::dlclose(h) };
    let _ = std::fs::remove_dir_all(&dir);
}

// --- hazards of the patching itself ----------------------------------------------------------

#[test]
fn threads_unmapping_in_a_loop_while_the_patch_goes_in() {
    if !role_is("threads_unmapping_in_a_loop_while_the_patch_goes_in") {
        in_fresh_process("threads_unmapping_in_a_loop_while_the_patch_goes_in", &[]);
        return;
    }
    assert_eq!(
        Notifier::hooked_calls(),
        0,
        "hooks already installed in a fresh process"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let iters = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (stop, iters) = (stop.clone(), iters.clone());
            std::thread::spawn(move || {
                let p = page();
                while !stop.load(SeqCst) {
                    // Straight libc calls, back to back, through every patched function.
                    let a = map(2 * p);
                    match w {
                        0 => madvise(a, p, libc::MADV_DONTNEED),
                        1 => replace(a, p),
                        _ => {}
                    }
                    unmap(a, 2 * p);
                    iters.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    while iters.load(SeqCst) < 3000 {
        std::thread::yield_now();
    }
    let n = hooks(); // installs the patch with the workers running through it
    let at_install = iters.load(SeqCst);
    let calls_at_install = Notifier::hooked_calls();
    while iters.load(SeqCst) < at_install + 3000 {
        std::thread::yield_now();
    }
    assert!(
        Notifier::hooked_calls() > calls_at_install + 3000,
        "the workers' calls do not go through the hooks"
    );
    let p = page();
    let a = map(p);
    let r = n.register(a..a + p, Cookie(1)).unwrap();
    unmap(a, p);
    assert!(!n.is_valid(r));
    stop.store(true, SeqCst);
    for w in workers {
        w.join().expect("a worker crashed");
    }
    eprintln!(
        "workers ran {} iterations, {} of them after the patch went in",
        iters.load(SeqCst),
        iters.load(SeqCst) - at_install
    );
    child_ok();
}

static HANDLER_PAGE: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn madvise_in_handler(_: libc::c_int) {
    let a = HANDLER_PAGE.load(SeqCst);
    // SAFETY: a page of ours; madvise is async-signal-safe, and the hook it runs must be too.
    unsafe { libc::madvise(a as *mut libc::c_void, page(), libc::MADV_DONTNEED) };
    HANDLED.fetch_add(1, SeqCst);
}

#[test]
fn a_hook_entered_from_a_signal_handler_does_not_deadlock() {
    if !role_is("a_hook_entered_from_a_signal_handler_does_not_deadlock") {
        in_fresh_process(
            "a_hook_entered_from_a_signal_handler_does_not_deadlock",
            &[],
        );
        return;
    }
    let n = Arc::new(hooks());
    let p = page();
    let h = map(p);
    HANDLER_PAGE.store(h, SeqCst);
    let rh = n.register(h..h + p, Cookie(1 << 40)).unwrap();
    // SAFETY: installs a handler that only calls madvise and bumps an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = madvise_in_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let worker = {
        let (n, stop) = (n.clone(), stop.clone());
        std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tid_tx.send(unsafe { libc::pthread_self() }).unwrap();
            let a = map(p);
            let mut i = 0u64;
            // Registered heap memory too: free() and malloc run hooks with arena locks held.
            let mut heap: Vec<Vec<u8>> = Vec::new();
            while !stop.load(SeqCst) {
                i += 1;
                n.register(a..a + p, Cookie(i)).unwrap(); // index lock, signals blocked
                replace(a, p); // hook slow path: index lock from inside mmap
                n.unregister(Cookie(i)).unwrap();
                heap.push(vec![1u8; 256 << 10]);
                if heap.len() > 8 {
                    heap.clear(); // free() -> __munmap through the hook
                }
            }
            unmap(a, p);
            i
        })
    };
    let tid = tid_rx.recv().unwrap();
    for _ in 0..3000 {
        // SAFETY: the worker thread is alive until `stop` is set below.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_micros(100));
    }
    stop.store(true, SeqCst);
    let rounds = worker.join().expect("worker crashed");
    let handled = HANDLED.load(SeqCst);
    eprintln!("worker rounds: {rounds}, handler madvises: {handled}");
    assert!(handled > 0, "the handler never ran");
    assert!(rounds > 0);
    assert!(!n.is_valid(rh), "the handler's madvise was not seen");
    child_ok();
}

// --- fork, and choosing the backend ------------------------------------------------------------

#[test]
fn a_forked_child_never_trusts_the_parents_registrations() {
    let n = hooks();
    let p = page();
    let a = map(2 * p);
    let r = n.register(a..a + p, Cookie(1)).unwrap();
    let code = in_child(|| {
        if n.is_valid(r) {
            return 1;
        }
        if !matches!(n.register(a + p..a + 2 * p, Cookie(2)), Err(Error::Forked)) {
            return 2;
        }
        // The child's own unmaps run the hooks; they must neither hang nor touch the parent.
        unmap(a, 2 * p);
        let m = Notifier::with_backend(Backend::Hooks).expect("a new notifier in the child");
        let b = map(p);
        let rb = m.register(b..b + p, Cookie(3)).unwrap();
        unmap(b, p);
        if m.is_valid(rb) {
            return 3;
        }
        0
    });
    assert_eq!(code, 0, "child failed at step {code}");
    assert!(
        n.is_valid(r),
        "the child's munmap invalidated the parent's region"
    );
    unmap(a, 2 * p);
    assert!(!n.is_valid(r));
}

#[test]
fn umn_backend_selects_the_backend_for_new() {
    if role_is("umn_backend_selects_the_backend_for_new") {
        match std::env::var("UMN_BACKEND").as_deref() {
            Ok("hooks") => {
                let n = Notifier::new().unwrap();
                assert_eq!(n.backend(), Backend::Hooks, "{}", n.backend_reason());
                assert!(n.backend_reason().starts_with("asked for hooks"));
            }
            Ok("bogus") => match Notifier::new() {
                Err(Error::Unsupported(Unsupported::UnknownBackend { value })) => {
                    assert_eq!(value, "bogus")
                }
                other => panic!("UMN_BACKEND=bogus: {other:?}"),
            },
            other => panic!("unexpected UMN_BACKEND {other:?}"),
        }
        child_ok();
        return;
    }
    for v in ["hooks", "bogus"] {
        in_fresh_process(
            "umn_backend_selects_the_backend_for_new",
            &[("UMN_BACKEND", v)],
        );
    }
}

// --- what hooks can not see: shown as missed ---------------------------------------------------

/// In a process of its own: once in CI (1 of 6 runs, under load) the io_uring page read
/// invalid here, and other tests of this binary map, unmap and fork concurrently in the same
/// process, where a libc munmap of a reused address would invalidate it legitimately. Not root
/// caused; alone, 60 of 60 runs and 30 of 30 runs of the whole binary passed.
#[test]
fn raw_syscalls_and_io_uring_are_missed_by_hooks() {
    const NAME: &str = "raw_syscalls_and_io_uring_are_missed_by_hooks";
    if !role_is(NAME) {
        let out = in_fresh_process(NAME, &[]);
        eprintln!("{out}");
        return;
    }
    raw_syscalls_and_io_uring_missed();
    child_ok();
}

fn raw_syscalls_and_io_uring_missed() {
    let n = hooks();
    let p = page();
    let a = map(2 * p);
    let r = n.register(a..a + p, Cookie(1)).unwrap();
    // SAFETY: unmaps our own page, bypassing libc.
    assert_eq!(unsafe { libc::syscall(libc::SYS_munmap, a, p) }, 0);
    let raw_missed = n.is_valid(r);
    eprintln!("hooks backend, raw syscall(SYS_munmap): missed = {raw_missed} (expected: missed)");
    assert!(
        raw_missed,
        "hooks saw a raw syscall: update the docs and the coverage table"
    );
    let r2 = n.register(a + p..a + 2 * p, Cookie(2)).unwrap();
    let mut ring = match io_uring::IoUring::new(4) {
        Ok(ring) => ring,
        Err(e) => {
            skip_or_fail(
                "raw_syscalls_and_io_uring_are_missed_by_hooks",
                &format!("io_uring ({e})"),
            );
            return;
        }
    };
    let sqe =
        io_uring::opcode::Madvise::new((a + p) as *const libc::c_void, p as _, libc::MADV_DONTNEED)
            .build();
    // SAFETY: the entry refers to our own mapping, which outlives the submission.
    unsafe { ring.submission().push(&sqe).unwrap() };
    ring.submit_and_wait(1).unwrap();
    let res = ring.completion().next().unwrap().result();
    assert_eq!(res, 0, "IORING_OP_MADVISE failed: {res}");
    let uring_missed = n.is_valid(r2);
    eprintln!(
        "hooks backend, io_uring IORING_OP_MADVISE: missed = {uring_missed} (expected: missed)"
    );
    assert!(
        uring_missed,
        "hooks saw io_uring's madvise: update the docs and the coverage table"
    );
    unmap(a + p, p);
}

#[test]
fn bad_arguments_get_the_kernels_error_through_the_hooks() {
    let n = hooks();
    let p = page();
    let a = map(p);
    let r = n.register(a..a + p, Cookie(1)).unwrap();
    let errno = || std::io::Error::last_os_error().raw_os_error();
    // SAFETY: every call below is refused by the kernel (or glibc) and changes nothing.
    unsafe {
        assert_eq!(libc::munmap((a + 1) as *mut libc::c_void, p), -1);
        assert_eq!(errno(), Some(libc::EINVAL));
        assert_eq!(
            libc::madvise((a + 1) as *mut libc::c_void, p, libc::MADV_DONTNEED),
            -1
        );
        assert_eq!(errno(), Some(libc::EINVAL));
        let m = libc::mremap(a as *mut libc::c_void, p, p, 0x1000_0000);
        assert_eq!(m, libc::MAP_FAILED);
        assert_eq!(errno(), Some(libc::EINVAL));
        let m = libc::mmap(
            std::ptr::null_mut(),
            p,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            1,
        );
        assert_eq!(m, libc::MAP_FAILED);
        assert_eq!(errno(), Some(libc::EINVAL));
        assert_eq!(libc::munmap(usize::MAX as *mut libc::c_void, p), -1);
        assert_eq!(errno(), Some(libc::EINVAL));
        assert_eq!(libc::shmdt(a as *const libc::c_void), -1);
        assert_eq!(errno(), Some(libc::EINVAL));
    }
    // A refused call may still have invalidated the region (the first pass runs before the
    // kernel answers): spurious, never stale. The notifier goes on working.
    eprintln!("region valid after refused calls: {}", n.is_valid(r));
    n.events().unwrap();
    n.unregister(Cookie(1)).unwrap();
    let r = n.register(a..a + p, Cookie(2)).unwrap();
    assert!(n.is_valid(r));
    unmap(a, p);
    assert!(!n.is_valid(r));
}

static HEAP_HANDLER_PAGE: AtomicUsize = AtomicUsize::new(0);
static HEAP_HANDLED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn madvise_heap_handler(_: libc::c_int) {
    let a = HEAP_HANDLER_PAGE.load(SeqCst);
    // SAFETY: a page of ours; madvise is async-signal-safe, and the hook it runs must be too.
    unsafe { libc::madvise(a as *mut libc::c_void, page(), libc::MADV_DONTNEED) };
    HEAP_HANDLED.fetch_add(1, SeqCst);
}

fn heap_range() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[heap]"))?;
    let (range, _) = line.split_once(' ')?;
    let (s, e) = range.split_once('-')?;
    Some((
        usize::from_str_radix(s, 16).ok()?,
        usize::from_str_radix(e, 16).ok()?,
    ))
}

/// The deadlock hunt of `tests/heap.rs` under hooks, with signals: one arena for every thread
/// (so each free and trim shrinks the registered main heap, with the arena lock held, through
/// the hooks), one thread registering, unregistering and reading events on heap blocks, and a
/// signal handler that madvises a registered page, sent to the workers all along.
#[test]
fn a_registered_heap_trimmed_from_many_threads_with_signals_never_deadlocks() {
    let test = "a_registered_heap_trimmed_from_many_threads_with_signals_never_deadlocks";
    if !role_is(test) {
        in_fresh_process(test, &[]);
        return;
    }
    const M_ARENA_MAX: libc::c_int = -8;
    // SAFETY: allocator tuning before any worker exists: one arena, small trim threshold.
    unsafe {
        libc::mallopt(M_ARENA_MAX, 1);
        libc::mallopt(M_TRIM_THRESHOLD, 64 << 10);
    }
    let n = Arc::new(hooks());
    let grow: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 * 1024]).collect();
    drop(grow);
    let (hs, he) = heap_range().expect("a [heap] mapping");
    n.register(hs..he, Cookie(0)).unwrap();
    let heap = n.region(Cookie(0)).unwrap();
    let p = page();
    let h = map(p);
    HEAP_HANDLER_PAGE.store(h, SeqCst);
    n.register(h..h + p, Cookie(1)).unwrap();
    // SAFETY: installs a handler that only calls madvise and bumps an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = madvise_heap_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let (n, tx) = (n.clone(), tx.clone());
            std::thread::spawn(move || {
                // SAFETY: pthread_self has no preconditions.
                tx.send(unsafe { libc::pthread_self() }).unwrap();
                for round in 0..300u64 {
                    heap_churn_round(&n, round, t == 0);
                }
            })
        })
        .collect();
    drop(tx);
    let tids: Vec<libc::pthread_t> = (0..3).map(|_| rx.recv().unwrap()).collect();
    let signaller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(SeqCst) {
                for &t in &tids {
                    // SAFETY: the workers are joined only after this thread is (their pthread_t
                    // stays valid until then, even once they have returned).
                    unsafe { libc::pthread_kill(t, libc::SIGUSR2) };
                    sent += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            sent
        })
    };
    while !workers.iter().all(|w| w.is_finished()) {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, SeqCst);
    let sent = signaller.join().unwrap();
    let finished: Vec<bool> = workers.into_iter().map(|w| w.join().is_ok()).collect();
    assert!(finished.iter().all(|&ok| ok), "a worker panicked");
    let stats = n.stats();
    eprintln!(
        "signals sent {sent}, handled {}, hook invalidations {}, events read {}",
        HEAP_HANDLED.load(SeqCst),
        stats.messages,
        stats.events_read
    );
    assert!(HEAP_HANDLED.load(SeqCst) > 0, "the handler never ran");
    assert!(
        !n.is_valid(heap),
        "the trims of the registered heap were not seen"
    );
    child_ok();
}

/// The same hunt on the hybrid backend, where each hook also removes the userfaultfd watch.
#[test]
fn the_heap_deadlock_hunt_under_hybrid() {
    in_fresh_process(
        "a_registered_heap_trimmed_from_many_threads_with_signals_never_deadlocks",
        &[(AS_HYBRID, "1")],
    );
}

/// The fork test below on the hybrid backend.
#[test]
fn forks_under_hybrid_never_leave_a_child_hanging() {
    let test = "forks_while_other_threads_register_never_leave_a_child_hanging";
    in_fresh_process(test, &[(AS_HYBRID, "1"), (ROLE, test)]);
}

/// Fork while other threads register and unregister (the filter's lock taken and released all
/// the time) and unmap registered memory (hooks holding index locks): every child starts a
/// hooks notifier of its own, registers and sees its own munmap, and never hangs.
#[test]
fn forks_while_other_threads_register_never_leave_a_child_hanging() {
    let n = Arc::new(hooks());
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|t| {
            let (n, stop) = (n.clone(), stop.clone());
            std::thread::spawn(move || {
                let p = page();
                let mut i = 0u64;
                while !stop.load(SeqCst) {
                    i += 1;
                    let a = map(2 * p);
                    let c = Cookie((t << 32) + i);
                    n.register(a..a + 2 * p, c).unwrap();
                    unmap(a, p);
                    n.unregister(c).unwrap();
                    unmap(a + p, p);
                }
            })
        })
        .collect();
    let backend = n.backend();
    for round in 0..40 {
        let code = in_child(|| {
            let m = match Notifier::with_backend(backend) {
                Ok(m) => m,
                Err(_) => return 1,
            };
            let p = page();
            let b = map(p);
            let Ok(r) = m.register(b..b + p, Cookie(1)) else {
                return 2;
            };
            unmap(b, p);
            if m.is_valid(r) {
                return 3;
            }
            0
        });
        assert_eq!(code, 0, "child {round} failed at step {code}");
    }
    stop.store(true, SeqCst);
    for b in busy {
        b.join().unwrap();
    }
    child_ok();
}
