//! Eviction policies: which resident, unlocked object a tier gives up first.
//!
//! Every policy is deterministic (ordered maps, logical stamps, no hashing order), so a replay
//! evicts the same objects on every run. Locked objects are skipped, not forgotten: they
//! stay in the policy's order and become candidates again once unlocked.

use std::collections::BTreeMap;

use lru::LruCache;
use std::fmt;
use std::str::FromStr;

use super::{KeyId, KeyIdHasher, KeyMap};

/// The linked hash map behind LRU, FIFO and ARC's lists.
type LinkedKeys = LruCache<KeyId, (), std::hash::BuildHasherDefault<KeyIdHasher>>;

/// The policies kvtrace offers; `Lru`, `Arc` and `Noop` are LMCache's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Lru,
    Arc,
    Fifo,
    Lfu,
    Noop,
}

impl PolicyKind {
    /// The name LMCache's `--eviction-policy` uses (upper case) or kvtrace's own.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "LRU",
            PolicyKind::Arc => "ARC",
            PolicyKind::Fifo => "FIFO",
            PolicyKind::Lfu => "LFU",
            PolicyKind::Noop => "noop",
        }
    }

    pub fn build(self) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Lru => Box::new(Linked {
                promote_on_touch: true,
                ..Linked::default()
            }),
            PolicyKind::Fifo => Box::new(Linked::default()),
            PolicyKind::Lfu => Box::new(Frequency::default()),
            PolicyKind::Arc => Box::new(AdaptiveReplacement::default()),
            PolicyKind::Noop => Box::new(Noop),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "lru" => Ok(PolicyKind::Lru),
            "arc" => Ok(PolicyKind::Arc),
            "fifo" => Ok(PolicyKind::Fifo),
            "lfu" => Ok(PolicyKind::Lfu),
            "noop" | "none" => Ok(PolicyKind::Noop),
            _ => Err(format!(
                "unknown eviction policy {s:?} (LRU, ARC, FIFO, LFU, noop)"
            )),
        }
    }
}

/// Tracks the resident objects of one tier.
pub trait EvictionPolicy: Send {
    /// A new resident object.
    fn insert(&mut self, key: KeyId);
    /// A read of a resident object.
    fn touch(&mut self, key: KeyId);
    /// The object left the tier for another reason (deleted, moved).
    fn remove(&mut self, key: KeyId);
    /// Chooses and forgets the next victim for which `evictable` holds; `None` when no
    /// tracked object may be evicted.
    fn pick(&mut self, evictable: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId>;
}

/// LRU (touches move an object to the back) and FIFO (they do not): a linked hash map,
/// O(1) per operation however many objects are resident.
#[derive(Default)]
struct Linked {
    order: Queue,
    promote_on_touch: bool,
}

impl EvictionPolicy for Linked {
    fn insert(&mut self, key: KeyId) {
        self.order.push(key);
    }

    fn touch(&mut self, key: KeyId) {
        if self.promote_on_touch {
            self.order.promote(key);
        }
    }

    fn remove(&mut self, key: KeyId) {
        self.order.remove(key);
    }

    fn pick(&mut self, evictable: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        self.order.pop_oldest(evictable)
    }
}

/// LFU: fewest touches first, ties by least recent; an ordered index keyed by
/// (touches, logical time).
#[derive(Default)]
struct Frequency {
    clock: u64,
    rank: KeyMap<(u64, u64)>,
    order: BTreeMap<(u64, u64), KeyId>,
}

impl Frequency {
    fn place(&mut self, key: KeyId, rank: (u64, u64)) {
        if let Some(old) = self.rank.insert(key, rank) {
            self.order.remove(&old);
        }
        self.order.insert(rank, key);
    }
}

impl EvictionPolicy for Frequency {
    fn insert(&mut self, key: KeyId) {
        self.clock += 1;
        self.place(key, (0, self.clock));
    }

    fn touch(&mut self, key: KeyId) {
        let Some(&(freq, _)) = self.rank.get(&key) else {
            return;
        };
        self.clock += 1;
        self.place(key, (freq + 1, self.clock));
    }

    fn remove(&mut self, key: KeyId) {
        if let Some(rank) = self.rank.remove(&key) {
            self.order.remove(&rank);
        }
    }

    fn pick(&mut self, evictable: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        let (&rank, &key) = self.order.iter().find(|(_, k)| evictable(**k))?;
        self.order.remove(&rank);
        self.rank.remove(&key);
        Some(key)
    }
}

/// Adaptive Replacement Cache (Megiddo & Modha, FAST '03), counting objects: T1 holds
/// objects seen once, T2 objects seen again; the ghost lists B1 and B2 remember recent
/// victims of each and steer the target size `p` of T1.
#[derive(Default)]
struct AdaptiveReplacement {
    t1: Queue,
    t2: Queue,
    b1: Queue,
    b2: Queue,
    /// Target number of objects in T1.
    p: usize,
}

/// An insertion-ordered set, O(1) per operation: the order behind LRU and FIFO, and each of
/// ARC's four lists.
struct Queue {
    order: LinkedKeys,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            order: LinkedKeys::unbounded_with_hasher(Default::default()),
        }
    }
}

impl Queue {
    /// Adds a key as the newest, or makes an existing one the newest.
    fn push(&mut self, key: KeyId) {
        self.order.push(key, ());
    }

    /// Makes an existing key the newest; does nothing for an unknown one.
    fn promote(&mut self, key: KeyId) {
        self.order.promote(&key);
    }

    fn remove(&mut self, key: KeyId) -> bool {
        self.order.pop(&key).is_some()
    }

    fn contains(&self, key: KeyId) -> bool {
        self.order.contains(&key)
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn pop_oldest(&mut self, evictable: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        let victim = self
            .order
            .iter()
            .rev()
            .map(|(k, _)| *k)
            .find(|k| evictable(*k))?;
        self.order.pop(&victim);
        Some(victim)
    }

    fn trim(&mut self, max: usize) {
        while self.order.len() > max {
            self.order.pop_lru();
        }
    }
}

impl EvictionPolicy for AdaptiveReplacement {
    fn insert(&mut self, key: KeyId) {
        let resident = self.t1.len() + self.t2.len();
        if self.b1.remove(key) {
            let step = (self.b2.len() / self.b1.len().max(1)).max(1);
            self.p = (self.p + step).min(resident.max(1));
            self.t2.push(key);
        } else if self.b2.remove(key) {
            let step = (self.b1.len() / self.b2.len().max(1)).max(1);
            self.p = self.p.saturating_sub(step);
            self.t2.push(key);
        } else {
            self.t1.push(key);
        }
        // Ghost lists remember at most as many keys as are resident.
        let cap = (self.t1.len() + self.t2.len()).max(1);
        self.b1.trim(cap);
        self.b2.trim(cap);
    }

    fn touch(&mut self, key: KeyId) {
        if self.t1.remove(key) || self.t2.contains(key) {
            self.t2.push(key);
        }
    }

    fn remove(&mut self, key: KeyId) {
        self.t1.remove(key);
        self.t2.remove(key);
    }

    fn pick(&mut self, evictable: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        let from_t1_first = self.t1.len() > self.p || self.t2.len() == 0;
        let order: [bool; 2] = if from_t1_first {
            [true, false]
        } else {
            [false, true]
        };
        for from_t1 in order {
            let (list, ghost) = if from_t1 {
                (&mut self.t1, &mut self.b1)
            } else {
                (&mut self.t2, &mut self.b2)
            };
            if let Some(victim) = list.pop_oldest(evictable) {
                ghost.push(victim);
                return Some(victim);
            }
        }
        None
    }
}

/// Never evicts: a full tier refuses new objects instead.
struct Noop;

impl EvictionPolicy for Noop {
    fn insert(&mut self, _: KeyId) {}
    fn touch(&mut self, _: KeyId) {}
    fn remove(&mut self, _: KeyId) {}
    fn pick(&mut self, _: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u128) -> KeyId {
        KeyId(n)
    }

    fn drain(p: &mut dyn EvictionPolicy, locked: &[u128]) -> Vec<u128> {
        let mut out = Vec::new();
        while let Some(v) = p.pick(&mut |key| !locked.contains(&key.0)) {
            out.push(v.0);
        }
        out
    }

    fn run(kind: PolicyKind) -> Vec<u128> {
        let mut p = kind.build();
        for n in 1..=4 {
            p.insert(k(n));
        }
        p.touch(k(1));
        p.touch(k(1));
        p.touch(k(3));
        drain(p.as_mut(), &[2])
    }

    #[test]
    fn each_policy_evicts_in_its_own_order_and_skips_locked_objects() {
        assert_eq!(run(PolicyKind::Lru), vec![4, 1, 3]);
        assert_eq!(run(PolicyKind::Fifo), vec![1, 3, 4]);
        assert_eq!(run(PolicyKind::Lfu), vec![4, 3, 1]);
        // ARC: 1 and 3 were seen twice (T2); 4 only once (T1) goes first.
        assert_eq!(run(PolicyKind::Arc), vec![4, 1, 3]);
        assert_eq!(run(PolicyKind::Noop), Vec::<u128>::new());
    }

    #[test]
    fn locked_objects_become_candidates_again_once_unlocked() {
        let mut p = PolicyKind::Lru.build();
        p.insert(k(1));
        p.insert(k(2));
        assert_eq!(drain(p.as_mut(), &[1]), vec![2]);
        assert_eq!(drain(p.as_mut(), &[]), vec![1]);
    }

    #[test]
    fn arc_adapts_towards_recency_after_a_ghost_hit_in_b1() {
        let mut arc = AdaptiveReplacement::default();
        for n in 1..=3 {
            arc.insert(k(n));
        }
        assert_eq!(arc.pick(&mut |_| true), Some(k(1)));
        assert_eq!(arc.p, 0);
        arc.insert(k(1)); // ghost hit in B1: T1 deserved more room
        assert_eq!(arc.p, 1);
        assert!(arc.t2.contains(k(1)));
    }

    #[test]
    fn names_parse_case_insensitively() {
        assert_eq!("lru".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
        assert_eq!("ARC".parse::<PolicyKind>(), Ok(PolicyKind::Arc));
        assert!("IsolatedLRU".parse::<PolicyKind>().is_err());
    }
}
