//! What only user threads touch, under the registry lock: cookies, coverage, the watch policy's
//! VMA budget and the interned wide ranges (the event path never takes this lock).

use super::*;

/// Watch ranges of the regions registered over the VMA budget (whole VMAs, so few distinct
/// ones), interned and refcounted: a region names its range in its node's tag (the 22 bits of
/// [`KIND`]) instead of carrying 16 bytes.
#[derive(Default)]
pub(super) struct WideRanges {
    /// `(watch_start, watch_end, regions using it)`; unused entries have count 0.
    pub(super) ranges: Vec<(u64, u64, u32)>,
    pub(super) by_range: HashMap<(u64, u64), u32>,
    pub(super) free: Vec<u32>,
}

impl WideRanges {
    /// The node tag of a region watched as `[start, end)` (counts the region).
    pub(super) fn intern(&mut self, start: u64, end: u64) -> Result<u32> {
        if let Some(&k) = self.by_range.get(&(start, end)) {
            self.ranges[k as usize].2 += 1;
            return Ok(WIDE + k);
        }
        let k = match self.free.pop() {
            Some(k) => k,
            None if self.ranges.len() <= (KIND - WIDE) as usize => {
                self.ranges.push((0, 0, 0));
                (self.ranges.len() - 1) as u32
            }
            None => {
                return Err(Error::CoverageLimit(io::Error::from_raw_os_error(
                    libc::ENOMEM,
                )))
            }
        };
        self.ranges[k as usize] = (start, end, 1);
        self.by_range.insert((start, end), k);
        Ok(WIDE + k)
    }

    /// Drops one region's use of the range of node tag kind `kind` (`>= WIDE`).
    pub(super) fn release(&mut self, kind: u32) {
        let k = kind - WIDE;
        let r = &mut self.ranges[k as usize];
        r.2 -= 1;
        if r.2 == 0 {
            self.by_range.remove(&(r.0, r.1));
            self.free.push(k);
        }
    }

    /// The region `node` (live) as a span: its range, and the pages watched for it.
    pub(super) fn span(&self, node: &Node) -> Span {
        let (start, end) = (node.start, node.end);
        let kind = node.tag() & KIND;
        let (watch_start, watch_end) = if kind >= WIDE {
            let r = self.ranges[(kind - WIDE) as usize];
            (r.0, r.1)
        } else {
            let page = sys::page_size() as u64;
            (start & !(page - 1), end.next_multiple_of(page))
        };
        Span {
            start,
            end,
            watch_start,
            watch_end,
        }
    }
}

/// State only user threads touch (the event path never takes this lock).
pub(super) struct Registry {
    pub(super) cookies: CookieTable,
    /// Watch ranges of widened regions (`Slot::node`'s tag).
    pub(super) wide: WideRanges,
    pub(super) coverage: Coverage,
    pub(super) free: Vec<u32>,
    pub(super) next_slot: u32,
    pub(super) budget: WatchBudget,
    /// Names the senders of in-flight `REMOVE`s (`crate::inflight`).
    pub(super) scanner: Scanner,
    /// Page ranges counted in `coverage` whose kernel watch an unmap may have taken since it was
    /// established: a registration over them watches again (see `register`).
    pub(super) lost: LostRanges,
    /// `UFFDIO_REGISTER`s (or filter insertions) made by registrations and re-arms.
    pub(super) watch_calls: u64,
    /// Regions whose node tag has [`HOLES`].
    pub(super) holes: usize,
}

/// Disjoint ranges, merged (the registry's `lost`).
#[derive(Default)]
pub(super) struct LostRanges {
    /// start -> end.
    pub(super) runs: std::collections::BTreeMap<u64, u64>,
}

impl LostRanges {
    /// Adds `[start, end)`.
    pub(super) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.runs.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.runs.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.runs.range(start..=end).next() {
            end = end.max(e);
            self.runs.remove(&s);
        }
        self.runs.insert(start, end);
    }

    /// Removes `[start, end)` (watched again).
    pub(super) fn remove(&mut self, start: u64, end: u64) {
        if self.runs.is_empty() {
            // The common case (nothing lost): every registration calls this.
            return;
        }
        let first = self
            .runs
            .range(..start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        let hit: Vec<(u64, u64)> = self
            .runs
            .range(first..end)
            .map(|(&s, &e)| (s, e))
            .filter(|&(_, e)| e > start)
            .collect();
        for (s, e) in hit {
            self.runs.remove(&s);
            if s < start {
                self.runs.insert(s, start);
            }
            if e > end {
                self.runs.insert(end, e);
            }
        }
    }

    /// Whether any of `[start, end)` is in the set.
    pub(super) fn overlaps(&self, start: u64, end: u64) -> bool {
        self.runs
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }
}

/// The watch policy's VMA budget (docs/architecture/regions.md, "Watch policy").
///
/// Watching exactly a region's pages splits the VMA they lie in (a watched VMA between two
/// unwatched ones: up to two more VMAs per disjoint watched range), and the kernel refuses new
/// VMAs at `vm.max_map_count` — 32,745 alternating single-page regions here. So exact watches
/// are allowed only while the process's VMA count, estimated from the last count plus two per
/// watched range added since, stays under half of `vm.max_map_count` (the other half is left to
/// everything else the process maps). Past that, a new region is watched as the whole VMAs it
/// lies in, which splits nothing; events for the other pages of those VMAs hit no region and
/// are dropped by the index (they still cost their senders a round trip: guarantee 3 is kept for
/// memory outside those VMAs only).
pub(super) struct WatchBudget {
    /// Half of `vm.max_map_count`.
    pub(super) limit: usize,
    /// The process's VMAs at the last count, and the coverage segments we had then.
    pub(super) counted: usize,
    pub(super) counted_at: usize,
    /// The mapping list (opened at the first widened watch).
    pub(super) vmas: Option<sys::vma::Vmas>,
    /// Regions registered with a widened watch, now.
    pub(super) wide_regions: usize,
}

impl WatchBudget {
    pub(super) fn new() -> WatchBudget {
        WatchBudget {
            limit: sys::vma::max_map_count() / 2,
            counted: sys::vma::count().unwrap_or(0),
            counted_at: 0,
            vmas: None,
            wide_regions: 0,
        }
    }

    /// The process's VMA count as far as we know: the last count, plus two for every watched
    /// range added since (never less for ranges removed: an over-estimate only widens sooner).
    pub(super) fn estimate(&self, segments: usize) -> usize {
        self.counted + 2 * segments.saturating_sub(self.counted_at)
    }

    /// Room left under the limit for VMAs the rest of the process makes between two counts
    /// (allocator arenas, the notifier's own slot segments, ...).
    pub(super) const MARGIN: usize = 1024;

    /// Whether one more exact watch fits. The VMAs are counted again (reading
    /// `/proc/self/maps`) whenever the watched ranges changed by `limit / 64`, or a quarter of
    /// the room left under the limit if that is more, since the last count: so the estimate
    /// follows what the rest of the process maps too, widened registrations (which add no range)
    /// do not each pay for a count, and far below the limit a count (O(VMAs) in the kernel: 40%
    /// of a cache miss's time at 10,000 VMAs when it came every `limit / 64` ranges) is rare.
    pub(super) fn allows_exact(&mut self, segments: usize) -> bool {
        let room = self
            .limit
            .saturating_sub(self.estimate(segments) + Self::MARGIN);
        if segments.abs_diff(self.counted_at) >= (self.limit / 64).max(room / 4).max(1) {
            if let Ok(n) = sys::vma::count() {
                self.counted = n;
                self.counted_at = segments;
            }
        }
        self.estimate(segments) + 2 + Self::MARGIN <= self.limit
    }

    /// The mapping list, opened at first use.
    pub(super) fn vmas(&mut self) -> Result<&sys::vma::Vmas> {
        if self.vmas.is_none() {
            self.vmas = Some(sys::vma::Vmas::open().map_err(|source| Error::Os {
                op: "open /proc/self/maps",
                source,
            })?);
        }
        Ok(self.vmas.as_ref().expect("opened above"))
    }

    /// The whole VMAs covering `[start, end)`, or `None` if part of it is unmapped.
    pub(super) fn widen(&mut self, start: u64, end: u64) -> Result<Option<(u64, u64)>> {
        self.vmas()?.extent(start, end).map_err(|source| Error::Os {
            op: "PROCMAP_QUERY",
            source,
        })
    }
}

/// Whether `span` is watched wider than its own pages (over the VMA budget).
pub(super) fn widened(span: &Span) -> bool {
    let page = sys::page_size() as u64;
    span.watch_start < span.start & !(page - 1) || span.watch_end > span.end.next_multiple_of(page)
}
