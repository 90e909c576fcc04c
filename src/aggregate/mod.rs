//! `kvtrace aggregate`: the per-rank reports of one run merged into one — replay summaries
//! ([`replay`]) or bench results ([`bench`]), told apart by their shape.
//!
//! Both follow the same rules. The reports must be one run's: the same world size, each
//! rank once, none missing. Counts add up; rates are recomputed from the sums; the run's
//! throughput is its work over the common measured window — from the first rank's start
//! (they start together, at the barrier) to the last rank's end; latency percentiles come
//! from the ranks' merged HdrHistograms, so they are the percentiles of every operation of
//! the run, within HdrHistogram's 0.1 %. Beside them: the spread over ranks (min / median /
//! max) and MLPerf Storage's own cross-rank rules, the mean of the ranks' throughputs and
//! the largest of the ranks' P95 latencies.

pub mod bench;
pub mod replay;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::error::{Error, Result};
use crate::report::histogram::LatencyHistogram;
use crate::report::{JsonStyle, Report, Table};

/// The merged run, of whichever command the ranks ran.
pub enum Aggregated {
    Replay(replay::RunReport),
    Bench(bench::BenchRun),
}

impl Aggregated {
    /// Whether any rank's operations failed (calls of a replay, storage I/O of a bench).
    pub fn failed(&self) -> bool {
        match self {
            Aggregated::Replay(r) => r.failed > 0,
            Aggregated::Bench(b) => b.io_errors > 0,
        }
    }

    fn report(&self) -> &dyn Report {
        match self {
            Aggregated::Replay(r) => r,
            Aggregated::Bench(b) => b,
        }
    }
}

impl Report for Aggregated {
    fn document(&self) -> Result<Json> {
        self.report().document()
    }

    fn json_style(&self) -> JsonStyle {
        self.report().json_style()
    }

    fn tables(&self) -> Vec<Table> {
        self.report().tables()
    }

    fn terminal(&self) -> String {
        self.report().terminal()
    }
}

/// Merges the per-rank reports of one run, all replay summaries or all bench results.
pub fn aggregate(paths: &[&Path]) -> Result<Aggregated> {
    let docs = paths
        .iter()
        .map(|p| read_json(p))
        .collect::<Result<Vec<_>>>()?;
    let is_bench = |(_, doc): &(String, Json)| doc.get("requests_completed").is_some();
    match docs.iter().position(is_bench) {
        None => replay::aggregate(&docs).map(Aggregated::Replay),
        Some(_) if docs.iter().all(is_bench) => bench::aggregate(&docs).map(Aggregated::Bench),
        Some(b) => {
            let r = docs.iter().find(|d| !is_bench(d)).map_or("", |d| &d.0);
            Err(Error::usage(format!(
                "{} is a bench result and {r} is not: aggregate merges ranks of one run",
                docs[b].0
            )))
        }
    }
}

/// A merged run as its JSON document.
fn document(run: &impl Serialize) -> Result<Json> {
    serde_json::to_value(run).map_err(|e| Error::usage(format!("cannot serialise the run: {e}")))
}

fn read_json(path: &Path) -> Result<(String, Json)> {
    let file = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io("cannot read", e).in_file(&file))?;
    let doc: Json = serde_json::from_str(&text)
        .map_err(|e| Error::line(e.line() as u64, "json", e.to_string()).in_file(&file))?;
    Ok((file, doc))
}

/// `path` (dot-separated) in `v`; `what` says which report was expected.
fn field<'a>(v: &'a Json, path: &str, file: &str, what: &str) -> Result<&'a Json> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .ok_or_else(|| Error::usage(format!("{file}: no {path}: not {what}")))
}

fn count_at(v: &Json, path: &str, file: &str, what: &str) -> Result<u64> {
    field(v, path, file, what)?
        .as_u64()
        .ok_or_else(|| Error::usage(format!("{file}: {path} is not a count")))
}

/// A rank's identity and measured window, from the `rank` section of its report.
#[derive(Clone, Debug)]
struct RankId {
    file: String,
    rank: u32,
    world_size: u32,
    started: f64,
    finished: f64,
}

impl RankId {
    fn read(rank: &Json, file: &str, what: &str) -> Result<RankId> {
        let number = |path: &str| -> Result<f64> {
            field(rank, path, file, what)?
                .as_f64()
                .ok_or_else(|| Error::usage(format!("{file}: rank.{path} is not a number")))
        };
        let small = |path: &str| -> Result<u32> {
            u32::try_from(count_at(rank, path, file, what)?)
                .map_err(|_| Error::usage(format!("{file}: {path} out of range")))
        };
        Ok(RankId {
            file: file.to_owned(),
            rank: small("rank")?,
            world_size: small("world_size")?,
            started: number("started_unix_s")?,
            finished: number("finished_unix_s")?,
        })
    }

    fn duration_s(&self) -> f64 {
        (self.finished - self.started).max(0.0)
    }
}

/// Checks `ranks` (sorted by rank) are one run's; its world size and common window.
fn one_run(ranks: &[&RankId]) -> Result<(u32, f64)> {
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
    Ok((world_size, (end - start).max(0.0)))
}

/// The encoded histograms under `v` (a map of name → text), decoded.
fn histograms(
    v: Option<&Json>,
    file: &str,
    at: &str,
) -> Result<BTreeMap<String, LatencyHistogram>> {
    let mut out = BTreeMap::new();
    if let Some(map) = v.and_then(Json::as_object) {
        for (name, text) in map {
            let h = text
                .as_str()
                .ok_or_else(|| "not a string".to_owned())
                .and_then(LatencyHistogram::decode)
                .map_err(|e| Error::usage(format!("{file}: {at}.{name}: {e}")))?;
            out.insert(name.clone(), h);
        }
    }
    Ok(out)
}

/// Percentiles of one kind of operation over the run.
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

/// Per operation, the percentiles of the ranks' merged histograms, the largest rank P95
/// and the summed errors.
fn merge_ops<'a>(
    ranks: impl Iterator<
        Item = (
            &'a BTreeMap<String, LatencyHistogram>,
            &'a BTreeMap<String, u64>,
        ),
    >,
) -> BTreeMap<String, OpSummary> {
    let mut ops: BTreeMap<String, OpSummary> = BTreeMap::new();
    let mut merged: BTreeMap<String, LatencyHistogram> = BTreeMap::new();
    for (histograms, errors) in ranks {
        for (q, h) in histograms {
            merged.entry(q.clone()).or_default().merge(h);
            let op = ops.entry(q.clone()).or_default();
            op.max_rank_p95_ms = op.max_rank_p95_ms.max(h.quantile_ms(0.95));
            op.errors += errors.get(q).copied().unwrap_or(0);
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
    ops
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

fn rate(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

fn per_s(n: f64, s: f64) -> f64 {
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

/// Tiers summed by their `name_key` (a tier's name): counts add; text, capacities (each
/// rank's own) and other numbers are the first rank's.
fn sum_tiers(ranks: &[&[BTreeMap<String, Json>]], name_key: &str) -> Vec<BTreeMap<String, Json>> {
    let mut out: Vec<BTreeMap<String, Json>> = Vec::new();
    for tiers in ranks {
        for t in *tiers {
            let name = t.get(name_key).cloned().unwrap_or(Json::Null);
            let at = match out.iter().position(|o| o.get(name_key) == Some(&name)) {
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

/// The union of the tiers' keys, in first-seen order: the tiers table's columns.
fn tier_columns(tiers: &[BTreeMap<String, Json>]) -> Vec<String> {
    tiers
        .iter()
        .flat_map(|t| t.keys().cloned())
        .fold(Vec::new(), |mut a, k| {
            if !a.contains(&k) {
                a.push(k);
            }
            a
        })
}

/// The tiers as a table.
fn tiers_table(tiers: &[BTreeMap<String, Json>]) -> Table {
    use crate::report::Cell;
    let columns = tier_columns(tiers);
    let mut table = Table::new(&columns)
        .sheet("Tiers")
        .csv("aggregate_tiers.csv");
    for t in tiers {
        table.rows.push(
            columns
                .iter()
                .map(|c| t.get(c).map_or(Cell::Empty, Cell::of))
                .collect(),
        );
    }
    table
}

/// The Summary sheet: world size and window, the run's own `figures`, then each figure's
/// spread over the ranks as min / median / max rows.
fn summary_table(
    world_size: u32,
    window_s: f64,
    figures: Vec<(&str, crate::report::Cell)>,
    spread: &BTreeMap<String, Spread>,
) -> Table {
    use crate::report::{Cell, Unit};
    let mut table = Table::new(&["metric", "value"])
        .sheet("Summary")
        .csv("aggregate_summary.csv");
    let mut put = |k: &str, c: Cell| table.rows.push(vec![Cell::text(k), c]);
    put("world size", Cell::Count(u64::from(world_size)));
    put("window (s)", Cell::Measure(window_s, Unit::Seconds));
    for (k, c) in figures {
        put(k, c);
    }
    for (k, s) in spread {
        for (what, v) in [("min", s.min), ("median", s.median), ("max", s.max)] {
            put(&format!("{k} ({what} over ranks)"), Cell::Number(v));
        }
    }
    table
}

/// The per-operation table.
fn ops_table(ops: &BTreeMap<String, OpSummary>, name: &str) -> Table {
    use crate::report::{Cell, Unit};
    let mut table = Table::new(&[
        name,
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
    for (q, o) in ops {
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
        table.rows.push(row);
    }
    table
}
