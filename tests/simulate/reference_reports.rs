//! `kvtrace simulate` against the engines it follows, on their own reports: what NVIDIA
//! Dynamo 1.4.2's `python -m dynamo.replay` wrote for each case of
//! `testdata/dynamo/cases.json` (`tools/dynamo-reference.sh` regenerates them) and what
//! AISimulate's engine (`aisimulate-core` 0.13.0, through `tools/aisim-harness`) wrote for each
//! case of `testdata/aisimulate/cases.json` (`REFERENCE=1 tools/simulate-vs-aisimulate.sh`);
//! and, when a Dynamo venv is named, the live differential matrix of
//! `tools/simulate-vs-dynamo.sh`.

use std::path::Path;

use crate::util::{kvtrace, scratch, shared, text};
use serde_json::Value;

/// Keys that measure the simulator's own speed, not the simulated system.
const LIVE: [&str; 3] = [
    "wall_time_ms",
    "processed_tokens_per_s",
    "processed_output_tokens_per_s",
];

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The command line of a case of a `cases.json`, its placeholders filled in, to which the
/// caller adds its outputs: `simulate ARGS --router-mode round_robin -q`. `None`, with a
/// message, for a case that reads `{shared}` when `../shared` is absent.
fn case_args(peer: &str, case: &Value) -> Option<Vec<String>> {
    let name = case["name"].as_str().expect("name");
    let raw: Vec<&str> = case["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    let shared = if raw.iter().any(|a| a.contains("{shared}")) {
        let Some(shared) = shared() else {
            eprintln!("skipped {peer} case {name}: ../shared is absent");
            return None;
        };
        shared.display().to_string()
    } else {
        String::new()
    };
    // The repository's files are named as the script names them, from the repository's
    // root (where cargo runs the tests): a legacy agentic graph's provenance is its file as
    // given.
    let mut args = vec!["simulate".to_string()];
    args.extend(raw.iter().map(|a| {
        a.replace("{slice}", "testdata/mooncake/conversation_head300.jsonl")
            .replace("{testdata}", "testdata")
            .replace("{shared}", &shared)
    }));
    args.extend(["--router-mode".into(), "round_robin".into(), "-q".into()]);
    Some(args)
}

/// Two values the same: numbers within 1e-9 of each other (relative), anything else equal.
fn same(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Array(g), Value::Array(w)) => {
            g.len() == w.len() && g.iter().zip(w).all(|(g, w)| same(g, w))
        }
        (Value::Object(g), Value::Object(w)) => {
            g.len() == w.len() && g.iter().all(|(k, g)| w.get(k).is_some_and(|w| same(g, w)))
        }
        _ => match (got.as_f64(), want.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
            _ => got == want,
        },
    }
}

/// Runs every case of `testdata/<peer>/cases.json` through `kvtrace simulate` (round_robin)
/// and returns each key whose value differs from the peer's report (1e-9 relative), each
/// key kvtrace writes that the peer's report lacks, and each key of the peer's that kvtrace
/// lacks. Cases that read `{shared}` are left out, with a message, when `../shared` is
/// absent.
fn differences(peer: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("testdata").join(peer);
    let cases = read_json(&data.join("cases.json"));
    let dir = scratch();
    let mut differ = Vec::new();
    for case in cases.as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let Some(mut args) = case_args(peer, case) else {
            continue;
        };
        let report = dir.path().join(format!("{name}.json"));
        args.extend(["--report-json".into(), report.display().to_string()]);
        let out = kvtrace(&args);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        let ours = read_json(&report);
        let theirs = read_json(&data.join(format!("{name}.report.json")));
        let (ours, theirs) = (ours.as_object().expect("o"), theirs.as_object().expect("t"));
        for key in theirs.keys() {
            if !ours.contains_key(key) {
                differ.push(format!("{name}: {key}: not in kvtrace's report"));
            }
        }
        for (key, got) in ours {
            if LIVE.contains(&key.as_str()) {
                continue;
            }
            let Some(want) = theirs.get(key) else {
                differ.push(format!("{name}: {key}: not in {peer}'s report"));
                continue;
            };
            if !same(got, want) {
                differ.push(format!("{name}: {key}: kvtrace {got}, {peer} {want}"));
            }
        }
    }
    differ
}

#[test]
fn round_robin_reports_match_dynamos_on_every_key() {
    let differ = differences("dynamo");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Every key of AISimulate's report is in kvtrace's, equal: a request graph's identity and
/// digest, each play's outcome and the digest of the driver's lifecycle transcript too,
/// failed plays among them.
#[test]
fn aisimulate_engine_reports_match_on_every_key() {
    let differ = differences("aisimulate");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Every request's line against AISimulate's, for the cases marked `"requests": true`
/// (disaggregated with a transfer delay: the reuse listed is the prefill's; the request
/// graphs of agentic and weka traces: no turn index): `--report-jsonl` cut to the fields of
/// `<name>.requests.jsonl`, which the harness's `--requests-jsonl` gave, as multisets — the
/// two name a Mooncake trace's sessions differently, and order a graph's lines otherwise.
#[test]
fn aisimulate_engine_requests_match_on_every_listed_field() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/aisimulate");
    let cases = read_json(&data.join("cases.json"));
    let dir = scratch();
    let lines = |path: &Path, fields: Option<&[String]>| -> Vec<Vec<Value>> {
        let text = std::fs::read_to_string(path).expect("lines");
        let mut rows: Vec<Vec<Value>> = text
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
            .map(|v| {
                let fields: Vec<String> = match fields {
                    Some(f) => f.to_vec(),
                    None => v.as_object().expect("object").keys().cloned().collect(),
                };
                fields.iter().map(|f| v[f.as_str()].clone()).collect()
            })
            .collect();
        rows.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        rows
    };
    let mut checked = 0;
    for case in cases.as_array().expect("cases") {
        if case["requests"] != Value::Bool(true) {
            continue;
        }
        let name = case["name"].as_str().expect("name");
        let reference = data.join(format!("{name}.requests.jsonl"));
        let first = std::fs::read_to_string(&reference).expect("reference lines");
        let first: Value =
            serde_json::from_str(first.lines().next().expect("a line")).expect("json");
        let fields: Vec<String> = first.as_object().expect("object").keys().cloned().collect();
        let Some(mut args) = case_args("aisimulate", case) else {
            continue;
        };
        let ours = dir.path().join(format!("{name}.jsonl"));
        let report = dir.path().join(format!("{name}.json"));
        // The report too goes to the scratch directory: by default it is written where the
        // command runs, the repository's root under `cargo test`.
        args.extend([
            "--report-jsonl".into(),
            ours.display().to_string(),
            "--report-json".into(),
            report.display().to_string(),
        ]);
        let out = kvtrace(&args);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        let (ours, theirs) = (lines(&ours, Some(&fields)), lines(&reference, None));
        assert_eq!(ours.len(), theirs.len(), "{name}: requests");
        for (got, want) in ours.iter().zip(&theirs) {
            let equal = got.iter().zip(want).all(|(g, w)| same(g, w));
            assert!(
                equal,
                "{name}: kvtrace {got:?}, aisimulate {want:?} ({fields:?})"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 18, "the cases with reference lines");
}

/// Runs the differential matrix against a live Dynamo when `KVTRACE_DYNAMO_VENV` names a venv
/// with `ai-dynamo==1.4.2` (see docs/commands/simulate.md); `KVTRACE_DYNAMO_SCOPE=full` adds the
/// whole Mooncake traces (tens of minutes).
#[test]
fn live_dynamo_differential_matrix() {
    let Some(venv) = std::env::var_os("KVTRACE_DYNAMO_VENV") else {
        eprintln!("skipped: set KVTRACE_DYNAMO_VENV to a venv with ai-dynamo 1.4.2 to run tools/simulate-vs-dynamo.sh");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scope = std::env::var("KVTRACE_DYNAMO_SCOPE").unwrap_or_else(|_| "quick".into());
    let out = std::process::Command::new(root.join("tools/simulate-vs-dynamo.sh"))
        .arg(scope)
        .env("DYNAMO_VENV", venv)
        .env("KVTRACE", env!("CARGO_BIN_EXE_kvtrace"))
        .output()
        .expect("run tools/simulate-vs-dynamo.sh");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
