//! Recorded versus replayed, request by request.
//!
//! A storage trace records what the server's client got: a retrieve's read names the chunks
//! that hit (no read when nothing did), and a store's `finish_write` names the keys the server
//! reserved (none after an OUT_OF_MEMORY). Replay compares that with what its own
//! StorageManager did for the same session. With the recorded configuration the share of
//! matching requests is the replay's fidelity; with another configuration every difference
//! is an answer to "what would have changed", and the first ones come with a reason.

use serde::Serialize;

use crate::storage::{Departure, KeyId, KeyMap, StorageManager};

use super::session::{membership, Closed, Retrieve, Store};

/// How many divergences the report lists in full (all are counted).
pub const LISTED_DIVERGENCES: usize = 20;

/// One request or store whose replay differs from its recording.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Divergence {
    /// 1-based record number of the session's first call, and its frame's byte offset.
    pub record: u64,
    pub offset: u64,
    pub t_mono: f64,
    /// `retrieve` or `store`.
    pub kind: &'static str,
    /// The external request id of a retrieve; empty for a store.
    pub request_id: String,
    /// Chunks hit (retrieve) or keys reserved (store), recorded and replayed.
    pub recorded: u64,
    pub replayed: u64,
    /// The first chunk index whose fate differs, for a retrieve.
    pub chunk: Option<u64>,
    pub reason: String,
}

/// The comparison, summed over the trace.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FidelityReport {
    pub requests: u64,
    pub requests_matching: u64,
    pub recorded_hit_chunks: u64,
    pub replayed_hit_chunks: u64,
    pub replayed_l1_hit_chunks: u64,
    pub replayed_l2_hit_chunks: u64,
    pub stores: u64,
    pub stores_matching: u64,
    pub recorded_reserved_keys: u64,
    pub replayed_reserved_keys: u64,
    /// Requests and stores that differ.
    pub divergences: u64,
    pub first_divergences: Vec<Divergence>,
}

impl FidelityReport {
    /// Share of requests whose hits match the recording (1 when there are none).
    pub fn request_match_rate(&self) -> f64 {
        if self.requests == 0 {
            1.0
        } else {
            self.requests_matching as f64 / self.requests as f64
        }
    }

    pub fn exact(&self) -> bool {
        self.divergences == 0
    }
}

/// Builds the report from closed sessions.
#[derive(Default)]
pub struct Fidelity {
    pub report: FidelityReport,
    /// Keys whose recorded store was not admitted (the server could not reserve them), with
    /// the time of that store.
    refused_on_server: KeyMap<f64>,
}

impl Fidelity {
    pub fn add(&mut self, sm: &StorageManager, closed: &Closed) {
        match closed {
            Closed::Retrieve(r) => self.retrieve(sm, r),
            Closed::Store(s) => self.store(s),
        }
    }

    /// Whether every further divergence is only counted: its reason is no longer needed, nor
    /// what reasons are found from (the manager's journal of departures, the server's refused
    /// keys).
    pub fn listed_all(&self) -> bool {
        self.report.first_divergences.len() >= LISTED_DIVERGENCES
    }

    fn retrieve(&mut self, sm: &StorageManager, r: &Retrieve) {
        let o = &r.outcome;
        let recorded = o.recorded_hit_chunks.unwrap_or(0);
        let rep = &mut self.report;
        rep.requests += 1;
        rep.recorded_hit_chunks += recorded;
        rep.replayed_hit_chunks += o.hit_chunks;
        rep.replayed_l1_hit_chunks += o.l1_hit_chunks;
        rep.replayed_l2_hit_chunks += o.l2_hit_chunks;
        if recorded == o.hit_chunks {
            rep.requests_matching += 1;
            return;
        }
        let chunk = recorded.min(o.hit_chunks);
        if self.listed_all() {
            self.report.divergences += 1;
            return;
        }
        let key = r.keys.get(chunk as usize).copied();
        let reason = match key {
            None => "the request has fewer chunks than were hit".to_string(),
            Some(key) if o.hit_chunks < recorded => self.replay_miss(sm, key),
            Some(key) => self.recorded_miss(key),
        };
        self.diverge(Divergence {
            record: r.at.record,
            offset: r.at.offset,
            t_mono: r.at.t,
            kind: "retrieve",
            request_id: o.external_request_id.clone(),
            recorded,
            replayed: o.hit_chunks,
            chunk: Some(chunk),
            reason,
        });
    }

    /// Why the replay missed a chunk the recording hit.
    fn replay_miss(&self, sm: &StorageManager, key: KeyId) -> String {
        match sm.departure(key) {
            Some((t, Departure::Evicted)) => {
                format!("evicted earlier: the replay evicted it at t={t:.3}s, the server kept it")
            }
            Some((t, Departure::Refused)) => format!(
                "allocation refused: the replay's reserve_write of it hit OUT_OF_MEMORY at t={t:.3}s"
            ),
            Some((t, Departure::Dropped)) => {
                format!("dropped at t={t:.3}s: an L2 load released by its reader, or skip_l1")
            }
            None if sm.has_l2() => "not in L2: never stored in the replay".to_string(),
            None => "never stored in the replay".to_string(),
        }
    }

    /// Why the recording missed a chunk the replay hit.
    fn recorded_miss(&self, key: KeyId) -> String {
        match self.refused_on_server.get(&key) {
            Some(t) => format!(
                "allocation refused on the server: its store at t={t:.3}s was not admitted there"
            ),
            None => "evicted later: the server no longer had it, the replay still does".into(),
        }
    }

    fn store(&mut self, s: &Store) {
        if !self.listed_all() {
            for (key, _) in membership(&s.keys, &s.recorded).filter(|&(_, admitted)| !admitted) {
                self.refused_on_server.insert(key, s.at.t);
            }
            for key in &s.recorded {
                self.refused_on_server.remove(key);
            }
        }
        let (recorded, replayed) = (s.recorded.len() as u64, s.replayed.len() as u64);
        let rep = &mut self.report;
        rep.stores += 1;
        rep.recorded_reserved_keys += recorded;
        rep.replayed_reserved_keys += replayed;
        let same =
            recorded == replayed && membership(&s.recorded, &s.replayed).all(|(_, held)| held);
        if same {
            rep.stores_matching += 1;
            return;
        }
        let reason = if replayed < recorded {
            "allocation refused: the replay could not reserve what the server did"
        } else {
            "allocation refused on the server: the replay reserved what the server could not"
        };
        self.diverge(Divergence {
            record: s.at.record,
            offset: s.at.offset,
            t_mono: s.at.t,
            kind: "store",
            request_id: String::new(),
            recorded,
            replayed,
            chunk: None,
            reason: reason.into(),
        });
    }

    fn diverge(&mut self, d: Divergence) {
        self.report.divergences += 1;
        if !self.listed_all() {
            self.report.first_divergences.push(d);
            if self.listed_all() {
                self.refused_on_server = KeyMap::default();
            }
        }
    }
}
