//! The eBPF backend behind the seam: watched ranges are tickets in this process's area, and the
//! notifier's checks pull through a [`Probe`] that compares the area's counter with the last
//! value it delivered.
//!
//! Visibility rule: the entry program bumped the ticket's word and the area's counter in the
//! unmapping thread before the call changed anything; any check made after the call returned
//! loads the counter in [`Probe::pull`], sees it moved, and delivers the moved words' ranges
//! (begin, apply, end) before the check's own load.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use super::{Area, Ticket};
use crate::backend::{Delivery, Watcher};
use crate::sink::{Count, Invalidation, Probe, Sink};

/// One watched range.
#[derive(Clone, Copy)]
struct Watch {
    start: u64,
    end: u64,
    ticket: Ticket,
}

struct Shared {
    area: Arc<Area>,
    watches: Mutex<Vec<Watch>>,
    /// The area counter the last pull delivered up to.
    seen: AtomicU64,
}

impl Shared {
    /// Delivers every moved word of this watcher's tickets. The watches lock is held: no
    /// allocation, only the area's slot lock and the sink.
    fn deliver_moved(&self, watches: &[Watch], sink: &dyn Sink) {
        let mut begun = false;
        for w in watches {
            if let Some(r) = self.area.take_change(w.ticket) {
                if !begun {
                    sink.begin(Count::Known);
                    begun = true;
                }
                sink.apply(Invalidation::Remove {
                    start: r.start,
                    end: r.end,
                });
            }
        }
        if begun {
            sink.end();
        }
    }
}

/// The eBPF [`Watcher`] of one notifier.
pub(crate) struct EbpfWatcher {
    shared: Arc<Shared>,
    sink: Mutex<Option<Arc<dyn Sink>>>,
}

impl EbpfWatcher {
    pub(crate) fn new(area: Arc<Area>) -> EbpfWatcher {
        let seen = AtomicU64::new(area.generation());
        EbpfWatcher {
            shared: Arc::new(Shared {
                area,
                watches: Mutex::new(Vec::new()),
                seen,
            }),
            sink: Mutex::new(None),
        }
    }
}

impl Watcher for EbpfWatcher {
    fn watch(&self, start: u64, end: u64) -> crate::Result<()> {
        let mut ws = self
            .shared
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if ws.iter().any(|w| w.start <= start && end <= w.end) {
            return Ok(()); // idempotent
        }
        let ticket = self.shared.area.register(start, end)?;
        ws.push(Watch { start, end, ticket });
        Ok(())
    }

    fn unwatch(&self, start: u64, end: u64) {
        let sink = self.sink.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut ws = self
            .shared
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut i = 0;
        while i < ws.len() {
            let w = ws[i];
            if w.end <= start || end <= w.start {
                i += 1;
                continue;
            }
            // The parts that stay watched are registered before the old ticket goes (so no
            // call can fall between them), and what the old ticket saw is delivered first.
            let mut keep = Vec::new();
            for (s, e) in [(w.start, start), (end, w.end)] {
                if s < e {
                    if let Ok(t) = self.shared.area.register(s, e) {
                        keep.push(Watch {
                            start: s,
                            end: e,
                            ticket: t,
                        });
                    }
                }
            }
            if let Some(sink) = &sink {
                self.shared.deliver_moved(&[w], sink.as_ref());
            }
            self.shared.area.unregister(w.ticket);
            ws.swap_remove(i);
            ws.extend(keep.iter().copied());
            i = 0; // the kept parts do not overlap [start, end); rescan is simplest
        }
    }

    fn splits_vmas(&self) -> bool {
        false // ranges in a BPF array: no VMA is touched
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        Some(Box::new(EbpfProbe(Arc::clone(&self.shared))))
    }

    fn deliver(&self, sink: Arc<dyn Sink>) -> crate::Result<Box<dyn Delivery>> {
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
        Ok(Box::new(Running))
    }
}

impl Drop for EbpfWatcher {
    fn drop(&mut self) {
        let ws = self
            .shared
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for w in ws.iter() {
            self.shared.area.unregister(w.ticket);
        }
    }
}

struct EbpfProbe(Arc<Shared>);

impl Probe for EbpfProbe {
    fn pull(&self, sink: &dyn Sink) {
        let s = &self.0;
        let now = s.area.generation();
        if s.seen.load(SeqCst) == now {
            return; // nothing changed: two loads
        }
        let ws = s.watches.lock().unwrap_or_else(|e| e.into_inner());
        s.deliver_moved(&ws, sink);
        // Stored after the delivery: a concurrent check that finds `seen == now` knows the
        // moves up to `now` were delivered (the words are bumped before the counter).
        s.seen.fetch_max(now, SeqCst);
    }
}

/// Delivery runs in the checking threads (the probe); nothing to stop.
struct Running;

impl Delivery for Running {
    fn stop(self: Box<Self>, _forked: bool) {}
}
