//! `SortedMap`: an ordered map from `u64` keys, as a sorted list of short sorted leaves.
//!
//! The coverage maps a miss updates (the registry's page counts, the userfaultfd watcher's page
//! set) each do a predecessor search, an exact search and an insertion per miss. On `BTreeMap`
//! those took ~1,100 instructions a coverage (issue 23): every search walks three or four
//! levels of nodes, and `range` finds both of its edges. Here a search is a binary search over
//! the leaves' first keys (one contiguous array) and one over a leaf: about half the time, warm
//! or cold (fewer cache lines). An insertion where a search just looked
//! ([`SortedMap::insert_in`] with the search's [`Gap`]) skips its own search: one search a
//! coverage per miss (~95 instructions each saved).
//!
//! The price is the one a two-level structure pays: splitting or dropping a leaf moves the
//! leaf list, 32 bytes a leaf, once per ~[`CAP`] / 2 insertions. That stays small while the map
//! is no bigger than the process's VMA count, which bounds a coverage (its runs are watched
//! ranges, exact only under the VMA budget); it is why the cache's own index, which may hold a
//! million regions, is not one of these.
//!
//! Runs under the registry lock or a watcher's lock (user threads), so it may allocate.

use std::ops::{Bound, RangeBounds};

/// Most entries in a leaf; one more splits it.
const CAP: usize = 64;

/// A leaf whose size falls below this after a removal is merged with its neighbour when the two
/// fit in [`MERGED`] entries.
const LOW: usize = CAP / 4;

/// Most entries a merge may produce (room left, so the next insertions do not split it again).
const MERGED: usize = CAP * 3 / 4;

/// An ordered map from `u64` keys to `V`, see the module documentation.
///
/// Invariants: no leaf is empty; every key of leaf `i` is below every key of leaf `i + 1`;
/// `firsts[i]` is leaf `i`'s first key.
#[derive(Clone, Debug)]
pub(crate) struct SortedMap<V> {
    firsts: Vec<u64>,
    leaves: Vec<Vec<(u64, V)>>,
    len: usize,
}

impl<V> Default for SortedMap<V> {
    fn default() -> Self {
        SortedMap {
            firsts: Vec::new(),
            leaves: Vec::new(),
            len: 0,
        }
    }
}

/// The place between two neighbouring entries a search found: see [`SortedMap::around_gap`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gap(Place);

/// A key and a reference to its value.
pub(crate) type Entry<'a, V> = (u64, &'a V);

/// A place between entries: before entry `pos` of leaf `leaf` (`pos` may be the leaf's length:
/// the place after its last entry, the same as before the next leaf's first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    leaf: usize,
    pos: usize,
}

impl<V> SortedMap<V> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The leaf that holds `key` if anything does: the last whose first key is at most `key`
    /// (leaf 0 for keys below every first key). Only for a non-empty map.
    fn leaf_for(&self, key: u64) -> usize {
        self.firsts.partition_point(|&f| f <= key).saturating_sub(1)
    }

    /// The place before the first entry whose key is `>= key` (`strict`: `> key`).
    fn place_after(&self, key: u64, strict: bool) -> Place {
        let (Some(first), Some(last)) = (self.leaves.first(), self.leaves.last()) else {
            return Place { leaf: 0, pos: 0 };
        };
        // Past either end without a search: addresses handed out in order (mmap's top-down
        // placement, an arena's bump) make every new region's key one of these.
        if last[last.len() - 1].0 < key {
            return self.end();
        }
        if first[0].0 > key {
            return Place { leaf: 0, pos: 0 };
        }
        let leaf = self.leaf_for(key);
        let pos =
            self.leaves[leaf].partition_point(|&(k, _)| if strict { k <= key } else { k < key });
        Place { leaf, pos }
    }

    /// The end place: after the last entry.
    fn end(&self) -> Place {
        match self.leaves.len() {
            0 => Place { leaf: 0, pos: 0 },
            n => Place {
                leaf: n - 1,
                pos: self.leaves[n - 1].len(),
            },
        }
    }

    /// The places bounding the entries with keys in `range`, `from <= to` (an empty range of
    /// places when the bounds cross).
    fn places(&self, range: &impl RangeBounds<u64>) -> (Place, Place) {
        let from = match range.start_bound() {
            Bound::Unbounded => Place { leaf: 0, pos: 0 },
            Bound::Included(&k) => self.place_after(k, false),
            Bound::Excluded(&k) => self.place_after(k, true),
        };
        let to = match range.end_bound() {
            Bound::Unbounded => self.end(),
            Bound::Included(&k) => self.place_after(k, true),
            Bound::Excluded(&k) => self.place_after(k, false),
        };
        // Normalised so that "after leaf i" and "before leaf i + 1" compare equal.
        let norm = |p: Place| match self.leaves.get(p.leaf) {
            Some(l) if p.pos == l.len() && p.leaf + 1 < self.leaves.len() => Place {
                leaf: p.leaf + 1,
                pos: 0,
            },
            _ => p,
        };
        let (from, to) = (norm(from), norm(to));
        (from, to.max(from))
    }

    /// The entries with keys in `range`, in key order (double-ended).
    pub(crate) fn range(
        &self,
        range: impl RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        let (from, to) = self.places(&range);
        let leaves = self.leaves.get(from.leaf..=to.leaf).unwrap_or(&[]);
        leaves.iter().enumerate().flat_map(move |(d, leaf)| {
            let i = from.leaf + d;
            let s = if i == from.leaf { from.pos } else { 0 };
            let e = if i == to.leaf { to.pos } else { leaf.len() };
            leaf[s..e].iter().map(|(k, v)| (k, v))
        })
    }

    /// As [`range`](Self::range), with the values mutable.
    pub(crate) fn range_mut(
        &mut self,
        range: impl RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = (&u64, &mut V)> {
        let (from, to) = self.places(&range);
        let leaves = self.leaves.get_mut(from.leaf..=to.leaf).unwrap_or(&mut []);
        leaves.iter_mut().enumerate().flat_map(move |(d, leaf)| {
            let i = from.leaf + d;
            let s = if i == from.leaf { from.pos } else { 0 };
            let e = if i == to.leaf { to.pos } else { leaf.len() };
            leaf[s..e].iter_mut().map(|(k, v)| (&*k, v))
        })
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        self.range(..)
    }

    /// Every value, in key order.
    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// The last entry with a key below `key` and the first with a key at or above it: a
    /// predecessor and a successor in one search.
    pub(crate) fn around(&self, key: u64) -> (Option<Entry<'_, V>>, Option<Entry<'_, V>>) {
        let (below, above, _) = self.around_gap(key);
        (below, above)
    }

    /// As [`around`](Self::around), with the gap between the two, where
    /// [`insert_in`](Self::insert_in) can put a key that lies in it without searching again.
    pub(crate) fn around_gap(&self, key: u64) -> (Option<Entry<'_, V>>, Option<Entry<'_, V>>, Gap) {
        let place = self.place_after(key, false);
        let Place { leaf: i, pos } = place;
        let Some(leaf) = self.leaves.get(i) else {
            return (None, None, Gap(place));
        };
        let below = match pos {
            // Leaf `i` starts at `key` (or above it, when it is leaf 0): the one before ends
            // below it.
            0 => i
                .checked_sub(1)
                .and_then(|j| self.leaves[j].last())
                .map(|(k, v)| (*k, v)),
            p => Some((leaf[p - 1].0, &leaf[p - 1].1)),
        };
        let above = match leaf.get(pos) {
            Some((k, v)) => Some((*k, v)),
            None => self.leaves.get(i + 1).map(|l| (l[0].0, &l[0].1)),
        };
        (below, above, Gap(place))
    }

    /// Puts `value` at `key`, which lies in `gap` if the map has not changed since the search
    /// that found it (checked: the entries on either side of the gap must bracket `key`, else
    /// this searches as [`insert`](Self::insert) does); returns the value it replaced.
    pub(crate) fn insert_in(&mut self, gap: Gap, key: u64, value: V) -> Option<V> {
        let Place { leaf: i, pos } = gap.0;
        let fits = self.leaves.get(i).is_some_and(|leaf| {
            let below = match pos.checked_sub(1) {
                Some(p) => leaf.get(p).map(|e| e.0),
                None => i
                    .checked_sub(1)
                    .and_then(|j| self.leaves[j].last())
                    .map(|e| e.0),
            };
            let above = match leaf.get(pos) {
                Some(e) => Some(e.0),
                None => self.leaves.get(i + 1).map(|l| l[0].0),
            };
            pos <= leaf.len() && below.is_none_or(|b| b < key) && above.is_none_or(|a| key < a)
        });
        if !fits {
            return self.insert(key, value);
        }
        self.insert_new(i, pos, key, value);
        None
    }

    /// The value at `key`.
    pub(crate) fn get(&self, key: &u64) -> Option<&V> {
        if self.leaves.is_empty() {
            return None;
        }
        let leaf = &self.leaves[self.leaf_for(*key)];
        let pos = leaf.binary_search_by_key(key, |&(k, _)| k).ok()?;
        Some(&leaf[pos].1)
    }

    /// Puts `value` at `key`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if self.leaves.is_empty() {
            let mut leaf = Vec::with_capacity(CAP + 1);
            leaf.push((key, value));
            self.leaves.push(leaf);
            self.firsts.push(key);
            self.len = 1;
            return None;
        }
        let i = self.leaf_for(key);
        let leaf = &mut self.leaves[i];
        let pos = match leaf.binary_search_by_key(&key, |&(k, _)| k) {
            Ok(pos) => return Some(std::mem::replace(&mut leaf[pos].1, value)),
            Err(pos) => pos,
        };
        self.insert_new(i, pos, key, value);
        None
    }

    /// Puts the new entry `(key, value)` at `pos` of leaf `i`, where it keeps the order.
    fn insert_new(&mut self, i: usize, pos: usize, key: u64, value: V) {
        let leaf = &mut self.leaves[i];
        leaf.insert(pos, (key, value));
        self.len += 1;
        if pos == 0 {
            self.firsts[i] = key;
        }
        if leaf.len() > CAP {
            // Keys arriving in order (at a leaf's end or start) leave full leaves behind them.
            let at = if pos == CAP {
                CAP
            } else if pos == 0 {
                1
            } else {
                leaf.len() / 2
            };
            let mut tail = Vec::with_capacity(CAP + 1);
            tail.extend(leaf.drain(at..));
            self.firsts.insert(i + 1, tail[0].0);
            self.leaves.insert(i + 1, tail);
        }
    }

    /// Takes the value at `key` out.
    pub(crate) fn remove(&mut self, key: &u64) -> Option<V> {
        if self.leaves.is_empty() {
            return None;
        }
        let i = self.leaf_for(*key);
        let leaf = &mut self.leaves[i];
        let pos = leaf.binary_search_by_key(key, |&(k, _)| k).ok()?;
        let (_, value) = leaf.remove(pos);
        self.len -= 1;
        if leaf.is_empty() {
            self.leaves.remove(i);
            self.firsts.remove(i);
            return Some(value);
        }
        if pos == 0 {
            self.firsts[i] = leaf[0].0;
        }
        if leaf.len() < LOW {
            // Merged into the leaf before it, or the one after into it, if the two fit.
            let fits = |a: usize, b: usize| self.leaves[a].len() + self.leaves[b].len() <= MERGED;
            let pair = if i > 0 && fits(i - 1, i) {
                Some(i - 1)
            } else if i + 1 < self.leaves.len() && fits(i, i + 1) {
                Some(i)
            } else {
                None
            };
            if let Some(a) = pair {
                let b = self.leaves.remove(a + 1);
                self.firsts.remove(a + 1);
                self.leaves[a].extend(b);
            }
        }
        Some(value)
    }

    /// Checks the invariants; panics on the first violation.
    #[cfg(test)]
    fn check(&self) {
        assert_eq!(self.firsts.len(), self.leaves.len());
        assert_eq!(self.len, self.leaves.iter().map(Vec::len).sum::<usize>());
        let mut last = None;
        for (i, leaf) in self.leaves.iter().enumerate() {
            assert!(!leaf.is_empty(), "leaf {i} is empty");
            assert!(leaf.len() <= CAP, "leaf {i} holds {}", leaf.len());
            assert_eq!(self.firsts[i], leaf[0].0, "first key of leaf {i}");
            for &(k, _) in leaf {
                assert!(last < Some(k), "keys out of order at {k}");
                last = Some(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A bound from a small key space, so that hits and misses both happen.
    fn bound(kind: u8, k: u64) -> Bound<u64> {
        match kind % 3 {
            0 => Bound::Unbounded,
            1 => Bound::Included(k),
            _ => Bound::Excluded(k),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Every operation answers as `BTreeMap` does, through growth past several leaves,
        /// splits, merges and emptying; half the insertions go through the gap of the last
        /// search, however stale (any key, the map changed since or not).
        #[test]
        fn matches_btreemap(
            ops in prop::collection::vec((0u8..4, 0u64..600, any::<u32>(), 0u8..3, 0u64..600, 0u8..3), 1..1500),
        ) {
            let (mut m, mut model) = (SortedMap::default(), BTreeMap::new());
            let mut gap = m.around_gap(0).2;
            for (op, k, v, lk, hk, hkind) in ops {
                match op {
                    0 => prop_assert_eq!(m.insert(k, v), model.insert(k, v)),
                    1 => prop_assert_eq!(m.insert_in(gap, k, v), model.insert(k, v)),
                    2 => prop_assert_eq!(m.remove(&k), model.remove(&k)),
                    _ => {
                        prop_assert_eq!(m.get(&k), model.get(&k));
                        let (below, above, g) = m.around_gap(k);
                        gap = g;
                        prop_assert_eq!(below, model.range(..k).next_back().map(|(&a, b)| (a, b)));
                        prop_assert_eq!(above, model.range(k..).next().map(|(&a, b)| (a, b)));
                        let (lo, hi) = (bound(lk, k.min(hk)), bound(hkind, k.max(hk)));
                        // `BTreeMap` panics on a range with equal excluded ends.
                        if matches!((lo, hi), (Bound::Excluded(a), Bound::Excluded(b)) if a == b) {
                            continue;
                        }
                        let got: Vec<_> = m.range((lo, hi)).collect();
                        let want: Vec<_> = model.range((lo, hi)).collect();
                        prop_assert_eq!(&got, &want);
                        let back: Vec<_> = m.range((lo, hi)).rev().collect();
                        let want_back: Vec<_> = model.range((lo, hi)).rev().collect();
                        prop_assert_eq!(back, want_back);
                        for (_, v) in m.range_mut((lo, hi)) {
                            *v = v.wrapping_add(1);
                        }
                        for (_, v) in model.range_mut((lo, hi)) {
                            *v = v.wrapping_add(1);
                        }
                    }
                }
                m.check();
                prop_assert_eq!(m.len(), model.len());
            }
            let all: Vec<_> = m.iter().collect();
            prop_assert_eq!(all, model.iter().collect::<Vec<_>>());
        }
    }

    /// Keys in order fill leaves to the brim (a coverage built by misses on rising addresses),
    /// and removing all but a few merges the leaves back.
    #[test]
    fn keys_in_order_fill_leaves_and_removals_merge_them() {
        let mut m = SortedMap::default();
        for k in 0..10 * CAP as u64 {
            m.insert(k, ());
        }
        m.check();
        assert_eq!(m.leaves.len(), 10);
        let mut down = SortedMap::default();
        for k in (0..10 * CAP as u64).rev() {
            down.insert(k, ());
        }
        down.check();
        assert_eq!(down.leaves.len(), 10);
        for k in 0..10 * CAP as u64 {
            if k % 16 != 0 {
                m.remove(&k);
            }
        }
        m.check();
        assert_eq!(m.len(), 40);
        assert!(m.leaves.len() <= 2, "{} leaves for 40 keys", m.leaves.len());
    }
}
