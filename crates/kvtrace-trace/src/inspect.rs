//! `kvtrace info`: everything LMCache's `trace info` prints, plus what users of a storage
//! trace ask next — which schema variant, when the first call came (the start-up gap), how
//! many distinct chunks and how many bytes the calls imply, and whether the file is complete.

use crate::report::terminal::escape_line;
use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::Progress;
use crate::error::Result;
use crate::lmct::args::{CallArgs, Keys};
use crate::lmct::blocks::fold_records;
use crate::lmct::calls::{
    FINISH_READ_PREFETCHED, FINISH_WRITE, RECORDER_SUMMARY, RESERVE_WRITE, SUBMIT_PREFETCH_TASK,
};
use crate::lmct::codec::LayoutCache;
use crate::lmct::digest::{config_digest, python_json, semantic_digest};
use crate::lmct::display::to_display;
use crate::lmct::msgpack::RawValue;
use crate::lmct::schema::SchemaEvidence;
use crate::lmct::{Header, HeaderSchema, ReadOptions, RecordRef, TraceReader};
use crate::replay::events::summary::EventsSummary;
use crate::storage::config::StorageConfig;
use crate::storage::{KeyId, KeyMap, KeySet};

/// Bytes implied by the calls' layouts (one object = one chunk's KV).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PayloadBytes {
    /// Distinct object sizes seen in layouts.
    pub object_sizes: Vec<u64>,
    /// Tokens per chunk, from the standard KV layout.
    pub chunk_tokens: Option<u64>,
    pub reserved: u64,
    pub written: u64,
    pub prefetch_requested: u64,
    pub read: u64,
    /// Keys whose size no layout gave (an unknown dtype, or never reserved or prefetched).
    pub keys_of_unknown_size: u64,
}

/// The summary of one trace file.
#[derive(Clone, Debug, Serialize)]
pub struct TraceInfo {
    pub file: String,
    pub compressed: bool,
    pub level: String,
    pub format_version: i64,
    pub trace_schema_version: Option<i64>,
    pub lmcache_version: Option<String>,
    pub schema_variant: String,
    /// LMCache's "duration": the largest record `t_mono`, start-up gap included.
    pub duration_s: f64,
    pub t_wall_start: f64,
    pub first_record_t_mono: Option<f64>,
    pub last_record_t_mono: Option<f64>,
    /// Time between the recorder's creation and the first call.
    pub startup_gap_s: Option<f64>,
    pub sm_config_digest: String,
    /// SHA-256 of `sm_config_json` equals the recorded digest.
    pub digest_verified: bool,
    /// `sm_config_json` is exactly what Python's `json.dumps(sort_keys=True)` produces.
    pub config_canonical: bool,
    pub semantic_digest: Option<String>,
    /// The recorded configuration in words (L1, eviction, L2), when kvtrace can read it.
    pub recorded_config: BTreeMap<String, String>,
    pub level_meta: Option<serde_json::Value>,
    pub total_records: u64,
    pub ops: BTreeMap<String, u64>,
    pub distinct_keys: u64,
    pub payload: PayloadBytes,
    pub undecodable_records: u64,
    pub truncated: Option<String>,
    /// A signal stopped the read: every count is of the records before it.
    pub interrupted: bool,
    /// Why the file is a kvtrace output that was never finished, when it is one: it lacks
    /// the trailer that its header or its temporary name promises (a killed recording, or
    /// a file cut short at a frame boundary).
    pub unfinished: Option<String>,
    pub warnings: Vec<String>,
    /// Arguments of kvtrace's trailer record, when the recorder wrote one.
    pub trailer: Option<serde_json::Value>,
    pub bytes_read: u64,
    /// The cache-event summary of an events-level trace.
    pub events: Option<EventsSummary>,
}

/// Bytes of records each decoding thread takes at a time. Measured on the 1.3 GB Mooncake
/// trace: 1 MiB blocks took 0.75 s where 4 MiB took 0.85 s (a block's key map stays in the
/// core's cache, and the buffers are not mapped afresh) and 256 KiB 1.0 s.
const BLOCK_BYTES: usize = 1 << 20;

/// A key's size where no layout gave one.
const UNKNOWN: u64 = u64::MAX;

/// Slots of [`Recent`].
const RECENT_SLOTS: usize = 1024;

/// The sizes the block's map gave its latest keys, in front of the map: a request names its
/// keys in a lookup, a reservation and a write within a few records, so most map reads and
/// writes of a block repeat one of the last few thousand. A slot holds the map's current
/// value for its key, so a hit answers exactly what the map would.
struct Recent {
    slots: Box<[(KeyId, u64)]>,
}

impl Recent {
    fn new() -> Recent {
        // An empty slot holds a size no key has: `get` of any key misses it.
        Recent {
            slots: vec![(KeyId(0), UNKNOWN); RECENT_SLOTS].into_boxed_slice(),
        }
    }

    fn slot(&mut self, key: KeyId) -> &mut (KeyId, u64) {
        // The id is a uniform hash: its low bits pick the slot.
        &mut self.slots[(key.0 as usize) % RECENT_SLOTS]
    }

    /// The key's size in the map, when the slot still holds the key with a known size.
    fn get(&mut self, key: KeyId) -> Option<u64> {
        let &mut (held, size) = self.slot(key);
        (held == key && size != UNKNOWN).then_some(size)
    }

    fn set(&mut self, key: KeyId, size: u64) {
        *self.slot(key) = (key, size);
    }
}

/// The file's keys with their sizes, as the merge keeps them: a set of every key, and a
/// map of only the keys whose size is not the one most keys have. A trace's objects are
/// nearly all of one size, so the set is nearly the whole store, at 16 bytes a key where a
/// map of sizes took 32 (a 128-bit id beside a 64-bit size, padded): on the 1.83 million
/// keys of `big_10x.lct` the merge thread's probes, one a key a block, miss the shared
/// cache less, and the process holds 23 MiB less.
#[derive(Default)]
struct FileKeys {
    all: KeySet,
    /// The size of the keys `other` does not hold: the first a layout gave.
    common: Option<u64>,
    /// Keys of [`UNKNOWN`] size or of a size other than `common`.
    other: KeyMap<u64>,
}

impl FileKeys {
    /// The key's size ([`UNKNOWN`] where none was given, or the key is new).
    fn get(&self, key: KeyId) -> u64 {
        if let Some(&size) = self.other.get(&key) {
            return size;
        }
        match (self.all.contains(&key), self.common) {
            (true, Some(common)) => common,
            _ => UNKNOWN,
        }
    }

    /// The key's size is now `size`.
    fn set(&mut self, key: KeyId, size: u64) {
        let common = *self.common.get_or_insert(size);
        let new = self.all.insert(key);
        if size != common {
            self.other.insert(key, size);
        } else if !new && !self.other.is_empty() {
            self.other.remove(&key);
        }
    }

    /// The key is known, its size unknown unless it had one.
    fn note(&mut self, key: KeyId) {
        if self.all.insert(key) {
            self.other.insert(key, UNKNOWN);
        }
    }

    fn len(&self) -> usize {
        self.all.len()
    }
}

impl Tally {
    /// Distinct keys seen: a block's map holds them, or, once blocks were merged into this
    /// tally, the file's keys (a tally that merges observes no records itself).
    fn distinct_keys(&self) -> usize {
        self.keys.len() + self.file.len()
    }
}

/// What a call does with the bytes of its keys, for the payload sums.
#[derive(Clone, Copy)]
enum Use {
    Reserved,
    Written,
    PrefetchRequested,
    Read,
    /// Counted as a key, not as bytes.
    Other,
}

/// Per-record facts of a run of records (a block, or the whole trace once merged). Blocks
/// are tallied on their own threads and merged in stream order, and the merge is exact: a
/// key's size is the one the last earlier layout gave it, so a key a block cannot size
/// itself waits in `waiting` for the blocks before it.
struct Tally {
    ops: BTreeMap<String, u64>,
    /// Every key seen, with the size the last layout gave it ([`UNKNOWN`]: none).
    keys: KeyMap<u64>,
    /// In front of `keys` for [`Tally::keys`], the only writer of a block's map; the merge
    /// writes the file's keys without it, and the file's tally observes no records.
    recent: Recent,
    /// The merged keys of the blocks before (the file's tally only).
    file: FileKeys,
    /// Occurrences no earlier record of this block sized, per use.
    waiting: KeyMap<[u64; 5]>,
    /// The ids of the record's keys, in a buffer kept from record to record.
    ids: Vec<KeyId>,
    sizes: Vec<u64>,
    /// The layouts [`Tally::note_layout`] read.
    layouts: LayoutCache,
    payload: PayloadBytes,
    evidence: SchemaEvidence,
    trailer: Option<serde_json::Value>,
    events: EventsSummary,
    max_t_mono: f64,
    first: Option<f64>,
    last: Option<f64>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            ops: BTreeMap::new(),
            // A block's distinct keys, about: growing from empty rehashed every block.
            keys: KeyMap::with_capacity_and_hasher(BLOCK_BYTES / 512, Default::default()),
            recent: Recent::new(),
            file: FileKeys::default(),
            waiting: KeyMap::default(),
            ids: Vec::new(),
            sizes: Vec::new(),
            layouts: LayoutCache::default(),
            payload: PayloadBytes::default(),
            evidence: SchemaEvidence::default(),
            trailer: None,
            events: EventsSummary::default(),
            max_t_mono: 0.0,
            first: None,
            last: None,
        }
    }
}

impl PayloadBytes {
    fn add(&mut self, used: Use, bytes: u64) {
        match used {
            Use::Reserved => self.reserved += bytes,
            Use::Written => self.written += bytes,
            Use::PrefetchRequested => self.prefetch_requested += bytes,
            Use::Read => self.read += bytes,
            Use::Other => {}
        }
    }
}

impl Tally {
    fn count_op(&mut self, qualname: &str) {
        match self.ops.get_mut(qualname) {
            Some(n) => *n += 1,
            None => {
                self.ops.insert(qualname.to_owned(), 1);
            }
        }
    }

    fn note_size(&mut self, size: u64) {
        if !self.sizes.contains(&size) {
            self.sizes.push(size);
        }
    }

    /// The object size a layout gives, noted among the sizes; the first layout that gives
    /// one tells the chunk's tokens.
    fn note_layout(&mut self, layout: Option<RawValue<'_>>) -> Option<u64> {
        let figures = self.layouts.figures(layout?)?;
        let size = figures.object_bytes?;
        self.note_size(size);
        if self.payload.chunk_tokens.is_none() {
            self.payload.chunk_tokens = figures.chunk_tokens;
        }
        Some(size)
    }

    /// Registers keys, with their size when a layout gives it, and adds the bytes of those
    /// whose size is known here; the others wait for the merge.
    fn keys(&mut self, keys: Option<&Keys<'_>>, size: Option<u64>, used: Use) {
        let Some(keys) = keys else {
            return;
        };
        let mut bytes = 0;
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        KeyId::of_refs(&keys.keys, &mut ids);
        for &h in &ids {
            let known = match (size, self.recent.get(h)) {
                (Some(s), Some(was)) if s == was => s,
                (None, Some(was)) => was,
                (Some(s), _) => {
                    self.keys.insert(h, s);
                    self.recent.set(h, s);
                    s
                }
                (None, None) => {
                    let known = *self.keys.entry(h).or_insert(UNKNOWN);
                    self.recent.set(h, known);
                    known
                }
            };
            if known == UNKNOWN {
                self.waiting.entry(h).or_default()[used as usize] += 1;
            } else {
                bytes += known;
            }
        }
        self.ids = ids;
        self.payload.add(used, bytes);
    }

    fn observe(&mut self, r: &RecordRef<'_>) {
        self.count_op(r.qualname);
        self.max_t_mono = self.max_t_mono.max(r.t_mono);
        self.first.get_or_insert(r.t_mono);
        self.last = Some(r.t_mono);
        if r.qualname.starts_with("events.") {
            self.events.add(r.qualname, r.args);
            return;
        }
        let Some(args) = CallArgs::of(r) else {
            return;
        };
        self.evidence.observe(r.qualname, &args);
        match r.qualname {
            RESERVE_WRITE => {
                let size = self.note_layout(args.layout_desc);
                self.keys(args.keys.valid(), size, Use::Reserved);
            }
            FINISH_WRITE => self.keys(args.keys.valid(), None, Use::Written),
            FINISH_READ_PREFETCHED => self.keys(args.keys.valid(), None, Use::Read),
            SUBMIT_PREFETCH_TASK => {
                for group in args.spec.valid().map(|s| &s.groups[..]).unwrap_or_default() {
                    let size = self.note_layout(group.layout_desc);
                    self.keys(Some(&group.keys), size, Use::PrefetchRequested);
                }
            }
            RECORDER_SUMMARY => self.trailer = Some(to_display(r.args)),
            _ => self.keys(args.keys.valid(), None, Use::Other),
        }
    }

    /// Appends the tally of the records that follow this one's.
    fn merge(&mut self, next: Tally) {
        const USES: [Use; 5] = [
            Use::Reserved,
            Use::Written,
            Use::PrefetchRequested,
            Use::Read,
            Use::Other,
        ];
        for (key, counts) in next.waiting {
            let size = self.file.get(key);
            for (used, n) in USES.into_iter().zip(counts) {
                if size == UNKNOWN {
                    self.payload.keys_of_unknown_size += n;
                } else {
                    self.payload.add(used, size * n);
                }
            }
        }
        for (key, size) in next.keys {
            if size == UNKNOWN {
                self.file.note(key);
            } else {
                self.file.set(key, size);
            }
        }
        for (qualname, n) in next.ops {
            *self.ops.entry(qualname).or_default() += n;
        }
        for size in next.sizes {
            self.note_size(size);
        }
        let (p, q) = (&mut self.payload, next.payload);
        p.chunk_tokens = p.chunk_tokens.or(q.chunk_tokens);
        p.reserved += q.reserved;
        p.written += q.written;
        p.prefetch_requested += q.prefetch_requested;
        p.read += q.read;
        self.evidence.merge(&next.evidence);
        self.events.merge(next.events);
        self.trailer = next.trailer.or(self.trailer.take());
        self.max_t_mono = self.max_t_mono.max(next.max_t_mono);
        self.first = self.first.or(next.first);
        self.last = next.last.or(self.last);
    }
}

/// Reads the whole trace once and summarises it; `-` reads standard input.
pub fn inspect(path: &Path, options: ReadOptions, progress: Progress<'_>) -> Result<TraceInfo> {
    let shown = path.display().to_string();
    let reader = TraceReader::open_or_stdin(path, options).map_err(|e| e.in_file(&shown))?;
    let header = reader.header().clone();
    let mut warnings = reader.header_warnings();
    let mut tally = Tally::default();
    let summary = fold_records(
        reader,
        options.threads(),
        BLOCK_BYTES,
        &Tally::default,
        &Tally::observe,
        &mut |block| tally.merge(block),
        progress,
    )
    .map_err(|e| e.in_file(&shown))?;
    warnings.extend(summary.warnings());
    let config = &header.sm_config_json;
    let config_canonical =
        config.is_empty() || serde_json::from_str(config).is_ok_and(|v| python_json(&v) == *config);
    let (trace_schema_version, lmcache_version) = match &header.schema {
        HeaderSchema::Version(v) => (Some(*v), None),
        HeaderSchema::Early { lmcache_version } => (None, Some(lmcache_version.clone())),
    };
    tally.sizes.sort_unstable();
    let distinct_keys = tally.distinct_keys() as u64;
    let mut payload = tally.payload;
    payload.object_sizes = tally.sizes;
    Ok(TraceInfo {
        file: shown,
        compressed: summary.compressed,
        level: header.level.clone(),
        format_version: header.format_version,
        trace_schema_version,
        lmcache_version,
        schema_variant: tally.evidence.variant(&header).to_string(),
        duration_s: tally.max_t_mono,
        t_wall_start: header.t_wall_start,
        first_record_t_mono: tally.first,
        last_record_t_mono: tally.last,
        startup_gap_s: tally.first,
        sm_config_digest: header.sm_config_digest.clone(),
        digest_verified: config_digest(config) == header.sm_config_digest
            || (config.is_empty() && header.sm_config_digest.is_empty()),
        config_canonical,
        semantic_digest: semantic_digest(config),
        recorded_config: StorageConfig::recorded_in_words(
            config,
            payload.object_sizes.first().copied(),
        )
        .unwrap_or_default()
        .into_iter()
        .map(|(what, words)| (what.to_owned(), words))
        .collect(),
        // Re-encoded from the parsed header, so it always parses again.
        level_meta: header.level_meta.as_ref().and_then(|m| {
            let bytes = crate::lmct::msgpack::encode_to_vec(m);
            RawValue::parse(&bytes).ok().map(to_display)
        }),
        total_records: summary.records,
        ops: tally.ops,
        distinct_keys,
        payload,
        undecodable_records: summary.undecodable,
        truncated: summary.truncation.as_ref().map(|t| t.to_string()),
        interrupted: summary.interrupted,
        unfinished: unfinished(&header, path, tally.trailer.is_some()),
        warnings,
        trailer: tally.trailer,
        bytes_read: summary.bytes,
        events: (header.level == "events").then_some(tally.events),
    })
}

/// Why a file without kvtrace's trailer should have had one: its header promises it, or its
/// name is the temporary name of an output whose process ended before renaming it.
fn unfinished(header: &Header, path: &Path, has_trailer: bool) -> Option<String> {
    if has_trailer {
        None
    } else if crate::output::is_temporary(path) {
        Some(
            "an unfinished kvtrace output, its process ended before it was renamed into place"
                .into(),
        )
    } else if header.promises_trailer() {
        Some("a kvtrace recording cut short: its header promises a trailer record, the file ends before it".into())
    } else {
        None
    }
}

fn human_bytes(n: u64) -> String {
    if n < 1024 {
        format!("{n} B")
    } else {
        format!("{} ({n} B)", crate::report::units::bytes(n))
    }
}

/// One `label: value` row, labels in LMCache's 28-wide column.
/// One `key: value` line; both may come from the trace, so both are escaped.
fn row(out: &mut String, indent: usize, key: &str, value: &dyn std::fmt::Display) {
    let (key, value) = (escape_line(key), value.to_string());
    let value = escape_line(&value);
    out.push_str(&format!("{:indent$}{:<28}{value}\n", "", format!("{key}:")));
}

fn field(out: &mut String, key: &str, value: impl std::fmt::Display) {
    row(out, 2, key, &value);
}

fn secs(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}s")).unwrap_or_else(|| "-".into())
}

impl TraceInfo {
    /// The text report: LMCache's `trace info` layout first, then kvtrace's additions.
    pub fn render(&self) -> String {
        let mut s = format!("Trace file: {}\n", escape_line(&self.file));
        field(&mut s, "level", &self.level);
        field(&mut s, "format_version", self.format_version);
        match (self.trace_schema_version, &self.lmcache_version) {
            (Some(v), _) => field(&mut s, "trace_schema_version", v),
            (None, Some(v)) => field(&mut s, "lmcache_version", v),
            _ => {}
        }
        field(&mut s, "duration", format!("{:.3}s", self.duration_s));
        field(&mut s, "sm_config_digest", &self.sm_config_digest);
        if let Some(serde_json::Value::Object(meta)) = &self.level_meta {
            // Sorted, strings bare: as LMCache prints them.
            let sorted: BTreeMap<&String, &serde_json::Value> = meta.iter().collect();
            for (k, v) in sorted {
                match v {
                    serde_json::Value::String(text) => field(&mut s, k, text),
                    v => field(&mut s, k, v),
                }
            }
        }
        field(&mut s, "total_records", self.total_records);
        if self.ops.is_empty() {
            s.push_str("  ops: (none)\n");
        } else {
            s.push_str("  ops:\n");
            for (q, n) in &self.ops {
                s.push_str(&format!("    {}: {n}\n", escape_line(q)));
            }
        }
        if let Some(events) = &self.events {
            s.push_str(&events.render(&row));
        }
        s.push_str("  kvtrace:\n");
        field(&mut s, "schema variant", &self.schema_variant);
        field(
            &mut s,
            "container",
            if self.compressed { "zstd" } else { "plain" },
        );
        field(
            &mut s,
            "first record t_mono",
            secs(self.first_record_t_mono),
        );
        field(&mut s, "last record t_mono", secs(self.last_record_t_mono));
        field(&mut s, "start-up gap", secs(self.startup_gap_s));
        let check = if self.digest_verified {
            "sha256(sm_config_json) matches"
        } else {
            "DOES NOT MATCH sha256(sm_config_json)"
        };
        field(&mut s, "digest check", check);
        let canonical = if self.config_canonical {
            "canonical (json.dumps sort_keys)"
        } else {
            "not in canonical form"
        };
        field(&mut s, "config JSON", canonical);
        if let Some(d) = &self.semantic_digest {
            field(&mut s, "semantic digest", d);
        }
        for what in ["L1", "eviction", "L2"] {
            if let Some(words) = self.recorded_config.get(what) {
                field(&mut s, &format!("recorded {what}"), words);
            }
        }
        match &self.events {
            Some(events) => {
                for (tier, bytes) in &events.store_bytes_per_tier {
                    field(&mut s, &format!("store bytes {tier}"), human_bytes(*bytes));
                }
            }
            None => self.render_payload(&mut s),
        }
        field(&mut s, "undecodable records", self.undecodable_records);
        match (&self.truncated, self.interrupted, &self.unfinished) {
            (_, true, _) => field(
                &mut s,
                "complete",
                "unknown: interrupted; every count above is of the records read before the signal",
            ),
            (Some(t), ..) => field(&mut s, "complete", format!("no: {t}")),
            (None, _, Some(why)) => field(&mut s, "complete", format!("no (no trailer): {why}")),
            (None, ..) => field(&mut s, "complete", "yes"),
        }
        if let Some(serde_json::Value::Object(t)) = &self.trailer {
            let parts: Vec<String> = t.iter().map(|(k, v)| format!("{k}={v}")).collect();
            field(&mut s, "recorder trailer", parts.join(" "));
        }
        s
    }

    /// What a storage-level trace's calls imply: keys and bytes.
    fn render_payload(&self, s: &mut String) {
        field(s, "distinct keys", self.distinct_keys);
        let p = &self.payload;
        let sizes: Vec<String> = p.object_sizes.iter().map(|b| human_bytes(*b)).collect();
        let sizes = if sizes.is_empty() {
            "-".into()
        } else {
            sizes.join(", ")
        };
        field(s, "object size", sizes);
        if let Some(t) = p.chunk_tokens {
            field(s, "chunk tokens", t);
        }
        field(s, "bytes reserved", human_bytes(p.reserved));
        field(s, "bytes written", human_bytes(p.written));
        field(
            s,
            "bytes prefetch-requested",
            human_bytes(p.prefetch_requested),
        );
        field(s, "bytes read", human_bytes(p.read));
        if p.keys_of_unknown_size > 0 {
            field(s, "keys of unknown size", p.keys_of_unknown_size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{write_to, SynthOptions};
    use crate::QUIET;

    fn facts(t: &Tally) -> String {
        format!(
            "{:?} {} {:?} {:?} {:?} {} {:?} {:?}",
            t.ops,
            t.distinct_keys(),
            t.payload,
            t.sizes,
            t.evidence,
            t.max_t_mono,
            t.first,
            t.last
        )
    }

    /// Tallies of runs of records merged in order equal one tally of them all: sizes a
    /// run learns from earlier runs are applied at the merge.
    #[test]
    fn merged_tallies_equal_one_pass() {
        let options = SynthOptions {
            records: 2000,
            ..SynthOptions::default()
        };
        let bytes = write_to(&options, Vec::new(), QUIET).expect("trace");
        let mut reader =
            TraceReader::from_reader(std::io::Cursor::new(bytes), ReadOptions::default())
                .expect("header");
        let mut whole = Tally::default();
        let mut merged = Tally::default();
        let mut run = Tally::default();
        let mut n = 0;
        while let Some(r) = reader.next_record().expect("read") {
            whole.observe(&r);
            run.observe(&r);
            n += 1;
            if n % 7 == 0 {
                merged.merge(std::mem::take(&mut run));
            }
        }
        merged.merge(run);
        assert!(whole.payload.written > 0 && whole.payload.read > 0);
        assert_eq!(facts(&merged), facts(&whole));
    }

    /// The file's compact keys answer as a map of every key's size would, whatever the
    /// order of sizes, unknowns and repeats.
    #[test]
    fn the_files_keys_answer_as_a_map_of_sizes() {
        let mut rng = crate::rng::SplitMix64::new(7);
        let mut next = |m: u64| rng.range(0, m - 1);
        for round in 0..50 {
            let (mut file, mut model) = (FileKeys::default(), KeyMap::<u64>::default());
            for _ in 0..400 {
                let key = KeyId(u128::from(next(60)));
                // Unknown, a rare size (7), or the common one (4096; 9 in a round of five).
                match next(10) {
                    0..=2 => {
                        file.note(key);
                        model.entry(key).or_insert(UNKNOWN);
                    }
                    3 => {
                        file.set(key, 7);
                        model.insert(key, 7);
                    }
                    _ => {
                        let size = if round % 5 == 0 { 9 } else { 4096 };
                        file.set(key, size);
                        model.insert(key, size);
                    }
                }
                let probe = KeyId(u128::from(next(70)));
                assert_eq!(
                    file.get(probe),
                    model.get(&probe).copied().unwrap_or(UNKNOWN),
                    "round {round}"
                );
            }
            assert_eq!(file.len(), model.len());
            for (key, size) in &model {
                assert_eq!(file.get(*key), *size);
            }
        }
    }

    /// Reservations whose layouts change from call to call, one with a dtype no size is
    /// known for: each call's bytes are its own layout's, whatever the layout before it.
    #[test]
    fn each_reservation_is_sized_by_its_own_layout() {
        use crate::lmct::calls::StorageCall;
        use crate::lmct::codec::{MemoryLayoutDesc, ObjectKey};
        use crate::lmct::{Header, TraceWriter};
        let layout = |tokens: i64, dtype: &str| MemoryLayoutDesc {
            shapes: vec![vec![2, 4, tokens, 8]],
            dtypes: vec![dtype.to_owned()],
        };
        let (small, large, odd) = (
            layout(16, "torch.bfloat16"),
            layout(32, "torch.float32"),
            layout(16, "torch.unheard_of"),
        );
        let mut writer = TraceWriter::new(Vec::new(), Header::storage(0.0, 0.0));
        writer.attach_storage_config("{}").expect("header");
        let mut args = Vec::new();
        for (i, layout) in [&small, &small, &large, &odd, &small, &large, &large]
            .into_iter()
            .enumerate()
        {
            let keys = [ObjectKey {
                chunk_hash: vec![i as u8; 32],
                model_name: "m".into(),
                kv_rank: 0,
                object_group_id: 0,
                cache_salt: String::new(),
            }];
            let call = StorageCall::ReserveWrite {
                keys: &keys,
                layout_desc: layout,
            };
            args.clear();
            call.encode_args(&mut args);
            writer
                .write_record_parts(i as f64, i as f64, call.qualname(), &args)
                .expect("record");
        }
        let bytes = writer.finish().expect("trace");
        let mut reader =
            TraceReader::from_reader(std::io::Cursor::new(bytes), ReadOptions::default())
                .expect("header");
        let mut tally = Tally::default();
        while let Some(r) = reader.next_record().expect("read") {
            tally.observe(&r);
        }
        // 2·4·16·8 elements of 2 bytes, and 2·4·32·8 of 4.
        let (s, l) = (2 * 4 * 16 * 8 * 2, 2 * 4 * 32 * 8 * 4);
        assert_eq!(tally.payload.reserved, 3 * s + 3 * l);
        assert_eq!(tally.sizes, vec![s, l]);
        assert_eq!(tally.waiting.len(), 1, "the odd layout's key has no size");
    }
}
