//! [`NotifierWatcher`]: one region of a real [`Notifier`], driven by the testkit's catalogue.
use std::ops::Range;

use ummunotify::ebpf::{Area, Ticket};
use ummunotify::{Backend, Cookie, Event, Generation, Notifier, Region};
use ummunotify_testkit::changes::{ChangeKind, Watcher};

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
    fn watch(&mut self, range: Range<usize>) -> Result<(), String> {
        let region = self
            .notifier
            .register(range, self.cookie)
            .map_err(|e| e.to_string())?;
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

    /// What the notifier's backend can see: everything userfaultfd reports, or every libc call.
    fn expects(&self, kind: ChangeKind) -> bool {
        expects(self.notifier.backend(), kind)
    }

    fn unwatch(&mut self) {
        if self.region.take().is_some() {
            let _ = self.notifier.unregister(self.cookie);
        }
    }
}

/// Whether `backend` is expected to see `kind` (the `expected` column of `umn coverage`).
pub fn expects(backend: Backend, kind: ChangeKind) -> bool {
    match backend {
        Backend::Hooks => kind.hooks_report(),
        _ => kind.userfaultfd_reports(),
    }
}

/// Watches one range in this process's eBPF area (the eBPF backend's mechanism, until the
/// notifier runs on it): the ticket's word is the region word, the area's counter the
/// generation, the word's change with its hint the event.
#[derive(Debug)]
pub struct AreaWatcher<'a> {
    area: &'a Area,
    ticket: Option<Ticket>,
    since: u64,
}

impl<'a> AreaWatcher<'a> {
    /// A watcher that registers its range in `area`.
    pub fn new(area: &'a Area) -> Self {
        AreaWatcher {
            area,
            ticket: None,
            since: 0,
        }
    }
}

impl Watcher for AreaWatcher<'_> {
    fn watch(&mut self, range: Range<usize>) -> Result<(), String> {
        self.since = self.area.generation();
        let t = self
            .area
            .register(range.start as u64, range.end as u64)
            .map_err(|e| e.to_string())?;
        self.ticket = Some(t);
        Ok(())
    }

    fn is_valid(&mut self) -> bool {
        self.ticket.is_some_and(|t| self.area.is_valid(t))
    }

    fn counter_moved(&mut self) -> bool {
        self.area.generation() != self.since
    }

    fn events(&mut self) -> Vec<(Range<usize>, bool)> {
        self.ticket
            .and_then(|t| self.area.take_change(t))
            .map(|r| vec![(r.start as usize..r.end as usize, true)])
            .unwrap_or_default()
    }

    fn expects(&self, kind: ChangeKind) -> bool {
        kind.ebpf_reports()
    }

    fn unwatch(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.area.unregister(t);
        }
    }
}
