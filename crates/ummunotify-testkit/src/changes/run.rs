//! Running one case against a watcher and judging it.

use std::io;
use std::ops::Range;

use super::child::in_own_process;
use super::mapping::read;
use super::scenario::Scenario;
use super::{CaseReport, ChangeKind, Watcher};
use crate::pagemap::pfns;
use crate::uring::Pinner;

/// Runs one case: sets up memory for `kind`, fills it, `w.watch(range)`, pins the range with an
/// io_uring fixed buffer, records PFNs, applies exactly one change of the kind, calls
/// `w.is_valid()` immediately after the call returned, puts new content at the old address
/// (x == y) and asks `w.is_valid()` again, then consults the oracles: PFNs before vs after
/// ([`CaseReport::oracle_changed`]) and a `WRITE_FIXED` through the pinned registration compared
/// with what memory holds now ([`CaseReport::device_bytes_stale`]).
///
/// Cleanup always runs, in this order: `w.unwatch()`, unpin, unmap what is left.
///
/// # Errors
///
/// A [`crate::require::MissingFeature`] if the kernel lacks what the kind needs, a
/// [`crate::pagemap::PfnUnavailable`] if the PFN oracle is unusable (not root), `InvalidInput`
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

fn exercise(
    kind: ChangeKind,
    sc: &mut Scenario,
    pinner: &mut Pinner,
    w: &mut dyn Watcher,
    watched: &mut bool,
) -> io::Result<CaseReport> {
    let range = sc.range.clone();
    let mut report = CaseReport {
        kind,
        detected: false,
        stale_uses: 0,
        expected_event: kind.expects_event(),
        events: Vec::new(),
        counter_moved: false,
        oracle_changed: false,
        device_bytes_stale: None,
        pinned: false,
        problems: Vec::new(),
        notes: std::mem::take(&mut sc.notes),
    };
    if let Err(e) = w.watch(range.clone()) {
        report
            .problems
            .push(format!("watch({range:#x?}) failed: {e}"));
        return Ok(report);
    }
    *watched = true;
    report.pinned = match pinner.register(range.start, range.len()) {
        Ok(()) => true,
        Err(e) if kind == ChangeKind::FileBacked => {
            report.notes.push(format!(
                "file-backed range not pinned ({e}): long-term pins of ordinary file pages are \
                 refused; the PFN oracle stays exact (the page cache keeps the old frame)"
            ));
            false
        }
        Err(e) => return Err(e),
    };
    let before = pfns(range.clone())?;
    if before.iter().any(Option::is_none) {
        report
            .problems
            .push("the range was not fully populated before the change".into());
    }

    sc.apply()?;
    let valid_now = w.is_valid();
    sc.refill()?;
    let valid_later = w.is_valid();

    let after = pfns(range.clone())?;
    report.oracle_changed = before.iter().zip(&after).any(|(b, a)| b != a);
    if report.pinned {
        pinner.write_fixed(range.start, range.len(), 0)?;
        let device = pinner.read_back(range.len(), 0)?;
        report.device_bytes_stale = Some(device != read(&range));
    }
    report.counter_moved = w.counter_moved();
    report.events = w.events();
    judge(&mut report, sc.expected.as_ref(), valid_now, valid_later);
    Ok(report)
}

fn judge(r: &mut CaseReport, expected: Option<&Range<usize>>, valid_now: bool, valid_later: bool) {
    if r.oracle_changed {
        r.stale_uses = u32::from(valid_now) + u32::from(valid_later);
    }
    match expected {
        Some(hint) => {
            let one_event = r.events.len() == 1 && r.events[0] == (hint.clone(), true);
            r.detected = !valid_now && r.counter_moved && one_event;
            if valid_now {
                r.problems
                    .push("is_valid() was true right after the change returned".into());
            }
            if valid_later {
                r.problems
                    .push("is_valid() was true after new memory was put in place".into());
            }
            if !r.counter_moved {
                r.problems
                    .push("the generation counter did not move".into());
            }
            if !one_event {
                r.problems.push(format!(
                    "expected exactly one event {hint:#x?} with the hint flag, got {:#x?}",
                    r.events
                ));
            }
            if r.kind.replaces_memory() && !r.oracle_changed {
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
                r.problems
                    .push("invalidated although only a neighbour changed".into());
            }
            if !r.events.is_empty() {
                r.problems
                    .push(format!("unexpected events {:#x?}", r.events));
            }
            if r.oracle_changed || r.device_bytes_stale == Some(true) {
                r.problems
                    .push("catalogue error: memory inside the range changed".into());
            }
        }
    }
    if r.stale_uses > 0 {
        r.problems.push(format!("{} stale use(s)", r.stale_uses));
    }
}
