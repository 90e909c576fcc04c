//! The replay report: everything LMCache's `trace replay` reports (records replayed, skipped
//! and failed; per-call-kind latency statistics; the digest check) plus what it cannot —
//! per-request hits and hit rates split by tier, OUT_OF_MEMORY reservations, evictions and
//! per-tier bytes. Exporters, one small module each behind [`Exporter`], turn it into files.

pub mod csv;
pub mod diff;
pub mod json;
pub mod table;
pub mod tables;
pub mod xlsx;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::Result;
use crate::replay::fidelity::FidelityReport;
use crate::replay::phase::PhaseReport;
use crate::replay::session::Completions;
use crate::storage::{CallStats, PrefetchOutcome, TierIo, TierStats};

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
    /// When the L1 eviction passes ran, and how that was chosen.
    pub eviction_phase: Option<PhaseReport>,
    pub warnings: Vec<String>,
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

/// Turns a report into files.
pub trait Exporter {
    /// `(file name, contents)` pairs.
    fn files(&self, report: &ReplayReport) -> Result<Vec<(String, Vec<u8>)>>;
}
