//! The outcome of one case.

use std::ops::Range;

use super::ChangeKind;

/// What happened when one [`ChangeKind`] was applied to a watched, pinned range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseReport {
    /// The change applied.
    pub kind: ChangeKind,
    /// The watcher got it right: invalid right after the change, counter moved, and exactly one
    /// event whose range is the changed range clipped to the watched one, with the hint flag set.
    /// For [`ChangeKind::UntouchedNeighbour`]: correctly silent (still valid, no event).
    pub detected: bool,
    /// How many validity checks (one right after the change returned, one after new content was
    /// put at the old address) answered "valid" although the oracle saw the memory change.
    pub stale_uses: u32,
    /// Whether a correct watcher must report an event for this kind.
    pub expected_event: bool,
    /// Whether the watcher under test is expected to detect this kind ([`super::Watcher::expects`]):
    /// false for a kind its backend can not see, which then stays in the table as missed.
    pub expected: bool,
    /// `Some(reason)` if the case could not run to a verdict (its address was taken by a mapping
    /// it did not make, say, on every try): then `detected` means nothing and is reported as
    /// `null`. Never "not detected".
    pub inconclusive: Option<String>,
    /// Which oracles judged the case: `"pfn+device"`, `"pfn"`, `"device"`, or `"none"` (the
    /// change is certain by construction, but nothing confirmed it).
    pub oracle: String,
    /// The events the watcher reported for the region.
    pub events: Vec<(Range<usize>, bool)>,
    /// Whether the watcher's shared generation counter moved.
    pub counter_moved: bool,
    /// The PFN oracle: some page of the range is backed by a different frame (or none) after the
    /// change. Exact while the old frames are pinned. `None` where PFNs are hidden (without
    /// `CAP_SYS_ADMIN`, pagemap reports frame 0).
    pub oracle_changed: Option<bool>,
    /// The device view: `Some(true)` if a `WRITE_FIXED` through the pinned registration wrote
    /// bytes other than those memory holds now; `None` if the range could not be pinned.
    pub device_bytes_stale: Option<bool>,
    /// Whether the range was pinned with an io_uring fixed buffer.
    pub pinned: bool,
    /// Everything that went wrong; empty means the case passed.
    pub problems: Vec<String>,
    /// Remarks that are not failures (e.g. why the range could not be pinned).
    pub notes: Vec<String>,
}

impl CaseReport {
    /// A report of `kind` before anything ran.
    pub fn new(kind: ChangeKind, expected: bool) -> CaseReport {
        CaseReport {
            kind,
            detected: false,
            stale_uses: 0,
            expected_event: kind.expects_event(),
            expected,
            inconclusive: None,
            oracle: "none".to_owned(),
            events: Vec::new(),
            counter_moved: false,
            oracle_changed: None,
            device_bytes_stale: None,
            pinned: false,
            problems: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Whether the case passed (ran to a verdict with no problems).
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.inconclusive.is_none()
    }

    /// A miss that counts against the watcher: an expected kind, run to a verdict, not detected.
    pub fn missed_expected(&self) -> bool {
        self.expected && self.inconclusive.is_none() && !self.detected
    }

    /// Whether memory changed, by the oracles that could judge (`None`: none could).
    pub fn memory_changed(&self) -> Option<bool> {
        match (self.oracle_changed, self.device_bytes_stale) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(false) || b.unwrap_or(false)),
        }
    }
}
