//! [`NotifierWatcher`] and [`KernelWatcher`]: one region of a real notifier (the
//! [`Notifier`] on any backend, or the `/dev/ummunotify` module's [`KernelNotifier`]), driven by
//! the testkit's catalogue.
use std::ops::Range;

use ummunotify::{Backend, Cookie, Error, Event, Generation, KernelNotifier, Notifier, Region};
use ummunotify_testkit::changes::{ChangeKind, Watcher};

/// What a watcher needs of a notifier (both notifiers have these calls).
pub trait Watchable {
    /// Registers `range` under `cookie`.
    fn register(&self, range: Range<usize>, cookie: Cookie) -> Result<Region, Error>;
    /// A stable snapshot of the counter.
    fn generation(&self) -> Result<Generation, Error>;
    /// The O(1) check.
    fn is_valid(&self, region: Region) -> bool;
    /// The one-load check.
    fn unchanged_since(&self, snapshot: Generation) -> bool;
    /// Every pending event.
    fn events(&self) -> Result<Vec<Event>, Error>;
    /// Unregisters `cookie`.
    fn unregister(&self, cookie: Cookie) -> Result<(), Error>;
    /// Whether this notifier is expected to see `kind` at all.
    fn expects(&self, kind: ChangeKind) -> bool;
}

impl Watchable for Notifier {
    fn register(&self, range: Range<usize>, cookie: Cookie) -> Result<Region, Error> {
        Notifier::register(self, range, cookie)
    }
    fn generation(&self) -> Result<Generation, Error> {
        Notifier::generation(self)
    }
    fn is_valid(&self, region: Region) -> bool {
        Notifier::is_valid(self, region)
    }
    fn unchanged_since(&self, snapshot: Generation) -> bool {
        Notifier::unchanged_since(self, snapshot)
    }
    fn events(&self) -> Result<Vec<Event>, Error> {
        Notifier::events(self)
    }
    fn unregister(&self, cookie: Cookie) -> Result<(), Error> {
        Notifier::unregister(self, cookie)
    }
    /// What the notifier's backend can see: everything userfaultfd reports, or every libc call.
    fn expects(&self, kind: ChangeKind) -> bool {
        expects(self.backend(), kind)
    }
}

impl Watchable for KernelNotifier {
    fn register(&self, range: Range<usize>, cookie: Cookie) -> Result<Region, Error> {
        KernelNotifier::register(self, range, cookie)
    }
    fn generation(&self) -> Result<Generation, Error> {
        Ok(KernelNotifier::generation(self))
    }
    fn is_valid(&self, region: Region) -> bool {
        KernelNotifier::is_valid(self, region)
    }
    fn unchanged_since(&self, snapshot: Generation) -> bool {
        KernelNotifier::unchanged_since(self, snapshot)
    }
    fn events(&self) -> Result<Vec<Event>, Error> {
        KernelNotifier::events(self)
    }
    fn unregister(&self, cookie: Cookie) -> Result<(), Error> {
        KernelNotifier::unregister(self, cookie)
    }
    /// The module's MMU notifiers see every kind in the catalogue.
    fn expects(&self, _kind: ChangeKind) -> bool {
        true
    }
}

/// Watches one range with a real notifier `N`.
#[derive(Debug)]
pub struct WatchWith<'n, N> {
    notifier: &'n N,
    cookie: Cookie,
    region: Option<Region>,
    since: Option<Generation>,
}

/// Watches one range with a [`Notifier`].
pub type NotifierWatcher<'n> = WatchWith<'n, Notifier>;
/// Watches one range with the `/dev/ummunotify` kernel module.
pub type KernelWatcher<'n> = WatchWith<'n, KernelNotifier>;

impl<'n, N: Watchable> WatchWith<'n, N> {
    /// A watcher that registers its range under `cookie` on `notifier`.
    pub fn new(notifier: &'n N, cookie: Cookie) -> Self {
        WatchWith {
            notifier,
            cookie,
            region: None,
            since: None,
        }
    }
}

impl<N: Watchable> Watcher for WatchWith<'_, N> {
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

    fn expects(&self, kind: ChangeKind) -> bool {
        self.notifier.expects(kind)
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
