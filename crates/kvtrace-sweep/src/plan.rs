//! The capacity planner: the L1 a storage trace needs for a hit rate, or the hit rate a size
//! gives, answered with full replays — LMCache's eviction controller and the recorded
//! client's model, as `kvtrace replay` runs them — and the curve around the answer.
//!
//! The search: the one-pass LRU curve (stack distances, [`crate::stack`]) brackets the sizes
//! that matter — from the largest request's objects (an L1 smaller holds no request) to twice
//! the size where nothing more would hit in an ideal LRU — and a log-spaced grid over that bracket is
//! replayed in parallel. For a target hit rate the first grid interval that reaches it is
//! narrowed by rounds of `jobs` replays each (geometric subdivision, each round shrinking the
//! interval `jobs + 1`-fold) until it is within the tolerance: the answer is the smallest
//! replayed size that meets the target. The hit rate of LMCache's controller is not
//! guaranteed to grow with the size (a pass may evict differently); the report counts the
//! dips it saw, and the answer never rests on a size between replays.
//!
//! Asked for a surface, it also replays a log-spaced grid of L1 sizes over the same bracket
//! against each L2 size given: the hit rate and the L2's traffic for every pair, as heat maps.
//!
//! Beside each replayed size the planner gives the optimal bound ([`crate::optimal`]): the
//! share of looked-up chunks the best possible eviction would hit there, so the curve shows
//! how far the chosen policy is from what no policy can beat.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::optimal::Uses;
use super::replay::{said_once, Figures, LOAD_BUDGET_BYTES};
use super::run_points;
use super::stack::{lru_curve, lru_curve_of, objects_in, LruCurve};
use crate::error::{Error, Result};
use crate::lmct::ReadOptions;
use kvtrace_replay::chunk_times::Times;
use kvtrace_replay::events::EventsReplayReport;
use kvtrace_replay::loaded::{Loaded, SampleCounts};
use kvtrace_replay::plan::Plan;
use kvtrace_replay::report::ReplayReport;
use kvtrace_report::{Cell, Chart, HeatMap, Report, Series, Table, Unit};

const GIB: f64 = (1u64 << 30) as f64;

/// What the user asks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Question {
    /// The smallest L1 (GiB) whose hit rate is at least this share (0–1).
    HitRate(f64),
    /// The hit rate of an L1 of this many GiB.
    Size(f64),
}

/// The L1 × L2 grid a surface replays.
#[derive(Clone, Debug, PartialEq)]
pub struct SurfaceGrid {
    /// L1 sizes, log-spaced over the plan's bracket.
    pub l1_sizes: usize,
    /// L2 capacities (GiB), each a column; 0 is L1 alone.
    pub l2_gib: Vec<f64>,
}

/// How the planner searches.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub question: Question,
    /// The sizes (GiB) to search between; `None`: from the trace's LRU curve.
    pub range: Option<(f64, f64)>,
    /// Sizes of the first, log-spaced grid.
    pub grid: usize,
    /// The answer's precision: the search stops when the interval's ends are within this
    /// share of each other.
    pub tolerance: f64,
    pub jobs: usize,
    /// Replay a sample of the trace's prefix trees instead of all of it: `(rate, seed)`.
    pub sample: Option<(f64, u64)>,
    /// Also replay an L1 × L2 surface.
    pub surface: Option<SurfaceGrid>,
}

/// What a sampled plan replayed: every size at [`SampleCounts::share`] of itself, token
/// counts the sample's divided by it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    pub seed: u64,
    pub counts: SampleCounts,
}

/// A replay of the trace at an L1 size in GiB — and, for a cell of a surface, an L2 capacity
/// in GiB — as `kvtrace replay` with the user's flags and those sizes would run it, from the
/// storage trace decoded once when it is given, its eviction passes moved by the last
/// argument's share of an interval ([`Plan::shift_phase`]; 0 but for a sample's repeats);
/// what it found.
pub type SizePlan<'a> =
    dyn Fn(f64, Option<f64>, Option<Arc<Loaded>>, f64) -> Result<SizeRun> + Sync + 'a;

/// The phases a sample replays a size at when LMCache's controller evicted from its L1, a
/// share of an interval apart. A 1 % sample writes a few requests between two passes, and
/// which of them a pass makes room for depends on where the passes fall; the whole trace's
/// thousands average that out. Over 16 seeds of the Mooncake twin at 1 % with passes every
/// 10 ms, four phases took the mean error from 0.70 to 0.64 pp (docs/commands/plan.md).
const SAMPLE_PHASES: u32 = 4;

/// What one replay found, as the planner compares replays.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeRun {
    pub figures: Figures,
    pub hit_tokens: u64,
    pub requested_tokens: u64,
    /// Seconds between the trace's first and last request.
    pub span_s: f64,
    /// The replay had an L1 and no other tier, and the L1 was an LRU that evicts as
    /// allocations need room (`immediate` timing): what a sample's hit rate is read
    /// against (`Estimate`).
    pub l1_alone: bool,
    pub lru_immediate: bool,
    /// LMCache's periodic controller ran the L1's evictions.
    pub periodic: bool,
    /// A sample's mean hit rate over `SAMPLE_PHASES` phases of the controller, where it
    /// evicted: what the sample's rate is read as (`Estimate`).
    pub hit_rate_over_phases: Option<f64>,
    /// What the plan says once, whatever the size ([`said_once`]): the trace's warnings (a
    /// truncated or undecodable record, a header the reader doubts) and LMCache's
    /// controller left idle, not the rest of the replay's at this size.
    pub warnings: Vec<String>,
}

impl SizeRun {
    /// A storage trace's replay.
    pub fn of(report: &ReplayReport) -> SizeRun {
        let config = &report.config;
        SizeRun {
            l1_alone: report.tiers.len() == 1,
            lru_immediate: config["kvtrace_eviction_timing"] == "immediate"
                && config["eviction_config"]["eviction_policy"]
                    .as_str()
                    .is_some_and(|p| p.eq_ignore_ascii_case("LRU")),
            periodic: report.eviction_phase.is_some(),
            hit_rate_over_phases: None,
            warnings: said_once(report),
            figures: Figures::of(report),
            hit_tokens: report.hits.hit_tokens,
            requested_tokens: report.hits.requested_tokens,
            span_s: match (report.requests.first(), report.requests.last()) {
                (Some(a), Some(b)) => (b.t - a.t).max(0.0),
                _ => 0.0,
            },
        }
    }

    /// An events fleet's replay over `span_s` seconds of records: lookups carry no token
    /// counts.
    pub fn of_events(report: &EventsReplayReport, span_s: f64) -> SizeRun {
        SizeRun {
            l1_alone: false,
            lru_immediate: false,
            periodic: false,
            hit_rate_over_phases: None,
            warnings: report.warnings.clone(),
            figures: Figures::of_events(report),
            hit_tokens: 0,
            requested_tokens: 0,
            span_s,
        }
    }

    /// The replay of [`Plan`] `plan`.
    pub fn run(plan: Plan) -> Result<SizeRun> {
        Ok(SizeRun::of(&plan.run(|_| {})?.report))
    }
}

/// What the planner replays.
#[derive(Clone, Copy, Debug)]
pub enum PlanInput {
    /// An LMCT storage trace, read with these options.
    Storage(ReadOptions),
    /// An events-level fleet, replayed by the caller's [`SizePlan`]: there is no LRU curve
    /// or optimal bound for it, and `bracket` (GiB) is searched when the options give no
    /// range.
    Events { bracket: (f64, f64) },
}

/// One cell of an L1 × L2 surface.
#[derive(Clone, Debug, PartialEq)]
pub struct SurfaceCell {
    pub l1_gib: f64,
    pub l2_gib: f64,
    pub hit_rate: f64,
    pub l1_hit_rate: f64,
    pub l2_hit_rate: f64,
    /// Bytes the L2 tiers served (hits promoted to L1) and took (stores, demotions).
    pub l2_bytes_read: u64,
    pub l2_bytes_written: u64,
}

impl SurfaceCell {
    /// The L2's traffic, both ways, in GiB.
    pub fn l2_traffic_gib(&self) -> f64 {
        (self.l2_bytes_read + self.l2_bytes_written) as f64 / GIB
    }
}

/// The replayed L1 × L2 grid, row by row (an L1 size each), columns the L2 sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct Surface {
    pub l1_gib: Vec<f64>,
    pub l2_gib: Vec<f64>,
    pub cells: Vec<SurfaceCell>,
}

/// One replayed size.
#[derive(Clone, Debug, PartialEq)]
pub struct SizePoint {
    pub l1_gib: f64,
    pub figures: Figures,
    pub hit_tokens: u64,
    pub requested_tokens: u64,
    /// Seconds between the trace's first and last request.
    pub span_s: f64,
    /// The share of looked-up chunks the best possible eviction hits at this size.
    pub optimal_chunk_hit_rate: Option<f64>,
    /// How a sample's hit rate became the whole trace's: `footprint`, `reuse time` or
    /// `admission time` (see `Estimate`); `None` for a replay of the whole trace.
    pub sample_mapping: Option<&'static str>,
}

impl SizePoint {
    /// The replay's share of looked-up chunks that hit (the optimal bound's measure).
    pub fn chunk_hit_rate(&self) -> f64 {
        if self.figures.requested_chunks == 0 {
            0.0
        } else {
            self.figures.hit_chunks as f64 / self.figures.requested_chunks as f64
        }
    }
}

/// The planner's answer and the curve it rests on.
#[derive(Clone, Debug)]
pub struct CapacityPlan {
    pub trace: String,
    pub question: Question,
    /// The sizes searched between (GiB), and whether the LRU curve chose them.
    pub range: (f64, f64),
    pub range_from_curve: bool,
    /// Every replayed size, smallest first.
    pub points: Vec<SizePoint>,
    /// The point that answers (for a target: the smallest replayed size meeting it; `None`
    /// when even the largest size falls short).
    pub answer: Option<usize>,
    /// The knee of the curve: past it each doubling of the L1 buys least.
    pub knee: Option<usize>,
    /// Seconds between the trace's first and last request (for the per-second figures).
    pub span_s: f64,
    /// Adjacent replayed sizes where the larger hit less (by more than 0.1 pp).
    pub dips: usize,
    pub replays: usize,
    pub interrupted: bool,
    pub sampled: Option<Sampled>,
    /// Why the optimal bound is missing, when it is (objects of several sizes, lookups it
    /// does not model).
    pub optimal_unavailable: Option<String>,
    pub surface: Option<Surface>,
    /// The trace's warnings, each once: a truncated or undecodable record, and the like,
    /// and [`CONTROLLER_IDLE`](super::replay::CONTROLLER_IDLE) where a size's replay left
    /// LMCache's controller idle.
    pub warnings: Vec<String>,
}

/// A size as an axis label: four significant digits.
fn size_label(gib: f64) -> String {
    if gib == 0.0 {
        "0".into()
    } else if gib >= 100.0 {
        format!("{gib:.0}")
    } else {
        let decimals = (3 - gib.abs().log10().floor() as i32).clamp(0, 8) as usize;
        let text = format!("{gib:.decimals$}");
        match text.contains('.') {
            true => text.trim_end_matches('0').trim_end_matches('.').to_owned(),
            false => text,
        }
    }
}

/// `n` sizes spread evenly on a log scale over `[lo, hi]`.
fn log_grid(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if n < 2 || lo >= hi {
        return vec![hi];
    }
    let steps = (n - 1) as f64;
    (0..n)
        .map(|i| lo * (hi / lo).powf(i as f64 / steps))
        .collect()
}

/// The bracket the one-pass LRU curve gives: from the largest request's objects to twice the
/// capacity beyond which nothing more hits in an ideal LRU (GiB). LMCache's controller keeps
/// its L1 below the watermark (0.8 by default) and evicts a share at a time, so it needs more
/// than the ideal capacity to hit as much; twice it reaches the plateau on the recordings.
fn bracket(curve: &LruCurve) -> Option<(f64, f64)> {
    let unit = (curve.object_bytes.max(1).div_ceil(4096) * 4096) as f64;
    let lo = (curve.largest_request.max(1) as f64 * unit) / GIB;
    let hi = (curve.saturation().max(curve.largest_request.max(1) * 2) as f64 * unit * 2.0) / GIB;
    (curve.requested_chunks > 0 && hi > lo).then_some((lo, hi))
}

/// The knee of an increasing curve on a log size axis (Kneedle): the point farthest above
/// the chord from the first to the last point, both axes scaled to 0–1.
fn knee(points: &[SizePoint]) -> Option<usize> {
    let (first, last) = (points.first()?, points.last()?);
    let (x0, x1) = (first.l1_gib.ln(), last.l1_gib.ln());
    let (y0, y1) = (first.figures.hit_rate, last.figures.hit_rate);
    if x1 <= x0 || y1 <= y0 {
        return None;
    }
    points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let x = (p.l1_gib.ln() - x0) / (x1 - x0);
            let y = (p.figures.hit_rate - y0) / (y1 - y0);
            (i, y - x)
        })
        .filter(|(_, d)| *d > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

/// Answers `options.question` for `trace`: `at` replays it at a size.
pub fn plan(
    trace: &Path,
    options: &PlanOptions,
    input: PlanInput,
    at: &SizePlan<'_>,
    done: &(dyn Fn(usize) + Sync),
) -> Result<CapacityPlan> {
    if !trace.is_file() {
        return Err(Error::usage(format!(
            "{}: the planner replays its trace many times; give a file, not a pipe",
            trace.display()
        )));
    }
    let read = match input {
        PlanInput::Storage(read) => read,
        PlanInput::Events { .. } if options.sample.is_some() => {
            return Err(Error::usage(
                "--sample samples a storage trace's prefix trees; an events trace has none",
            ))
        }
        PlanInput::Events { bracket } => return plan_events(trace, options, bracket, at, done),
    };
    let (loaded, sampled, times) = match options.sample {
        Some((rate, seed)) => {
            let sample = Loaded::load_sample(trace, read, rate, seed)?;
            if sample.counts.trees_kept == 0 {
                return Err(Error::usage(format!(
                    "{}: a sample of {} kept none of the trace's {} prefix trees: sample more",
                    trace.display(),
                    kvtrace_io::error::short(rate),
                    sample.counts.trees
                )));
            }
            let sampled = Sampled {
                seed,
                counts: sample.counts,
            };
            // A sample of every tree counts the same times: its figures stand as they are.
            let times = (sample.times != sample.times_kept).then_some(SampleTimes {
                whole: sample.times,
                kept: sample.times_kept,
            });
            (Some(Arc::new(sample.loaded)), Some(sampled), times)
        }
        None => (
            Loaded::load(trace, read, LOAD_BUDGET_BYTES)?.map(Arc::new),
            None,
            None,
        ),
    };
    // The uses the optimal bound replays (the sample's, when sampled); they also tell
    // whether the trace stores objects of one size.
    let uses = match &loaded {
        Some(l) => Uses::of(l.calls()),
        None => Uses::read(trace, read),
    };
    // Sizes are the whole trace's; a sample replays each at its share of it (the trunk,
    // which every sample holds whole, at its own size).
    let estimate = sampled.map_or(Estimate::WHOLE, |s| Estimate {
        share: s.counts.share(),
        correction: s.counts.correction(),
        times,
        object_bytes: uses.as_ref().ok().map(|u| u.object_bytes),
    });
    let to_sample = |gib: f64| match sampled {
        Some(s) => s.counts.scaled(gib * GIB) / GIB,
        None => gib,
    };
    let to_whole = |gib: f64| match sampled {
        Some(s) => s.counts.unscaled(gib * GIB) / GIB,
        None => gib,
    };
    let (range, range_from_curve) = match options.range {
        Some(range) => (range, false),
        None => {
            let curve = match &loaded {
                Some(l) => lru_curve_of(l),
                None => lru_curve(trace, read),
            };
            let (lo, hi) = curve.ok().as_ref().and_then(bracket).ok_or_else(|| {
                Error::usage(format!(
                    "{}: no size range from the trace's LRU curve (it looks nothing up, or mixes object sizes): give the range to search",
                    trace.display()
                ))
            })?;
            ((to_whole(lo), to_whole(hi)), true)
        }
    };
    // A sample of every tree is the whole trace: one phase, as the full plan.
    let partial = loaded.as_ref().is_some_and(|l| l.sample_scale().is_some());
    let at_size = |gib: f64, l2: Option<f64>| {
        let replay = |shift: f64| at(to_sample(gib), l2.map(to_sample), loaded.clone(), shift);
        let run = replay(0.0)?;
        if !partial || !run.periodic || run.figures.evictions == 0 {
            return Ok(run);
        }
        let mut sum = run.figures.hit_rate;
        for k in 1..SAMPLE_PHASES {
            sum += replay(f64::from(k) / f64::from(SAMPLE_PHASES))?
                .figures
                .hit_rate;
        }
        Ok(SizeRun {
            hit_rate_over_phases: Some(sum / f64::from(SAMPLE_PHASES)),
            ..run
        })
    };
    let mut search = search(options, range, &estimate, &at_size, done)?;
    // The bound at every replayed size, over the same calls (the sample's, when sampled) and
    // the L1 bytes the replay had.
    search.optimal_unavailable = match &uses {
        Ok(u) => {
            let points = &search.points;
            let rates = run_points(
                points.len(),
                options.jobs,
                &|i| {
                    let p = &points[i];
                    let rate = u.hit_rate(u.capacity(p.figures.l1_size_bytes));
                    Ok(estimate.bound(rate, p.figures.hit_rate))
                },
                &|_| {},
            )?;
            for (p, rate) in search.points.iter_mut().zip(rates) {
                p.optimal_chunk_hit_rate = Some(rate);
            }
            None
        }
        Err(e) => Some(e.to_string()),
    };
    Ok(CapacityPlan {
        trace: trace.display().to_string(),
        range_from_curve,
        sampled,
        ..search
    })
}

/// [`plan`] of an events fleet: the same search, over `bracket` unless the options give a
/// range, without a bound.
fn plan_events(
    trace: &Path,
    options: &PlanOptions,
    bracket: (f64, f64),
    at: &SizePlan<'_>,
    done: &(dyn Fn(usize) + Sync),
) -> Result<CapacityPlan> {
    let range = options.range.unwrap_or(bracket);
    let search = search(
        options,
        range,
        &Estimate::WHOLE,
        &|gib, l2| at(gib, l2, None, 0.0),
        done,
    )?;
    Ok(CapacityPlan {
        trace: trace.display().to_string(),
        range_from_curve: false,
        optimal_unavailable: Some(
            "an events trace's lookups are single objects of a fleet, not prefixes of requests"
                .into(),
        ),
        ..search
    })
}

/// The search itself, for any input: the grid over `range` (GiB), the rounds narrowing a
/// target's interval, and the surface, each size replayed by `at` (a sample's at its share
/// of the size), whose figures `estimate` turns back into the whole trace's.
fn search(
    options: &PlanOptions,
    range: (f64, f64),
    estimate: &Estimate,
    at: &(dyn Fn(f64, Option<f64>) -> Result<SizeRun> + Sync),
    done: &(dyn Fn(usize) + Sync),
) -> Result<CapacityPlan> {
    let mut sizes = log_grid(range.0, range.1, options.grid.max(2));
    if let Question::Size(s) = options.question {
        sizes.push(s);
        sizes.sort_by(f64::total_cmp);
    }
    let run = |gib: f64| -> Result<(SizePoint, Vec<String>)> {
        let mut run = at(gib, None)?;
        let warnings = std::mem::take(&mut run.warnings);
        Ok((estimate.point(gib, run), warnings))
    };
    // The trace's warnings (every replay gives the same) and the controller's idleness,
    // each once, in the order of the sizes.
    let mut warnings: Vec<String> = Vec::new();
    let mut note = |said: Vec<String>| crate::warn_once(&mut warnings, said);
    let mut replay_all = |sizes: &[f64]| -> Result<Vec<SizePoint>> {
        let runs = run_points(sizes.len(), options.jobs, &|i| run(sizes[i]), done)?;
        Ok(runs
            .into_iter()
            .map(|(point, said)| {
                note(said);
                point
            })
            .collect())
    };
    let mut points = replay_all(&sizes)?;
    let mut replays = points.len();
    let span_s = points.first().map_or(0.0, |p| p.span_s);
    let meets = |p: &SizePoint, target: f64| p.figures.hit_rate + 1e-12 >= target;
    if let Question::HitRate(target) = options.question {
        // Narrow the first interval whose upper end meets the target.
        loop {
            if crate::interrupt::requested().is_some() {
                break;
            }
            points.sort_by(|a, b| a.l1_gib.total_cmp(&b.l1_gib));
            let Some(upper) = points.iter().position(|p| meets(p, target)) else {
                break;
            };
            if upper == 0 {
                break;
            }
            let (a, b) = (points[upper - 1].l1_gib, points[upper].l1_gib);
            if b / a - 1.0 <= options.tolerance {
                break;
            }
            let probes = options.jobs.max(1);
            let inner: Vec<f64> = log_grid(a, b, probes + 2)[1..=probes].to_vec();
            let more = replay_all(&inner)?;
            replays += more.len();
            points.extend(more);
        }
    }
    points.sort_by(|a, b| a.l1_gib.total_cmp(&b.l1_gib));
    let answer = match options.question {
        Question::HitRate(target) => points.iter().position(|p| meets(p, target)),
        Question::Size(s) => points
            .iter()
            .position(|p| (p.l1_gib - s).abs() <= 1e-12 * s),
    };
    let dips = points
        .windows(2)
        .filter(|w| w[1].figures.hit_rate + 0.001 < w[0].figures.hit_rate)
        .count();
    let surface = match &options.surface {
        Some(grid) if crate::interrupt::requested().is_none() => {
            let l1_gib = log_grid(range.0, range.1, grid.l1_sizes.max(2));
            let pairs: Vec<(f64, f64)> = l1_gib
                .iter()
                .flat_map(|&l1| grid.l2_gib.iter().map(move |&l2| (l1, l2)))
                .collect();
            let cells = run_points(
                pairs.len(),
                options.jobs,
                &|i| {
                    let (l1, l2) = pairs[i];
                    let mut run = at(l1, Some(l2))?;
                    let said = std::mem::take(&mut run.warnings);
                    // A sample's traffic is its share of the whole trace's; what L2 serves
                    // is hits, corrected as they are.
                    let (read, written) = run.figures.l2_bytes();
                    let factor = estimate.factor(l1, &run);
                    let without_hits = estimate.without_hits(l1, &run);
                    let rate = |r: f64| without_hits.unwrap_or((r * factor).min(1.0));
                    let cell = SurfaceCell {
                        l1_gib: l1,
                        l2_gib: l2,
                        hit_rate: rate(run.figures.hit_rate),
                        l1_hit_rate: rate(run.figures.l1_hit_rate),
                        l2_hit_rate: (run.figures.l2_hit_rate * factor).min(1.0),
                        l2_bytes_read: estimate.whole(read as f64 * factor),
                        l2_bytes_written: estimate.whole(written as f64),
                    };
                    Ok((cell, said))
                },
                done,
            )?;
            let cells: Vec<SurfaceCell> = cells
                .into_iter()
                .map(|(cell, said)| {
                    note(said);
                    cell
                })
                .collect();
            replays += cells.len();
            Some(Surface {
                l1_gib,
                l2_gib: grid.l2_gib.clone(),
                cells,
            })
        }
        _ => None,
    };
    Ok(CapacityPlan {
        trace: String::new(),
        question: options.question,
        range,
        range_from_curve: false,
        knee: knee(&points),
        points,
        answer,
        span_s,
        dips,
        replays,
        interrupted: crate::interrupt::requested().is_some(),
        sampled: None,
        optimal_unavailable: None,
        surface,
        warnings,
    })
}

/// How a replay's figures stand for the whole trace's: a sample's token counts divided by
/// its share, its hit rates mapped by one of the [`Mapping`]s
/// ([`kvtrace_replay::chunk_times`]): read from the whole trace's own footprint or fill
/// point where the L1 was alone, else through the time within which the sample's own
/// chunks hit as often as its replay did, and the whole trace's chunks within that time.
#[derive(Debug)]
struct Estimate {
    share: f64,
    /// The whole trace's reuse over the sample's
    /// ([`SampleCounts::correction`](kvtrace_replay::loaded::SampleCounts::correction)):
    /// for the optimal bound, and a rate past every chunk the sample's times place.
    correction: f64,
    /// `None`: the replay held every tree.
    times: Option<SampleTimes>,
    /// The size of every object the sample stores, when it is one (what an L1's capacity
    /// in objects needs).
    object_bytes: Option<u64>,
}

/// The whole trace's chunk times and the sample's.
#[derive(Debug)]
struct SampleTimes {
    whole: Times,
    kept: Times,
}

/// How a sample's hit rate becomes the whole trace's, by how its L1 turned over.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mapping {
    /// An L1 alone, under LRU that evicts as allocations need room: it keeps what was used
    /// within its characteristic time, which the whole trace's footprint gives at the whole
    /// size. The sample's own replay cannot give it: each sampled tree's own chunks crowd
    /// the scaled L1 at full size, and a few heavy trees decide how often.
    Footprint,
    /// An L1 alone that evicted nothing: it kept the keys stored before it filled and
    /// refused the rest, so it hits the chunks whose prefix was stored by the record at
    /// which the whole trace had first stored as many keys as the L1 holds.
    FirstStores,
    /// Any other L1 that evicted, or one beside an L2: by the time within which the
    /// sample's own chunks were reused as often as its replay hit.
    Reuse,
    /// Any other L1 that evicted nothing: by the sample's own chunks' admission times.
    Admission,
}

impl Mapping {
    /// The mapping's name in the reports.
    fn name(self) -> &'static str {
        match self {
            Mapping::Footprint => "footprint",
            Mapping::FirstStores => "first stores",
            Mapping::Reuse => "reuse time",
            Mapping::Admission => "admission time",
        }
    }
}

impl Estimate {
    /// A replay of the whole trace: its figures as they are.
    const WHOLE: Estimate = Estimate {
        share: 1.0,
        correction: 1.0,
        times: None,
        object_bytes: None,
    };

    /// How `run`'s hit rate maps: through the whole trace's own model where the L1 was
    /// alone and its objects are of one size (the capacity in objects), else through the
    /// sample's times.
    fn mapping(&self, run: &SizeRun) -> Mapping {
        let alone = run.l1_alone && self.object_bytes.is_some();
        match run.figures.evictions {
            _ if alone && run.lru_immediate => Mapping::Footprint,
            0 if alone => Mapping::FirstStores,
            0 => Mapping::Admission,
            _ => Mapping::Reuse,
        }
    }

    /// A replay's hit rate `rate` at an L1 of `gib` (the whole trace's size) as the whole
    /// trace's.
    fn rate(&self, rate: f64, mapping: Mapping, gib: f64) -> f64 {
        let Some(times) = &self.times else {
            return rate;
        };
        let trace = &times.whole;
        let capacity = || objects_in((gib * GIB) as u64, self.object_bytes.unwrap_or(1)) as f64;
        let (whole, kept) = match mapping {
            Mapping::Footprint => {
                return match trace.footprint.window(capacity()) {
                    Some(window) => trace.reuse.share_within(window),
                    None => trace.reuse.share_timed(),
                }
            }
            Mapping::FirstStores => {
                return match trace.first_stores.time_of_count(capacity()) {
                    Some(full) => trace.admission.share_within(full),
                    None => trace.admission.share_timed(),
                }
            }
            Mapping::Reuse => (&trace.reuse, &times.kept.reuse),
            Mapping::Admission => (&trace.admission, &times.kept.admission),
        };
        match kept.time_of(rate) {
            None => rate * self.correction,
            // Every chunk the sample could hit hit: the whole trace's plateau. The sample
            // holds few of the trace's longest times, so the time read there falls short.
            Some(_) if rate >= kept.share_timed() * (1.0 - 1e-9) => whole.share_timed(),
            Some(time) => whole.share_within(time),
        }
        .min(1.0)
    }

    /// The optimal bound's rate `rate` over a sample as the whole trace's: by the reuse
    /// ratio, which measured closer than the times (they model a policy's turnover, not
    /// Belady's choices), and never below `policy`, the policy's own estimate at that size.
    fn bound(&self, rate: f64, policy: f64) -> f64 {
        match self.times {
            None => rate,
            Some(_) => (rate * self.correction).min(1.0).max(policy),
        }
    }

    /// What a replay's hits at an L1 of `gib` (its L1's and L2's, its hit tokens and
    /// bytes) are multiplied by: its hit rate's estimate over the rate.
    fn factor(&self, gib: f64, run: &SizeRun) -> f64 {
        match run.figures.hit_rate {
            rate if rate > 0.0 => {
                let over_phases = run.hit_rate_over_phases.unwrap_or(rate);
                self.rate(over_phases, self.mapping(run), gib) / rate
            }
            _ => 1.0,
        }
    }

    /// The whole trace's hit rate at `gib` where `run`, a sample's replay of an L1 alone,
    /// hit nothing and a whole-trace model answers anyway (a scaled L1 too small for the
    /// sample's requests): there is nothing to multiply, so the counts are that share of
    /// what was requested. `None` otherwise.
    fn without_hits(&self, gib: f64, run: &SizeRun) -> Option<f64> {
        let mapping = self.mapping(run);
        let model = matches!(mapping, Mapping::Footprint | Mapping::FirstStores);
        (model && run.figures.hit_rate <= 0.0 && self.times.is_some())
            .then(|| self.rate(0.0, mapping, gib))
            .filter(|&rate| rate > 0.0)
    }

    /// A sample's count (tokens, bytes) scaled to the whole trace.
    fn whole(&self, n: f64) -> u64 {
        (n / self.share).round() as u64
    }

    fn point(&self, gib: f64, run: SizeRun) -> SizePoint {
        let mapping = self.mapping(&run);
        let factor = self.factor(gib, &run);
        let without_hits = self.without_hits(gib, &run);
        let mut figures = run.figures;
        let hit_tokens = match without_hits {
            Some(rate) => {
                figures.hit_rate = rate;
                figures.l1_hit_rate = rate;
                figures.hit_chunks = (rate * figures.requested_chunks as f64).round() as u64;
                rate * run.requested_tokens as f64
            }
            None => {
                figures.hit_rate = (figures.hit_rate * factor).min(1.0);
                figures.l1_hit_rate = (figures.l1_hit_rate * factor).min(1.0);
                figures.l2_hit_rate = (figures.l2_hit_rate * factor).min(1.0);
                figures.hit_chunks = ((figures.hit_chunks as f64 * factor).round() as u64)
                    .min(figures.requested_chunks);
                run.hit_tokens as f64 * factor
            }
        };
        SizePoint {
            l1_gib: gib,
            hit_tokens: self.whole(hit_tokens),
            requested_tokens: self.whole(run.requested_tokens as f64),
            span_s: run.span_s,
            sample_mapping: self.times.as_ref().map(|_| mapping.name()),
            figures,
            optimal_chunk_hit_rate: None,
        }
    }
}

/// Fewer prefix trees than this in a sample read through its own times, and the plan is
/// loose: on the Mooncake twin under an evicting controller the mean error was 17 pp at 75
/// trees, 2.8 at 148, 0.9 at 369 and 0.53 at 737 (docs/commands/plan.md).
pub const FEW_TREES: u64 = 500;

/// Why a sample is too thin to stand for its trace, in words, when it is: too few trees
/// where some size's rate came from the sample's own times (`reuse time`, `admission
/// time`), or a trunk — the keys more than a tenth of the sample's lookups name, held whole
/// — that is most of the sample where its replay chose between the whole trace's models
/// (`first stores` where it evicted nothing), as a small share of a trace whose trees recur
/// gives. A plan read from the whole trace's footprint alone stands at any share, and a
/// sample of every tree is the whole trace.
fn thin_sample(points: &[SizePoint], counts: &SampleCounts) -> Option<String> {
    let mapped = |wanted: &[Mapping]| {
        let names: Vec<&str> = wanted.iter().map(|m| m.name()).collect();
        points
            .iter()
            .any(|p| p.sample_mapping.is_some_and(|m| names.contains(&m)))
    };
    let own = mapped(&[Mapping::Reuse, Mapping::Admission]);
    let chose = own || mapped(&[Mapping::FirstStores]);
    let trunk = counts.trunk_keys as f64 / counts.keys_kept.max(1) as f64;
    let partial = counts.trees_kept < counts.trees;
    let thin = (own && counts.trees_kept < FEW_TREES) || (chose && trunk > 0.5);
    (partial && thin).then(|| {
        format!(
            "{} prefix trees kept, {:.0} % of the sample's keys in the trunk every sample holds whole; \
             a sample this small misses by points where its own replay maps the rate (17 pp mean error at 75 trees, \
             2.8 at 148, 0.9 at 369 on the Mooncake twin under an evicting controller, docs/commands/plan.md)",
            counts.trees_kept,
            trunk * 100.0
        )
    })
}

impl CapacityPlan {
    /// Why the sample is too thin to stand for the trace, in words, when the plan is
    /// sampled and it is (see [`FEW_TREES`]).
    pub fn thin_sample(&self) -> Option<String> {
        thin_sample(&self.points, &self.sampled.as_ref()?.counts)
    }

    /// Hit tokens per second of the trace (0 for a trace of one instant).
    fn per_s(&self, tokens: u64) -> f64 {
        if self.span_s > 0.0 {
            tokens as f64 / self.span_s
        } else {
            0.0
        }
    }

    /// What each step up in size buys over the size before it: (hit-rate points, hit tokens)
    /// per extra GiB.
    fn marginal(&self, i: usize) -> Option<(f64, f64)> {
        let (a, b) = (self.points.get(i.checked_sub(1)?)?, self.points.get(i)?);
        let gib = b.l1_gib - a.l1_gib;
        (gib > 0.0).then(|| {
            (
                (b.figures.hit_rate - a.figures.hit_rate) / gib,
                (b.hit_tokens as f64 - a.hit_tokens as f64) / gib,
            )
        })
    }

    fn point_json(&self, i: usize) -> Json {
        let p = &self.points[i];
        let (rate_per_gib, tokens_per_gib) = self.marginal(i).unwrap_or((0.0, 0.0));
        json!({
            "l1_size_gb": p.l1_gib,
            "hit_rate": p.figures.hit_rate,
            "chunk_hit_rate": p.chunk_hit_rate(),
            "optimal_chunk_hit_rate": p.optimal_chunk_hit_rate,
            "l1_hit_rate": p.figures.l1_hit_rate,
            "l2_hit_rate": p.figures.l2_hit_rate,
            "hit_tokens": p.hit_tokens,
            "requested_tokens": p.requested_tokens,
            "hit_tokens_per_s": self.per_s(p.hit_tokens),
            "prefill_tokens_saved": p.hit_tokens,
            "out_of_memory_calls": p.figures.out_of_memory_calls,
            "evictions": p.figures.evictions,
            "request_match_rate": p.figures.request_match_rate,
            "marginal_hit_rate_per_gb": rate_per_gib,
            "marginal_hit_tokens_per_gb": tokens_per_gib,
            "sample_mapping": p.sample_mapping,
        })
    }

    /// The mappings the curve's sizes took, each with how many, for the sample's line.
    fn mappings(&self) -> String {
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for name in self.points.iter().filter_map(|p| p.sample_mapping) {
            match counts.iter_mut().find(|(n, _)| *n == name) {
                Some((_, n)) => *n += 1,
                None => counts.push((name, 1)),
            }
        }
        counts
            .iter()
            .map(|(name, n)| format!("{name} at {n} size{}", if *n == 1 { "" } else { "s" }))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn question_json(&self) -> Json {
        match self.question {
            Question::HitRate(t) => json!({ "target_hit_rate": t }),
            Question::Size(s) => json!({ "l1_size_gb": s }),
        }
    }
}

impl Report for CapacityPlan {
    fn document(&self) -> Result<Json> {
        Ok(json!({
            "trace": self.trace,
            "question": self.question_json(),
            "answer": self.answer.map(|i| self.point_json(i)),
            "unreachable": self.answer.is_none().then(|| {
                let best = self.points.last().map_or(0.0, |p| p.figures.hit_rate);
                format!("the largest size searched ({:.4} GiB) hits {:.2} %", self.range.1, best * 100.0)
            }),
            "knee": self.knee.map(|i| self.point_json(i)),
            "range_gb": [self.range.0, self.range.1],
            "range_from_lru_curve": self.range_from_curve,
            "trace_span_s": self.span_s,
            "replays": self.replays,
            "dips": self.dips,
            "interrupted": self.interrupted,
            "optimal_bound": match &self.optimal_unavailable {
                None => json!("Belady's rule, prefix-aware: the share of looked-up chunks the best possible eviction hits, with a client that stores its misses"),
                Some(why) => json!(format!("unavailable: {why}")),
            },
            "warnings": self.warnings,
            "sample": self.sampled.map(|Sampled { seed, counts: s }| json!({
                "rate": s.rate,
                "seed": seed,
                "share_of_keys": s.share(),
                "prefix_trees": s.trees,
                "prefix_trees_kept": s.trees_kept,
                "keys": s.keys,
                "keys_kept": s.keys_kept,
                "trunk_keys": s.trunk_keys,
                "trunk_bytes": s.trunk_bytes,
                "reuse_rate": s.reuse.rate(),
                "reuse_rate_kept": s.reuse_kept.rate(),
                "correction": s.correction(),
            })),
            "curve": (0..self.points.len()).map(|i| self.point_json(i)).collect::<Vec<_>>(),
            "surface": self.surface.as_ref().map(|s| json!({
                "l1_size_gb": s.l1_gib,
                "l2_size_gb": s.l2_gib,
                "cells": s.cells.iter().map(|c| json!({
                    "l1_size_gb": c.l1_gib,
                    "l2_size_gb": c.l2_gib,
                    "hit_rate": c.hit_rate,
                    "l1_hit_rate": c.l1_hit_rate,
                    "l2_hit_rate": c.l2_hit_rate,
                    "l2_bytes_read": c.l2_bytes_read,
                    "l2_bytes_written": c.l2_bytes_written,
                })).collect::<Vec<_>>(),
            })),
        }))
    }

    fn json_style(&self) -> kvtrace_report::JsonStyle {
        kvtrace_report::JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let mut t = Table::new(&[
            "l1_size_gb",
            "hit_rate",
            "chunk_hit_rate",
            "optimal_chunk_hit_rate",
            "l1_hit_rate",
            "l2_hit_rate",
            "hit_tokens",
            "hit_tokens_per_s",
            "out_of_memory_calls",
            "evictions",
            "request_match_rate",
            "marginal_hit_rate_per_gb",
            "marginal_hit_tokens_per_gb",
            "answer",
            "knee",
            "sample_mapping",
        ])
        .sheet("Curve")
        .csv("plan_curve.csv");
        for (i, p) in self.points.iter().enumerate() {
            let (rate, tokens) = self.marginal(i).unwrap_or((0.0, 0.0));
            t.rows.push(vec![
                Cell::Number(p.l1_gib),
                Cell::Measure(p.figures.hit_rate, Unit::Ratio),
                Cell::Measure(p.chunk_hit_rate(), Unit::Ratio),
                p.optimal_chunk_hit_rate
                    .map_or(Cell::Empty, |r| Cell::Measure(r, Unit::Ratio)),
                Cell::Measure(p.figures.l1_hit_rate, Unit::Ratio),
                Cell::Measure(p.figures.l2_hit_rate, Unit::Ratio),
                Cell::Count(p.hit_tokens),
                Cell::Number(self.per_s(p.hit_tokens)),
                Cell::Count(p.figures.out_of_memory_calls),
                Cell::Count(p.figures.evictions),
                Cell::Measure(p.figures.request_match_rate, Unit::Ratio),
                Cell::Number(rate),
                Cell::Number(tokens),
                Cell::Bool(self.answer == Some(i)),
                Cell::Bool(self.knee == Some(i)),
                p.sample_mapping
                    .map_or(Cell::Empty, |m| Cell::Text(m.to_owned())),
            ]);
        }
        let mut tables = vec![t];
        if let Some(surface) = &self.surface {
            let mut t = Table::new(&[
                "l1_size_gb",
                "l2_size_gb",
                "hit_rate",
                "l1_hit_rate",
                "l2_hit_rate",
                "l2_bytes_read",
                "l2_bytes_written",
            ])
            .sheet("Surface")
            .csv("plan_surface.csv");
            t.rows = surface
                .cells
                .iter()
                .map(|c| {
                    vec![
                        Cell::Number(c.l1_gib),
                        Cell::Number(c.l2_gib),
                        Cell::Measure(c.hit_rate, Unit::Ratio),
                        Cell::Measure(c.l1_hit_rate, Unit::Ratio),
                        Cell::Measure(c.l2_hit_rate, Unit::Ratio),
                        Cell::Count(c.l2_bytes_read),
                        Cell::Count(c.l2_bytes_written),
                    ]
                })
                .collect();
            tables.push(t);
        }
        tables
    }

    fn heat_maps(&self) -> Vec<HeatMap> {
        let Some(surface) = &self.surface else {
            return Vec::new();
        };
        let map =
            |title: &str, sheet: &str, ratio: bool, value: &dyn Fn(&SurfaceCell) -> f64| HeatMap {
                title: title.into(),
                sheet: sheet.into(),
                x_title: "L2 size (GiB)".into(),
                x_labels: surface.l2_gib.iter().map(|g| size_label(*g)).collect(),
                y_title: "L1 size (GiB)".into(),
                y_labels: surface.l1_gib.iter().map(|g| size_label(*g)).collect(),
                values: surface
                    .cells
                    .chunks(surface.l2_gib.len().max(1))
                    .map(|row| row.iter().map(|c| Some(value(c))).collect())
                    .collect(),
                ratio,
            };
        vec![
            map(
                "Hit rate, L1 x L2 (full replays)",
                "Surface hit rate",
                true,
                &|c| c.hit_rate,
            ),
            map(
                "L2 traffic, GiB read + written",
                "Surface L2 traffic",
                false,
                &SurfaceCell::l2_traffic_gib,
            ),
        ]
    }

    fn charts(&self) -> Vec<Chart> {
        let mut series = vec![Series {
            name: match self.sampled {
                Some(_) => "hit rate (sampled replays)".into(),
                None => "hit rate (full replays)".into(),
            },
            points: self
                .points
                .iter()
                .map(|p| (p.l1_gib, p.figures.hit_rate))
                .collect(),
        }];
        if self.optimal_unavailable.is_none() {
            series.push(Series {
                name: "optimal bound (Belady, prefix-aware; chunks)".into(),
                points: self
                    .points
                    .iter()
                    .filter_map(|p| Some((p.l1_gib, p.optimal_chunk_hit_rate?)))
                    .collect(),
            });
        }
        if let Some(i) = self.answer {
            let p = &self.points[i];
            series.push(Series {
                name: "answer".into(),
                points: vec![(p.l1_gib, p.figures.hit_rate)],
            });
        }
        if let Some(i) = self.knee {
            let p = &self.points[i];
            series.push(Series {
                name: "knee".into(),
                points: vec![(p.l1_gib, p.figures.hit_rate)],
            });
        }
        vec![Chart {
            title: "Hit rate vs L1 size".into(),
            x_title: "L1 size (GiB)".into(),
            y_title: "hit rate".into(),
            y_ratio: true,
            x_log: true,
            series,
        }]
    }

    fn terminal(&self) -> String {
        let mut out = String::new();
        let pct = |r: f64| format!("{:.2} %", r * 100.0);
        let line = |p: &SizePoint| match p.requested_tokens {
            // An events fleet's lookups carry no tokens.
            0 => format!(
                "{:.4} GiB: hit rate {}, {} of {} lookups",
                p.l1_gib,
                pct(p.figures.hit_rate),
                p.figures.hit_chunks,
                p.figures.requested_chunks
            ),
            _ => format!(
                "{:.4} GiB: hit rate {}, {} hit tokens ({:.0}/s of the trace)",
                p.l1_gib,
                pct(p.figures.hit_rate),
                p.hit_tokens,
                self.per_s(p.hit_tokens)
            ),
        };
        out.push_str(&format!(
            "Capacity plan for {}\n",
            kvtrace_report::terminal::escape_line(&self.trace)
        ));
        match (self.question, self.answer) {
            (Question::HitRate(t), Some(i)) => out.push_str(&format!(
                "  a hit rate of {} needs an L1 of {}\n",
                pct(t),
                line(&self.points[i])
            )),
            (Question::HitRate(t), None) => out.push_str(&format!(
                "  a hit rate of {} is out of reach: the largest size searched, {}\n",
                pct(t),
                self.points.last().map(line).unwrap_or_default()
            )),
            (Question::Size(_), Some(i)) => {
                out.push_str(&format!("  an L1 of {}\n", line(&self.points[i])))
            }
            (Question::Size(s), None) => out.push_str(&format!("  {s} GiB was not replayed\n")),
        }
        if let Some(i) = self.knee {
            out.push_str(&format!(
                "  the knee (past it each doubling buys least): {}\n",
                line(&self.points[i])
            ));
        }
        if let Some(i) = self.answer.or(self.knee) {
            let p = &self.points[i];
            if let Some(best) = p.optimal_chunk_hit_rate {
                out.push_str(&format!(
                    "  the best any eviction could do at {:.4} GiB: {} of chunks (this policy: {})\n",
                    p.l1_gib,
                    pct(best),
                    pct(p.chunk_hit_rate())
                ));
            }
        }
        out.push_str(&format!(
            "\n  {:>12}  {:>9}  {:>9}  {:>14}  {:>16}  {:>6}\n",
            "L1 (GiB)", "hit rate", "optimal", "hit tokens", "+hit pp per GiB", ""
        ));
        // One screen: the rows nearest the answer (or the knee), at most 15.
        let centre = self.answer.or(self.knee).unwrap_or(0);
        let from = centre
            .saturating_sub(7)
            .min(self.points.len().saturating_sub(15));
        for (i, p) in self.points.iter().enumerate().skip(from).take(15) {
            let marginal = self
                .marginal(i)
                .map_or(String::new(), |(r, _)| format!("{:.2}", r * 100.0));
            let mark = match (self.answer == Some(i), self.knee == Some(i)) {
                (true, true) => "answer, knee",
                (true, false) => "answer",
                (false, true) => "knee",
                _ => "",
            };
            out.push_str(&format!(
                "  {:>12.4}  {:>9}  {:>9}  {:>14}  {:>16}  {mark}\n",
                p.l1_gib,
                pct(p.figures.hit_rate),
                p.optimal_chunk_hit_rate.map_or("—".into(), pct),
                p.hit_tokens,
                marginal
            ));
        }
        if let Some(surface) = &self.surface {
            out.push_str(&format!(
                "\n  hit rate by L1 (rows) and L2 (columns), GiB\n  {:>12}",
                "L1 \\ L2"
            ));
            for l2 in &surface.l2_gib {
                out.push_str(&format!("  {:>9}", size_label(*l2)));
            }
            out.push('\n');
            for (l1, row) in surface
                .l1_gib
                .iter()
                .zip(surface.cells.chunks(surface.l2_gib.len().max(1)))
            {
                out.push_str(&format!("  {:>12.4}", l1));
                for c in row {
                    out.push_str(&format!("  {:>9}", pct(c.hit_rate)));
                }
                out.push('\n');
            }
        }
        out.push_str(&format!(
            "\n  {} {} between {:.4} and {:.4} GiB{}{}\n",
            self.replays,
            match self.sampled {
                Some(_) => "replays of the sample",
                None => "full replays",
            },
            self.range.0,
            self.range.1,
            if self.range_from_curve {
                " (the bracket from the one-pass LRU curve)"
            } else {
                ""
            },
            if self.dips > 0 {
                let s = if self.dips == 1 { "" } else { "s" };
                format!("; {} dip{s} where a larger L1 hit less", self.dips)
            } else {
                String::new()
            }
        ));
        if let Some(Sampled { counts: s, .. }) = self.sampled {
            out.push_str(&format!(
                "  sampled: {} of {} prefix trees ({:.2} % of {} distinct keys), each size replayed at that share; tokens are estimates\n  hit rates mapped by {}, as docs/commands/plan.md says; the trace reuses {:.2} % of its looked-up chunks, the sample {:.2} % (the bound x {:.4})\n",
                s.trees_kept,
                s.trees,
                s.share() * 100.0,
                s.keys,
                self.mappings(),
                s.reuse.rate() * 100.0,
                s.reuse_kept.rate() * 100.0,
                s.correction(),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample's hit rate is read as a time against its own chunks and mapped to the whole
    /// trace's chunks within that time: by reuse time when its replay evicted, by admission
    /// time when it did not; past every chunk the sample's times place, by the reuse ratio.
    /// An L1 alone reads the whole trace's own models instead: an immediate LRU its
    /// footprint's window at the size, one that filled the record at which it filled.
    #[test]
    fn a_sampled_rate_maps_through_the_time_its_turnover_follows() {
        // Chunks at these times, and `none` without one.
        let times = |known: &[u64], none: usize| {
            let known = known.iter().map(|&t| Some(t));
            known.chain(std::iter::repeat_n(None, none)).collect()
        };
        let sample = SampleTimes {
            whole: Times {
                reuse: times(&[5, 6, 7, 10, 30, 40], 2),
                admission: times(&[50, 200, 300, 400], 0),
                ..Times::default()
            },
            kept: Times {
                reuse: times(&[10, 20], 2),
                admission: times(&[100, 300], 2),
                ..Times::default()
            },
        };
        let mut estimate = Estimate {
            share: 0.5,
            correction: 1.5,
            times: Some(sample),
            object_bytes: None,
        };
        let evicting = SizeRun {
            figures: Figures {
                evictions: 3,
                hit_rate: 0.25,
                ..Figures::default()
            },
            hit_tokens: 0,
            requested_tokens: 0,
            span_s: 0.0,
            l1_alone: true,
            lru_immediate: false,
            periodic: true,
            hit_rate_over_phases: None,
            warnings: Vec::new(),
        };
        let mut filling = evicting.clone();
        filling.figures.evictions = 0;
        let lru = SizeRun {
            lru_immediate: true,
            ..evicting.clone()
        };
        // Objects of no one size: no capacity in objects, so the sample's times.
        assert_eq!(estimate.mapping(&evicting), Mapping::Reuse);
        assert_eq!(estimate.mapping(&filling), Mapping::Admission);
        assert_eq!(estimate.mapping(&lru), Mapping::Reuse);
        // A quarter of the sample's chunks: the one at reuse time 10, spread over [10, 11),
        // so within 11 records — where half the whole trace's chunks are (5, 6, 7, 10).
        assert_eq!(estimate.rate(0.25, Mapping::Reuse, 1.0), 0.5);
        // By admission: the sample's chunk stored at 100, within 101 records; the whole
        // trace's stored by then are the one at 50, a quarter.
        assert_eq!(estimate.rate(0.25, Mapping::Admission, 1.0), 0.25);
        // Half the sample's chunks have a reuse time: at that rate, the whole trace's share
        // with one (6 of 8), though the sample's longest time (20) is short of its (40).
        assert_eq!(estimate.rate(0.5, Mapping::Reuse, 1.0), 0.75);
        // More is past every chunk the sample's times place: the ratio.
        assert_eq!(estimate.rate(0.6, Mapping::Reuse, 1.0), 0.6 * 1.5);
        assert_eq!(estimate.factor(1.0, &evicting), 2.0);
        assert_eq!(estimate.factor(1.0, &filling), 1.0);
        // Replayed at several phases, the mean rate is the one read (0.5 maps to 0.75, as
        // above); the figures of the first phase's replay, at 0.25, are scaled to it.
        let over_phases = SizeRun {
            hit_rate_over_phases: Some(0.5),
            ..evicting.clone()
        };
        assert_eq!(estimate.factor(1.0, &over_phases), 3.0);
        // Objects of one size, an L1 alone: the whole trace's own models.
        estimate.object_bytes = Some(1 << 30);
        assert_eq!(estimate.mapping(&lru), Mapping::Footprint);
        assert_eq!(estimate.mapping(&filling), Mapping::FirstStores);
        assert_eq!(estimate.mapping(&evicting), Mapping::Reuse);
        let beside_l2 = SizeRun {
            l1_alone: false,
            ..lru.clone()
        };
        assert_eq!(estimate.mapping(&beside_l2), Mapping::Reuse);
        // The whole trace first stored keys at records 50, 200 and 400: an L1 of two 1 GiB
        // objects was full at 200, spread over [200, 201), so the chunks whose prefix was
        // stored within 201 records hit — those at 50 and 200, half — whatever the sample
        // hit. One of three or more never refused a key: every chunk with a time.
        let times = estimate.times.as_mut().expect("times");
        times.whole.first_stores = [50, 200, 400].map(Some).into_iter().collect();
        assert_eq!(estimate.rate(0.01, Mapping::FirstStores, 2.0), 0.5);
        assert_eq!(estimate.rate(0.9, Mapping::FirstStores, 2.0), 0.5);
        assert_eq!(estimate.rate(0.01, Mapping::FirstStores, 3.0), 1.0);
        assert_eq!(estimate.rate(0.01, Mapping::FirstStores, 4.0), 1.0);
        // A sample that hit nothing has nothing to multiply: the model's share of what was
        // requested (here 10 chunks and 4,000 tokens, the whole trace's 8,000 at half).
        let mut nothing = filling.clone();
        nothing.figures.hit_rate = 0.0;
        nothing.figures.requested_chunks = 10;
        nothing.requested_tokens = 4000;
        assert_eq!(estimate.without_hits(2.0, &nothing), Some(0.5));
        assert_eq!(estimate.without_hits(2.0, &filling), None);
        let point = estimate.point(2.0, nothing);
        assert_eq!(point.figures.hit_rate, 0.5);
        assert_eq!(point.figures.l1_hit_rate, 0.5);
        assert_eq!(point.figures.hit_chunks, 5);
        assert_eq!((point.hit_tokens, point.requested_tokens), (4000, 8000));
        assert_eq!(point.sample_mapping, Some("first stores"));
        // This footprint counted no key, so every capacity holds them all: the chunks with a
        // reuse time (the footprint itself is held to windows counted one by one in
        // `kvtrace_replay::chunk_times`).
        assert_eq!(estimate.rate(0.25, Mapping::Footprint, 1.0), 0.75);
        // The optimal bound by the ratio, never below the policy's estimate.
        assert_eq!(estimate.bound(0.25, 0.25), 0.375);
        assert_eq!(estimate.bound(0.25, 0.5), 0.5);
        // The whole trace's own replay stands as it is.
        assert_eq!(Estimate::WHOLE.rate(0.25, Mapping::Reuse, 1.0), 0.25);
        assert_eq!(Estimate::WHOLE.rate(0.25, Mapping::Footprint, 1.0), 0.25);
        assert_eq!(Estimate::WHOLE.bound(0.2, 0.5), 0.2);
    }

    fn point(gib: f64, hit_rate: f64) -> SizePoint {
        SizePoint {
            l1_gib: gib,
            figures: Figures {
                hit_rate,
                ..Figures::default()
            },
            hit_tokens: (hit_rate * 1000.0) as u64,
            requested_tokens: 1000,
            span_s: 1.0,
            optimal_chunk_hit_rate: None,
            sample_mapping: None,
        }
    }

    #[test]
    fn the_grid_is_log_spaced_and_ends_at_the_bounds() {
        let g = log_grid(0.5, 8.0, 5);
        let want = [0.5, 1.0, 2.0, 4.0, 8.0];
        assert!(
            g.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{g:?}"
        );
        assert_eq!(log_grid(1.0, 1.0, 4), vec![1.0]);
    }

    /// A sample is thin where its own times map the rate and it holds fewer than 500 trees,
    /// or where its replay chose the mapping and its trunk is most of it; never where the
    /// whole trace's footprint answers, or where it holds every tree.
    #[test]
    fn a_thin_sample_is_one_whose_own_replay_decides_with_too_little() {
        let counts = |trees_kept: u64, trunk_keys: u64| SampleCounts {
            rate: 0.01,
            trees: 10_000,
            trees_kept,
            keys: 100_000,
            keys_kept: 1_000,
            trunk_keys,
            trunk_bytes: 0,
            reuse: Default::default(),
            reuse_kept: Default::default(),
        };
        let mapped = |names: &[&'static str]| -> Vec<SizePoint> {
            names
                .iter()
                .map(|&m| SizePoint {
                    sample_mapping: Some(m),
                    ..point(1.0, 0.5)
                })
                .collect()
        };
        let reuse = mapped(&["footprint", "reuse time"]);
        let stores = mapped(&["first stores"]);
        let footprint = mapped(&["footprint"]);
        assert!(thin_sample(&reuse, &counts(499, 0)).is_some_and(|w| w.starts_with("499 ")));
        assert!(thin_sample(&reuse, &counts(500, 0)).is_none());
        assert!(thin_sample(&mapped(&["admission time"]), &counts(499, 0)).is_some());
        assert!(thin_sample(&stores, &counts(75, 310)).is_none());
        assert!(thin_sample(&stores, &counts(75, 800)).is_some());
        assert!(thin_sample(&reuse, &counts(5_000, 501)).is_some());
        assert!(thin_sample(&footprint, &counts(10, 900)).is_none());
        let mut every = counts(10, 900);
        every.trees_kept = every.trees;
        assert!(thin_sample(&reuse, &every).is_none());
    }

    #[test]
    fn the_knee_is_where_the_curve_bends() {
        // Rises fast to 1 GiB, then flattens: the knee is at 1 GiB.
        let pts: Vec<SizePoint> = [
            (0.25, 0.1),
            (0.5, 0.4),
            (1.0, 0.7),
            (2.0, 0.75),
            (4.0, 0.78),
        ]
        .iter()
        .map(|&(g, r)| point(g, r))
        .collect();
        assert_eq!(knee(&pts), Some(2));
        let flat: Vec<SizePoint> = [(1.0, 0.5), (2.0, 0.5)]
            .iter()
            .map(|&(g, r)| point(g, r))
            .collect();
        assert_eq!(knee(&flat), None);
    }

    #[test]
    fn the_bracket_spans_a_request_to_past_saturation() {
        let curve = LruCurve {
            object_bytes: 4096,
            requests: 2,
            requested_chunks: 10,
            prefix_max: vec![0, 3, 0, 2, 0, 0, 0, 0, 1],
            cold: 4,
            largest_request: 4,
        };
        let (lo, hi) = bracket(&curve).expect("bracket");
        assert!((lo - 4.0 * 4096.0 / GIB).abs() < 1e-15);
        assert!((hi - 8.0 * 4096.0 * 2.0 / GIB).abs() < 1e-15);
    }
}
