//! Running one case against a watcher and judging it.

use std::io;
use std::ops::Range;

use super::child::in_own_process;
use super::mapping::read;
use super::scenario::{AddressTaken, Scenario};
use super::{CaseReport, ChangeKind, WatchError, Watcher};
use crate::pagemap::{is_pfn_unavailable, pfns};
use crate::uring::Pinner;

/// How many times a case is tried before it is reported inconclusive because its address kept
/// being taken by mappings it did not make.
pub const TRIES: usize = 3;

/// Runs one case: sets up memory for `kind`, fills it, `w.watch(range)`, pins the range with an
/// io_uring fixed buffer, records PFNs, applies exactly one change of the kind, calls
/// `w.is_valid()` immediately after the call returned, puts new content at the old address
/// (x == y) and asks `w.is_valid()` again, then consults the oracles: PFNs before vs after
/// ([`CaseReport::oracle_changed`], where the process may read PFNs) and a `WRITE_FIXED` through
/// the pinned registration compared with what memory holds now
/// ([`CaseReport::device_bytes_stale`], which needs no privilege).
///
/// If the old address was taken by a mapping the case did not make (another thread's stack or
/// signal stack, say), that is bad luck, not a verdict: the case names the intruder and runs
/// again at a fresh address, up to [`TRIES`] times, and then reports itself
/// [`CaseReport::inconclusive`].
///
/// Cleanup always runs, in this order: `w.unwatch()`, unpin, unmap what is left.
///
/// # Errors
///
/// A [`crate::require::MissingFeature`] if the kernel lacks what the kind needs, `InvalidInput`
/// for [`ChangeKind::BrkShrink`] outside a process of its own (see [`super::run_in_child`]), or
/// the OS error of a step that failed. Watcher misbehaviour is never an error: it is a problem in
/// the report.
pub fn run_case(kind: ChangeKind, w: &mut dyn Watcher) -> io::Result<CaseReport> {
    if kind.needs_own_process() && !in_own_process() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{kind} moves the program break: run it with run_in_child"),
        ));
    }
    let mut taken = Vec::new();
    for _ in 0..TRIES {
        match run_once(kind, w) {
            Err(e) if e.get_ref().is_some_and(|i| i.is::<AddressTaken>()) => {
                taken.push(e.to_string());
            }
            Ok(mut report) => {
                if !taken.is_empty() {
                    report.notes.push(format!(
                        "ran again at a fresh address after: {}",
                        taken.join("; ")
                    ));
                }
                return Ok(report);
            }
            Err(e) => return Err(e),
        }
    }
    let mut report = CaseReport::new(kind, w.expects(kind));
    report.inconclusive = Some(format!(
        "could not run in {TRIES} tries: {}",
        taken.join("; ")
    ));
    Ok(report)
}

fn run_once(kind: ChangeKind, w: &mut dyn Watcher) -> io::Result<CaseReport> {
    let mut pinner = Pinner::new()?;
    let mut sc = Scenario::setup(kind)?;
    let mut watched = false;
    let outcome = exercise(kind, &mut sc, &mut pinner, w, &mut watched);
    if watched {
        w.unwatch();
    }
    let unpinned = pinner.unregister();
    let leftovers = sc.cleanup();
    let mut report = outcome?;
    if let Err(e) = unpinned {
        report
            .problems
            .push(format!("io_uring unregister failed: {e}"));
    }
    report.problems.extend(leftovers);
    Ok(report)
}

/// PFNs of `range`, or `None` where this process may not read them.
fn pfns_if_visible(range: Range<usize>) -> io::Result<Option<Vec<Option<u64>>>> {
    match pfns(range) {
        Ok(p) => Ok(Some(p)),
        Err(e) if is_pfn_unavailable(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

fn exercise(
    kind: ChangeKind,
    sc: &mut Scenario,
    pinner: &mut Pinner,
    w: &mut dyn Watcher,
    watched: &mut bool,
) -> io::Result<CaseReport> {
    let range = sc.range.clone();
    let mut report = CaseReport::new(kind, w.expects(kind));
    report.notes = std::mem::take(&mut sc.notes);
    report.problems = std::mem::take(&mut sc.problems);
    match w.watch(range.clone()) {
        Ok(()) => {}
        // Refused by type, where no event is expected anyway: every registration of such a
        // mapping gets the error, so nothing is used stale; the kind stays in the table, missed.
        Err(WatchError::Refused(why)) if !report.expected => {
            report.notes.push(format!(
                "the watcher refuses this mapping ({why}): registering it is a typed error, so \
                 nothing is used stale, and nothing is seen"
            ));
            return Ok(report);
        }
        Err(e) => {
            report
                .problems
                .push(format!("watch({range:#x?}) failed: {e}"));
            return Ok(report);
        }
    }
    *watched = true;
    report.pinned = kind.pins()
        && match pinner.register(range.start, range.len()) {
            Ok(()) => true,
            Err(e) if kind == ChangeKind::FileBacked => {
                report.notes.push(format!(
                "file-backed range not pinned ({e}): long-term pins of ordinary file pages are \
                 refused; judged by PFNs where visible (exact: the page cache keeps the old \
                 frame), else by construction"
            ));
                false
            }
            Err(e) if kind == ChangeKind::Shmdt && e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                report.notes.push(format!(
                    "not pinned ({e}): io_uring of some kernels (6.1) pins shmem and hugetlb file \
                     pages only, and a SysV segment's VMA is neither; judged by construction \
                     (the segment's frames are freed at shmdt and may come back in the refill, \
                     so PFNs prove nothing unpinned)"
                ));
                false
            }
            Err(e) => return Err(e),
        };
    // Unpinned, a detached segment's freed frames may be the refill's: no PFN oracle then.
    let pfn_oracle = report.pinned || kind != ChangeKind::Shmdt;
    let before = if pfn_oracle {
        pfns_if_visible(range.clone())?
    } else {
        None
    };
    if before
        .as_ref()
        .is_some_and(|b| b.iter().any(Option::is_none))
    {
        report
            .problems
            .push("the range was not fully populated before the change".into());
    }

    sc.apply()?;
    let valid_now = w.is_valid();
    sc.refill()?;
    let valid_later = w.is_valid();

    if let Some(before) = before {
        let after = pfns(range.clone())?;
        report.oracle_changed = Some(before.iter().zip(&after).any(|(b, a)| b != a));
    }
    if report.pinned {
        pinner.write_fixed(range.start, range.len(), 0)?;
        let device = pinner.read_back(range.len(), 0)?;
        report.device_bytes_stale = Some(device != read(&range));
    }
    report.counter_moved = w.counter_moved();
    report.events = w.events();
    report.oracle = match (
        report.oracle_changed.is_some(),
        report.device_bytes_stale.is_some(),
    ) {
        (true, true) => "pfn+device",
        (true, false) => "pfn",
        (false, true) => "device",
        (false, false) => "none",
    }
    .to_owned();
    judge(
        &mut report,
        &range,
        sc.expected.as_ref(),
        valid_now,
        valid_later,
    );
    Ok(report)
}

fn judge(
    r: &mut CaseReport,
    watched: &Range<usize>,
    expected: Option<&Range<usize>>,
    valid_now: bool,
    valid_later: bool,
) {
    // With no oracle (file pages can not be pinned and PFNs are hidden), a kind that replaces
    // memory did so by construction: count its checks as the oracles would have.
    let changed = r
        .memory_changed()
        .unwrap_or_else(|| r.kind.replaces_memory());
    if changed {
        r.stale_uses = u32::from(valid_now) + u32::from(valid_later);
    }
    // A kind the watcher can not see is reported as missed, with its stale uses; only catalogue
    // errors are problems there.
    let mut watcher_problems = Vec::new();
    match expected {
        Some(hint) => {
            // Where the change covers the whole region, an event without the hint flag says the
            // same: the kernel module's MMU notifier sees mremap's move and ftruncate's two
            // unmap_mapping_range passes as two invalidations of the range, and the 2010 rule
            // then clears the flag, leaving the whole region.
            let whole =
                hint == watched && r.events.len() == 1 && r.events[0] == (hint.clone(), false);
            let one_event = r.events.len() == 1 && r.events[0] == (hint.clone(), true) || whole;
            if whole {
                r.notes.push(
                    "two invalidations of the whole region: no hint flag, the whole range".into(),
                );
            }
            r.detected = !valid_now && r.counter_moved && one_event;
            if valid_now {
                watcher_problems.push("is_valid() was true right after the change returned".into());
            }
            if valid_later {
                watcher_problems
                    .push("is_valid() was true after new memory was put in place".into());
            }
            if !r.counter_moved {
                watcher_problems.push("the generation counter did not move".into());
            }
            if !one_event {
                watcher_problems.push(format!(
                    "expected exactly one event {hint:#x?} with the hint flag, got {:#x?}",
                    r.events
                ));
            }
            if r.kind.replaces_memory() && r.oracle_changed == Some(false) {
                r.problems
                    .push("catalogue error: the PFN oracle saw no change".into());
            }
            if r.kind.replaces_memory() && r.device_bytes_stale == Some(false) {
                r.problems
                    .push("catalogue error: the device view is not stale".into());
            }
        }
        None => {
            r.detected = valid_now && valid_later && r.events.is_empty();
            if !(valid_now && valid_later) {
                watcher_problems.push("invalidated although only a neighbour changed".into());
            }
            if !r.events.is_empty() {
                watcher_problems.push(format!("unexpected events {:#x?}", r.events));
            }
            if r.memory_changed() == Some(true) {
                r.problems
                    .push("catalogue error: memory inside the range changed".into());
            }
        }
    }
    if r.stale_uses > 0 {
        watcher_problems.push(format!("{} stale use(s)", r.stale_uses));
    }
    if r.expected {
        r.problems.extend(watcher_problems);
    } else if !r.detected {
        r.notes.push(format!(
            "missed, as expected: this watcher can not see it ({})",
            watcher_problems.join("; ")
        ));
    }
}
