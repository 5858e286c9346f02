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
    /// The events the watcher reported for the region.
    pub events: Vec<(Range<usize>, bool)>,
    /// Whether the watcher's shared generation counter moved.
    pub counter_moved: bool,
    /// The PFN oracle: some page of the range is backed by a different frame (or none) after the
    /// change. Exact while the old frames are pinned.
    pub oracle_changed: bool,
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
    /// Whether the case passed (no problems).
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}
