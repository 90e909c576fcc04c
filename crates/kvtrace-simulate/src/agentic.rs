//! Agentic request graphs (`agentic_mooncake`): each row is one request that may wait for
//! others — a tool call's result, a sub-agent it spawned, the branches it joins — instead of
//! a turn placed by its session's order. Two shapes of the same format are read:
//!
//! - **version 2**: a header line `{"schema": "dynamo.agentic_mooncake", "version": 2,
//!   "block_size", "hash_id_scope": "local", "source": {"format", "digest"}}`, then rows with
//!   `request_id`, `play_id`, `session_id`, `model`, `input_length`, `output_length`,
//!   `hash_ids` (exactly one per block of the header's size), `not_before_ms` and typed
//!   `dependencies` (`request_id`, `trigger` dispatch|completion, `delay_ms`, `relation`
//!   sequence|spawn|join|replay_barrier);
//! - **legacy rows**: Mooncake rows with a required `request_id`, `wait_for` (ids that must
//!   all complete), `delay`/`delay_ms` and `tool_wait_ms` (waited after the last of them),
//!   at the block size the user gives.
//!
//! A request with no dependencies arrives at its timestamp; one with dependencies once every
//! dependency has fired and its delay has passed, and never before its own `not_before_ms`.
//! Version 2 requests are ordered by `request_id` and time 0 is their earliest
//! `not_before_ms`. Legacy rows are read as the engine the simulation follows reads them:
//! Dynamo 1.4.2 keeps them in file order with time 0 at the first request that waits for
//! nothing; AISimulate 0.13 reads them as version 2 rows (ordered by id, the earliest
//! `not_before_ms` at 0 — a dependent row's is 0, so roots keep their own timestamps). The
//! order settles ties between equal arrival times.
//! Unknown ids, self-dependencies, cross-play dependencies and cycles are errors naming the
//! line and field.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;

use serde_json::Value as Json;

use crate::agentic_identity::{canonical_legacy, canonical_v2, graph_digest, GraphIdentity};
use crate::args::EngineVersion;
use crate::error::{Error, Result};
use crate::mooncake::{for_each_object, Interner, Row};
use crate::workload::{Graph, Session, Trigger, Turn, Wait, Workload, DEFAULT_TRACE_BLOCK_SIZE};

/// The schema a version 2 header names.
pub const SCHEMA: &str = "dynamo.agentic_mooncake";
/// The version of the header this reader knows.
pub const VERSION: u64 = 2;

/// One request of the graph as read, before its dependencies are resolved.
struct Node {
    line: u64,
    request_id: String,
    session_id: String,
    play_id: String,
    play_ordinal: Option<u64>,
    not_before_ms: f64,
    turn: Turn,
    /// `(request id, trigger, delay)`, in the row's order.
    waits: Vec<(String, Trigger, f64)>,
    /// The row as AISimulate's canonical record, when the graph's identity is wanted.
    canonical: Option<Json>,
}

/// Reads an `agentic_mooncake` trace: version 2, whose header's block size is authoritative
/// (`block_size`, when given, must equal it), or legacy rows, whose hash ids stand for
/// `block_size` tokens (512 when not given), ordered and timed as `engine` reads them.
/// Under AISimulate's engine the graph carries its identity, a legacy file's provenance
/// being `name` (the file as given) and its row count. Its times and delays are divided by
/// `speedup` (see [`Workload::speed_up_arrivals`]), which the graph's digest covers.
pub fn read_agentic_mooncake(
    src: impl BufRead + Send,
    block_size: Option<u32>,
    engine: EngineVersion,
    name: &str,
    speedup: f64,
) -> Result<Workload> {
    let identity = (engine == EngineVersion::Aisimulate013).then(|| name.to_owned());
    let mut rows = Rows::new(block_size, identity);
    for_each_object(src, |line, json| rows.add(line, json))?;
    rows.finish(engine, speedup)
}

/// An `agentic_mooncake` trace's objects as they are read, one per line: its header (the
/// first object, when it names the schema) and its rows. Another reader that lowers its own
/// format to these rows (Weka's) hands them over as values, without writing them out.
pub(crate) struct Rows {
    block_size: Option<u32>,
    /// `None` before the first object; then the header's block size, or `None` for legacy
    /// rows.
    header: Option<Option<u32>>,
    /// The source's format and digest as the graph's identity gives them, when it is
    /// wanted: a header's `source`; for legacy rows, at first, the name of their file.
    identity: Option<(String, String)>,
    ids: Interner,
    nodes: Vec<Node>,
}

impl Rows {
    /// Rows whose hash ids stand for `block_size` tokens: the header's, which must then equal
    /// it, or legacy rows' (512 when not given). With `identity` (legacy rows' file name)
    /// the graph carries its identity ([`crate::agentic_identity`]).
    pub(crate) fn new(block_size: Option<u32>, identity: Option<String>) -> Rows {
        Rows {
            block_size,
            header: None,
            identity: identity.map(|name| ("legacy_agentic_mooncake".to_owned(), name)),
            ids: Interner::default(),
            nodes: Vec::new(),
        }
    }

    /// The tokens a hash id stands for: the header's block size, or legacy rows' (512 when
    /// not given).
    fn block(&self) -> u32 {
        match self.header {
            Some(Some(block)) => block,
            _ => self.block_size.unwrap_or(DEFAULT_TRACE_BLOCK_SIZE),
        }
    }

    /// The object on `line`.
    pub(crate) fn add(&mut self, line: u64, json: Json) -> Result<()> {
        if self.header.is_none() {
            if json.get("schema").is_some() {
                let own = parse_header(&json, line)?;
                if let Some(given) = self.block_size.filter(|&b| b != own) {
                    return Err(Error::line(
                        line,
                        "block_size",
                        format!("{own}, but the trace block size given is {given}"),
                    ));
                }
                self.header = Some(Some(own));
                if let Some(source) = &mut self.identity {
                    let text = |name: &str| json["source"][name].as_str().map(str::to_owned);
                    *source = (
                        text("format").unwrap_or_default(),
                        text("digest").unwrap_or_default(),
                    );
                }
                return Ok(());
            }
            self.header = Some(None);
        }
        let block = self.block();
        let mut node = match self.header {
            Some(Some(_)) => v2_node(&json, line, block, &mut self.ids)?,
            _ => legacy_node(&json, line, block, &mut self.ids)?,
        };
        if self.identity.is_some() {
            node.canonical = Some(match self.header {
                Some(Some(_)) => canonical_v2(&json),
                _ => canonical_legacy(&json, u64::from(node.turn.prompt.len)),
            });
        }
        self.nodes.push(node);
        Ok(())
    }

    /// The request graph of the rows, ordered and timed as `engine` reads them, its times
    /// and delays divided by `speedup`.
    pub(crate) fn finish(self, engine: EngineVersion, speedup: f64) -> Result<Workload> {
        if self.nodes.is_empty() {
            return Err(Error::line(1, "request_id", "the trace holds no request"));
        }
        let versioned = matches!(self.header, Some(Some(_)));
        let block = self.block();
        let rows = self.nodes.len();
        let (mut workload, records) = build(
            self.nodes,
            versioned,
            versioned || engine == EngineVersion::Aisimulate013,
        )?;
        if let (Some(graph), Some(records), Some((format, mut digest))) =
            (workload.graph.as_mut(), records, self.identity)
        {
            if !versioned {
                digest = format!("{digest}:{rows}");
            }
            let mut models: Vec<String> = records
                .iter()
                .filter_map(|r| r["model"].as_str().map(str::to_owned))
                .collect();
            models.sort();
            models.dedup();
            graph.identity = Some(GraphIdentity {
                format,
                digest,
                graph_digest: graph_digest(u64::from(block), records, speedup),
                block_size: u64::from(block),
                node_count: rows as u64,
                play_count: graph.play_names.len() as u64,
                source_models: models,
            });
        }
        workload.speed_up_arrivals(speedup);
        Ok(workload)
    }
}

fn parse_header(json: &Json, line: u64) -> Result<u32> {
    let wrong = |field: &str, message: String| Error::line(line, field, message);
    let schema = json
        .get("schema")
        .and_then(Json::as_str)
        .unwrap_or_default();
    if schema != SCHEMA {
        return Err(wrong(
            "schema",
            format!("{schema:?} is not {SCHEMA:?}, the agentic Mooncake header"),
        ));
    }
    match json.get("version").and_then(Json::as_u64) {
        Some(VERSION) => {}
        Some(v) => {
            return Err(wrong(
                "version",
                format!("version {v} is not supported; this reader knows version {VERSION}"),
            ))
        }
        None => return Err(wrong("version", "expected an unsigned integer".into())),
    }
    let block = json
        .get("block_size")
        .and_then(Json::as_u64)
        .filter(|&b| b > 0 && b <= u64::from(u32::MAX))
        .ok_or_else(|| wrong("block_size", "expected a positive token count".into()))?;
    if json.get("hash_id_scope").and_then(Json::as_str) != Some("local") {
        return Err(wrong(
            "hash_id_scope",
            "expected \"local\" (hash ids name content within this file)".into(),
        ));
    }
    let provenance = |name: &str| {
        json.get("source")
            .and_then(|s| s.get(name))
            .and_then(Json::as_str)
            .is_some_and(|v| !v.trim().is_empty())
    };
    if !provenance("format") || !provenance("digest") {
        return Err(wrong(
            "source",
            "expected {\"format\": …, \"digest\": …}, both nonempty".into(),
        ));
    }
    Ok(block as u32)
}

/// A nonempty string field.
fn text(json: &Json, line: u64, name: &str) -> Result<String> {
    match json.get(name) {
        Some(Json::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        None | Some(Json::Null) => Err(Error::line(line, name, "missing field")),
        Some(_) => Err(Error::line(line, name, "expected a nonempty string")),
    }
}

/// A finite, non-negative number of milliseconds, 0 when absent.
fn millis(json: &Json, line: u64, name: &str) -> Result<f64> {
    match json.get(name) {
        None | Some(Json::Null) => Ok(0.0),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| {
                Error::line(line, name, "expected a non-negative number of milliseconds")
            }),
    }
}

fn legacy_node(json: &Json, line: u64, block: u32, ids: &mut Interner) -> Result<Node> {
    let row = Row::parse(json, line)?;
    let request_id = text(json, line, "request_id")?;
    if json.get("delay").is_some_and(|v| !v.is_null())
        && json.get("delay_ms").is_some_and(|v| !v.is_null())
    {
        return Err(Error::line(
            line,
            "delay_ms",
            "delay and delay_ms cannot both be set",
        ));
    }
    let delay = row.delay.unwrap_or(0.0) + millis(json, line, "tool_wait_ms")?;
    let waits = match json.get("wait_for") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(list)) => list
            .iter()
            .map(|v| match v {
                Json::String(s) => Ok((s.clone(), Trigger::Completion, delay)),
                _ => Err(Error::line(
                    line,
                    "wait_for",
                    "expected an array of request ids",
                )),
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(Error::line(
                line,
                "wait_for",
                "expected an array of request ids",
            ))
        }
    };
    let turn = row.turn(line, block, ids)?;
    Ok(Node {
        line,
        session_id: row.session_id.clone().unwrap_or_else(|| request_id.clone()),
        play_id: String::new(),
        play_ordinal: None,
        // A dependent request's own timestamp does not hold it back.
        not_before_ms: if waits.is_empty() {
            row.timestamp.unwrap_or(0.0)
        } else {
            0.0
        },
        turn: Turn {
            request_id: Some(request_id.clone()),
            ..turn
        },
        request_id,
        waits,
        canonical: None,
    })
}

fn v2_node(json: &Json, line: u64, block: u32, ids: &mut Interner) -> Result<Node> {
    let row = Row::parse(json, line)?;
    let request_id = text(json, line, "request_id")?;
    let play_id = text(json, line, "play_id")?;
    let session_id = text(json, line, "session_id")?;
    text(json, line, "model")?;
    let input = row
        .input_length
        .ok_or_else(|| Error::line(line, "input_length", "missing field"))?;
    let want = input.div_ceil(u64::from(block));
    if row.hash_ids.len() as u64 != want {
        return Err(Error::line(
            line,
            "hash_ids",
            format!(
                "input_length {input} at block_size {block} needs exactly {want} hash ids, got {}",
                row.hash_ids.len()
            ),
        ));
    }
    if json.get("not_before_ms").is_none_or(Json::is_null) {
        return Err(Error::line(line, "not_before_ms", "missing field"));
    }
    let not_before_ms = millis(json, line, "not_before_ms")?;
    millis(json, line, "recorded_api_time_ms")?;
    let play_ordinal = match json.get("source_play_ordinal") {
        None | Some(Json::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            Error::line(line, "source_play_ordinal", "expected an unsigned integer")
        })?),
    };
    let waits = match json.get("dependencies") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(list)) => list
            .iter()
            .map(|d| dependency(d, line))
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(Error::line(
                line,
                "dependencies",
                "expected an array of dependencies",
            ))
        }
    };
    let turn = row.turn(line, block, ids)?;
    Ok(Node {
        line,
        session_id,
        play_id,
        play_ordinal,
        not_before_ms,
        turn: Turn {
            request_id: Some(request_id.clone()),
            ..turn
        },
        request_id,
        waits,
        canonical: None,
    })
}

fn dependency(d: &Json, line: u64) -> Result<(String, Trigger, f64)> {
    let field = |name: &str| format!("dependencies.{name}");
    let id = match d.get("request_id") {
        Some(Json::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(Error::line(
                line,
                field("request_id"),
                "expected a nonempty string",
            ))
        }
    };
    let trigger = match d.get("trigger").and_then(Json::as_str) {
        Some("dispatch") => Trigger::Dispatch,
        Some("completion") => Trigger::Completion,
        _ => {
            return Err(Error::line(
                line,
                field("trigger"),
                "expected \"dispatch\" or \"completion\"",
            ))
        }
    };
    let relation = d.get("relation").and_then(Json::as_str).unwrap_or_default();
    let allowed = match relation {
        "spawn" => true,
        "sequence" | "join" | "replay_barrier" => trigger == Trigger::Completion,
        _ => {
            return Err(Error::line(
                line,
                field("relation"),
                "expected sequence, spawn, join or replay_barrier",
            ))
        }
    };
    if !allowed {
        return Err(Error::line(
            line,
            field("trigger"),
            format!("a {relation} dependency fires on completion only"),
        ));
    }
    let delay = d
        .get("delay_ms")
        .and_then(Json::as_f64)
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| {
            Error::line(
                line,
                field("delay_ms"),
                "expected a non-negative number of milliseconds",
            )
        })?;
    Ok((id, trigger, delay))
}

/// Orders the requests (by id when `by_id`, else in file order), resolves and checks their
/// dependencies, and makes each one a session of one turn.
fn build(
    mut nodes: Vec<Node>,
    versioned: bool,
    by_id: bool,
) -> Result<(Workload, Option<Vec<Json>>)> {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    for n in &nodes {
        if let Some(first) = seen.insert(&n.request_id, n.line) {
            return Err(Error::line(
                n.line,
                "request_id",
                format!("{:?} is already the id of line {first}", n.request_id),
            ));
        }
    }
    // AISimulate's graph orders its requests by id; Dynamo 1.4.2 keeps legacy rows in file
    // order. The order settles ties between equal arrival times.
    if by_id {
        nodes.sort_by(|a, b| a.request_id.cmp(&b.request_id));
    }
    let index: HashMap<&str, u32> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.request_id.as_str(), i as u32))
        .collect();
    let field = if versioned {
        "dependencies.request_id"
    } else {
        "wait_for"
    };
    let mut waits = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        let mut resolved = Vec::with_capacity(n.waits.len());
        for (id, trigger, delay_ms) in &n.waits {
            let Some(&on) = index.get(id.as_str()) else {
                return Err(Error::line(
                    n.line,
                    field,
                    format!("no request has the id {id:?}"),
                ));
            };
            if on as usize == i {
                return Err(Error::line(
                    n.line,
                    field,
                    "a request cannot wait for itself",
                ));
            }
            if nodes[on as usize].play_id != n.play_id {
                return Err(Error::line(
                    n.line,
                    field,
                    format!(
                        "{id:?} is in play {:?}, this request in play {:?}",
                        nodes[on as usize].play_id, n.play_id
                    ),
                ));
            }
            resolved.push(Wait {
                on,
                trigger: *trigger,
                delay_ms: *delay_ms,
            });
        }
        waits.push(resolved);
    }
    check_acyclic(&nodes, &waits)?;
    let (plays, play_names) = if versioned {
        check_plays(&nodes, &waits)?;
        number_plays(nodes.iter().map(|n| (n.play_id.clone(), n.play_ordinal)))
    } else {
        // A legacy play is a connected part of the graph, named for its earliest request
        // that waits for nothing (then the least id), as AISimulate names it.
        let parts = components(&waits);
        let earlier = |i: usize, j: usize| {
            let (a, b) = (&nodes[i], &nodes[j]);
            (a.not_before_ms.total_cmp(&b.not_before_ms))
                .then_with(|| a.request_id.cmp(&b.request_id))
                .is_lt()
        };
        let mut first_root: HashMap<u32, usize> = HashMap::new();
        for i in (0..nodes.len()).filter(|&i| waits[i].is_empty()) {
            let root = first_root.entry(parts[i]).or_insert(i);
            if earlier(i, *root) {
                *root = i;
            }
        }
        number_plays((0..nodes.len()).map(|i| {
            let root = first_root.get(&parts[i]).map_or(i, |&r| r);
            (format!("legacy-play:{}", nodes[root].request_id), None)
        }))
    };
    // Time 0 is the earliest `not_before_ms` of all requests (AISimulate's normalisation),
    // or the first legacy request that waits for nothing (Dynamo 1.4.2's).
    let origin = nodes
        .iter()
        .zip(&waits)
        .filter(|(_, w)| by_id || w.is_empty())
        .map(|(n, _)| n.not_before_ms)
        .fold(f64::INFINITY, f64::min);
    // The canonical records, their plays named, in request-id order.
    let mut records: Option<Vec<Json>> = nodes.iter_mut().map(|n| n.canonical.take()).collect();
    if let Some(records) = &mut records {
        for (r, &play) in records.iter_mut().zip(&plays) {
            if r["play_id"].is_null() {
                r["play_id"] = Json::from(play_names[play as usize].as_str());
            }
        }
        let id = |r: &Json| r["request_id"].as_str().unwrap_or_default().to_owned();
        records.sort_by_key(id);
    }
    let sessions = nodes
        .into_iter()
        .map(|n| Session {
            id: Some(n.session_id),
            start_ms: (n.not_before_ms - origin).max(0.0),
            turns: vec![n.turn],
        })
        .collect();
    let workload = Workload {
        sessions,
        graph: Some(Graph {
            waits,
            plays,
            play_names,
            identity: None,
        }),
        planned_outputs: true,
    };
    Ok((workload, records))
}

/// Numbers the plays of the requests, each given as its play's name and ordinal, in the
/// order AISimulate lists them: by ordinal when every play has one, else by name. Gives each
/// request's play number and the names in number order.
fn number_plays(
    of_requests: impl Iterator<Item = (String, Option<u64>)>,
) -> (Vec<u32>, Vec<String>) {
    let named: Vec<(String, Option<u64>)> = of_requests.collect();
    let mut order: Vec<(Option<u64>, &str)> = named
        .iter()
        .map(|(name, ordinal)| (*ordinal, name.as_str()))
        .collect();
    let by_ordinal = order.iter().all(|(ordinal, _)| ordinal.is_some());
    if by_ordinal {
        order.sort();
    } else {
        order.sort_by(|a, b| a.1.cmp(b.1));
    }
    order.dedup_by(|a, b| a.1 == b.1);
    let numbers: HashMap<&str, u32> = order
        .iter()
        .enumerate()
        .map(|(i, (_, name))| (*name, i as u32))
        .collect();
    let plays = named
        .iter()
        .map(|(name, _)| numbers[name.as_str()])
        .collect();
    let names = order.iter().map(|(_, name)| (*name).to_owned()).collect();
    (plays, names)
}

/// The connected parts of the graph `waits` draws (union-find), numbered from 0 in the order
/// of their first request.
fn components(waits: &[Vec<Wait>]) -> Vec<u32> {
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut parent: Vec<usize> = (0..waits.len()).collect();
    for (i, list) in waits.iter().enumerate() {
        for w in list {
            let (a, b) = (find(&mut parent, i), find(&mut parent, w.on as usize));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut numbers: HashMap<usize, u32> = HashMap::new();
    (0..waits.len())
        .map(|i| {
            let root = find(&mut parent, i);
            let next = numbers.len() as u32;
            *numbers.entry(root).or_insert(next)
        })
        .collect()
}

/// Kahn's algorithm: every request must become ready once the ones it waits for are.
fn check_acyclic(nodes: &[Node], waits: &[Vec<Wait>]) -> Result<()> {
    let mut pending: Vec<usize> = waits.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); nodes.len()];
    for (i, list) in waits.iter().enumerate() {
        for w in list {
            dependents[w.on as usize].push(i);
        }
    }
    let mut ready: VecDeque<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut visited = 0;
    while let Some(i) = ready.pop_front() {
        visited += 1;
        for &d in &dependents[i] {
            pending[d] -= 1;
            if pending[d] == 0 {
                ready.push_back(d);
            }
        }
    }
    match (0..nodes.len()).find(|&i| pending[i] > 0) {
        None => Ok(()),
        Some(i) => Err(Error::line(
            nodes[i].line,
            "dependencies",
            format!(
                "{:?} is on a cycle of dependencies ({} requests never become ready)",
                nodes[i].request_id,
                nodes.len() - visited
            ),
        )),
    }
}

/// Every play has a request that waits for nothing, and play ordinals are given for all
/// plays or none, and then number them from 0 without gaps, one per play.
fn check_plays(nodes: &[Node], waits: &[Vec<Wait>]) -> Result<()> {
    let mut plays: HashMap<&str, (Option<u64>, bool, u64)> = HashMap::new();
    for (n, list) in nodes.iter().zip(waits) {
        let entry = plays
            .entry(&n.play_id)
            .or_insert((n.play_ordinal, false, n.line));
        if entry.0 != n.play_ordinal {
            return Err(Error::line(
                n.line,
                "source_play_ordinal",
                format!("play {:?} has differing ordinals", n.play_id),
            ));
        }
        entry.1 |= list.is_empty();
    }
    if let Some((play, (_, _, line))) = plays.iter().find(|(_, p)| !p.1) {
        return Err(Error::line(
            *line,
            "dependencies",
            format!("play {play:?} has no request that waits for nothing"),
        ));
    }
    let given: Vec<u64> = plays.values().filter_map(|p| p.0).collect();
    if !given.is_empty() {
        let line = plays.values().map(|p| p.2).min().unwrap_or(1);
        if given.len() != plays.len() {
            return Err(Error::line(
                line,
                "source_play_ordinal",
                "given for some plays and not others",
            ));
        }
        let mut sorted = given;
        sorted.sort_unstable();
        if sorted.iter().enumerate().any(|(i, &o)| o != i as u64) {
            return Err(Error::line(
                line,
                "source_play_ordinal",
                "ordinals must number the plays 0, 1, 2, … once each",
            ));
        }
    }
    Ok(())
}
