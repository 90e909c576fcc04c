//! Replays a storage trace against a StorageManager: real time, sped up, or as fast as
//! possible.
//!
//! As fast as possible (the default) is deterministic — calls apply in file order on the
//! trace's own clock, so the same trace and configuration give identical counters and hits on
//! every run. Paced replays sleep to each record's time and are as deterministic in their
//! counters (the manager runs on trace time), only their latencies are live measurements.
//! The start-up gap before the first record is skipped unless asked for.
//!
//! Events-level traces, which hold the cache's own events rather than its calls, are read,
//! merged into a fleet and replayed by [`events`].

#![warn(unreachable_pub)]

pub mod chunk_times;
pub mod client;
pub mod diff;
pub mod dispatch;
pub mod events;
pub mod fidelity;
pub mod loaded;
pub mod phase;
pub mod plan;
pub mod report;
pub mod session;
pub mod shard;
pub mod spans;
pub mod spool;
pub mod terminal;

// The crates below, under the paths this code has always used.
use kvtrace_cache::{bus, clock, storage};
use kvtrace_io::{error, interrupt};
use kvtrace_lmct as lmct;
use kvtrace_otel as otel;
use kvtrace_rank as rank;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::bus::Tracer;
use crate::error::{Error, Result};
use crate::lmct::blocks::read_ahead;
use crate::lmct::digest::{compare_configs, config_digest, python_json, DigestMatch};
use crate::lmct::{ReadOptions, ReadSummary, TraceReader};
use crate::rank::Rank;
use crate::storage::config::{EvictionTiming, StorageConfig};
use crate::storage::{CallStats, StorageManager, TierIo};
use client::{ClientChoice, Rewrite};
use dispatch::{Call, Decoder, Dispatcher, Outcome};
use fidelity::Fidelity;
use kvtrace_report::histogram::LatencyHistogram;
use kvtrace_report::reasons::{add_reason, count_failure, OTHER_SKIPS};
use loaded::Loaded;
use report::{ConfigLine, DigestReport, HitSummary, OpStats, RankReport, ReplayReport};
use session::{Closed, Position, SessionModel, Sessions};
use shard::{ShardMode, Sharder};
use spans::RequestSpans;

/// The slowest timed pacing: a millisecond of the trace takes 11.6 days. Slower is no
/// replay anyone waits for, and a record's wait would no longer fit the clock's range.
pub const MIN_SPEEDUP: f64 = 1e-9;

/// How records are spaced in time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pacing {
    /// No sleeping: deterministic.
    AsFastAsPossible,
    /// Sleep to each record's recorded offset divided by `speedup` (1 = LMCache's pacing).
    Timed { speedup: f64 },
}

impl Pacing {
    pub fn describe(&self) -> String {
        match self {
            Pacing::AsFastAsPossible => "as fast as possible (deterministic)".into(),
            Pacing::Timed { speedup } if *speedup == 1.0 => "real time".into(),
            Pacing::Timed { speedup } => format!("{speedup}x real time"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub pacing: Pacing,
    /// Sleep through the time before the first record too (LMCache does).
    pub keep_startup_gap: bool,
    pub read: ReadOptions,
    /// Model the client sessions: the server's end-of-session touch, and the writes and
    /// lock releases a client does that a what-if outcome calls for (see [`session`]).
    pub emulate_sessions: bool,
    /// Stop after the first call that fails (a tier refused it); the report covers the
    /// records up to it.
    pub fail_fast: bool,
    /// Where each replayed call is republished, with the recorded argument bytes (a
    /// disabled tracer by default; a recorder on it records the replay).
    pub tracer: Tracer,
    /// This process's rank in a run of many, and how it takes its share of the trace
    /// (`None`: the whole trace is this rank's own, one server's file of several).
    pub rank: Option<(Rank, Option<ShardMode>)>,
    /// Where each replayed request goes as a `request` span tree (see [`spans`]).
    pub spans: Option<std::sync::Arc<dyn crate::otel::SpanSink>>,
    /// The model of the recorded client: what it would have stored had the cache answered
    /// as the replay's does (see [`client`]).
    pub client: ClientChoice,
    /// Time every call on the wall clock: the report's per-call-kind latencies and
    /// histograms, each record's `latency_ms`, and the spans' lookup ends. Without it they
    /// are zero, and the report holds no latency histograms. A sweep's or a planner's
    /// replays compare hits: reading the clock twice a call was a tenth of their time, and
    /// the histograms, each 270 KiB of counts, were most of what a small replay allocated.
    pub time_calls: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            pacing: Pacing::AsFastAsPossible,
            keep_startup_gap: false,
            read: ReadOptions::default(),
            emulate_sessions: true,
            fail_fast: false,
            tracer: Tracer::disabled(),
            rank: None,
            spans: None,
            client: ClientChoice::Infer,
            time_calls: true,
        }
    }
}

/// One replayed record, for per-record output (`--verbose`, `--jsonl-out`).
pub struct RecordEvent<'a> {
    /// 1-based.
    pub index: u64,
    /// Byte offset of the record's frame.
    pub offset: u64,
    pub qualname: &'a str,
    pub outcome: &'a Outcome,
    pub latency_ms: f64,
    /// The manager after the call: its tiers' and calls' counters as they stand.
    pub sm: &'a StorageManager,
}

/// The calls of one kind a replay made: each one's latency when calls are timed (none are
/// kept otherwise: every latency is zero, and a sweep's points pushed a hundred thousand of
/// them each).
#[derive(Default)]
struct CallTimes {
    ms: Vec<f64>,
    calls: u64,
    errors: u64,
}

/// Where a replay's records come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// A trace file, decoded on worker threads as it is read.
    File(&'a Path),
    /// A trace decoded before, whose records many replays share.
    Loaded(&'a Loaded),
}

/// What the replay loop reads of a record besides its decoded call.
struct At<'r> {
    offset: u64,
    t_mono: f64,
    qualname: &'r str,
    /// The recorded argument bytes, republished by a recording tracer (empty for a
    /// [`Loaded`] trace, which a recording replay does not use).
    args: &'r [u8],
}

fn digest_report(
    recorded: &str,
    recorded_digest: &str,
    config: &serde_json::Value,
) -> DigestReport {
    let run = python_json(config);
    let (result, differing_paths) = match compare_configs(recorded, &run) {
        DigestMatch::Exact => ("match".to_string(), Vec::new()),
        DigestMatch::Semantic => ("match (semantic)".to_string(), Vec::new()),
        DigestMatch::Mismatch(paths) => ("MISMATCH".to_string(), paths),
    };
    DigestReport {
        recorded: recorded_digest.to_owned(),
        run: config_digest(&run),
        result,
        differing_paths,
    }
}

/// Bytes of records decoded ahead at a time: a few of these are all the trace a replay holds.
const READ_AHEAD_BLOCK_BYTES: usize = 1 << 20;

/// Replays `path` onto `sm`, calling `on_record` after each record. The records are decoded
/// on worker threads, ahead of the calls.
pub fn replay(
    path: &Path,
    sm: &mut StorageManager,
    options: &ReplayOptions,
    on_record: impl FnMut(&RecordEvent<'_>),
) -> Result<ReplayReport> {
    replay_from(Source::File(path), sm, options, on_record)
}

/// [`replay`] of records from either source: the same loop, the same report. A [`Loaded`]
/// trace keeps no argument bytes, so a replay whose tracer records must read the file.
pub fn replay_from(
    source: Source<'_>,
    sm: &mut StorageManager,
    options: &ReplayOptions,
    on_record: impl FnMut(&RecordEvent<'_>),
) -> Result<ReplayReport> {
    replay_records(source, None, sm, options, on_record)
}

/// [`replay`] of a file whose head was decoded before (a plan's, for the client and the
/// phase): the head's calls are replayed from memory and the file is read after them, so
/// that no record is decoded twice. The same report as [`replay`]; a replay whose tracer
/// records reads the file whole, for the argument bytes.
pub(crate) fn replay_after_head(
    path: &Path,
    head: &Loaded,
    sm: &mut StorageManager,
    options: &ReplayOptions,
    on_record: impl FnMut(&RecordEvent<'_>),
) -> Result<ReplayReport> {
    replay_records(Source::File(path), Some(head), sm, options, on_record)
}

fn replay_records(
    source: Source<'_>,
    head: Option<&Loaded>,
    sm: &mut StorageManager,
    options: &ReplayOptions,
    mut on_record: impl FnMut(&RecordEvent<'_>),
) -> Result<ReplayReport> {
    /// The source, opened.
    enum Input<'a> {
        Reader(Box<TraceReader>),
        Loaded(&'a Loaded),
        /// A head decoded before, and the file read on from the frame after it.
        AfterHead(&'a Loaded, Box<TraceReader>),
    }
    let (input, header, header_warnings, shown) = match source {
        Source::File(path) => {
            let shown = path.display().to_string();
            let mut reader =
                TraceReader::open(path, options.read).map_err(|e| e.in_file(&shown))?;
            let (header, warnings) = (reader.header().clone(), reader.header_warnings());
            let input = match head {
                Some(head) if !options.tracer.is_recording() => {
                    let frames = head.summary.records + head.summary.undecodable;
                    reader.skip_frames(frames).map_err(|e| e.in_file(&shown))?;
                    Input::AfterHead(head, Box::new(reader))
                }
                _ => Input::Reader(Box::new(reader)),
            };
            (input, header, warnings, shown)
        }
        Source::Loaded(loaded) => {
            if options.tracer.is_recording() {
                return Err(Error::usage(
                    "a replay that records its calls reads the trace file: a loaded trace keeps no argument bytes",
                ));
            }
            let shown = loaded.shown().to_owned();
            let header = loaded.header().clone();
            (
                Input::Loaded(loaded),
                header,
                loaded.header_warnings(),
                shown,
            )
        }
    };
    if header.level != "storage" {
        return Err(Error::data(
            0,
            "level",
            format!(
                "trace level is {:?}; replay needs a \"storage\" trace (or an \"events\" one, see replay::events)",
                header.level
            ),
        )
        .in_file(&shown));
    }
    let config = sm.config().to_lmcache_json();
    let mut report = ReplayReport {
        trace: shown.clone(),
        level: header.level.clone(),
        pacing: options.pacing.describe(),
        digest: digest_report(&header.sm_config_json, &header.sm_config_digest, &config),
        config,
        trace_warnings: header_warnings.clone(),
        warnings: header_warnings,
        ..ReplayReport::default()
    };
    let client =
        client::resolve(source, options.read, &options.client).map_err(|e| e.in_file(&shown))?;
    sm.keep_journal();
    // A few kinds of call, each named by one of the decoder's constants: found by the
    // constant's address before its text (qualnames share their first 54 bytes, and a
    // sorted map compared them three times a call), sorted for the report at the end.
    let mut latencies: Vec<(&'static str, CallTimes)> = Vec::new();
    let mut dispatcher = Dispatcher::default();
    // The client model reads a loaded trace's lookups from its index while the replay sees
    // every record; a rank's share of the records is followed as it comes.
    let indexed = match &input {
        Input::Loaded(loaded) if options.rank.is_none() => Some(*loaded),
        _ => None,
    };
    let mut sessions = Sessions::new(
        &SessionModel {
            emulate: options.emulate_sessions,
            client,
        },
        indexed,
    );
    let mut fidelity = Fidelity::default();
    let mut spans = options
        .spans
        .clone()
        .map(|sink| RequestSpans::new(sink, header.t_wall_start));
    let mut absorb = |sm: &mut StorageManager, closed: Closed, report: &mut ReplayReport| {
        fidelity.add(sm, &closed);
        if fidelity.listed_all() {
            // Departures explain the listed divergences only; under churn the journal would
            // otherwise take a map insert for every key evicted or refused.
            sm.drop_journal();
        }
        if let Some(spans) = spans.as_mut() {
            spans.closed(&closed);
        }
        if let Closed::Retrieve(r) = closed {
            report.requests.push(r.outcome);
        }
    };
    let mut sharder = options.rank.as_ref().map(|(rank, mode)| {
        let mode = mode.unwrap_or(ShardMode::Replicate);
        Sharder::new(mode, rank.rank, rank.world_size)
    });
    let mut other_ranks = 0u64;
    let started_unix_s = crate::clock::wall_secs();
    let start = Instant::now();
    let mut origin: Option<f64> = None;
    let (mut first_t, mut last_t) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut object_bytes = None;
    let mut consume = |record: At<'_>, decoded: &std::result::Result<Call, Outcome>| {
        if crate::interrupt::requested().is_some() {
            report.interrupted = true;
            return Ok(false);
        }
        report.records += 1;
        if !record.t_mono.is_finite() {
            return Err(Error::data(
                record.offset,
                "t_mono",
                format!("{} is not a time", record.t_mono),
            ));
        }
        first_t = first_t.min(record.t_mono);
        last_t = last_t.max(record.t_mono);
        let base = match origin {
            Some(base) => base,
            None => {
                let base = if options.keep_startup_gap {
                    0.0
                } else {
                    record.t_mono
                };
                if let Pacing::Timed { speedup } = options.pacing {
                    sm.pace_io(start, base, speedup);
                }
                *origin.insert(base)
            }
        };
        if let Pacing::Timed { speedup } = options.pacing {
            let due = ((record.t_mono - base).max(0.0) / speedup.max(MIN_SPEEDUP)).min(1e9);
            // In slices, so that a signal is noticed within one.
            while let Some(wait) = Duration::from_secs_f64(due).checked_sub(start.elapsed()) {
                if crate::interrupt::requested().is_some() {
                    break;
                }
                std::thread::sleep(wait.min(Duration::from_millis(100)));
            }
        }
        if let Some(sharder) = sharder.as_mut() {
            let ours = match decoded {
                Ok(call) => sharder.owns(call),
                Err(_) => sharder.owns_undecoded(),
            };
            if !ours {
                other_ranks += 1;
                return Ok(true);
            }
        }
        let at = Position {
            record: report.records,
            offset: record.offset,
            t: record.t_mono,
        };
        let (outcome, latency_ms, qualname) = match decoded {
            Err(skip) => (skip.clone(), 0.0, ""),
            Ok(call) => {
                if object_bytes.is_none() {
                    object_bytes = match call {
                        Call::ReserveWrite { object_bytes, .. } => Some(*object_bytes),
                        Call::Prefetch { groups, .. } => groups.first().map(|g| g.object_bytes),
                        _ => None,
                    };
                }
                if let Some(closed) = sessions.before(sm, call, at) {
                    absorb(sm, closed, &mut report);
                }
                match sessions.rewrite(call) {
                    Rewrite::Drop => (
                        Outcome::Skipped {
                            reason: client::DROPPED.to_owned(),
                        },
                        0.0,
                        "",
                    ),
                    rewrite => {
                        let replaced = match rewrite {
                            Rewrite::Replace(other) => Some(other),
                            _ => None,
                        };
                        let applied = replaced.as_ref().unwrap_or(call);
                        sm.advance_to(record.t_mono);
                        let began = options.time_calls.then(Instant::now);
                        let (outcome, effect) =
                            dispatcher.apply(sm, &options.tracer, applied, record.args);
                        let latency_ms = began.map_or(0.0, |b| b.elapsed().as_secs_f64() * 1e3);
                        sessions.after(call, applied, &effect, at, latency_ms / 1e3);
                        (outcome, latency_ms, call.qualname())
                    }
                }
            }
        };
        match &outcome {
            Outcome::Ok { .. } | Outcome::Failed { .. } => {
                report.replayed += 1;
                let at = latencies
                    .iter()
                    .position(|(q, _)| std::ptr::eq(*q, qualname) || *q == qualname)
                    .unwrap_or_else(|| {
                        latencies.push((qualname, CallTimes::default()));
                        latencies.len() - 1
                    });
                let entry = &mut latencies[at].1;
                entry.calls += 1;
                if options.time_calls {
                    entry.ms.push(latency_ms);
                }
                if let Outcome::Failed { reason } = &outcome {
                    report.failed += 1;
                    entry.errors += 1;
                    count_failure(&mut report.failure_reasons, reason);
                }
            }
            Outcome::Skipped { reason } => {
                report.skipped += 1;
                add_reason(&mut report.skip_reasons, reason.clone(), 1, OTHER_SKIPS);
            }
        }
        on_record(&RecordEvent {
            index: report.records,
            offset: record.offset,
            qualname: record.qualname,
            outcome: &outcome,
            latency_ms,
            sm,
        });
        if let (true, Outcome::Failed { reason }) = (options.fail_fast, &outcome) {
            report.warnings.push(format!(
                "fail fast: stopped after record {} (byte {}), the first call that failed: {reason}",
                report.records, record.offset
            ));
            return Ok(false);
        }
        Ok(true)
    };
    type Consume<'c> = dyn FnMut(At<'_>, &std::result::Result<Call, Outcome>) -> Result<bool> + 'c;
    // The records decoded before, in order; where the consumer stopped, the read's summary
    // up to that record (as a read of the file that stopped there gives it).
    let from_memory = |loaded: &Loaded, consume: &mut Consume<'_>| -> Result<Option<ReadSummary>> {
        for (taken, r) in (1..).zip(&loaded.records) {
            let at = At {
                offset: r.offset,
                t_mono: r.t_mono,
                qualname: &r.qualname,
                args: &[],
            };
            if !consume(at, &r.call).map_err(|e| e.in_file(&shown))? {
                return Ok(Some(loaded.summary.stopped_at(r.offset, taken)));
            }
        }
        Ok(None)
    };
    let from_file = |reader: TraceReader, consume: &mut Consume<'_>| -> Result<ReadSummary> {
        read_ahead(
            reader,
            READ_AHEAD_BLOCK_BYTES,
            options.read.threads(),
            &Decoder::default,
            &|decoder, record| decoder.decode(record),
            &mut |record, decoded| {
                let at = At {
                    offset: record.offset,
                    t_mono: record.t_mono,
                    qualname: record.qualname,
                    args: record.args.bytes(),
                };
                consume(at, decoded)
            },
        )
        .map_err(|e| e.in_file(&shown))
    };
    let summary = match input {
        Input::Loaded(loaded) => {
            from_memory(loaded, &mut consume)?.unwrap_or_else(|| loaded.summary.clone())
        }
        Input::Reader(reader) => from_file(*reader, &mut consume)?,
        Input::AfterHead(head, reader) => match from_memory(head, &mut consume)? {
            None => from_file(*reader, &mut consume)?.following(&head.summary),
            Some(stopped) => stopped,
        },
    };
    if let Some(closed) = sessions.close(sm, f64::INFINITY) {
        absorb(sm, closed, &mut report);
    }
    if let Some(spans) = spans.as_mut() {
        spans.flush();
    }
    report.forced_exits = dispatcher.close_open_contexts(sm, &options.tracer);
    sm.drain_io();
    report.duration_s = start.elapsed().as_secs_f64();
    report.rank = options.rank.as_ref().map(|(rank, mode)| RankReport {
        rank: rank.clone(),
        shard: mode.map_or("own trace", ShardMode::name).to_owned(),
        records_of_other_ranks: other_ranks,
        started_unix_s,
        finished_unix_s: started_unix_s + report.duration_s,
    });
    latencies.sort_by_key(|&(qualname, _)| qualname);
    if options.time_calls {
        report.latency_histograms = latencies
            .iter()
            .map(|(q, times)| {
                let mut h = LatencyHistogram::new();
                times.ms.iter().for_each(|&v| h.record_ms(v));
                ((*q).to_owned(), h.encode())
            })
            .collect();
    }
    report.ops = latencies
        .into_iter()
        .map(|(q, times)| {
            let stats = match options.time_calls {
                true => OpStats::from_latencies(times.ms, times.errors),
                false => OpStats::untimed(times.calls, times.errors),
            };
            (q.to_owned(), stats)
        })
        .collect();
    report.hits = HitSummary::from_requests(&report.requests);
    report.calls = sm.call_stats();
    report.tiers = sm.tier_stats();
    report.tier_io = sm.tier_io();
    report.warnings.extend(io_warnings(&report.tier_io));
    report.fidelity = fidelity.report;
    report.client = sessions.client_report().clone();
    report.configuration = configuration(sm.config(), &header.sm_config_json, object_bytes);
    report.completions = sessions.completions;
    if let Some(w) = time_compressed(sm, first_t, last_t, &report.calls) {
        report.warnings.push(w);
    }
    let read = summary.warnings();
    report.warnings.extend(read.iter().cloned());
    report.trace_warnings.extend(read);
    Ok(report)
}

/// What asynchronous tier I/O did not do as the cache counted it: reads of objects the
/// backend no longer had, and calls the backend refused (the first one's error quoted).
fn io_warnings(tiers: &[TierIo]) -> Vec<String> {
    tiers
        .iter()
        .filter(|t| t.mode == "asynchronous")
        .filter_map(|t| {
            let c = &t.calls;
            let lost = (c.lost_reads > 0).then(|| {
                format!(
                    "{}: {} asynchronous reads found their object gone from the backend (counted as hits by the cache)",
                    t.name, c.lost_reads
                )
            });
            let failed = c.first_error.as_ref().map(|e| {
                format!(
                    "{}: asynchronous calls failed; the first: {}",
                    t.name,
                    kvtrace_report::terminal::escape_line(e)
                )
            });
            match (lost, failed) {
                (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                (a, b) => a.or(b),
            }
        })
        .collect()
}

/// The warning for a trace whose records are closer together than the server's eviction
/// passes, when that starved L1: written through LMCache's recorder API (or `kvtrace
/// generate`) rather than by a serving server, it spans too little trace time for periodic
/// eviction to run.
fn time_compressed(
    sm: &StorageManager,
    first: f64,
    last: f64,
    calls: &CallStats,
) -> Option<String> {
    let EvictionTiming::Periodic { interval_s, .. } = sm.config().eviction.timing else {
        return None;
    };
    let span = last - first;
    let short = span < 2.0 * interval_s;
    if calls.out_of_memory_calls == 0 || !short || calls.eviction_passes > 1 {
        return None;
    }
    Some(format!(
        "the trace spans {:.3} s of trace time, so LMCache's eviction controller (one pass every {} s) ran {} time(s) while {} reservation(s) failed with OUT_OF_MEMORY; \
         its records are closer together than a serving server's (written through the recorder API?): replay with immediate eviction timing to evict as allocations need room",
        span.max(0.0),
        error::short(interval_s),
        calls.eviction_passes,
        calls.out_of_memory_calls
    ))
}

/// The configuration replayed in words, beside the one `recorded_json` records.
fn configuration(
    replayed: &StorageConfig,
    recorded_json: &str,
    object_bytes: Option<u64>,
) -> Vec<ConfigLine> {
    let recorded = StorageConfig::recorded_in_words(recorded_json, object_bytes);
    replayed
        .in_words(object_bytes)
        .into_iter()
        .enumerate()
        .map(|(i, (what, replayed))| ConfigLine {
            what: what.to_owned(),
            replayed,
            recorded: recorded
                .as_ref()
                .and_then(|r| r.get(i))
                .map(|(_, w)| w.clone()),
        })
        .collect()
}
