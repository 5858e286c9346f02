//! The trait through which a case drives the thing under test, and a naive implementation.

use std::fmt;
use std::ops::Range;

use super::ChangeKind;

/// Why [`Watcher::watch`] did not watch a range.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchError {
    /// The thing under test refuses this kind of mapping with a typed error it gives every
    /// registration of it (ummunotify's `UnsupportedMapping`: the kernel can not watch the
    /// mapping). Nothing can be used stale through a refused registration; for a kind the
    /// watcher is not expected to see, the case is an expected miss, not a problem.
    Refused(String),
    /// Any other failure: the case records it as a problem.
    Failed(String),
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::Refused(why) => write!(f, "refused: {why}"),
            WatchError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for WatchError {}

impl From<String> for WatchError {
    fn from(why: String) -> Self {
        WatchError::Failed(why)
    }
}

/// The thing under test: something that watches one address range for mapping changes.
///
/// [`super::run_case`] calls `watch`, then (after the change) `is_valid` twice, then
/// `counter_moved` and `events`, and finally `unwatch`, always, even when the case fails.
pub trait Watcher {
    /// Start watching `range` (what the library calls registering a region).
    ///
    /// # Errors
    ///
    /// [`WatchError::Refused`] for a mapping the watcher refuses by type (an expected miss
    /// where [`expects`](Self::expects) is false, a problem otherwise); [`WatchError::Failed`]
    /// for anything else (a problem).
    fn watch(&mut self, range: Range<usize>) -> Result<(), WatchError>;
    /// Per-region validity check, made right after the change returned.
    fn is_valid(&mut self) -> bool;
    /// Whether the shared generation counter moved since watch().
    fn counter_moved(&mut self) -> bool;
    /// Drain events: (reported range, hint flag) for this region.
    fn events(&mut self) -> Vec<(Range<usize>, bool)>;
    /// Stop watching (before the scenario frees what is left).
    fn unwatch(&mut self);
    /// Whether this watcher is expected to detect `kind` (the `expected` column). By default,
    /// what userfaultfd reports ([`ChangeKind::userfaultfd_reports`]).
    fn expects(&self, kind: ChangeKind) -> bool {
        kind.userfaultfd_reports()
    }
}

/// A watcher that never notices anything: always valid, no events, counter never moves.
///
/// This is what a registration cache without invalidation does. Running the catalogue against it
/// shows the hazard is real: every kind that replaces memory yields stale uses.
#[derive(Debug, Default, Clone)]
pub struct NaiveWatcher {
    range: Option<Range<usize>>,
}

impl NaiveWatcher {
    /// A naive watcher watching nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The range passed to the last [`Watcher::watch`], until [`Watcher::unwatch`].
    pub fn range(&self) -> Option<Range<usize>> {
        self.range.clone()
    }
}

impl Watcher for NaiveWatcher {
    fn watch(&mut self, range: Range<usize>) -> Result<(), WatchError> {
        self.range = Some(range);
        Ok(())
    }

    fn is_valid(&mut self) -> bool {
        true
    }

    fn counter_moved(&mut self) -> bool {
        false
    }

    fn events(&mut self) -> Vec<(Range<usize>, bool)> {
        Vec::new()
    }

    fn unwatch(&mut self) {
        self.range = None;
    }

    /// The naive watcher detects nothing, and is expected to detect nothing but the control
    /// case (where "detected" means correctly silent).
    fn expects(&self, kind: ChangeKind) -> bool {
        !kind.expects_event()
    }
}
