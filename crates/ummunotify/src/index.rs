//! `IntervalIndex`: an augmented AVL tree of half-open ranges, for stabbing queries.
//!
//! Nodes are identified by `u32` ids and stored by the caller (inside region slots), reached
//! through the [`Nodes`] trait, so the tree itself owns no memory: `insert`, `remove` and
//! `for_each_overlap` never allocate or free, which is what lets them run under the index lock
//! (see `docs/ARCHITECTURE.md`, "Locks").
//!
//! The tree is ordered by `(start, id)`, so equal ranges coexist. Each node also keeps the
//! maximum `end` of its subtree, which lets a query skip every subtree that ends before it.
//! Recursion depth is bounded by the tree height, at most about `1.44 log2 n` (under 48 for any
//! number of `u32` ids).

use std::cmp::Ordering;

/// The null node id (no child, empty tree).
pub(crate) const NIL: u32 = u32::MAX;

/// One interval of the index: the caller sets `start`/`end`, the tree owns the rest.
///
/// The range is half-open, `start < end`. `start` and `end` must not change while the node is
/// in a tree. 32 bytes: it lives in every region's slot, so it is packed (`max_end` in
/// granules, the height sharing a word with 24 bits the caller may use, see [`Node::tag`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Node {
    /// First address of the range.
    pub start: u64,
    /// One past the last address of the range.
    pub end: u64,
    /// Left child id, or [`NIL`].
    left: u32,
    /// Right child id, or [`NIL`].
    right: u32,
    /// Largest `end` in this node's subtree, rounded up to a [`GRANULE`], as granules above
    /// the granule of `start`; [`MAX_END_UNKNOWN`] when that does not fit, or on the right
    /// spine (see [`insert_leaf`]). Unknown reads as "ends at the top of the address space":
    /// the query then does not prune that subtree, which is only slower, never wrong.
    max_end: u32,
    /// Low 8 bits: height of this node's subtree (a leaf has height 1). High 24 bits: the
    /// caller's [`tag`](Node::tag), which the tree never changes.
    meta: u32,
}

// Every region's slot holds one: keep it at 32 bytes.
const _: () = assert!(std::mem::size_of::<Node>() == 32);

/// Granule of [`Node`]'s `max_end`.
const GRANULE: u64 = 4096;

/// `max_end` that does not fit in 32 bits of granules.
const MAX_END_UNKNOWN: u32 = u32::MAX;

/// Largest [`Node::tag`].
pub(crate) const TAG_MAX: u32 = (1 << 24) - 1;

impl Node {
    /// A node for `[start, end)`, not in any tree, with tag 0.
    pub(crate) const fn new(start: u64, end: u64) -> Self {
        let mut n = Self {
            start,
            end,
            left: NIL,
            right: NIL,
            max_end: 0,
            meta: 1,
        };
        n.max_end = n.encode_max_end(end);
        n
    }

    /// 24 bits of the caller's own (0 in a new node), kept by every tree operation.
    pub(crate) fn tag(&self) -> u32 {
        self.meta >> 8
    }

    /// Sets the caller's [`tag`](Node::tag) (at most [`TAG_MAX`]).
    pub(crate) fn set_tag(&mut self, tag: u32) {
        debug_assert!(tag <= TAG_MAX);
        self.meta = (self.meta & 0xff) | (tag << 8);
    }

    fn height(&self) -> u8 {
        self.meta as u8
    }

    fn set_height(&mut self, h: u8) {
        self.meta = (self.meta & !0xff) | u32::from(h);
    }

    /// `max_end` as an address (an over-estimate by less than a granule, or `u64::MAX`).
    fn max_end(&self) -> u64 {
        if self.max_end == MAX_END_UNKNOWN {
            return u64::MAX;
        }
        (self.start / GRANULE + u64::from(self.max_end)).saturating_mul(GRANULE)
    }

    /// The stored form of a subtree maximum `m >= self.end`. Rounding to absolute granule
    /// boundaries makes decoding and encoding again a no-op, so errors never accumulate.
    const fn encode_max_end(&self, m: u64) -> u32 {
        let g = m.div_ceil(GRANULE) - self.start / GRANULE;
        if g >= MAX_END_UNKNOWN as u64 {
            MAX_END_UNKNOWN
        } else {
            g as u32
        }
    }
}

/// Access to node storage owned by the caller.
pub(crate) trait Nodes {
    /// The node with id `id` (an id the caller handed to the tree).
    fn node(&self, id: u32) -> &Node;
    /// The node with id `id`, mutably.
    fn node_mut(&mut self, id: u32) -> &mut Node;
}

/// Plain vector storage, for tests and fuzzing: node `id` is `self[id]`.
impl Nodes for Vec<Node> {
    fn node(&self, id: u32) -> &Node {
        &self[id as usize]
    }

    fn node_mut(&mut self, id: u32) -> &mut Node {
        &mut self[id as usize]
    }
}

/// An augmented AVL tree over caller-stored [`Node`]s.
#[derive(Debug)]
pub(crate) struct IntervalIndex {
    /// Root node id, or [`NIL`].
    root: u32,
    /// Number of nodes in the tree.
    len: usize,
}

impl Default for IntervalIndex {
    /// Same as [`IntervalIndex::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// Height of `id`'s subtree (0 for [`NIL`]).
#[inline]
fn height<N: Nodes + ?Sized>(nodes: &N, id: u32) -> u8 {
    if id == NIL {
        0
    } else {
        nodes.node(id).height()
    }
}

/// Orders nodes by `(start, id)`.
#[inline]
fn cmp_key(a_start: u64, a_id: u32, b_start: u64, b_id: u32) -> Ordering {
    (a_start, a_id).cmp(&(b_start, b_id))
}

/// Recomputes `id`'s height and `max_end` from its children.
#[inline]
fn update<N: Nodes + ?Sized>(nodes: &mut N, id: u32) {
    let Node {
        end, left, right, ..
    } = *nodes.node(id);
    let (hl, ml) = summary(nodes, left);
    let (hr, mr) = summary(nodes, right);
    set_summary(nodes, id, hl.max(hr) + 1, end.max(ml).max(mr));
}

/// Height and largest end of the subtree at `id` (`(0, 0)` for none): one node read.
#[inline]
fn summary<N: Nodes + ?Sized>(nodes: &N, id: u32) -> (u8, u64) {
    if id == NIL {
        (0, 0)
    } else {
        let n = nodes.node(id);
        (n.height(), n.max_end())
    }
}

#[inline]
fn set_summary<N: Nodes + ?Sized>(nodes: &mut N, id: u32, h: u8, m: u64) {
    let node = nodes.node_mut(id);
    node.set_height(h);
    node.max_end = node.encode_max_end(m);
}

/// Rotates `id`'s subtree right; returns the new subtree root.
fn rotate_right<N: Nodes + ?Sized>(nodes: &mut N, id: u32) -> u32 {
    let l = nodes.node(id).left;
    let lr = nodes.node(l).right;
    nodes.node_mut(id).left = lr;
    update(nodes, id);
    nodes.node_mut(l).right = id;
    update(nodes, l);
    l
}

/// Rotates `id`'s subtree left; returns the new subtree root.
fn rotate_left<N: Nodes + ?Sized>(nodes: &mut N, id: u32) -> u32 {
    let r = nodes.node(id).right;
    let rl = nodes.node(r).left;
    nodes.node_mut(id).right = rl;
    update(nodes, id);
    nodes.node_mut(r).left = id;
    update(nodes, r);
    r
}

/// Restores the AVL balance at `id` (whose children are balanced and differ in height by at
/// most 2) and its augmentation; returns the new subtree root.
fn rebalance<N: Nodes + ?Sized>(nodes: &mut N, id: u32) -> u32 {
    // Each child read once: balanced (the common case), that is all `update` would read too;
    // a rotation updates `id` itself.
    let Node {
        end, left, right, ..
    } = *nodes.node(id);
    let (hl, ml) = summary(nodes, left);
    let (hr, mr) = summary(nodes, right);
    if hl > hr + 1 {
        let (ll, lr) = (nodes.node(left).left, nodes.node(left).right);
        if height(nodes, ll) < height(nodes, lr) {
            let new_left = rotate_left(nodes, left);
            nodes.node_mut(id).left = new_left;
        }
        rotate_right(nodes, id)
    } else if hr > hl + 1 {
        let (rl, rr) = (nodes.node(right).left, nodes.node(right).right);
        if height(nodes, rr) < height(nodes, rl) {
            let new_right = rotate_right(nodes, right);
            nodes.node_mut(id).right = new_right;
        }
        rotate_left(nodes, id)
    } else {
        set_summary(nodes, id, hl.max(hr) + 1, end.max(ml).max(mr));
        id
    }
}

/// `id`'s child on the left (`left`) or right side.
#[inline]
fn child_of<N: Nodes + ?Sized>(nodes: &N, id: u32, left: bool) -> u32 {
    let n = nodes.node(id);
    if left {
        n.left
    } else {
        n.right
    }
}

/// Sets `id`'s child on the left (`left`) or right side.
#[inline]
fn set_child<N: Nodes + ?Sized>(nodes: &mut N, id: u32, left: bool, child: u32) {
    let n = nodes.node_mut(id);
    if left {
        n.left = child;
    } else {
        n.right = child;
    }
}

/// Sets `id`'s height to `h` and its `max_end` from its own end and its children's, whose
/// summaries are correct.
fn settle<N: Nodes + ?Sized>(nodes: &mut N, id: u32, h: u8) {
    let Node {
        end, left, right, ..
    } = *nodes.node(id);
    let m = end.max(summary(nodes, left).1).max(summary(nodes, right).1);
    set_summary(nodes, id, h, m);
}

/// The rotation an insertion needs at `p`, whose child on side `left` grew to two above its
/// other child (of height `h_sibling`); `double` when that child grew on its inner side.
/// Returns the subtree's new root. The heights are known (the subtree ends as tall as before
/// the insertion), so only the rotated nodes' `max_end`s are recomputed, bottom up; the new
/// root's is the whole subtree's, `p`'s own before the rotation (if known: then every node
/// below is, and it is exact; if not, it stays unknown where `p` is on the right `spine`).
fn rotate_grown<N: Nodes + ?Sized>(
    nodes: &mut N,
    p: u32,
    left: bool,
    double: bool,
    h_sibling: u8,
    spine: bool,
) -> u32 {
    let top = nodes.node(p).max_end();
    let c = child_of(nodes, p, left);
    let settle_root = |nodes: &mut N, root: u32| {
        if top == u64::MAX && !spine {
            settle(nodes, root, h_sibling + 2);
        } else {
            set_summary(nodes, root, h_sibling + 2, top);
        }
    };
    if !double {
        // c's inner subtree moves under p; p under c.
        let inner = child_of(nodes, c, !left);
        set_child(nodes, p, left, inner);
        settle(nodes, p, h_sibling + 1);
        set_child(nodes, c, !left, p);
        settle_root(nodes, c);
        return c;
    }
    // c's inner child g (the one that grew) rises above both; its children go one to each.
    let g = child_of(nodes, c, !left);
    let (g_outer, g_inner) = (child_of(nodes, g, left), child_of(nodes, g, !left));
    set_child(nodes, c, !left, g_outer);
    set_child(nodes, p, left, g_inner);
    settle(nodes, c, h_sibling + 1);
    settle(nodes, p, h_sibling + 1);
    set_child(nodes, g, left, c);
    set_child(nodes, g, !left, p);
    settle_root(nodes, g);
    g
}

/// Deepest path an AVL tree of `u32` ids can have (its height is below 1.45·log2(n + 2)).
const MAX_DEPTH: usize = 64;

/// Inserts the detached leaf `id` (key `(start, id)`) into the tree at `root`; returns the new
/// root. Walks down once, then up only as far as something changes, reading each ancestor once
/// and, while the subtree below grew, its other child:
///
/// - Every ancestor's subtree gains exactly the new node (a rotation only rearranges a subtree),
///   so its stored `max_end` becomes the larger of itself and the new node's end, in the
///   ancestor's own granules: no child is read for it.
/// - Except on the right spine (the root and its chain of right children) where the new node
///   went right: those become unknown, so a tree growing at its right end (addresses handed out
///   rising, as a heap or a bump arena does) stops updating ancestors where the spine is
///   unknown already, after O(1) levels on average instead of every level to the root. A
///   spine node's subtree holds the largest keys, so its maximum prunes only a query that lies
///   past every region's end; every other node stays exact (`check_invariants`).
/// - While the subtree below grew, the ancestor's height needs its other child's, one read;
///   where that child is two lower, one rotation (single or double) restores the height the
///   subtree had before, and nothing above grows.
/// - Above the first node where neither the link, the height nor `max_end` changed, nothing
///   does.
///
/// (A cache miss on a notifier holding ~2,000 regions spent ~15% of its user time in the
/// recursive form, which rebalanced every node on the way up, and still ~2,500 instructions in
/// a form that read both children at each level: issue 23.)
fn insert_leaf<N: Nodes + ?Sized>(nodes: &mut N, root: u32, id: u32, start: u64) -> u32 {
    // The ancestors, and a bit per level for "went left" (a zeroed array is a few vector
    // stores; an array of pairs was a store per element, ~130 instructions an insertion).
    let mut path = [0u32; MAX_DEPTH];
    let mut went_left = 0u64;
    let mut depth = 0;
    let mut at = root;
    while at != NIL {
        let n = nodes.node(at);
        let left = cmp_key(start, id, n.start, at) == Ordering::Less;
        path[depth] = at;
        went_left |= u64::from(left) << depth;
        depth += 1;
        at = if left { n.left } else { n.right };
    }
    // The ancestors at depth below this are on the right spine with the new node to their
    // right (every move from the root to there went right).
    let spine = went_left.trailing_zeros() as usize;
    // The new node's end in absolute granules, as `encode_max_end` rounds it.
    let end_granule = nodes.node(id).end.div_ceil(GRANULE);
    let mut child = id;
    // Whether `child`'s stored `max_end` is unknown: then so is every ancestor's (`update`
    // would decode it as the top of the address space), known or not before.
    let mut child_unknown = nodes.node(id).max_end == MAX_END_UNKNOWN;
    // Height of `child`'s subtree while it is taller than before the insertion, else `None`.
    let mut grown = Some(1u8);
    while depth > 0 {
        depth -= 1;
        let (p, left) = (path[depth], went_left >> depth & 1 == 1);
        let n = nodes.node_mut(p);
        let (old_link, sibling) = if left {
            (std::mem::replace(&mut n.left, child), n.right)
        } else {
            (std::mem::replace(&mut n.right, child), n.left)
        };
        let (old_max, h_old) = (n.max_end, n.height());
        let n = if child_unknown || depth < spine {
            n.max_end = MAX_END_UNKNOWN;
            n
        } else if old_max != MAX_END_UNKNOWN {
            let above = end_granule.saturating_sub(n.start / GRANULE);
            n.max_end = old_max.max(u32::try_from(above).unwrap_or(MAX_END_UNKNOWN));
            n
        } else if depth <= spine {
            // On the spine (the new node went left here): unknown may stay.
            n
        } else {
            // Unknown before, but the child's now known (a rotation below put a node with a
            // later start at its top, whose granules fit): only the children can tell.
            update(nodes, p);
            nodes.node_mut(p)
        };
        child_unknown = n.max_end == MAX_END_UNKNOWN;
        let Some(h_child) = grown else {
            if old_link == child && n.max_end == old_max {
                return root;
            }
            child = p;
            continue;
        };
        let h_sibling = height(nodes, sibling);
        if h_child > h_sibling + 1 {
            // The child's side is two taller: after the rotation the subtree is as tall as
            // before the insertion, and the node now at this position links into the parent.
            // `p`'s child is an ancestor of the new node (a leaf's parent never rotates).
            let child_went_left = went_left >> (depth + 1) & 1 == 1;
            child = rotate_grown(
                nodes,
                p,
                left,
                child_went_left != left,
                h_sibling,
                depth <= spine,
            );
            child_unknown = nodes.node(child).max_end == MAX_END_UNKNOWN;
            grown = None;
            continue;
        }
        let h = h_child.max(h_sibling) + 1;
        nodes.node_mut(p).set_height(h);
        grown = (h != h_old).then_some(h);
        child = p;
    }
    child
}

/// Detaches the leftmost node of the subtree at `root`; returns `(new subtree root, detached)`.
fn remove_min<N: Nodes + ?Sized>(nodes: &mut N, root: u32) -> (u32, u32) {
    let Node { left, right, .. } = *nodes.node(root);
    if left == NIL {
        return (right, root);
    }
    let (new_left, min) = remove_min(nodes, left);
    nodes.node_mut(root).left = new_left;
    (rebalance(nodes, root), min)
}

/// Removes node `id` (key `(start, id)`) from the subtree at `root`; returns the new subtree
/// root. Sets `*found` if the node was there.
fn remove_at<N: Nodes + ?Sized>(
    nodes: &mut N,
    root: u32,
    id: u32,
    start: u64,
    found: &mut bool,
) -> u32 {
    if root == NIL {
        return NIL;
    }
    let r = *nodes.node(root);
    match cmp_key(start, id, r.start, root) {
        Ordering::Equal => {
            *found = true;
            if r.left == NIL {
                return r.right;
            }
            if r.right == NIL {
                return r.left;
            }
            let (new_right, successor) = remove_min(nodes, r.right);
            let s = nodes.node_mut(successor);
            s.left = r.left;
            s.right = new_right;
            rebalance(nodes, successor)
        }
        Ordering::Less => {
            let new_left = remove_at(nodes, r.left, id, start, found);
            nodes.node_mut(root).left = new_left;
            rebalance(nodes, root)
        }
        Ordering::Greater => {
            let new_right = remove_at(nodes, r.right, id, start, found);
            nodes.node_mut(root).right = new_right;
            rebalance(nodes, root)
        }
    }
}

/// Calls `f` for every node of the subtree at `id` overlapping `[start, end)`, in key order.
fn overlap_at<N: Nodes + ?Sized, F: FnMut(u32)>(
    nodes: &N,
    id: u32,
    start: u64,
    end: u64,
    f: &mut F,
) {
    if id == NIL {
        return;
    }
    let n = nodes.node(id);
    if n.max_end() <= start {
        // Everything below ends at or before `start`.
        return;
    }
    overlap_at(nodes, n.left, start, end, f);
    if n.start >= end {
        // This node and its right subtree start at or after `end`.
        return;
    }
    if n.end > start {
        f(id);
    }
    overlap_at(nodes, n.right, start, end, f);
}

impl IntervalIndex {
    /// An empty index.
    pub(crate) const fn new() -> Self {
        Self { root: NIL, len: 0 }
    }

    /// Number of nodes in the index.
    // Part of the index's interface (tests, statistics); the notifier does not need it yet.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the index has no node.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts node `id`, whose `start`/`end` the caller has set (`start < end`).
    ///
    /// The key is `(start, id)`, so equal ranges are fine. `id` must not be [`NIL`] nor already
    /// in this tree. O(log n); never allocates.
    pub(crate) fn insert<N: Nodes + ?Sized>(&mut self, nodes: &mut N, id: u32) {
        debug_assert_ne!(id, NIL, "NIL is not a node id");
        debug_assert!(
            !self.contains(nodes, id),
            "node {id} is already in the index"
        );
        let node = nodes.node_mut(id);
        debug_assert!(node.start < node.end, "empty or inverted range");
        let tag = node.tag();
        *node = Node::new(node.start, node.end);
        node.set_tag(tag);
        let start = node.start;
        self.root = insert_leaf(nodes, self.root, id, start);
        self.len += 1;
    }

    /// Removes node `id`, which must be in this tree (with the `start` it was inserted with).
    ///
    /// O(log n); never allocates. Removing a node that is not in the tree leaves the tree
    /// unchanged (and fails a debug assertion).
    pub(crate) fn remove<N: Nodes + ?Sized>(&mut self, nodes: &mut N, id: u32) {
        let start = nodes.node(id).start;
        let mut found = false;
        self.root = remove_at(nodes, self.root, id, start, &mut found);
        debug_assert!(found, "node {id} is not in the index");
        if found {
            self.len -= 1;
        }
    }

    /// Calls `f(id)` for every node with `node.start < end && node.end > start`, in
    /// `(start, id)` order.
    ///
    /// The condition is taken literally, so an empty query `[a, a)` reports the nodes that
    /// contain both `a - 1` and `a`.
    ///
    /// Never allocates; recursion depth is at most the tree height. Visits O(log n) nodes plus,
    /// for each reported node, at most its path to the root not already visited: O(log n + k)
    /// when the hits are clustered in key order, O(log n + k log(n/k)) in the worst case.
    pub(crate) fn for_each_overlap<N: Nodes + ?Sized>(
        &self,
        nodes: &N,
        start: u64,
        end: u64,
        mut f: impl FnMut(u32),
    ) {
        overlap_at(nodes, self.root, start, end, &mut f);
    }

    /// Whether node `id` (with its current `start`) is in this tree. O(log n).
    pub(crate) fn contains<N: Nodes + ?Sized>(&self, nodes: &N, id: u32) -> bool {
        let start = nodes.node(id).start;
        let mut cur = self.root;
        while cur != NIL {
            let c = nodes.node(cur);
            cur = match cmp_key(start, id, c.start, cur) {
                Ordering::Equal => return true,
                Ordering::Less => c.left,
                Ordering::Greater => c.right,
            };
        }
        false
    }

    /// Checks every invariant (ordering, AVL balance, heights, `max_end`, `len`); panics with
    /// a description of the first violation.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn check_invariants<N: Nodes + ?Sized>(&self, nodes: &N) {
        /// Returns `(height, max_end, count)` of the subtree at `id`, whose keys must lie
        /// strictly between `lo` and `hi`.
        fn walk<N: Nodes + ?Sized>(
            nodes: &N,
            id: u32,
            lo: Option<(u64, u32)>,
            hi: Option<(u64, u32)>,
        ) -> (u8, u64, usize) {
            if id == NIL {
                return (0, 0, 0);
            }
            let n = *nodes.node(id);
            let key = (n.start, id);
            assert!(n.start < n.end, "node {id}: empty range");
            if let Some(lo) = lo {
                assert!(lo < key, "node {id}: ordering (low)");
            }
            if let Some(hi) = hi {
                assert!(key < hi, "node {id}: ordering (high)");
            }
            let (hl, ml, cl) = walk(nodes, n.left, lo, Some(key));
            let (hr, mr, cr) = walk(nodes, n.right, Some(key), hi);
            assert!(hl.abs_diff(hr) <= 1, "node {id}: unbalanced ({hl} vs {hr})");
            assert_eq!(n.height(), hl.max(hr) + 1, "node {id}: height");
            let m = n.end.max(ml).max(mr);
            // Unknown is allowed on the right spine (no upper bound: `hi` is `None` there).
            if !(hi.is_none() && n.max_end == MAX_END_UNKNOWN) {
                assert_eq!(n.max_end, n.encode_max_end(m), "node {id}: max_end");
            }
            assert!(n.max_end() >= m, "node {id}: max_end under-estimates");
            (n.height(), n.max_end(), cl + cr + 1)
        }
        let (_, _, count) = walk(nodes, self.root, None, None);
        assert_eq!(count, self.len, "len");
    }

    /// Height of the tree (0 when empty).
    #[cfg(test)]
    fn height<N: Nodes + ?Sized>(&self, nodes: &N) -> u8 {
        height(nodes, self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One step of a random sequence.
    #[derive(Clone, Debug)]
    enum Op {
        /// Insert a new node `[start, start + len)`.
        Insert(u64, u64),
        /// Insert a new node `gap` past the highest start so far, `len` long: the rising
        /// addresses of a heap, where the right spine's maxima go unknown.
        Rising(u64, u64),
        /// Remove the live node chosen by this selector (modulo the live count).
        Remove(usize),
        /// Query `[start, start + len)`.
        Query(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..200, 1u64..40).prop_map(|(s, l)| Op::Insert(s, l)),
            2 => (0u64..8, 1u64..40).prop_map(|(g, l)| Op::Rising(g, l)),
            2 => any::<usize>().prop_map(Op::Remove),
            2 => (0u64..240, 0u64..60).prop_map(|(s, l)| Op::Query(s, l)),
        ]
    }

    fn query(index: &IntervalIndex, nodes: &Vec<Node>, start: u64, end: u64) -> Vec<u32> {
        let mut got = Vec::new();
        index.for_each_overlap(nodes, start, end, |id| got.push(id));
        got
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        /// `scale` stretches every address: 1 keeps a whole tree in one granule, 3,000 and 4,096
        /// exercise the granule rounding of `max_end`, 2^40 the unknown (overflowing) one.
        fn matches_naive_model(
            ops in prop::collection::vec(op(), 1..300),
            scale in prop_oneof![Just(1u64), Just(3_000), Just(4_096), Just(1 << 40)],
        ) {
            let mut nodes: Vec<Node> = Vec::new();
            let mut live: Vec<u32> = Vec::new();
            let mut index = IntervalIndex::new();
            let mut top = 0;
            for op in ops {
                let op = match op {
                    Op::Rising(gap, l) => {
                        top += gap;
                        Op::Insert(top, l)
                    }
                    op => op,
                };
                match op {
                    Op::Insert(s, l) => {
                        top = top.max(s);
                        let (s, l) = (s * scale, l * scale);
                        let id = nodes.len() as u32;
                        nodes.push(Node { start: s, end: s + l, ..Node::default() });
                        index.insert(&mut nodes, id);
                        live.push(id);
                    }
                    Op::Remove(sel) => {
                        if live.is_empty() {
                            continue;
                        }
                        let id = live.swap_remove(sel % live.len());
                        index.remove(&mut nodes, id);
                        prop_assert!(!index.contains(&nodes, id));
                    }
                    Op::Query(s, l) => {
                        let (s, l) = (s * scale, l * scale);
                        let mut got = query(&index, &nodes, s, s + l);
                        // Reported in key order.
                        let keys: Vec<_> = got.iter().map(|&id| (nodes[id as usize].start, id)).collect();
                        prop_assert!(keys.windows(2).all(|w| w[0] < w[1]));
                        got.sort_unstable();
                        let mut want: Vec<u32> = live
                            .iter()
                            .copied()
                            .filter(|&id| {
                                let n = &nodes[id as usize];
                                n.start < s + l && n.end > s
                            })
                            .collect();
                        want.sort_unstable();
                        prop_assert_eq!(got, want);
                    }
                    Op::Rising(..) => unreachable!("mapped to an insertion above"),
                }
                index.check_invariants(&nodes);
                prop_assert_eq!(index.len(), live.len());
                prop_assert_eq!(index.is_empty(), live.is_empty());
            }
        }
    }

    #[test]
    fn equal_ranges_coexist() {
        let mut nodes = vec![Node::new(10, 20); 5];
        let mut index = IntervalIndex::new();
        for id in 0..5 {
            index.insert(&mut nodes, id);
        }
        index.check_invariants(&nodes);
        assert_eq!(query(&index, &nodes, 15, 16), vec![0, 1, 2, 3, 4]);
        index.remove(&mut nodes, 2);
        index.check_invariants(&nodes);
        assert_eq!(query(&index, &nodes, 0, 11), vec![0, 1, 3, 4]);
        assert!(query(&index, &nodes, 20, 30).is_empty());
        assert!(query(&index, &nodes, 0, 10).is_empty());
        assert_eq!(query(&index, &nodes, 15, 15), vec![0, 1, 3, 4]);
        assert!(query(&index, &nodes, 10, 10).is_empty());
    }

    #[test]
    fn reinsert_after_remove() {
        let mut nodes = vec![Node::new(0, 4096), Node::new(4096, 8192)];
        let mut index = IntervalIndex::new();
        index.insert(&mut nodes, 0);
        index.insert(&mut nodes, 1);
        index.remove(&mut nodes, 0);
        nodes[0] = Node::new(8192, 12288);
        index.insert(&mut nodes, 0);
        index.check_invariants(&nodes);
        assert_eq!(query(&index, &nodes, 0, u64::MAX), vec![1, 0]);
    }

    #[test]
    fn tags_survive_rotations() {
        let mut nodes: Vec<Node> = (0..64u64)
            .map(|i| {
                let mut n = Node::new(i * 4096, i * 4096 + 100);
                n.set_tag(TAG_MAX - i as u32);
                n
            })
            .collect();
        let mut index = IntervalIndex::new();
        for id in 0..64 {
            index.insert(&mut nodes, id);
        }
        for id in (0..64).step_by(3) {
            index.remove(&mut nodes, id);
        }
        index.check_invariants(&nodes);
        for (i, n) in nodes.iter().enumerate() {
            assert_eq!(n.tag(), TAG_MAX - i as u32);
        }
    }

    #[test]
    fn huge_ranges_do_not_prune_wrongly() {
        // Ends beyond 16 TiB of granules above their start: `max_end` saturates.
        let mut nodes = vec![
            Node::new(0, u64::MAX),
            Node::new(1 << 20, (1 << 20) + 1),
            Node::new(1 << 60, (1 << 60) + 10),
            Node::new(4096, 1 << 62),
        ];
        let mut index = IntervalIndex::new();
        for id in 0..4 {
            index.insert(&mut nodes, id);
        }
        index.check_invariants(&nodes);
        assert_eq!(
            query(&index, &nodes, (1 << 61) + 5, (1 << 61) + 6),
            vec![0, 3]
        );
        assert_eq!(
            query(&index, &nodes, (1 << 60) + 9, (1 << 60) + 12),
            vec![0, 3, 2]
        );
    }

    /// xorshift64*, deterministic and dependency-free.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn many_nodes() {
        let n: u32 = if cfg!(debug_assertions) {
            200_000
        } else {
            1_000_000
        };
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut nodes: Vec<Node> = (0..n)
            .map(|_| {
                let start = (next(&mut rng) % (1 << 40)) & !0xfff;
                let len = ((next(&mut rng) % 64) + 1) << 12;
                Node::new(start, start + len)
            })
            .collect();
        let mut index = IntervalIndex::new();
        for id in 0..n {
            index.insert(&mut nodes, id);
        }
        assert_eq!(index.len(), n as usize);
        let bound = 1.45 * f64::from(n + 2).log2();
        assert!(f64::from(index.height(&nodes)) <= bound);
        index.check_invariants(&nodes);
        for _ in 0..20 {
            let start = next(&mut rng) % (1 << 40);
            let end = start + (next(&mut rng) % (1 << 24)) + 1;
            let mut got = query(&index, &nodes, start, end);
            got.sort_unstable();
            let want: Vec<u32> = (0..n)
                .filter(|&id| {
                    let node = &nodes[id as usize];
                    node.start < end && node.end > start
                })
                .collect();
            assert_eq!(got, want);
        }
        for id in (0..n).step_by(2) {
            index.remove(&mut nodes, id);
        }
        assert_eq!(index.len(), (n / 2) as usize);
        index.check_invariants(&nodes);
    }
}
