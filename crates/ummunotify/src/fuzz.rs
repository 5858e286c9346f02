//! Fuzzing entry point (feature `fuzzing`; not part of the API): drives the pure parts of the
//! event path — the interval index, the refcounted coverage and per-region event coalescing —
//! with an operation sequence decoded from bytes, and compares every answer with a naive model.
//!
//! Used by the cargo-fuzz target in `fuzz/` and, on stable Rust, by this module's tests, which
//! replay the committed corpus (`fuzz/corpus/region_index`) and random sequences.
#![allow(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};

use crate::coverage::Coverage;
use crate::event::Pending;
use crate::index::{IntervalIndex, Node};

/// Region ids in play (small, so sequences revisit them).
const IDS: usize = 24;
/// Addresses stay within this many pages, so ranges overlap often.
const SPAN_PAGES: u64 = 48;
const PAGE: u64 = 4096;

/// A region of the model.
#[derive(Clone, Copy, Debug)]
struct ModelRegion {
    start: u64,
    end: u64,
    /// 0: nothing pending; 1: one hit (with its clipped range); 2: more.
    hits: u8,
    hint: (u64, u64),
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    /// An address in the play area: page-granular most of the time, sometimes unaligned.
    fn addr(&mut self) -> Option<u64> {
        let p = u64::from(self.byte()?) % (SPAN_PAGES + 1);
        let off = match self.byte()? {
            b if b < 192 => 0,
            b => u64::from(b) * 17 % PAGE,
        };
        Some(p * PAGE + off)
    }
    /// A non-empty range `[start, end)`.
    fn range(&mut self) -> Option<(u64, u64)> {
        let a = self.addr()?;
        let b = self.addr()?;
        Some(match a.cmp(&b) {
            std::cmp::Ordering::Less => (a, b),
            std::cmp::Ordering::Greater => (b, a),
            std::cmp::Ordering::Equal => (a, a + 1),
        })
    }
}

fn page_round(s: u64, e: u64) -> (u64, u64) {
    (s & !(PAGE - 1), (e + PAGE - 1) & !(PAGE - 1))
}

/// Maximal runs of pages in `pages` (sorted page numbers) as byte ranges.
fn runs(pages: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for p in pages {
        let (s, e) = (p * PAGE, (p + 1) * PAGE);
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

/// Runs one operation sequence; panics on the first disagreement with the model.
pub fn run(data: &[u8]) {
    let mut input = Bytes(data);
    let mut nodes = vec![Node::default(); IDS];
    let mut tree = IntervalIndex::new();
    let mut pending = [Pending::default(); IDS];
    let mut cov = Coverage::new();
    let mut model: [Option<ModelRegion>; IDS] = [None; IDS];
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();

    while let Some(op) = input.byte() {
        let Some(idb) = input.byte() else { break };
        let id = usize::from(idb) % IDS;
        match op % 6 {
            // Register: index insert + coverage add (what Notifier::register does).
            0 | 1 => {
                let Some((s, e)) = input.range() else { break };
                if model[id].is_some() {
                    continue;
                }
                nodes[id] = Node::new(s, e);
                tree.insert(&mut nodes, id as u32);
                let (ps, pe) = page_round(s, e);
                let got = cov.add(ps, pe);
                let mut newly = Vec::new();
                for p in ps / PAGE..pe / PAGE {
                    let c = counts.entry(p).or_insert(0);
                    if *c == 0 {
                        newly.push(p);
                    }
                    *c += 1;
                }
                assert_eq!(
                    got,
                    runs(newly.into_iter()),
                    "coverage add [{ps:#x}, {pe:#x})"
                );
                model[id] = Some(ModelRegion {
                    start: s,
                    end: e,
                    hits: 0,
                    hint: (0, 0),
                });
            }
            // Unregister: index remove + coverage remove; a pending event is discarded.
            2 => {
                let Some(m) = model[id].take() else { continue };
                tree.remove(&mut nodes, id as u32);
                pending[id] = Pending::default();
                let (ps, pe) = page_round(m.start, m.end);
                let got = cov.remove(ps, pe);
                let mut freed = Vec::new();
                for p in ps / PAGE..pe / PAGE {
                    let c = counts.get_mut(&p).expect("model count");
                    *c -= 1;
                    if *c == 0 {
                        counts.remove(&p);
                        freed.push(p);
                    }
                }
                assert_eq!(got, runs(freed.into_iter()), "coverage remove");
            }
            // Invalidate a range: stab the index, coalesce per region (the monitor's step 4).
            3 | 4 => {
                let Some((s, e)) = input.range() else { break };
                let mut hit = BTreeSet::new();
                tree.for_each_overlap(&nodes, s, e, |i| {
                    assert!(hit.insert(i), "region {i} reported twice");
                });
                let want: BTreeSet<u32> = (0..IDS)
                    .filter(|&i| model[i].is_some_and(|m| m.start < e && s < m.end))
                    .map(|i| i as u32)
                    .collect();
                assert_eq!(hit, want, "stab [{s:#x}, {e:#x})");
                for &i in &hit {
                    let i = i as usize;
                    let m = model[i].as_mut().expect("hit region in model");
                    let newly = pending[i].hit(m.start, m.end, s, e);
                    assert_eq!(newly, m.hits == 0, "queued once per pending event");
                    if m.hits == 0 {
                        m.hits = 1;
                        // Hints are kept in granules: an unaligned range rounds out.
                        let (gs, ge) = page_round(s, e);
                        m.hint = (gs.max(m.start), ge.min(m.end));
                    } else {
                        m.hits = 2;
                        m.hint = (m.start, m.end);
                    }
                }
            }
            // Read the region's event (re-arm), and check the whole structure.
            _ => {
                if let Some(m) = model[id].as_mut() {
                    assert_eq!(pending[id].is_pending(), m.hits != 0);
                    if m.hits != 0 {
                        let got = pending[id].take(m.start, m.end);
                        assert_eq!(got, (m.hint.0, m.hint.1, m.hits == 1), "event of {id}");
                        m.hits = 0;
                    }
                }
                tree.check_invariants(&nodes);
                for (i, m) in model.iter().enumerate() {
                    assert_eq!(tree.contains(&nodes, i as u32), m.is_some(), "contains {i}");
                }
                assert_eq!(tree.len(), model.iter().flatten().count());
                let (s, e) = (0, (SPAN_PAGES + 2) * PAGE);
                let holes = runs((s / PAGE..e / PAGE).filter(|p| !counts.contains_key(p)));
                assert_eq!(cov.uncovered(s, e), holes, "uncovered");
                // Runs of equal count, merged: the representation is minimal.
                let mut segs = 0;
                let mut prev: Option<(u64, u32)> = None;
                for (&p, &c) in &counts {
                    if prev != Some((p.wrapping_sub(1), c)) {
                        segs += 1;
                    }
                    prev = Some((p, c));
                }
                assert_eq!(cov.segments(), segs, "coverage segments");
            }
        }
    }
    tree.check_invariants(&nodes);
}

#[cfg(test)]
mod tests {
    use super::run;

    /// Replays every committed corpus input (the same files the cargo-fuzz target starts from).
    #[test]
    fn replay_fuzz_corpus() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/region_index"
        );
        let mut n = 0;
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                run(&std::fs::read(e.path()).unwrap());
                n += 1;
            }
        }
        assert!(n > 0, "no corpus in {dir}");
    }

    /// Random sequences through the same harness, so stable-Rust CI exercises it too.
    /// `UMN_FUZZ_CASES` (default 3000) sets how many.
    #[test]
    fn random_sequences_through_the_fuzz_harness() {
        let cases: u64 = std::env::var("UMN_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000);
        let mut x: u64 = 0x5EED_F022;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for _ in 0..cases {
            let len = (next() % 1024) as usize;
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            run(&data);
        }
    }
}
