//! The 2009 counter-proposal as proposed (issue 43): `perf` on tracepoints *where the kernel
//! invalidates*, not on the syscalls (`Backend::Tracepoint`).
//!
//! # The tracepoints
//! `mmu_notifier:mmu_notifier_invalidate_range_start` and `..._end`, added by
//! `kernel/patches/mmu-notifier-trace/` to `include/linux/mmu_notifier.h`'s inline callers,
//! *outside* the `mm_has_notifiers()` fast path: every change to any mm's page tables is
//! announced (munmap, mremap, madvise, truncate and hole punch of a mapped file through
//! `unmap_mapping_range`, reclaim and migration through rmap, io_uring workers, another
//! process's `process_madvise`), with the mm, the range and the reason
//! (`enum mmu_notifier_event`). No stock kernel has them (Linux 6.18 neither): [`open`] refuses
//! and `umn doctor` says so.
//!
//! # Which events, and why CPU-wide
//! The invalidating task is often not ours: a truncate by another process, kswapd, a
//! compaction thread, another process's `process_madvise`. A per-task perf event (the syscall
//! backend's kind) fires only while the task it is attached to runs, so it would miss all of
//! those. So this backend opens one event per tracepoint *per CPU for every task*
//! (`pid = -1, cpu = c`) with the in-kernel filter `mm == <our mm>`: whoever invalidates our
//! mm, on whatever CPU, writes the record into that CPU's ring before it changes a page. The
//! filter needs our `struct mm_struct` address, learned at open from one record of a per-task
//! event (a `MADV_DONTNEED` of a page of our own). CPU-wide events and raw samples both need
//! `CAP_PERFMON` (or `perf_event_paranoid` = -1): perf's filters do the filtering, as proposed,
//! but only for a privileged reader; an unprivileged one could be given per-task events
//! (a `TRACE_EVENT_FL_CAP_ANY` flag like the syscall tracepoints'), and would then miss every
//! invalidation of its mm made by another task.
//!
//! # The guarantees
//! The record is written by the invalidating task in `mmu_notifier_invalidate_range_start`,
//! before the page tables change and so before the unmapping call returns: a check (one load
//! of each CPU ring's head, as in the syscall mode) made after the return sees the head moved
//! and pulls it. The end record (`..._end`, the same task, after the change) closes the
//! window and invalidates the range again (a registration made between the start's delivery
//! and the change could hold the old pages): the same start/end machinery as the syscall
//! mode's entry/exit ([`super::begin_call`], [`super::end_call`]). A full ring or a
//! `PERF_RECORD_LOST` invalidates everything. A BPF program on these tracepoints that returns
//! 0 suppresses the perf samples: the delivery thread's canary (a zap of a page of ours every
//! tick) catches it and kills the notifier.
#![allow(unsafe_code)] // the canary page's mmap/munmap.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Mutex;

use super::decode::{self, Mmu, Syscall};
use super::{missing, sys, Canary, Discard, Drain, Perf, PerfStats, Ring, OPEN_CALLS, WAKEUP};

/// tracefs's directory of the patch's events.
pub(crate) const SYSTEM: &str = "mmu_notifier";
const START: &str = "mmu_notifier_invalidate_range_start";
const END: &str = "mmu_notifier_invalidate_range_end";

/// A private anonymous page of the backend's own: the canary zaps it.
pub(crate) struct Page(NonNull<u8>);

// SAFETY: the page is only passed to madvise/munmap, never dereferenced.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn new() -> io::Result<Page> {
        // SAFETY: a fresh anonymous mapping, owned by the returned value.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast())
            .map(Page)
            .ok_or_else(io::Error::last_os_error)
    }

    pub(crate) fn addr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: our own mapping, not used after this.
        unsafe { libc::munmap(self.0.as_ptr().cast(), 4096) };
    }
}

/// The tracepoints' ids and layout (tracefs), without our mm yet.
fn tracepoints() -> Result<Mmu, crate::Unsupported> {
    let root = sys::tracefs().ok_or_else(|| {
        missing(format!(
            "mmu_notifier tracepoints: {}",
            sys::tracefs_missing()
        ))
    })?;
    let id = |name: &str| {
        sys::event_id(root, SYSTEM, name).map_err(|e| {
            missing(format!(
                "this kernel has no tracepoint {SYSTEM}:{name} ({root}/events/{SYSTEM}/{name}/id: \
                 {e}): no released kernel has it; kernel/patches/mmu-notifier-trace/ adds it \
                 (the patched guest kernel of kernel/ci.sh)"
            ))
        })
    };
    let (start_id, end_id) = (id(START)?, id(END)?);
    let format = std::fs::read_to_string(format!("{root}/events/{SYSTEM}/{START}/format"))
        .map_err(|e| missing(format!("{root}/events/{SYSTEM}/{START}/format: {e}")))?;
    let at = |name: &str, size: usize| {
        decode::field_offset(&format, name, size).ok_or_else(|| {
            missing(format!(
                "{SYSTEM}:{START} has no {size}-byte field {name:?}: not the layout of \
                 kernel/patches/mmu-notifier-trace/"
            ))
        })
    };
    Ok(Mmu {
        start_id,
        end_id,
        mm_at: at("mm", 8)?,
        start_at: at("start", 8)?,
        end_at: at("end", 8)?,
        event_at: at("event", 4)?,
        mm: 0,
    })
}

fn refused(what: &str, e: &io::Error) -> crate::Unsupported {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unreadable".into());
    let why = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "CPU-wide events with raw tracepoint samples need CAP_PERFMON (or CAP_SYS_ADMIN), \
             or kernel.perf_event_paranoid=-1 (it is {paranoid})"
        ),
        Some(libc::ENOSYS) => "the kernel has no perf_event_open (CONFIG_PERF_EVENTS=n)".into(),
        Some(libc::EINVAL) => "the kernel refused the event or its filter".into(),
        _ => "unexpected error".into(),
    };
    missing(format!("{what}: {e}: {why}"))
}

/// Learns our `struct mm_struct` address: a per-task event on the start tracepoint records one
/// zap of `page` by this thread.
fn learn_mm(m: &Mmu, page: &Page) -> Result<u64, crate::Unsupported> {
    let fd = sys::open_self(m.start_id).map_err(|e| {
        refused(
            &format!("perf_event_open({SYSTEM}:{START}, this thread)"),
            &e,
        )
    })?;
    let ring = sys::RingMap::map(&fd).map_err(|e| missing(format!("perf ring mmap: {e}")))?;
    sys::zap(page.addr());
    let me = crate::sys::gettid();
    let mut mm = None;
    super::walk(
        &ring,
        0,
        ring.head(),
        |rec| {
            if let Some((tid, that, start)) = decode::sample_mm(rec, m) {
                if tid == me && start == page.addr() as u64 {
                    mm = Some(that);
                }
            }
            decode::Record::Other
        },
        |_| {},
    );
    mm.ok_or_else(|| {
        missing(format!(
            "{SYSTEM}:{START} recorded nothing for a MADV_DONTNEED of this process (a BPF \
             program attached to it that returns 0 suppresses perf samples system-wide)"
        ))
    })
}

/// Opens the two tracepoints on every online CPU for every task, filtered to this process's
/// mm, one ring per CPU; refuses (naming what is missing) rather than start with a gap.
pub(crate) fn open() -> Result<Perf, crate::Unsupported> {
    super::ATFORK.register(None, None, Some(super::in_child));
    let mut m = tracepoints()?;
    let page = Page::new().map_err(|e| missing(format!("canary page: {e}")))?;
    m.mm = learn_mm(&m, &page)?;
    let filter = std::ffi::CString::new(format!("mm == {:#x}", m.mm))
        .map_err(|_| missing("filter string"))?;
    let cpus = sys::online_cpus().map_err(|e| missing(format!("online CPUs: {e}")))?;
    let (mut fds, mut leads, mut rings) = (Vec::new(), Vec::new(), Vec::new());
    for &cpu in &cpus {
        let what = |n: &str| format!("perf_event_open({SYSTEM}:{n}, cpu {cpu}, every task)");
        let lead = sys::open_cpu_wide(m.start_id, cpu, None, WAKEUP, &filter)
            .map_err(|e| refused(&what(START), &e))?;
        rings.push(Ring {
            map: sys::RingMap::map(&lead).map_err(|e| missing(format!("perf ring mmap: {e}")))?,
            tail: AtomicU64::new(0),
        });
        let end = sys::open_cpu_wide(m.end_id, cpu, Some(&lead), WAKEUP, &filter)
            .map_err(|e| refused(&what(END), &e))?;
        leads.push(fds.len());
        fds.push(lead);
        fds.push(end);
    }
    let n = rings.len();
    let addr = page.addr() as u64;
    let perf = Perf {
        rings,
        ids: [(0, Syscall::Munmap, false); 2 * Syscall::ALL.len()],
        threads: 0,
        drain: Mutex::new(Drain {
            begun: vec![0; n],
            h1: vec![0; n],
            h2: vec![0; n],
            open: [None; OPEN_CALLS],
            brk_top: 0,
            canary_tid: 0,
            seen: 0,
            canary_addr: addr,
            lost_since_canary: false,
            stats: PerfStats::default(),
        }),
        fds,
        leads,
        quiet: AtomicU32::new(0),
        mmu: Some(m),
        canary_page: Some(page),
    };
    let verdict = perf.canary(crate::sys::gettid(), &Discard);
    perf.drain.lock().unwrap_or_else(|e| e.into_inner()).open = [None; OPEN_CALLS];
    match verdict {
        Canary::Suppressed(which) => Err(missing(format!(
            "the tracepoints record nothing: {}",
            suppressed(which)
        ))),
        Canary::Ok | Canary::Void => Ok(perf),
    }
}

/// The tracepoints named by the bits of `which` (bit 0 start, bit 1 end), in words.
pub(crate) fn suppressed(which: u32) -> String {
    let names: Vec<String> = [START, END]
        .iter()
        .enumerate()
        .filter(|(i, _)| which & (1 << i) != 0)
        .map(|(_, n)| format!("{SYSTEM}:{n}"))
        .collect();
    format!(
        "{} (a BPF program attached to them that returns 0 suppresses perf samples \
         system-wide)",
        names.join(", ")
    )
}

/// What this kernel offers for BPF on the invalidation path (issue 43 item 2, not built):
/// kprobe events, ftrace's function list (fentry needs the function traceable), BTF.
pub(crate) fn bpf_invalidation_path() -> String {
    let root = sys::tracefs().unwrap_or("/sys/kernel/tracing");
    let kprobes = std::path::Path::new(&format!("{root}/kprobe_events")).exists();
    let functions = match std::fs::read_to_string(format!("{root}/available_filter_functions")) {
        Ok(s) => {
            let has = s.lines().any(|l| {
                l.split_whitespace().next() == Some("__mmu_notifier_invalidate_range_start")
            });
            if has {
                "lists __mmu_notifier_invalidate_range_start".to_string()
            } else {
                "does not list __mmu_notifier_invalidate_range_start".to_string()
            }
        }
        Err(e) => format!("is unreadable ({e})"),
    };
    let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
    format!(
        "BPF on the kernel's invalidation functions (fentry/kprobe on \
         __mmu_notifier_invalidate_range_start): not built; here {root}/kprobe_events {}, \
         available_filter_functions {functions}, BTF {}; and that function runs only for an \
         mm with MMU-notifier subscriptions (the inline caller's mm_has_notifiers() fast path \
         skips it for every other process), so a program there sees nothing of a process that \
         registered no notifier",
        if kprobes {
            "exists"
        } else {
            "is absent (no kprobe events: CONFIG_KPROBE_EVENTS off)"
        },
        if btf {
            "present (/sys/kernel/btf/vmlinux)"
        } else {
            "absent"
        },
    )
}

/// What `umn doctor` says about the tracepoint backend.
pub(crate) fn probe() -> crate::backend::BackendReport {
    let mut features = Vec::new();
    let notes = vec![
        "perf on mmu_notifier:mmu_notifier_invalidate_range_start/_end (kernel/patches/\
         mmu-notifier-trace/), one event per CPU for every task, filtered in the kernel to \
         this process's mm: sees every invalidation of its pages whichever task makes it \
         (truncate, hole punch, io_uring, reclaim, another process's process_madvise); the \
         check loads every CPU's ring head"
            .to_string(),
        "needs CAP_PERFMON (CPU-wide events, raw samples); while active, every invalidation \
         on the machine evaluates the filter (the tax on other processes)"
            .to_string(),
        bpf_invalidation_path(),
    ];
    let status = open().map(|p| {
        let (_, cpus, events) = p.shape();
        features.push("mmu_notifier tracepoints");
        format!("ok: {cpus} rings (one per CPU), {events} CPU-wide events filtered to this mm")
    });
    crate::backend::BackendReport {
        name: "tracepoint",
        status,
        kernel_features: features,
        notes,
    }
}
