//! When the recorded server's L1 eviction controller ran.
//!
//! LMCache's controller thread starts a few milliseconds to a few tenths of a second after
//! the trace recorder (the reference recordings: 4–130 ms) and then passes every 1.000x s.
//! A trace does not record that phase, yet it decides which records an eviction pass falls
//! between — and under pressure, which request hits. The trace does record the outcomes the
//! phase produced: each retrieve's hits and each store's admitted keys. So replay estimates
//! the phase as the one under which a replay of the recorded configuration reproduces the
//! most of those outcomes: a coarse grid over one interval, then a fine one around the best,
//! taking the middle of the widest run of best-scoring phases. Phases whose first pass comes
//! after the calls estimated on run none and are replayed once for all, so a trace shorter
//! than one interval costs one replay, not hundreds — and a plan whose head ends before any
//! candidate's first pass makes that one beside its own replay (`settle_beside`).
//! Deterministic for a given trace and configuration; the caller may pin the phase instead.

use std::path::Path;

use serde::Serialize;

use crate::bus::Tracer;
use crate::error::Result;
use crate::lmct::ReadOptions;
use crate::storage::config::{BackendConfig, EvictionTiming, L2Io, StorageConfig};
use crate::storage::StorageManager;

use super::client::Rewrite;
use super::dispatch::{Call, Dispatcher};
use super::fidelity::Fidelity;
use super::loaded::Loaded;
use super::session::{Position, SessionModel, Sessions, SESSION_END_DELAY_S};
use super::Source;

/// Records the estimate replays at most: enough for the evidence of many passes, small
/// enough that hundreds of candidate replays stay quick.
pub const ESTIMATE_RECORDS: usize = 10_000;

/// How the eviction phase of a replay was chosen.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PhaseReport {
    pub phase_s: f64,
    /// `flag`, `estimated`, or `irrelevant` (L1 never reached the watermark, so no pass could
    /// evict: any phase replays the same).
    pub source: &'static str,
    /// Sessions (retrieves and stores) the chosen phase reproduces, of those estimated on.
    pub matched: u64,
    pub sessions: u64,
    /// The range of phases that scored as well as the chosen one around it.
    pub plateau_s: [f64; 2],
}

/// The configuration the estimate replays: the recorded one, with sizes only (no buffers,
/// no files, no servers, no I/O workers: the decisions are the same) so that hundreds of
/// runs are cheap and touch nothing.
fn model(config: &StorageConfig) -> StorageConfig {
    let mut m = config.clone();
    m.l1_buffers = false;
    m.l2_io = L2Io::Synchronous;
    for tier in &mut m.l2 {
        tier.backend = match tier.backend {
            BackendConfig::Gpu { bandwidth_gbps } => BackendConfig::Gpu { bandwidth_gbps },
            BackendConfig::Null => BackendConfig::Null,
            _ => BackendConfig::Memory { buffers: false },
        };
    }
    m
}

fn with_phase(config: &StorageConfig, phase_s: f64) -> StorageConfig {
    let mut c = config.clone();
    if let EvictionTiming::Periodic { interval_s, .. } = c.eviction.timing {
        c.eviction.timing = EvictionTiming::Periodic {
            interval_s,
            phase_s,
        };
    }
    c
}

/// What one replay of the estimate's calls found.
struct Score {
    /// Sessions (retrieves and stores) reproduced.
    matched: u64,
    sessions: u64,
    /// L1's peak usage reached the watermark.
    pressured: bool,
    /// The latest trace time the replay moved its clock to: its calls' times and the
    /// session ends after them. A phase runs a pass only if its first one (`phase +
    /// interval`) comes by the horizon of a replay without passes, since until its first
    /// pass it replays exactly as that one does.
    horizon: f64,
}

/// Replays the calls under `config`.
fn score(calls: &[(Position, &Call)], config: &StorageConfig, follow: &SessionModel) -> Score {
    let Some((sm, fidelity)) = replay(calls, config, follow) else {
        return Score {
            matched: 0,
            sessions: 0,
            pressured: false,
            horizon: 0.0,
        };
    };
    let r = &fidelity.report;
    let l1 = &sm.tier_stats()[0];
    let heap = l1.capacity_bytes.unwrap_or(0).max(1) as f64;
    Score {
        matched: r.requests_matching + r.stores_matching,
        sessions: r.requests + r.stores,
        pressured: l1.peak_bytes as f64 / heap >= config.eviction.trigger_watermark,
        horizon: sm.now(),
    }
}

/// The storage manager after replaying the calls under `config`, and how many sessions
/// it reproduced; `None` when `config` cannot make one.
fn replay(
    calls: &[(Position, &Call)],
    config: &StorageConfig,
    follow: &SessionModel,
) -> Option<(StorageManager, Fidelity)> {
    let mut sm = StorageManager::new(config.clone()).ok()?;
    let mut dispatcher = Dispatcher::default();
    let tracer = Tracer::disabled();
    let mut sessions = Sessions::new(follow, None);
    let mut fidelity = Fidelity::default();
    for (at, call) in calls {
        if let Some(closed) = sessions.before(&mut sm, call, *at) {
            fidelity.add(&sm, &closed);
        }
        let replaced = match sessions.rewrite(call) {
            Rewrite::Drop => continue,
            Rewrite::Replace(other) => Some(other),
            Rewrite::Keep => None,
        };
        let applied = replaced.as_ref().unwrap_or(call);
        sm.advance_to(at.t);
        let (_, effect) = dispatcher.apply(&mut sm, &tracer, applied, &[]);
        sessions.after(call, applied, &effect, *at, 0.0);
    }
    if let Some(closed) = sessions.close(&mut sm, f64::INFINITY) {
        fidelity.add(&sm, &closed);
    }
    Some((sm, fidelity))
}

/// Scores every candidate phase of a `period`, over the machine's cores. A phase whose
/// first pass (`phase + period`) comes after the horizon of the replay `without_passes`
/// runs none, and scores as that replay did.
fn scores(
    calls: &[(Position, &Call)],
    config: &StorageConfig,
    follow: &SessionModel,
    phases: &[f64],
    period: f64,
    without_passes: &Score,
) -> Vec<u64> {
    let passes = |p: f64| p + period <= without_passes.horizon;
    let replayed: Vec<f64> = phases.iter().copied().filter(|&p| passes(p)).collect();
    let mut replayed = replay_all(calls, config, follow, &replayed).into_iter();
    phases
        .iter()
        .map(|&p| match passes(p) {
            true => replayed.next().unwrap_or(0),
            false => without_passes.matched,
        })
        .collect()
}

/// Replays every phase of `phases`, over the machine's cores.
fn replay_all(
    calls: &[(Position, &Call)],
    config: &StorageConfig,
    follow: &SessionModel,
    phases: &[f64],
) -> Vec<u64> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(phases.len().max(1));
    let chunk = phases.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = phases
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&p| score(calls, &with_phase(config, p), follow).matched)
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// The widest run of consecutive candidates with the best score, as (first index, length).
/// `circular`: the candidates cover one whole interval, so the last one is next to the first
/// and a run may wrap around (phase `interval - ε` is phase `-ε`). Ties go to the earliest.
fn best_run(scores: &[u64], circular: bool) -> (usize, usize) {
    let n = scores.len();
    let best = scores.iter().copied().max().unwrap_or(0);
    if n == 0 || scores.iter().all(|&s| s == best) {
        return (0, n);
    }
    let is_best = |i: usize| scores[i] == best;
    let mut widest = (0, 0);
    for i in (0..n).filter(|&i| is_best(i)) {
        let starts = match i {
            0 if !circular => true,
            0 => !is_best(n - 1),
            _ => !is_best(i - 1),
        };
        if !starts {
            continue;
        }
        let reach = if circular { n } else { n - i };
        let len = (0..reach).take_while(|&d| is_best((i + d) % n)).count();
        if len > widest.1 {
            widest = (i, len);
        }
    }
    widest
}

/// Where LMCache's L1 eviction controller starts, seconds after the trace recorder: the
/// middle of what the reference servers logged (4–30 ms, once 130 ms). The phase a replay uses
/// where the trace holds no evidence of it — its recorded L1 never reached the watermark, or
/// every phase reproduces it alike — which a replay of another configuration still needs.
pub const SERVER_START_DELAY_S: f64 = 0.016;

/// The phase for a trace that holds no evidence of it.
fn prior(matched: u64, sessions: u64, interval_s: f64) -> PhaseReport {
    PhaseReport {
        phase_s: SERVER_START_DELAY_S.min(interval_s),
        source: "prior",
        matched,
        sessions,
        plateau_s: [0.0, interval_s],
    }
}

/// Estimates the phase for replaying `path`, whose server ran `recorded` (see the module
/// documentation). Periodic timing only; the phase is returned unchanged otherwise.
pub fn estimate(
    source: Source<'_>,
    read: ReadOptions,
    recorded: &StorageConfig,
    follow: &SessionModel,
) -> Result<PhaseReport> {
    let EvictionTiming::Periodic { interval_s, .. } = recorded.eviction.timing else {
        return Ok(PhaseReport {
            phase_s: 0.0,
            source: "irrelevant",
            matched: 0,
            sessions: 0,
            plateau_s: [0.0, 0.0],
        });
    };
    // The first calls of the trace, decoded once: the loaded trace's, or the file's.
    let decoded;
    let head = match source {
        Source::File(path) => {
            decoded = Loaded::load_head(path, read, ESTIMATE_RECORDS)?;
            &decoded
        }
        Source::Loaded(loaded) => loaded,
    };
    let calls = head.head(usize::MAX, ESTIMATE_RECORDS);
    let config = model(recorded);
    let first = score(&calls, &with_phase(&config, 0.0), follow);
    let (matched, sessions) = (first.matched, first.sessions);
    if !first.pressured {
        return Ok(prior(matched, sessions, interval_s));
    }
    let period = interval_s.max(1e-3);
    // Phase 0 ran no pass (its first came after its last call: a trace shorter than one
    // controller interval), so no candidate can: each replays as phase 0 did.
    if period > first.horizon {
        return Ok(prior(matched, sessions, interval_s));
    }
    let without_passes = score(&calls, &with_phase(&config, f64::INFINITY), follow);
    let coarse_step = (period / 200.0).max(1e-4);
    let coarse: Vec<f64> = (0..200).map(|i| i as f64 * coarse_step).collect();
    let coarse_scores = scores(&calls, &config, follow, &coarse, period, &without_passes);
    let (a, len) = best_run(&coarse_scores, true);
    if len == coarse.len() {
        return Ok(prior(coarse_scores[0], sessions, interval_s));
    }
    let wrap = |p: f64| p.rem_euclid(period);
    if len > 5 {
        // Deep inside a wide plateau already: its middle needs no refinement.
        let first = coarse[a];
        return Ok(PhaseReport {
            phase_s: wrap(first + (len - 1) as f64 * coarse_step / 2.0),
            source: "estimated",
            matched: coarse_scores[a],
            sessions,
            plateau_s: [first, wrap(first + (len - 1) as f64 * coarse_step)],
        });
    }
    let lo = coarse[a] - coarse_step;
    let hi = coarse[a] + len as f64 * coarse_step;
    let fine_step = coarse_step / 10.0;
    let fine: Vec<f64> = (0..)
        .map(|i| lo + i as f64 * fine_step)
        .take_while(|&p| p <= hi + 1e-12)
        .collect();
    let fine_scores = scores(&calls, &config, follow, &fine, period, &without_passes);
    let (a, len) = best_run(&fine_scores, false);
    let (first, last) = (fine[a], fine[a + len.max(1) - 1]);
    Ok(PhaseReport {
        phase_s: wrap((first + last) / 2.0),
        source: "estimated",
        matched: fine_scores[a],
        sessions,
        plateau_s: [wrap(first), wrap(last)],
    })
}

/// How the replay's eviction phase is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PhaseChoice {
    /// Seconds after the trace's time origin that the controller started.
    Fixed(f64),
    /// Estimated from the trace's own outcomes.
    Estimate,
}

/// Sets the eviction phase of `config` (the replay's) for replaying `source`: pinned, or
/// estimated against the configuration the trace records (`recorded_json`; the replay's own
/// when the trace records none, and the replay's L2 tiers where the recording had adapters
/// kvtrace cannot rebuild). `None` for immediate timing, which has no passes.
///
/// A sample of some of a trace's prefix trees ([`Loaded::sample_scale`]) holds a share of the
/// server's load at its full L1, so its head shows other pressure than the server's, or
/// none: it takes the phase of `whole`, the file it was drawn from, as the whole trace's
/// replay does.
pub fn settle(
    source: Source<'_>,
    whole: Option<&Path>,
    read: ReadOptions,
    recorded_json: &str,
    config: &mut StorageConfig,
    choice: PhaseChoice,
    follow: &SessionModel,
) -> Result<Option<PhaseReport>> {
    let EvictionTiming::Periodic { interval_s, .. } = config.eviction.timing else {
        return Ok(None);
    };
    let report = match choice {
        PhaseChoice::Fixed(phase_s) => PhaseReport {
            phase_s,
            source: "flag",
            matched: 0,
            sessions: 0,
            plateau_s: [phase_s, phase_s],
        },
        PhaseChoice::Estimate => {
            let recorded = recorded_model(recorded_json, config, interval_s);
            match source {
                Source::File(_) => estimate(source, read, &recorded, follow)?,
                Source::Loaded(loaded) => {
                    loaded.phase(format!("{recorded:?} {follow:?}"), || {
                        let told_by = match whole {
                            Some(path) if loaded.sample_scale().is_some() => Source::File(path),
                            _ => source,
                        };
                        estimate(told_by, read, &recorded, follow)
                    })?
                }
            }
        }
    };
    *config = with_phase(config, report.phase_s);
    Ok(Some(report))
}

/// The recorded configuration the estimate replays, its phase 0.
fn recorded_model(recorded_json: &str, config: &StorageConfig, interval_s: f64) -> StorageConfig {
    match StorageConfig::from_lmcache_json(recorded_json) {
        Some((mut recorded, _)) => {
            // Where the recording had adapters that were not rebuilt (unreadable, or tiers
            // a header may not open), the replay's own tiers stand in.
            if recorded.l2.len() < StorageConfig::adapters_in(recorded_json) {
                recorded.l2 = config.l2.clone();
            }
            recorded.eviction.timing = EvictionTiming::Periodic {
                interval_s,
                phase_s: 0.0,
            };
            recorded
        }
        None => config.clone(),
    }
}

/// The score [`settle_beside`] leaves to be made beside the replay.
pub(crate) struct PriorScore {
    config: StorageConfig,
    follow: SessionModel,
}

impl PriorScore {
    /// The sessions of `head` the prior phase reproduces, and of how many: the figures
    /// [`estimate`] would have reported.
    pub(crate) fn run(&self, head: &Loaded) -> (u64, u64) {
        let calls = head.head(usize::MAX, ESTIMATE_RECORDS);
        let s = score(&calls, &self.config, &self.follow);
        (s.matched, s.sessions)
    }
}

/// [`settle`] for a replay that has the head of its trace to itself (a plan's). Where the
/// head's calls end before the first pass of any candidate phase, every phase replays them
/// alike: the estimate is the prior whatever they score, and only how many sessions it
/// reproduces is left to count — which the caller may do beside the replay, with the
/// [`PriorScore`] returned, and write into the report's `matched` and `sessions`.
pub(crate) fn settle_beside(
    head: &Loaded,
    read: ReadOptions,
    recorded_json: &str,
    config: &mut StorageConfig,
    choice: PhaseChoice,
    follow: &SessionModel,
) -> Result<(Option<PhaseReport>, Option<PriorScore>)> {
    if let (PhaseChoice::Estimate, EvictionTiming::Periodic { interval_s, .. }) =
        (choice, config.eviction.timing)
    {
        let calls = head.head(usize::MAX, ESTIMATE_RECORDS);
        let last = calls
            .iter()
            .map(|(at, _)| at.t)
            .filter(|t| t.is_finite())
            .fold(0.0, f64::max);
        // A replay's clock ends at most two session-end delays after its last call (the
        // close of the last session, then the modelled client's store): the horizon
        // [`estimate`] compares the period with. A third delay covers the rounding.
        if interval_s.max(1e-3) > last + 3.0 * SESSION_END_DELAY_S {
            let recorded = recorded_model(recorded_json, config, interval_s);
            let report = prior(0, 0, interval_s);
            *config = with_phase(config, report.phase_s);
            let later = PriorScore {
                config: with_phase(&model(&recorded), 0.0),
                follow: follow.clone(),
            };
            return Ok((Some(report), Some(later)));
        }
    }
    let report = settle(
        Source::Loaded(head),
        None,
        read,
        recorded_json,
        config,
        choice,
        follow,
    )?;
    Ok((report, None))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::client::{resolve, ClientChoice};
    use super::*;
    use crate::lmct::TraceReader;

    /// The decoded head of a real LMCache 0.5.6 recording under eviction pressure, its recorded
    /// configuration, and the session model a default replay infers for it.
    fn churn(name: &str) -> (Loaded, StorageConfig, SessionModel) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/lmcache/churn")
            .join(name);
        let read = ReadOptions::default();
        let header = TraceReader::open(&path, read).unwrap().header().clone();
        let (recorded, _) = StorageConfig::from_lmcache_json(&header.sm_config_json).unwrap();
        let client = resolve(Source::File(&path), read, &ClientChoice::Infer).unwrap();
        let follow = SessionModel {
            emulate: true,
            client,
        };
        (
            Loaded::load_head(&path, read, ESTIMATE_RECORDS).unwrap(),
            model(&recorded),
            follow,
        )
    }

    /// A sample of half the trees of a recording under pressure settles the phase a replay
    /// of the whole file estimates; from its own head it would not.
    #[test]
    fn a_sample_takes_the_phase_of_the_trace_it_was_drawn_from() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/lmcache/churn/lru_seed1.lct");
        let read = ReadOptions::default();
        let header = TraceReader::open(&path, read).unwrap().header().clone();
        let (recorded, _) = StorageConfig::from_lmcache_json(&header.sm_config_json).unwrap();
        let (_, _, follow) = churn("lru_seed1.lct");
        let settled = |source: Source<'_>, whole: Option<&Path>| {
            let mut config = recorded.clone();
            let json = &header.sm_config_json;
            settle(
                source,
                whole,
                read,
                json,
                &mut config,
                PhaseChoice::Estimate,
                &follow,
            )
            .unwrap()
            .expect("periodic timing")
        };
        let full = settled(Source::File(&path), None);
        assert_eq!(full.source, "estimated", "{full:?}");
        let sample = Loaded::load_sample(&path, read, 0.5, 7).unwrap().loaded;
        assert!(sample.sample_scale().is_some(), "some trees left out");
        assert_eq!(settled(Source::Loaded(&sample), Some(&path)), full);
        let own = Loaded::load_sample(&path, read, 0.5, 7).unwrap().loaded;
        assert_ne!(settled(Source::Loaded(&own), None), full);
    }

    #[test]
    fn phases_without_a_pass_score_as_one_replay_without_passes_does() {
        for name in ["lru_seed1.lct", "arc_seed2.lct"] {
            let (head, config, follow) = churn(name);
            let calls = head.head(usize::MAX, ESTIMATE_RECORDS);
            let EvictionTiming::Periodic { interval_s, .. } = config.eviction.timing else {
                panic!("{name}: periodic eviction recorded");
            };
            let without = score(&calls, &with_phase(&config, f64::INFINITY), &follow);
            // Candidates on both sides of the horizon: some run passes, some cannot.
            let phases: Vec<f64> = (0..40)
                .map(|i| without.horizon - interval_s - 0.2 + i as f64 * 0.01)
                .filter(|&p| p >= 0.0)
                .collect();
            assert!(
                phases.iter().any(|&p| p + interval_s > without.horizon)
                    && phases.iter().any(|&p| p + interval_s <= without.horizon),
                "{name}: horizon {}",
                without.horizon
            );
            let every = replay_all(&calls, &config, &follow, &phases);
            let shortcut = scores(&calls, &config, &follow, &phases, interval_s, &without);
            assert_eq!(shortcut, every, "{name}");
            // Exactly the phases past the horizon run no pass: the last one before it does
            // (under pressure, so it evicts), and none after it.
            for &p in &phases {
                let (sm, _) = replay(&calls, &with_phase(&config, p), &follow).unwrap();
                let passes = sm.call_stats().eviction_passes;
                let past = p + interval_s > without.horizon;
                assert_eq!(passes == 0, past, "{name}: phase {p}: {passes} pass(es)");
            }
        }
    }

    #[test]
    fn the_widest_run_of_best_scores_wins_and_ties_go_to_the_earliest() {
        assert_eq!(best_run(&[1, 3, 3, 2, 3, 3, 3, 1], false), (4, 3));
        assert_eq!(best_run(&[3, 1, 3], false), (0, 1));
        assert_eq!(best_run(&[], false), (0, 0));
        assert_eq!(best_run(&[3, 3, 1, 3, 3], false), (0, 2));
    }

    #[test]
    fn a_circular_run_wraps_around_the_interval() {
        // The run at the end continues at the start: 3 wide, from index 4.
        assert_eq!(best_run(&[3, 1, 3, 2, 3, 3], true), (4, 3));
        assert_eq!(best_run(&[3, 3, 1, 3, 3], true), (3, 4));
        // Equally wide runs: the earliest start.
        assert_eq!(best_run(&[3, 1, 3, 1], true), (0, 1));
        assert_eq!(best_run(&[1, 3, 3, 1, 3, 3], true), (1, 2));
        // Everything best: the whole interval, no evidence.
        assert_eq!(best_run(&[2, 2, 2], true), (0, 3));
    }

    /// A churn recording moved to start at trace time 0, as one written through the
    /// recorder API does (LMCache's servers record a start-up gap of seconds first).
    fn from_zero(name: &str, dir: &Path) -> std::path::PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/lmcache/churn")
            .join(name);
        let mut reader = TraceReader::open(&path, ReadOptions::default()).unwrap();
        let header = reader.header().clone();
        let mut writer = crate::lmct::TraceWriter::new(Vec::new(), header.clone());
        writer
            .attach_storage_config(&header.sm_config_json)
            .unwrap();
        let mut first = None;
        while let Some(r) = reader.next_record().unwrap() {
            let t = r.t_mono - *first.get_or_insert(r.t_mono);
            writer
                .write_record_parts(t, r.t_wall, r.qualname, r.args.bytes())
                .unwrap();
        }
        let out = dir.join(name);
        std::fs::write(&out, writer.finish().unwrap()).unwrap();
        out
    }

    /// Settled beside the replay, a head that ends before any candidate's first pass gives
    /// the report the estimate gives, once its score is made; a head reaching past it is
    /// estimated as before. Heads of recordings under eviction pressure, short and long.
    #[test]
    fn a_prior_scored_beside_the_replay_is_the_estimate() {
        let read = ReadOptions::default();
        let dir = std::env::temp_dir().join(format!("kvtrace-phase-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut short, mut long) = (0, 0);
        for name in ["lru_seed1.lct", "arc_seed2.lct", "lru_small_seed3.lct"] {
            let path = from_zero(name, &dir);
            let header = TraceReader::open(&path, read).unwrap().header().clone();
            let (recorded, _) = StorageConfig::from_lmcache_json(&header.sm_config_json).unwrap();
            let follow = churn(name).2;
            for calls in [3, 12, 40, 400] {
                // Two loads: settle keeps its estimate in the head it was given.
                let head = || Loaded::load_head(&path, read, calls).unwrap();
                let mut config = recorded.clone();
                let expected = settle(
                    Source::Loaded(&head()),
                    None,
                    read,
                    &header.sm_config_json,
                    &mut config,
                    PhaseChoice::Estimate,
                    &follow,
                )
                .unwrap()
                .unwrap();
                let beside = head();
                let mut beside_config = recorded.clone();
                let (report, later) = settle_beside(
                    &beside,
                    read,
                    &header.sm_config_json,
                    &mut beside_config,
                    PhaseChoice::Estimate,
                    &follow,
                )
                .unwrap();
                let mut report = report.unwrap();
                match later {
                    Some(score) => {
                        short += 1;
                        (report.matched, report.sessions) = score.run(&beside);
                        assert!(report.sessions > 0, "{name}, {calls} calls");
                    }
                    None => long += 1,
                }
                assert_eq!(report, expected, "{name}, {calls} calls");
                assert_eq!(format!("{beside_config:?}"), format!("{config:?}"));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            short > 0 && long > 0,
            "{short} heads scored beside, {long} estimated"
        );
    }
}
