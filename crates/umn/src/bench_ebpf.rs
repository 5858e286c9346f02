//! The eBPF backend's rows of `umn bench`: the check, munmap and madvise of a registered vs an
//! unregistered page with the programs attached, the same calls with no programs loaded, and
//! the tax on another process's `getpid` while the programs are attached (each pair measured
//! in the same run, phases alternating: detached, attached, detached, attached).
//!
//! [`rows`] is the function `umn bench --backends` calls for its eBPF rows.
#![allow(unsafe_code)] // mmap/munmap/madvise of benchmark memory, fork of the getpid child.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use ummunotify::ebpf::Area;

use crate::bench::{batched, map, median, page, row, touch, unmap, Row};

/// Per-call medians of one phase.
#[derive(Default)]
struct Phase {
    munmap_reg: Vec<f64>,
    munmap_unreg: Vec<f64>,
    madvise_reg: Vec<f64>,
    madvise_unreg: Vec<f64>,
    getpid_other: Vec<f64>,
}

fn time(v: &mut Vec<f64>, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    v.push(t.elapsed().as_nanos() as f64);
}

/// Median ns of `getpid` in a forked child (a process the programs do not watch).
fn getpid_in_other_process(batches: usize, per: usize) -> f64 {
    let mut fds = [0; 2];
    // SAFETY: a pipe for the child's one result.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only runs syscalls, times them into a preallocated buffer and _exits.
    let mut v = vec![0f64; batches];
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        for slot in v.iter_mut() {
            let t = Instant::now();
            for _ in 0..per {
                // SAFETY: getpid has no preconditions.
                black_box(unsafe { libc::syscall(libc::SYS_getpid) });
            }
            *slot = t.elapsed().as_nanos() as f64 / per as f64;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let m = v[v.len() / 2].to_ne_bytes();
        // SAFETY: writes 8 bytes to the pipe and leaves.
        unsafe {
            libc::write(fds[1], m.as_ptr().cast(), 8);
            libc::_exit(0);
        }
    }
    let mut m = [0u8; 8];
    // SAFETY: reads the child's 8 bytes, reaps it, closes the pipe.
    unsafe {
        libc::read(fds[0], m.as_mut_ptr().cast(), 8);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    f64::from_ne_bytes(m)
}

fn phase(area: Option<&Area>, cycles: usize, p: &mut Phase) -> Result<(), ummunotify::Error> {
    let pg = page();
    for _ in 0..cycles {
        let (r, u) = (map(pg, 0), map(pg, 0));
        touch(r, pg);
        touch(u, pg);
        let t = area
            .map(|a| a.register(r as u64, (r + pg) as u64))
            .transpose()?;
        // SAFETY (below): benchmark-owned pages.
        time(&mut p.madvise_reg, || unsafe {
            libc::madvise(r as *mut _, pg, libc::MADV_DONTNEED);
        });
        time(&mut p.madvise_unreg, || unsafe {
            libc::madvise(u as *mut _, pg, libc::MADV_DONTNEED);
        });
        touch(r, pg);
        touch(u, pg);
        time(&mut p.munmap_reg, || unmap(r, pg));
        time(&mut p.munmap_unreg, || unmap(u, pg));
        if let (Some(a), Some(t)) = (area, t) {
            debug_assert!(!a.is_valid(t));
            a.unregister(t);
        }
    }
    for _ in 0..5 {
        p.getpid_other.push(getpid_in_other_process(21, 20_000));
    }
    Ok(())
}

/// The eBPF rows (needs root to load the programs here; the error says why not).
pub fn rows(cycles: usize) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let (mut detached, mut attached) = (Phase::default(), Phase::default());
    let mut check = Vec::new();
    let mut load = Vec::new();
    for _ in 0..2 {
        phase(None, cycles, &mut detached)?;
        let area = Area::open_local()?;
        phase(Some(&area), cycles, &mut attached)?;
        // The check: one load of the ticket's word and a compare, vs a plain atomic load.
        let pg = page();
        let buf = map(pg, 0);
        touch(buf, pg);
        let t = area.register(buf as u64, (buf + pg) as u64)?;
        let word = AtomicU64::new(1);
        for _ in 0..51 {
            check.push(batched(1, 20_000, || {
                black_box(area.is_valid(black_box(t)));
            }));
            load.push(batched(1, 20_000, || {
                black_box(word.load(Relaxed));
            }));
        }
        area.unregister(t);
        unmap(buf, pg);
        drop(area); // detaches the programs
    }
    // Through the notifier: is_valid on the eBPF backend (the probe's counter load, then the
    // region word) vs on userfaultfd (push: the region word alone).
    let (mut nb, mut nu) = (Vec::new(), Vec::new());
    {
        let e = ummunotify::Notifier::with_backend(ummunotify::Backend::Ebpf)?;
        let u = ummunotify::Notifier::with_backend(ummunotify::Backend::Userfaultfd)?;
        let pg = page();
        let buf = map(2 * pg, 0);
        touch(buf, 2 * pg);
        let re = e.register(buf..buf + pg, ummunotify::Cookie(1))?;
        let ru = u.register(buf + pg..buf + 2 * pg, ummunotify::Cookie(1))?;
        for _ in 0..51 {
            nb.push(batched(1, 20_000, || {
                black_box(e.is_valid(black_box(re)));
            }));
            nu.push(batched(1, 20_000, || {
                black_box(u.is_valid(black_box(ru)));
            }));
        }
        e.unregister(ummunotify::Cookie(1))?;
        u.unregister(ummunotify::Cookie(1))?;
        unmap(buf, 2 * pg);
    }
    let m = |v: &Vec<f64>| median(v.clone());
    Ok(vec![
        row(
            "ebpf_notifier_is_valid",
            median(nb),
            "uffd_notifier_is_valid",
            median(nu),
        ),
        row("ebpf_check", median(check), "atomic_load", median(load)),
        row(
            "ebpf_munmap_registered_4k",
            m(&attached.munmap_reg),
            "ebpf_munmap_unregistered_4k",
            m(&attached.munmap_unreg),
        ),
        row(
            "ebpf_munmap_unregistered_4k",
            m(&attached.munmap_unreg),
            "munmap_4k_no_programs",
            m(&detached.munmap_unreg),
        ),
        row(
            "ebpf_madvise_registered_4k",
            m(&attached.madvise_reg),
            "ebpf_madvise_unregistered_4k",
            m(&attached.madvise_unreg),
        ),
        row(
            "ebpf_madvise_unregistered_4k",
            m(&attached.madvise_unreg),
            "madvise_4k_no_programs",
            m(&detached.madvise_unreg),
        ),
        row(
            "ebpf_getpid_other_process",
            m(&attached.getpid_other),
            "getpid_other_process_no_programs",
            m(&detached.getpid_other),
        ),
    ])
}
