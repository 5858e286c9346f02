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

/// The pending-event bits of a region's validity word (see `notifier::Slot`): set only together
/// with `INVALID`, by `fetch_or` on the event path, so a valid word never has them.
///
/// At least one invalidation hit the region since its event was last read.
pub(crate) const PENDING: u64 = 1 << 1;
/// More than one did (no hint: the event reports the whole region).
pub(crate) const MANY: u64 = 1 << 2;

/// Granule of [`Hint`]: every Linux page size is a multiple of it, and every invalidation the
/// kernel reports is page-aligned.
const GRANULE: u64 = 4096;

/// The hint of a region's pending event in 8 bytes: the one invalidation's range, clipped to
/// the region, as 4 KiB granules counted from the granule of the region's start.
///
/// Invalidations are page ranges, so nothing is lost; an unaligned range is rounded out to
/// granules first (what the kernel unmaps anyway). Offsets past 16 TiB saturate, which only
/// widens the hint of a region larger than that towards its own bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hint {
    lo: u32,
    hi: u32,
}

impl Hint {
    /// The hint for an invalidation of `[start, end)` on the region `[rs, re)` (they overlap).
    fn clip(rs: u64, start: u64, end: u64) -> Hint {
        let base = rs / GRANULE;
        let granules = |a: u64| u32::try_from(a.saturating_sub(base)).unwrap_or(u32::MAX);
        Hint {
            lo: granules(start / GRANULE),
            hi: granules(end.div_ceil(GRANULE)),
        }
    }

    /// The hint as an address range inside `[rs, re)`.
    fn range(self, rs: u64, re: u64) -> (u64, u64) {
        let base = rs / GRANULE;
        let at = |g: u32| (base + u64::from(g)).saturating_mul(GRANULE);
        let hi = if self.hi == u32::MAX { re } else { at(self.hi) };
        (at(self.lo).max(rs), hi.min(re))
    }
}

/// Records an invalidation of `[start, end)` on the region `[rs, re)` whose word has the event
/// bits `bits`: returns the bits to set and whether the region was not pending before (the
/// caller must queue it). At most one pending event per region, with the 2010 hint rules.
#[inline]
pub(crate) fn hit(bits: u64, hint: &mut Hint, rs: u64, start: u64, end: u64) -> (u64, bool) {
    if bits & PENDING == 0 {
        *hint = Hint::clip(rs, start, end);
        (PENDING, true)
    } else {
        (MANY, false)
    }
}

/// The pending event of a region with event bits `bits` as `(start, end, hint)`.
pub(crate) fn take(bits: u64, hint: Hint, rs: u64, re: u64) -> (u64, u64, bool) {
    if bits & MANY != 0 {
        (rs, re, false)
    } else {
        let (s, e) = hint.range(rs, re);
        (s, e, true)
    }
}

/// Per-region pending state on its own (the fuzz harness's view of the same rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    bits: u64,
    hint: Hint,
}

// Only the fuzz harness uses the stand-alone form.
#[cfg_attr(not(any(test, feature = "fuzzing")), allow(dead_code))]
impl Pending {
    /// Records an invalidation of `[start, end)` on the region `[rs, re)` (they overlap).
    /// Returns true if the region was not pending before (the caller must queue it).
    pub(crate) fn hit(&mut self, rs: u64, _re: u64, start: u64, end: u64) -> bool {
        let (set, newly) = hit(self.bits, &mut self.hint, rs, start, end);
        self.bits |= set;
        newly
    }

    /// Whether an event is pending.
    pub(crate) fn is_pending(&self) -> bool {
        self.bits & PENDING != 0
    }

    /// Takes the pending event (re-arming the region) as `(start, end, hint)`.
    pub(crate) fn take(&mut self, rs: u64, re: u64) -> (u64, u64, bool) {
        let r = take(self.bits, self.hint, rs, re);
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
        let (rs, re) = (100, 3 * 4096 + 100);
        assert!(p.hit(rs, re, 0, 4096));
        assert_eq!(p.take(rs, re), (100, 4096, true));
        assert!(!p.is_pending());
        assert!(p.hit(rs, re, 4096, 2 * 4096));
        assert_eq!(p.take(rs, re), (4096, 2 * 4096, true));
        assert!(p.hit(rs, re, 2 * 4096, 8 * 4096));
        assert!(!p.hit(rs, re, 4096, 2 * 4096));
        assert_eq!(p.take(rs, re), (rs, re, false));
        // Unaligned invalidations round out to granules.
        assert!(p.hit(rs, re, 4097, 4098));
        assert_eq!(p.take(rs, re), (4096, 2 * 4096, true));
        // Far beyond 16 TiB: saturates towards the region's own bounds.
        let big = (0, 1u64 << 50);
        assert!(p.hit(big.0, big.1, 1 << 49, (1 << 49) + 4096));
        assert_eq!(p.take(big.0, big.1), ((1 << 44) - 4096, 1 << 50, true));
    }
}
