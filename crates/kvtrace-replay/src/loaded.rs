//! A storage trace decoded once and held in memory, for replaying it under many
//! configurations (a sweep's points, its model curves).
//!
//! A replay of a file decodes every record on a second thread; a sweep of 64 L1 sizes on two
//! cores would decode the same records 64 times over, and estimate the same eviction phase
//! and infer the same client 64 times. A [`Loaded`] trace is decoded once, its records kept
//! as the calls they decode to (key ids, not key bytes: about a seventh of the file for
//! LMCache's encoding), and the phase and the client inferred from it once, on first use.
//! What it does not keep is each record's argument bytes: a replay that republishes its calls
//! (a recorder on its tracer) reads the file instead.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use super::client::{ClientInfo, LookupIndex};
use super::dispatch::{Call, Decoder, Outcome};
use super::phase::PhaseReport;
use super::session::Position;
use crate::error::Result;
use crate::lmct::blocks::read_ahead;
use crate::lmct::{Header, ReadOptions, ReadSummary, TraceReader};
use crate::storage::{KeyId, KeyMap, KeySet, PrefetchGroup};

/// One record as a replay needs it.
pub(crate) struct LoadedRecord {
    pub(crate) offset: u64,
    pub(crate) t_mono: f64,
    pub(crate) qualname: Arc<str>,
    pub(crate) call: std::result::Result<Call, Outcome>,
}

/// A trace's records, decoded.
pub struct Loaded {
    /// The path as given, for messages and reports.
    shown: String,
    header: Header,
    header_warnings: Vec<String>,
    pub(crate) records: Vec<LoadedRecord>,
    pub(crate) summary: ReadSummary,
    client: OnceLock<ClientInfo>,
    /// Where the client model's window of lookups stands at each record, worked out on first
    /// use (`None`: too many records to index).
    lookups: OnceLock<Option<LookupIndex>>,
    /// Phase estimates by what they were estimated from (the recorded configuration and the
    /// session model, in words): every point of a sweep asks for the same one.
    phases: Mutex<HashMap<String, PhaseReport>>,
}

/// Bytes a decoded call holds besides its record: its key ids and its groups.
fn call_bytes(call: &Call) -> usize {
    let groups = match call {
        Call::Prefetch { groups, .. } => groups.len() * std::mem::size_of::<PrefetchGroup>(),
        _ => 0,
    };
    groups + call.keys().count() * std::mem::size_of::<KeyId>()
}

/// What a load does after a record.
enum Next {
    More,
    /// Enough: keep what was read.
    Done,
    /// Give up: [`Loaded::load`] gives `None`.
    Abandon,
}

impl Loaded {
    /// Decodes the whole of `path`, or gives `None` as soon as the decoded records would hold
    /// more than `budget_bytes` (the caller then replays the file as usual) or a signal asks
    /// to stop.
    pub fn load(path: &Path, read: ReadOptions, budget_bytes: usize) -> Result<Option<Loaded>> {
        let (loaded, abandoned) = Loaded::load_while(
            path,
            read,
            |_| true,
            |held, _| match held > budget_bytes || crate::interrupt::requested().is_some() {
                true => Next::Abandon,
                false => Next::More,
            },
        )?;
        Ok((!abandoned).then_some(loaded))
    }

    /// The head of `path`: its records up to the one that makes `calls` decoded calls, all of
    /// a shorter trace. What the client inference and the phase estimate read, decoded once
    /// for both by a plan.
    pub(crate) fn load_head(path: &Path, read: ReadOptions, calls: usize) -> Result<Loaded> {
        let (head, _) = Loaded::load_while(
            path,
            read,
            |_| true,
            |_, decoded| match decoded >= calls {
                true => Next::Done,
                false => Next::More,
            },
        )?;
        Ok(head)
    }

    /// The calls of a share of `path`'s prefix trees, for a sampled curve: see [`Sample`].
    /// The file is read twice (once to count how many lookups pass through each key, once
    /// to keep the sampled calls) and only the sampled records are held, so a trace too
    /// large to load whole can be sampled; what the whole trace costs is two maps over its
    /// distinct keys (about 60 bytes a key).
    pub fn load_sample(path: &Path, read: ReadOptions, rate: f64, seed: u64) -> Result<Sample> {
        let stop = |_: usize, _: usize| match crate::interrupt::requested() {
            Some(_) => Next::Abandon,
            None => Next::More,
        };
        // Every key the trace names, with the lookups that name it (0: only other calls do).
        let mut lookups = KeyMap::<u32>::default();
        let mut chains = 0u64;
        let mut reuse = Reuse::default();
        Loaded::load_while(
            path,
            read,
            |call| {
                if let Call::Prefetch { .. } = call {
                    chains += 1;
                    reuse.count(call, |key| lookups.contains_key(key));
                    for key in call.keys() {
                        let n = lookups.entry(key).or_insert(0);
                        *n = n.saturating_add(1);
                    }
                } else {
                    for key in call.keys() {
                        lookups.entry(key).or_insert(0);
                    }
                }
                false
            },
            stop,
        )?;
        let mut trees = Trees::new(rate, seed, lookups, chains);
        let (loaded, _) = Loaded::load_while(path, read, |call| trees.keep(call), stop)?;
        Ok(Sample {
            loaded,
            counts: SampleCounts {
                rate,
                trees: trees.trees,
                trees_kept: trees.trees_kept,
                keys: trees.kept.len() as u64,
                keys_kept: trees.keys_kept,
                trunk_keys: trees.trunk_keys,
                trunk_bytes: trees.trunk_bytes,
                reuse,
                reuse_kept: trees.reuse_kept,
            },
        })
    }

    /// Reads records until `next(bytes held, calls decoded)` says to stop, keeping the calls
    /// `keep` accepts (and every record that decoded to none); whether it gave up.
    fn load_while(
        path: &Path,
        read: ReadOptions,
        mut keep: impl FnMut(&Call) -> bool,
        mut next: impl FnMut(usize, usize) -> Next,
    ) -> Result<(Loaded, bool)> {
        let shown = path.display().to_string();
        let reader = TraceReader::open(path, read).map_err(|e| e.in_file(&shown))?;
        let header = reader.header().clone();
        let header_warnings = reader.header_warnings();
        let mut records = Vec::new();
        let mut names: Vec<Arc<str>> = Vec::new();
        let (mut held, mut calls) = (0usize, 0usize);
        let mut abandoned = false;
        let mut decoder = Decoder::default();
        let summary = read_ahead(
            reader,
            super::READ_AHEAD_BLOCK_BYTES,
            &mut |record| Some(decoder.decode(record)),
            &mut |record, decoded| {
                let Some(call) = decoded.take() else {
                    return Ok(true);
                };
                if let Ok(c) = &call {
                    if !keep(c) {
                        return Ok(true);
                    }
                }
                held += std::mem::size_of::<LoadedRecord>() + call.as_ref().map_or(0, call_bytes);
                calls += usize::from(call.is_ok());
                let next = next(held, calls);
                if let Next::Abandon = next {
                    abandoned = true;
                    return Ok(false);
                }
                let qualname = match names.iter().find(|n| ***n == *record.qualname) {
                    Some(n) => n.clone(),
                    None => {
                        names.push(Arc::from(record.qualname));
                        names[names.len() - 1].clone()
                    }
                };
                records.push(LoadedRecord {
                    offset: record.offset,
                    t_mono: record.t_mono,
                    qualname,
                    call,
                });
                Ok(matches!(next, Next::More))
            },
        )
        .map_err(|e| e.in_file(&shown))?;
        let loaded = Loaded {
            shown,
            header,
            header_warnings,
            records,
            summary,
            client: OnceLock::new(),
            lookups: OnceLock::new(),
            phases: Mutex::new(HashMap::new()),
        };
        Ok((loaded, abandoned))
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn header_warnings(&self) -> Vec<String> {
        self.header_warnings.clone()
    }

    /// Records decoded (undecodable frames, counted in the read summary, are not records).
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Every decoded call, with its record's byte offset.
    pub fn calls(&self) -> impl Iterator<Item = (u64, &Call)> {
        self.records
            .iter()
            .filter_map(|r| Some((r.offset, r.call.as_ref().ok()?)))
    }

    /// The calls of the head of the trace: at most `records` records, of which at most
    /// `calls` decoded, each with where it is.
    pub(crate) fn head(&self, records: usize, calls: usize) -> Vec<(Position, Call)> {
        self.records
            .iter()
            .take(records)
            .enumerate()
            .filter_map(|(i, r)| {
                let call = r.call.as_ref().ok()?;
                let at = Position {
                    record: i as u64 + 1,
                    offset: r.offset,
                    t: r.t_mono,
                };
                Some((at, call.clone()))
            })
            .take(calls)
            .collect()
    }

    /// The client inferred from the head, inferring it on first use.
    pub(crate) fn client(&self, infer: impl FnOnce() -> ClientInfo) -> ClientInfo {
        self.client.get_or_init(infer).clone()
    }

    /// The index of the trace's lookups for the client model, built on first use.
    pub(crate) fn lookup_index(&self) -> Option<&LookupIndex> {
        self.lookups
            .get_or_init(|| LookupIndex::build(&self.records))
            .as_ref()
    }

    /// The phase estimated from `inputs` (in words), estimating it on first use; callers
    /// asking for the same one meanwhile wait for it rather than estimate it again.
    pub(crate) fn phase(
        &self,
        inputs: String,
        estimate: impl FnOnce() -> Result<PhaseReport>,
    ) -> Result<PhaseReport> {
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = phases.get(&inputs) {
            return Ok(known.clone());
        }
        let report = estimate()?;
        phases.insert(inputs, report.clone());
        Ok(report)
    }
}

/// A sampled trace: the calls of a share of its prefix trees, whole.
///
/// Sampling single keys (SHARDS) breaks the rule a prefix cache lives by: a chunk hits only
/// when every chunk before it does. A sample here keeps whole subtrees of the trace's prefix
/// tree instead, stratified so that one hot prefix does not decide the sample: keys that
/// more than a limit of lookups pass through (a shared system prompt) are the *trunk*, in
/// every sample; each lookup's tree is rooted at its first key below the trunk (the lookups
/// through a key all pass through its ancestors, so a tree is a whole subtree), and a hash
/// of that root and the seed keeps the tree with probability `rate`. The limit is a tenth of
/// the lookups the sample expects to keep, so no tree is more than a tenth of the sample. A
/// call other than a lookup follows the tree of its first key below the trunk (a write of
/// the chunks after a hit prefix, the tree of the lookup that named them), a call of trunk
/// keys only is kept. Replayed with every capacity scaled by [`SampleCounts::scaled`] (the
/// trunk, which every sample holds whole, at its own bytes, the rest at
/// [`SampleCounts::share`]), the sample's hit rate times [`SampleCounts::correction`]
/// estimates the whole trace's.
pub struct Sample {
    pub loaded: Loaded,
    pub counts: SampleCounts,
}

/// What a sample kept of its trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleCounts {
    /// The share asked for.
    pub rate: f64,
    /// Prefix trees seen, and kept.
    pub trees: u64,
    pub trees_kept: u64,
    /// Distinct keys seen, and kept (the trunk's among them).
    pub keys: u64,
    pub keys_kept: u64,
    pub trunk_keys: u64,
    /// The L1 bytes the trunk's written objects take (each rounded up to the allocator's
    /// 4 KiB alignment).
    pub trunk_bytes: u64,
    /// The whole trace's lookups and the sample's: how many of their chunks an unbounded
    /// cache could hit (see [`Reuse`]).
    pub reuse: Reuse,
    pub reuse_kept: Reuse,
}

/// Chunks looked up, and how many of them lead their lookup's key list and were named by an
/// earlier call: the hits of a cache that never evicts, the curve's plateau. It is counted
/// over the whole trace and over the sample alike, so the sample's error at the plateau is
/// known exactly, and it moves with the sample's error at every size (the trees a sample
/// happens to hold that reuse more than the average hit more at every size, too).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reuse {
    pub chunks: u64,
    pub named_before: u64,
}

impl Reuse {
    /// Counts a lookup, `seen` telling whether an earlier call named a key.
    fn count(&mut self, call: &Call, seen: impl Fn(&KeyId) -> bool) {
        let mut leading = true;
        for key in call.keys() {
            leading = leading && seen(&key);
            self.chunks += 1;
            self.named_before += u64::from(leading);
        }
    }

    /// The share of looked-up chunks an unbounded cache could hit.
    pub fn rate(&self) -> f64 {
        if self.chunks == 0 {
            0.0
        } else {
            self.named_before as f64 / self.chunks as f64
        }
    }
}

impl SampleCounts {
    /// The share of the trace's distinct keys outside the trunk that the sample holds: what
    /// capacities scale by, as the working set a cache holds a share of is that of the keys.
    pub fn share(&self) -> f64 {
        let (all, kept) = (
            self.keys.saturating_sub(self.trunk_keys),
            self.keys_kept.saturating_sub(self.trunk_keys),
        );
        if all == 0 {
            return self.rate;
        }
        kept as f64 / all as f64
    }

    /// The capacity (bytes) a sampled replay gets for `bytes` of the whole trace's: every
    /// sample holds the trunk whole, so the trunk's bytes stay as they are and only the rest
    /// scales by [`SampleCounts::share`]; below the trunk's bytes the capacity is unscaled.
    pub fn scaled(&self, bytes: f64) -> f64 {
        let trunk = self.trunk_bytes as f64;
        bytes.min(trunk) + (bytes - trunk).max(0.0) * self.share()
    }

    /// What the sample's hit rates are multiplied by to estimate the whole trace's: the whole
    /// trace's [`Reuse::rate`] over the sample's. A sample's error is mostly which heavy
    /// trees it happens to hold, and a tree that reuses more than the average hits more at
    /// every size that holds it; the reuse is counted exactly on both sides, so this ratio
    /// estimator removes the error where the curve levels off and most of it before
    /// (docs/commands/plan.md measures it). 1 when either side reuses nothing.
    pub fn correction(&self) -> f64 {
        let (whole, kept) = (self.reuse.rate(), self.reuse_kept.rate());
        if whole > 0.0 && kept > 0.0 {
            whole / kept
        } else {
            1.0
        }
    }

    /// The inverse of [`SampleCounts::scaled`]: the whole trace's bytes a sample's `bytes`
    /// stand for.
    pub fn unscaled(&self, bytes: f64) -> f64 {
        let trunk = self.trunk_bytes as f64;
        match self.share() {
            share if bytes > trunk && share > 0.0 => trunk + (bytes - trunk) / share,
            _ => bytes,
        }
    }
}

/// The sample's decisions, key by key.
struct Trees {
    /// How many lookups name each key (the first pass).
    lookups: KeyMap<u32>,
    /// A key named by more lookups is in the trunk.
    trunk_limit: u32,
    /// Whether each key seen so far is kept (the trunk's are).
    kept: KeyMap<bool>,
    threshold: u64,
    seed: u64,
    trees: u64,
    trees_kept: u64,
    keys_kept: u64,
    trunk_keys: u64,
    trunk_bytes: u64,
    /// The trunk keys whose writes were counted in `trunk_bytes`.
    trunk_written: KeySet,
    reuse_kept: Reuse,
}

impl Trees {
    fn new(rate: f64, seed: u64, lookups: KeyMap<u32>, chains: u64) -> Trees {
        let rate = rate.clamp(0.0, 1.0);
        Trees {
            lookups,
            trunk_limit: ((chains as f64 * rate / 10.0) as u64).clamp(1, u64::from(u32::MAX))
                as u32,
            kept: KeyMap::default(),
            threshold: (rate * u64::MAX as f64) as u64,
            seed,
            trees: 0,
            trees_kept: 0,
            keys_kept: 0,
            trunk_keys: 0,
            trunk_bytes: 0,
            trunk_written: KeySet::default(),
            reuse_kept: Reuse::default(),
        }
    }

    fn is_trunk(&self, key: &KeyId) -> bool {
        self.lookups.get(key).is_some_and(|&n| n > self.trunk_limit)
    }

    /// Whether `call` is kept; the keys it names for the first time take its decision.
    fn keep(&mut self, call: &Call) -> bool {
        if let Call::ReserveWrite { keys, object_bytes } = call {
            let aligned = object_bytes.div_ceil(4096).saturating_mul(4096);
            for key in keys {
                if self.is_trunk(key) && self.trunk_written.insert(*key) {
                    self.trunk_bytes = self.trunk_bytes.saturating_add(aligned);
                }
            }
        }
        // A call of trunk keys only is kept: every sample holds the trunk.
        let kept = match call.keys().find(|k| !self.is_trunk(k)) {
            None => true,
            Some(below) => match self.kept.get(&below) {
                Some(&kept) => kept,
                None => {
                    let root = below.0;
                    let kept = mix(root as u64 ^ (root >> 64) as u64 ^ self.seed) <= self.threshold;
                    self.trees += 1;
                    self.trees_kept += u64::from(kept);
                    kept
                }
            },
        };
        if kept && matches!(call, Call::Prefetch { .. }) {
            self.reuse_kept.count(call, |k| self.kept.contains_key(k));
        }
        for key in call.keys() {
            let trunk = self.is_trunk(&key);
            self.mark(key, kept || trunk, trunk);
        }
        kept
    }

    fn mark(&mut self, key: KeyId, kept: bool, trunk: bool) {
        if let Entry::Vacant(slot) = self.kept.entry(key) {
            slot.insert(kept);
            self.keys_kept += u64::from(kept);
            self.trunk_keys += u64::from(trunk);
        }
    }
}

/// SplitMix64's finalizer: a root's id and the seed to a uniform 64-bit draw.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn churn() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/lmcache/churn/lru_seed1.lct")
    }

    #[test]
    fn a_load_holds_every_record_or_none_past_its_budget() {
        let read = ReadOptions::default();
        let all = Loaded::load(&churn(), read, usize::MAX)
            .unwrap()
            .expect("within budget");
        // Counted independently: every record the reader hands out, in order.
        let mut reader = TraceReader::open(&churn(), read).unwrap();
        let mut offsets = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            offsets.push(record.offset);
        }
        assert!(offsets.len() > 100, "{}", offsets.len());
        let loaded: Vec<u64> = all.records.iter().map(|r| r.offset).collect();
        assert_eq!(loaded, offsets);
        assert!(Loaded::load(&churn(), read, 1000).unwrap().is_none());
        let head = Loaded::load_head(&churn(), read, 10).unwrap();
        let calls = head.records.iter().filter(|r| r.call.is_ok()).count();
        assert_eq!(calls, 10);
        assert_eq!(head.head(usize::MAX, 10), all.head(usize::MAX, 10));
    }

    fn lookup(keys: &[u8]) -> Call {
        Call::Prefetch {
            groups: vec![crate::storage::PrefetchGroup {
                keys: keys.iter().map(|&k| KeyId(u128::from(k))).collect(),
                object_bytes: 4096,
                chunk_tokens: None,
                window: -1,
            }],
            prefix_only: true,
            readers: 1,
            lock: false,
            skip_l2: false,
            request_id: String::new(),
        }
    }

    #[test]
    fn reuse_counts_the_leading_chunks_named_before() {
        let mut reuse = Reuse::default();
        let seen: std::collections::HashSet<u128> = [1, 2, 3].into();
        // [1, 2, 3]: all three; [1, 4, 2]: the 2 after the new 4 does not lead; [5, 1]: none.
        for keys in [&[1u8, 2, 3][..], &[1, 4, 2], &[5, 1]] {
            reuse.count(&lookup(keys), |k| seen.contains(&{ k.0 }));
        }
        assert_eq!(
            reuse,
            Reuse {
                chunks: 8,
                named_before: 4
            }
        );
        assert_eq!(reuse.rate(), 0.5);
        assert_eq!(Reuse::default().rate(), 0.0);
    }

    #[test]
    fn a_sample_counts_the_whole_traces_reuse_and_its_own() {
        let read = ReadOptions::default();
        // Counted independently over every call: a lookup's chunks, and those of its
        // leading run that any earlier call named.
        let all = Loaded::load(&churn(), read, usize::MAX)
            .unwrap()
            .expect("within budget");
        let mut named = std::collections::HashSet::new();
        let (mut chunks, mut before) = (0u64, 0u64);
        for (_, call) in all.calls() {
            if let Call::Prefetch { .. } = call {
                let keys: Vec<KeyId> = call.keys().collect();
                chunks += keys.len() as u64;
                before += keys.iter().take_while(|k| named.contains(*k)).count() as u64;
            }
            named.extend(call.keys());
        }
        assert!(before > 0 && before < chunks, "{before} of {chunks}");
        let whole = Reuse {
            chunks,
            named_before: before,
        };
        let every = Loaded::load_sample(&churn(), read, 1.0, 0).unwrap().counts;
        assert_eq!((every.reuse, every.reuse_kept), (whole, whole));
        assert_eq!(every.correction(), 1.0);
        let half = Loaded::load_sample(&churn(), read, 0.5, 7).unwrap().counts;
        assert_eq!(half.reuse, whole);
        assert!(half.reuse_kept.chunks < chunks, "{:?}", half.reuse_kept);
        assert_eq!(
            half.correction(),
            whole.rate() / half.reuse_kept.rate(),
            "{half:?}"
        );
    }
}
