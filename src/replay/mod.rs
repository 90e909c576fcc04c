//! Replays a storage trace against a StorageManager: real time, sped up, or as fast as
//! possible.
//!
//! As fast as possible (the default) is deterministic — calls apply in file order on the
//! trace's own clock, so the same trace and configuration give identical counters and hits on
//! every run. Paced replays sleep to each record's time and are as deterministic in their
//! counters (the manager runs on trace time), only their latencies are live measurements.
//! The start-up gap before the first record is skipped unless asked for.

pub mod client;
pub mod diff;
pub mod dispatch;
pub mod events;
pub mod fidelity;
pub mod phase;
pub mod plan;
pub mod report;
pub mod session;
pub mod shard;
pub mod spans;
pub mod spool;
pub mod terminal;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::bus::Tracer;
use crate::error::{Error, Result};
use crate::lmct::blocks::read_ahead;
use crate::lmct::digest::{compare_configs, config_digest, python_json, DigestMatch};
use crate::lmct::{ReadOptions, RecordRef, TraceReader};
use crate::rank::Rank;
use crate::report::histogram::LatencyHistogram;
use crate::storage::config::{EvictionTiming, StorageConfig};
use crate::storage::{CallStats, StorageManager};
use client::{ClientChoice, Rewrite};
use dispatch::{Call, Decoder, Dispatcher, Outcome};
use fidelity::Fidelity;
use report::{ConfigLine, DigestReport, HitSummary, OpStats, RankReport, ReplayReport};
use session::{Closed, Position, SessionModel, Sessions};
use shard::{ShardMode, Sharder};
use spans::RequestSpans;

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
        }
    }
}

/// One replayed record, for per-record output (`--verbose`, `--jsonl-out`).
pub struct RecordEvent<'a> {
    /// 1-based.
    pub index: u64,
    pub record: &'a RecordRef<'a>,
    pub outcome: &'a Outcome,
    pub latency_ms: f64,
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
/// on a second thread, ahead of the calls.
pub fn replay(
    path: &Path,
    sm: &mut StorageManager,
    options: &ReplayOptions,
    mut on_record: impl FnMut(&RecordEvent<'_>),
) -> Result<ReplayReport> {
    let shown = path.display().to_string();
    let reader = TraceReader::open(path, options.read).map_err(|e| e.in_file(&shown))?;
    let header = reader.header().clone();
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
        warnings: reader.header_warnings(),
        ..ReplayReport::default()
    };
    let client =
        client::resolve(path, options.read, &options.client).map_err(|e| e.in_file(&shown))?;
    sm.keep_journal();
    let mut latencies: BTreeMap<&'static str, (Vec<f64>, u64)> = BTreeMap::new();
    let mut dispatcher = Dispatcher::default();
    let mut sessions = Sessions::new(&SessionModel {
        emulate: options.emulate_sessions,
        client,
    });
    let mut fidelity = Fidelity::default();
    let mut spans = options
        .spans
        .clone()
        .map(|sink| RequestSpans::new(sink, header.t_wall_start));
    let mut absorb = |sm: &StorageManager, closed: Closed, report: &mut ReplayReport| {
        fidelity.add(sm, &closed);
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
    let mut decoder = Decoder::default();
    let mut object_bytes = None;
    let mut consume = |record: &RecordRef<'_>, decoded: &mut std::result::Result<Call, Outcome>| {
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
        let base = *origin.get_or_insert(if options.keep_startup_gap {
            0.0
        } else {
            record.t_mono
        });
        if let Pacing::Timed { speedup } = options.pacing {
            let due = ((record.t_mono - base).max(0.0) / speedup.max(1e-9)).min(1e9);
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
                        let began = Instant::now();
                        let (outcome, effect) =
                            dispatcher.apply(sm, &options.tracer, applied, record.args.bytes());
                        let latency_ms = began.elapsed().as_secs_f64() * 1e3;
                        sessions.after(call, applied, &effect, at, latency_ms / 1e3);
                        (outcome, latency_ms, call.qualname())
                    }
                }
            }
        };
        match &outcome {
            Outcome::Ok { .. } | Outcome::Failed { .. } => {
                report.replayed += 1;
                let entry = latencies.entry(qualname).or_default();
                entry.0.push(latency_ms);
                if let Outcome::Failed { reason } = &outcome {
                    report.failed += 1;
                    entry.1 += 1;
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
            record,
            outcome: &outcome,
            latency_ms,
        });
        if let (true, Outcome::Failed { reason }) = (options.fail_fast, &outcome) {
            report.warnings.push(format!(
                "--fail-fast: stopped after record {} (byte {}), the first call that failed: {reason}",
                report.records, record.offset
            ));
            return Ok(false);
        }
        Ok(true)
    };
    let summary = read_ahead(
        reader,
        READ_AHEAD_BLOCK_BYTES,
        &mut |record| decoder.decode(record),
        &mut consume,
    )
    .map_err(|e| e.in_file(&shown))?;
    if let Some(closed) = sessions.close(sm, f64::INFINITY) {
        absorb(sm, closed, &mut report);
    }
    if let Some(spans) = spans.as_mut() {
        spans.flush();
    }
    report.forced_exits = dispatcher.close_open_contexts(sm, &options.tracer);
    report.duration_s = start.elapsed().as_secs_f64();
    report.rank = options.rank.as_ref().map(|(rank, mode)| RankReport {
        rank: rank.clone(),
        shard: mode.map_or("own trace", ShardMode::name).to_owned(),
        records_of_other_ranks: other_ranks,
        started_unix_s,
        finished_unix_s: started_unix_s + report.duration_s,
    });
    report.latency_histograms = latencies
        .iter()
        .map(|(q, (ms, _))| {
            let mut h = LatencyHistogram::new();
            ms.iter().for_each(|&v| h.record_ms(v));
            ((*q).to_owned(), h.encode())
        })
        .collect();
    report.ops = latencies
        .into_iter()
        .map(|(q, (ms, errors))| (q.to_owned(), OpStats::from_latencies(ms, errors)))
        .collect();
    report.hits = HitSummary::from_requests(&report.requests);
    report.calls = sm.call_stats();
    report.tiers = sm.tier_stats();
    report.tier_io = sm.tier_io();
    report.fidelity = fidelity.report;
    report.client = sessions.client_report().clone();
    report.configuration = configuration(sm.config(), &header.sm_config_json, object_bytes);
    report.completions = sessions.completions;
    if let Some(w) = time_compressed(sm, first_t, last_t, &report.calls) {
        report.warnings.push(w);
    }
    report.warnings.extend(summary.warnings());
    Ok(report)
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
        "the trace spans {:.3} s of trace time, so LMCache's eviction controller (one pass every {interval_s} s) ran {} time(s) while {} reservation(s) failed with OUT_OF_MEMORY; \
         its records are closer together than a serving server's (written through the recorder API?): replay with --eviction-timing immediate to evict as allocations need room",
        span.max(0.0),
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

/// How many failure kinds, and how many skip reasons, a report counts apart; the rest are
/// counted together under [`OTHER_FAILURES`] or [`OTHER_SKIPS`], so neither a tier that names
/// every key in its errors nor a trace of a million made-up qualnames can grow the report.
pub const MAX_REASON_KINDS: usize = 32;

/// The kind under which failures past [`MAX_REASON_KINDS`] are counted.
pub const OTHER_FAILURES: &str = "other failures";

/// The reason under which skipped records past [`MAX_REASON_KINDS`] are counted.
pub const OTHER_SKIPS: &str = "other reasons";

/// Counts one failure under its kind. (One call adds one: the count of a run's calls cannot
/// reach `u64::MAX`, so the overflow [`add_failures`] reports cannot happen here.)
pub fn count_failure(reasons: &mut BTreeMap<String, u64>, reason: &str) {
    add_failures(reasons, failure_kind(reason), 1);
}

/// Adds `n` failures of `kind`, keeping at most [`MAX_REASON_KINDS`] kinds apart; the new
/// count, or `None` (nothing added) where it would pass `u64::MAX`.
pub fn add_failures(reasons: &mut BTreeMap<String, u64>, kind: String, n: u64) -> Option<u64> {
    add_reason(reasons, kind, n, OTHER_FAILURES)
}

/// The longest reason kept whole; a longer one (a qualname of a hostile trace can be
/// megabytes) is cut there and ends in `…`.
pub const MAX_REASON_BYTES: usize = 512;

/// Adds `n` under `reason`, or under `other` once [`MAX_REASON_KINDS`] reasons are counted
/// apart; the new count, or `None` (nothing added) where it would pass `u64::MAX`.
fn add_reason(
    reasons: &mut BTreeMap<String, u64>,
    mut reason: String,
    n: u64,
    other: &str,
) -> Option<u64> {
    if reason.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    let reason = if reasons.contains_key(&reason) || reasons.len() < MAX_REASON_KINDS {
        reason
    } else {
        other.to_owned()
    };
    let count = reasons.entry(reason).or_default();
    *count = count.checked_add(n)?;
    Some(*count)
}

/// The failure kinds as one line: `3 × why; 1 × why`.
pub fn failure_summary(reasons: &BTreeMap<String, u64>) -> String {
    reasons
        .iter()
        .map(|(reason, n)| format!("{n} × {reason}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The failure's kind: its whole text (which tier, what and why) with what differs from call
/// to call replaced: a count standing alone becomes `N`, a run of 16 or more hex digits (a
/// key, or the file named after one) becomes `KEY`. Addresses such as `127.0.0.1:7000` stay.
pub fn failure_kind(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(512));
    let mut rest = reason;
    while let Some(c) = rest.chars().next() {
        let word = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        if word == 0 {
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let (token, tail) = rest.split_at(word);
        let before = out.chars().last();
        let after = tail.chars().next();
        // Part of an address: `10.0.0.1`, `:7000`.
        let glued = matches!(before, Some('.' | ':')) || after == Some('.');
        if token.len() >= 16 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
            // The file tier's fan-out directory, `/ab/` before `ab…` (`/N/` once its digits
            // were replaced), varies with the key too.
            if let Some(parent) = out.strip_suffix('/') {
                if let Some((up, dir)) = parent.rsplit_once('/') {
                    let hex = dir.len() == 2 && dir.bytes().all(|b| b.is_ascii_hexdigit());
                    if hex || dir == "N" {
                        out.truncate(up.len() + 1);
                    }
                }
            }
            out.push_str("KEY");
        } else if token.bytes().all(|b| b.is_ascii_digit()) && !glued {
            out.push('N');
        } else {
            out.push_str(token);
        }
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_kind_keeps_the_tier_and_the_why_and_drops_what_varies_per_call() {
        let cluster = "tier I/O failed: resp-cluster 127.0.0.1:7000,127.0.0.1:7001: SET of 12 object(s): Connection refused (os error 111)";
        assert_eq!(
            failure_kind(cluster),
            "tier I/O failed: resp-cluster 127.0.0.1:7000,127.0.0.1:7001: SET of N object(s): Connection refused (os error N)"
        );
        for fan_out in ["3f", "12"] {
            let file = format!("tier I/O failed: /data/kv/{fan_out}/{fan_out}00aa11223344556677889900aabbcc.kv: No space left on device (os error 28)");
            assert_eq!(
                failure_kind(&file),
                "tier I/O failed: /data/kv/KEY.kv: No space left on device (os error N)"
            );
        }
        let redis = "tier I/O failed: redis GET kv:0000000000000000000000000000002a: timed out";
        assert_eq!(
            failure_kind(redis),
            "tier I/O failed: redis GET kv:KEY: timed out"
        );
        assert_eq!(failure_kind("ünïcode 7: x"), "ünïcode N: x");
    }

    #[test]
    fn failure_kinds_past_the_cap_are_counted_together() {
        let mut reasons = BTreeMap::new();
        for i in 0..MAX_REASON_KINDS + 5 {
            count_failure(&mut reasons, &format!("tier{i}x: refused"));
        }
        count_failure(&mut reasons, "tier0x: refused");
        assert_eq!(reasons.len(), MAX_REASON_KINDS + 1);
        assert_eq!(reasons[OTHER_FAILURES], 5);
        assert_eq!(reasons["tier0x: refused"], 2);
        let mut skips = BTreeMap::new();
        let long = "é".repeat(MAX_REASON_BYTES);
        add_reason(&mut skips, long.clone(), 1, OTHER_SKIPS);
        add_reason(&mut skips, long, 1, OTHER_SKIPS);
        let (kept, n) = skips.iter().next().expect("one");
        assert_eq!((kept.chars().count(), *n), (MAX_REASON_BYTES / 2 + 1, 2));
        assert!(kept.ends_with('…'));
    }
}
