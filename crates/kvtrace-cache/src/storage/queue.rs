//! An insertion-ordered set of key ids: LRU's and FIFO's order, and each of ARC's four
//! lists. Every operation is O(1), and none allocates once the set has reached its largest
//! size: the nodes live in one vector, linked by index, and a removed node's slot is reused.
//! (A list of boxed nodes allocated and freed one node per eviction and per admission, which
//! was a tenth of an as-fast-as-possible replay.)

use super::{KeyId, KeyMap};

/// No node: the end of the list.
const NIL: usize = usize::MAX;

struct Node {
    key: KeyId,
    older: usize,
    newer: usize,
}

pub(super) struct Queue {
    slot: KeyMap<usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    oldest: usize,
    newest: usize,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            slot: KeyMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            oldest: NIL,
            newest: NIL,
        }
    }
}

impl Queue {
    /// Adds a key as the newest, or makes an existing one the newest.
    pub(super) fn push(&mut self, key: KeyId) {
        if let Some(&at) = self.slot.get(&key) {
            self.unlink(at);
            self.link_newest(at);
            return;
        }
        let node = Node {
            key,
            older: NIL,
            newer: NIL,
        };
        let at = match self.free.pop() {
            Some(at) => {
                self.nodes[at] = node;
                at
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.slot.insert(key, at);
        self.link_newest(at);
    }

    /// Makes an existing key the newest; does nothing for an unknown one.
    pub(super) fn promote(&mut self, key: KeyId) {
        if let Some(&at) = self.slot.get(&key) {
            self.unlink(at);
            self.link_newest(at);
        }
    }

    pub(super) fn remove(&mut self, key: KeyId) -> bool {
        let Some(at) = self.slot.remove(&key) else {
            return false;
        };
        self.unlink(at);
        self.free.push(at);
        true
    }

    pub(super) fn contains(&self, key: KeyId) -> bool {
        self.slot.contains_key(&key)
    }

    pub(super) fn len(&self) -> usize {
        self.slot.len()
    }

    pub(super) fn pop_oldest(&mut self) -> Option<KeyId> {
        let key = self.nodes.get(self.oldest)?.key;
        self.remove(key);
        Some(key)
    }

    /// The keys from the oldest to the newest, walking the links without copying them.
    pub(super) fn oldest_first(&self) -> impl Iterator<Item = KeyId> + '_ {
        let mut at = self.oldest;
        std::iter::from_fn(move || {
            let node = self.nodes.get(at)?;
            at = node.newer;
            Some(node.key)
        })
    }

    fn unlink(&mut self, at: usize) {
        let (older, newer) = (self.nodes[at].older, self.nodes[at].newer);
        match self.nodes.get_mut(older) {
            Some(node) => node.newer = newer,
            None => self.oldest = newer,
        }
        match self.nodes.get_mut(newer) {
            Some(node) => node.older = older,
            None => self.newest = older,
        }
    }

    fn link_newest(&mut self, at: usize) {
        self.nodes[at].older = self.newest;
        self.nodes[at].newer = NIL;
        match self.nodes.get_mut(self.newest) {
            Some(node) => node.newer = at,
            None => self.oldest = at,
        }
        self.newest = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same operations on a plain vector, oldest first.
    fn model(ops: &[(u8, u8)]) -> Vec<KeyId> {
        let mut v: Vec<KeyId> = Vec::new();
        for &(op, k) in ops {
            let key = KeyId(k.into());
            let pos = v.iter().position(|&x| x == key);
            match (op % 4, pos) {
                (0, Some(i)) | (1, Some(i)) => {
                    v.remove(i);
                    v.push(key);
                }
                (0, None) => v.push(key),
                (2, Some(i)) => {
                    v.remove(i);
                }
                (3, _) if !v.is_empty() => {
                    v.remove(0);
                }
                _ => {}
            }
        }
        v
    }

    #[test]
    fn every_sequence_of_operations_keeps_the_order_a_list_would() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..300 {
            let mut ops = Vec::new();
            let mut q = Queue::default();
            for _ in 0..60 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let (op, k) = ((state % 4) as u8, ((state >> 8) % 6) as u8);
                ops.push((op, k));
                let key = KeyId(k.into());
                match op {
                    0 => q.push(key),
                    1 => q.promote(key),
                    2 => {
                        let was = q.contains(key);
                        assert_eq!(q.remove(key), was);
                    }
                    _ => {
                        let oldest = q.oldest_first().next();
                        assert_eq!(q.pop_oldest(), oldest);
                    }
                }
                let expected = model(&ops);
                assert_eq!(q.oldest_first().collect::<Vec<_>>(), expected, "{ops:?}");
                assert_eq!(q.len(), expected.len());
            }
        }
    }
}
