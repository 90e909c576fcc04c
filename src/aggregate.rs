//! `kvtrace aggregate`: the per-rank replay reports of one run merged into one.
//!
//! Counts add up (records, calls, hit chunks, tier bytes and cross-rank hits); hit rates
//! are recomputed from the summed chunks; the run's rate is its calls over the common
//! measured window — from the first rank's start (they start together, at the barrier) to
//! the last rank's end; latency percentiles come from the ranks' merged HdrHistograms, so
//! they are the percentiles of every call of the run, within HdrHistogram's 0.1 %. Beside
//! them: the spread over ranks (min / median / max) and MLPerf Storage's own cross-rank
//! rules, the mean of the ranks' throughputs and the largest of the ranks' P95 latencies.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::error::{Error, Result};
use crate::report::histogram::LatencyHistogram;
use crate::report::{Cell, JsonStyle, Report, Table, Unit};

/// One rank's report, as much as the run's needs.
#[derive(Clone, Debug)]
struct RankInput {
    file: String,
    rank: u32,
    world_size: u32,
    started: f64,
    finished: f64,
    replayed: u64,
    failed: u64,
    hits: BTreeMap<String, u64>,
    calls: BTreeMap<String, u64>,
    tiers: Vec<BTreeMap<String, Json>>,
    histograms: BTreeMap<String, LatencyHistogram>,
    errors: BTreeMap<String, u64>,
}

/// Percentiles of one call kind over the run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OpSummary {
    pub count: u64,
    pub errors: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// MLPerf's rule: the largest of the ranks' own P95.
    pub max_rank_p95_ms: f64,
}

/// One rank's line in the run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RankLine {
    pub rank: u32,
    pub file: String,
    pub replayed: u64,
    pub failed: u64,
    pub hit_rate: f64,
    pub duration_s: f64,
    pub calls_per_s: f64,
    pub cross_rank_hits: u64,
}

/// Min, median and max of a figure over the ranks.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Spread {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        if n == 0 {
            return Spread::default();
        }
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Spread {
            min: values[0],
            median,
            max: values[n - 1],
        }
    }
}

/// The run, merged.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub world_size: u32,
    /// The common measured window: first start to last end, seconds.
    pub window_s: f64,
    pub replayed: u64,
    pub failed: u64,
    /// Calls per second over the window.
    pub calls_per_s: f64,
    /// MLPerf's rule: the mean of the ranks' own calls per second.
    pub mean_rank_calls_per_s: f64,
    pub hits: BTreeMap<String, Json>,
    pub calls: BTreeMap<String, u64>,
    pub tiers: Vec<BTreeMap<String, Json>>,
    pub ops: BTreeMap<String, OpSummary>,
    pub spread: BTreeMap<String, Spread>,
    pub ranks: Vec<RankLine>,
}

fn field<'a>(v: &'a Json, path: &str, file: &str) -> Result<&'a Json> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .ok_or_else(|| Error::usage(format!("{file}: no {path}: not a kvtrace replay summary of a rank (trace_replay_summary.json written in rank mode)")))
}

fn counts(v: &Json) -> BTreeMap<String, u64> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
                .collect()
        })
        .unwrap_or_default()
}

fn read_rank(path: &Path) -> Result<RankInput> {
    let file = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io("cannot read", e).in_file(&file))?;
    let doc: Json = serde_json::from_str(&text)
        .map_err(|e| Error::line(e.line() as u64, "json", e.to_string()).in_file(&file))?;
    let k = field(&doc, "kvtrace", &file)?;
    let rank = field(k, "rank", &file)?;
    let number = |path: &str| -> Result<f64> {
        field(rank, path, &file)?
            .as_f64()
            .ok_or_else(|| Error::usage(format!("{file}: kvtrace.rank.{path} is not a number")))
    };
    let whole = |v: &Json, path: &str| -> Result<u64> {
        field(v, path, &file)?
            .as_u64()
            .ok_or_else(|| Error::usage(format!("{file}: {path} is not a count")))
    };
    let mut histograms = BTreeMap::new();
    if let Some(map) = k.get("latency_histograms").and_then(Json::as_object) {
        for (q, text) in map {
            let h = text
                .as_str()
                .ok_or_else(|| "not a string".to_owned())
                .and_then(LatencyHistogram::decode)
                .map_err(|e| {
                    Error::usage(format!("{file}: kvtrace.latency_histograms.{q}: {e}"))
                })?;
            histograms.insert(q.clone(), h);
        }
    }
    let errors = doc
        .get("ops")
        .and_then(Json::as_object)
        .map(|o| {
            o.iter()
                .map(|(q, s)| {
                    (
                        q.clone(),
                        s.get("errors").and_then(Json::as_u64).unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(RankInput {
        rank: u32::try_from(whole(rank, "rank")?)
            .map_err(|_| Error::usage(format!("{file}: rank out of range")))?,
        world_size: u32::try_from(whole(rank, "world_size")?)
            .map_err(|_| Error::usage(format!("{file}: world_size out of range")))?,
        started: number("started_unix_s")?,
        finished: number("finished_unix_s")?,
        replayed: whole(k, "replayed")?,
        failed: whole(k, "failed")?,
        hits: counts(field(k, "hits", &file)?),
        calls: counts(field(k, "calls", &file)?),
        tiers: field(k, "tiers", &file)?
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_object())
                    .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .collect()
            })
            .unwrap_or_default(),
        histograms,
        errors,
        file,
    })
}

fn rate(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

fn per_s(n: u64, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Tiers summed by name: counts add, text (name, backend) is kept, capacities are each
/// rank's own and kept as given.
fn sum_tiers(ranks: &[RankInput]) -> Vec<BTreeMap<String, Json>> {
    let mut out: Vec<BTreeMap<String, Json>> = Vec::new();
    for r in ranks {
        for t in &r.tiers {
            let name = t.get("name").cloned().unwrap_or(Json::Null);
            let at = match out.iter().position(|o| o.get("name") == Some(&name)) {
                Some(i) => i,
                None => {
                    out.push(t.clone());
                    continue;
                }
            };
            for (k, v) in t {
                let summed = match (out[at].get(k).and_then(Json::as_u64), v.as_u64()) {
                    (Some(a), Some(b)) if k != "capacity_bytes" => json!(a + b),
                    _ => continue,
                };
                out[at].insert(k.clone(), summed);
            }
        }
    }
    out
}

/// Merges the per-rank reports of one run. They must be one run's: the same world size,
/// each rank once, none missing.
pub fn aggregate(paths: &[&Path]) -> Result<RunReport> {
    let mut ranks = paths
        .iter()
        .map(|p| read_rank(p))
        .collect::<Result<Vec<_>>>()?;
    ranks.sort_by_key(|r| r.rank);
    let Some(first) = ranks.first() else {
        return Err(Error::usage("no rank reports given"));
    };
    let world_size = first.world_size;
    if let Some(r) = ranks.iter().find(|r| r.world_size != world_size) {
        return Err(Error::usage(format!(
            "{}: world size {} differs from {}'s {world_size}: not one run",
            r.file, r.world_size, first.file
        )));
    }
    if let Some(w) = ranks.windows(2).find(|w| w[0].rank == w[1].rank) {
        return Err(Error::usage(format!(
            "{} and {} are both rank {}",
            w[0].file, w[1].file, w[0].rank
        )));
    }
    let missing: Vec<String> = (0..world_size)
        .filter(|r| !ranks.iter().any(|x| x.rank == *r))
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Error::usage(format!(
            "rank(s) {} of {world_size} missing: give every rank's report",
            missing.join(", ")
        )));
    }
    let start = ranks
        .iter()
        .map(|r| r.started)
        .fold(f64::INFINITY, f64::min);
    let end = ranks
        .iter()
        .map(|r| r.finished)
        .fold(f64::NEG_INFINITY, f64::max);
    let window_s = (end - start).max(0.0);
    let sum = |maps: &mut dyn Iterator<Item = &BTreeMap<String, u64>>| {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for m in maps {
            for (k, v) in m {
                *out.entry(k.clone()).or_default() += v;
            }
        }
        out
    };
    let hit_counts = sum(&mut ranks.iter().map(|r| &r.hits));
    let mut hits: BTreeMap<String, Json> = hit_counts
        .iter()
        .filter(|(k, _)| k.as_str() != "hit_rate_histogram")
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let requested = hit_counts.get("requested_chunks").copied().unwrap_or(0);
    for (name, chunks) in [
        ("hit_rate", "hit_chunks"),
        ("l1_hit_rate", "l1_hit_chunks"),
        ("l2_hit_rate", "l2_hit_chunks"),
    ] {
        let n = hit_counts.get(chunks).copied().unwrap_or(0);
        hits.insert(name.into(), json!(rate(n, requested)));
    }
    let tiers = sum_tiers(&ranks);
    let mut ops: BTreeMap<String, OpSummary> = BTreeMap::new();
    let mut merged: BTreeMap<String, LatencyHistogram> = BTreeMap::new();
    for r in &ranks {
        for (q, h) in &r.histograms {
            merged.entry(q.clone()).or_default().merge(h);
            let op = ops.entry(q.clone()).or_default();
            op.max_rank_p95_ms = op.max_rank_p95_ms.max(h.quantile_ms(0.95));
            op.errors += r.errors.get(q).copied().unwrap_or(0);
        }
    }
    for (q, h) in &merged {
        let op = ops.entry(q.clone()).or_default();
        op.count = h.count();
        op.mean_ms = h.mean_ms();
        op.p50_ms = h.quantile_ms(0.5);
        op.p90_ms = h.quantile_ms(0.9);
        op.p95_ms = h.quantile_ms(0.95);
        op.p99_ms = h.quantile_ms(0.99);
        op.max_ms = h.max_ms();
    }
    let lines: Vec<RankLine> = ranks
        .iter()
        .map(|r| {
            let duration_s = (r.finished - r.started).max(0.0);
            RankLine {
                rank: r.rank,
                file: r.file.clone(),
                replayed: r.replayed,
                failed: r.failed,
                hit_rate: rate(
                    r.hits.get("hit_chunks").copied().unwrap_or(0),
                    r.hits.get("requested_chunks").copied().unwrap_or(0),
                ),
                duration_s,
                calls_per_s: per_s(r.replayed, duration_s),
                cross_rank_hits: r
                    .tiers
                    .iter()
                    .filter_map(|t| t.get("cross_rank_hits").and_then(Json::as_u64))
                    .sum(),
            }
        })
        .collect();
    let spread_of = |f: &dyn Fn(&RankLine) -> f64| Spread::of(lines.iter().map(f).collect());
    let spread = BTreeMap::from([
        ("calls_per_s".to_owned(), spread_of(&|l| l.calls_per_s)),
        ("duration_s".to_owned(), spread_of(&|l| l.duration_s)),
        ("hit_rate".to_owned(), spread_of(&|l| l.hit_rate)),
        ("replayed".to_owned(), spread_of(&|l| l.replayed as f64)),
    ]);
    let replayed = ranks.iter().map(|r| r.replayed).sum();
    Ok(RunReport {
        world_size,
        window_s,
        replayed,
        failed: ranks.iter().map(|r| r.failed).sum(),
        calls_per_s: per_s(replayed, window_s),
        mean_rank_calls_per_s: lines.iter().map(|l| l.calls_per_s).sum::<f64>()
            / lines.len() as f64,
        hits,
        calls: sum(&mut ranks.iter().map(|r| &r.calls)),
        tiers,
        ops,
        spread,
        ranks: lines,
    })
}

impl Report for RunReport {
    fn document(&self) -> Result<Json> {
        serde_json::to_value(self)
            .map_err(|e| Error::usage(format!("cannot serialise the run: {e}")))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let mut summary = Table::new(&["metric", "value"])
            .sheet("Summary")
            .csv("aggregate_summary.csv");
        let mut put = |k: &str, c: Cell| summary.rows.push(vec![Cell::text(k), c]);
        put("world size", Cell::Count(u64::from(self.world_size)));
        put("window (s)", Cell::Measure(self.window_s, Unit::Seconds));
        put("replayed", Cell::Count(self.replayed));
        put("failed", Cell::Count(self.failed));
        put("calls/s over the window", Cell::Number(self.calls_per_s));
        put(
            "mean of rank calls/s (MLPerf)",
            Cell::Number(self.mean_rank_calls_per_s),
        );
        for (k, v) in &self.hits {
            put(k, Cell::of(v));
        }
        for (k, s) in &self.spread {
            for (what, v) in [("min", s.min), ("median", s.median), ("max", s.max)] {
                put(&format!("{k} ({what} over ranks)"), Cell::Number(v));
            }
        }
        let mut ops = Table::new(&[
            "qualname",
            "count",
            "errors",
            "mean_ms",
            "p50_ms",
            "p90_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "max_rank_p95_ms",
        ])
        .sheet("Ops")
        .csv("aggregate_ops.csv");
        for (q, o) in &self.ops {
            let mut row = vec![Cell::text(q), Cell::Count(o.count), Cell::Count(o.errors)];
            row.extend(
                [
                    o.mean_ms,
                    o.p50_ms,
                    o.p90_ms,
                    o.p95_ms,
                    o.p99_ms,
                    o.max_ms,
                    o.max_rank_p95_ms,
                ]
                .map(|v| Cell::Measure(v, Unit::Millis)),
            );
            ops.rows.push(row);
        }
        let mut ranks = Table::new(&[
            "rank",
            "file",
            "replayed",
            "failed",
            "hit_rate",
            "duration_s",
            "calls_per_s",
            "cross_rank_hits",
        ])
        .sheet("Ranks")
        .csv("aggregate_ranks.csv");
        for l in &self.ranks {
            ranks.rows.push(vec![
                Cell::Count(u64::from(l.rank)),
                Cell::text(&l.file),
                Cell::Count(l.replayed),
                Cell::Count(l.failed),
                Cell::Measure(l.hit_rate, Unit::Ratio),
                Cell::Measure(l.duration_s, Unit::Seconds),
                Cell::Number(l.calls_per_s),
                Cell::Count(l.cross_rank_hits),
            ]);
        }
        let columns: Vec<String> =
            self.tiers
                .iter()
                .flat_map(|t| t.keys().cloned())
                .fold(Vec::new(), |mut a, k| {
                    if !a.contains(&k) {
                        a.push(k);
                    }
                    a
                });
        let mut tiers = Table::new(&columns)
            .sheet("Tiers")
            .csv("aggregate_tiers.csv");
        for t in &self.tiers {
            tiers.rows.push(
                columns
                    .iter()
                    .map(|c| t.get(c).map_or(Cell::Empty, Cell::of))
                    .collect(),
            );
        }
        vec![summary, ops, ranks, tiers]
    }

    fn terminal(&self) -> String {
        let mut s = format!(
            "{} ranks, {} calls in {:.3} s: {:.0} calls/s (mean of ranks {:.0}, MLPerf's rule); hit rate {}\n",
            self.world_size,
            self.replayed,
            self.window_s,
            self.calls_per_s,
            self.mean_rank_calls_per_s,
            self.hits.get("hit_rate").and_then(Json::as_f64).map_or("-".into(), crate::report::units::percent)
        );
        if self.failed > 0 {
            s.push_str(&format!("{} call(s) failed\n", self.failed));
        }
        s.push_str(&format!(
            "{:<32} {:>9} {:>10} {:>10} {:>10} {:>14}\n",
            "call", "count", "p50 ms", "p95 ms", "p99 ms", "max rank p95"
        ));
        for (q, o) in &self.ops {
            s.push_str(&format!(
                "{:<32} {:>9} {:>10.4} {:>10.4} {:>10.4} {:>14.4}\n",
                crate::lmct::calls::short_name(q),
                o.count,
                o.p50_ms,
                o.p95_ms,
                o.p99_ms,
                o.max_rank_p95_ms
            ));
        }
        let cross: u64 = self.ranks.iter().map(|l| l.cross_rank_hits).sum();
        if cross > 0 {
            s.push_str(&format!("loads of other ranks' objects: {cross}\n"));
        }
        s
    }
}
