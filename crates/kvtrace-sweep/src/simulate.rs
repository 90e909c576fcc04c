//! `sweep simulate`: one request trace (or synthetic workload) served under every
//! configuration of a sweep, and which configurations meet an SLA.
//!
//! Each point is a whole [`kvtrace_simulate::plan::Plan`] built by the caller from the point's
//! flags, as `kvtrace simulate` with those flags builds it, and run offline (virtual time, so
//! deterministic) without report files. A point keeps the simulation's JSON report less the
//! figures measured live ([`LIVE_FIGURES`]).

use serde_json::{Map, Value as Json};

use super::{run_points, Point};
use crate::error::{Error, Result};
use kvtrace_report::Report;
use kvtrace_simulate::plan::Plan;
use kvtrace_simulate::summary::{OffloadSummary, Summary};

/// One SLA bound: a figure of the simulation's report and its limit.
#[derive(Clone, Debug, PartialEq)]
pub struct Bound {
    /// As the user wrote it (`ttft_p90_ms`).
    pub name: String,
    /// The report key it reads (`p90_ttft_ms`).
    pub key: String,
    pub limit: f64,
    /// Latencies (`…_ms`) must not exceed their limit; rates must reach theirs.
    pub at_most: bool,
}

impl Bound {
    pub fn met(&self, summary: &Map<String, Json>) -> bool {
        match summary.get(&self.key).and_then(Json::as_f64) {
            Some(v) if self.at_most => v <= self.limit,
            Some(v) => v >= self.limit,
            None => false,
        }
    }
}

const STATS: [&str; 9] = [
    "mean", "min", "max", "median", "p50", "p75", "p90", "p95", "p99",
];

/// The report key of a metric named either way: Dynamo's (`p90_ttft_ms`) or family first
/// (`ttft_p90_ms`, `e2e_p99_ms`, `itl_median_ms`).
fn report_key(name: &str) -> String {
    let parts: Vec<&str> = name.split('_').collect();
    let stat = |s: &str| {
        if s == "p50" {
            "median".to_owned()
        } else {
            s.to_owned()
        }
    };
    match parts.as_slice() {
        [first, rest @ ..] if STATS.contains(first) => {
            format!("{}_{}", stat(first), rest.join("_"))
        }
        [family, s, rest @ ..] if STATS.contains(s) => {
            let family = if *family == "e2e" {
                "e2e_latency"
            } else {
                family
            };
            let mut key = format!("{}_{family}", stat(s));
            for r in rest {
                key.push('_');
                key.push_str(r);
            }
            key
        }
        _ => name.to_owned(),
    }
}

/// `--sla ttft_p90_ms=500,itl_p90_ms=30`: each `metric=limit`, checked against the figures a
/// simulation reports (`known`).
pub fn parse_sla(text: &str, known: &Map<String, Json>) -> Result<Vec<Bound>> {
    let bad = |why: String| Error::usage(format!("--sla {text:?}: {why}"));
    let mut bounds = Vec::new();
    for item in text.split(',') {
        let Some((name, limit)) = item.split_once('=') else {
            return Err(bad(format!("{item:?}: expected metric=limit")));
        };
        let (name, limit) = (name.trim(), limit.trim());
        let limit: f64 = match limit.parse() {
            Ok(v) if f64::is_finite(v) && v >= 0.0 => v,
            _ => {
                return Err(bad(format!(
                    "{name}: {limit:?} is not a non-negative number"
                )))
            }
        };
        let key = report_key(name);
        if !known.get(&key).is_some_and(Json::is_number) {
            return Err(bad(format!(
                "{name}: no such figure in the report (e.g. ttft_p90_ms, itl_p99_ms, e2e_median_ms, output_throughput_tok_s)"
            )));
        }
        bounds.push(Bound {
            name: name.to_owned(),
            at_most: key.ends_with("_ms"),
            key,
            limit,
        });
    }
    Ok(bounds)
}

/// What one configuration did.
#[derive(Clone, Debug)]
pub struct SimulatePoint {
    pub point: Point,
    /// The simulation's JSON report less its [`LIVE_FIGURES`].
    pub summary: Map<String, Json>,
    /// Wall-clock milliseconds of the simulation (live).
    pub wall_time_ms: f64,
}

impl SimulatePoint {
    /// A figure of the report (0 when absent).
    pub fn figure(&self, key: &str) -> f64 {
        self.summary.get(key).and_then(Json::as_f64).unwrap_or(0.0)
    }

    pub fn meets(&self, sla: &[Bound]) -> bool {
        sla.iter().all(|b| b.met(&self.summary))
    }
}

/// A finished simulation sweep.
#[derive(Clone, Debug)]
pub struct SimulateSweep {
    pub trace: String,
    pub points: Vec<SimulatePoint>,
    pub sla: Vec<Bound>,
}

/// The report's figures measured on the wall clock of the machine running the simulation
/// (how fast kvtrace simulated), not in the simulated system.
pub const LIVE_FIGURES: [&str; 3] = [
    "wall_time_ms",
    "processed_tokens_per_s",
    "processed_output_tokens_per_s",
];

/// The report a point keeps: the JSON report less its [`LIVE_FIGURES`], and its wall time.
pub fn comparable_summary(report: &dyn Report) -> Result<(Map<String, Json>, f64)> {
    let Json::Object(mut map) = report.document()? else {
        return Ok((Map::new(), 0.0));
    };
    let wall = map
        .get("wall_time_ms")
        .and_then(Json::as_f64)
        .unwrap_or(0.0);
    for key in LIVE_FIGURES {
        map.remove(key);
    }
    Ok((map, wall))
}

/// Simulates every point, `jobs` at a time; `plan` builds point `i`'s simulation as `kvtrace
/// simulate` with its flags would, without report files; `sla` is checked before any runs.
pub fn sweep(
    trace: &str,
    points: &[Point],
    jobs: usize,
    sla: Option<&str>,
    plan: &(dyn Fn(usize) -> Result<Plan> + Sync),
    done: &(dyn Fn(usize) + Sync),
) -> Result<SimulateSweep> {
    // Checked against every figure a report can have, before any point runs.
    let every_figure = Summary {
        offload: Some(OffloadSummary::default()),
        ..Summary::default()
    }
    .to_map();
    let sla = sla
        .map(|text| parse_sla(text, &every_figure))
        .transpose()?
        .unwrap_or_default();
    let run = |i: usize| -> Result<SimulatePoint> {
        let finished = plan(i)?.run(&mut |_, _| {})?;
        let (summary, wall_time_ms) = comparable_summary(&finished.report)?;
        Ok(SimulatePoint {
            point: points[i].clone(),
            summary,
            wall_time_ms,
        })
    };
    let points = run_points(points.len(), jobs, &run, done)?;
    Ok(SimulateSweep {
        trace: trace.to_owned(),
        points,
        sla,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sla_names_map_to_report_keys() {
        assert_eq!(report_key("ttft_p90_ms"), "p90_ttft_ms");
        assert_eq!(report_key("e2e_p50_ms"), "median_e2e_latency_ms");
        assert_eq!(report_key("p99_itl_ms"), "p99_itl_ms");
        assert_eq!(
            report_key("output_throughput_tok_s"),
            "output_throughput_tok_s"
        );
    }

    #[test]
    fn bounds_are_maxima_for_latencies_and_minima_for_rates() {
        let known =
            json!({"p90_ttft_ms": 400.0, "p90_itl_ms": 40.0, "output_throughput_tok_s": 900.0});
        let known = known.as_object().unwrap();
        let sla = parse_sla("ttft_p90_ms=500, output_throughput_tok_s=800", known).unwrap();
        assert!(sla.iter().all(|b| b.met(known)));
        let sla = parse_sla("itl_p90_ms=30", known).unwrap();
        assert!(!sla[0].met(known));
        for bad in [
            "ttft_p90_ms",
            "nope_p90_ms=1",
            "ttft_p90_ms=-1",
            "ttft_p90_ms=x",
        ] {
            let e = parse_sla(bad, known).unwrap_err().to_string();
            assert!(e.starts_with("--sla"), "{e}");
        }
    }
}
