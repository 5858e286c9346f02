//! Events and their coalescing: at most one pending event per region, with the 2010 hint rules.
//!
//! Pure code (no syscalls, no allocation): it runs on the event path under the index lock.

/// One invalidation event for a region, as returned by
/// [`Notifier::read_events`](crate::Notifier::read_events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// The region's cookie.
    pub cookie: crate::Cookie,
    /// Start of the reported range: the invalidated range clipped to the region while exactly one
    /// invalidation hit it (`hint` set), the whole region (the caller's range) after more.
    pub start: usize,
    /// End (exclusive) of the reported range.
    pub end: usize,
    /// Exactly one invalidation hit the region before the event was read (2010
    /// `UMMUNOTIFY_EVENT_FLAG_HINT`).
    pub hint: bool,
}

impl Event {
    /// The reported range.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.end
    }
}

/// Per-region pending state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    /// 0: nothing pending; 1: one invalidation (hint valid); 2: more than one.
    pub hits: u8,
    pub hint_start: u64,
    pub hint_end: u64,
}

impl Pending {
    /// Records an invalidation of `[start, end)` on the region `[rs, re)` (they overlap).
    /// Returns true if the region was not pending before (the caller must queue it).
    pub(crate) fn hit(&mut self, rs: u64, re: u64, start: u64, end: u64) -> bool {
        match self.hits {
            0 => {
                self.hits = 1;
                self.hint_start = start.max(rs);
                self.hint_end = end.min(re);
                true
            }
            _ => {
                self.hits = 2;
                self.hint_start = rs;
                self.hint_end = re;
                false
            }
        }
    }

    /// Whether an event is pending.
    pub(crate) fn is_pending(&self) -> bool {
        self.hits != 0
    }

    /// Takes the pending event (re-arming the region) as `(start, end, hint)`.
    pub(crate) fn take(&mut self) -> (u64, u64, bool) {
        let r = (self.hint_start, self.hint_end, self.hits == 1);
        *self = Pending::default();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_rules() {
        let mut p = Pending::default();
        assert!(p.hit(100, 200, 0, 150));
        assert_eq!(p.take(), (100, 150, true));
        assert!(!p.is_pending());
        assert!(p.hit(100, 200, 120, 130));
        assert!(!p.hit(100, 200, 150, 160));
        assert_eq!(p.take(), (100, 200, false));
    }
}
