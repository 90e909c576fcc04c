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

use super::chunk_times::{Recency, Times};
use super::client::{ClientInfo, LookupIndex};
use super::dispatch::{Call, Decoder, Outcome};
use super::phase::PhaseReport;
use super::session::Position;
use crate::error::Result;
use crate::lmct::blocks::{fold_records, read_ahead};
use crate::lmct::reader::read_records_at;
use crate::lmct::{Header, ReadOptions, ReadSummary, RecordRef, TraceReader};
use crate::storage::{KeyId, KeyMap, PrefetchGroup, SampleScale};

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
    /// What a sample of some of the trace's prefix trees stands for (`None`: every record).
    sample: Option<SampleScale>,
}

/// Bytes a decoded call holds besides its record: its key ids and its groups.
fn call_bytes(call: &Call) -> usize {
    let groups = match call {
        Call::Prefetch { groups, .. } => groups.len() * std::mem::size_of::<PrefetchGroup>(),
        _ => 0,
    };
    groups + call.keys().count() * std::mem::size_of::<KeyId>()
}

/// `name` as one of `names` (a trace has a handful): each record holds a shared reference,
/// not a copy.
fn interned(names: &mut Vec<Arc<str>>, name: &str) -> Arc<str> {
    if let Some(known) = names.iter().find(|n| ***n == *name) {
        return known.clone();
    }
    let new: Arc<str> = Arc::from(name);
    names.push(new.clone());
    new
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
        let (loaded, abandoned) = Loaded::load_while(path, read, |held, _| {
            match held > budget_bytes || crate::interrupt::requested().is_some() {
                true => Next::Abandon,
                false => Next::More,
            }
        })?;
        Ok((!abandoned).then_some(loaded))
    }

    /// The head of `path`: its records up to the one that makes `calls` decoded calls, all of
    /// a shorter trace. What the client inference and the phase estimate read, decoded once
    /// for both by a plan.
    pub(crate) fn load_head(path: &Path, read: ReadOptions, calls: usize) -> Result<Loaded> {
        let (head, _) = Loaded::load_while(path, read, |_, decoded| match decoded >= calls {
            true => Next::Done,
            false => Next::More,
        })?;
        Ok(head)
    }

    /// The calls of a share of `path`'s prefix trees, for a sampled curve: see [`Sample`].
    /// The file is read once whole, holding every call's kind and keys as dense ids (4
    /// bytes a key named and 40 a record, plus 66–106 bytes a distinct key, its times among
    /// them); the sample is decided over those in memory, and only the kept records are read
    /// again (a plain file at their offsets). Only the sampled records are held afterwards,
    /// so a trace too large to load whole can be sampled.
    pub fn load_sample(path: &Path, read: ReadOptions, rate: f64, seed: u64) -> Result<Sample> {
        let mut census = Census::read(path, read)?;
        let mut trees = Trees::new(rate, seed, &census);
        let (mut offsets, mut kept, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
        let (mut from, mut next_id) = (0, 0);
        for (index, call) in census.calls.iter().enumerate() {
            let keys = &census.keys[from..call.keys_end];
            if trees.keep(&census, index as u64, call, keys) {
                offsets.push(call.offset);
                kept.push(index);
            }
            // Ids are given in the order keys are first named: a key is new here when its id
            // is past every id before.
            let new = keys.iter().filter(|&&id| id >= next_id).count();
            fresh.push(match call.kind {
                Kind::Lookup => u32::try_from(new).unwrap_or(u32::MAX),
                _ => 0,
            });
            next_id = keys
                .iter()
                .map(|&id| id.saturating_add(1))
                .fold(next_id, u32::max);
            from = call.keys_end;
        }
        let whole = trees.trees_kept == trees.trees;
        let clock = (!whole)
            .then(|| sample_clock(&census.calls, &fresh, &kept))
            .flatten();
        drop(fresh);
        let records = census.calls.len() as u64;
        trees.recency.finish(records);
        census.recency.finish(records);
        let Census {
            shown,
            header,
            header_warnings,
            summary,
            folded,
            reuse,
            recency,
            ..
        } = census;
        let mut records = Vec::with_capacity(offsets.len());
        let mut names = Vec::new();
        let mut decoder = Decoder::default();
        read_records_at(path, read, &offsets, &mut |record| {
            let t_mono = clock.as_ref().map_or(record.t_mono, |c| c[records.len()]);
            records.push(LoadedRecord {
                offset: record.offset,
                t_mono,
                qualname: interned(&mut names, record.qualname),
                call: decoder.decode(&record),
            });
            Ok(())
        })
        .map_err(|e| e.in_file(&shown))?;
        let counts = SampleCounts {
            rate,
            trees: trees.trees,
            trees_kept: trees.trees_kept,
            keys: folded.len() as u64,
            keys_kept: trees.keys_kept,
            trunk_keys: trees.trunk_keys,
            trunk_bytes: trees.trunk_bytes,
            reuse,
            reuse_kept: trees.reuse_kept,
        };
        let mut loaded = Loaded::new(shown, header, header_warnings, records, summary);
        loaded.sample = (!whole).then(|| counts.scale());
        Ok(Sample {
            loaded,
            counts,
            times: recency.times,
            times_kept: trees.recency.times,
        })
    }

    /// Reads records until `next(bytes held, calls decoded)` says to stop; whether it gave
    /// up.
    fn load_while(
        path: &Path,
        read: ReadOptions,
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
        let summary = read_ahead(
            reader,
            super::READ_AHEAD_BLOCK_BYTES,
            read.threads(),
            &Decoder::default,
            &|decoder, record| Some(decoder.decode(record)),
            &mut |record, decoded| {
                let Some(call) = decoded.take() else {
                    return Ok(true);
                };
                held += std::mem::size_of::<LoadedRecord>() + call.as_ref().map_or(0, call_bytes);
                calls += usize::from(call.is_ok());
                let next = next(held, calls);
                if let Next::Abandon = next {
                    abandoned = true;
                    return Ok(false);
                }
                records.push(LoadedRecord {
                    offset: record.offset,
                    t_mono: record.t_mono,
                    qualname: interned(&mut names, record.qualname),
                    call,
                });
                Ok(matches!(next, Next::More))
            },
        )
        .map_err(|e| e.in_file(&shown))?;
        let loaded = Loaded::new(shown, header, header_warnings, records, summary);
        Ok((loaded, abandoned))
    }

    /// Records read, with nothing inferred from them yet.
    fn new(
        shown: String,
        header: Header,
        header_warnings: Vec<String>,
        records: Vec<LoadedRecord>,
        summary: ReadSummary,
    ) -> Loaded {
        Loaded {
            shown,
            header,
            header_warnings,
            records,
            summary,
            client: OnceLock::new(),
            lookups: OnceLock::new(),
            phases: Mutex::new(HashMap::new()),
            sample: None,
        }
    }

    /// How this sample's L1 stands for the whole trace's, when it is a sample of some of
    /// the trace's prefix trees: a replay of it tells its storage manager.
    pub fn sample_scale(&self) -> Option<SampleScale> {
        self.sample
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
    pub(crate) fn head(&self, records: usize, calls: usize) -> Vec<(Position, &Call)> {
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
                Some((at, call))
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
/// through a key all pass through its ancestors, so a tree is a whole subtree), and one
/// tree in each run of `1 / rate` of them in weight order is kept (stratified by weight;
/// a tree no lookup roots, by a hash of its root and the seed). The limit is a tenth of
/// the lookups the sample expects to keep, so no tree is more than a tenth of the sample. A
/// call other than a lookup follows the tree of its first key below the trunk (a write of
/// the chunks after a hit prefix, the tree of the lookup that named them), a call of trunk
/// keys only is kept, except a read: a read of trunk keys only (or of none, after a lookup
/// that hit nothing) follows the last lookup's tree. Replayed with every capacity scaled by
/// [`SampleCounts::scaled`] (the trunk, which every sample holds whole, at its own bytes, the
/// rest at [`SampleCounts::share`]), the sample's hit rate, mapped through [`Sample::times`]
/// (see [`crate::chunk_times`]; for an L1 alone, the whole trace's footprint and first
/// stores answer it), estimates the whole trace's.
pub struct Sample {
    pub loaded: Loaded,
    pub counts: SampleCounts,
    /// The whole trace's looked-up chunks by their times, and the sample's (counted over
    /// its own calls, as its replay sees them): what turns a sampled hit rate into the
    /// whole trace's.
    pub times: Times,
    pub times_kept: Times,
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
    /// Counts a lookup by whether an earlier call named each of its keys, in order.
    fn count(&mut self, seen: impl IntoIterator<Item = bool>) {
        let mut leading = true;
        for seen in seen {
            leading = leading && seen;
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

    /// The whole trace's [`Reuse::rate`] over the sample's: a ratio estimator of the whole
    /// trace's hit rates from the sample's. A sample's error is mostly which heavy trees it
    /// happens to hold, and a tree that reuses more than the average hits more at every size
    /// that holds it; the reuse is counted exactly on both sides, so the ratio is exact where
    /// the curve levels off. The planner maps a policy's rates through the chunks' times
    /// instead, which measured closer below the plateau, and multiplies the optimal bound by
    /// this (docs/commands/plan.md measures both). 1 when either side reuses nothing.
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
        self.scale().whole_bytes(bytes)
    }

    /// How a replay of the sample stands for the whole trace: the trunk whole, the rest at
    /// [`SampleCounts::share`].
    pub fn scale(&self) -> SampleScale {
        SampleScale {
            trunk_objects: self.trunk_keys,
            trunk_bytes: self.trunk_bytes,
            share: self.share(),
        }
    }
}

/// Each kept call's time on a sample's own clock: the time of the whole trace's first call
/// before which it had looked up as large a share of its new keys as the sample had by the
/// middle of that call.
///
/// LMCache's controller runs a pass every interval and admits at most the room its last
/// pass made, so what a replay hits depends on how evenly the writes come between passes.
/// A 1 % sample of the Mooncake twin writes about 16 requests in an interval where the whole
/// trace writes 1,700: by the recorded times its load per interval varies far more, a lump
/// overruns the room the whole trace's smoother load fits, and the sample refused writes
/// the whole trace did not (every seed read 1.3–3.5 pp low at 137 GiB). Its new keys are
/// the work it brings; spread like the whole trace's, each interval brings its share.
/// `fresh` is each call's keys that no call named before, counted for lookups only; `kept`
/// the sample's calls in order. `None` when either side names none.
fn sample_clock(calls: &[Counted], fresh: &[u32], kept: &[usize]) -> Option<Vec<f64>> {
    let whole: u64 = fresh.iter().map(|&n| u64::from(n)).sum();
    let sampled: u64 = kept.iter().map(|&i| u64::from(fresh[i])).sum();
    if whole == 0 || sampled == 0 || calls.is_empty() {
        return None;
    }
    let scale = whole as f64 / sampled as f64;
    // The sample's keys named so far; the whole trace's call, and its keys named before it.
    let (mut named, mut at, mut before) = (0u64, 0usize, 0u64);
    let times = kept.iter().map(|&i| {
        let target = (named as f64 + f64::from(fresh[i]) / 2.0) * scale;
        named += u64::from(fresh[i]);
        while at + 1 < calls.len() && (before as f64) < target {
            before += u64::from(fresh[at]);
            at += 1;
        }
        calls[at].t_mono
    });
    Some(times.collect())
}

/// A sample's one read of the whole trace: every record's kind and its call's keys, each
/// key a dense id given in the order keys are first named (so the keys a call names first
/// are the ids it was given), for deciding the sample without a second read of the keys.
struct Census {
    shown: String,
    header: Header,
    header_warnings: Vec<String>,
    summary: ReadSummary,
    calls: Vec<Counted>,
    /// Every call's keys in order, one run after another.
    keys: Vec<u32>,
    /// By dense id: the key's id folded to 64 bits, which a tree's draw hashes.
    folded: Vec<u64>,
    /// By dense id: how many lookups name the key.
    lookups: Vec<u32>,
    /// Lookups.
    chains: u64,
    reuse: Reuse,
    /// The chunks' times over every call.
    recency: Recency,
}

/// One record of a [`Census`].
struct Counted {
    offset: u64,
    /// Where the call's run of [`Census::keys`] ends.
    keys_end: usize,
    kind: Kind,
    t_mono: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Lookup,
    /// `read_prefetched_results` or `finish_read_prefetched`: the read of a lookup's hit.
    Read,
    /// `reserve_write`, of objects of this many bytes.
    Reserve(u64),
    Other,
    /// A record replay skips: every sample keeps it.
    Skipped,
}

/// A block of records decoded on a worker thread, for [`Census::read`] to take in order.
#[derive(Default)]
struct Decoded {
    decoder: Decoder,
    /// Each record's offset, kind, where its keys end in `keys`, and time.
    records: Vec<(u64, Kind, usize, f64)>,
    keys: Vec<KeyId>,
}

impl Decoded {
    fn add(&mut self, record: &RecordRef<'_>) {
        let call = self.decoder.decode(record);
        let kind = match &call {
            Err(_) => Kind::Skipped,
            Ok(Call::Prefetch { .. }) => Kind::Lookup,
            Ok(Call::ReadEnter { .. } | Call::ReadExit { .. } | Call::FinishRead { .. }) => {
                Kind::Read
            }
            Ok(Call::ReserveWrite { object_bytes, .. }) => Kind::Reserve(*object_bytes),
            Ok(_) => Kind::Other,
        };
        if let Ok(call) = &call {
            self.keys.extend(call.keys());
        }
        self.records
            .push((record.offset, kind, self.keys.len(), record.t_mono));
    }
}

impl Census {
    /// Reads the whole of `path`, its records decoded on [`ReadOptions::threads`] threads
    /// and taken in order.
    fn read(path: &Path, read: ReadOptions) -> Result<Census> {
        let shown = path.display().to_string();
        let reader = TraceReader::open(path, read).map_err(|e| e.in_file(&shown))?;
        let mut census = Census {
            header: reader.header().clone(),
            header_warnings: reader.header_warnings(),
            shown,
            summary: ReadSummary::default(),
            calls: Vec::new(),
            keys: Vec::new(),
            folded: Vec::new(),
            lookups: Vec::new(),
            chains: 0,
            reuse: Reuse::default(),
            recency: Recency::default(),
        };
        let mut ids = KeyMap::<u32>::default();
        let mut failed = None;
        let summary = fold_records(
            reader,
            read.threads(),
            super::READ_AHEAD_BLOCK_BYTES,
            &Decoded::default,
            &Decoded::add,
            &mut |block| {
                let mut from = 0;
                for &(offset, kind, to, t_mono) in &block.records {
                    if failed.is_none() {
                        let keys = &block.keys[from..to];
                        if let Err(e) = census.add(&mut ids, keys, kind == Kind::Lookup, offset) {
                            failed = Some(e);
                        }
                    }
                    census.calls.push(Counted {
                        offset,
                        keys_end: census.keys.len(),
                        kind,
                        t_mono,
                    });
                    from = to;
                }
            },
            &|_, _| {},
        )
        .and_then(|summary| failed.map_or(Ok(summary), Err))
        .map_err(|e| e.in_file(&census.shown))?;
        census.summary = summary;
        Ok(census)
    }

    /// Gives `call`'s keys their ids and counts a lookup's reuse.
    fn add(
        &mut self,
        ids: &mut KeyMap<u32>,
        keys: &[KeyId],
        lookup: bool,
        offset: u64,
    ) -> Result<()> {
        let known = self.folded.len();
        let start = self.keys.len();
        for &key in keys {
            let id = match ids.entry(key) {
                Entry::Occupied(id) => *id.get(),
                Entry::Vacant(slot) => {
                    let Ok(id) = u32::try_from(self.folded.len()) else {
                        return Err(crate::error::Error::data(
                            offset,
                            "keys",
                            "more than 2^32 distinct keys: too many to sample",
                        ));
                    };
                    self.folded.push(key.0 as u64 ^ (key.0 >> 64) as u64);
                    self.lookups.push(0);
                    self.recency.add_key();
                    *slot.insert(id)
                }
            };
            self.keys.push(id);
        }
        if lookup {
            self.chains += 1;
            let run = &self.keys[start..];
            self.reuse
                .count(run.iter().map(|&id| (id as usize) < known));
            for &id in run {
                let n = &mut self.lookups[id as usize];
                *n = n.saturating_add(1);
            }
        }
        self.recency
            .call(self.calls.len() as u64, lookup, &self.keys[start..]);
        Ok(())
    }
}

/// Whether a key is kept, by dense id.
#[derive(Clone, Copy, PartialEq)]
enum Mark {
    Unseen,
    Dropped,
    Kept,
}

/// A lookup tree's root, in the order [`Trees::stratified`] takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Root {
    weight: u64,
    folded: u64,
    id: u32,
}

/// The sample's decisions, call by call over a [`Census`].
struct Trees {
    /// A key named by more lookups is in the trunk.
    trunk_limit: u32,
    marks: Vec<Mark>,
    /// The roots of the lookups' trees, each kept or not (see [`Trees::stratified`]).
    roots: HashMap<u32, bool>,
    /// A tree first named by another call is kept when its root's draw is at most this.
    threshold: u64,
    seed: u64,
    trees: u64,
    trees_kept: u64,
    keys_kept: u64,
    trunk_keys: u64,
    trunk_bytes: u64,
    /// The trunk keys whose writes were counted in `trunk_bytes`.
    trunk_written: Vec<bool>,
    reuse_kept: Reuse,
    /// The chunks' times over the kept calls.
    recency: Recency,
    /// Whether the last lookup was kept (`None` before the first).
    last_lookup: Option<bool>,
}

impl Trees {
    fn new(rate: f64, seed: u64, census: &Census) -> Trees {
        let rate = rate.clamp(0.0, 1.0);
        let keys = census.folded.len();
        let trunk_limit =
            ((census.chains as f64 * rate / 10.0) as u64).clamp(1, u64::from(u32::MAX)) as u32;
        Trees {
            trunk_limit,
            marks: vec![Mark::Unseen; keys],
            roots: Trees::stratified(&Trees::roots(census, trunk_limit), rate, seed),
            threshold: (rate * u64::MAX as f64) as u64,
            seed,
            trees: 0,
            trees_kept: 0,
            keys_kept: 0,
            trunk_keys: 0,
            trunk_bytes: 0,
            trunk_written: vec![false; keys],
            reuse_kept: Reuse::default(),
            recency: Recency::with_keys(keys),
            last_lookup: None,
        }
    }

    /// The roots of the lookups' trees — a lookup's first key that `trunk_limit` lookups or
    /// fewer name — each with its tree's weight (the chunks its lookups look up) and its
    /// folded id, sorted by weight.
    fn roots(census: &Census, trunk_limit: u32) -> Vec<Root> {
        let mut weights: HashMap<u32, u64> = HashMap::new();
        let mut from = 0;
        for call in &census.calls {
            let keys = &census.keys[from..call.keys_end];
            from = call.keys_end;
            if call.kind != Kind::Lookup {
                continue;
            }
            if let Some(&root) = keys
                .iter()
                .find(|&&id| census.lookups[id as usize] <= trunk_limit)
            {
                *weights.entry(root).or_default() += keys.len() as u64;
            }
        }
        let mut roots: Vec<Root> = weights
            .into_iter()
            .map(|(id, weight)| Root {
                weight,
                folded: census.folded[id as usize],
                id,
            })
            .collect();
        roots.sort_unstable();
        roots
    }

    /// Which of `roots` (sorted by weight) a sample of `rate` keeps: cut into runs of
    /// `1 / rate`, one from each run, the one whose draw with the seed is least (a last,
    /// shorter run keeps one with the chance its length gives). Stratified by weight, a
    /// sample keeps each weight class in proportion: drawn one by one, a sample of a few
    /// hundred trees holds more or fewer of the few heavy ones by chance, and they move the
    /// curve by points (docs/commands/plan.md).
    fn stratified(roots: &[Root], rate: f64, seed: u64) -> HashMap<u32, bool> {
        let mut kept: HashMap<u32, bool> = roots.iter().map(|r| (r.id, false)).collect();
        if rate <= 0.0 {
            return kept;
        }
        let step = 1.0 / rate;
        for run in 0u64.. {
            let start = (run as f64 * step) as usize;
            if start >= roots.len() {
                break;
            }
            let end = (((run + 1) as f64 * step) as usize).clamp(start + 1, roots.len());
            // Only the last run can be short: a run's length is measured against where it
            // would end, not against its rounded bounds, which hold `step` rounded down (33
            // of 33.3 at 3 %) and, read as a short run, ended the sample by chance early.
            let length = (roots.len() as f64 - run as f64 * step) / step;
            if length < 1.0 && mix(seed ^ run) as f64 > length * u64::MAX as f64 {
                break;
            }
            if let Some(r) = roots[start..end]
                .iter()
                .min_by_key(|r| mix(r.folded ^ seed))
            {
                kept.insert(r.id, true);
            }
        }
        kept
    }

    /// Whether `call` (naming `keys`) is kept; the keys it names for the first time take its
    /// decision.
    fn keep(&mut self, census: &Census, index: u64, call: &Counted, keys: &[u32]) -> bool {
        let limit = self.trunk_limit;
        let trunk = |id: u32| census.lookups[id as usize] > limit;
        if let Kind::Reserve(object_bytes) = call.kind {
            let aligned = object_bytes.div_ceil(4096).saturating_mul(4096);
            for &id in keys {
                if trunk(id) && !std::mem::replace(&mut self.trunk_written[id as usize], true) {
                    self.trunk_bytes = self.trunk_bytes.saturating_add(aligned);
                }
            }
        }
        let kept = match keys.iter().find(|&&id| !trunk(id)) {
            // A read of the trunk only (a hit on the shared prefix, or nothing) belongs to
            // the lookup before it, as a server's calls for one request come together: kept
            // with every tree, such reads were half of a 1 % sample's records.
            None if call.kind == Kind::Read => self.last_lookup.unwrap_or(true),
            // Any other call of trunk keys only is kept (every sample holds the trunk), and
            // so is a record replay skips.
            None => true,
            Some(&below) => match self.marks[below as usize] {
                Mark::Kept => true,
                Mark::Dropped => false,
                Mark::Unseen => {
                    let kept = match self.roots.get(&below) {
                        Some(&kept) => kept,
                        None => mix(census.folded[below as usize] ^ self.seed) <= self.threshold,
                    };
                    self.trees += 1;
                    self.trees_kept += u64::from(kept);
                    kept
                }
            },
        };
        if call.kind == Kind::Lookup {
            self.last_lookup = Some(kept);
            if kept {
                let marks = &self.marks;
                self.reuse_kept
                    .count(keys.iter().map(|&id| marks[id as usize] != Mark::Unseen));
            }
        }
        if kept {
            self.recency.call(index, call.kind == Kind::Lookup, keys);
        }
        for &id in keys {
            let mark = &mut self.marks[id as usize];
            if *mark == Mark::Unseen {
                let trunk = trunk(id);
                let kept = kept || trunk;
                *mark = if kept { Mark::Kept } else { Mark::Dropped };
                self.keys_kept += u64::from(kept);
                self.trunk_keys += u64::from(trunk);
            }
        }
        kept
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

    /// The churn recording, every record of it.
    fn whole_churn() -> Loaded {
        Loaded::load(&churn(), ReadOptions::default(), usize::MAX)
            .unwrap()
            .expect("within budget")
    }

    #[test]
    fn a_load_holds_every_record_or_none_past_its_budget() {
        let read = ReadOptions::default();
        let all = whole_churn();
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
            reuse.count(lookup(keys).keys().map(|k| seen.contains(&{ k.0 })));
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

    /// A recording with one request at a time: a sample that holds a read holds the lookup
    /// before it, whatever the read names (a hit on keys every tree shares, or nothing).
    #[test]
    fn a_sampled_read_comes_with_its_lookup() {
        let read = ReadOptions::default();
        let all = whole_churn();
        // Each read's lookup, found independently: the last lookup before it in the file.
        let mut lookup_of = HashMap::new();
        let mut last = None;
        for r in &all.records {
            match &r.call {
                Ok(Call::Prefetch { .. }) => last = Some(r.offset),
                Ok(Call::ReadEnter { .. } | Call::ReadExit { .. } | Call::FinishRead { .. }) => {
                    lookup_of.insert(r.offset, last.expect("a lookup first"));
                }
                _ => {}
            }
        }
        for (rate, seed) in [(0.5, 7), (0.2, 1), (0.2, 2)] {
            let sample = Loaded::load_sample(&churn(), read, rate, seed)
                .unwrap()
                .loaded;
            let kept: std::collections::HashSet<u64> =
                sample.records.iter().map(|r| r.offset).collect();
            let reads: Vec<u64> = lookup_of
                .keys()
                .copied()
                .filter(|r| kept.contains(r))
                .collect();
            assert!(
                !reads.is_empty() && reads.len() < lookup_of.len(),
                "{rate}: {reads:?}"
            );
            for r in reads {
                assert!(
                    kept.contains(&lookup_of[&r]),
                    "{rate} {seed}: the read at byte {r}"
                );
            }
        }
    }

    /// A trace of eight lookups a second apart, each naming one new key: a sample of the
    /// first two (a lump at its start) names 4 of the whole trace's keys per one of its own,
    /// so the middles of its calls, half a key and a key and a half in, stand at 2 and 6
    /// keys: the first calls the whole trace had named as many keys before, at 2 s and 6 s.
    #[test]
    fn a_samples_clock_spreads_its_new_keys_as_the_whole_trace_does() {
        let call = |i: u64, kind| Counted {
            offset: i,
            keys_end: 0,
            kind,
            t_mono: i as f64,
        };
        let calls: Vec<Counted> = (0..8).map(|i| call(i, Kind::Lookup)).collect();
        let fresh = [1u32; 8];
        assert_eq!(sample_clock(&calls, &fresh, &[0, 1]), Some(vec![2.0, 6.0]));
        // Calls 0 and 4 of eight, a read after each lookup (16 calls, t = call index).
        let calls: Vec<Counted> = (0..16)
            .map(|i| call(i, [Kind::Lookup, Kind::Read][i as usize % 2]))
            .collect();
        let fresh: Vec<u32> = (0..16).map(|i| u32::from(i % 2 == 0)).collect();
        // 4 keys a sampled key: the lookup at 0 stands at 2 keys, first named before call 3
        // (by the lookups at 0 and 2); its read at 4, before call 7; the lookup at 8 at 6,
        // before call 11; its read at all 8, before call 15.
        assert_eq!(
            sample_clock(&calls, &fresh, &[0, 1, 8, 9]),
            Some(vec![3.0, 7.0, 11.0, 15.0])
        );
        assert_eq!(sample_clock(&calls, &[0; 16], &[0, 1]), None);
        assert_eq!(sample_clock(&calls, &fresh, &[1, 3]), None);
    }

    /// A sample takes one tree from each run of `1 / rate` trees in weight order: as many
    /// as the rate asks, every weight class in proportion, a different tree for another seed.
    #[test]
    fn a_sample_takes_one_tree_from_each_run_of_weights() {
        let roots: Vec<Root> = (0..40u32)
            .map(|id| Root {
                weight: u64::from(id) * 3,
                folded: mix(u64::from(id)),
                id,
            })
            .collect();
        let kept = |rate: f64, seed: u64| {
            let kept = Trees::stratified(&roots, rate, seed);
            assert_eq!(kept.len(), roots.len());
            let mut ids: Vec<u32> = kept.iter().filter(|(_, &k)| k).map(|(&id, _)| id).collect();
            ids.sort_unstable();
            ids
        };
        assert_eq!(kept(1.0, 3), (0..40).collect::<Vec<_>>());
        for seed in 0..8 {
            let quarter = kept(0.25, seed);
            // One in each run of four: ids 0-3, 4-7, ...
            let runs: Vec<u32> = quarter.iter().map(|id| id / 4).collect();
            assert_eq!(runs, (0..10).collect::<Vec<_>>(), "seed {seed}");
            // Runs of 3.33: [0, 3), [3, 6), ..., the last [36, 40); twelve runs in all.
            assert_eq!(kept(0.3, seed).len(), 12, "seed {seed}");
        }
        // A rate whose runs are not whole takes one tree from every run: runs of 33.3 trees
        // hold 33 or 34, and only the last may be short of a whole run. 10,007 trees are
        // 300 runs and 7 trees, 0.21 of a run: 300 trees, or 301 with that chance.
        let many: Vec<Root> = (0..10_007u32)
            .map(|id| Root {
                weight: u64::from(id),
                folded: mix(u64::from(id)),
                id,
            })
            .collect();
        for seed in 0..8 {
            let kept = Trees::stratified(&many, 0.03, seed);
            let kept = kept.values().filter(|&&k| k).count();
            assert!((300..=301).contains(&kept), "seed {seed}: {kept}");
            // Runs of 3.33 (0.3): the last run starts at 3,002 × 3.33 = 10,006.7, a third of
            // a run: kept with a third's chance, so 3,002 or 3,003.
            let kept = Trees::stratified(&many, 0.3, seed)
                .values()
                .filter(|&&k| k)
                .count();
            assert!((3002..=3003).contains(&kept), "seed {seed}: {kept}");
        }
        assert_ne!(kept(0.25, 0), kept(0.25, 1));
        assert!(kept(0.0, 0).is_empty());
    }

    /// Every looked-up chunk's times, counted independently with the keys themselves over
    /// every record of a real recording: a sample of every tree counts exactly these on both
    /// sides, a half sample these for the whole trace and its own for itself. The whole
    /// trace's footprint is each window's distinct used keys, averaged window by window,
    /// and its first stores each key's first store.
    #[test]
    fn a_samples_chunk_times_are_the_whole_traces_and_its_own_calls() {
        let read = ReadOptions::default();
        let all = whole_churn();
        let (mut used, mut stored) = (HashMap::new(), HashMap::new());
        let (mut reuse, mut admission) = (Vec::new(), Vec::new());
        // By record: the keys it used (stored, read, or found by a lookup).
        let mut uses: Vec<Vec<KeyId>> = vec![Vec::new(); all.records.len()];
        for (now, record) in all.records.iter().enumerate() {
            let Ok(call) = &record.call else { continue };
            let at = now;
            let now = now as u64;
            let keys: Vec<KeyId> = call.keys().collect();
            if !matches!(call, Call::Prefetch { .. }) {
                for &k in &keys {
                    used.insert(k, now);
                    stored.entry(k).or_insert(now);
                }
                uses[at] = keys;
                continue;
            }
            let (mut r, mut a) = (Some(0), Some(0));
            for k in &keys {
                r = r.zip(used.get(k)).map(|(r, &u)| u64::max(r, now - u));
                a = a.zip(stored.get(k)).map(|(a, &s)| u64::max(a, s));
                reuse.push(r);
                admission.push(a);
            }
            for k in keys.iter().take_while(|k| stored.contains_key(*k)) {
                used.insert(*k, now);
                uses[at].push(*k);
            }
        }
        assert!(reuse.iter().any(Option::is_some) && reuse.iter().any(Option::is_none));
        let every = Loaded::load_sample(&churn(), read, 1.0, 0).unwrap();
        let footprint = every.times.footprint.clone();
        let n = uses.len();
        for w in [1, 10, 100, n / 3, n - 1] {
            let windows = n - w + 1;
            let distinct: usize = (0..windows)
                .map(|s| {
                    uses[s..s + w]
                        .iter()
                        .flatten()
                        .collect::<std::collections::HashSet<_>>()
                        .len()
                })
                .sum();
            let expected = distinct as f64 / windows as f64;
            // Stretches past 2,048 records are bucketed to a 1/1024 share of themselves.
            let got = footprint.mean_keys(w as f64);
            assert!(
                (got / expected - 1.0).abs() < 1e-3,
                "w {w}: {got} against {expected}"
            );
        }
        let whole = Times {
            reuse: reuse.into_iter().collect(),
            admission: admission.into_iter().collect(),
            footprint,
            first_stores: stored.values().map(|&s| Some(s)).collect(),
        };
        assert_eq!((&every.times, &every.times_kept), (&whole, &whole));
        let half = Loaded::load_sample(&churn(), read, 0.5, 7).unwrap();
        assert_eq!(half.times, whole);
        assert_ne!(half.times_kept, whole);
        assert!(half.times_kept.reuse.share_within(1e12) > 0.0);
    }

    #[test]
    fn a_sample_counts_the_whole_traces_reuse_and_its_own() {
        let read = ReadOptions::default();
        // Counted independently over every call: a lookup's chunks, and those of its
        // leading run that any earlier call named.
        let all = whole_churn();
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
