//! Bench results of ranks merged: requests, tokens, hits, bytes and tier counters add up;
//! the hit rate comes from the summed hits and misses; throughput is tokens (and requests,
//! and storage bytes) over the common window, beside MLPerf's mean of the ranks' own
//! tokens/s.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value as Json;

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
    /// MLPerf's rule: the mean of the ranks' own tokens per second.
    pub mean_rank_tokens_per_s: f64,
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
        mean_rank_tokens_per_s: lines.iter().map(|l| l.tokens_per_s).sum::<f64>()
            / lines.len() as f64,
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
                "mean of rank tokens/s (MLPerf)",
                Cell::Number(self.mean_rank_tokens_per_s),
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
        let mut s = format!(
            "{} ranks, {} requests, {} tokens in {:.3} s: {:.1} tok/s (mean of ranks {:.1}, MLPerf's rule), {:.2} req/s, {:.3} GiB/s storage I/O; hit rate {}\n",
            self.world_size,
            self.requests_completed,
            self.total_tokens,
            self.window_s,
            self.tokens_per_s,
            self.mean_rank_tokens_per_s,
            self.requests_per_s,
            self.storage_io_gib_per_s,
            crate::report::units::percent(self.cache_hit_rate)
        );
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
                "cache_stats": {
                    "cache_hits": 3 * u64::from(rank + 1),
                    "cache_misses": 1,
                    "total_read_bytes": 1u64 << 30,
                    "total_write_bytes": 1u64 << 30,
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
        assert!(
            (run.mean_rank_tokens_per_s - 20.0).abs() < 1e-9,
            "(10 + 30) / 2"
        );
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
