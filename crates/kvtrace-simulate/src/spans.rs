//! The `request` span trees of a simulation (see [`crate::otel`]): each simulated request on
//! the simulated clock, its millisecond 0 put at the wall time the run began.
//!
//! The root carries LMCache's `hit_tokens` (the engine's prefix-cache hit, the largest over
//! the request's admissions), `requested_tokens` (its input) and `hit_rate`; the tier of the
//! hit is the engine's own KV cache (`kvtrace.hit_tier` `gpu`). Under it, the lookup at the
//! first admission is `mp.lookup_prefetch` (instantaneous on the simulated clock), and
//! kvtrace's phases `kvtrace.queue` (arrival to admission), `kvtrace.prefill` (admission to
//! first token) and `kvtrace.decode` (first to last token) show where the time went.
//! `kvtrace.worker` is the rank that served it (decode's, else prefill's), numbered as the
//! request lines number it: `worker × dp_size + rank`, the worker itself with one rank.

use crate::otel::{Attr, RequestSpan, Span};
use kvtrace_report::units::fraction;

use super::collector::RequestRecord;

/// The span tree of `r`, with simulated millisecond 0 at Unix time `wall_start`.
pub fn request_span(r: &RequestRecord, wall_start: f64) -> RequestSpan {
    let at = |ms: f64| wall_start + ms / 1e3;
    let arrival = at(r.arrival_time_ms);
    let end = r.terminal_time_ms.or(r.last_token_ms).map_or(arrival, at);
    let rate = fraction(u64::from(r.reused_input_tokens), u64::from(r.input_length));
    let hit = i64::from(r.reused_input_tokens);
    let requested = i64::from(r.input_length);
    let tier = if hit > 0 { "gpu" } else { "none" };
    let id = Attr::Str(format!("{}/{}", r.session_id, r.turn_index));
    let mut root = Span::new("request", arrival, end)
        .with("session_id", id.clone())
        .with("hit_tokens", Attr::Int(hit))
        .with("requested_tokens", Attr::Int(requested))
        .with("hit_rate", Attr::Float(rate))
        .with("kvtrace.hit_tier", Attr::Str(tier.into()))
        .with(
            "kvtrace.output_tokens",
            Attr::Int(i64::from(r.output_length)),
        );
    if let Some(worker) = r.decode_worker_idx.or(r.prefill_worker_idx) {
        root = root.with("kvtrace.worker", Attr::Int(i64::from(worker)));
    }
    let mut request = RequestSpan {
        root,
        children: Vec::new(),
    };
    if let Some(admit) = r.first_admit_ms.map(at) {
        request.push(Span::new("kvtrace.queue", arrival, admit));
        request.push(
            Span::new("mp.lookup_prefetch", admit, admit)
                .with("session_id", id)
                .with("hit_tokens", Attr::Int(hit))
                .with("requested_tokens", Attr::Int(requested)),
        );
        if let Some(first) = r.first_token_ms.map(at) {
            request.push(Span::new("kvtrace.prefill", admit, first));
            if let Some(last) = r.last_token_ms.map(at) {
                request.push(Span::new("kvtrace.decode", first, last));
            }
        }
    }
    request
}
