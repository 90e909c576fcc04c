//! The best hit count any eviction policy could reach at an L1 capacity: Belady's offline
//! rule (keep the objects needed soonest), made prefix-aware, so each policy's curve has the
//! bound it is measured against.
//!
//! The uses are the trace's lookups and stores in order. At a lookup, chunk `i` hits when
//! chunks `1..=i` are all resident (LMCache hits the longest resident prefix). After any use,
//! the chunks it named may stay resident — a stored chunk and, as the stack-distance curve
//! assumes, a chunk the lookup missed (the client stores its misses) — and when more than the
//! capacity would stay, the ones needed last go. A chunk is *needed* at its next lookup; if a
//! store names it first, it comes back for nothing then, so it is not needed before that.
//!
//! Why this is optimal for prefix hits, not only for single chunks: chunk keys are chained (a
//! chunk's key names its whole prefix), so every lookup of a chunk is a lookup of its parent,
//! and a parent is never needed later than its child. Evicting the latest-needed first (the
//! deeper chunk on a tie) therefore keeps every resident prefix whole at each lookup, and the
//! chunk hits it counts are prefix hits. Farthest-need eviction maximises single-chunk hits
//! (the exchange argument of Belady's MIN, uniform sizes, optional admission), and prefix
//! hits can be no more than those. A test holds it to an exhaustive search over every
//! admission and eviction choice on small traces.
//!
//! Every real policy — LRU, ARC, FIFO, LFU under LMCache's controller, with the recorded
//! client — makes choices this bound considers, so its replay hits no more (objects of one
//! size, capacity in whole objects as [`crate::stack::LruCurve::capacity`] counts them).

use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

use crate::error::Result;
use crate::lmct::{ReadOptions, TraceReader};
use crate::stack::{objects_in, one_group, OneSize};
use crate::storage::KeyId;
use kvtrace_replay::dispatch::{Call, Decoder};

/// A use that is never needed again.
const NEVER: u32 = u32::MAX;

/// The trace's lookups and stores, keys numbered, each occurrence with the use that next
/// needs its key.
#[derive(Clone, Debug, Default)]
pub struct Uses {
    /// The size of every object.
    pub object_bytes: u64,
    pub lookups: u64,
    pub looked_up_chunks: u64,
    /// Key numbers, use after use.
    keys: Vec<u32>,
    /// Where each use's keys end in `keys`, and whether it is a lookup.
    uses: Vec<(u32, bool)>,
    /// For each entry of `keys`: the index of the use that next needs that key.
    need: Vec<u32>,
    distinct: usize,
}

impl Uses {
    /// The uses of a decoded trace; fails, naming the record, on what the bound does not
    /// model (objects of several sizes, lookups of several groups or a sliding window).
    pub fn of<'a>(calls: impl Iterator<Item = (u64, &'a Call)>) -> Result<Uses> {
        let mut b = Builder::default();
        for (offset, call) in calls {
            b.add(offset, call)?;
        }
        Ok(b.finish())
    }

    /// The uses of a trace read from its file, one call at a time (a trace too large to
    /// hold decoded keeps only its key numbers).
    pub fn read(path: &Path, read: ReadOptions) -> Result<Uses> {
        let shown = path.display().to_string();
        let mut reader = TraceReader::open(path, read).map_err(|e| e.in_file(&shown))?;
        let mut decoder = Decoder::default();
        let mut b = Builder::default();
        while let Some(record) = reader.next_record().map_err(|e| e.in_file(&shown))? {
            if let Ok(call) = decoder.decode(&record) {
                b.add(record.offset, &call).map_err(|e| e.in_file(&shown))?;
            }
        }
        Ok(b.finish())
    }

    /// Each occurrence's next need, from the end: the next use naming the key if that use is
    /// a lookup, never if it is a store (which brings the key back for nothing).
    fn number_needs(&mut self) {
        let mut next: Vec<(u32, bool)> = vec![(NEVER, false); self.distinct];
        self.need = vec![NEVER; self.keys.len()];
        for u in (0..self.uses.len()).rev() {
            let (start, end) = self.span(u);
            for j in start..end {
                let key = self.keys[j] as usize;
                let (at, lookup) = next[key];
                self.need[j] = if lookup { at } else { NEVER };
            }
            for j in start..end {
                next[self.keys[j] as usize] = (u as u32, self.uses[u].1);
            }
        }
    }

    fn span(&self, u: usize) -> (usize, usize) {
        let start = if u == 0 {
            0
        } else {
            self.uses[u - 1].0 as usize
        };
        (start, self.uses[u].0 as usize)
    }

    /// The most chunks lookups can hit with `capacity` objects of L1.
    pub fn hit_chunks(&self, capacity: u64) -> u64 {
        let mut resident = vec![false; self.distinct];
        // The need each resident key is kept under; heap entries that disagree are stale.
        let mut kept = vec![NEVER; self.distinct];
        let mut count = 0u64;
        // Farthest need first; on a tie the deeper chunk (its place in the use).
        let mut heap: BinaryHeap<(u32, u32, u32)> = BinaryHeap::new();
        let mut hits = 0u64;
        for u in 0..self.uses.len() {
            let (start, end) = self.span(u);
            if self.uses[u].1 {
                hits += self.keys[start..end]
                    .iter()
                    .take_while(|&&k| resident[k as usize])
                    .count() as u64;
            }
            for j in start..end {
                let key = self.keys[j] as usize;
                if !resident[key] {
                    resident[key] = true;
                    count += 1;
                }
                kept[key] = self.need[j];
                heap.push((self.need[j], (j - start) as u32, key as u32));
            }
            while count > capacity {
                let Some((need, _, key)) = heap.pop() else {
                    break;
                };
                let key = key as usize;
                if resident[key] && kept[key] == need {
                    resident[key] = false;
                    count -= 1;
                }
            }
            // Stale entries would otherwise pile up: rebuild once they dominate.
            if heap.len() > 4 * (count as usize + 64) {
                heap.retain(|&(need, _, key)| resident[key as usize] && kept[key as usize] == need);
            }
        }
        hits
    }

    /// [`Uses::hit_chunks`] over the looked-up chunks (0 with no lookups).
    pub fn hit_rate(&self, capacity: u64) -> f64 {
        if self.looked_up_chunks == 0 {
            0.0
        } else {
            self.hit_chunks(capacity) as f64 / self.looked_up_chunks as f64
        }
    }

    /// Objects of this trace's size an L1 of `l1_bytes` holds (4 KiB allocation units).
    pub fn capacity(&self, l1_bytes: u64) -> u64 {
        objects_in(l1_bytes, self.object_bytes)
    }
}

/// Collects the uses call by call, numbering keys as they first appear.
#[derive(Default)]
struct Builder {
    uses: Uses,
    ids: HashMap<KeyId, u32>,
    size: OneSize,
}

impl Builder {
    fn add(&mut self, offset: u64, call: &Call) -> Result<()> {
        const MODEL: &str = "the optimal bound";
        let u = &mut self.uses;
        let (keys, lookup) = match call {
            Call::Prefetch { groups, .. } => {
                let group = one_group(groups, offset, MODEL)?;
                self.size.check(group.object_bytes, offset, MODEL)?;
                u.lookups += 1;
                u.looked_up_chunks += group.keys.len() as u64;
                (&group.keys, true)
            }
            Call::ReserveWrite { keys, object_bytes } => {
                self.size.check(*object_bytes, offset, MODEL)?;
                (keys, false)
            }
            _ => return Ok(()),
        };
        for key in keys {
            let next = self.ids.len() as u32;
            u.keys.push(*self.ids.entry(*key).or_insert(next));
        }
        u.uses.push((u.keys.len() as u32, lookup));
        Ok(())
    }

    fn finish(self) -> Uses {
        let mut u = self.uses;
        u.object_bytes = self.size.bytes();
        u.distinct = self.ids.len();
        u.number_needs();
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A trace of uses over chained keys: each is (lookup?, path in a small prefix tree).
    fn uses(spec: &[(bool, Vec<u8>)]) -> Uses {
        let mut u = Uses::default();
        let mut ids: HashMap<Vec<u8>, u32> = HashMap::new();
        for (lookup, path) in spec {
            for depth in 1..=path.len() {
                let prefix = path[..depth].to_vec();
                let next = ids.len() as u32;
                u.keys.push(*ids.entry(prefix).or_insert(next));
            }
            u.uses.push((u.keys.len() as u32, *lookup));
            if *lookup {
                u.lookups += 1;
                u.looked_up_chunks += path.len() as u64;
            }
        }
        u.distinct = ids.len();
        u.number_needs();
        u
    }

    /// The true optimum: every choice of what stays after every use, searched exhaustively
    /// (states are sets of resident keys; the best hits reachable from each).
    fn exhaustive(u: &Uses, capacity: usize) -> u64 {
        let mut states: HashMap<BTreeSet<u32>, u64> = HashMap::from([(BTreeSet::new(), 0)]);
        for i in 0..u.uses.len() {
            let (start, end) = u.span(i);
            let named = &u.keys[start..end];
            let mut next: HashMap<BTreeSet<u32>, u64> = HashMap::new();
            for (state, hits) in states {
                let gained = if u.uses[i].1 {
                    named.iter().take_while(|k| state.contains(k)).count() as u64
                } else {
                    0
                };
                let pool: Vec<u32> = state
                    .iter()
                    .copied()
                    .chain(named.iter().copied())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                // Every subset of what could stay, within the capacity.
                for mask in 0u32..(1 << pool.len()) {
                    if mask.count_ones() as usize > capacity {
                        continue;
                    }
                    let kept: BTreeSet<u32> = (0..pool.len())
                        .filter(|b| mask & (1 << b) != 0)
                        .map(|b| pool[b])
                        .collect();
                    let best = next.entry(kept).or_insert(0);
                    *best = (*best).max(hits + gained);
                }
            }
            states = next;
        }
        states.into_values().max().unwrap_or(0)
    }

    /// A small deterministic generator (SplitMix64).
    fn rng(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn belady_over_prefixes_equals_the_exhaustive_optimum() {
        let mut seed = 7;
        let mut checked = 0;
        for trial in 0..60 {
            let n = 4 + (rng(&mut seed) % 5) as usize;
            let spec: Vec<(bool, Vec<u8>)> = (0..n)
                .map(|_| {
                    let depth = 1 + (rng(&mut seed) % 3) as usize;
                    let path = (0..depth).map(|_| (rng(&mut seed) % 2) as u8).collect();
                    // Mostly lookups; some stores, as a client's after a miss.
                    (!rng(&mut seed).is_multiple_of(4), path)
                })
                .collect();
            let u = uses(&spec);
            if u.distinct > 9 {
                continue;
            }
            checked += 1;
            for capacity in 0..=4 {
                assert_eq!(
                    u.hit_chunks(capacity as u64),
                    exhaustive(&u, capacity),
                    "trial {trial}, capacity {capacity}: {spec:?}"
                );
            }
        }
        assert!(checked >= 40, "{checked} traces searched");
    }

    #[test]
    fn the_bound_grows_with_the_capacity_and_saturates() {
        let spec: Vec<(bool, Vec<u8>)> = (0..40u8)
            .map(|i| (true, vec![i % 5, i % 3, i % 2]))
            .collect();
        let u = uses(&spec);
        let curve: Vec<u64> = (0..=40).map(|c| u.hit_chunks(c)).collect();
        assert!(curve.windows(2).all(|w| w[0] <= w[1]), "{curve:?}");
        // With room for every key, every chunk seen before hits.
        let mut seen = BTreeSet::new();
        let mut warm = 0;
        for (_, path) in &spec {
            for d in 1..=path.len() {
                warm += u64::from(!seen.insert(path[..d].to_vec()));
            }
        }
        assert_eq!(curve[40], warm);
        assert_eq!(curve[0], 0);
    }
}
