//! AISimulate's identity of a request graph, its report's `agentic_graph`: where the graph
//! came from (a version 2 header's `source`, a legacy file's name and row count, a Weka
//! corpus's digest), how many requests and plays it holds, their models, and a digest of
//! the graph in AISimulate's canonical form — the requests as version 2 records (legacy rows
//! lowered as AISimulate lowers them), ordered by id, times from the earliest request,
//! each request's dependencies ordered, as compact JSON under BLAKE3.
//!
//! The records are taken from the rows as read (`canonical_v2`, `canonical_legacy`),
//! after the reader has checked them; a request's play is filled in once the plays are
//! known.

use serde_json::{json, Map, Value as Json};

/// A request graph's provenance and digest, as AISimulate's report gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphIdentity {
    /// The source's format and digest: a header's `source`, `legacy_agentic_mooncake` and
    /// `<file>:<rows>`, or `weka` and the corpus's digest.
    pub format: String,
    pub digest: String,
    pub graph_digest: String,
    pub block_size: u64,
    pub node_count: u64,
    pub play_count: u64,
    /// The requests' models, sorted, each once.
    pub source_models: Vec<String>,
}

impl GraphIdentity {
    pub fn to_json(&self) -> Json {
        json!({
            "source": {"format": self.format, "digest": self.digest},
            "graph_digest": self.graph_digest,
            "block_size": self.block_size,
            "node_count": self.node_count,
            "play_count": self.play_count,
            "source_models": self.source_models,
        })
    }
}

/// A number as AISimulate's records hold it, a float (`100.0`, not `100`).
fn float(v: Option<&Json>) -> Json {
    Json::from(v.and_then(Json::as_f64).unwrap_or(0.0))
}

/// The fields every record has after the play's, from `session_id` on to `policy_class`.
fn record(
    head: [(&str, Json); 2],
    ordinal: Option<&Json>,
    rest: Vec<(&str, Json)>,
) -> Map<String, Json> {
    let mut m = Map::new();
    for (k, v) in head {
        m.insert(k.into(), v);
    }
    if let Some(o) = ordinal.filter(|o| !o.is_null()) {
        m.insert("source_play_ordinal".into(), o.clone());
    }
    for (k, v) in rest {
        m.insert(k.into(), v);
    }
    m
}

/// The output tokens a row lists, and the replay key they give it (its request id).
fn outputs(row: &Json, request_id: &Json) -> (Json, Json) {
    match row.get("output_token_ids").filter(|v| !v.is_null()) {
        Some(ids) => (ids.clone(), request_id.clone()),
        None => (Json::Null, Json::Null),
    }
}

/// The first of `names` `row` holds, not null, as the readers take it; null when none.
fn field(row: &Json, names: &[&'static str]) -> Json {
    crate::mooncake::field(row, names).map_or(Json::Null, |(_, v)| v.clone())
}

/// A checked version 2 row as AISimulate's canonical record.
pub(crate) fn canonical_v2(row: &Json) -> Json {
    let id = field(row, &["request_id"]);
    let (output_token_ids, replay_key) = outputs(row, &id);
    let mut rest = vec![
        ("session_id", field(row, &["session_id"])),
        ("model", field(row, &["model"])),
        (
            "input_length",
            field(row, &["input_length", "input_tokens"]),
        ),
        (
            "max_output_tokens",
            field(row, &["output_length", "output_tokens"]),
        ),
        ("output_token_ids", output_token_ids),
        ("replay_key", replay_key),
        ("hash_ids", field(row, &["hash_ids"])),
        ("not_before_ms", float(row.get("not_before_ms"))),
    ];
    if let Some(t) = row.get("recorded_api_time_ms").filter(|v| !v.is_null()) {
        rest.push(("recorded_api_time_ms", float(Some(t))));
    }
    rest.extend(policy(row));
    let dependencies = row
        .get("dependencies")
        .and_then(Json::as_array)
        .map(|list| {
            list.iter()
                .map(|d| {
                    json!({"request_id": field(d, &["request_id"]),
                           "trigger": field(d, &["trigger"]),
                           "delay_ms": float(d.get("delay_ms")),
                           "relation": field(d, &["relation"])})
                })
                .collect()
        })
        .unwrap_or_default();
    rest.push(("dependencies", Json::Array(dependencies)));
    let head = [("request_id", id), ("play_id", field(row, &["play_id"]))];
    Json::Object(record(head, row.get("source_play_ordinal"), rest))
}

/// `priority`, `strict_priority` (0 when absent) and `policy_class`.
fn policy(row: &Json) -> [(&'static str, Json); 3] {
    let zero = |name: &'static str| match field(row, &[name]) {
        Json::Null => Json::from(0),
        v => v,
    };
    [
        ("priority", zero("priority")),
        ("strict_priority", zero("strict_priority")),
        ("policy_class", field(row, &["policy_class"])),
    ]
}

/// A checked legacy row as AISimulate lowers it: model `unknown`, session
/// `agentic-session` when it names none, its waits completion dependencies (a join when
/// there are several) after `delay` (its `delay_ms`) and `tool_wait_ms`, a dependent
/// request at time 0. Its play is filled in later.
pub(crate) fn canonical_legacy(row: &Json, input_length: u64) -> Json {
    let id = field(row, &["request_id"]);
    let (output_token_ids, replay_key) = outputs(row, &id);
    let waits: Vec<Json> = row
        .get("wait_for")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    let delay = field(row, &["delay", "delay_ms"]).as_f64().unwrap_or(0.0)
        + field(row, &["tool_wait_ms"]).as_f64().unwrap_or(0.0);
    let relation = if waits.len() > 1 { "join" } else { "sequence" };
    let not_before = if waits.is_empty() {
        float(row.get("timestamp").or(row.get("created_time")))
    } else {
        Json::from(0.0)
    };
    let session = match field(row, &["session_id"]) {
        Json::Null => Json::from("agentic-session"),
        s => s,
    };
    let mut rest = vec![
        ("session_id", session),
        ("model", Json::from("unknown")),
        ("input_length", Json::from(input_length)),
        (
            "max_output_tokens",
            field(row, &["output_length", "output_tokens"]),
        ),
        ("output_token_ids", output_token_ids),
        ("replay_key", replay_key),
        ("hash_ids", field(row, &["hash_ids"])),
        ("not_before_ms", not_before),
    ];
    rest.extend(policy(row));
    let dependencies = waits
        .into_iter()
        .map(|on| {
            json!({"request_id": on, "trigger": "completion", "delay_ms": delay,
                   "relation": relation})
        })
        .collect();
    rest.push(("dependencies", Json::Array(dependencies)));
    Json::Object(record(
        [("request_id", id), ("play_id", Json::Null)],
        None,
        rest,
    ))
}

/// The digest of `records` (in request-id order, their plays filled in) at `block_size`:
/// times taken from the earliest and then divided by `speedup` (the arrival speed-up, which
/// AISimulate applies to the graph before its digest), each record's dependencies ordered by
/// request id, then trigger, relation and delay.
pub(crate) fn graph_digest(block_size: u64, mut records: Vec<Json>, speedup: f64) -> String {
    let at = |r: &Json| r["not_before_ms"].as_f64().unwrap_or(0.0);
    let origin = records.iter().map(at).fold(f64::INFINITY, f64::min);
    let rank = |v: &Json, order: &[&str]| {
        let name = v.as_str().unwrap_or_default();
        order.iter().position(|o| *o == name).unwrap_or(order.len())
    };
    for r in &mut records {
        let shifted = (at(r) - origin) / speedup;
        r["not_before_ms"] = Json::from(shifted);
        if let Some(Json::Array(deps)) = r.get_mut("dependencies") {
            for d in deps.iter_mut() {
                if let Some(delay) = d["delay_ms"].as_f64() {
                    d["delay_ms"] = Json::from(delay / speedup);
                }
            }
            deps.sort_by(|a, b| {
                let key = |d: &Json| {
                    (
                        d["request_id"].as_str().unwrap_or_default().to_owned(),
                        rank(&d["trigger"], &["dispatch", "completion"]),
                        rank(
                            &d["relation"],
                            &["sequence", "spawn", "join", "replay_barrier"],
                        ),
                    )
                };
                key(a).cmp(&key(b)).then_with(|| {
                    let delay = |d: &Json| d["delay_ms"].as_f64().unwrap_or(0.0);
                    delay(a).total_cmp(&delay(b))
                })
            });
        }
    }
    let graph = json!({"block_size": block_size, "nodes": records});
    let mut hasher = blake3::Hasher::new();
    // Writing JSON into the hasher cannot fail.
    let _ = serde_json::to_writer(HashWriter(&mut hasher), &graph);
    hasher.finalize().to_hex().to_string()
}

/// Feeds what is written to a BLAKE3 hasher.
struct HashWriter<'a>(&'a mut blake3::Hasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest covers the compact JSON of the records with times from the earliest and
    /// each record's dependencies ordered by id, trigger, relation and delay: written out
    /// here by hand.
    #[test]
    fn the_graph_digest_is_blake3_of_the_canonical_text() {
        let row = json!({"request_id": "b", "play_id": "p", "session_id": "s",
            "model": "m", "input_length": 3, "output_length": 2, "hash_ids": [7],
            "not_before_ms": 250, "dependencies": [
                {"request_id": "a", "trigger": "completion", "delay_ms": 5, "relation": "join"},
                {"request_id": "a", "trigger": "dispatch", "delay_ms": 1, "relation": "spawn"}]});
        let root = json!({"request_id": "a", "play_id": "p", "session_id": "s",
            "model": "m", "input_length": 1, "output_length": 1, "hash_ids": [9],
            "not_before_ms": 200.5, "priority": 3});
        let records = vec![canonical_v2(&root), canonical_v2(&row)];
        let text = concat!(
            r#"{"block_size":4,"nodes":["#,
            r#"{"request_id":"a","play_id":"p","session_id":"s","model":"m","input_length":1,"#,
            r#""max_output_tokens":1,"output_token_ids":null,"replay_key":null,"hash_ids":[9],"#,
            r#""not_before_ms":0.0,"priority":3,"strict_priority":0,"policy_class":null,"#,
            r#""dependencies":[]},"#,
            r#"{"request_id":"b","play_id":"p","session_id":"s","model":"m","input_length":3,"#,
            r#""max_output_tokens":2,"output_token_ids":null,"replay_key":null,"hash_ids":[7],"#,
            r#""not_before_ms":49.5,"priority":0,"strict_priority":0,"policy_class":null,"#,
            r#""dependencies":[{"request_id":"a","trigger":"dispatch","delay_ms":1.0,"#,
            r#""relation":"spawn"},{"request_id":"a","trigger":"completion","delay_ms":5.0,"#,
            r#""relation":"join"}]}]}"#
        );
        assert_eq!(
            graph_digest(4, records.clone(), 1.0),
            blake3::hash(text.as_bytes()).to_hex().to_string()
        );
        // Sped up twice: every time from the earliest and every delay halved.
        let fast = text
            .replace(r#""not_before_ms":49.5"#, r#""not_before_ms":24.75"#)
            .replace(r#""delay_ms":1.0"#, r#""delay_ms":0.5"#)
            .replace(r#""delay_ms":5.0"#, r#""delay_ms":2.5"#);
        assert_eq!(
            graph_digest(4, records, 2.0),
            blake3::hash(fast.as_bytes()).to_hex().to_string()
        );
    }

    /// A legacy row becomes a record of model `unknown` whose waits are completion
    /// dependencies after its delay and tool wait, a join when there are several.
    #[test]
    fn a_legacy_row_is_lowered_as_aisimulate_lowers_it() {
        let row = json!({"request_id": "j", "output_length": 4, "hash_ids": [1, 2],
            "wait_for": ["x", "y"], "delay": 10, "tool_wait_ms": 2.5, "timestamp": 99});
        let record = canonical_legacy(&row, 700);
        assert_eq!(record["model"], "unknown");
        assert_eq!(record["session_id"], "agentic-session");
        assert_eq!(record["input_length"], 700);
        assert_eq!(record["not_before_ms"], json!(0.0));
        assert_eq!(
            record["dependencies"],
            json!([
                {"request_id": "x", "trigger": "completion", "delay_ms": 12.5, "relation": "join"},
                {"request_id": "y", "trigger": "completion", "delay_ms": 12.5, "relation": "join"}
            ])
        );
    }
}
