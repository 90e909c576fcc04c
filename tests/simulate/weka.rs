//! Weka/AgentX agent traces (`--trace-format weka`): every recorded call becomes a request,
//! and the dependencies inferred from the calls' prompts and times hold in the simulated
//! run. Expectations are read from `testdata/traces/weka_sample.jsonl` here, by hand-written
//! rules of the format, not by kvtrace's reader; the sample's calls have distinct input
//! lengths, so a request is found by its `in`.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::engines::simulate;
use crate::util::{kvtrace, one_line_error, repo, scratch};

fn sample() -> String {
    repo("testdata/traces/weka_sample.jsonl")
}

/// The sample's plays as JSON.
fn plays() -> Vec<Value> {
    std::fs::read_to_string(sample())
        .expect("sample")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

/// Every call of a play, sub-agents' included.
fn calls(play: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for r in play["requests"].as_array().expect("requests") {
        match r["type"].as_str() {
            Some("subagent") => out.extend(r["requests"].as_array().expect("inner").clone()),
            _ => out.push(r.clone()),
        }
    }
    out
}

/// Runs the sample and returns the report and each request's record by input length.
fn run(dir: &Path, source: &str) -> (serde_json::Map<String, Value>, HashMap<u64, Value>) {
    let jsonl = dir.join("requests.jsonl");
    let report = simulate(
        dir,
        &[
            source,
            "--trace-format",
            "weka",
            "--num-workers",
            "2",
            "--extra-engine-args",
            "{\"block_size\":16}",
            "--report-jsonl",
            &jsonl.display().to_string(),
        ],
    );
    let by_input = std::fs::read_to_string(jsonl)
        .expect("jsonl")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("json");
            (v["input_length"].as_u64().expect("input"), v)
        })
        .collect();
    (report, by_input)
}

fn at(requests: &HashMap<u64, Value>, input: u64, key: &str) -> f64 {
    requests[&input][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} of the call with in={input}"))
}

#[test]
fn every_call_is_a_request_and_the_inferred_waits_hold() {
    let dir = scratch();
    let (report, r) = run(dir.path(), &sample());
    let all: Vec<Value> = plays().iter().flat_map(calls).collect();
    let sum = |k: &str| all.iter().map(|c| c[k].as_u64().expect(k)).sum::<u64>();
    assert_eq!(report["num_requests"], all.len());
    assert_eq!(report["completed_requests"], all.len());
    assert_eq!(report["total_input_tokens"], sum("in"));
    assert_eq!(report["total_output_tokens"], sum("out"));
    assert_eq!(r.len(), all.len(), "distinct input lengths");

    let arrival = |i| at(&r, i, "arrival_time_ms");
    let done = |i| at(&r, i, "terminal_time_ms");
    let ms = 1e-6;
    // Each play starts at its first call.
    for first in [230, 128, 255] {
        assert_eq!(arrival(first), 0.0, "in={first}");
    }
    // Play 1. A call that extends the previous prompt follows it after the recorded gap
    // (t 1.5 against the first call's end at 0 + 1.0).
    assert!(arrival(300) + ms >= done(230) + 500.0);
    // The completed sub-agent spawns on completion of the call before its marker (t 2.9
    // after that call ended at 2.7), and the parent's next call (t 4.3) joins its last call
    // (ended 3.5 + 0.6) and follows its own predecessor (ended 2.7).
    assert!(arrival(150) + ms >= done(300) + 200.0);
    assert!(arrival(430) + ms >= done(210) + 200.0);
    assert!(arrival(430) + ms >= done(300) + 1600.0);
    // A call that forks the main prompt while the main call runs (t 4.4 against 4.3–5.3) is
    // a worker spawned on dispatch 100 ms later, after the main stream's latest ended call.
    assert!(arrival(290) + ms >= arrival(430) + 100.0);
    assert!(arrival(290) + ms >= done(300));
    // The background sub-agent (t 5.1) is spawned by the call before its marker, still
    // running then (t 4.4 to 5.2): on dispatch, 700 ms later; nothing waits for it.
    assert!(arrival(100) + ms >= arrival(290) + 700.0);
    let session = |i: u64| r[&i]["session_id"].as_str().expect("session").to_owned();
    assert!(session(430).ends_with(":session:root"));
    assert!(session(290).ends_with(":session:root:worker:0"));
    assert!(session(150).ends_with(":session:subagent:2:a1"));
    assert_eq!(session(150), session(210));
    // Play 2: a first call that shares nothing is the main stream's preamble; a fork while
    // its parent runs is a worker, and the call extending it stays on that worker.
    assert!(session(128).ends_with(":session:root"));
    assert_eq!(session(128), session(256));
    assert!(session(305).ends_with(":session:root:worker:0"));
    assert_eq!(session(305), session(440));
    assert!(arrival(440) + ms >= done(305) + 700.0);
    // Play 3: a fork that starts after its parent ended resumes the conversation (a seam):
    // one stream.
    assert_eq!(session(255), session(250));
    assert_eq!(session(250), session(310));
    assert!(arrival(250) + ms >= done(255) + 1000.0);
    // Plays are namespaced by their source: three distinct root sessions.
    assert_ne!(session(230), session(128));
    assert_ne!(session(128), session(255));
}

#[test]
fn a_directory_corpus_reads_its_files_in_path_order() {
    let dir = scratch();
    let corpus = dir.path().join("corpus");
    std::fs::create_dir_all(corpus.join("more")).expect("dirs");
    let lines: Vec<String> = std::fs::read_to_string(sample())
        .expect("sample")
        .lines()
        .map(str::to_owned)
        .collect();
    std::fs::write(corpus.join("a.json"), &lines[0]).expect("write");
    std::fs::write(
        corpus.join("more/b.jsonl"),
        format!("{}\n{}\n", lines[1], lines[2]),
    )
    .expect("write");
    std::fs::write(corpus.join("notes.txt"), "not a trace").expect("write");
    let (report, _) = run(dir.path(), &corpus.display().to_string());
    let all: usize = plays().iter().map(|p| calls(p).len()).sum();
    assert_eq!(report["num_requests"], all);
    assert_eq!(report["completed_requests"], all);
}

#[test]
fn bad_weka_input_is_a_one_line_error_with_line_and_field() {
    let dir = scratch();
    let good = "{\"id\":\"x\",\"block_size\":64,\"hash_id_scope\":\"local\",\"requests\":[{\"type\":\"n\",\"t\":0,\"model\":\"m\",\"in\":10,\"out\":1}]}";
    let call = |extra: &str| {
        format!("{{\"type\":\"n\",\"t\":1,\"model\":\"m\",\"in\":10,\"out\":1{extra}}}")
    };
    let play = |requests: &str, head: &str| {
        format!("{{\"id\":\"y\",\"block_size\":64,\"hash_id_scope\":\"local\"{head},\"requests\":[{call0},{requests}]}}", call0 = call(""))
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("t.jsonl", format!("{good}\n{{\"id\":\"y\",\"block_size\":64,\"hash_id_scope\":\"local\",\"requests\":[{{\"type\":\"n\",\"model\":\"m\",\"in\":1,\"out\":1}}]}}\n"), "line 2: t: missing field"),
        ("kind.jsonl", play("{\"type\":\"tool\",\"t\":2}", ""), "line 1: type: unknown variant"),
        ("scope.jsonl", good.replace("local", "global"), "line 1: hash_id_scope: \"global\""),
        ("status.jsonl", play("{\"type\":\"subagent\",\"t\":2,\"agent_id\":\"a\",\"subagent_type\":\"k\",\"status\":\"failed\",\"requests\":[]}", ""), "line 1: requests[1].status"),
        ("blocking.jsonl", play("{\"type\":\"subagent\",\"t\":2,\"agent_id\":\"a\",\"subagent_type\":\"k\",\"status\":\"completed\",\"requests\":[]}", ""), "line 1: requests[1].requests: a completed sub-agent with no calls"),
        ("empty_in.jsonl", play(&call(",\"in\":0").replace("\"in\":10,", ""), ""), "line 1: requests[1].in: a call with no input tokens"),
        ("api.jsonl", play(&call(",\"api_time\":-1"), ""), "line 1: requests[1].api_time"),
        ("model.jsonl", play(&call("").replace("\"m\"", "\"other\""), ",\"models\":[\"m\"]"), "line 1: requests[1].model: \"other\" is not among"),
        ("blocks.jsonl", format!("{good}\n{}\n", good.replace("64", "16")), "line 2: block_size: 16, but the corpus's earlier traces have 64"),
        // Lines counted on from object to object: 1, a blank line, 8 lines (one after each of
        // its 7 commas), a blank line, and the damaged object on line 12.
        ("later.jsonl", format!("{good}\n\n{}\n\n{}\n", good.replace(",", ",\n"), good.replace("64", "16")), "line 12: block_size: 16"),
        ("two.json", format!("{good}\n{good}\n"), "line 2: json: a .json Weka source holds one trace object"),
        ("broken.jsonl", format!("{good}\n{{\"id\": \n"), "line 3: json: not a JSON trace object"),
        ("only_sub.jsonl", "{\"id\":\"z\",\"block_size\":64,\"hash_id_scope\":\"local\",\"requests\":[{\"type\":\"subagent\",\"t\":2,\"agent_id\":\"a\",\"subagent_type\":\"k\",\"status\":\"async_launched\",\"requests\":[".to_string() + &call("") + "]}]}", "line 1: requests: the trace holds no call of its own"),
        ("trace.txt", good.to_string(), "a Weka source file ends in .json or .jsonl"),
    ];
    for (name, text, says) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        let out = kvtrace([
            "simulate",
            &path.display().to_string(),
            "--trace-format",
            "weka",
            "-q",
        ]);
        let err = one_line_error(&out, 1);
        assert!(err.contains(name), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
    }

    // Nested times before their marker are relative under auto, an error under absolute.
    let nested = dir.path().join("nested.jsonl");
    std::fs::write(
        &nested,
        play(
            &format!("{{\"type\":\"subagent\",\"t\":5,\"agent_id\":\"a\",\"subagent_type\":\"k\",\"status\":\"async_launched\",\"requests\":[{}]}}", call("")),
            "",
        ),
    )
    .expect("write");
    let nested = nested.display().to_string();
    let args = |basis: &str| {
        kvtrace([
            "simulate",
            &nested,
            "--trace-format",
            "weka",
            "--nested-timestamp-basis",
            basis,
            "-q",
            "--report-json",
            &dir.path()
                .join(format!("{basis}.json"))
                .display()
                .to_string(),
        ])
    };
    assert_eq!(args("auto").status.code(), Some(0));
    let err = one_line_error(&args("absolute"), 1);
    assert!(
        err.contains("line 1: requests[1].requests[0].t: 1 is before its sub-agent's marker"),
        "{err}"
    );
}
