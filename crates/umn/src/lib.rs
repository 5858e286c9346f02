//! Library half of the `umn` command line: the pieces its subcommands share, kept here so the
//! integration tests exercise exactly what users run.
//!
//! * [`watch`]: the real [`Notifier`](ummunotify::Notifier) behind the testkit's
//!   [`Watcher`](ummunotify_testkit::changes::Watcher) trait.
//! * [`coverage`]: run every change kind against the notifier, each in a child process.
//! * [`remove_race`]: coverage's `remove-race` row, a madvise `REMOVE` racing a registration.
//! * [`doctor`]: which backends work here and why not.
#![warn(missing_docs)]

pub mod coverage;
pub mod doctor;
pub mod no_procmap_query;
pub mod remove_race;
pub mod watch;
