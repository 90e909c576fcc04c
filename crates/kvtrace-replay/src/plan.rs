//! A replay from options to written reports, the same for the command line and a library
//! caller: the input spooled when it is a pipe, the storage configuration the trace recorded
//! (or the caller's) with the caller's overrides, the eviction phase settled, every output
//! checked before the run so a finished replay is never lost to a bad path, then the replay,
//! its per-record JSONL, and the report files.

use std::path::PathBuf;
use std::sync::Arc;

use super::client::{resolve, ClientChoice};
use super::dispatch::Outcome;
use super::loaded::Loaded;
use super::phase::{settle, settle_beside, PhaseChoice, PhaseReport, PriorScore, ESTIMATE_RECORDS};
use super::report::ReplayReport;
use super::session::SessionModel;
use super::spool::Spooled;
use super::{replay_after_head, replay_from, RecordEvent, ReplayOptions, Source};
use crate::error::{Error, Result};
use crate::lmct::digest::{config_digest, python_json};
use crate::lmct::{Header, TraceReader};
use crate::otel::SpanSink;
use crate::rank::barrier::Barrier;
use crate::storage::config::{EvictionTiming, StorageConfig, NAME_L2};
use crate::storage::StorageManager;
use kvtrace_report::jsonl::JsonlWriter;
use kvtrace_report::{Exporter, Target};

/// Where the storage configuration comes from.
pub enum Storage<'a> {
    /// The configuration recorded in the trace's header, then `overrides`. `own_l2` says the
    /// overrides bring their own L2 tiers (so recorded adapters kvtrace cannot rebuild need
    /// no warning); `complete` that they make a whole configuration (an L1 size or a
    /// configuration file), so a trace that records none starts from the defaults instead
    /// of failing.
    Recorded {
        overrides: &'a dyn Fn(&mut StorageConfig) -> Result<()>,
        own_l2: bool,
        complete: bool,
    },
    /// This configuration, whatever the trace recorded.
    Given(StorageConfig),
}

/// What a replay does and writes, beyond the storage configuration.
pub struct Options {
    pub replay: ReplayOptions,
    pub phase: PhaseChoice,
    /// Report files: each exporter's output to its target (a directory takes the default
    /// file names, as LMCache's `trace_replay_*` files).
    pub outputs: Vec<(&'static dyn Exporter, Target, &'static str)>,
    /// One JSON line per replayed record.
    pub jsonl: Option<PathBuf>,
    /// Where the ranks of a run meet once their tiers are set up, so that their replays
    /// begin together.
    pub barrier: Option<Barrier>,
    /// The trace, decoded before and shared by many plans (a sweep's): the plan reads
    /// nothing of the file, and the phase and client it shares are settled once. Not used by
    /// a replay whose tracer records (its argument bytes are not kept).
    pub loaded: Option<Arc<Loaded>>,
}

/// A replay ready to run.
pub struct Plan {
    input: Spooled,
    shown: String,
    config: StorageConfig,
    phase: Option<PhaseReport>,
    /// The head of the file decoded for the client and the phase, replayed from memory.
    head: Option<Loaded>,
    /// The prior phase's score, made beside the replay.
    prior_score: Option<PriorScore>,
    options: Options,
    jsonl: Option<JsonlWriter>,
    /// The digest of the storage configuration the trace recorded.
    recorded_digest: String,
    /// What the caller should hear before the run (recorded tiers that cannot be rebuilt).
    pub notes: Vec<String>,
}

/// A finished replay: the report, already written to every output.
pub struct Finished {
    pub report: ReplayReport,
}

impl Plan {
    /// Opens `path` (a pipe is spooled first), settles the configuration and the eviction
    /// phase, and checks every output.
    pub fn new(path: &std::path::Path, storage: Storage<'_>, options: Options) -> Result<Plan> {
        let shown = path.display().to_string();
        let input = Spooled::open(path)?;
        let mut options = options;
        if options.replay.tracer.is_recording() {
            options.loaded = None;
        }
        let source = source(&options.loaded, &input);
        let header = match source {
            Source::Loaded(loaded) => loaded.header().clone(),
            Source::File(path) => TraceReader::open(path, options.replay.read)
                .map_err(|e| e.in_file(&shown))?
                .header()
                .clone(),
        };
        let (mut config, notes) = storage_config(&header, storage, &shown)?;
        // The client and the phase are told by the head of the trace: decoded once for both.
        let head = match (source, &options.replay.client, options.phase) {
            (Source::File(path), ClientChoice::Infer, _)
            | (Source::File(path), _, PhaseChoice::Estimate) => Some(
                Loaded::load_head(path, options.replay.read, ESTIMATE_RECORDS)
                    .map_err(|e| e.in_file(&shown))?,
            ),
            _ => None,
        };
        let told_by = head.as_ref().map_or(source, Source::Loaded);
        let client = resolve(told_by, options.replay.read, &options.replay.client)
            .map_err(|e| e.in_file(&shown))?;
        options.replay.client = ClientChoice::Resolved(client.clone());
        let model = SessionModel {
            emulate: options.replay.emulate_sessions,
            client,
        };
        let (phase, prior_score) = match &head {
            Some(head) => settle_beside(
                head,
                options.replay.read,
                &header.sm_config_json,
                &mut config,
                options.phase,
                &model,
            ),
            None => settle(
                told_by,
                Some(input.path()),
                options.replay.read,
                &header.sm_config_json,
                &mut config,
                options.phase,
                &model,
            )
            .map(|phase| (phase, None)),
        }
        .map_err(|e| e.in_file(&shown))?;
        // The reports land there after the whole replay: find out now that they can.
        for (_, target, _) in &options.outputs {
            target.check()?;
        }
        let jsonl = options
            .jsonl
            .as_deref()
            .map(JsonlWriter::create)
            .transpose()?;
        Ok(Plan {
            input,
            shown,
            config,
            phase,
            head,
            prior_score,
            options,
            jsonl,
            recorded_digest: header.sm_config_digest,
            notes,
        })
    }

    /// The file replayed: the input itself, or its spooled copy.
    pub fn input(&self) -> &std::path::Path {
        self.input.path()
    }

    /// The configuration the replay runs.
    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// Moves the eviction controller's passes `fraction` of an interval later than the
    /// phase settled (periodic timing; nothing otherwise): a sampled plan replays a size at
    /// several phases, as which of a sample's few requests a pass makes room for is luck.
    pub fn shift_phase(&mut self, fraction: f64) {
        if let EvictionTiming::Periodic {
            interval_s,
            phase_s,
        } = self.config.eviction.timing
        {
            let phase_s = phase_s + fraction * interval_s;
            self.config.eviction.timing = EvictionTiming::Periodic {
                interval_s,
                phase_s,
            };
            if let Some(report) = self.phase.as_mut() {
                report.phase_s = phase_s;
            }
        }
    }

    /// Sends each replayed request to `sink` as a span tree.
    pub fn export_spans(&mut self, sink: Arc<dyn SpanSink>) {
        self.options.replay.spans = Some(sink);
    }

    /// The resource attributes that say which replay spans come from: the command, the
    /// trace and its recorded configuration digest, the configuration replayed, the pacing.
    pub fn span_resource(&self) -> Vec<(String, String)> {
        let config = python_json(&self.config.to_lmcache_json());
        let mut attributes = vec![
            ("kvtrace.command", "replay".to_owned()),
            ("kvtrace.trace", self.shown.clone()),
            (
                "kvtrace.trace.sm_config_digest",
                self.recorded_digest.clone(),
            ),
            ("kvtrace.config.digest", config_digest(&config)),
            ("kvtrace.pacing", self.options.replay.pacing.describe()),
        ];
        if let Some((rank, _)) = &self.options.replay.rank {
            attributes.push(("kvtrace.rank", rank.rank.to_string()));
            attributes.push(("kvtrace.world_size", rank.world_size.to_string()));
        }
        attributes
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    }

    /// Replays, calling `on_record` after each record, and writes the JSONL and the reports.
    pub fn run(mut self, mut on_record: impl FnMut(&RecordEvent<'_>)) -> Result<Finished> {
        let mut sm = StorageManager::new(self.config)?;
        if let Some(scale) = self.options.loaded.as_ref().and_then(|l| l.sample_scale()) {
            sm.sample(scale);
        }
        if let Some(barrier) = &self.options.barrier {
            barrier.wait()?;
        }
        let mut jsonl_error = None;
        let jsonl = &mut self.jsonl;
        let source = source(&self.options.loaded, &self.input);
        let each = |event: &RecordEvent<'_>| {
            on_record(event);
            if let Some(w) = jsonl.as_mut() {
                if let Err(e) = w.write(&record_line(event)) {
                    jsonl_error.get_or_insert(e);
                }
            }
        };
        let (head, options) = (&self.head, &self.options.replay);
        let (replayed, prior) = std::thread::scope(|scope| {
            let prior = self
                .prior_score
                .as_ref()
                .zip(head.as_ref())
                .map(|(score, head)| scope.spawn(move || score.run(head)));
            let replayed = match (source, head) {
                (Source::File(path), Some(head)) => {
                    replay_after_head(path, head, &mut sm, options, each)
                }
                _ => replay_from(source, &mut sm, options, each),
            };
            let prior = prior.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (replayed, prior)
        });
        let mut report = replayed?;
        // A spooled pipe is named as the user gave it, not by its temporary copy.
        report.trace = self.shown;
        report.eviction_phase = self.phase;
        if let (Some(phase), Some((matched, sessions))) = (report.eviction_phase.as_mut(), prior) {
            (phase.matched, phase.sessions) = (matched, sessions);
        }
        if let Some(e) = jsonl_error {
            return Err(e);
        }
        if let Some(w) = self.jsonl {
            w.commit()?;
        }
        for (exporter, target, name) in &self.options.outputs {
            kvtrace_report::write(&report, *exporter, target, name)?;
        }
        Ok(Finished { report })
    }
}

impl Finished {
    /// One line saying which calls failed and why, when any did: the exit status alone does
    /// not tell a full disk from a miss.
    pub fn failure_line(&self) -> Option<String> {
        let r = &self.report;
        (r.failed > 0).then(|| {
            format!(
                "{}: {} call(s) failed: {}",
                r.trace,
                r.failed,
                kvtrace_report::reasons::failure_summary(&r.failure_reasons)
            )
        })
    }
}

/// Where a plan's records come from: the trace decoded before, or the file.
fn source<'a>(loaded: &'a Option<Arc<Loaded>>, input: &'a Spooled) -> Source<'a> {
    match loaded {
        Some(loaded) => Source::Loaded(loaded),
        None => Source::File(input.path()),
    }
}

/// The per-record JSONL line.
fn record_line(event: &RecordEvent<'_>) -> serde_json::Value {
    let (kind, detail) = match event.outcome {
        Outcome::Ok { detail } => ("ok", detail.to_string()),
        Outcome::Failed { reason } => ("failed", reason.clone()),
        Outcome::Skipped { reason } => ("skipped", reason.clone()),
    };
    serde_json::json!({
        "qualname": event.qualname,
        "latency_ms": event.latency_ms,
        "failed": !matches!(event.outcome, Outcome::Ok { .. }),
        "outcome": kind,
        "detail": detail,
    })
}

/// The words the error of a replay ends with when its trace records no configuration it can
/// read and its caller gave no whole one ([`Storage::Given`], or overrides that are
/// `complete`). The error names the file and `header.sm_config_json`, and says why first.
pub const NO_RECORDED_CONFIG: &str = "the trace records no storage configuration kvtrace can read";

/// The error of a trace whose `sm_config_json` is no configuration, for `why`.
pub fn no_recorded_config(shown: impl std::fmt::Display, why: &str) -> Error {
    let mut e = Error::usage(format!("{why}: {NO_RECORDED_CONFIG}")).in_file(shown);
    e.field = Some("header.sm_config_json".into());
    e
}

/// The configuration to replay and the notes about what of the recorded one could not be
/// rebuilt.
fn storage_config(
    header: &Header,
    storage: Storage<'_>,
    shown: &str,
) -> Result<(StorageConfig, Vec<String>)> {
    let (overrides, own_l2, complete) = match storage {
        Storage::Given(config) => return Ok((config, Vec::new())),
        Storage::Recorded {
            overrides,
            own_l2,
            complete,
        } => (overrides, own_l2, complete),
    };
    let (mut config, notes) = match StorageConfig::read_lmcache_json(&header.sm_config_json) {
        Ok((config, notes)) => {
            config
                .check_recorded()
                .map_err(|e| Error::data(0, "header.sm_config_json", e).in_file(shown))?;
            let notes = notes
                .into_iter()
                .filter(|n| !(own_l2 && n.ends_with(NAME_L2)))
                .collect();
            (config, notes)
        }
        Err(_) if complete => (StorageConfig::default(), Vec::new()),
        Err(why) => return Err(no_recorded_config(shown, &why)),
    };
    overrides(&mut config)?;
    Ok((config, notes))
}
