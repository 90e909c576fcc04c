//! `sweep replay`: one storage trace replayed under every configuration of a sweep.
//!
//! Each point is a whole [`kvtrace_replay::plan::Plan`] built from the point's flags by the
//! caller, exactly as `kvtrace replay` with those flags builds it, and run without report
//! files; what the point keeps of its report is the replay's JSON summary less the live
//! timings, so a point can be compared field for field with a single replay.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value as Json};

use super::stack::{lru_curve, lru_curve_of, LruCurve};
use super::{run_points, Point};
use crate::error::{Error, Result};
use crate::lmct::ReadOptions;
use crate::storage::config::StorageConfig;
use kvtrace_replay::events::fleet::{summarise, FleetStream};
use kvtrace_replay::events::{replay_events, server_config, EventsReplayReport};
use kvtrace_replay::loaded::Loaded;
use kvtrace_replay::plan::Plan;
use kvtrace_replay::report::ReplayReport;
use kvtrace_report::units::fraction;
use kvtrace_report::Report;

/// What a plan or a sweep says once where a replay ran LMCache's periodic controller at most
/// once while its L1 refused writes, as a replay says it of itself: a trace written through
/// the recorder API, its records microseconds apart, spans less than one pass, so the rates
/// there are not those of an L1 that evicts.
pub const CONTROLLER_IDLE: &str = "LMCache's eviction controller ran at most one pass while the L1 refused writes at some sizes: \
     the trace spans less than a pass interval (written through the recorder API?), so their hit rates are those of an L1 that fills \
     and refuses; replay with immediate eviction timing for one that evicts as allocations need room";

/// What a plan or a sweep says once of `report`'s replay, whatever the size: the trace's own
/// warnings, and [`CONTROLLER_IDLE`] where the replay left LMCache's controller idle.
pub fn said_once(report: &ReplayReport) -> Vec<String> {
    let mut said = report.trace_warnings.clone();
    let idle = report.eviction_phase.is_some()
        && report.calls.eviction_passes <= 1
        && report.calls.out_of_memory_calls > 0;
    if idle {
        said.push(CONTROLLER_IDLE.to_owned());
    }
    said
}

/// What one configuration did.
#[derive(Clone, Debug)]
pub struct ReplayPoint {
    pub point: Point,
    /// The single replay's JSON summary (`kvtrace` object) without `tier_io` and
    /// `latency_histograms`, the parts measured live.
    pub summary: Json,
    pub figures: Figures,
    /// Wall-clock seconds of the replay (live, unlike everything else here).
    pub replay_s: f64,
}

/// The figures a sweep compares, read from a replay report.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub l1_size_bytes: u64,
    pub eviction_policy: String,
    pub hit_rate: f64,
    pub l1_hit_rate: f64,
    pub l2_hit_rate: f64,
    /// Per-request hit rates: 10th, 50th and 90th percentile (nearest rank).
    pub request_hit_rate: [f64; 3],
    pub requests: u64,
    pub requested_chunks: u64,
    pub hit_chunks: u64,
    pub out_of_memory_calls: u64,
    pub out_of_memory_keys: u64,
    pub evictions: u64,
    /// `(tier, bytes written, bytes read, peak resident bytes)`, L1 first.
    pub tier_bytes: Vec<(String, u64, u64, u64)>,
    pub fidelity_requests: u64,
    pub fidelity_requests_matching: u64,
    pub request_match_rate: f64,
    pub stores_matching: u64,
    pub stores: u64,
    pub divergences: u64,
    pub failed: u64,
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Figures {
    pub fn of(report: &ReplayReport) -> Figures {
        let mut rates: Vec<f64> = report.requests.iter().map(|r| r.hit_rate()).collect();
        rates.sort_by(f64::total_cmp);
        let config = &report.config;
        let f = &report.fidelity;
        Figures {
            l1_size_bytes: config["l1_manager_config"]["memory_config"]["size_in_bytes"]
                .as_u64()
                .unwrap_or(0),
            eviction_policy: config["eviction_config"]["eviction_policy"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            hit_rate: report.hits.hit_rate,
            l1_hit_rate: report.hits.l1_hit_rate,
            l2_hit_rate: report.hits.l2_hit_rate,
            request_hit_rate: [10.0, 50.0, 90.0].map(|p| percentile(&rates, p)),
            requests: report.hits.requests,
            requested_chunks: report.hits.requested_chunks,
            hit_chunks: report.hits.hit_chunks,
            out_of_memory_calls: report.calls.out_of_memory_calls,
            out_of_memory_keys: report.calls.out_of_memory_keys,
            evictions: report.tiers.iter().map(|t| t.evictions).sum(),
            tier_bytes: report
                .tiers
                .iter()
                .map(|t| (t.name.clone(), t.bytes_written, t.bytes_read, t.peak_bytes))
                .collect(),
            fidelity_requests: f.requests,
            fidelity_requests_matching: f.requests_matching,
            request_match_rate: f.request_match_rate(),
            stores_matching: f.stores_matching,
            stores: f.stores,
            divergences: f.divergences,
            failed: report.failed,
        }
    }
}

impl Figures {
    /// Bytes the L2 tiers (every tier after L1) served and took: `(read, written)`.
    pub fn l2_bytes(&self) -> (u64, u64) {
        self.tier_bytes
            .iter()
            .skip(1)
            .fold((0, 0), |(r, w), (_, written, read, _)| {
                (r.saturating_add(*read), w.saturating_add(*written))
            })
    }

    /// The figures of an events replay (see [`kvtrace_replay::events`]): a lookup is a request
    /// of one chunk, the per-request percentiles are the servers' hit ratios, and the
    /// fidelity counts stay 0, since an events trace records no request outcomes to match.
    pub fn of_events(report: &EventsReplayReport) -> Figures {
        let fleet = &report.fleet;
        let mut rates: Vec<f64> = report.servers.iter().map(|s| s.hit_ratio).collect();
        rates.sort_by(f64::total_cmp);
        Figures {
            l1_size_bytes: report.config["l1_manager_config"]["memory_config"]["size_in_bytes"]
                .as_u64()
                .unwrap_or(0),
            eviction_policy: report.config["eviction_config"]["eviction_policy"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            hit_rate: fleet.hit_ratio,
            l1_hit_rate: fraction(fleet.l1_hits, fleet.lookups),
            l2_hit_rate: fraction(fleet.l2_hits, fleet.lookups),
            request_hit_rate: [10.0, 50.0, 90.0].map(|p| percentile(&rates, p)),
            requests: fleet.lookups,
            requested_chunks: fleet.lookups,
            hit_chunks: fleet.hits,
            out_of_memory_calls: fleet.reservations_refused,
            out_of_memory_keys: fleet.stores_refused,
            evictions: fleet.evictions,
            tier_bytes: vec![("l1".into(), 0, 0, fleet.peak_l1_bytes)],
            ..Figures::default()
        }
    }
}

/// Replays the events trace `trace` at every point, `jobs` at a time: `config` gives point
/// `i`'s configuration from the one the trace records, each server of the fleet a copy of it.
pub fn sweep_events(
    trace: &Path,
    points: &[Point],
    jobs: usize,
    read: ReadOptions,
    config: &(dyn Fn(usize, &str) -> Result<StorageConfig> + Sync),
    done: &(dyn Fn(usize) + Sync),
) -> Result<ReplaySweep> {
    let stream = FleetStream::load(&[trace], read)?;
    let recorded = summarise(&stream);
    let run = |i: usize| -> Result<ReplayPoint> {
        let start = Instant::now();
        let base = config(i, &stream.sm_config_json)?;
        let mut report = replay_events(&stream, &recorded, &|server| server_config(&base, server))?;
        report.duration_s = 0.0;
        Ok(ReplayPoint {
            point: points[i].clone(),
            summary: serde_json::to_value(&report)
                .map_err(|e| Error::io("cannot encode JSON", e.into()))?,
            figures: Figures::of_events(&report),
            replay_s: start.elapsed().as_secs_f64(),
        })
    };
    let results = run_points(points.len(), jobs, &run, done)?;
    Ok(ReplaySweep {
        trace: trace.display().to_string(),
        points: results,
        curve: None,
        curve_note: None,
        model_curves: Vec::new(),
        warnings: stream.warnings.clone(),
    })
}

/// A finished replay sweep.
#[derive(Clone, Debug)]
pub struct ReplaySweep {
    pub trace: String,
    pub points: Vec<ReplayPoint>,
    /// Every L1 capacity's LRU hit rate from one pass, when the sweep varies the L1 size and
    /// the trace is one the stack-distance model describes.
    pub curve: Option<LruCurve>,
    /// Why there is no curve, when the sweep varies the L1 size.
    pub curve_note: Option<String>,
    /// The hit rate at many L1 sizes by full replays — LMCache's controller and the recorded
    /// client's model, as every point — one curve per combination of the other flags.
    pub model_curves: Vec<ModelCurve>,
    /// The trace's warnings (a truncated or undecodable record, and the like) and
    /// [`CONTROLLER_IDLE`] where a point left LMCache's controller idle, each once; every
    /// point's summary holds its replay's own.
    pub warnings: Vec<String>,
}

/// The hit-rate curve of LMCache's cache model: a full replay at each size.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelCurve {
    /// The other flags the replays ran with (the first point's).
    pub line: String,
    /// (L1 size in GiB, hit rate), smallest first.
    pub points: Vec<(f64, f64)>,
}

/// How many sizes the model curve spreads over the sweep's smallest and largest L1.
pub const MODEL_CURVE_SIZES: usize = 24;

/// The sizes (GiB) the model curve replays: every size a point replayed, and those of
/// [`MODEL_CURVE_SIZES`] sizes spread evenly on a log scale over the points' L1 range that
/// lie in a gap between them — at least half a step of that scale from every point's size.
/// A sweep of a few sizes gets a curve of about [`MODEL_CURVE_SIZES`]; one of many sizes
/// already draws its own and gets the grid only where its sizes are sparse.
fn curve_sizes(points: &[ReplayPoint]) -> Vec<f64> {
    const GIB: f64 = (1u64 << 30) as f64;
    let sizes: Vec<f64> = points
        .iter()
        .map(|p| p.figures.l1_size_bytes as f64 / GIB)
        .filter(|&g| g > 0.0)
        .collect();
    curve_sizes_around(&sizes)
}

/// [`curve_sizes`] of the points' sizes (GiB, all positive).
fn curve_sizes_around(sizes: &[f64]) -> Vec<f64> {
    let (lo, hi) = sizes.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &g| {
        (lo.min(g), hi.max(g))
    });
    if sizes.is_empty() || lo >= hi {
        return Vec::new();
    }
    let steps = (MODEL_CURVE_SIZES - 1) as f64;
    let half_step = (hi / lo).powf(0.5 / steps);
    let in_gap = |g: f64| {
        sizes
            .iter()
            .all(|&s| (g / s).max(s / g) >= half_step * (1.0 - 1e-9))
    };
    let mut at: Vec<f64> = (0..MODEL_CURVE_SIZES)
        .map(|i| lo * (hi / lo).powf(i as f64 / steps))
        .filter(|&g| in_gap(g))
        .chain(sizes.iter().copied())
        .collect();
    at.sort_by(f64::total_cmp);
    at.dedup_by(|a, b| (*a - *b).abs() <= 1e-9 * b.abs());
    at
}

/// The replay summary a point keeps: the `kvtrace` object less the live `tier_io` and
/// `latency_histograms`.
pub fn comparable_summary(report: &ReplayReport) -> Result<Json> {
    let mut doc = report.document()?;
    let mut summary = doc
        .get_mut("kvtrace")
        .map(Json::take)
        .unwrap_or_else(|| json!({}));
    if let Some(map) = summary.as_object_mut() {
        map.remove("tier_io");
        map.remove("latency_histograms");
    }
    Ok(summary)
}

/// One model curve's points: a combination of the flags other than the L1 size, and the
/// sweep points that have it (the first one's flags and phase are the line's).
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub name: String,
    pub points: Vec<usize>,
}

/// A plan for point `i`'s replay, sharing the trace decoded once when there is one.
pub type PointPlan<'a> = dyn Fn(usize, Option<Arc<Loaded>>) -> Result<Plan> + Sync + 'a;

/// A plan for a line's replay at an L1 size in GiB: the line's first point, the size, the
/// eviction phase that point settled on (when given), the trace decoded once.
pub type LinePlan<'a> =
    dyn Fn(usize, f64, Option<f64>, Option<Arc<Loaded>>) -> Result<Plan> + Sync + 'a;

/// How a sweep draws its model curves: each line, and the replay of a line at an L1 size,
/// built as `kvtrace replay` with the line's flags and that size would be, with the eviction
/// phase the line's first point settled on when it is given (the phase is the recording's,
/// whatever the size: estimating it once is enough).
pub struct CurvePlan<'a> {
    pub lines: Vec<Line>,
    pub plan: &'a LinePlan<'a>,
}

/// Bytes of decoded records a sweep holds to replay every point from memory; a larger trace
/// is read again by each point.
pub const LOAD_BUDGET_BYTES: usize = 1 << 30;

/// Replays `trace` at every point, `jobs` at a time. `plan` builds point `i`'s replay as
/// `kvtrace replay` with its flags would; `done` hears each finished point. The trace is
/// decoded once (within [`LOAD_BUDGET_BYTES`]) and every replay runs from memory. With
/// `curve_wanted`, one more pass gives the idealised stack-distance curve; with `model`, full
/// replays at [`MODEL_CURVE_SIZES`] sizes give each line's model curve, taking the points'
/// own figures at the sizes they replayed.
#[allow(clippy::too_many_arguments)]
pub fn sweep(
    trace: &Path,
    points: &[Point],
    jobs: usize,
    curve_wanted: bool,
    model: Option<CurvePlan<'_>>,
    read: ReadOptions,
    plan: &PointPlan<'_>,
    done: &(dyn Fn(usize) + Sync),
) -> Result<ReplaySweep> {
    if !trace.is_file() {
        return Err(Error::usage(format!(
            "{}: a sweep replays its trace once per point; give a file, not a pipe",
            trace.display()
        )));
    }
    let loaded = Loaded::load(trace, read, LOAD_BUDGET_BYTES)?.map(Arc::new);
    let run = |i: usize| -> Result<(ReplayPoint, Vec<String>)> {
        let point = &points[i];
        let start = Instant::now();
        let finished = plan(i, loaded.clone())?.run(|_| {})?;
        let report = &finished.report;
        let replayed = ReplayPoint {
            point: point.clone(),
            summary: comparable_summary(report)?,
            figures: Figures::of(report),
            replay_s: start.elapsed().as_secs_f64(),
        };
        Ok((replayed, said_once(report)))
    };
    // The idealised curve of a loaded trace runs beside the points (it reads only the
    // records), so that it costs a share of the cores rather than a pass of its own after
    // them; `--jobs 1` keeps to one thread.
    let (results, beside) = std::thread::scope(|scope| {
        let beside = match (&loaded, curve_wanted && jobs > 1) {
            (Some(loaded), true) => Some(scope.spawn(|| lru_curve_of(loaded))),
            _ => None,
        };
        let results = run_points(points.len(), jobs, &run, done);
        (results, beside.map(|curve| curve.join()))
    });
    let mut warnings: Vec<String> = Vec::new();
    let results: Vec<ReplayPoint> = results?
        .into_iter()
        .map(|(replayed, said)| {
            crate::warn_once(&mut warnings, said);
            replayed
        })
        .collect();
    let (curve, curve_note) = if curve_wanted {
        let curve = match (beside, &loaded) {
            (Some(curve), _) => {
                curve.map_err(|_| Error::usage("the idealised curve's thread panicked"))?
            }
            (None, Some(loaded)) => lru_curve_of(loaded),
            (None, None) => lru_curve(trace, read),
        };
        match curve {
            Ok(c) => (Some(c), None),
            Err(e) if e.exit_code() == crate::error::EXIT_DATA => (None, Some(e.to_string())),
            Err(e) => return Err(e),
        }
    } else {
        (None, None)
    };
    let mut model_curves = Vec::new();
    if let Some(model) = model {
        const GIB: f64 = (1u64 << 30) as f64;
        let sizes = curve_sizes(&results);
        // A size a point of the line replayed is that point's figure: the same flags, the
        // same size, the same phase. The others are replayed.
        let mut curves: Vec<Vec<(f64, Option<f64>)>> = model
            .lines
            .iter()
            .map(|line| {
                sizes
                    .iter()
                    .map(|&gib| {
                        let point = line
                            .points
                            .iter()
                            .map(|&i| &results[i])
                            .find(|p| p.figures.l1_size_bytes as f64 / GIB == gib);
                        (gib, point.map(|p| p.figures.hit_rate))
                    })
                    .collect()
            })
            .collect();
        let runs: Vec<(usize, usize)> = curves
            .iter()
            .enumerate()
            .flat_map(|(l, curve)| {
                let open = curve
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, rate))| rate.is_none());
                open.map(move |(at, _)| (l, at))
            })
            .collect();
        let phase = |first: usize| {
            results
                .get(first)
                .and_then(|p| p.summary.get("eviction_phase"))
                .and_then(|p| p.get("phase_s"))
                .and_then(Json::as_f64)
        };
        let rates = run_points(
            runs.len(),
            jobs,
            &|i| {
                let (line, at) = runs[i];
                let first = model.lines[line].points.first().copied().unwrap_or(0);
                let gib = sizes[at];
                let finished =
                    (model.plan)(first, gib, phase(first), loaded.clone())?.run(|_| {})?;
                Ok(Figures::of(&finished.report).hit_rate)
            },
            &|_| {},
        )?;
        for (&(line, at), rate) in runs.iter().zip(rates) {
            curves[line][at].1 = Some(rate);
        }
        for (line, curve) in model.lines.iter().zip(curves) {
            model_curves.push(ModelCurve {
                line: line.name.clone(),
                points: curve
                    .into_iter()
                    .filter_map(|(gib, rate)| Some((gib, rate?)))
                    .collect(),
            });
        }
    }
    Ok(ReplaySweep {
        trace: trace.display().to_string(),
        points: results,
        curve,
        curve_note,
        model_curves,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_sizes_get_the_whole_grid_and_many_only_their_gaps() {
        // Three sizes over a 4x range: the 24-size grid, its two ends being the points,
        // and the middle point between two grid sizes.
        let few = curve_sizes_around(&[0.0125, 0.025, 0.05]);
        assert_eq!(few.len(), 25, "{few:?}");
        // 64 sizes 1/16 GiB apart from 0.25 GiB: the log grid's step (1.13x) is finer than
        // theirs only below about 0.48 GiB, and there only two grid sizes are at least half
        // a step (1.063x) from every point (worked out by hand: 0.2826 and 0.4081 GiB).
        let many: Vec<f64> = (0..64).map(|i| 0.25 + f64::from(i) * 0.0625).collect();
        let curve = curve_sizes_around(&many);
        let extra: Vec<f64> = curve
            .iter()
            .copied()
            .filter(|g| !many.contains(g))
            .collect();
        assert_eq!(extra.len(), 2, "{extra:?}");
        assert!((extra[0] - 0.2826).abs() < 1e-4 && (extra[1] - 0.4081).abs() < 1e-4);
        // No two neighbours on either curve are more than two grid steps apart: a grid size
        // left out lies within half a step of a point, so a gap holds at most two of them.
        for (sizes, curve) in [(&[0.0125, 0.025, 0.05][..], &few), (&many[..], &curve)] {
            let step = (sizes[sizes.len() - 1] / sizes[0]).powf(1.0 / 23.0);
            for pair in curve.windows(2) {
                assert!(pair[1] / pair[0] <= step.powi(2) * (1.0 + 1e-9), "{pair:?}");
            }
        }
    }
}
