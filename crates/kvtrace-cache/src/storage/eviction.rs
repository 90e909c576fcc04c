//! Eviction policies: which tracked objects a tier gives up, and in what order.
//!
//! The interface is LMCache 0.5.6's (`lmcache/v1/distributed/eviction.py`): a policy hears
//! about reservations, admissions, touches and removals as batches in request order, and an
//! eviction pass asks it for a number of victims among the keys the tier says may go. LRU and
//! ARC follow LMCache's implementations step for step, because which object an eviction pass
//! picks decides every later hit of a replay: batches are applied last key first (so the
//! tail of a request is evicted before its prefix, which a prefix match needs), a reservation
//! is tracked like an admission, and ARC is LMCache's batch variant (the largest resident
//! count seen is its capacity; ghost hits on reservation adapt the T1 target; a victim only
//! enters a ghost list once its removal is confirmed). FIFO and LFU are kvtrace's own.
//!
//! Every policy is deterministic: linked queues and logical stamps, never hash order.
//! Selection walks from the eviction end and skips ineligible (locked) keys without moving
//! them, so an eviction costs O(victims + skipped) and a touch or removal O(1) (LFU: O(log n)).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::queue::Queue;
use super::{KeyId, KeyMap, KeySet};

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
            PolicyKind::Lru => Box::new(Linked::new(true)),
            PolicyKind::Fifo => Box::new(Linked::new(false)),
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

/// How many victims one eviction pass asks for: LMCache's `int(tracked * ratio)`, at least one
/// when the ratio is positive and anything is tracked.
pub fn victim_count(tracked: usize, ratio: f64) -> usize {
    let ratio = ratio.clamp(0.0, 1.0);
    let n = (tracked as f64 * ratio) as usize;
    if n == 0 && ratio > 0.0 && tracked > 0 {
        1
    } else {
        n
    }
}

/// Tracks the objects of one tier, in LMCache's listener vocabulary. Key slices are in
/// request order.
pub trait EvictionPolicy: Send {
    /// Keys reserved for writing: tracked from then on, so an abandoned reservation is
    /// evicted like any unlocked key once its write lock lapses.
    fn on_reserved(&mut self, keys: &[KeyId]) {
        self.on_created(keys);
    }
    /// Keys that became resident (admitted, or loaded from a lower tier).
    fn on_created(&mut self, keys: &[KeyId]);
    /// Keys that were used (a prefetch hit, the end of a client's session).
    fn on_touched(&mut self, keys: &[KeyId]);
    /// Keys that left the tier.
    fn on_removed(&mut self, keys: &[KeyId]);
    /// Up to `count` victims for which `eligible` holds, in eviction order. The caller removes
    /// them and reports that with [`EvictionPolicy::on_removed`].
    fn select(&mut self, count: usize, eligible: &mut dyn FnMut(KeyId) -> bool) -> Vec<KeyId>;
    /// The first victim [`EvictionPolicy::select`] would give, without a list: immediate
    /// eviction asks for one at a time, once per object it makes room for.
    fn select_one(&mut self, eligible: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        self.select(1, eligible).pop()
    }
    /// Keys the policy tracks: what an eviction pass's ratio is taken of.
    fn tracked(&self) -> usize;
}

/// LRU (touches and re-admissions move a key to the back) and FIFO (they do not).
struct Linked {
    order: Queue,
    recency: bool,
}

impl Linked {
    fn new(recency: bool) -> Linked {
        Linked {
            order: Queue::default(),
            recency,
        }
    }
}

impl EvictionPolicy for Linked {
    fn on_created(&mut self, keys: &[KeyId]) {
        for &key in keys.iter().rev() {
            if self.recency || !self.order.contains(key) {
                self.order.push(key);
            }
        }
    }

    fn on_touched(&mut self, keys: &[KeyId]) {
        if self.recency {
            for &key in keys.iter().rev() {
                self.order.promote(key);
            }
        }
    }

    fn on_removed(&mut self, keys: &[KeyId]) {
        for &key in keys {
            self.order.remove(key);
        }
    }

    fn select(&mut self, count: usize, eligible: &mut dyn FnMut(KeyId) -> bool) -> Vec<KeyId> {
        self.order
            .oldest_first()
            .filter(|k| eligible(*k))
            .take(count)
            .collect()
    }

    fn select_one(&mut self, eligible: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        self.order.oldest_first().find(|&k| eligible(k))
    }

    fn tracked(&self) -> usize {
        self.order.len()
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
    fn on_created(&mut self, keys: &[KeyId]) {
        for &key in keys.iter().rev() {
            if !self.rank.contains_key(&key) {
                self.clock += 1;
                self.place(key, (0, self.clock));
            }
        }
    }

    fn on_touched(&mut self, keys: &[KeyId]) {
        for &key in keys.iter().rev() {
            if let Some(&(freq, _)) = self.rank.get(&key) {
                self.clock += 1;
                self.place(key, (freq + 1, self.clock));
            }
        }
    }

    fn on_removed(&mut self, keys: &[KeyId]) {
        for key in keys {
            if let Some(rank) = self.rank.remove(key) {
                self.order.remove(&rank);
            }
        }
    }

    fn select(&mut self, count: usize, eligible: &mut dyn FnMut(KeyId) -> bool) -> Vec<KeyId> {
        self.order
            .values()
            .copied()
            .filter(|k| eligible(*k))
            .take(count)
            .collect()
    }

    fn select_one(&mut self, eligible: &mut dyn FnMut(KeyId) -> bool) -> Option<KeyId> {
        self.order.values().copied().find(|&k| eligible(k))
    }

    fn tracked(&self) -> usize {
        self.rank.len()
    }
}

/// LMCache's Adaptive Replacement Cache (`eviction_policy/arc.py`): T1 holds keys seen once,
/// T2 keys seen again; B1 and B2 remember confirmed victims of each and steer the T1 target.
/// Eviction is a pressure-driven batch, not ARC's per-miss REPLACE, so the capacity is the
/// largest resident count observed and an equality at the boundary selects from T1.
#[derive(Default)]
struct AdaptiveReplacement {
    t1: Queue,
    t2: Queue,
    b1: Queue,
    b2: Queue,
    /// Reserved keys whose admission must not count as a second access.
    pending_admissions: KeySet,
    /// Keys the last selections returned: their removal sends them to a ghost list.
    pending_evictions: KeySet,
    target_t1: f64,
    capacity: usize,
}

impl AdaptiveReplacement {
    fn resident(&self) -> usize {
        self.t1.len() + self.t2.len()
    }

    fn forget(&mut self, key: KeyId) {
        self.t1.remove(key);
        self.t2.remove(key);
        self.b1.remove(key);
        self.b2.remove(key);
    }

    /// How far a ghost hit moves the T1 target: `max(1, |other| / |hit|)`.
    fn delta(hit: &Queue, other: &Queue) -> f64 {
        (other.len() as f64 / hit.len() as f64).max(1.0)
    }

    fn grow_target(&mut self) {
        self.target_t1 =
            (self.target_t1 + Self::delta(&self.b1, &self.b2)).min(self.capacity as f64);
    }

    fn shrink_target(&mut self) {
        self.target_t1 = (self.target_t1 - Self::delta(&self.b2, &self.b1)).max(0.0);
    }

    fn trim_ghosts(&mut self) {
        if self.capacity == 0 {
            return;
        }
        while self.t1.len() + self.b1.len() > self.capacity && self.b1.len() > 0 {
            self.b1.pop_oldest();
        }
        while self.resident() + self.b1.len() + self.b2.len() > 2 * self.capacity {
            let ghost = if self.b2.len() > 0 {
                &mut self.b2
            } else {
                &mut self.b1
            };
            if ghost.pop_oldest().is_none() {
                break;
            }
        }
    }

    fn note_capacity(&mut self) {
        self.capacity = self.capacity.max(self.resident());
    }
}

impl EvictionPolicy for AdaptiveReplacement {
    fn on_reserved(&mut self, keys: &[KeyId]) {
        for &key in keys.iter().rev() {
            self.pending_evictions.remove(&key);
            self.pending_admissions.insert(key);
            if self.b1.contains(key) {
                self.grow_target();
            } else if self.b2.contains(key) {
                self.shrink_target();
            }
            self.forget(key);
            self.t1.push(key);
            self.note_capacity();
            self.trim_ghosts();
        }
    }

    fn on_created(&mut self, keys: &[KeyId]) {
        for &key in keys.iter().rev() {
            self.pending_evictions.remove(&key);
            if self.pending_admissions.remove(&key) {
                continue;
            }
            // Seen again: from T1, or refreshed within T2.
            if self.t1.remove(key) || self.t2.contains(key) {
                self.t2.push(key);
            } else if self.b1.contains(key) {
                self.grow_target();
                self.b1.remove(key);
                self.t2.push(key);
            } else if self.b2.contains(key) {
                self.shrink_target();
                self.b2.remove(key);
                self.t2.push(key);
            } else {
                self.forget(key);
                self.t1.push(key);
            }
            self.note_capacity();
            self.trim_ghosts();
        }
    }

    fn on_touched(&mut self, keys: &[KeyId]) {
        for &key in keys.iter().rev() {
            if self.t1.remove(key) || self.t2.contains(key) {
                self.t2.push(key);
            }
        }
    }

    fn on_removed(&mut self, keys: &[KeyId]) {
        for &key in keys {
            if self.pending_evictions.contains(&key) {
                if self.t1.remove(key) {
                    self.b1.push(key);
                } else if self.t2.remove(key) {
                    self.b2.push(key);
                }
            } else {
                self.forget(key);
            }
            self.pending_admissions.remove(&key);
            self.pending_evictions.remove(&key);
        }
        self.trim_ghosts();
    }

    fn select(&mut self, count: usize, eligible: &mut dyn FnMut(KeyId) -> bool) -> Vec<KeyId> {
        if self.resident() == 0 || count == 0 {
            return Vec::new();
        }
        self.note_capacity();
        self.target_t1 = self.target_t1.min(self.capacity as f64);
        self.trim_ghosts();
        let boundary = self.target_t1 as usize;
        let mut virtual_t1 = self.t1.len();
        let mut victims = Vec::with_capacity(count.min(self.resident()));
        let (mut t1, mut t2) = (self.t1.oldest_first(), self.t2.oldest_first());
        while victims.len() < count {
            let mut from_t1 = false;
            let mut candidate = None;
            if virtual_t1 >= boundary {
                candidate = t1.find(|&k| eligible(k));
                from_t1 = candidate.is_some();
            }
            if candidate.is_none() {
                candidate = t2.find(|&k| eligible(k));
            }
            if candidate.is_none() {
                candidate = t1.find(|&k| eligible(k));
                from_t1 = candidate.is_some();
            }
            let Some(key) = candidate else { break };
            if from_t1 {
                virtual_t1 = virtual_t1.saturating_sub(1);
            }
            victims.push(key);
        }
        drop((t1, t2));
        self.pending_evictions.extend(victims.iter().copied());
        victims
    }

    fn tracked(&self) -> usize {
        self.resident()
    }
}

/// LMCache's `noop`: tracks nothing, never evicts; a full tier refuses new objects instead.
struct Noop;

impl EvictionPolicy for Noop {
    fn on_created(&mut self, _: &[KeyId]) {}
    fn on_touched(&mut self, _: &[KeyId]) {}
    fn on_removed(&mut self, _: &[KeyId]) {}
    fn select(&mut self, _: usize, _: &mut dyn FnMut(KeyId) -> bool) -> Vec<KeyId> {
        Vec::new()
    }
    fn tracked(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u128) -> KeyId {
        KeyId(n)
    }

    fn ks(ns: &[u128]) -> Vec<KeyId> {
        ns.iter().map(|&n| k(n)).collect()
    }

    fn ids(keys: &[KeyId]) -> Vec<u128> {
        keys.iter().map(|k| k.0).collect()
    }

    /// Selects everything eligible, then removes it, as an eviction pass does.
    fn drain(p: &mut dyn EvictionPolicy, locked: &[u128]) -> Vec<u128> {
        let victims = p.select(usize::MAX, &mut |key| !locked.contains(&{ key.0 }));
        p.on_removed(&victims);
        ids(&victims)
    }

    #[test]
    fn a_batch_is_applied_last_key_first_so_the_tail_of_a_request_goes_first() {
        for kind in [
            PolicyKind::Lru,
            PolicyKind::Fifo,
            PolicyKind::Lfu,
            PolicyKind::Arc,
        ] {
            let mut p = kind.build();
            p.on_created(&ks(&[1, 2, 3]));
            assert_eq!(drain(p.as_mut(), &[]), vec![3, 2, 1], "{kind}");
        }
    }

    #[test]
    fn each_policy_evicts_in_its_own_order_and_skips_locked_objects() {
        let run = |kind: PolicyKind| {
            let mut p = kind.build();
            for n in 1..=4 {
                p.on_created(&[k(n)]);
            }
            p.on_touched(&[k(1)]);
            p.on_touched(&[k(1)]);
            p.on_touched(&[k(3)]);
            drain(p.as_mut(), &[2])
        };
        assert_eq!(run(PolicyKind::Lru), vec![4, 1, 3]);
        assert_eq!(run(PolicyKind::Fifo), vec![1, 3, 4]);
        assert_eq!(run(PolicyKind::Lfu), vec![4, 3, 1]);
        // ARC: 1 and 3 were seen again (T2); 4 only once (T1) goes first.
        assert_eq!(run(PolicyKind::Arc), vec![4, 1, 3]);
        assert_eq!(run(PolicyKind::Noop), Vec::<u128>::new());
    }

    #[test]
    fn locked_objects_stay_tracked_and_become_candidates_once_unlocked() {
        let mut p = PolicyKind::Lru.build();
        p.on_created(&[k(1)]);
        p.on_created(&[k(2)]);
        assert_eq!(drain(p.as_mut(), &[1]), vec![2]);
        assert_eq!(p.tracked(), 1);
        assert_eq!(drain(p.as_mut(), &[]), vec![1]);
    }

    #[test]
    fn victim_count_is_lmcache_int_of_ratio_times_tracked_and_at_least_one() {
        assert_eq!(victim_count(28, 0.2), 5);
        assert_eq!(victim_count(32, 0.2), 6);
        assert_eq!(victim_count(3, 0.2), 1);
        assert_eq!(victim_count(0, 0.2), 0);
        assert_eq!(victim_count(10, 0.0), 0);
        assert_eq!(victim_count(10, 7.0), 10);
    }

    #[test]
    fn arc_admission_of_a_reserved_key_is_not_a_second_access() {
        let mut arc = AdaptiveReplacement::default();
        arc.on_reserved(&ks(&[1, 2]));
        arc.on_created(&ks(&[1, 2]));
        assert_eq!(arc.t1.len(), 2);
        assert_eq!(arc.t2.len(), 0);
        arc.on_touched(&[k(1)]);
        assert!(arc.t2.contains(k(1)));
    }

    #[test]
    fn arc_moves_confirmed_victims_to_ghosts_and_a_ghost_reservation_grows_the_t1_target() {
        let mut arc = AdaptiveReplacement::default();
        arc.on_created(&ks(&[3, 2, 1]));
        let victims = arc.select(1, &mut |_| true);
        assert_eq!(ids(&victims), vec![1]);
        arc.on_removed(&victims);
        assert!(arc.b1.contains(k(1)));
        assert_eq!(arc.target_t1, 0.0);
        arc.on_reserved(&[k(1)]);
        assert_eq!(arc.target_t1, 1.0);
        assert!(arc.t1.contains(k(1)));
    }

    #[test]
    fn arc_removal_without_a_selection_forgets_the_key() {
        let mut arc = AdaptiveReplacement::default();
        arc.on_created(&ks(&[1]));
        arc.on_removed(&ks(&[1]));
        assert_eq!(arc.b1.len() + arc.t1.len(), 0);
    }

    #[test]
    fn arc_takes_from_t2_once_t1_is_below_its_target() {
        let mut arc = AdaptiveReplacement::default();
        arc.on_created(&ks(&[1, 2]));
        arc.on_touched(&ks(&[1, 2]));
        arc.on_created(&ks(&[3]));
        arc.target_t1 = 2.0;
        // T1 = [3] is below the target of 2: T2's oldest goes — 2, as the touch applied the
        // batch last key first.
        assert_eq!(ids(&arc.select(1, &mut |_| true)), vec![2]);
    }

    #[test]
    fn names_parse_case_insensitively() {
        assert_eq!("lru".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
        assert_eq!("ARC".parse::<PolicyKind>(), Ok(PolicyKind::Arc));
        assert!("IsolatedLRU".parse::<PolicyKind>().is_err());
    }
}
