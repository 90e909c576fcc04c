//! The `request` span trees of a replay: each retrieve session with the store session that
//! follows it for the same keys, on the replayed clock mapped onto wall time.
//!
//! An LMCache server opens one root span per client session and nests the lookup, the read
//! and the store of that request under it; a store without a lookup (a request that never
//! asked) gets a root of its own, as LMCache creates one on the store's start. A child starts
//! at its record's trace time and lasts the replay's measured latency of its calls; trace
//! time `t` — seconds since the recorder started (`t_mono`, LMCT.md §5) — is wall time
//! `t_wall_start + t`, so a replayed span lies where the live server's span of the same
//! request lay.

use std::sync::Arc;

use crate::otel::{Attr, RequestSpan, Span, SpanSink};
use kvtrace_report::units::fraction;

use super::session::{Closed, Retrieve, Store};

pub struct RequestSpans {
    sink: Arc<dyn SpanSink>,
    /// Wall time at trace time 0.
    offset: f64,
    /// The last retrieve, waiting for its request's store.
    open: Option<(RequestSpan, Option<crate::storage::KeyId>)>,
}

impl RequestSpans {
    /// Spans on the recording's wall clock, which read `t_wall_start` when trace time was 0.
    pub fn new(sink: Arc<dyn SpanSink>, t_wall_start: f64) -> RequestSpans {
        RequestSpans {
            sink,
            offset: if t_wall_start.is_finite() {
                t_wall_start
            } else {
                0.0
            },
            open: None,
        }
    }

    pub fn closed(&mut self, closed: &Closed) {
        match closed {
            Closed::Retrieve(r) => {
                self.flush();
                self.open = Some((self.retrieve(r), r.keys.first().copied()));
            }
            Closed::Store(s) => {
                let first = s.keys.first().copied();
                let store = self.store(s);
                match self.open.take() {
                    Some((mut request, key)) if key.is_some() && key == first => {
                        request.push(store);
                        self.sink.request(request);
                    }
                    other => {
                        self.open = other;
                        self.flush();
                        let mut request = RequestSpan {
                            root: Span::new("request", store.start_s, store.end_s),
                            children: Vec::new(),
                        };
                        request.push(store);
                        self.sink.request(request);
                    }
                }
            }
        }
    }

    /// Sends the request still waiting for a store.
    pub fn flush(&mut self) {
        if let Some((request, _)) = self.open.take() {
            self.sink.request(request);
        }
    }

    fn wall(&self, t: f64) -> f64 {
        self.offset + t
    }

    fn retrieve(&self, r: &Retrieve) -> RequestSpan {
        let o = &r.outcome;
        let tokens = o.chunk_tokens.unwrap_or(0);
        let requested = o.requested_chunks * tokens;
        let rate = |hit: u64| fraction(hit * tokens, requested);
        let tier = match (o.l1_hit_chunks > 0, o.l2_hit_chunks > 0) {
            (false, false) => "none",
            (true, false) => "l1",
            (false, true) => "l2",
            (true, true) => "l1+l2",
        };
        let start = self.wall(r.at.t);
        let id = Attr::Str(o.external_request_id.clone());
        let mut root = Span::new("request", start, start)
            .with("session_id", id.clone())
            .with("hit_tokens", int(o.hit_chunks * tokens))
            .with("requested_tokens", int(requested))
            .with("hit_rate", Attr::Float(rate(o.hit_chunks)))
            .with("l1_hit_tokens", int(o.l1_hit_chunks * tokens))
            .with("l2_hit_tokens", int(o.l2_hit_chunks * tokens))
            .with("l1_hit_rate", Attr::Float(rate(o.l1_hit_chunks)))
            .with("l2_hit_rate", Attr::Float(rate(o.l2_hit_chunks)))
            .with("l1_hit_keys", int(o.l1_hit_chunks))
            .with("l2_hit_keys", int(o.l2_hit_chunks))
            .with("kvtrace.hit_tier", Attr::Str(tier.into()))
            .with("kvtrace.requested_chunks", int(o.requested_chunks))
            .with("kvtrace.hit_chunks", int(o.hit_chunks));
        if let Some(recorded) = o.recorded_hit_chunks {
            root = root.with("kvtrace.recorded_hit_chunks", int(recorded));
        }
        let mut request = RequestSpan {
            root,
            children: Vec::new(),
        };
        request.push(
            Span::new("mp.lookup_prefetch", start, self.wall(r.lookup_end))
                .with("session_id", id.clone())
                .with("hit_tokens", int(o.hit_chunks * tokens))
                .with("requested_tokens", int(requested)),
        );
        if let Some((from, to)) = r.read {
            request.push(
                Span::new("mp.retrieve", self.wall(from), self.wall(to))
                    .with("session_id", id)
                    .with("kvtrace.keys", int(o.hit_chunks)),
            );
        }
        request
    }

    fn store(&self, s: &Store) -> Span {
        Span::new("mp.store", self.wall(s.at.t), self.wall(s.end))
            .with("kvtrace.keys", int(s.keys.len() as u64))
            .with("kvtrace.reserved_keys", int(s.replayed.len() as u64))
    }
}

fn int(n: u64) -> Attr {
    Attr::Int(i64::try_from(n).unwrap_or(i64::MAX))
}
