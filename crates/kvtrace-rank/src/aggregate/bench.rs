//! Bench results of ranks merged: requests, tokens, hits, bytes and tier counters add up;
//! the hit rate comes from the summed hits and misses; throughput is tokens (and requests,
//! and storage bytes) over the common window. Beside them, the figures MLPerf Storage v3.0
//! aggregates a trial's ranks into (its rules, §6.3.4): the ranks' storage read and write
//! bandwidth and storage throughput summed, their device read and write P95s reduced to the
//! largest (a worst-client bound, not a pooled percentile), and the ranks that never read
//! from storage listed apart.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value as Json;

use super::mlperf::{RankFigures, TrialFigures};
use super::{
    add, count_at, field, histograms, one_run, ops_table, per_s, rate, summary_table, tiers_table,
    OpMerge, OpSummary, RankId, Spread, TierSum,
};
use crate::error::{Error, Result};
use crate::report::{Cell, JsonStyle, Report, Table, Unit};

const WHAT: &str = "a kvtrace bench result of a rank (written in rank mode)";
const GIB: f64 = (1u64 << 30) as f64;

/// What the run keeps of one rank once its result is folded in.
struct RankInput {
    id: RankId,
    requests: u64,
    tokens: u64,
    tokens_per_s: f64,
    hits: u64,
    misses: u64,
    read_bytes: u64,
    write_bytes: u64,
    io_errors: u64,
    late: u64,
    cross_rank_hits: u64,
    mlperf: RankFigures,
}

/// One trial's ranks as MLPerf Storage v3.0 aggregates them (§6.3.4): sums across ranks,
/// and the largest per-rank device P95s. With one trial, MLPerf's mean over trials is these
/// figures; the keys are those of its `kvcache_run_summary.json` option entries.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct MlperfTrial {
    pub total_ranks: u32,
    pub aggregated_read_bandwidth_gbps: f64,
    pub aggregated_write_bandwidth_gbps: f64,
    pub aggregated_storage_throughput_tokens_per_sec: f64,
    /// The largest per-rank device read P95 (ms): a worst-client bound.
    pub aggregated_device_read_p95_ms: f64,
    pub aggregated_device_write_p95_ms: f64,
    /// Ranks that held nothing in the storage tier (`storage_entries` 0): they read from
    /// memory only, and their device latencies count as 0.
    pub cpu_tier_ranks: Vec<u32>,
}

/// Folds one rank's result into the merged operations and tiers; what the run keeps of it.
fn read_rank(
    (file, doc): (String, Json),
    ops: &mut OpMerge,
    tier_sum: &mut TierSum,
) -> Result<RankInput> {
    let (file, doc) = (&file, &doc);
    let k = field(doc, "kvtrace", file, WHAT)?;
    let id = RankId::read(field(k, "rank", file, WHAT)?, file, WHAT)?;
    let count = |path: &str| count_at(doc, path, file, WHAT);
    let tiers = field(k, "tiers", file, WHAT)?
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    let mut row = BTreeMap::from([(
                        "tier".to_owned(),
                        t.get("tier").cloned().unwrap_or(Json::Null),
                    )]);
                    // Counts only: seconds of different ranks overlap and do not add.
                    if let Some(c) = t.get("counters").and_then(Json::as_object) {
                        row.extend(
                            c.iter()
                                .filter(|(_, v)| v.is_u64())
                                .map(|(k, v)| (k.clone(), v.clone())),
                        );
                    }
                    row
                })
                .collect()
        })
        .unwrap_or_default();
    ops.add(
        histograms(
            k.get("latency_histograms"),
            file,
            "kvtrace.latency_histograms",
        )?,
        &BTreeMap::new(),
        file,
    )?;
    let cross_rank_hits = tier_sum.add(tiers, file)?;
    Ok(RankInput {
        requests: count("requests_completed")?,
        tokens: count("total_tokens_generated")?,
        tokens_per_s: field(doc, "summary.avg_throughput_tokens_per_sec", file, WHAT)?
            .as_f64()
            .ok_or_else(|| {
                Error::usage(format!(
                    "{file}: summary.avg_throughput_tokens_per_sec is not a number"
                ))
            })?,
        hits: count("summary.cache_stats.cache_hits")?,
        misses: count("summary.cache_stats.cache_misses")?,
        read_bytes: count("summary.cache_stats.total_read_bytes")?,
        write_bytes: count("summary.cache_stats.total_write_bytes")?,
        io_errors: count("kvtrace.io_errors")?,
        late: count("kvtrace.requests_after_deadline")?,
        mlperf: RankFigures::read(doc),
        cross_rank_hits,
        id,
    })
}

/// One rank's line in the run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BenchRankLine {
    pub rank: u32,
    pub file: String,
    pub requests: u64,
    pub tokens: u64,
    /// The rank's own tokens/s over its own run.
    pub tokens_per_s: f64,
    pub hit_rate: f64,
    pub duration_s: f64,
    pub cross_rank_hits: u64,
    pub io_errors: u64,
}

/// The run, merged.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRun {
    pub world_size: u32,
    /// The common measured window: first start to last end, seconds.
    pub window_s: f64,
    pub requests_completed: u64,
    pub total_tokens: u64,
    /// Over the window.
    pub requests_per_s: f64,
    pub tokens_per_s: f64,
    /// The trial as MLPerf Storage v3.0 aggregates it (§6.3.4).
    pub mlperf: MlperfTrial,
    /// Bytes read and written over every tier, over the window.
    pub storage_io_gib_per_s: f64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_hit_rate: f64,
    /// Reads of entries another rank wrote (a shared storage tier).
    pub cross_rank_hits: u64,
    pub io_errors: u64,
    pub requests_after_deadline: u64,
    pub tiers: Vec<BTreeMap<String, Json>>,
    pub ops: BTreeMap<String, OpSummary>,
    pub spread: BTreeMap<String, Spread>,
    pub ranks: Vec<BenchRankLine>,
}

/// MLPerf Storage v3.0's aggregate of one trial's ranks (§6.3.4), by the run summary's
/// own reduction of a trial.
fn mlperf_trial(ranks: &[RankInput], total_ranks: u32) -> MlperfTrial {
    let mut sums = TrialFigures::default();
    for r in ranks {
        sums.add(&r.mlperf);
    }
    MlperfTrial {
        total_ranks,
        aggregated_read_bandwidth_gbps: sums.read_bandwidth_gbps,
        aggregated_write_bandwidth_gbps: sums.write_bandwidth_gbps,
        aggregated_storage_throughput_tokens_per_sec: sums.storage_throughput_tokens_per_sec,
        aggregated_device_read_p95_ms: sums.device_read_p95_ms,
        aggregated_device_write_p95_ms: sums.device_write_p95_ms,
        cpu_tier_ranks: ranks
            .iter()
            .filter(|r| r.mlperf.cpu_tier_only())
            .map(|r| r.id.rank)
            .collect(),
    }
}

/// Merges the bench results of one run's ranks.
pub fn aggregate(docs: impl Iterator<Item = Result<(String, Json)>>) -> Result<BenchRun> {
    let (mut ops, mut tiers) = (OpMerge::default(), TierSum::new("tier"));
    let mut ranks = Vec::new();
    for doc in docs {
        ranks.push(read_rank(doc?, &mut ops, &mut tiers)?);
    }
    ranks.sort_by_key(|r| r.id.rank);
    let (world_size, window_s) = one_run(&ranks.iter().map(|r| &r.id).collect::<Vec<_>>())?;
    let lines: Vec<BenchRankLine> = ranks
        .iter()
        .map(|r| BenchRankLine {
            rank: r.id.rank,
            file: r.id.file.clone(),
            requests: r.requests,
            tokens: r.tokens,
            tokens_per_s: r.tokens_per_s,
            hit_rate: rate(r.hits, r.hits.saturating_add(r.misses)),
            duration_s: r.id.duration_s(),
            cross_rank_hits: r.cross_rank_hits,
            io_errors: r.io_errors,
        })
        .collect();
    let total = |what: &str, f: &dyn Fn(&RankInput) -> u64| {
        ranks
            .iter()
            .try_fold(0u64, |sum, r| add(sum, f(r), &r.id.file, what))
    };
    let requests = total("requests_completed", &|r| r.requests)?;
    let tokens = total("total_tokens_generated", &|r| r.tokens)?;
    let hits = total("cache_hits", &|r| r.hits)?;
    let misses = total("cache_misses", &|r| r.misses)?;
    let read = total("total_read_bytes", &|r| r.read_bytes)?;
    let bytes = add(
        read,
        total("total_write_bytes", &|r| r.write_bytes)?,
        "",
        "bytes",
    )?;
    let spread_of = |f: &dyn Fn(&BenchRankLine) -> f64| Spread::of(lines.iter().map(f).collect());
    Ok(BenchRun {
        world_size,
        window_s,
        requests_completed: requests,
        total_tokens: tokens,
        requests_per_s: per_s(requests as f64, window_s),
        tokens_per_s: per_s(tokens as f64, window_s),
        mlperf: mlperf_trial(&ranks, world_size),
        storage_io_gib_per_s: per_s(bytes as f64 / GIB, window_s),
        cache_hits: hits,
        cache_misses: misses,
        cache_hit_rate: rate(hits, hits.saturating_add(misses)),
        cross_rank_hits: total("cross_rank_hits", &|r| r.cross_rank_hits)?,
        io_errors: total("kvtrace.io_errors", &|r| r.io_errors)?,
        requests_after_deadline: total("kvtrace.requests_after_deadline", &|r| r.late)?,
        tiers: tiers.tiers,
        ops: ops.finish(),
        spread: BTreeMap::from([
            ("tokens_per_s".to_owned(), spread_of(&|l| l.tokens_per_s)),
            ("duration_s".to_owned(), spread_of(&|l| l.duration_s)),
            ("hit_rate".to_owned(), spread_of(&|l| l.hit_rate)),
            ("requests".to_owned(), spread_of(&|l| l.requests as f64)),
        ]),
        ranks: lines,
    })
}

impl Report for BenchRun {
    fn document(&self) -> Result<Json> {
        super::document(self)
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let figures = vec![
            ("requests completed", Cell::Count(self.requests_completed)),
            ("tokens", Cell::Count(self.total_tokens)),
            (
                "requests/s over the window",
                Cell::Number(self.requests_per_s),
            ),
            ("tokens/s over the window", Cell::Number(self.tokens_per_s)),
            (
                "MLPerf storage read GB/s (sum of ranks)",
                Cell::Number(self.mlperf.aggregated_read_bandwidth_gbps),
            ),
            (
                "MLPerf storage write GB/s (sum of ranks)",
                Cell::Number(self.mlperf.aggregated_write_bandwidth_gbps),
            ),
            (
                "MLPerf storage throughput tok/s (sum of ranks)",
                Cell::Number(self.mlperf.aggregated_storage_throughput_tokens_per_sec),
            ),
            (
                "MLPerf device read P95 ms (max of ranks)",
                Cell::Number(self.mlperf.aggregated_device_read_p95_ms),
            ),
            (
                "MLPerf device write P95 ms (max of ranks)",
                Cell::Number(self.mlperf.aggregated_device_write_p95_ms),
            ),
            ("storage I/O GiB/s", Cell::Number(self.storage_io_gib_per_s)),
            ("cache hits", Cell::Count(self.cache_hits)),
            ("cache misses", Cell::Count(self.cache_misses)),
            (
                "cache hit rate",
                Cell::Measure(self.cache_hit_rate, Unit::Ratio),
            ),
            ("cross-rank hits", Cell::Count(self.cross_rank_hits)),
            ("I/O errors", Cell::Count(self.io_errors)),
            (
                "requests after the deadline",
                Cell::Count(self.requests_after_deadline),
            ),
        ];
        let summary = summary_table(self.world_size, self.window_s, figures, &self.spread);
        let mut ranks = Table::new(&[
            "rank",
            "file",
            "requests",
            "tokens",
            "tokens_per_s",
            "hit_rate",
            "duration_s",
            "cross_rank_hits",
            "io_errors",
        ])
        .sheet("Ranks")
        .csv("aggregate_ranks.csv");
        for l in &self.ranks {
            ranks.rows.push(vec![
                Cell::Count(u64::from(l.rank)),
                Cell::text(&l.file),
                Cell::Count(l.requests),
                Cell::Count(l.tokens),
                Cell::Number(l.tokens_per_s),
                Cell::Measure(l.hit_rate, Unit::Ratio),
                Cell::Measure(l.duration_s, Unit::Seconds),
                Cell::Count(l.cross_rank_hits),
                Cell::Count(l.io_errors),
            ]);
        }
        vec![
            summary,
            ops_table(&self.ops, "latency"),
            ranks,
            tiers_table(&self.tiers),
        ]
    }

    fn terminal(&self) -> String {
        let m = &self.mlperf;
        let mut s = format!(
            "{} ranks, {} requests, {} tokens in {:.3} s: {:.1} tok/s, {:.2} req/s, {:.3} GiB/s storage I/O; hit rate {}\n\
             MLPerf Storage v3.0 §6.3.4, this trial: storage read {:.3} GB/s, write {:.3} GB/s,\n  \
             {:.1} storage tok/s (sums of ranks); device P95 read {:.2} ms, write {:.2} ms (worst rank)\n",
            self.world_size,
            self.requests_completed,
            self.total_tokens,
            self.window_s,
            self.tokens_per_s,
            self.requests_per_s,
            self.storage_io_gib_per_s,
            crate::report::units::percent(self.cache_hit_rate),
            m.aggregated_read_bandwidth_gbps,
            m.aggregated_write_bandwidth_gbps,
            m.aggregated_storage_throughput_tokens_per_sec,
            m.aggregated_device_read_p95_ms,
            m.aggregated_device_write_p95_ms,
        );
        if !m.cpu_tier_ranks.is_empty() {
            s.push_str(&format!(
                "rank(s) {:?} held nothing in storage: their device latencies count as 0\n",
                m.cpu_tier_ranks
            ));
        }
        if self.io_errors > 0 {
            s.push_str(&format!("{} storage I/O error(s)\n", self.io_errors));
        }
        s.push_str(&format!(
            "{:<16} {:>9} {:>10} {:>10} {:>10} {:>14}\n",
            "latency", "count", "p50 ms", "p95 ms", "p99 ms", "max rank p95"
        ));
        for (q, o) in &self.ops {
            s.push_str(&format!(
                "{:<16} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>14.2}\n",
                q, o.count, o.p50_ms, o.p95_ms, o.p99_ms, o.max_rank_p95_ms
            ));
        }
        if self.cross_rank_hits > 0 {
            s.push_str(&format!(
                "reads of other ranks' entries: {}\n",
                self.cross_rank_hits
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::histogram::LatencyHistogram;
    use serde_json::json;

    /// A bench result of `rank` of 2 with `e2e` latencies (seconds).
    fn result(rank: u32, tokens: u64, e2e: &[f64]) -> (String, Json) {
        let mut h = LatencyHistogram::new();
        for s in e2e {
            h.record_ms(s * 1e3);
        }
        let doc = json!({
            "requests_completed": e2e.len(),
            "total_tokens_generated": tokens,
            "summary": {
                "avg_throughput_tokens_per_sec": tokens as f64 / 10.0,
                "storage_throughput_tokens_per_sec": 50.0 + f64::from(rank),
                "cache_stats": {
                    "cache_hits": 3 * u64::from(rank + 1),
                    "cache_misses": 1,
                    "total_read_bytes": 1u64 << 30,
                    "total_write_bytes": 1u64 << 30,
                    "storage_entries": 4,
                    "tier_storage_read_bandwidth_gbps": 1.25 * f64::from(rank + 1),
                    "tier_storage_write_bandwidth_gbps": 0.5,
                    "storage_read_device_p95_ms": 7.0 - f64::from(rank),
                    "storage_write_device_p95_ms": 2.0 + f64::from(rank),
                },
            },
            "kvtrace": {
                "io_errors": 0,
                "requests_after_deadline": rank,
                "rank": {
                    "rank": rank, "world_size": 2, "source": "--rank", "base_seed": 0,
                    "started_unix_s": 100.0 + f64::from(rank), "finished_unix_s": 110.0 + f64::from(rank),
                },
                "tiers": [{"tier": "storage", "counters": {"writes": 5, "cross_rank_hits": rank, "write_s": 1.5}}],
                "latency_histograms": {"end_to_end": h.encode()},
            },
        });
        (format!("rank{rank}.json"), doc)
    }

    #[test]
    fn ranks_merge_into_sums_window_rates_and_mlperf_rules() {
        let run = aggregate(
            [
                result(1, 300, &[0.4, 0.5, 0.6]),
                result(0, 100, &[0.1, 0.2]),
            ]
            .into_iter()
            .map(Ok),
        )
        .expect("aggregate");
        assert_eq!((run.world_size, run.requests_completed), (2, 5));
        assert_eq!(run.total_tokens, 400);
        assert!((run.window_s - 11.0).abs() < 1e-9, "100 s to 111 s");
        assert!((run.tokens_per_s - 400.0 / 11.0).abs() < 1e-9);
        // MLPerf's trial: bandwidths and storage tokens/s add up over the ranks, device
        // P95s are the worse rank's.
        let m = &run.mlperf;
        assert_eq!(m.total_ranks, 2);
        assert!(
            (m.aggregated_read_bandwidth_gbps - 3.75).abs() < 1e-12,
            "1.25 + 2.5"
        );
        assert!((m.aggregated_write_bandwidth_gbps - 1.0).abs() < 1e-12);
        assert!((m.aggregated_storage_throughput_tokens_per_sec - 101.0).abs() < 1e-12);
        assert_eq!(
            (
                m.aggregated_device_read_p95_ms,
                m.aggregated_device_write_p95_ms
            ),
            (7.0, 3.0),
            "rank 0's read P95, rank 1's write P95"
        );
        assert!(m.cpu_tier_ranks.is_empty());
        assert_eq!((run.cache_hits, run.cache_misses), (9, 2));
        assert_eq!(run.cross_rank_hits, 1);
        assert_eq!(run.requests_after_deadline, 1);
        assert!((run.storage_io_gib_per_s - 4.0 / 11.0).abs() < 1e-9);
        let e2e = &run.ops["end_to_end"];
        assert_eq!(e2e.count, 5);
        assert!((e2e.max_ms - 600.0).abs() < 1.0, "{e2e:?}");
        assert!(
            (e2e.max_rank_p95_ms - 600.0).abs() < 1.0,
            "rank 1's own P95 is the largest"
        );
        assert!((e2e.p50_ms - 400.0).abs() < 1.0, "median of all five");
        assert_eq!(run.tiers[0]["writes"], json!(10));
        assert!(!run.tiers[0].contains_key("write_s"), "seconds do not add");
        assert_eq!(run.ranks.iter().map(|l| l.rank).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn a_rank_that_never_read_from_storage_is_listed_and_adds_no_device_latency() {
        let (file, mut doc) = result(1, 300, &[0.4]);
        doc["summary"]["cache_stats"]["storage_entries"] = json!(0);
        doc["summary"]["cache_stats"]["storage_read_device_p95_ms"] = json!(99.0);
        let run = aggregate([result(0, 100, &[0.1]), (file, doc)].into_iter().map(Ok))
            .expect("aggregate");
        assert_eq!(run.mlperf.cpu_tier_ranks, [1]);
        assert_eq!(
            run.mlperf.aggregated_device_read_p95_ms, 7.0,
            "rank 0's only"
        );
        assert!(run
            .terminal()
            .contains("rank(s) [1] held nothing in storage"));
    }

    #[test]
    fn a_bench_result_beside_a_replay_summary_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let bench = dir.path().join("bench.json");
        let replay = dir.path().join("replay.json");
        std::fs::write(&bench, result(0, 1, &[0.1]).1.to_string()).expect("write");
        std::fs::write(&replay, r#"{"kvtrace": {"replayed": 1}}"#).expect("write");
        let e = super::super::aggregate(&[&bench, &replay])
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("is a bench result and"), "{e}");
    }
}
