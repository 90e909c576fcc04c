//! `kvtrace aggregate`: the per-rank reports of one run merged into one — replay summaries
//! ([`replay`]) or bench results ([`bench`](mod@bench)), told apart by their shape.
//!
//! Both follow the same rules. The reports must be one run's: the same world size, each
//! rank once, none missing. Counts add up; rates are recomputed from the sums; the run's
//! throughput is its work over the common measured window — from the first rank's start
//! (they start together, at the barrier) to the last rank's end; latency percentiles come
//! from the ranks' merged HdrHistograms, so they are the percentiles of every operation of
//! the run, within HdrHistogram's 0.1 %. Beside them: the spread over ranks (min / median /
//! max) and, for bench results, MLPerf Storage's own cross-rank rules: storage bandwidths
//! and throughput summed over ranks, the largest of the ranks' device P95s. [`mlperf`]
//! reduces a whole MLPerf run (Options × trials × ranks) to its run summary.

pub mod bench;
pub mod mlperf;
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

/// Merges the per-rank reports of one run, all replay summaries or all bench results. The
/// reports are read one at a time and folded into the merged state as they come, so memory
/// is one report plus what the run keeps of each rank (its line in the Ranks table).
pub fn aggregate(paths: &[&Path]) -> Result<Aggregated> {
    let Some(first) = paths.first() else {
        return Err(Error::usage("no rank reports given"));
    };
    let (first_file, first_doc) = read_report(first)?;
    let bench = is_bench(&first_doc);
    let mut first = Some((first_file.clone(), first_doc));
    let docs = paths.iter().map(move |p| {
        if crate::interrupt::requested().is_some() {
            return Err(Error::usage(format!(
                "interrupted before {} was read; nothing merged or written",
                p.display()
            )));
        }
        let (file, doc) = match first.take() {
            Some(read) => read,
            None => read_report(p)?,
        };
        if is_bench(&doc) != bench {
            let (b, r) = if bench {
                (&first_file, &file)
            } else {
                (&file, &first_file)
            };
            return Err(Error::usage(format!(
                "{b} is a bench result and {r} is not: aggregate merges ranks of one run"
            )));
        }
        Ok((file, doc))
    });
    if bench {
        bench::aggregate(docs).map(Aggregated::Bench)
    } else {
        replay::aggregate(docs).map(Aggregated::Replay)
    }
}

fn is_bench(doc: &Json) -> bool {
    doc.get("requests_completed").is_some()
}

/// `a + b`, or a data error naming `file` and `what` when the sum passes `u64`: a forged
/// report must not wrap a count around to a small one.
fn add(a: u64, b: u64, file: &str, what: &str) -> Result<u64> {
    a.checked_add(b).ok_or_else(|| overflow(file, what))
}

/// The error of a sum over ranks that passes `u64::MAX`.
fn overflow(file: &str, what: &str) -> Error {
    Error::bad_input(format!(
        "{file}: {what}: the sum over ranks passes 2^64 - 1 (a count no run reaches)"
    ))
}

/// A merged run as its JSON document.
fn document(run: &impl Serialize) -> Result<Json> {
    serde_json::to_value(run).map_err(|e| Error::usage(format!("cannot serialise the run: {e}")))
}

/// A report read back, of up to [`kvtrace_io::limits::MAX_REPORT_BYTES`] (an error names its
/// line), with the name its errors give it.
pub fn read_report(path: &Path) -> Result<(String, Json)> {
    let doc = kvtrace_io::limits::read_json(path, kvtrace_io::limits::MAX_REPORT_BYTES)?;
    Ok((path.display().to_string(), doc))
}

/// `path` (dot-separated) in `v`; `what` says which report was expected.
fn field<'a>(v: &'a Json, path: &str, file: &str, what: &str) -> Result<&'a Json> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .ok_or_else(|| Error::usage(format!("{file}: no {path}: not {what}")))
}

fn count_at(v: &Json, path: &str, file: &str, what: &str) -> Result<u64> {
    let v = field(v, path, file, what)?;
    v.as_u64().ok_or_else(|| not_a_count(file, path, v))
}

/// A count that is negative, fractional or not a number: a data error, never dropped.
fn not_a_count(file: &str, path: &str, v: &Json) -> Error {
    Error::bad_input(format!(
        "{file}: {path} is {v}, not a count (an integer from 0)"
    ))
}

/// The counts under `v` (a map of name -> count, rates beside them): a negative integer
/// is a data error, never dropped; fractions (the rates) are left out.
fn counts_at(v: &Json, file: &str, at: &str) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for (k, n) in v.as_object().into_iter().flatten() {
        if n.is_i64() && !n.is_u64() {
            return Err(not_a_count(file, &format!("{at}.{k}"), n));
        }
        if let Some(c) = n.as_u64() {
            out.insert(k.clone(), c);
        }
    }
    Ok(out)
}

/// Adds `counts` into `into`, checked.
fn add_counts(
    into: &mut BTreeMap<String, u64>,
    counts: &BTreeMap<String, u64>,
    file: &str,
    at: &str,
) -> Result<()> {
    for (k, v) in counts {
        let sum = into.entry(k.clone()).or_default();
        *sum = add(*sum, *v, file, &format!("{at}.{k}"))?;
    }
    Ok(())
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
        let id = RankId {
            file: file.to_owned(),
            rank: small("rank")?,
            world_size: small("world_size")?,
            started: number("started_unix_s")?,
            finished: number("finished_unix_s")?,
        };
        if id.world_size == 0 {
            return Err(Error::bad_input(format!(
                "{file}: rank.world_size is 0: a run has at least one rank"
            )));
        }
        if id.rank >= id.world_size {
            return Err(Error::bad_input(format!(
                "{file}: rank.rank {} is not below rank.world_size {}",
                id.rank, id.world_size
            )));
        }
        Ok(id)
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
    let missing = u64::from(world_size) - ranks.len() as u64;
    if missing > 0 {
        return Err(Error::usage(format!(
            "rank(s) {} of {world_size} missing ({missing} in all): give every rank's report",
            missing_ranges(ranks, world_size)
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

/// The first few runs of ranks absent from `ranks` (sorted, distinct, each below
/// `world_size`), as `3, 5-9, …`: a forged world size of 10^9 costs a few lines of text, not
/// a list of every missing rank.
fn missing_ranges(ranks: &[&RankId], world_size: u32) -> String {
    const SHOWN: usize = 8;
    let mut runs = Vec::new();
    let mut next = 0u64;
    let present = ranks
        .iter()
        .map(|r| u64::from(r.rank))
        .chain([u64::from(world_size)]);
    for rank in present {
        if rank > next {
            runs.push(match rank - next {
                1 => next.to_string(),
                _ => format!("{next}-{}", rank - 1),
            });
        }
        next = rank + 1;
    }
    let more = runs.len().saturating_sub(SHOWN);
    runs.truncate(SHOWN);
    if more > 0 {
        runs.push(format!("and {more} more runs"));
    }
    runs.join(", ")
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
    /// The largest of the ranks' own P95s: a worst-client bound, as MLPerf Storage reduces
    /// device latencies (not a pooled percentile).
    pub max_rank_p95_ms: f64,
}

/// Per operation, the ranks' histograms merged as each rank is read, the largest rank P95
/// and the summed errors.
#[derive(Default)]
struct OpMerge {
    merged: BTreeMap<String, LatencyHistogram>,
    ops: BTreeMap<String, OpSummary>,
}

impl OpMerge {
    fn add(
        &mut self,
        histograms: BTreeMap<String, LatencyHistogram>,
        errors: &BTreeMap<String, u64>,
        file: &str,
    ) -> Result<()> {
        for (q, h) in histograms {
            let op = self.ops.entry(q.clone()).or_default();
            op.max_rank_p95_ms = op.max_rank_p95_ms.max(h.quantile_ms(0.95));
            let e = errors.get(&q).copied().unwrap_or(0);
            op.errors = add(op.errors, e, file, &format!("ops.{q}.errors"))?;
            self.merged.entry(q).or_default().merge(&h);
        }
        Ok(())
    }

    /// The percentiles of the merged histograms.
    fn finish(mut self) -> BTreeMap<String, OpSummary> {
        for (q, h) in &self.merged {
            let op = self.ops.entry(q.clone()).or_default();
            op.count = h.count();
            op.mean_ms = h.mean_ms();
            op.p50_ms = h.quantile_ms(0.5);
            op.p90_ms = h.quantile_ms(0.9);
            op.p95_ms = h.quantile_ms(0.95);
            op.p99_ms = h.quantile_ms(0.99);
            op.max_ms = h.max_ms();
        }
        self.ops
    }
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

/// Tiers summed by their `name_key` (a tier's name) as each rank is read: counts add;
/// text, capacities (each rank's own) and other numbers are the first rank's. A tier is
/// found by its name in a map, so many tiers cost no more per tier than a few.
struct TierSum {
    name_key: &'static str,
    tiers: Vec<BTreeMap<String, Json>>,
    at: std::collections::HashMap<String, usize>,
}

impl TierSum {
    fn new(name_key: &'static str) -> TierSum {
        TierSum {
            name_key,
            tiers: Vec::new(),
            at: std::collections::HashMap::new(),
        }
    }

    /// Adds one rank's tiers; returns the cross-rank hits they report.
    fn add(&mut self, tiers: Vec<BTreeMap<String, Json>>, file: &str) -> Result<u64> {
        let mut cross = 0u64;
        for t in tiers {
            if let Some(n) = t.get("cross_rank_hits") {
                let n = n
                    .as_u64()
                    .ok_or_else(|| not_a_count(file, "cross_rank_hits", n))?;
                cross = add(cross, n, file, "cross_rank_hits")?;
            }
            let name = t.get(self.name_key).unwrap_or(&Json::Null).to_string();
            let Some(&at) = self.at.get(&name) else {
                self.at.insert(name, self.tiers.len());
                self.tiers.push(t);
                continue;
            };
            for (k, v) in t {
                let into = &mut self.tiers[at];
                let summed = match (into.get(&k).and_then(Json::as_u64), v.as_u64()) {
                    (Some(a), Some(b)) if k != "capacity_bytes" => {
                        json!(add(a, b, file, &format!("tiers.{k}"))?)
                    }
                    _ => continue,
                };
                into.insert(k, summed);
            }
        }
        Ok(cross)
    }
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
