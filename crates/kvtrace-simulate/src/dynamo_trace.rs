//! Dynamo's own request traces (`dynamo`, schema `dynamo.request.trace.v1`): the JSONL records
//! a Dynamo frontend writes, possibly split across several files. Each `request_end` record
//! (bare, or under an `event` envelope) carries the request's id, when it was received and
//! how long it took, its output tokens, and under `request.replay` the prompt's
//! `input_sequence_hashes` at the embedded `trace_block_size`. `request_payload` and
//! `tool_start` records are skipped. Requests arrive in the order they were received (ties by
//! end, then id), the first at time 0, each a session of its own.
//!
//! Records with an `agent_context` describe an agentic trace (sessions, sub-agents, tools);
//! those are refused for now: lower them to `agentic_mooncake` first.

use std::collections::HashSet;
use std::io::BufRead;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::mooncake::{for_each_object, Interner, Row};
use crate::workload::{Session, Workload};

/// The schema every record names.
pub const SCHEMA: &str = "dynamo.request.trace.v1";

struct Entry {
    start_ms: u64,
    end_ms: u64,
    request_id: String,
    input_length: u64,
    output_tokens: u64,
    hashes: Vec<u64>,
    /// The file and line, for errors found once every file is read.
    at: (usize, u64),
}

/// Reads the records of every source (a name for errors, and its text) as one trace. The
/// block size is the records' own; `block_size`, when given, must equal it.
pub fn read_dynamo_request_trace<R: BufRead + Send>(
    sources: Vec<(String, R)>,
    block_size: Option<u32>,
) -> Result<Workload> {
    let mut entries = Vec::new();
    let mut ids: HashSet<String> = HashSet::new();
    let mut block: Option<(u64, usize, u64)> = None;
    let names: Vec<String> = sources.iter().map(|(n, _)| n.clone()).collect();
    for (file, (name, src)) in sources.into_iter().enumerate() {
        for_each_object(src, |line, json| {
            let Some(entry) = parse_record(&json, line, file)? else {
                return Ok(());
            };
            let size = json_block(&json);
            match block {
                None => block = Some((size, file, line)),
                Some((first, at_file, at_line)) if first != size => {
                    return Err(Error::line(
                        line,
                        "request.replay.trace_block_size",
                        format!(
                            "{size}, but {}:{at_line} says {first}: one trace has one block size",
                            names[at_file]
                        ),
                    ))
                }
                Some(_) => {}
            }
            if !ids.insert(entry.request_id.clone()) {
                return Err(Error::line(
                    line,
                    "request.request_id",
                    format!("{:?} ends twice", entry.request_id),
                ));
            }
            entries.push(entry);
            Ok(())
        })
        .map_err(|e| e.in_file(&name))?;
    }
    let Some((size, _, _)) = block else {
        let name = names.join(", ");
        return Err(Error::line(1, "event_type", "no request_end record").in_file(name));
    };
    let size = u32::try_from(size).unwrap_or(u32::MAX);
    if let Some(given) = block_size.filter(|&b| b != size) {
        return Err(Error::usage(format!(
            "--trace-block-size {given} does not match the trace's own trace_block_size {size}"
        )));
    }
    entries.sort_by(|a, b| {
        (a.start_ms, a.end_ms)
            .cmp(&(b.start_ms, b.end_ms))
            .then_with(|| a.request_id.cmp(&b.request_id))
    });
    let origin = entries.first().map_or(0, |e| e.start_ms);
    let mut interner = Interner::default();
    let mut sessions = Vec::with_capacity(entries.len());
    for e in entries {
        let (file, line) = e.at;
        let row = Row {
            timestamp: Some((e.start_ms - origin) as f64),
            input_length: Some(e.input_length),
            output_length: e.output_tokens,
            hash_ids: e.hashes,
            session_id: None,
            delay: None,
            request_id: Some(e.request_id),
            ..Row::default()
        };
        let turn = row
            .turn(line, size, &mut interner)
            .map_err(|err| err.in_file(&names[file]))?;
        sessions.push(Session {
            id: None,
            start_ms: row.timestamp.unwrap_or(0.0),
            turns: vec![turn],
        });
    }
    Ok(Workload {
        sessions,
        graph: None,
        planned_outputs: true,
    })
}

fn json_block(json: &Json) -> u64 {
    record(json)
        .pointer("/request/replay/trace_block_size")
        .and_then(Json::as_u64)
        .unwrap_or(0)
}

/// The record itself, inside its `event` envelope when it has one.
fn record(json: &Json) -> &Json {
    json.get("event").filter(|e| e.is_object()).unwrap_or(json)
}

fn parse_record(json: &Json, line: u64, file: usize) -> Result<Option<Entry>> {
    if !json.is_object() {
        return Err(Error::line(
            line,
            "json",
            "expected one JSON object per line",
        ));
    }
    let r = record(json);
    let event_type = r
        .get("event_type")
        .or_else(|| json.get("event_type"))
        .and_then(Json::as_str);
    match event_type {
        Some("request_payload" | "tool_start") => return Ok(None),
        Some("request_end") => {}
        Some("tool_end" | "tool_error") => {
            return Err(Error::line(
                line,
                "event_type",
                "tool records belong to agentic traces, which this reader does not take yet: lower them to agentic_mooncake",
            ))
        }
        other => {
            return Err(Error::line(
                line,
                "event_type",
                format!("{other:?}: expected request_end, request_payload or tool_start"),
            ))
        }
    }
    if r.get("schema").and_then(Json::as_str) != Some(SCHEMA) {
        return Err(Error::line(line, "schema", format!("expected {SCHEMA:?}")));
    }
    if r.get("agent_context").is_some_and(|c| !c.is_null()) {
        return Err(Error::line(
            line,
            "agent_context",
            "agentic Dynamo traces are not read yet: lower them to agentic_mooncake",
        ));
    }
    let unsigned = |path: &str, name: &str| -> Result<Option<u64>> {
        match r.pointer(path) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| Error::line(line, name, "expected a non-negative integer")),
        }
    };
    let event_time = unsigned("/event_time_unix_ms", "event_time_unix_ms")?
        .ok_or_else(|| Error::line(line, "event_time_unix_ms", "missing field"))?;
    let request = r
        .get("request")
        .filter(|q| q.is_object())
        .ok_or_else(|| Error::line(line, "request", "missing request metrics"))?;
    let request_id = match request.get("request_id") {
        Some(Json::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(Error::line(
                line,
                "request.request_id",
                "expected a nonempty string",
            ))
        }
    };
    let total_ms = match request.get("total_time_ms") {
        None | Some(Json::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| {
                    Error::line(
                        line,
                        "request.total_time_ms",
                        "expected a non-negative number of milliseconds",
                    )
                })?
                .round() as u64,
        ),
    };
    let received = unsigned(
        "/request/request_received_ms",
        "request.request_received_ms",
    )?;
    let end_ms = match (received, total_ms) {
        (Some(start), Some(total)) => start.saturating_add(total),
        _ => event_time,
    };
    let start_ms = received.unwrap_or_else(|| event_time.saturating_sub(total_ms.unwrap_or(0)));
    let output_tokens = unsigned("/request/output_tokens", "request.output_tokens")?
        .ok_or_else(|| Error::line(line, "request.output_tokens", "missing field"))?;
    if output_tokens > u64::from(u32::MAX) {
        return Err(Error::line(
            line,
            "request.output_tokens",
            "more than 2^32 - 1",
        ));
    }
    let block = unsigned(
        "/request/replay/trace_block_size",
        "request.replay.trace_block_size",
    )?
    .filter(|&b| b > 0 && b <= u64::from(u32::MAX))
    .ok_or_else(|| {
        Error::line(
            line,
            "request.replay.trace_block_size",
            "expected a positive token count",
        )
    })?;
    let input_length = unsigned(
        "/request/replay/input_length",
        "request.replay.input_length",
    )?
    .ok_or_else(|| Error::line(line, "request.replay.input_length", "missing field"))?;
    let hashes = match request.pointer("/replay/input_sequence_hashes") {
        Some(Json::Array(list)) => list
            .iter()
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    Error::line(
                        line,
                        "request.replay.input_sequence_hashes",
                        "expected an array of non-negative integers",
                    )
                })
            })
            .collect::<Result<Vec<u64>>>()?,
        _ => {
            return Err(Error::line(
                line,
                "request.replay.input_sequence_hashes",
                "expected an array of non-negative integers",
            ))
        }
    };
    if input_length > hashes.len() as u64 * block {
        return Err(Error::line(
            line,
            "request.replay.input_length",
            format!(
                "{input_length} tokens, but {} hashes of {block} tokens cover {}",
                hashes.len(),
                hashes.len() as u64 * block
            ),
        ));
    }
    Ok(Some(Entry {
        start_ms,
        end_ms,
        request_id,
        input_length,
        output_tokens,
        hashes,
        at: (file, line),
    }))
}
