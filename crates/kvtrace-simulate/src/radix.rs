//! SGLang's KV cache as the reference mocker keeps it: a pool of fixed-size pages and a
//! radix tree of the complete pages requests have cached, keyed by page hash. A node holds a
//! run of pages; requests lock the path to the node their KV ends at, and only unlocked
//! leaves may be evicted, least recently used first and from the tail (a leaf may be cut
//! short). Evictable and protected (locked) sizes are kept in tokens, as the scheduler's
//! memory checks count them.
//!
//! The reference stamps nodes with the wall clock; here a logical clock ticks wherever it
//! reads the time, which keeps the order and makes runs repeatable.

use std::collections::{BTreeSet, HashMap};

use super::BlockMap;

/// A physical page of the pool.
pub type PageId = u32;

/// A node of the tree.
pub type NodeId = u32;

/// The pool's pages: never-used ones in order, then freed ones, most recently freed first.
pub struct PagePool {
    next_fresh: u32,
    free: Vec<PageId>,
    total: u32,
}

impl PagePool {
    fn new(total: u32) -> PagePool {
        PagePool {
            next_fresh: 0,
            free: Vec::new(),
            total,
        }
    }

    pub fn available(&self) -> u32 {
        self.free.len() as u32 + self.total - self.next_fresh
    }

    /// `count` pages, or `None` with nothing taken.
    pub fn allocate(&mut self, count: u32) -> Option<Vec<PageId>> {
        if self.available() < count {
            return None;
        }
        let recycled = (count as usize).min(self.free.len());
        let mut pages: Vec<PageId> = self.free.drain(self.free.len() - recycled..).collect();
        let fresh = count - recycled as u32;
        pages.extend(self.next_fresh..self.next_fresh + fresh);
        self.next_fresh += fresh;
        Some(pages)
    }

    pub fn free(&mut self, pages: &[PageId]) {
        self.free.extend_from_slice(pages);
    }
}

struct Node {
    children: BlockMap<NodeId>,
    parent: Option<NodeId>,
    /// Page hashes, one per page of `pages`.
    keys: Vec<u64>,
    pages: Vec<PageId>,
    lock_ref: u32,
    last_access: u64,
}

pub struct RadixCache {
    nodes: Vec<Option<Node>>,
    vacant: Vec<NodeId>,
    pub pool: PagePool,
    page: u32,
    /// Unlocked leaves by `(last access, node)`: the first is the next victim.
    evictable_leaves: BTreeSet<(u64, NodeId)>,
    /// Tokens in unlocked and locked nodes.
    pub evictable: u64,
    pub protected: u64,
    clock: u64,
    /// Counts the changes to which hashes the tree holds (inserts and evictions), so that a
    /// caller can tell that the prefix matches it computed still hold.
    generation: u64,
}

const ROOT: NodeId = 0;

impl RadixCache {
    pub fn new(total_tokens: u64, page: u32) -> RadixCache {
        let page = page.max(1);
        let root = Node {
            children: BlockMap::default(),
            parent: None,
            keys: Vec::new(),
            pages: Vec::new(),
            lock_ref: 0,
            last_access: 0,
        };
        RadixCache {
            nodes: vec![Some(root)],
            vacant: Vec::new(),
            pool: PagePool::new((total_tokens / u64::from(page)).min(u64::from(u32::MAX)) as u32),
            page,
            evictable_leaves: BTreeSet::new(),
            evictable: 0,
            protected: 0,
            clock: 0,
            generation: 0,
        }
    }

    pub fn root(&self) -> NodeId {
        ROOT
    }

    pub fn page(&self) -> u32 {
        self.page
    }

    /// Tokens of free pages.
    pub fn available_tokens(&self) -> u64 {
        u64::from(self.pool.available()) * u64::from(self.page)
    }

    /// Changes with every insert and eviction: equal generations, equal prefix matches.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn total_tokens(&self) -> u64 {
        u64::from(self.pool.total) * u64::from(self.page)
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id as usize].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id as usize].as_mut().expect("a live node")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn insert_node(&mut self, node: Node) -> NodeId {
        match self.vacant.pop() {
            Some(id) => {
                self.nodes[id as usize] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    /// Stamps a node, keeping the eviction order of an evictable leaf in step.
    fn touch(&mut self, id: NodeId, now: u64) {
        let before = self.node(id).last_access;
        if self.evictable_leaves.remove(&(before, id)) {
            self.evictable_leaves.insert((now, id));
        }
        self.node_mut(id).last_access = now;
    }

    fn make_evictable_leaf(&mut self, id: NodeId) {
        let t = self.node(id).last_access;
        self.evictable_leaves.insert((t, id));
    }

    fn drop_evictable_leaf(&mut self, id: NodeId) {
        let t = self.node(id).last_access;
        self.evictable_leaves.remove(&(t, id));
    }

    fn tokens(&self, pages: usize) -> u64 {
        pages as u64 * u64::from(self.page)
    }

    fn common(a: &[u64], b: &[u64]) -> usize {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        // Runs of eight pages compared at once: a request's path is hundreds of pages, and
        // `lpm` walks every waiting request's down the tree whenever the tree changed.
        let (runs, _) = a.as_chunks::<8>();
        let same = runs
            .iter()
            .zip(b.as_chunks::<8>().0)
            .take_while(|(x, y)| x.iter().zip(*y).fold(0, |diff, (p, q)| diff | (p ^ q)) == 0)
            .count()
            * 8;
        same + a[same..]
            .iter()
            .zip(&b[same..])
            .take_while(|(x, y)| x == y)
            .count()
    }

    /// Walks `keys` down the tree, stamping the path and splitting a node the match ends
    /// inside; returns the pages matched and the node the match ends at.
    pub fn match_prefix(&mut self, keys: &[u64]) -> (usize, NodeId) {
        let now = self.tick();
        self.touch(ROOT, now);
        let mut current = ROOT;
        let mut matched = 0;
        while matched < keys.len() {
            let Some(&child) = self.node(current).children.get(&keys[matched]) else {
                break;
            };
            let child_len = self.node(child).keys.len();
            let common = Self::common(&self.node(child).keys, &keys[matched..]);
            if common < child_len {
                if common > 0 {
                    current = self.split(child, common);
                }
                matched += common;
                break;
            }
            matched += common;
            current = child;
            self.touch(current, now);
        }
        (matched, current)
    }

    /// Pages of `keys` the tree holds, without touching it.
    pub fn prefix_match_len(&self, keys: &[u64]) -> usize {
        let mut current = ROOT;
        let mut matched = 0;
        while matched < keys.len() {
            let Some(&child) = self.node(current).children.get(&keys[matched]) else {
                break;
            };
            let node = self.node(child);
            let common = Self::common(&node.keys, &keys[matched..]);
            matched += common;
            if common < node.keys.len() {
                break;
            }
            current = child;
        }
        matched
    }

    /// Inserts pages `from..keys.len()` of a sequence whose first `from` pages end at
    /// `start` (a request's locked path): a leaf it owns alone may grow in place. Pages the
    /// tree already holds are not taken; returns the node the sequence's pages end at.
    pub fn insert_from(
        &mut self,
        start: NodeId,
        from: usize,
        keys: &[u64],
        pages: &[PageId],
    ) -> NodeId {
        if keys.len() == from {
            return start;
        }
        let now = self.tick();
        let mut up = Some(start);
        while let Some(id) = up {
            self.touch(id, now);
            up = self.node(id).parent;
        }
        let mut current = start;
        let mut offset = from;
        while offset < keys.len() {
            let node = self.node(current);
            let own_leaf = current != ROOT
                && node.children.is_empty()
                && (node.lock_ref == 0 || (current == start && node.lock_ref == 1));
            if own_leaf {
                self.extend_leaf(current, &keys[offset..], &pages[offset..], now);
                return current;
            }
            let Some(&child) = self.node(current).children.get(&keys[offset]) else {
                return self.create_child(current, &keys[offset..], &pages[offset..]);
            };
            let child_len = self.node(child).keys.len();
            let common = Self::common(&self.node(child).keys, &keys[offset..]);
            if common == child_len {
                offset += common;
                current = child;
                self.touch(current, now);
            } else {
                if common == 0 {
                    return current;
                }
                let middle = self.split(child, common);
                offset += common;
                if offset < keys.len() {
                    return self.create_child(middle, &keys[offset..], &pages[offset..]);
                }
                return middle;
            }
        }
        current
    }

    fn extend_leaf(&mut self, id: NodeId, keys: &[u64], pages: &[PageId], now: u64) {
        let tokens = self.tokens(keys.len());
        self.generation += 1;
        let node = self.node_mut(id);
        node.keys.extend_from_slice(keys);
        node.pages.extend_from_slice(pages);
        let locked = node.lock_ref > 0;
        self.touch(id, now);
        if locked {
            self.protected += tokens;
        } else {
            self.evictable += tokens;
        }
    }

    /// Cuts `child` after `at` pages: the front becomes a new node between it and its
    /// parent, with its lock count and stamp.
    fn split(&mut self, child: NodeId, at: usize) -> NodeId {
        let c = self.node_mut(child);
        let parent = c.parent;
        let first_key = c.keys[0];
        let rest_keys = c.keys.split_off(at);
        let front_keys = std::mem::replace(&mut c.keys, rest_keys);
        let rest_pages = c.pages.split_off(at);
        let front_pages = std::mem::replace(&mut c.pages, rest_pages);
        let (lock_ref, last_access, rest_first) = (c.lock_ref, c.last_access, c.keys[0]);
        let mut children = BlockMap::default();
        children.insert(rest_first, child);
        let middle = self.insert_node(Node {
            children,
            parent,
            keys: front_keys,
            pages: front_pages,
            lock_ref,
            last_access,
        });
        self.node_mut(child).parent = Some(middle);
        if let Some(p) = parent {
            self.node_mut(p).children.insert(first_key, middle);
        }
        middle
    }

    fn create_child(&mut self, parent: NodeId, keys: &[u64], pages: &[PageId]) -> NodeId {
        let now = self.tick();
        self.generation += 1;
        let id = self.insert_node(Node {
            children: BlockMap::default(),
            parent: Some(parent),
            keys: keys.to_vec(),
            pages: pages.to_vec(),
            lock_ref: 0,
            last_access: now,
        });
        self.drop_evictable_leaf(parent);
        self.node_mut(parent).children.insert(keys[0], id);
        self.make_evictable_leaf(id);
        self.evictable += self.tokens(keys.len());
        id
    }

    /// Locks the path from `id` up: its tokens are no longer evictable.
    pub fn lock(&mut self, id: NodeId) {
        let mut up = Some(id);
        while let Some(n) = up.filter(|&n| n != ROOT) {
            let tokens = self.tokens(self.node(n).keys.len());
            self.node_mut(n).lock_ref += 1;
            if self.node(n).lock_ref == 1 {
                self.drop_evictable_leaf(n);
                self.evictable -= tokens;
                self.protected += tokens;
            }
            up = self.node(n).parent;
        }
    }

    pub fn unlock(&mut self, id: NodeId) {
        let mut up = Some(id);
        while let Some(n) = up.filter(|&n| n != ROOT) {
            if self.node(n).lock_ref == 0 {
                break;
            }
            self.node_mut(n).lock_ref -= 1;
            if self.node(n).lock_ref == 0 {
                let tokens = self.tokens(self.node(n).keys.len());
                self.protected -= tokens;
                self.evictable += tokens;
                if self.node(n).children.is_empty() {
                    self.make_evictable_leaf(n);
                }
            }
            up = self.node(n).parent;
        }
    }

    /// The pages of the path from the root down to `id`, in order.
    pub fn path_pages(&self, id: NodeId) -> Vec<PageId> {
        let mut path = Vec::new();
        let mut at = id;
        while at != ROOT {
            path.push(at);
            at = self.node(at).parent.expect("a non-root node has a parent");
        }
        path.iter()
            .rev()
            .flat_map(|&n| self.node(n).pages.iter().copied())
            .collect()
    }

    /// The path from `id` up as `(pages, parent)` runs, deepest first: how a caller walks a
    /// sequence's cached pages backwards.
    pub fn node_pages(&self, id: NodeId) -> (&[PageId], Option<NodeId>) {
        let n = self.node(id);
        (&n.pages, n.parent)
    }

    /// Evicts at least `tokens` tokens of unlocked leaves (whole pages), least recently used
    /// first; returns the pages freed.
    pub fn evict(&mut self, tokens: u64) -> Vec<PageId> {
        let mut evicted = 0;
        let mut freed = Vec::new();
        while evicted < tokens {
            let Some(&(_, victim)) = self.evictable_leaves.first() else {
                break;
            };
            self.generation += 1;
            let victim_pages = self.node(victim).keys.len();
            let wanted = (tokens - evicted).div_ceil(u64::from(self.page)) as usize;
            let cut = wanted.min(victim_pages);
            if cut < victim_pages {
                let keep = victim_pages - cut;
                let node = self.node_mut(victim);
                node.keys.truncate(keep);
                let tail = node.pages.split_off(keep);
                self.pool.free(&tail);
                freed.extend(tail);
                let t = self.tokens(cut);
                self.evictable -= t;
                evicted += t;
                continue;
            }
            self.drop_evictable_leaf(victim);
            let node = self.nodes[victim as usize].take().expect("a live node");
            self.vacant.push(victim);
            let t = self.tokens(node.keys.len());
            self.evictable -= t;
            evicted += t;
            self.pool.free(&node.pages);
            freed.extend_from_slice(&node.pages);
            if let Some(p) = node.parent {
                self.node_mut(p).children.remove(&node.keys[0]);
                let parent = self.node(p);
                if p != ROOT && parent.children.is_empty() && parent.lock_ref == 0 {
                    self.make_evictable_leaf(p);
                }
            }
        }
        freed
    }
}

/// Which hashes the router has been told about, by page, so a page shared by several
/// requests' copies is announced once and withdrawn with its last copy.
#[derive(Default)]
pub struct PublishedPages {
    by_page: HashMap<PageId, u64>,
    copies: BlockMap<u32>,
}

impl PublishedPages {
    /// `page` now holds `hash`; true when the hash is new to the router.
    pub fn store(&mut self, page: PageId, hash: u64) -> bool {
        if self.by_page.contains_key(&page) {
            return false;
        }
        self.by_page.insert(page, hash);
        let n = self.copies.entry(hash).or_default();
        *n += 1;
        *n == 1
    }

    pub fn is_published(&self, page: PageId) -> bool {
        self.by_page.contains_key(&page)
    }

    /// `page` was freed; the hash the router must drop, if that was its last copy.
    pub fn remove(&mut self, page: PageId) -> Option<u64> {
        let hash = self.by_page.remove(&page)?;
        let n = self.copies.get_mut(&hash)?;
        *n -= 1;
        if *n == 0 {
            self.copies.remove(&hash);
            return Some(hash);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(cache: &mut RadixCache, keys: &[u64]) -> NodeId {
        let pages = cache.pool.allocate(keys.len() as u32).expect("room");
        cache.insert_from(ROOT, 0, keys, &pages)
    }

    /// Two paths' common pages, compared eight at a time, are the pages before their first
    /// difference: at every place in and around a run of eight, at every length.
    #[test]
    fn common_pages_end_at_the_first_difference() {
        let a: Vec<u64> = (0..40).map(|i| i * 7 + 1).collect();
        for len in 0..=40 {
            for differ in 0..=len {
                let mut b = a[..len].to_vec();
                if differ < len {
                    b[differ] ^= 1 << (differ % 64);
                }
                let expected = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                assert_eq!(expected, differ);
                assert_eq!(RadixCache::common(&a, &b), differ, "len {len}");
                assert_eq!(RadixCache::common(&b, &a), differ, "len {len}");
            }
        }
    }

    #[test]
    fn a_partial_match_splits_the_node_and_eviction_takes_the_oldest_leaf_from_its_tail() {
        let mut cache = RadixCache::new(16 * 4, 4);
        insert(&mut cache, &[1, 2, 3]);
        insert(&mut cache, &[1, 2, 7, 8]);
        assert_eq!(cache.prefix_match_len(&[1, 2, 3, 9]), 3);
        assert_eq!(cache.prefix_match_len(&[1, 2, 7]), 3);
        assert_eq!(cache.evictable, 5 * 4, "the shared [1, 2] is stored once");
        let (matched, node) = cache.match_prefix(&[1, 2, 7, 8]);
        assert_eq!(matched, 4);
        cache.lock(node);
        let freed = cache.evict(4);
        assert_eq!(freed.len(), 1, "one page of the unlocked leaf [3]");
        assert_eq!(cache.prefix_match_len(&[1, 2, 3]), 2);
        assert_eq!(cache.protected, 4 * 4);
        cache.unlock(node);
        assert_eq!(cache.evictable, 4 * 4);
    }

    #[test]
    fn published_pages_announce_a_hash_once_and_withdraw_it_with_its_last_copy() {
        let mut published = PublishedPages::default();
        assert!(published.store(0, 9));
        assert!(!published.store(1, 9));
        assert_eq!(published.remove(0), None);
        assert_eq!(published.remove(1), Some(9));
    }
}
