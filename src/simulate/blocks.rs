//! The engine's KV block pool with prefix caching: physical blocks of `block_size` tokens;
//! a full prompt block is registered under its chained hash and stays reusable after its
//! request ends, on an LRU list of inactive blocks, until a fresh block is needed.

use super::BlockMap;

/// What the router's index learns from the pool after each pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEvent {
    Stored(u64),
    Removed(u64),
}

const NONE: u32 = u32::MAX;

pub struct BlockPool {
    capacity: u32,
    refs: Vec<u32>,
    hash: Vec<Option<u64>>,
    /// Inactive registered blocks, least recently released first.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    /// Blocks that hold nothing reusable.
    free: Vec<u32>,
    cached: BlockMap<u32>,
    active: u32,
    prefix_caching: bool,
    events: Option<Vec<KvEvent>>,
}

impl BlockPool {
    pub fn new(capacity: u64, prefix_caching: bool, track_events: bool) -> BlockPool {
        let capacity = capacity.min(u64::from(u32::MAX - 1)) as u32;
        BlockPool {
            capacity,
            refs: Vec::new(),
            hash: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            head: NONE,
            tail: NONE,
            free: Vec::new(),
            cached: BlockMap::default(),
            active: 0,
            prefix_caching,
            events: track_events.then(Vec::new),
        }
    }

    pub fn capacity(&self) -> u64 {
        u64::from(self.capacity)
    }

    /// Blocks referenced by running requests.
    pub fn active(&self) -> u64 {
        u64::from(self.active)
    }

    /// How many leading blocks of `hashes` are cached, and how many of those are active.
    pub fn match_prefix(&self, hashes: &[u64]) -> (usize, u64) {
        if !self.prefix_caching {
            return (0, 0);
        }
        let mut active = 0;
        for (i, h) in hashes.iter().enumerate() {
            match self.cached.get(h) {
                Some(&b) => active += u64::from(self.refs[b as usize] > 0),
                None => return (i, active),
            }
        }
        (hashes.len(), active)
    }

    /// Takes a reference on the cached block of `hash` (found by [`BlockPool::match_prefix`]).
    pub fn acquire(&mut self, hash: u64) -> u32 {
        let b = self.cached[&hash];
        if self.refs[b as usize] == 0 {
            self.unlink(b);
            self.active += 1;
        }
        self.refs[b as usize] += 1;
        b
    }

    /// A block for new tokens: a never-used or empty one first, else the least recently
    /// released cached block (which leaves the cache). `None` when every block is active.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = if let Some(b) = self.free.pop() {
            b
        } else if (self.refs.len() as u32) < self.capacity {
            self.refs.push(0);
            self.hash.push(None);
            self.prev.push(NONE);
            self.next.push(NONE);
            self.refs.len() as u32 - 1
        } else if self.head != NONE {
            let b = self.head;
            self.unlink(b);
            if let Some(h) = self.hash[b as usize].take() {
                self.cached.remove(&h);
                if let Some(e) = self.events.as_mut() {
                    e.push(KvEvent::Removed(h));
                }
            }
            b
        } else {
            return None;
        };
        self.refs[b as usize] = 1;
        self.active += 1;
        Some(b)
    }

    /// Makes a full prompt block visible to later requests; a second copy of a hash stays
    /// private.
    pub fn register(&mut self, block: u32, hash: u64) {
        if !self.prefix_caching || self.hash[block as usize].is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.cached.entry(hash) {
            slot.insert(block);
            self.hash[block as usize] = Some(hash);
            if let Some(e) = self.events.as_mut() {
                e.push(KvEvent::Stored(hash));
            }
        }
    }

    /// Drops a request's references, leaf first, so its suffix is evicted before a prefix
    /// other requests share.
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let r = &mut self.refs[b as usize];
            *r -= 1;
            if *r > 0 {
                continue;
            }
            self.active -= 1;
            if self.hash[b as usize].is_some() {
                self.push_tail(b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Events since the last call (empty unless tracking).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NONE {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NONE;
        self.next[b as usize] = NONE;
    }

    fn push_tail(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NONE;
        if self.tail == NONE {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_prefixes_stay_reusable_until_evicted_leaf_first() {
        let mut pool = BlockPool::new(3, true, true);
        let a: Vec<u32> = (0..3).map(|_| pool.allocate().expect("room")).collect();
        assert_eq!(pool.allocate(), None, "all active");
        for (b, h) in a.iter().zip([10, 11, 12]) {
            pool.register(*b, h);
        }
        pool.release(&a);
        assert_eq!(pool.active(), 0);
        assert_eq!(pool.match_prefix(&[10, 11, 99]), (2, 0));
        pool.allocate().expect("evicts the leaf");
        assert_eq!(pool.match_prefix(&[10, 11, 12]), (2, 0), "12 left first");
        assert_eq!(pool.acquire(10), a[0]);
        assert_eq!(pool.match_prefix(&[10, 11]), (2, 1));
        assert_eq!(
            pool.take_events(),
            [
                KvEvent::Stored(10),
                KvEvent::Stored(11),
                KvEvent::Stored(12),
                KvEvent::Removed(12)
            ]
        );
    }
}
