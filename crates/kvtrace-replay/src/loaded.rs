//! A storage trace decoded once and held in memory, for replaying it under many
//! configurations (a sweep's points, its model curves).
//!
//! A replay of a file decodes every record on a second thread; a sweep of 64 L1 sizes on two
//! cores would decode the same records 64 times over, and estimate the same eviction phase
//! and infer the same client 64 times. A [`Loaded`] trace is decoded once, its records kept
//! as the calls they decode to (key ids, not key bytes: about a seventh of the file for
//! LMCache's encoding), and the phase and the client inferred from it once, on first use.
//! What it does not keep is each record's argument bytes: a replay that republishes its calls
//! (a recorder on its tracer) reads the file instead.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use super::client::ClientInfo;
use super::dispatch::{Call, Decoder, Outcome};
use super::phase::PhaseReport;
use super::session::Position;
use crate::error::Result;
use crate::lmct::blocks::read_ahead;
use crate::lmct::{Header, ReadOptions, ReadSummary, TraceReader};
use crate::storage::{KeyId, PrefetchGroup};

/// One record as a replay needs it.
pub(crate) struct LoadedRecord {
    pub(crate) offset: u64,
    pub(crate) t_mono: f64,
    pub(crate) qualname: Arc<str>,
    pub(crate) call: std::result::Result<Call, Outcome>,
}

/// A trace's records, decoded.
pub struct Loaded {
    /// The path as given, for messages and reports.
    shown: String,
    header: Header,
    header_warnings: Vec<String>,
    pub(crate) records: Vec<LoadedRecord>,
    pub(crate) summary: ReadSummary,
    client: OnceLock<ClientInfo>,
    /// Phase estimates by what they were estimated from (the recorded configuration and the
    /// session model, in words): every point of a sweep asks for the same one.
    phases: Mutex<HashMap<String, PhaseReport>>,
}

/// Bytes a decoded call holds besides its record: its key ids and its groups.
fn call_bytes(call: &Call) -> usize {
    let groups = match call {
        Call::Prefetch { groups, .. } => groups.len() * std::mem::size_of::<PrefetchGroup>(),
        _ => 0,
    };
    groups + call.keys().count() * std::mem::size_of::<KeyId>()
}

/// What a load does after a record.
enum Next {
    More,
    /// Enough: keep what was read.
    Done,
    /// Give up: [`Loaded::load`] gives `None`.
    Abandon,
}

impl Loaded {
    /// Decodes the whole of `path`, or gives `None` as soon as the decoded records would hold
    /// more than `budget_bytes` (the caller then replays the file as usual) or a signal asks
    /// to stop.
    pub fn load(path: &Path, read: ReadOptions, budget_bytes: usize) -> Result<Option<Loaded>> {
        let (loaded, abandoned) = Loaded::load_while(path, read, |held, _| {
            match held > budget_bytes || crate::interrupt::requested().is_some() {
                true => Next::Abandon,
                false => Next::More,
            }
        })?;
        Ok((!abandoned).then_some(loaded))
    }

    /// The head of `path`: its records up to the one that makes `calls` decoded calls, all of
    /// a shorter trace. What the client inference and the phase estimate read, decoded once
    /// for both by a plan.
    pub(crate) fn load_head(path: &Path, read: ReadOptions, calls: usize) -> Result<Loaded> {
        let (head, _) = Loaded::load_while(path, read, |_, decoded| match decoded >= calls {
            true => Next::Done,
            false => Next::More,
        })?;
        Ok(head)
    }

    /// Reads records until `next(bytes held, calls decoded)` says to stop; whether it gave up.
    fn load_while(
        path: &Path,
        read: ReadOptions,
        mut next: impl FnMut(usize, usize) -> Next,
    ) -> Result<(Loaded, bool)> {
        let shown = path.display().to_string();
        let reader = TraceReader::open(path, read).map_err(|e| e.in_file(&shown))?;
        let header = reader.header().clone();
        let header_warnings = reader.header_warnings();
        let mut records = Vec::new();
        let mut names: Vec<Arc<str>> = Vec::new();
        let (mut held, mut calls) = (0usize, 0usize);
        let mut abandoned = false;
        let mut decoder = Decoder::default();
        let summary = read_ahead(
            reader,
            super::READ_AHEAD_BLOCK_BYTES,
            &mut |record| Some(decoder.decode(record)),
            &mut |record, decoded| {
                let Some(call) = decoded.take() else {
                    return Ok(true);
                };
                held += std::mem::size_of::<LoadedRecord>() + call.as_ref().map_or(0, call_bytes);
                calls += usize::from(call.is_ok());
                let next = next(held, calls);
                if let Next::Abandon = next {
                    abandoned = true;
                    return Ok(false);
                }
                let qualname = match names.iter().find(|n| ***n == *record.qualname) {
                    Some(n) => n.clone(),
                    None => {
                        names.push(Arc::from(record.qualname));
                        names[names.len() - 1].clone()
                    }
                };
                records.push(LoadedRecord {
                    offset: record.offset,
                    t_mono: record.t_mono,
                    qualname,
                    call,
                });
                Ok(matches!(next, Next::More))
            },
        )
        .map_err(|e| e.in_file(&shown))?;
        let loaded = Loaded {
            shown,
            header,
            header_warnings,
            records,
            summary,
            client: OnceLock::new(),
            phases: Mutex::new(HashMap::new()),
        };
        Ok((loaded, abandoned))
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn header_warnings(&self) -> Vec<String> {
        self.header_warnings.clone()
    }

    /// Records decoded (undecodable frames, counted in the read summary, are not records).
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Every decoded call, with its record's byte offset.
    pub fn calls(&self) -> impl Iterator<Item = (u64, &Call)> {
        self.records
            .iter()
            .filter_map(|r| Some((r.offset, r.call.as_ref().ok()?)))
    }

    /// The calls of the head of the trace: at most `records` records, of which at most
    /// `calls` decoded, each with where it is.
    pub(crate) fn head(&self, records: usize, calls: usize) -> Vec<(Position, Call)> {
        self.records
            .iter()
            .take(records)
            .enumerate()
            .filter_map(|(i, r)| {
                let call = r.call.as_ref().ok()?;
                let at = Position {
                    record: i as u64 + 1,
                    offset: r.offset,
                    t: r.t_mono,
                };
                Some((at, call.clone()))
            })
            .take(calls)
            .collect()
    }

    /// The client inferred from the head, inferring it on first use.
    pub(crate) fn client(&self, infer: impl FnOnce() -> ClientInfo) -> ClientInfo {
        self.client.get_or_init(infer).clone()
    }

    /// The phase estimated from `inputs` (in words), estimating it on first use; callers
    /// asking for the same one meanwhile wait for it rather than estimate it again.
    pub(crate) fn phase(
        &self,
        inputs: String,
        estimate: impl FnOnce() -> Result<PhaseReport>,
    ) -> Result<PhaseReport> {
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = phases.get(&inputs) {
            return Ok(known.clone());
        }
        let report = estimate()?;
        phases.insert(inputs, report.clone());
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn churn() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/lmcache/churn/lru_seed1.lct")
    }

    #[test]
    fn a_load_holds_every_record_or_none_past_its_budget() {
        let read = ReadOptions::default();
        let all = Loaded::load(&churn(), read, usize::MAX)
            .unwrap()
            .expect("within budget");
        // Counted independently: every record the reader hands out, in order.
        let mut reader = TraceReader::open(&churn(), read).unwrap();
        let mut offsets = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            offsets.push(record.offset);
        }
        assert!(offsets.len() > 100, "{}", offsets.len());
        let loaded: Vec<u64> = all.records.iter().map(|r| r.offset).collect();
        assert_eq!(loaded, offsets);
        assert!(Loaded::load(&churn(), read, 1000).unwrap().is_none());
        let head = Loaded::load_head(&churn(), read, 10).unwrap();
        let calls = head.records.iter().filter(|r| r.call.is_ok()).count();
        assert_eq!(calls, 10);
        assert_eq!(head.head(usize::MAX, 10), all.head(usize::MAX, 10));
    }
}
