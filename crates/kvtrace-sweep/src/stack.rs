//! Every L1 capacity's LRU hit count from one pass over a trace (Mattson's stack distances).
//!
//! LRU is a stack algorithm: a cache of `C` objects holds exactly the `C` most recently used
//! ones, whatever `C` is, as long as the sequence of uses does not itself depend on `C`. A
//! key's stack distance at a lookup — one more than the distinct keys used since its last
//! use — says at once which capacities hold it: those of at least that many objects.
//!
//! An LMCache lookup hits the longest resident prefix of a request's chunks, so chunk `i`
//! of a request hits at capacity `C` when the largest stack distance among chunks `1..=i`
//! is at most `C`. One histogram of those prefix maxima gives the hit count of every
//! capacity: `hits(C)` is the number of chunks whose prefix maximum is `≤ C`.
//!
//! The uses this pass counts are the ones an LMCache server makes of a request's chunks
//! whatever the capacity: by the end of a request's store session every chunk of the
//! request is resident (read, written, or touched by the server's end-of-session touch) and
//! the most recently used, the first chunk most recent of all (the server's policy takes a
//! batch last key first, so a prefix is evicted from its tail). Replays agree with it when the L1 evicts as
//! soon as an allocation needs room (`--eviction-timing immediate`, LRU), objects are of one
//! size, every request fits in L1 (see [`LruCurve::largest_request`]), and the trace stores
//! every request's chunks, as `kvtrace generate --from-mooncake` writes them (tested against
//! full replays). A recording whose client stored only after a miss has no store to replay
//! where a smaller L1 misses a request the recorded one hit: there the curve is what the
//! server would have done with a client that stores its misses, and the replay, which can
//! only repeat the recorded calls, hits less.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::lmct::{ReadOptions, TraceReader};
use crate::storage::{KeyId, PrefetchGroup};
use kvtrace_replay::dispatch::{Call, Decoder};
use kvtrace_replay::loaded::Loaded;

/// Hits of every L1 capacity, from one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LruCurve {
    /// The size of every object the trace stores and looks up.
    pub object_bytes: u64,
    pub requests: u64,
    pub requested_chunks: u64,
    /// `prefix_max[d]`: chunks whose prefix's largest stack distance is `d` objects (index 0
    /// unused). Chunks never seen before count in `cold`.
    pub prefix_max: Vec<u64>,
    pub cold: u64,
    /// Chunks of the largest lookup: an L1 of fewer objects cannot hold one request, and
    /// refuses writes (OUT_OF_MEMORY) where this model would not.
    pub largest_request: u64,
}

impl LruCurve {
    /// Chunks a lookup finds in an L1 of `capacity` objects.
    pub fn hit_chunks(&self, capacity: u64) -> u64 {
        let end = (capacity as usize)
            .saturating_add(1)
            .min(self.prefix_max.len());
        self.prefix_max[..end].iter().sum()
    }

    /// The share of requested chunks that hit, as replay's `hit_rate` (0 with no requests).
    pub fn hit_rate(&self, capacity: u64) -> f64 {
        if self.requested_chunks == 0 {
            0.0
        } else {
            self.hit_chunks(capacity) as f64 / self.requested_chunks as f64
        }
    }

    /// Objects of this curve's size an L1 of `l1_bytes` holds: LMCache's allocator rounds each
    /// object up to 4 KiB.
    pub fn capacity(&self, l1_bytes: u64) -> u64 {
        objects_in(l1_bytes, self.object_bytes)
    }

    /// The capacity past which nothing more hits: the largest finite prefix maximum.
    pub fn saturation(&self) -> u64 {
        self.prefix_max.iter().rposition(|&n| n > 0).unwrap_or(0) as u64
    }
}

/// The one object size the models of uniform objects (the stack-distance curve, the optimal
/// bound) need: the first call's, which every later call must repeat.
#[derive(Default)]
pub(crate) struct OneSize(Option<u64>);

impl OneSize {
    /// Takes `bytes` as the size, or an error naming the record when it differs; `model`
    /// names who needs one size.
    pub(crate) fn check(&mut self, bytes: u64, offset: u64, model: &str) -> Result<()> {
        match self.0 {
            None => {
                self.0 = Some(bytes);
                Ok(())
            }
            Some(s) if s == bytes => Ok(()),
            Some(s) => Err(Error::data(
                offset,
                "layout_desc",
                format!("objects of {s} and {bytes} bytes: {model} needs one size"),
            )),
        }
    }

    /// The size (0 before any object).
    pub(crate) fn bytes(&self) -> u64 {
        self.0.unwrap_or(0)
    }
}

/// The one full-attention group of a lookup, or an error naming the record: what the
/// one-object-size models (`model`: the stack-distance curve, the optimal bound) describe.
pub(crate) fn one_group<'a>(
    groups: &'a [PrefetchGroup],
    offset: u64,
    model: &str,
) -> Result<&'a PrefetchGroup> {
    let [group] = groups else {
        return Err(Error::data(
            offset,
            "spec",
            format!("a lookup of several groups: {model} models one"),
        ));
    };
    if group.window > 0 {
        return Err(Error::data(
            offset,
            "spec",
            format!("a sliding-window lookup: {model} models full attention"),
        ));
    }
    Ok(group)
}

/// Objects of `object_bytes` an L1 of `l1_bytes` holds: LMCache's allocator rounds each
/// object up to 4 KiB.
pub fn objects_in(l1_bytes: u64, object_bytes: u64) -> u64 {
    l1_bytes / (object_bytes.max(1).div_ceil(4096) * 4096)
}

/// Counts, over positions in the stream of uses, which positions hold a key's latest use; a
/// Fenwick tree, so a key's stack distance is one prefix sum.
#[derive(Default)]
struct Latest {
    tree: Vec<u64>,
    marked: Vec<bool>,
}

impl Latest {
    fn grow(&mut self) {
        let size = (self.marked.len() * 2).max(1024);
        self.marked.resize(size, false);
        self.tree = vec![0; size + 1];
        for i in 0..size {
            if self.marked[i] {
                self.add_tree(i, 1);
            }
        }
    }

    fn add_tree(&mut self, position: usize, delta: i64) {
        let mut i = position + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    fn set(&mut self, position: usize, on: bool) {
        while position >= self.marked.len() {
            self.grow();
        }
        if self.marked[position] != on {
            self.marked[position] = on;
            self.add_tree(position, if on { 1 } else { -1 });
        }
    }

    /// Marks at positions `0..=position`.
    fn up_to(&self, position: usize) -> u64 {
        let mut i = (position + 1).min(self.tree.len().saturating_sub(1));
        let mut sum = 0;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }
}

/// The LRU stack of a stream of uses.
#[derive(Default)]
struct Stack {
    last: HashMap<KeyId, usize>,
    latest: Latest,
    now: usize,
}

impl Stack {
    /// The key's stack distance now (1 = most recently used); `None` if never used.
    fn distance(&self, key: KeyId) -> Option<u64> {
        let at = *self.last.get(&key)?;
        let total = self.last.len() as u64;
        Some(total - self.latest.up_to(at) + 1)
    }

    fn touch(&mut self, key: KeyId) {
        if let Some(before) = self.last.insert(key, self.now) {
            self.latest.set(before, false);
        }
        self.latest.set(self.now, true);
        self.now += 1;
    }
}

/// One pass over `path`: every lookup's hits at every capacity. Fails on a trace the model
/// does not describe: objects of several sizes, or lookups of several groups or a sliding
/// window.
pub fn lru_curve(path: &Path, read: ReadOptions) -> Result<LruCurve> {
    let shown = path.display().to_string();
    let mut reader = TraceReader::open(path, read).map_err(|e| e.in_file(&shown))?;
    let mut decoder = Decoder::default();
    let mut pass = Pass::default();
    while let Some(record) = reader.next_record().map_err(|e| e.in_file(&shown))? {
        if let Ok(call) = decoder.decode(&record) {
            pass.add(record.offset, &call)
                .map_err(|e| e.in_file(&shown))?;
        }
    }
    Ok(pass.finish())
}

/// [`lru_curve`] of a trace decoded before.
pub fn lru_curve_of(loaded: &Loaded) -> Result<LruCurve> {
    let mut pass = Pass::default();
    for (offset, call) in loaded.calls() {
        pass.add(offset, call)
            .map_err(|e| e.in_file(loaded.shown()))?;
    }
    Ok(pass.finish())
}

/// The stack-distance pass, one call at a time.
#[derive(Default)]
struct Pass {
    stack: Stack,
    curve: LruCurve,
    size: OneSize,
}

impl Pass {
    fn same_size(&mut self, bytes: u64, offset: u64) -> Result<()> {
        self.size.check(bytes, offset, "the stack-distance curve")
    }

    fn add(&mut self, offset: u64, call: &Call) -> Result<()> {
        match call {
            Call::Prefetch { groups, .. } => {
                let group = one_group(groups, offset, "the stack-distance curve")?;
                self.same_size(group.object_bytes, offset)?;
                look_up(&mut self.stack, &mut self.curve, &group.keys);
                // Last chunk first, as the server's policy takes a batch: the prefix ends
                // up the most recently used, so it is the last to go.
                for &key in group.keys.iter().rev() {
                    self.stack.touch(key);
                }
            }
            Call::ReserveWrite { keys, object_bytes } => {
                self.same_size(*object_bytes, offset)?;
                for &key in keys.iter().rev() {
                    self.stack.touch(key);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(mut self) -> LruCurve {
        self.curve.object_bytes = self.size.bytes();
        self.curve
    }
}

/// Adds one lookup's chunks to the histogram of prefix maxima.
fn look_up(stack: &mut Stack, curve: &mut LruCurve, keys: &[KeyId]) {
    curve.requests += 1;
    curve.requested_chunks += keys.len() as u64;
    curve.largest_request = curve.largest_request.max(keys.len() as u64);
    let mut prefix_max = Some(0u64);
    for &key in keys {
        prefix_max = match (prefix_max, stack.distance(key)) {
            (Some(m), Some(d)) => Some(m.max(d)),
            _ => None,
        };
        match prefix_max {
            Some(m) => {
                let m = m as usize;
                if curve.prefix_max.len() <= m {
                    curve.prefix_max.resize(m + 1, 0);
                }
                curve.prefix_max[m] += 1;
            }
            None => curve.cold += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> KeyId {
        KeyId(u128::from(n))
    }

    #[test]
    fn distances_count_the_distinct_keys_used_since() {
        let mut s = Stack::default();
        for n in [1, 2, 3, 2, 2, 1] {
            s.touch(key(n));
        }
        assert_eq!(s.distance(key(1)), Some(1));
        assert_eq!(s.distance(key(2)), Some(2));
        assert_eq!(s.distance(key(3)), Some(3));
        assert_eq!(s.distance(key(4)), None);
        for n in 10..200 {
            s.touch(key(n));
        }
        assert_eq!(s.distance(key(1)), Some(191));
    }

    #[test]
    fn a_lookup_hits_the_prefix_a_capacity_holds() {
        let mut s = Stack::default();
        let mut c = LruCurve::default();
        for n in [1, 2, 3] {
            s.touch(key(n));
        }
        // Distances 3, 2, 1, then a cold key: prefix maxima 3, 3, 3, cold.
        look_up(&mut s, &mut c, &[key(1), key(2), key(3), key(9)]);
        assert_eq!(
            (c.hit_chunks(2), c.hit_chunks(3), c.hit_chunks(100)),
            (0, 3, 3)
        );
        assert_eq!(c.cold, 1);
        assert_eq!(c.saturation(), 3);
    }
}
