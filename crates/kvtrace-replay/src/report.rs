//! The replay report: everything LMCache's `trace replay` reports (records replayed, skipped
//! and failed; per-call-kind latency statistics; the digest check) plus what it cannot —
//! per-request hits and hit rates split by tier, OUT_OF_MEMORY reservations, evictions and
//! per-tier bytes, and the fidelity of the replay to the recording. As a [`Report`] it is
//! LMCache's files: `trace_replay_summary.json` (LMCache's `duration_s` and `ops`, kvtrace's
//! sections under `kvtrace`), `trace_replay_{ops,requests,tiers,divergences}.csv` and the
//! workbook `trace_replay.xlsx`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value as Json};

use super::fidelity::FidelityReport;
use super::phase::PhaseReport;
use super::session::Completions;
use crate::error::Result;
use crate::rank::Rank;
use crate::storage::{CallStats, PrefetchOutcome, TierIo, TierStats};
use kvtrace_report::xlsx::MAX_DATA_ROWS;
use kvtrace_report::{Cell, JsonStyle, Report, Table, Unit};

/// Latency statistics of one call kind, in milliseconds (LMCache's columns).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OpStats {
    pub count: u64,
    pub errors: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

/// Percentile as LMCache 0.5.6 computes it: index `int(p/100 · n)` of the sorted values,
/// clamped to the last one.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * sorted.len() as f64) as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl OpStats {
    /// The statistics of `count` calls that were not timed: every latency zero, as
    /// [`OpStats::from_latencies`] gives of that many zeros.
    pub fn untimed(count: u64, errors: u64) -> OpStats {
        OpStats {
            count,
            errors,
            ..OpStats::default()
        }
    }

    pub fn from_latencies(mut ms: Vec<f64>, errors: u64) -> OpStats {
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        OpStats {
            count: n as u64,
            errors,
            mean_ms: if n == 0 {
                0.0
            } else {
                ms.iter().sum::<f64>() / n as f64
            },
            p50_ms: percentile(&ms, 50.0),
            p90_ms: percentile(&ms, 90.0),
            p99_ms: percentile(&ms, 99.0),
            min_ms: ms.first().copied().unwrap_or(0.0),
            max_ms: ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// Hits over every prefetch, in chunks and tokens.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HitSummary {
    pub requests: u64,
    pub requested_chunks: u64,
    pub hit_chunks: u64,
    pub l1_hit_chunks: u64,
    pub l2_hit_chunks: u64,
    pub requested_tokens: u64,
    pub hit_tokens: u64,
    pub l1_hit_tokens: u64,
    pub l2_hit_tokens: u64,
    pub hit_rate: f64,
    pub l1_hit_rate: f64,
    pub l2_hit_rate: f64,
    /// Requests per hit-rate decile: `[0, 0.1)`, …, `[0.9, 1.0)`, and exactly 1.0 last.
    pub hit_rate_histogram: [u64; 11],
}

impl HitSummary {
    pub fn from_requests(requests: &[PrefetchOutcome]) -> HitSummary {
        let mut s = HitSummary::default();
        for r in requests {
            let tokens = r.chunk_tokens.unwrap_or(0);
            s.requests += 1;
            s.requested_chunks += r.requested_chunks;
            s.hit_chunks += r.hit_chunks;
            s.l1_hit_chunks += r.l1_hit_chunks;
            s.l2_hit_chunks += r.l2_hit_chunks;
            s.requested_tokens += r.requested_chunks * tokens;
            s.hit_tokens += r.hit_chunks * tokens;
            s.l1_hit_tokens += r.l1_hit_chunks * tokens;
            s.l2_hit_tokens += r.l2_hit_chunks * tokens;
            let bucket = ((r.hit_rate() * 10.0).floor() as usize).min(10);
            s.hit_rate_histogram[bucket] += 1;
        }
        let rate = |n: u64| {
            if s.requested_chunks == 0 {
                0.0
            } else {
                n as f64 / s.requested_chunks as f64
            }
        };
        s.hit_rate = rate(s.hit_chunks);
        s.l1_hit_rate = rate(s.l1_hit_chunks);
        s.l2_hit_rate = rate(s.l2_hit_chunks);
        s
    }
}

/// The digest comparison, as printed.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct DigestReport {
    pub recorded: String,
    pub run: String,
    /// `match`, `match (semantic)` or `MISMATCH`.
    pub result: String,
    /// JSON paths that differ, for a mismatch.
    pub differing_paths: Vec<String>,
}

/// Which rank of a run a replay was, and what of the trace it took.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RankReport {
    #[serde(flatten)]
    pub rank: Rank,
    /// `by-request`, `by-key`, `replicate`, or `own trace` (one file per rank).
    pub shard: String,
    /// Records of the trace other ranks replayed.
    pub records_of_other_ranks: u64,
    /// The measured phase, in seconds since the Unix epoch: what `kvtrace aggregate`
    /// takes the run's common window from.
    pub started_unix_s: f64,
    pub finished_unix_s: f64,
}

/// Everything a replay measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplayReport {
    pub trace: String,
    pub level: String,
    pub pacing: String,
    pub records: u64,
    /// A signal stopped the replay before the end of the trace: every figure covers only
    /// the records up to `records`.
    pub interrupted: bool,
    pub replayed: u64,
    pub skipped: u64,
    pub failed: u64,
    /// Wall time of the whole replay loop, pacing sleeps included.
    pub duration_s: f64,
    pub digest: DigestReport,
    /// The configuration the replay ran with, in LMCache's JSON shape.
    pub config: serde_json::Value,
    pub ops: BTreeMap<String, OpStats>,
    pub hits: HitSummary,
    pub calls: CallStats,
    pub tiers: Vec<TierStats>,
    /// Live I/O timing of the L2 tiers (bandwidth, load latency).
    pub tier_io: Vec<TierIo>,
    pub requests: Vec<PrefetchOutcome>,
    pub skip_reasons: BTreeMap<String, u64>,
    pub failure_reasons: BTreeMap<String, u64>,
    /// `read_prefetched_results` contexts still open at the end, closed by the replayer.
    pub forced_exits: u64,
    /// Recorded versus replayed, request by request.
    pub fidelity: FidelityReport,
    /// What the replay did for the recording's client (end-of-session touches, and writes
    /// and lock releases a different outcome called for).
    pub completions: Completions,
    /// The model of the recorded client the replay ran, and what it changed.
    pub client: super::client::ClientReport,
    /// The configuration replayed in words, beside the recorded one.
    pub configuration: Vec<ConfigLine>,
    /// When the L1 eviction passes ran, and how that was chosen.
    pub eviction_phase: Option<PhaseReport>,
    pub warnings: Vec<String>,
    /// The warnings of `warnings` that are the trace's own (its header's, a truncated or
    /// undecodable record), the same in every replay of it: what a caller replaying one
    /// trace at many sizes says once.
    #[serde(skip)]
    pub trace_warnings: Vec<String>,
    /// This replay's rank, in a run of many.
    pub rank: Option<RankReport>,
    /// Per call kind, every latency as a mergeable HdrHistogram (see
    /// [`kvtrace_report::histogram`]).
    pub latency_histograms: BTreeMap<String, String>,
}

/// Columns of the per-call-kind table (LMCache's `trace_replay_ops.csv`).
pub const OP_COLUMNS: [&str; 9] = [
    "qualname", "count", "errors", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms",
];

/// Columns of the per-request table; the last is what the recorded server hit.
pub const REQUEST_COLUMNS: [&str; 11] = [
    "external_request_id",
    "t_mono",
    "requested_chunks",
    "hit_chunks",
    "l1_hit_chunks",
    "l2_hit_chunks",
    "chunk_tokens",
    "requested_tokens",
    "hit_tokens",
    "hit_rate",
    "recorded_hit_chunks",
];

/// Columns of the per-tier table.
const TIER_COLUMNS: [&str; 16] = [
    "name",
    "backend",
    "capacity_bytes",
    "resident_bytes",
    "resident_objects",
    "peak_bytes",
    "bytes_written",
    "bytes_read",
    "writes",
    "reads",
    "evictions",
    "bytes_evicted",
    "write_errors",
    "read_errors",
    "delete_errors",
    "cross_rank_hits",
];

/// Columns of the per-tier I/O table: the backend calls of each L2 tier, timed.
const TIER_IO_COLUMNS: [&str; 26] = [
    "name",
    "mode",
    "queue_depth",
    "workers",
    "writes",
    "reads",
    "deletes",
    "bytes_written",
    "bytes_read",
    "mib_per_s",
    "queue_wait_p50_ms",
    "queue_wait_p90_ms",
    "queue_wait_p99_ms",
    "service_p50_ms",
    "service_p90_ms",
    "service_p99_ms",
    "end_to_end_p50_ms",
    "end_to_end_p90_ms",
    "end_to_end_p99_ms",
    "end_to_end_max_ms",
    "schedule_lag_p50_ms",
    "schedule_lag_p90_ms",
    "schedule_lag_p99_ms",
    "submit_stall_s",
    "drain_s",
    "lost_reads",
];

/// One part of the configuration in words: what was replayed and what the trace records.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ConfigLine {
    pub what: String,
    pub replayed: String,
    /// `None` when the trace records no configuration kvtrace can read.
    pub recorded: Option<String>,
}

impl ConfigLine {
    /// Whether the replay ran something else than the recording did.
    pub fn differs(&self) -> bool {
        self.recorded.as_ref().is_some_and(|r| *r != self.replayed)
    }
}

/// Columns of the divergence table.
pub const DIVERGENCE_COLUMNS: [&str; 9] = [
    "record",
    "offset",
    "t_mono",
    "kind",
    "request_id",
    "recorded",
    "replayed",
    "chunk",
    "reason",
];

impl ReplayReport {
    /// The summary document; keys are sorted when written.
    fn summary(&self) -> Json {
        json!({
            "duration_s": self.duration_s,
            "ops": self.ops,
            "kvtrace": {
                "trace": self.trace,
                "level": self.level,
                "pacing": self.pacing,
                "records": self.records,
                "interrupted": self.interrupted,
                "replayed": self.replayed,
                "skipped": self.skipped,
                "failed": self.failed,
                "digest": self.digest,
                "config": self.config,
                "hits": self.hits,
                "calls": self.calls,
                "tiers": self.tiers,
                "tier_io": self.tier_io,
                "skip_reasons": self.skip_reasons,
                "failure_reasons": self.failure_reasons,
                "forced_exits": self.forced_exits,
                "fidelity": self.fidelity,
                "completions": self.completions,
                "client": self.client,
                "configuration": self.configuration,
                "eviction_phase": self.eviction_phase,
                "warnings": self.warnings,
                "rank": self.rank,
                "latency_histograms": self.latency_histograms,
            }
        })
    }

    fn summary_sheet(&self) -> Table {
        let h = &self.hits;
        let c = &self.calls;
        let mut t = Table::new(&["metric", "value"]).sheet("Summary");
        let texts: [(&str, &str); 7] = [
            ("trace", &self.trace),
            ("level", &self.level),
            ("pacing", &self.pacing),
            ("interrupted", if self.interrupted { "yes" } else { "no" }),
            ("config digest", &self.digest.result),
            ("recorded digest", &self.digest.recorded),
            ("run digest", &self.digest.run),
        ];
        for (k, v) in texts {
            t.rows.push(vec![Cell::text(k), Cell::text(v)]);
        }
        t.rows.push(vec![
            Cell::text("duration (s)"),
            Cell::Measure(self.duration_s, Unit::Seconds),
        ]);
        let left_out = self.requests.len().saturating_sub(MAX_DATA_ROWS) as u64;
        let counts: [(&str, u64); 17] = [
            ("records", self.records),
            ("replayed", self.replayed),
            ("skipped", self.skipped),
            ("failed", self.failed),
            ("requests", h.requests),
            ("requested chunks", h.requested_chunks),
            ("hit chunks", h.hit_chunks),
            ("L1 hit chunks", h.l1_hit_chunks),
            ("L2 hit chunks", h.l2_hit_chunks),
            ("requested tokens", h.requested_tokens),
            ("hit tokens", h.hit_tokens),
            ("keys reserved", c.keys_reserved),
            ("keys not writable", c.keys_not_writable),
            ("OUT_OF_MEMORY reservations", c.out_of_memory_calls),
            ("OUT_OF_MEMORY keys", c.out_of_memory_keys),
            ("failed reads of prefetched keys", c.read_failures),
            ("request rows left out (Excel row limit)", left_out),
        ];
        for (k, v) in counts {
            t.rows.push(vec![Cell::text(k), Cell::Count(v)]);
        }
        for (k, v) in [
            ("hit rate", h.hit_rate),
            ("L1 hit rate", h.l1_hit_rate),
            ("L2 hit rate", h.l2_hit_rate),
        ] {
            t.rows
                .push(vec![Cell::text(k), Cell::Measure(v, Unit::Ratio)]);
        }
        t
    }

    fn ops_table(&self) -> Table {
        let mut t = Table::new(&OP_COLUMNS)
            .sheet("Ops")
            .csv("trace_replay_ops.csv");
        for (q, s) in &self.ops {
            let mut row = vec![Cell::text(q), Cell::Count(s.count), Cell::Count(s.errors)];
            row.extend(
                [s.mean_ms, s.p50_ms, s.p90_ms, s.p99_ms, s.min_ms, s.max_ms]
                    .map(|v| Cell::Measure(v, Unit::Millis)),
            );
            t.rows.push(row);
        }
        t
    }

    fn requests_table(&self) -> Table {
        let mut t = Table::new(&REQUEST_COLUMNS)
            .sheet("Requests")
            .csv("trace_replay_requests.csv");
        let optional = |n: Option<u64>| n.map_or(Cell::Empty, Cell::Count);
        for r in &self.requests {
            let tokens = r.chunk_tokens.unwrap_or(0);
            t.rows.push(vec![
                Cell::text(&r.external_request_id),
                Cell::Measure(r.t, Unit::Seconds),
                Cell::Count(r.requested_chunks),
                Cell::Count(r.hit_chunks),
                Cell::Count(r.l1_hit_chunks),
                Cell::Count(r.l2_hit_chunks),
                optional(r.chunk_tokens),
                Cell::Count(r.requested_chunks * tokens),
                Cell::Count(r.hit_chunks * tokens),
                Cell::Measure(r.hit_rate(), Unit::Ratio),
                optional(r.recorded_hit_chunks),
            ]);
        }
        t
    }

    /// The tier counters; the CSV names its first column `name` (the field), the sheet
    /// `tier`.
    fn tiers_table(&self, first: &str) -> Table {
        let mut columns = TIER_COLUMNS.to_vec();
        columns[0] = first;
        let mut t = Table::new(&columns);
        for s in &self.tiers {
            let mut row = vec![
                Cell::text(&s.name),
                Cell::text(&s.backend),
                s.capacity_bytes.map_or(Cell::Empty, Cell::Count),
            ];
            row.extend(
                [
                    s.resident_bytes,
                    s.resident_objects,
                    s.peak_bytes,
                    s.bytes_written,
                    s.bytes_read,
                    s.writes,
                    s.reads,
                    s.evictions,
                    s.bytes_evicted,
                    s.write_errors,
                    s.read_errors,
                    s.delete_errors,
                    s.cross_rank_hits,
                ]
                .map(Cell::Count),
            );
            t.rows.push(row);
        }
        t
    }

    /// Each tier's backend calls: counts, bytes, and queue wait, service and end-to-end
    /// percentiles (schedule lag in paced asynchronous replays). The CSV names its first
    /// column `name`, the sheet `tier`.
    fn tier_io_table(&self, first: &str) -> Table {
        let mut columns = TIER_IO_COLUMNS.to_vec();
        columns[0] = first;
        let mut t = Table::new(&columns);
        let optional = |n: Option<u32>| n.map_or(Cell::Empty, |n| Cell::Count(n.into()));
        for io in self.tier_io.iter().filter(|io| io.mode != "modelled") {
            let c = &io.calls;
            let mut row = vec![
                Cell::text(&io.name),
                Cell::text(&io.mode),
                optional(io.queue_depth),
                optional(io.workers),
            ];
            row.extend(
                [c.writes, c.reads, c.deletes, c.bytes_written, c.bytes_read].map(Cell::Count),
            );
            row.push(Cell::Number(c.mib_per_s));
            for p in [&c.queue_wait_ms, &c.service_ms] {
                row.extend([p.p50_ms, p.p90_ms, p.p99_ms].map(|v| Cell::Measure(v, Unit::Millis)));
            }
            let e = &c.end_to_end_ms;
            row.extend(
                [e.p50_ms, e.p90_ms, e.p99_ms, e.max_ms].map(|v| Cell::Measure(v, Unit::Millis)),
            );
            match &c.schedule_lag_ms {
                Some(p) => row
                    .extend([p.p50_ms, p.p90_ms, p.p99_ms].map(|v| Cell::Measure(v, Unit::Millis))),
                None => row.extend([Cell::Empty, Cell::Empty, Cell::Empty]),
            }
            row.push(Cell::Measure(c.submit_stall_s, Unit::Seconds));
            row.push(Cell::Measure(c.drain_s, Unit::Seconds));
            row.push(Cell::Count(c.lost_reads));
            t.rows.push(row);
        }
        t
    }

    /// The first divergences; the sheet adds the fidelity summary beneath them.
    fn divergences_table(&self) -> Table {
        let mut t = Table::new(&DIVERGENCE_COLUMNS);
        for d in &self.fidelity.first_divergences {
            t.rows.push(vec![
                Cell::Count(d.record),
                Cell::Count(d.offset),
                Cell::Measure(d.t_mono, Unit::Seconds),
                Cell::text(d.kind),
                Cell::text(&d.request_id),
                Cell::Count(d.recorded),
                Cell::Count(d.replayed),
                d.chunk.map_or(Cell::Empty, Cell::Count),
                Cell::text(&d.reason),
            ]);
        }
        t
    }

    fn fidelity_footer(&self) -> Vec<Vec<Cell>> {
        let fi = &self.fidelity;
        let mut rows: Vec<Vec<Cell>> = [
            ("requests", fi.requests),
            ("requests matching", fi.requests_matching),
            ("recorded hit chunks", fi.recorded_hit_chunks),
            ("replayed hit chunks", fi.replayed_hit_chunks),
            ("replayed L1 hit chunks", fi.replayed_l1_hit_chunks),
            ("replayed L2 hit chunks", fi.replayed_l2_hit_chunks),
            ("stores", fi.stores),
            ("stores matching", fi.stores_matching),
            ("recorded reserved keys", fi.recorded_reserved_keys),
            ("replayed reserved keys", fi.replayed_reserved_keys),
            ("divergences", fi.divergences),
        ]
        .into_iter()
        .map(|(k, v)| vec![Cell::text(k), Cell::Count(v)])
        .collect();
        rows.push(vec![
            Cell::text("request match rate"),
            Cell::Measure(fi.request_match_rate(), Unit::Ratio),
        ]);
        if let Some(p) = &self.eviction_phase {
            rows.push(vec![
                Cell::text("eviction phase (s)"),
                Cell::Measure(p.phase_s, Unit::Seconds),
            ]);
            rows.push(vec![
                Cell::text("eviction phase source"),
                Cell::text(p.source),
            ]);
        }
        rows
    }

    fn config_sheet(&self) -> Table {
        let mut leaves = Vec::new();
        config_leaves("", &self.config, &mut leaves);
        let mut t = Table::new(&["setting", "value"]).sheet("Config");
        t.rows = leaves
            .into_iter()
            .map(|(path, value)| {
                let cell = match value {
                    Json::Number(n) => Cell::Number(n.as_f64().unwrap_or(0.0)),
                    Json::Bool(b) => Cell::Bool(*b),
                    Json::String(s) => Cell::text(s),
                    other => Cell::Text(other.to_string()),
                };
                vec![Cell::Text(path), cell]
            })
            .collect();
        t
    }
}

/// `(dotted path, value)` of every leaf of a JSON value, keys sorted.
fn config_leaves<'a>(prefix: &str, v: &'a Json, out: &mut Vec<(String, &'a Json)>) {
    match v {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                config_leaves(&path, &m[k], out);
            }
        }
        Json::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                config_leaves(&format!("{prefix}[{i}]"), item, out);
            }
        }
        other => out.push((prefix.to_owned(), other)),
    }
}

impl Report for ReplayReport {
    fn document(&self) -> Result<Json> {
        Ok(self.summary())
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::PrettySorted
    }

    fn tables(&self) -> Vec<Table> {
        let mut fidelity = self.divergences_table().sheet("Fidelity");
        fidelity.footer = self.fidelity_footer();
        let tables = vec![
            self.summary_sheet(),
            self.ops_table(),
            self.requests_table(),
            self.tiers_table("name").csv("trace_replay_tiers.csv"),
            self.tiers_table("tier").sheet("Tiers"),
            self.tier_io_table("name").csv("trace_replay_tier_io.csv"),
            self.tier_io_table("tier").sheet("Tier IO"),
            self.divergences_table().csv("trace_replay_divergences.csv"),
            fidelity,
            self.config_sheet(),
        ];
        match &self.rank {
            Some(r) => {
                let rank = Cell::Count(u64::from(r.rank.rank));
                tables
                    .into_iter()
                    .map(|t| t.with_first_column("rank", &rank))
                    .collect()
            }
            None => tables,
        }
    }

    fn terminal(&self) -> String {
        super::terminal::render(self)
    }
}

#[cfg(test)]
mod tests {
    use super::OpStats;

    #[test]
    fn untimed_calls_are_calls_of_no_time() {
        for (calls, errors) in [(1, 0), (2, 1), (72_162, 11)] {
            assert_eq!(
                OpStats::untimed(calls, errors),
                OpStats::from_latencies(vec![0.0; calls as usize], errors)
            );
        }
    }
}
