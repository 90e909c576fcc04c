//! Replay summaries of ranks merged: records, calls, hit chunks, tier bytes and cross-rank
//! hits add up; hit rates come from the summed chunks; the rate is calls over the window.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value as Json};

use super::{
    add, add_counts, count_at, counts_at, field, histograms, one_run, ops_table, per_s, rate,
    summary_table, tiers_table, OpMerge, OpSummary, RankId, Spread, TierSum,
};
use crate::error::Result;
use crate::report::{Cell, JsonStyle, Report, Table, Unit};

/// What the run keeps of one rank once its report is folded in.
#[derive(Clone, Debug)]
struct RankInput {
    id: RankId,
    replayed: u64,
    failed: u64,
    hit_chunks: u64,
    requested_chunks: u64,
    cross_rank_hits: u64,
}

/// The run's sums so far.
struct Sums {
    hits: BTreeMap<String, u64>,
    calls: BTreeMap<String, u64>,
    failure_reasons: BTreeMap<String, u64>,
    ops: OpMerge,
    tiers: TierSum,
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

/// The run, merged.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub world_size: u32,
    /// The common measured window: first start to last end, seconds.
    pub window_s: f64,
    pub replayed: u64,
    pub failed: u64,
    /// The failed calls by kind (which tier, what and why), over every rank.
    pub failure_reasons: BTreeMap<String, u64>,
    /// Calls per second over the window.
    pub calls_per_s: f64,
    /// The mean of the ranks' own calls per second: how much each rank got, where the rate
    /// over the window says how much they got together.
    pub mean_rank_calls_per_s: f64,
    pub hits: BTreeMap<String, Json>,
    pub calls: BTreeMap<String, u64>,
    pub tiers: Vec<BTreeMap<String, Json>>,
    pub ops: BTreeMap<String, OpSummary>,
    pub spread: BTreeMap<String, Spread>,
    pub ranks: Vec<RankLine>,
}

const WHAT: &str =
    "a kvtrace replay summary of a rank (trace_replay_summary.json written in rank mode)";

/// Folds one rank's report into `sums`; what the run keeps of the rank.
fn read_rank((file, doc): (String, Json), sums: &mut Sums) -> Result<RankInput> {
    let file = &file;
    let k = field(&doc, "kvtrace", file, WHAT)?;
    let id = RankId::read(field(k, "rank", file, WHAT)?, file, WHAT)?;
    let histograms = histograms(
        k.get("latency_histograms"),
        file,
        "kvtrace.latency_histograms",
    )?;
    let errors = doc
        .get("ops")
        .and_then(Json::as_object)
        .map(|o| {
            o.iter()
                .map(|(q, s)| match s.get("errors") {
                    None => Ok((q.clone(), 0)),
                    Some(e) => e
                        .as_u64()
                        .map(|e| (q.clone(), e))
                        .ok_or_else(|| super::not_a_count(file, &format!("ops.{q}.errors"), e)),
                })
                .collect::<Result<BTreeMap<String, u64>>>()
        })
        .transpose()?
        .unwrap_or_default();
    let hits = counts_at(field(k, "hits", file, WHAT)?, file, "kvtrace.hits")?;
    let calls = counts_at(field(k, "calls", file, WHAT)?, file, "kvtrace.calls")?;
    let tiers = field(k, "tiers", file, WHAT)?
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_object())
                .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .collect()
        })
        .unwrap_or_default();
    add_counts(&mut sums.hits, &hits, file, "kvtrace.hits")?;
    add_counts(&mut sums.calls, &calls, file, "kvtrace.calls")?;
    if let Some(reasons) = k.get("failure_reasons") {
        let at = "kvtrace.failure_reasons";
        for (kind, n) in counts_at(reasons, file, at)? {
            let shown = format!("{at}.{kind}");
            crate::report::reasons::add_failures(&mut sums.failure_reasons, kind, n)
                .ok_or_else(|| super::overflow(file, &shown))?;
        }
    }
    sums.ops.add(histograms, &errors, file)?;
    let cross_rank_hits = sums.tiers.add(tiers, file)?;
    Ok(RankInput {
        id,
        replayed: count_at(k, "replayed", file, WHAT)?,
        failed: count_at(k, "failed", file, WHAT)?,
        hit_chunks: hits.get("hit_chunks").copied().unwrap_or(0),
        requested_chunks: hits.get("requested_chunks").copied().unwrap_or(0),
        cross_rank_hits,
    })
}

/// Merges the replay summaries of one run's ranks, each folded in as it is read.
pub fn aggregate(docs: impl Iterator<Item = Result<(String, Json)>>) -> Result<RunReport> {
    let mut sums = Sums {
        hits: BTreeMap::new(),
        calls: BTreeMap::new(),
        failure_reasons: BTreeMap::new(),
        ops: OpMerge::default(),
        tiers: TierSum::new("name"),
    };
    let mut ranks = Vec::new();
    for doc in docs {
        ranks.push(read_rank(doc?, &mut sums)?);
    }
    ranks.sort_by_key(|r| r.id.rank);
    let (world_size, window_s) = one_run(&ranks.iter().map(|r| &r.id).collect::<Vec<_>>())?;
    let hit_counts = sums.hits;
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
    let lines: Vec<RankLine> = ranks
        .iter()
        .map(|r| {
            let duration_s = r.id.duration_s();
            RankLine {
                rank: r.id.rank,
                file: r.id.file.clone(),
                replayed: r.replayed,
                failed: r.failed,
                hit_rate: rate(r.hit_chunks, r.requested_chunks),
                duration_s,
                calls_per_s: per_s(r.replayed as f64, duration_s),
                cross_rank_hits: r.cross_rank_hits,
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
    let total = |what: &str, f: &dyn Fn(&RankInput) -> u64| {
        ranks
            .iter()
            .try_fold(0u64, |sum, r| add(sum, f(r), &r.id.file, what))
    };
    let replayed = total("kvtrace.replayed", &|r| r.replayed)?;
    Ok(RunReport {
        world_size,
        window_s,
        replayed,
        failed: total("kvtrace.failed", &|r| r.failed)?,
        failure_reasons: sums.failure_reasons,
        calls_per_s: per_s(replayed as f64, window_s),
        mean_rank_calls_per_s: lines.iter().map(|l| l.calls_per_s).sum::<f64>()
            / lines.len() as f64,
        hits,
        calls: sums.calls,
        tiers: sums.tiers.tiers,
        ops: sums.ops.finish(),
        spread,
        ranks: lines,
    })
}

impl Report for RunReport {
    fn document(&self) -> Result<Json> {
        super::document(self)
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let mut figures = vec![
            ("replayed", Cell::Count(self.replayed)),
            ("failed", Cell::Count(self.failed)),
            ("calls/s over the window", Cell::Number(self.calls_per_s)),
            (
                "mean of rank calls/s",
                Cell::Number(self.mean_rank_calls_per_s),
            ),
        ];
        figures.extend(self.hits.iter().map(|(k, v)| (k.as_str(), Cell::of(v))));
        let summary = summary_table(self.world_size, self.window_s, figures, &self.spread);
        let ops = ops_table(&self.ops, "qualname");
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
        let tiers = tiers_table(&self.tiers);
        vec![summary, ops, ranks, tiers]
    }

    fn terminal(&self) -> String {
        let mut s = format!(
            "{} ranks, {} calls in {:.3} s: {:.0} calls/s (mean of ranks {:.0}); hit rate {}\n",
            self.world_size,
            self.replayed,
            self.window_s,
            self.calls_per_s,
            self.mean_rank_calls_per_s,
            self.hits
                .get("hit_rate")
                .and_then(Json::as_f64)
                .map_or("-".into(), crate::report::units::percent)
        );
        if self.failed > 0 {
            s.push_str(&format!(
                "{} call(s) failed: {}\n",
                self.failed,
                crate::report::reasons::failure_summary(&self.failure_reasons)
            ));
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
