//! [`NotifierWatcher`]: one region of a real [`Notifier`], driven by the testkit's catalogue.
use std::ops::Range;

use ummunotify::{Backend, Cookie, Event, Generation, Notifier, Region};
use ummunotify_testkit::changes::{ChangeKind, WatchError, Watcher};

/// Watches one range with a real notifier.
#[derive(Debug)]
pub struct NotifierWatcher<'n> {
    notifier: &'n Notifier,
    cookie: Cookie,
    region: Option<Region>,
    since: Option<Generation>,
}

impl<'n> NotifierWatcher<'n> {
    /// A watcher that registers its range under `cookie` on `notifier`.
    pub fn new(notifier: &'n Notifier, cookie: Cookie) -> Self {
        NotifierWatcher {
            notifier,
            cookie,
            region: None,
            since: None,
        }
    }
}

impl Watcher for NotifierWatcher<'_> {
    fn watch(&mut self, range: Range<usize>) -> Result<(), WatchError> {
        let region = self
            .notifier
            .register(range, self.cookie)
            .map_err(|e| match e {
                // The backend can not watch this mapping and tells every registration so.
                ummunotify::Error::UnsupportedMapping(_) => WatchError::Refused(e.to_string()),
                e => WatchError::Failed(e.to_string()),
            })?;
        self.region = Some(region);
        self.since = Some(self.notifier.generation().map_err(|e| e.to_string())?);
        Ok(())
    }

    fn is_valid(&mut self) -> bool {
        self.region.is_some_and(|r| self.notifier.is_valid(r))
    }

    fn counter_moved(&mut self) -> bool {
        self.since
            .is_some_and(|g| !self.notifier.unchanged_since(g))
    }

    fn events(&mut self) -> Vec<(Range<usize>, bool)> {
        let events: Vec<Event> = self.notifier.events().unwrap_or_default();
        events
            .into_iter()
            .filter(|e| e.cookie == self.cookie)
            .map(|e| (e.range(), e.hint))
            .collect()
    }

    /// What the notifier's backend can see: everything userfaultfd reports, every libc call, or
    /// every traced syscall (perf).
    fn expects(&self, kind: ChangeKind) -> bool {
        expects(self.notifier.backend(), kind)
    }

    fn unwatch(&mut self) {
        if self.region.take().is_some() {
            let _ = self.notifier.unregister(self.cookie);
        }
    }
}

/// Whether `backend` is expected to see `kind` (the `expected` column of `umn coverage`): the
/// catalogue's [`ChangeKind::expected_on`], userfaultfd's set for `auto`.
pub fn expects(backend: Backend, kind: ChangeKind) -> bool {
    kind.expected_on(backend.name())
        .unwrap_or_else(|| kind.userfaultfd_reports())
}
