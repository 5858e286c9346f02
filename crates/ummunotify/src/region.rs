//! Regions: what a caller registers, and the token that checks one in O(1).
use std::fmt;
use std::ops::Range;

use crate::{Error, Result};

/// The caller's 64-bit name for a region, unique within one notifier (as in the 2010 ABI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Cookie(pub u64);

impl From<u64> for Cookie {
    fn from(v: u64) -> Cookie {
        Cookie(v)
    }
}

impl fmt::Display for Cookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A token for one registered region, returned by [`Notifier::register`](crate::Notifier::register).
///
/// [`Notifier::is_valid`](crate::Notifier::is_valid) checks it with two loads. A token taken
/// before an invalidation never reads valid again, even after the region is re-armed by reading
/// its event: ask [`Notifier::region`](crate::Notifier::region) for a fresh token then.
///
/// After a re-arm while some of the region's pages are unmapped, a fresh token of a
/// [`register`](crate::Notifier::register) region reads invalid (the memory it was registered
/// for is gone) until a later re-arm finds all its pages mapped; one of a
/// [`register_any`](crate::Notifier::register_any) region reads valid (nothing mapped there has
/// changed since). Either region keeps reporting events (see
/// [`Notifier::read_events`](crate::Notifier::read_events)).
///
/// A token means something only to the notifier that issued it; checking it against another
/// notifier is never unsafe, but its answer is meaningless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub(crate) slot: u32,
    pub(crate) expected: u64,
}

impl Region {
    /// The token as two integers, for foreign-function interfaces (the C API's
    /// `ummunotify_region`). Only meaningful to [`Region::from_raw`] on the same notifier.
    pub fn to_raw(self) -> (u32, u64) {
        (self.slot, self.expected)
    }

    /// Rebuilds a token from [`Region::to_raw`]. A forged value is harmless: checking it never
    /// touches memory outside the notifier's slot table, it only answers for whatever slot it
    /// names (false for a slot that does not exist).
    pub fn from_raw(slot: u32, expected: u64) -> Region {
        Region { slot, expected }
    }
}

/// The low bit of a slot's validity word.
pub(crate) const INVALID: u64 = 1;

/// A validated caller range plus its page-rounded cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// The region as the caller gave it: events and hits use this.
    pub start: u64,
    pub end: u64,
    /// The pages watched for it: its own pages rounded out, or, over the notifier's VMA budget,
    /// the whole VMAs they lie in (see `notifier::WatchBudget`). Coverage counts these.
    pub watch_start: u64,
    pub watch_end: u64,
}

impl Span {
    /// Validates `range` (guarantee 5: empty and wrapping ranges are typed errors).
    pub(crate) fn new(range: Range<usize>, page: usize) -> Result<Span> {
        if range.end == range.start {
            return Err(Error::EmptyRange);
        }
        if range.end < range.start {
            return Err(Error::WrappingRange);
        }
        let page = page as u64;
        let (start, end) = (range.start as u64, range.end as u64);
        let watch_start = start & !(page - 1);
        let watch_end = end.checked_add(page - 1).ok_or(Error::WrappingRange)? & !(page - 1);
        Ok(Span {
            start,
            end,
            watch_start,
            watch_end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert!(matches!(Span::new(5..5, 4096), Err(Error::EmptyRange)));
        #[allow(clippy::reversed_empty_ranges)]
        let r = 10..5;
        assert!(matches!(Span::new(r, 4096), Err(Error::WrappingRange)));
        assert!(matches!(
            Span::new(usize::MAX - 10..usize::MAX, 4096),
            Err(Error::WrappingRange)
        ));
        let s = Span::new(4100..8200, 4096).unwrap();
        assert_eq!((s.watch_start, s.watch_end), (4096, 12288));
        let s = Span::new(4096..8192, 4096).unwrap();
        assert_eq!((s.watch_start, s.watch_end), (4096, 8192));
    }
}
