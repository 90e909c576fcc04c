//! Looked-up chunks by when their prefix was last used or first stored, counted in one pass
//! over a trace, for turning a sampled replay's hit rate into the whole trace's.
//!
//! A cache that hits a chunk when some per-chunk time is within a threshold hits, at any
//! size, the share of chunks whose time is within that size's threshold. A sampled replay
//! shows the threshold its scaled cache reached: the time within which its own chunks hit as
//! often as it did. The whole trace's chunks within the same threshold are the estimate —
//! a quantile mapping, which keeps what trees the sample happens to hold out of the answer,
//! as the threshold is read against the sample's own chunks. Which time fits depends on how
//! the cache turned over:
//!
//! - [`Times::reuse`]: the records since the chunk's prefix was last used (named by a store,
//!   a read or a lookup that found it stored). An LRU-like cache that evicts keeps what was
//!   used within its *characteristic time*, so a chunk hits when its whole prefix was.
//! - [`Times::admission`]: the record at which the last of the prefix's keys was first
//!   stored. A cache that never evicts (LMCache's controller runs once a second; a trace
//!   recorded faster never sees it) keeps what was stored before it filled, and refuses the
//!   rest.
//!
//! A prefix hits only whole, so a chunk's time is the largest over its prefix; a chunk whose
//! prefix holds a key never stored has none (no cache hits it).
//!
//! For an L1 alone, the threshold need not be read from a sampled replay at all; the same
//! pass gives it for the whole trace at any capacity: [`Footprint`] the characteristic time
//! of an LRU that evicts as allocations need room, and [`Times::first_stores`] the record
//! at which a cache that never evicts filled.

/// Buckets of single records up to 2^10, then 2^10 buckets an octave: every time is placed
/// within a 1/1024 share of itself, in a few tens of thousands of buckets for any trace.
const EXACT_BITS: u32 = 10;

fn bucket(t: u64) -> usize {
    if t < 2 << EXACT_BITS {
        return t as usize;
    }
    let shift = 63 - t.leading_zeros() - EXACT_BITS;
    ((shift as usize) << EXACT_BITS) + (t >> shift) as usize
}

/// The first time in bucket `b`, and how many times it spans.
fn bucket_span(b: usize) -> (f64, f64) {
    if b < 2 << EXACT_BITS {
        return (b as f64, 1.0);
    }
    let shift = (b >> EXACT_BITS) - 1;
    let mantissa = b - (shift << EXACT_BITS);
    let width = (1u64 << shift) as f64;
    (mantissa as f64 * width, width)
}

/// Looked-up chunks by a time in records (see the module): a histogram whose chunks are
/// spread evenly over their bucket, so the share within a time and the time of a share are
/// continuous and each other's inverse.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChunkTimes {
    /// By bucket: chunks with a time in it.
    counts: Vec<u64>,
    /// Chunks counted, with a time or none.
    chunks: u64,
}

impl ChunkTimes {
    /// Counts a lookup by its keys' times in order (`None`: the key was never stored).
    fn count(&mut self, times: impl IntoIterator<Item = Option<u64>>) {
        let mut prefix = Some(0);
        for time in times {
            self.chunks += 1;
            prefix = prefix.zip(time).map(|(p, t)| p.max(t));
            if let Some(t) = prefix {
                let b = bucket(t);
                if b >= self.counts.len() {
                    self.counts.resize(b + 1, 0);
                }
                self.counts[b] += 1;
            }
        }
    }

    /// The share of chunks whose time is at most `t`.
    pub fn share_within(&self, t: f64) -> f64 {
        if self.chunks == 0 || t <= 0.0 {
            return 0.0;
        }
        let b = bucket(t as u64);
        let before: u64 = self.counts.iter().take(b).sum();
        let (low, width) = bucket_span(b);
        let inside = self.counts.get(b).copied().unwrap_or(0) as f64;
        let within = before as f64 + inside * ((t - low) / width).clamp(0.0, 1.0);
        within / self.chunks as f64
    }

    /// The share of chunks that have a time at all: what a cache that never evicts hits.
    pub fn share_timed(&self) -> f64 {
        match self.chunks {
            0 => 0.0,
            chunks => self.counts.iter().sum::<u64>() as f64 / chunks as f64,
        }
    }

    /// The least time within which `n` of the chunks lie; `None` past those with a time.
    pub fn time_of_count(&self, n: f64) -> Option<f64> {
        match self.chunks {
            0 => None,
            chunks => self.time_of(n / chunks as f64),
        }
    }

    /// The least time within which `share` of the chunks lie; `None` past the share that has
    /// a time at all.
    pub fn time_of(&self, share: f64) -> Option<f64> {
        let target = share * self.chunks as f64;
        if target <= 0.0 {
            return Some(0.0);
        }
        let mut before = 0.0;
        for (b, &n) in self.counts.iter().enumerate() {
            let after = before + n as f64;
            if after >= target {
                let (low, width) = bucket_span(b);
                return Some(low + width * (target - before) / n as f64);
            }
            before = after;
        }
        None
    }
}

/// Each item one chunk's time (`None`: none), its prefix's already folded in.
impl FromIterator<Option<u64>> for ChunkTimes {
    fn from_iter<I: IntoIterator<Item = Option<u64>>>(chunks: I) -> ChunkTimes {
        let mut times = ChunkTimes::default();
        for chunk in chunks {
            times.count([chunk]);
        }
        times
    }
}

/// A trace's chunks by both times of the module, and its keys' footprint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Times {
    pub reuse: ChunkTimes,
    pub admission: ChunkTimes,
    pub footprint: Footprint,
    /// Keys (not chunks) by the record that first stored them: when a cache that never
    /// evicts filled, at any capacity.
    pub first_stores: ChunkTimes,
}

/// A trace's keys by how long each stayed unused, for its *average footprint*: the mean
/// number of distinct keys a window of `w` records uses, over every such window (Xiang et
/// al., "Linear-time modeling of program working set", the footprint their AET theory
/// reads). An LRU cache of `C` objects keeps a key while fewer than `C` others were used
/// since: with the windows' mean standing for each window, it keeps what was used within
/// the window whose footprint is `C` — its characteristic time at that capacity.
///
/// A key used at records `a1 < … < ak` of `n` is missing from the windows that fit in one
/// of its idle stretches: the `a1 + 1` records before its first use, each gap `a(j+1) − aj`,
/// and the `n − ak` records from its last use on. A stretch of `g` records holds
/// `max(0, g − w)` windows of `w`, so the footprint is every key less those windows' share:
/// one histogram of stretches gives it at any `w`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Footprint {
    /// By bucket ([`bucket`]): idle stretches, and the sum of their lengths.
    stretches: Vec<u64>,
    lengths: Vec<u64>,
    keys: u64,
    records: u64,
}

impl Footprint {
    fn stretch(&mut self, g: u64) {
        let b = bucket(g);
        if b >= self.stretches.len() {
            self.stretches.resize(b + 1, 0);
            self.lengths.resize(b + 1, 0);
        }
        self.stretches[b] += 1;
        self.lengths[b] += g;
    }

    /// The mean number of distinct keys used in a window of `w` records.
    pub fn mean_keys(&self, w: f64) -> f64 {
        let n = self.records as f64;
        if w >= n {
            return self.keys as f64;
        }
        let w = w.max(0.0);
        let mut missing = 0.0;
        for (b, (&count, &length)) in self.stretches.iter().zip(&self.lengths).enumerate() {
            let (low, width) = bucket_span(b);
            let high = low + width;
            if count == 0 || high <= w {
                continue;
            }
            missing += if low >= w {
                length as f64 - w * count as f64
            } else {
                // Lengths spread evenly over the bucket, as the chunks' times are.
                count as f64 * (high - w) * (high - w) / (2.0 * width)
            };
        }
        self.keys as f64 - missing / (n - w + 1.0)
    }

    /// The least window (records) whose mean distinct keys reach `capacity`; `None` when the
    /// whole trace uses fewer keys (a cache that large never evicts).
    pub fn window(&self, capacity: f64) -> Option<f64> {
        if capacity >= self.keys as f64 {
            return None;
        }
        // The footprint grows with the window: bisect to a hundredth of a record.
        let (mut low, mut high) = (0.0, self.records as f64);
        while high - low > 0.01 {
            let mid = (low + high) / 2.0;
            if self.mean_keys(mid) >= capacity {
                high = mid;
            } else {
                low = mid;
            }
        }
        Some(high)
    }
}

/// Per key, by dense id: the record that last used it and the one that first stored it,
/// for counting [`Times`] call by call. Sized by whoever gives the ids: a key is added as it
/// is given one.
#[derive(Default)]
pub(crate) struct Recency {
    used: Vec<u32>,
    stored: Vec<u32>,
    pub(crate) times: Times,
}

/// Not yet: a key never used or never stored.
const NEVER: u32 = u32::MAX;

impl Recency {
    /// For keys of ids `..keys`, none used or stored yet.
    pub(crate) fn with_keys(keys: usize) -> Recency {
        Recency {
            used: vec![NEVER; keys],
            stored: vec![NEVER; keys],
            times: Times::default(),
        }
    }

    /// One more key, the next id.
    pub(crate) fn add_key(&mut self) {
        self.used.push(NEVER);
        self.stored.push(NEVER);
    }

    /// Key `id` used at record `now`: its idle stretch since the last use (or the start)
    /// ends. A key used twice by one record is one use.
    fn use_key(&mut self, id: u32, now: u32) {
        let was = std::mem::replace(&mut self.used[id as usize], now);
        let footprint = &mut self.times.footprint;
        if was == NEVER {
            footprint.keys += 1;
            footprint.stretch(u64::from(now) + 1);
        } else if now > was {
            footprint.stretch(u64::from(now - was));
        }
    }

    /// Ends the count at a trace of `records` records: each used key's last stretch, from
    /// its last use to the end, closes the footprint.
    pub(crate) fn finish(&mut self, records: u64) {
        let footprint = &mut self.times.footprint;
        footprint.records = records;
        for &used in self.used.iter().filter(|&&u| u != NEVER) {
            footprint.stretch(records.saturating_sub(u64::from(used)));
        }
        self.times.first_stores = self
            .stored
            .iter()
            .filter(|&&s| s != NEVER)
            .map(|&s| Some(u64::from(s)))
            .collect();
    }

    /// Counts record `now`'s call naming keys `keys` (dense ids): a lookup's chunks by their
    /// times, then what the call used or stored.
    pub(crate) fn call(&mut self, now: u64, lookup: bool, keys: &[u32]) {
        // Past 2^32 - 1 records, later records count as the last: times stay bounded.
        let now = u32::try_from(now).unwrap_or(NEVER - 1);
        if !lookup {
            for &id in keys {
                self.use_key(id, now);
                let stored = &mut self.stored[id as usize];
                if *stored == NEVER {
                    *stored = now;
                }
            }
            return;
        }
        let known = |t: u32| (t != NEVER).then_some(t);
        let (used, stored) = (&self.used, &self.stored);
        self.times.reuse.count(
            keys.iter()
                .map(|&id| known(used[id as usize]).map(|u| u64::from(now - u))),
        );
        self.times.admission.count(
            keys.iter()
                .map(|&id| known(stored[id as usize]).map(u64::from)),
        );
        // The lookup finds its stored prefix, and uses it.
        for &id in keys {
            if self.stored[id as usize] == NEVER {
                break;
            }
            self.use_key(id, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_single_times_then_a_1024th_of_an_octave() {
        for t in [
            0u64,
            1,
            1023,
            2047,
            2048,
            2049,
            4095,
            4096,
            1 << 40,
            (1 << 50) + 12_345,
        ] {
            let (low, width) = bucket_span(bucket(t));
            assert!(
                low <= t as f64 && (t as f64) < low + width,
                "{t}: {low} + {width}"
            );
            assert!(width <= 1.0_f64.max(low / 1024.0), "{t}: {width}");
        }
        // Consecutive: each bucket starts where the one before ends.
        for b in 1..(8 << EXACT_BITS) {
            let ((l0, w0), (l1, _)) = (bucket_span(b - 1), bucket_span(b));
            assert_eq!(l0 + w0, l1, "bucket {b}");
        }
    }

    #[test]
    fn a_chunks_time_is_its_prefixs_largest_and_none_past_a_key_never_stored() {
        let mut times = ChunkTimes::default();
        times.count([Some(3), Some(1), Some(5), None, Some(1)]);
        // Times 3, 3, 5; then none for the last two.
        assert_eq!(times.chunks, 5);
        assert_eq!(times.counts, [0, 0, 0, 2, 0, 1]);
        // Spread evenly over their record: within 3.5, half of time 3's two chunks.
        assert_eq!(times.share_within(3.5), 1.0 / 5.0);
        assert_eq!(times.share_within(100.0), 3.0 / 5.0);
        assert_eq!(times.share_timed(), 3.0 / 5.0);
        let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(near(times.time_of(1.0 / 5.0), 3.5));
        assert!(near(times.time_of(3.0 / 5.0), 6.0));
        assert_eq!(times.time_of(0.8), None);
    }

    #[test]
    fn the_share_within_a_time_and_the_time_of_a_share_are_each_others_inverse() {
        let mut times = ChunkTimes::default();
        for t in [2u64, 7, 7, 900, 5000, 5001, 70_000, 1 << 33] {
            times.count([Some(t)]);
        }
        for share in [0.01, 0.125, 0.3, 0.5, 0.77, 0.99, 1.0] {
            let t = times.time_of(share).expect("every chunk has a time");
            let back = times.share_within(t);
            assert!((back - share).abs() < 1e-12, "{share} -> {t} -> {back}");
        }
    }

    #[test]
    fn the_footprint_is_the_mean_distinct_keys_of_every_window() {
        // Stores of one to three of 12 keys a record, from a fixed generator.
        let (records, keys) = (300u64, 12u32);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(m)) as u32
        };
        let calls: Vec<Vec<u32>> = (0..records)
            .map(|_| (0..=next(3)).map(|_| next(keys)).collect())
            .collect();
        let mut recency = Recency::with_keys(keys as usize);
        for (now, call) in calls.iter().enumerate() {
            recency.call(now as u64, false, call);
        }
        recency.finish(records);
        let footprint = &recency.times.footprint;
        // Counted window by window, independently of the stretches.
        for w in [1usize, 2, 3, 7, 20, 64, 150, 299, 300] {
            let windows = calls.len() - w + 1;
            let total: usize = (0..windows)
                .map(|s| {
                    let mut seen = [false; 12];
                    calls[s..s + w]
                        .iter()
                        .flatten()
                        .for_each(|&k| seen[k as usize] = true);
                    seen.iter().filter(|&&b| b).count()
                })
                .sum();
            let expected = total as f64 / windows as f64;
            let got = footprint.mean_keys(w as f64);
            assert!(
                (got - expected).abs() < 1e-9,
                "w {w}: {got} against {expected}"
            );
        }
        // The window of a capacity is the least whose footprint reaches it.
        for capacity in [1.5, 4.0, 9.0, 11.9] {
            let w = footprint.window(capacity).expect("fewer than every key");
            assert!(footprint.mean_keys(w) >= capacity, "{capacity}");
            assert!(footprint.mean_keys(w - 0.02) < capacity, "{capacity}");
        }
        assert_eq!(footprint.window(f64::from(keys)), None);
    }

    #[test]
    fn reuse_is_the_records_since_a_use_and_admission_the_first_store() {
        let mut recency = Recency::with_keys(3);
        recency.call(0, false, &[0, 1]); // store keys 0 and 1
        recency.call(4, true, &[0, 2, 1]); // 0 hits (4 after its store); 2 never stored
                                           // The lookup used key 0 but not 1, behind the never-stored 2.
        assert_eq!(recency.used, [4, 0, NEVER]);
        recency.call(6, false, &[2]); // store 2
        recency.call(9, true, &[0, 2, 1]); // 0 used at 4, 2 at 6, 1 at 0
        let (reuse, admission) = (&recency.times.reuse, &recency.times.admission);
        assert_eq!(reuse.chunks, 6);
        // Lookup at 4: chunk 0 at 4, then none. At 9: 5, 5 (2 used at 6: 3), 9 (1 at 0).
        let mut expected = vec![0; 10];
        expected[4] = 1;
        expected[5] = 2;
        expected[9] = 1;
        assert_eq!(reuse.counts, expected);
        // Admission: lookup at 4: 0; at 9: 0, 6, 6.
        let mut expected = vec![0; 7];
        expected[0] = 2;
        expected[6] = 2;
        assert_eq!(admission.counts, expected);
    }
}
