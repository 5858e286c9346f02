//! Reading events: [`Notifier::read_events`] takes queued regions, re-arms them (or holds them
//! invalid while a `REMOVE` over them is in flight) and reports whether the queue drained.

use super::*;

/// What [`Notifier::read_events`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadEvents {
    /// Number of events written to the front of the buffer.
    pub count: usize,
    /// `Some` when the read drained the queue: the generation at that moment (the 2010
    /// `UMMUNOTIFY_EVENT_TYPE_LAST` counter). While
    /// [`unchanged_since`](Notifier::unchanged_since) this value, there is nothing to read.
    pub drained: Option<Generation>,
    /// `Some` with `drained`: the [notification count](Notifier::notifications) at that same
    /// moment (what the 2010 ABI's LAST record carries).
    pub drained_notifications: Option<u64>,
}

impl ReadEvents {
    /// Every pending event, read in batches by `read` until a read drains the queue.
    pub(crate) fn collect(
        mut read: impl FnMut(&mut [Event]) -> Result<ReadEvents>,
    ) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        let mut buf = [Event::default(); 64];
        loop {
            let r = read(&mut buf)?;
            out.extend_from_slice(&buf[..r.count]);
            if r.drained.is_some() {
                return Ok(out);
            }
        }
    }
}

impl Notifier {
    /// Moves pending events to the front of `buf` (re-arming their regions) and reports whether
    /// the queue was drained, with the counter at that moment.
    ///
    /// Re-arming a region whose pages were unmapped watches them again where they are mapped now.
    /// What its token means when some are not (holes): a [`register`](Self::register) region
    /// keeps reading invalid (the memory it was registered for is gone) until a later re-arm
    /// finds all its pages mapped; a [`register_any`](Self::register_any) region reads valid
    /// (nothing mapped there changed since). Either way the region is never deaf: memory mapped
    /// into its holes and announced with [`mapped`](Self::mapped) is watched, and its next
    /// invalidation is an event.
    ///
    /// # Errors
    /// [`Error::Forked`], [`Error::MonitorDead`].
    pub fn read_events(&self, buf: &mut [Event]) -> Result<ReadEvents> {
        let sh = &*self.shared;
        sh.alive()?;
        let mut reg = sh.lock_registry();
        sh.settle(&mut reg)?; // pulls first on a pull backend
                              // Regions whose REMOVE is still in flight are re-armed only after its zap: wait for
                              // that (bounded) rather than hand out their event again and again.
        sh.wait_inflight_until(
            &mut reg,
            |l, reg, h| !l.queued_in_flight(&reg.wide, h),
            (0, u64::MAX),
        );
        let mut recover: Vec<(u32, u64, Span)> = Vec::with_capacity(buf.len().min(4096));
        let mut held: Vec<u32> = Vec::with_capacity(buf.len().min(4096));
        let mut n = 0;
        let drained = loop {
            if generation::wait_idle(sh.counter()).is_err() {
                return sh.alive().map(|_| unreachable!("dead counter"));
            }
            let mut l = sh.lock_index_blocked();
            l.st.inflight.sweep();
            while n < buf.len() && l.st.queued > 0 {
                if recover.len() == recover.capacity() || held.len() == held.capacity() {
                    break; // re-cover these before taking more (no allocation under the lock)
                }
                let Some(id) = l.next_queued() else { break };
                l.dequeue(id);
                l.st.cursor = id.saturating_add(1);
                let span = reg.wide.span(l.node(id));
                let slot = l.slot(id);
                let w = slot.word.load(Relaxed);
                let (s, e, hint) = event::take(w, *l.hint(id), span.start, span.end);
                // The event is taken: the region stays invalid until re-armed below.
                slot.word.store(w & !(PENDING | MANY), Release);
                buf[n] = Event {
                    cookie: Cookie(slot.cookie.load(Relaxed)),
                    start: s as usize,
                    end: e as usize,
                    hint,
                };
                n += 1;
                if l.st.inflight.overlaps(span.watch_start, span.watch_end) {
                    held.push(id); // re-armed below, once its REMOVE is known to be done
                } else if w & LOST != 0 {
                    recover.push((id, serial_of(w), span));
                } else {
                    slot.word.store(valid_word(serial_of(w) + 1), Release);
                }
            }
            // Regions over a REMOVE in flight stay invalid and get their event again: the user
            // re-arms them on a later read, after the zap.
            for id in held.drain(..) {
                l.hold_invalid(id);
                sh.signal_ready(&mut l);
            }
            if l.st.queued > 0 {
                break None;
            }
            // BUSY is only set under this lock, together with readiness: if it is clear, no
            // message is between its read() and its application, and the queue is truly empty.
            let c = sh.counter().load(SeqCst);
            if c & generation::BUSY == 0 {
                if l.st.ready {
                    sh.ready.drain();
                    l.st.ready = false;
                }
                // Stable too: the monitor changes it only between begin_message (which needs
                // this lock) and end_message (which clears BUSY after it).
                let notes = sh.counter.notification_word().load(SeqCst);
                break Some((Generation(c), notes));
            }
            if n == buf.len() {
                break None;
            }
            // The monitor is mid-message (maybe waiting for this lock): let it finish.
        };
        sh.events_read.fetch_add(n as u64, Relaxed);
        for (id, serial, span) in recover {
            self.recover(&mut reg, id, serial, &span);
        }
        Ok(ReadEvents {
            count: n,
            drained: drained.map(|d| d.0),
            drained_notifications: drained.map(|d| d.1),
        })
    }
}
