//! `simulate --trace-format`: what each format means, checked on the samples of
//! `testdata/traces` with expectations computed here from the files themselves (Dynamo 1.4.2's
//! own reports for them are in `reference_reports.rs`), and the one-line errors of bad input.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::util::{kvtrace, one_line_error, repo, scratch, text};

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn write_lines(path: &Path, rows: &[Value]) {
    let body: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, body).expect("write");
}

/// Runs `simulate` on `args` (two round-robin workers of 16-token blocks) and returns its
/// report and per-request records.
fn simulate(dir: &Path, name: &str, args: &[&str]) -> (Value, Vec<Value>) {
    simulate_on(dir, name, "{\"block_size\":16}", args)
}

/// [`simulate`] with the engine arguments `engine`.
fn simulate_on(dir: &Path, name: &str, engine: &str, args: &[&str]) -> (Value, Vec<Value>) {
    let report = dir.join(format!("{name}.json"));
    let requests = dir.join(format!("{name}.jsonl"));
    let mut all: Vec<String> = vec!["simulate".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    all.extend(
        [
            "--num-workers",
            "2",
            "--extra-engine-args",
            engine,
            "-q",
            "--report-json",
            &report.display().to_string(),
            "--report-jsonl",
            &requests.display().to_string(),
        ]
        .map(String::from),
    );
    let out = kvtrace(&all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(report).expect("report")).expect("json");
    (report, lines(&requests))
}

fn f(v: &Value) -> f64 {
    v.as_f64().expect("number")
}

#[test]
fn a_delta_turn_replays_the_session_so_far_its_output_and_its_new_input() {
    let file = repo("testdata/traces/mooncake_delta.jsonl");
    let dir = scratch();
    let (report, records) = simulate(
        dir.path(),
        "delta",
        &[
            &file,
            "--trace-format",
            "mooncake-delta",
            "--trace-block-size",
            "64",
        ],
    );
    // Each session's prompts, as the format defines them: the previous prompt, its output,
    // then the row's own input.
    let mut sessions: HashMap<String, Vec<u64>> = HashMap::new();
    let mut previous: HashMap<String, (u64, u64)> = HashMap::new();
    for row in lines(Path::new(&file)) {
        let s = row["session_id"].as_str().expect("session").to_owned();
        let input = row["input_length"].as_u64().expect("input");
        let output = row["output_length"].as_u64().expect("output");
        let prompt = previous.get(&s).map_or(0, |(p, o)| p + o) + input;
        previous.insert(s.clone(), (prompt, output));
        sessions.entry(s).or_default().push(prompt);
    }
    let total: u64 = sessions.values().flatten().sum();
    assert_eq!(report["total_input_tokens"].as_u64(), Some(total));
    for r in &records {
        let s = r["session_id"].as_str().expect("session");
        let turn = r["turn_index"].as_u64().expect("turn") as usize;
        assert_eq!(
            r["input_length"].as_u64(),
            Some(sessions[s][turn]),
            "{s} turn {turn}"
        );
    }
}

#[test]
fn an_agentic_request_starts_when_what_it_waits_for_ends_plus_its_delays() {
    let dir = scratch();
    // The sample, each request its own session so that its record names it.
    let rows: Vec<Value> = lines(Path::new(&repo("testdata/traces/agentic_legacy.jsonl")))
        .into_iter()
        .map(|mut r| {
            r["session_id"] = r["request_id"].clone();
            r
        })
        .collect();
    let file = dir.path().join("agentic.jsonl");
    write_lines(&file, &rows);
    let (report, records) = simulate(
        dir.path(),
        "run",
        &[
            &file.display().to_string(),
            "--trace-format",
            "agentic_mooncake",
            "--trace-block-size",
            "64",
        ],
    );
    assert_eq!(
        report["completed_requests"].as_u64(),
        Some(rows.len() as u64)
    );
    let by_id: HashMap<&str, &Value> = records
        .iter()
        .map(|r| (r["session_id"].as_str().expect("id"), r))
        .collect();
    let first_root = rows
        .iter()
        .filter(|r| r.get("wait_for").is_none())
        .map(|r| f(&r["timestamp"]))
        .fold(f64::INFINITY, f64::min);
    for row in &rows {
        let id = row["request_id"].as_str().expect("id");
        let arrival = f(&by_id[id]["arrival_time_ms"]);
        let expected = match row.get("wait_for").and_then(Value::as_array) {
            None => f(&row["timestamp"]) - first_root,
            Some(waits) => {
                let delay =
                    row.get("delay").map_or(0.0, f) + row.get("tool_wait_ms").map_or(0.0, f);
                waits
                    .iter()
                    .map(|w| f(&by_id[w.as_str().expect("id")]["terminal_time_ms"]))
                    .fold(f64::NEG_INFINITY, f64::max)
                    + delay
            }
        };
        assert!(
            (arrival - expected).abs() < 1e-9,
            "{id}: arrived {arrival}, expected {expected}"
        );
    }
}

/// AISimulate's report gives a request graph's plays (legacy rows: the parts its waits
/// connect, whatever the sessions say) and each completed play's span, from its first arrival
/// to its last end; Dynamo's report has no such keys.
#[test]
fn a_legacy_graphs_plays_are_the_parts_its_waits_connect() {
    let dir = scratch();
    let row = |id: &str, session: &str, t: Option<u64>, waits: &[&str]| {
        let mut r = json!({"request_id": id, "session_id": session, "input_length": 200,
            "output_length": 8, "hash_ids": [1, 2, 3, 4]});
        match t {
            Some(t) => r["timestamp"] = json!(t),
            None => r["wait_for"] = json!(waits),
        }
        r
    };
    // Two roots joined by one request, in three sessions: one play; a root and its child:
    // another.
    let rows = [
        row("r1", "s1", Some(0), &[]),
        row("r2", "s2", Some(10), &[]),
        row("j", "s3", None, &["r1", "r2"]),
        row("r3", "s4", Some(5), &[]),
        row("c3", "s4", None, &["r3"]),
    ];
    let file = dir.path().join("plays.jsonl");
    write_lines(&file, &rows);
    let file = file.display().to_string();
    let run = |engine: &str| {
        let args = format!("{{\"block_size\":16,\"engine_version\":\"{engine}\"}}");
        simulate_on(
            dir.path(),
            engine,
            &args,
            &[&file, "--trace-format", "agentic_mooncake"],
        )
    };
    let (dynamo, _) = run("dynamo-1.4.2");
    assert!(dynamo.get("total_trajectories").is_none());
    assert!(dynamo.get("committed_prefill_tokens").is_none());
    let (report, records) = run("aisimulate-0.13");
    assert_eq!(report["total_trajectories"], json!(2));
    assert_eq!(report["completed_trajectories"], json!(2));
    assert_eq!(report["incomplete_trajectories"], json!(0));
    // The requests' order: r1, r2, r3 arrive at their times, j and c3 after.
    let end = |session: &str| {
        records
            .iter()
            .filter(|r| r["session_id"] == json!(session))
            .map(|r| f(&r["terminal_time_ms"]))
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let joined = end("s3") - 0.0;
    let alone = end("s4") - 5.0;
    let (low, high) = (joined.min(alone), joined.max(alone));
    assert!((f(&report["min_trajectory_e2e_latency_ms"]) - low).abs() < 1e-9);
    assert!((f(&report["max_trajectory_e2e_latency_ms"]) - high).abs() < 1e-9);
    assert!((f(&report["mean_trajectory_e2e_latency_ms"]) - (low + high) / 2.0).abs() < 1e-9);
    assert_eq!(report["kv_eviction_policy"], json!("lru"));
    assert_eq!(report["power_w"], Value::Null);
    assert_eq!(report["num_e2e_latency_samples"], json!(5));
    // Each play is named for its earliest root and listed by name; a completed play's
    // outcome ends when its last request did.
    let outcome = |play: &str, at: f64| {
        json!({"play_id": play, "status": "completed", "causal_terminal_ms": at,
               "settled_at_ms": at})
    };
    assert_eq!(
        report["agentic_play_outcomes"],
        json!([
            outcome("legacy-play:r1", end("s1").max(end("s2")).max(end("s3"))),
            outcome("legacy-play:r3", end("s4")),
        ])
    );
    assert!(dynamo.get("agentic_play_outcomes").is_none());
}

/// A play whose request can never be scheduled (SGLang keeps a prompt larger than its
/// cache waiting) is incomplete: its outcome ends at its last request that ended, and it
/// never settles.
#[test]
fn a_play_left_waiting_is_incomplete_and_never_settles() {
    let dir = scratch();
    let v2 = repo("testdata/traces/agentic_v2.jsonl");
    let engine = r#"{"engine_type":"sglang","block_size":16,"num_gpu_blocks":30,"engine_version":"aisimulate-0.13"}"#;
    let (report, records) = simulate_on(
        dir.path(),
        "stall",
        engine,
        &[&v2, "--trace-format", "agentic_mooncake"],
    );
    let outcomes = report["agentic_play_outcomes"]
        .as_array()
        .expect("outcomes");
    assert_eq!(outcomes.len(), 3);
    for (o, session) in outcomes.iter().zip(["a0", "a1", "a2"]) {
        assert_eq!(o["status"], json!("incomplete"), "{o}");
        assert!(o.get("settled_at_ms").is_none(), "{o}");
        // The play's sessions: its own and its sub-agent's (`a0-sub`).
        let last = records
            .iter()
            .filter(|r| {
                r["session_id"]
                    .as_str()
                    .is_some_and(|s| s.split('-').next() == Some(session))
            })
            .filter_map(|r| r["terminal_time_ms"].as_f64())
            .fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(f(&o["causal_terminal_ms"]), last, "{o}");
    }
}

#[test]
fn version_2_reads_as_its_legacy_rows_and_spawns_on_dispatch() {
    let dir = scratch();
    let v2 = repo("testdata/traces/agentic_v2.jsonl");
    let rows = lines(Path::new(&v2));
    // The same graph as legacy rows, in the order version 2 gives its requests, without
    // the spawned sub-agent (legacy rows cannot spawn).
    let legacy: Vec<Value> = rows[1..]
        .iter()
        .filter(|r| r["request_id"] != "a0-sub")
        .map(|r| {
            let mut row = json!({
                "request_id": r["request_id"],
                "session_id": r["session_id"],
                "input_length": r["input_length"],
                "output_length": r["output_length"],
                "hash_ids": r["hash_ids"],
            });
            match r.get("dependencies").and_then(Value::as_array) {
                None => row["timestamp"] = r["not_before_ms"].clone(),
                Some(deps) => {
                    row["wait_for"] = deps.iter().map(|d| d["request_id"].clone()).collect();
                    row["delay"] = deps[0]["delay_ms"].clone();
                }
            }
            row
        })
        .collect();
    let legacy_file = dir.path().join("legacy.jsonl");
    write_lines(&legacy_file, &legacy);
    let without_spawn = dir.path().join("v2.jsonl");
    write_lines(
        &without_spawn,
        &rows
            .iter()
            .filter(|r| r["request_id"] != "a0-sub")
            .cloned()
            .collect::<Vec<_>>(),
    );
    let format = ["--trace-format", "agentic_mooncake"];
    let (a, _) = simulate(
        dir.path(),
        "legacy-run",
        &[
            &legacy_file.display().to_string(),
            format[0],
            format[1],
            "--trace-block-size",
            "64",
        ],
    );
    let (b, _) = simulate(
        dir.path(),
        "v2-run",
        &[&without_spawn.display().to_string(), format[0], format[1]],
    );
    for (key, value) in a.as_object().expect("report") {
        if !key.contains("wall") && !key.starts_with("processed_") {
            assert_eq!(&b[key], value, "{key}");
        }
    }
    // With the spawn: a0-sub is sent 15 ms after a0-plan is.
    let (_, records) = simulate(dir.path(), "spawn", &[&v2, format[0], format[1]]);
    let arrival = |session: &str| {
        records
            .iter()
            .find(|r| r["session_id"] == session)
            .map(|r| f(&r["arrival_time_ms"]))
            .expect(session)
    };
    let plan = records
        .iter()
        .filter(|r| r["session_id"] == "a0")
        .map(|r| f(&r["arrival_time_ms"]))
        .fold(f64::INFINITY, f64::min);
    assert_eq!(arrival("a0-sub"), plan + 15.0);
}

#[test]
fn dynamo_shards_read_as_one_trace_in_the_order_requests_were_received() {
    let dir = scratch();
    let part0 = repo("testdata/traces/dynamo_trace.part0.jsonl");
    let part1 = repo("testdata/traces/dynamo_trace.part1.jsonl.gz");
    let (report, records) = simulate(
        dir.path(),
        "dynamo",
        &[&part0, &part1, "--trace-format", "dynamo"],
    );
    assert_eq!(report["completed_requests"].as_u64(), Some(60));
    // The slice it was made from: the same requests at the same offsets.
    let slice = lines(Path::new(&repo(
        "testdata/mooncake/conversation_head300.jsonl",
    )));
    let mut arrivals: Vec<f64> = records.iter().map(|r| f(&r["arrival_time_ms"])).collect();
    arrivals.sort_by(f64::total_cmp);
    let first = f(&slice[0]["timestamp"]);
    let expected: Vec<f64> = slice[..60]
        .iter()
        .map(|r| (f(&r["timestamp"]) - first).floor())
        .collect();
    assert_eq!(arrivals, expected);
    let input: u64 = slice[..60]
        .iter()
        .map(|r| r["input_length"].as_u64().expect("input"))
        .sum();
    assert_eq!(report["total_input_tokens"].as_u64(), Some(input));
}

#[test]
fn bad_traces_are_one_line_errors_naming_line_and_field() {
    let dir = scratch();
    let row = |id: &str, waits: &[&str]| {
        json!({"request_id": id, "input_length": 64, "output_length": 4, "hash_ids": [1],
               "timestamp": 0, "wait_for": waits})
    };
    let header = json!({"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64,
        "hash_id_scope": "local", "source": {"format": "t", "digest": "d"}});
    let v2_row = json!({"request_id": "a", "play_id": "p", "session_id": "s", "model": "m",
        "input_length": 64, "output_length": 4, "hash_ids": [1], "not_before_ms": 0});
    let end = |extra: Value| {
        let mut r = json!({"schema": "dynamo.request.trace.v1", "event_type": "request_end",
            "event_time_unix_ms": 1000, "request": {"request_id": "r", "output_tokens": 3,
            "request_received_ms": 10, "replay": {"trace_block_size": 64, "input_length": 64,
            "input_sequence_hashes": [5]}}});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                r[k] = v;
            }
        }
        r
    };
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        (
            "agentic_mooncake",
            vec![row("a", &[]), row("b", &["c"])],
            "line 2: wait_for: no request has the id \"c\"",
        ),
        (
            "agentic_mooncake",
            vec![row("a", &["b"]), row("b", &["a"])],
            "line 1: dependencies: \"a\" is on a cycle",
        ),
        (
            "agentic_mooncake",
            vec![row("a", &[]), row("a", &[])],
            "line 2: request_id: \"a\" is already the id of line 1",
        ),
        (
            "agentic_mooncake",
            vec![row("a", &["a"])],
            "line 1: wait_for: a request cannot wait for itself",
        ),
        (
            "agentic_mooncake",
            vec![json!({"input_length": 64, "output_length": 4, "hash_ids": [1]})],
            "line 1: request_id: missing field",
        ),
        (
            "agentic_mooncake",
            vec![json!({"schema": "dynamo.agentic_mooncake", "version": 3})],
            "line 1: version: version 3 is not supported",
        ),
        (
            "agentic_mooncake",
            vec![header.clone(), {
                let mut r = v2_row.clone();
                r.as_object_mut().expect("row").remove("not_before_ms");
                r
            }],
            "line 2: not_before_ms: missing field",
        ),
        (
            "agentic_mooncake",
            vec![header.clone(), {
                let mut r = v2_row.clone();
                r["hash_ids"] = json!([1, 2]);
                r
            }],
            "line 2: hash_ids: input_length 64 at block_size 64 needs exactly 1 hash ids, got 2",
        ),
        (
            "agentic_mooncake",
            vec![header, {
                let mut r = v2_row;
                r["dependencies"] = json!([{"request_id": "a", "trigger": "dispatch",
                    "delay_ms": 0, "relation": "join"}]);
                r
            }],
            "line 2: dependencies.trigger: a join dependency fires on completion only",
        ),
        (
            "mooncake-delta",
            vec![json!({"session_id": "s", "hash_ids": [1], "output_length": 2, "delay": 5})],
            "line 1: delay: the first turn of a session cannot carry a delay",
        ),
        (
            "dynamo",
            vec![end(json!({"request": {"request_id": "r", "replay": {}}}))],
            "line 1: request.output_tokens: missing field",
        ),
        (
            "dynamo",
            vec![end(json!({"agent_context": {"session_id": "s"}}))],
            "line 1: agent_context: agentic Dynamo traces are not read yet",
        ),
        (
            "dynamo",
            vec![end(json!({"schema": "dynamo.request.trace.v2"}))],
            "line 1: schema: expected \"dynamo.request.trace.v1\"",
        ),
        (
            "dynamo",
            vec![end(json!({})), end(json!({}))],
            "line 2: request.request_id: \"r\" ends twice",
        ),
    ];
    for (i, (format, rows, expected)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.jsonl"));
        write_lines(&path, &rows);
        let shown = path.display().to_string();
        let out = kvtrace([
            "simulate",
            &shown,
            "--trace-format",
            format,
            "-q",
            "--report-json",
            &dir.path().join("r.json").display().to_string(),
        ]);
        let err = one_line_error(&out, 1);
        assert!(
            err.contains(&format!("{shown}: {expected}")),
            "{format}: {err}"
        );
    }
}
