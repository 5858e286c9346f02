//! `Coverage`: the refcounted union of page ranges registered with the kernel.
//!
//! Every region adds its (page-rounded) range once; a page is registered with userfaultfd while
//! at least one region covers it. `add` reports exactly the ranges whose count goes 0 → 1 (to
//! register) and `remove` those whose count goes 1 → 0 (to unregister), so overlapping and
//! adjacent regions share one registration and memory outside every region is never touched.
//!
//! Runs under the registry lock only (user threads), so it may allocate.

use crate::sorted_map::SortedMap;

/// Every Linux page size is a multiple of this; ranges must be aligned to it at least.
const MIN_PAGE_SIZE: u64 = 4096;

/// Page ranges an operation reports, sorted: up to [`INLINE`] in place, more on the heap.
///
/// A cache miss on fresh memory adds one range to three coverages (the registry's, the
/// watcher's, the context's) and asks one for its gaps; each answer is one range. A `Vec` for
/// each was a `malloc`/`free` pair apiece on every miss (issue 23).
#[derive(Clone, Default)]
pub(crate) struct Ranges {
    inline: [(u64, u64); INLINE],
    len: usize,
    /// Every range, once there are more than [`INLINE`] (then `inline` is unused).
    spill: Vec<(u64, u64)>,
}

/// Ranges a [`Ranges`] holds without allocating.
const INLINE: usize = 4;

impl Ranges {
    fn one(start: u64, end: u64) -> Ranges {
        let mut r = Ranges::default();
        r.push((start, end));
        r
    }

    pub(crate) fn push(&mut self, range: (u64, u64)) {
        if self.spill.is_empty() && self.len < INLINE {
            self.inline[self.len] = range;
            self.len += 1;
            return;
        }
        if self.spill.is_empty() {
            self.spill.extend_from_slice(&self.inline[..self.len]);
        }
        self.spill.push(range);
    }

    /// The last range, to extend in place.
    fn last_mut(&mut self) -> Option<&mut (u64, u64)> {
        if self.spill.is_empty() {
            self.inline[..self.len].last_mut()
        } else {
            self.spill.last_mut()
        }
    }
}

impl std::ops::Deref for Ranges {
    type Target = [(u64, u64)];
    fn deref(&self) -> &[(u64, u64)] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl std::fmt::Debug for Ranges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Ranges {
    fn eq(&self, other: &Ranges) -> bool {
        **self == **other
    }
}

impl PartialEq<Vec<(u64, u64)>> for Ranges {
    fn eq(&self, other: &Vec<(u64, u64)>) -> bool {
        **self == **other
    }
}

/// The ranges of a [`Ranges`], by value.
pub(crate) struct RangesIter {
    ranges: Ranges,
    next: usize,
}

impl Iterator for RangesIter {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        let r = self.ranges.get(self.next).copied();
        self.next += 1;
        r
    }
}

impl IntoIterator for Ranges {
    type Item = (u64, u64);
    type IntoIter = RangesIter;
    fn into_iter(self) -> RangesIter {
        RangesIter {
            ranges: self,
            next: 0,
        }
    }
}

/// A run of pages `[key, end)` that all have the same non-zero count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    /// One past the last address of the run.
    end: u64,
    /// Number of regions covering every page of the run (never 0).
    count: u32,
}

/// Refcounted union of page ranges.
///
/// Stored as disjoint runs keyed by start address; pages with count 0 are not stored, and
/// adjacent runs always have different counts (equal ones are merged), so the representation of
/// a given per-page count function is unique and `segments()` is as small as it can be.
#[derive(Clone, Debug, Default)]
pub(crate) struct Coverage {
    /// Runs keyed by start address.
    runs: SortedMap<Segment>,
}

impl Coverage {
    /// Empty coverage: every page has count 0.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds 1 to the count of every page in `[start, end)` (page-aligned, `start < end`).
    ///
    /// Returns the maximal ranges whose count went 0 → 1, sorted: these must be registered with
    /// the kernel. O(log n + runs touched).
    pub(crate) fn add(&mut self, start: u64, end: u64) -> Ranges {
        debug_assert_valid(start, end);
        if start >= end {
            return Ranges::default();
        }
        if self.add_isolated(start, end) {
            return Ranges::one(start, end);
        }
        self.split_at(start);
        self.split_at(end);
        let mut gaps = Ranges::default();
        let mut pos = start;
        for (&s, run) in self.runs.range_mut(start..end) {
            if pos < s {
                gaps.push((pos, s));
            }
            // A count is bounded by the number of live regions, which is below `u32::MAX`
            // (region ids are `u32` and `u32::MAX` is reserved).
            run.count += 1;
            pos = run.end;
        }
        if pos < end {
            gaps.push((pos, end));
        }
        for &(s, e) in gaps.iter() {
            self.runs.insert(s, Segment { end: e, count: 1 });
        }
        self.coalesce(start, end);
        gaps
    }

    /// Subtracts 1 from the count of every page in `[start, end)`, which must have been added.
    ///
    /// Returns the maximal ranges whose count went 1 → 0, sorted: these must be unregistered.
    /// `add(s, e)` immediately followed by `remove(s, e)` returns the same ranges as the `add`,
    /// and restores the previous state (rollback). Pages of the range with count 0 (a caller
    /// bug, caught by a debug assertion) are left at 0. O(log n + runs touched).
    pub(crate) fn remove(&mut self, start: u64, end: u64) -> Ranges {
        debug_assert_valid(start, end);
        if start >= end {
            return Ranges::default();
        }
        if self.remove_from_single(start, end) {
            return Ranges::one(start, end);
        }
        self.split_at(start);
        self.split_at(end);
        let mut freed = Ranges::default();
        let mut emptied: Vec<u64> = Vec::new();
        let mut pos = start;
        for (&s, run) in self.runs.range_mut(start..end) {
            debug_assert_eq!(pos, s, "removing [{pos:#x}, {s:#x}), which was never added");
            pos = run.end;
            if run.count > 1 {
                run.count -= 1;
                continue;
            }
            emptied.push(s);
            match freed.last_mut() {
                Some(last) if last.1 == s => last.1 = run.end,
                _ => freed.push((s, run.end)),
            }
        }
        debug_assert_eq!(
            pos, end,
            "removing [{pos:#x}, {end:#x}), which was never added"
        );
        for s in emptied {
            self.runs.remove(&s);
        }
        self.coalesce(start, end);
        freed
    }

    /// Adds 1 to the count of the pages of `[start, end)` that have count 0, and returns them
    /// (sorted, maximal): `add` for a coverage used as a set. On untouched pages (a miss on new
    /// memory) one lookup fewer than `uncovered` followed by `add`.
    pub(crate) fn fill(&mut self, start: u64, end: u64) -> Ranges {
        debug_assert_valid(start, end);
        if start >= end {
            return Ranges::default();
        }
        if self.add_isolated(start, end) {
            return Ranges::one(start, end);
        }
        let gaps = self.uncovered(start, end);
        for &(s, e) in gaps.iter() {
            self.add(s, e);
        }
        gaps
    }

    /// The parts of `[start, end)` with count 0 (not covered), sorted and maximal.
    pub(crate) fn uncovered(&self, start: u64, end: u64) -> Ranges {
        let mut out = Ranges::default();
        if start >= end {
            return out;
        }
        if self.untouched(start, end) {
            out.push((start, end));
            return out;
        }
        let mut pos = start;
        if let Some((_, run)) = self.runs.range(..start).next_back() {
            pos = pos.max(run.end);
        }
        for (&s, run) in self.runs.range(start..end) {
            if pos < s {
                out.push((pos, s));
            }
            pos = pos.max(run.end);
        }
        if pos < end {
            out.push((pos, end));
        }
        out
    }

    /// The parts of `[start, end)` with a count above 0, sorted and maximal: what `fill` added
    /// there, for a coverage used as a set.
    pub(crate) fn covered(&self, start: u64, end: u64) -> Ranges {
        let mut out = Ranges::default();
        self.for_each_covered(start, end, |s, e| out.push((s, e)));
        out
    }

    /// Calls `f(s, e)` for each maximal covered (count > 0) part of `[start, end)`, in order.
    /// No allocation.
    pub(crate) fn for_each_covered(&self, start: u64, end: u64, mut f: impl FnMut(u64, u64)) {
        let mut part: Option<(u64, u64)> = None;
        let before = self.runs.range(..start).next_back();
        for (&s, run) in before.into_iter().chain(self.runs.range(start..end)) {
            let (s, e) = (s.max(start), run.end.min(end));
            if s >= e {
                continue;
            }
            part = match part {
                Some((ps, pe)) if pe == s => Some((ps, e)),
                Some((ps, pe)) => {
                    f(ps, pe);
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((s, e)) = part {
            f(s, e);
        }
    }

    /// Number of stored runs (for tests and statistics).
    pub(crate) fn segments(&self) -> usize {
        self.runs.len()
    }

    /// Bytes covered (count > 0). O(n).
    pub(crate) fn bytes(&self) -> u64 {
        self.runs.iter().map(|(&s, run)| run.end - s).sum()
    }

    /// Whether no page of `[start, end)` is covered (one lookup: the last run that starts
    /// before `end` must end by `start`).
    fn untouched(&self, start: u64, end: u64) -> bool {
        self.runs
            .around(end)
            .0
            .is_none_or(|(_, run)| run.end <= start)
    }

    /// `add` when no page of `[start, end)` is covered, the case of a new region on memory no
    /// other region holds: one run of count 1 is inserted, merged with a count-1 run it touches
    /// on either side. Returns false (nothing done) otherwise. A few lookups instead of the
    /// general path's split, walk and coalescing (a miss of the cache paid ~10,000 instructions
    /// in coverage before this: issue 23).
    fn add_isolated(&mut self, start: u64, end: u64) -> bool {
        // The last run starting below `end` and the first from it, in one search.
        let (before, after, gap) = self.runs.around_gap(end);
        let before = before.map(|(s, &r)| (s, r));
        if before.is_some_and(|(_, r)| r.end > start) {
            return false;
        }
        // Only a run starting exactly at `end` can merge.
        let after = after.filter(|&(s, _)| s == end).map(|(_, &r)| r);
        let (mut s, mut e) = (start, end);
        if let Some((ps, p)) = before {
            if p.end == start && p.count == 1 {
                s = ps;
                self.runs.remove(&ps);
            }
        }
        if let Some(n) = after {
            if n.count == 1 {
                e = n.end;
                self.runs.remove(&end);
            }
        }
        // Where the search left off, when nothing merged (the gap's neighbours are checked).
        self.runs.insert_in(gap, s, Segment { end: e, count: 1 });
        true
    }

    /// `remove` when `[start, end)` lies in one run of count 1 (the pages of one region no other
    /// region shares): the run loses those pages. Its neighbours never have count 1 (runs are
    /// maximal), so nothing needs merging. Returns false (nothing done) otherwise.
    fn remove_from_single(&mut self, start: u64, end: u64) -> bool {
        // The run starting at or before `start`.
        let (below, above) = self.runs.around(start);
        let Some((s, run)) = above
            .filter(|&(s, _)| s == start)
            .or(below)
            .map(|(s, &r)| (s, r))
        else {
            return false;
        };
        if run.count != 1 || run.end < end {
            return false;
        }
        if s < start {
            self.runs.insert(
                s,
                Segment {
                    end: start,
                    count: 1,
                },
            );
        } else {
            self.runs.remove(&s);
        }
        if end < run.end {
            self.runs.insert(
                end,
                Segment {
                    end: run.end,
                    count: 1,
                },
            );
        }
        true
    }

    /// Splits the run containing `at` strictly inside it into `[s, at)` and `[at, e)`.
    fn split_at(&mut self, at: u64) {
        let Some((_, run)) = self.runs.range_mut(..at).next_back() else {
            return;
        };
        if run.end <= at {
            return;
        }
        let tail = Segment {
            end: run.end,
            count: run.count,
        };
        run.end = at;
        self.runs.insert(at, tail);
    }

    /// Merges adjacent runs with equal counts from the run just before `start` through the run
    /// starting at `end` (the only places an `add`/`remove` of `[start, end)` can create them).
    fn coalesce(&mut self, start: u64, end: u64) {
        let first = self
            .runs
            .range(..start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        let keys: Vec<u64> = self.runs.range(first..=end).map(|(&s, _)| s).collect();
        let mut keys = keys.into_iter();
        let Some(mut cur) = keys.next() else {
            return;
        };
        for k in keys {
            // Every collected key is present: only keys already passed are removed.
            let (Some(&next), Some(&acc)) = (self.runs.get(&k), self.runs.get(&cur)) else {
                continue;
            };
            if acc.end == k && acc.count == next.count {
                self.runs.remove(&k);
                self.runs.insert(
                    cur,
                    Segment {
                        end: next.end,
                        count: acc.count,
                    },
                );
            } else {
                cur = k;
            }
        }
    }

    /// Checks the representation invariants; panics on the first violation.
    #[cfg(test)]
    fn check_invariants(&self) {
        let mut prev: Option<(u64, Segment)> = None;
        for (&s, &run) in self.runs.iter() {
            assert!(s < run.end, "empty run at {s:#x}");
            assert!(run.count > 0, "zero-count run at {s:#x}");
            if let Some((_, p)) = prev {
                assert!(p.end <= s, "overlapping runs at {s:#x}");
                assert!(
                    p.end < s || p.count != run.count,
                    "unmerged equal runs at {s:#x}"
                );
            }
            prev = Some((s, run));
        }
    }
}

/// Debug-checks that `[start, end)` is a non-empty, page-aligned range.
#[inline]
fn debug_assert_valid(start: u64, end: u64) {
    debug_assert!(start < end, "empty range [{start:#x}, {end:#x})");
    debug_assert!(
        start % MIN_PAGE_SIZE == 0 && end % MIN_PAGE_SIZE == 0,
        "unaligned range [{start:#x}, {end:#x})"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_spill_past_the_inline_ones_in_order() {
        let mut r = Ranges::default();
        let want: Vec<(u64, u64)> = (0..7).map(|i| (i * 10, i * 10 + 5)).collect();
        for (i, &x) in want.iter().enumerate() {
            r.push(x);
            assert_eq!(&*r, &want[..=i]);
        }
        *r.last_mut().unwrap() = (60, 70);
        assert_eq!(r.last(), Some(&(60, 70)));
        assert_eq!(r.clone().into_iter().count(), 7);
        assert_eq!(Ranges::default().into_iter().next(), None);
    }

    #[test]
    fn covered_parts() {
        let p = MIN_PAGE_SIZE;
        let mut c = Coverage::new();
        c.add(p, 4 * p);
        c.add(2 * p, 3 * p); // a run with count 2 inside: still one covered part
        c.add(6 * p, 8 * p);
        let mut parts = Vec::new();
        c.for_each_covered(0, 10 * p, |s, e| parts.push((s, e)));
        assert_eq!(parts, [(p, 4 * p), (6 * p, 8 * p)]);
        parts.clear();
        c.for_each_covered(2 * p, 7 * p, |s, e| parts.push((s, e)));
        assert_eq!(parts, [(2 * p, 4 * p), (6 * p, 7 * p)]);
        parts.clear();
        c.for_each_covered(4 * p, 6 * p, |s, e| parts.push((s, e)));
        assert!(parts.is_empty());
    }
    use proptest::prelude::*;
    use std::collections::HashMap;

    const PAGE: u64 = MIN_PAGE_SIZE;

    /// Maximal runs of pages in `[start, end)` (page numbers) satisfying `pred`, as addresses.
    fn runs_where(start: u64, end: u64, pred: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for p in start..end {
            if pred(p) {
                match out.last_mut() {
                    Some(last) if last.1 == p * PAGE => last.1 = (p + 1) * PAGE,
                    _ => out.push((p * PAGE, (p + 1) * PAGE)),
                }
            }
        }
        out
    }

    /// Minimal number of runs for the model's counts.
    fn model_segments(model: &HashMap<u64, u32>, pages: u64) -> usize {
        let mut n = 0;
        let mut prev = 0;
        for p in 0..pages {
            let c = model.get(&p).copied().unwrap_or(0);
            if c != 0 && c != prev {
                n += 1;
            }
            prev = c;
        }
        n
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn matches_per_page_model(
            ops in prop::collection::vec((any::<bool>(), 0u64..64, 1u64..16, any::<usize>()), 1..200),
            queries in prop::collection::vec((0u64..80, 0u64..30), 1..10),
        ) {
            const PAGES: u64 = 80;
            let mut cov = Coverage::new();
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut added: Vec<(u64, u64)> = Vec::new();
            for (is_add, first, len, sel) in ops {
                if is_add || added.is_empty() {
                    let (s, e) = (first, first + len);
                    let want = runs_where(s, e, |p| !model.contains_key(&p));
                    for p in s..e {
                        *model.entry(p).or_insert(0) += 1;
                    }
                    let got = cov.add(s * PAGE, e * PAGE);
                    prop_assert_eq!(got, want);
                    added.push((s, e));
                } else {
                    let (s, e) = added.swap_remove(sel % added.len());
                    let want = runs_where(s, e, |p| model[&p] == 1);
                    for p in s..e {
                        let c = model.get_mut(&p).unwrap();
                        *c -= 1;
                        if *c == 0 {
                            model.remove(&p);
                        }
                    }
                    let got = cov.remove(s * PAGE, e * PAGE);
                    prop_assert_eq!(got, want);
                }
                cov.check_invariants();
                prop_assert_eq!(cov.segments(), model_segments(&model, PAGES));
                for &(qs, ql) in &queries {
                    let want = runs_where(qs, qs + ql, |p| !model.contains_key(&p));
                    prop_assert_eq!(cov.uncovered(qs * PAGE, (qs + ql) * PAGE), want);
                }
            }
        }

        /// `fill` is a set's insert: a page's count goes 0 → 1 and never higher; what it returns
        /// is what it filled.
        #[test]
        fn fill_is_a_set_insert(ops in prop::collection::vec((0u64..64, 1u64..16), 1..100)) {
            let mut cov = Coverage::new();
            let mut model = std::collections::HashSet::new();
            for (s, len) in ops {
                let e = s + len;
                let want = runs_where(s, e, |p| !model.contains(&p));
                model.extend(s..e);
                prop_assert_eq!(cov.fill(s * PAGE, e * PAGE), want);
                cov.check_invariants();
                prop_assert!(cov.runs.values().all(|r| r.count == 1));
                let missing = runs_where(0, 80, |p| !model.contains(&p));
                prop_assert_eq!(cov.uncovered(0, 80 * PAGE), missing);
            }
        }

        #[test]
        fn add_then_remove_is_rollback(
            setup in prop::collection::vec((0u64..64, 1u64..16), 0..20),
            s in 0u64..64,
            len in 1u64..16,
        ) {
            let mut cov = Coverage::new();
            for (first, l) in setup {
                cov.add(first * PAGE, (first + l) * PAGE);
            }
            let before: Vec<_> = cov.runs.iter().map(|(&k, &v)| (k, v)).collect();
            let added = cov.add(s * PAGE, (s + len) * PAGE);
            let removed = cov.remove(s * PAGE, (s + len) * PAGE);
            prop_assert_eq!(added, removed);
            let after: Vec<_> = cov.runs.iter().map(|(&k, &v)| (k, v)).collect();
            prop_assert_eq!(before, after);
        }
    }

    #[test]
    fn overlapping_regions_share_registration() {
        let mut cov = Coverage::new();
        assert_eq!(cov.add(0, 4 * PAGE), vec![(0, 4 * PAGE)]);
        assert_eq!(cov.add(2 * PAGE, 6 * PAGE), vec![(4 * PAGE, 6 * PAGE)]);
        assert_eq!(cov.add(0, 8 * PAGE), vec![(6 * PAGE, 8 * PAGE)]);
        assert_eq!(cov.uncovered(0, 10 * PAGE), vec![(8 * PAGE, 10 * PAGE)]);
        assert_eq!(cov.remove(0, 8 * PAGE), vec![(6 * PAGE, 8 * PAGE)]);
        assert_eq!(cov.remove(0, 4 * PAGE), vec![(0, 2 * PAGE)]);
        assert_eq!(cov.remove(2 * PAGE, 6 * PAGE), vec![(2 * PAGE, 6 * PAGE)]);
        assert_eq!(cov.segments(), 0);
        assert_eq!(cov.uncovered(PAGE, 3 * PAGE), vec![(PAGE, 3 * PAGE)]);
    }

    #[test]
    fn adjacent_single_pages_collapse() {
        let n: u64 = 1_000_000;
        let mut cov = Coverage::new();
        for p in 0..n {
            let got = cov.add(p * PAGE, (p + 1) * PAGE);
            assert_eq!(got, vec![(p * PAGE, (p + 1) * PAGE)]);
        }
        assert_eq!(cov.segments(), 1);
        assert!(cov.uncovered(0, n * PAGE).is_empty());
        assert_eq!(cov.remove(0, n * PAGE), vec![(0, n * PAGE)]);
        assert_eq!(cov.segments(), 0);
    }
}
