//! `simulate --config prediction.yaml`: AISimulate's prediction interface, held to the flags
//! it stands for, to the meaning of its sections (computed here), and to one-line refusals.

use std::path::Path;

use serde_json::Value;

use crate::util::{kvtrace, one_line_error, repo, scratch, text};

const ENGINE: &str = "
engine:
  mode: aggregated
  model: Qwen/Qwen3-32B-FP8
  hardware: h200_sxm
  workers:
    aggregated:
      parallelism: {replicas: 2}
      kv_cache:
        block_size: 64
        capacity: {type: fixed, blocks: 4000}
      timing: {type: polynomial}
";

fn write(dir: &Path, name: &str, yaml: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, yaml).expect("write");
    path.display().to_string()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
}

fn predict(args: &[&str]) -> std::process::Output {
    let mut all = vec!["simulate", "-q"];
    all.extend_from_slice(args);
    kvtrace(all)
}

/// Runs the configuration with per-request capture into `dir/out`, which it returns.
fn captured(dir: &Path, config: &str) -> std::path::PathBuf {
    let out_dir = dir.join("out");
    let out = predict(&[
        "--config",
        config,
        "--output-dir",
        &out_dir.display().to_string(),
        "--capture-per-request",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    out_dir
}

/// Runs the flags a prediction stands for, and holds the prediction's report in `out_dir` to
/// theirs on every key but the simulator's own timing; returns the flags' report.
fn same_as_flags(dir: &Path, out_dir: &Path, flags: &[&str]) -> Value {
    let report = dir.join("flags.json");
    let report_arg = report.display().to_string();
    let mut args = flags.to_vec();
    args.extend(["--report-json", &report_arg]);
    let out = predict(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (a, b) = (
        read_json(&out_dir.join("prediction.json")),
        read_json(&report),
    );
    for (key, value) in b.as_object().expect("report") {
        if !key.contains("wall") && !key.starts_with("processed_") {
            assert_eq!(&a[key], value, "{key}");
        }
    }
    b
}

#[test]
fn a_trace_prediction_is_the_same_run_as_its_flags() {
    let dir = scratch();
    let slice = repo("testdata/mooncake/conversation_head300.jsonl");
    let config = write(
        dir.path(),
        "p.yaml",
        &format!(
            "traffic:\n  source: {{type: trace, paths: [{slice}], block_size: 512}}\n  load: {{type: trace_timestamps, speedup: 2}}\nevaluation:\n  sla: {{ttft_ms: 800, itl_ms: 40}}\n{ENGINE}"
        ),
    );
    let out_dir = captured(dir.path(), &config);
    same_as_flags(
        dir.path(),
        &out_dir,
        &[
            &slice,
            "--num-workers",
            "2",
            "--arrival-speedup-ratio",
            "2",
            "--sla-ttft-ms",
            "800",
            "--sla-itl-ms",
            "40",
            "--extra-engine-args",
            r#"{"block_size":64,"num_gpu_blocks":4000,"engine_version":"aisimulate-0.13"}"#,
        ],
    );
    let lines = std::fs::read_to_string(out_dir.join("requests.jsonl")).expect("requests");
    assert_eq!(lines.lines().count(), 300);
}

#[test]
fn a_prefill_cadence_on_attention_dp_ranks_is_the_same_run_as_its_flags() {
    let dir = scratch();
    let slice = repo("testdata/mooncake/conversation_head300.jsonl");
    let engine = ENGINE
        .replace(
            "parallelism: {replicas: 2}",
            "parallelism: {replicas: 2, attention_data: 2}\n      scheduler: {prefill_schedule_interval: 3}",
        )
        .replace("blocks: 4000", "blocks: 1000");
    let config = write(
        dir.path(),
        "c.yaml",
        &format!(
            "traffic:\n  source: {{type: trace, paths: [{slice}], block_size: 512}}\n  load: {{type: trace_timestamps}}\n{engine}"
        ),
    );
    let out_dir = captured(dir.path(), &config);
    let engine_args = |interval: u32| {
        format!(
            r#"{{"block_size":64,"num_gpu_blocks":1000,"dp_size":2,"prefill_schedule_interval":{interval},"engine_version":"aisimulate-0.13"}}"#
        )
    };
    let (cadence, every_pass) = (engine_args(3), engine_args(1));
    let with = same_as_flags(
        dir.path(),
        &out_dir,
        &[
            &slice,
            "--num-workers",
            "2",
            "--extra-engine-args",
            &cadence,
        ],
    );
    let report = dir.path().join("every.json");
    let out = predict(&[
        &slice,
        "--num-workers",
        "2",
        "--extra-engine-args",
        &every_pass,
        "--report-json",
        &report.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_ne!(
        with["mean_ttft_ms"],
        read_json(&report)["mean_ttft_ms"],
        "the cadence defers prefills"
    );
}

#[test]
fn a_weka_prediction_is_the_same_run_as_its_flags() {
    let dir = scratch();
    let sample = repo("testdata/traces/weka_sample.jsonl");
    let config = write(
        dir.path(),
        "w.yaml",
        &format!(
            "traffic:\n  source: {{type: trace, format: weka, paths: [{sample}], nested_timestamp_basis: absolute}}\n  load: {{type: trace_timestamps}}\n{ENGINE}"
        ),
    );
    let out_dir = captured(dir.path(), &config);
    let flags = same_as_flags(
        dir.path(),
        &out_dir,
        &[
            &sample,
            "--trace-format",
            "weka",
            "--nested-timestamp-basis",
            "absolute",
            "--num-workers",
            "2",
            "--extra-engine-args",
            r#"{"block_size":64,"num_gpu_blocks":4000,"engine_version":"aisimulate-0.13"}"#,
        ],
    );
    assert_eq!(flags["num_requests"], 17);
}

#[test]
fn a_synthetic_session_carries_its_history_and_stops_per_load_unit() {
    let dir = scratch();
    let config = write(
        dir.path(),
        "s.yaml",
        &format!(
            "traffic:\n  source:\n    type: synthetic-session\n    new_input_tokens_per_turn: 300\n    output_tokens_per_turn: 20\n    session: {{turns: 3, inter_turn_delay_ms: 50}}\n  load: {{type: concurrency, concurrency: 4}}\n  stop: {{sessions_per_load_unit: 1.5}}\n{ENGINE}"
        ),
    );
    let out_dir = captured(dir.path(), &config);
    let records: Vec<Value> = std::fs::read_to_string(out_dir.join("requests.jsonl"))
        .expect("requests")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    // round(1.5 × 4) = 6 sessions of 3 turns; turn k's prompt is the previous prompt, its
    // 20 output tokens and 300 new ones.
    assert_eq!(records.len(), 18);
    for r in &records {
        let k = r["turn_index"].as_u64().expect("turn");
        assert_eq!(r["input_length"].as_u64(), Some(300 + k * 320), "{r}");
    }
    let report = read_json(&out_dir.join("prediction.json"));
    assert_eq!(report["completed_requests"].as_u64(), Some(18));
}

#[test]
fn overrides_outputs_and_refusals() {
    let dir = scratch();
    let config = write(
        dir.path(),
        "p.yaml",
        &format!(
            "traffic:\n  source: {{type: synthetic, input_tokens: 512, output_tokens: 16}}\n  load: {{type: concurrency, concurrency: 2}}\n  stop: {{requests: 6}}\n{ENGINE}"
        ),
    );
    let out_dir = dir.path().join("out");
    let shown = out_dir.display().to_string();
    // --set replaces whole mappings and scalars, left to right; --format json prints the report.
    let out = predict(&[
        "--config",
        &config,
        "--output-dir",
        &shown,
        "--set",
        "traffic.stop.requests=9",
        "--set",
        "traffic.load={type: poisson, requests_per_second: 20}",
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let printed: Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert_eq!(printed["completed_requests"].as_u64(), Some(9));
    // An existing directory needs --overwrite, which leaves other files alone.
    std::fs::write(out_dir.join("notes.txt"), "mine").expect("write");
    let again = ["--config", &config, "--output-dir", &shown];
    let err = one_line_error(&predict(&again), 2);
    assert!(err.contains("exists and is not empty"), "{err}");
    let mut overwrite = again.to_vec();
    overwrite.push("--overwrite");
    assert_eq!(predict(&overwrite).status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(out_dir.join("notes.txt")).expect("kept"),
        "mine"
    );
    let fresh = dir.path().join("fresh").display().to_string();
    for (set, expected) in [
        (
            "traffic.load.concurency=3",
            "p.yaml: traffic.load: unknown field `concurency`",
        ),
        (
            "engine.workers.aggregated.timing.type=default",
            "engine.workers.aggregated.timing.type: default timing reads AIC's performance data",
        ),
        (
            "engine.workers.aggregated.kv_cache.capacity={type: default, memory_fraction: 0.9}",
            "kv_cache.capacity.type: \"default\": the default capacity needs AIC's memory model",
        ),
        (
            "traffic.stop.max_virtual_time_seconds=30",
            "traffic.stop.max_virtual_time_seconds: a virtual-time cutoff is not modelled",
        ),
        (
            "router={policy: kv_router}",
            "router: the router section belongs to the dynamo stack",
        ),
        (
            "planner.policy=enabled",
            "planner.policy: the planner is not modelled",
        ),
        (
            "traffic.load={type: poisson, requests_per_second: 0}",
            "traffic.load.requests_per_second: must be greater than 0, got 0",
        ),
        (
            "traffic.0=1",
            "--set traffic.0: a dotted path of field names",
        ),
    ] {
        let out = predict(&["--config", &config, "--output-dir", &fresh, "--set", set]);
        let err = one_line_error(&out, 2);
        assert!(err.contains(expected), "{set}: {err}");
    }
    // The nested-timestamp basis: one of three words, and for weka traces only.
    let sample = repo("testdata/traces/weka_sample.jsonl");
    for (source, expected) in [
        (
            format!("{{type: trace, format: weka, paths: [{sample}], nested_timestamp_basis: sideways}}"),
            "traffic.source.nested_timestamp_basis: \"sideways\": expected auto, absolute or relative",
        ),
        (
            format!("{{type: trace, paths: [{sample}], nested_timestamp_basis: absolute}}"),
            "traffic.source.nested_timestamp_basis: applies to weka traces only",
        ),
    ] {
        let set = format!("traffic.source={source}");
        let out = predict(&["--config", &config, "--output-dir", &fresh, "--set", &set]);
        let err = one_line_error(&out, 2);
        assert!(err.contains(expected), "{set}: {err}");
    }
    let err = one_line_error(&predict(&["--config", &config, "--num-workers", "3"]), 2);
    assert!(err.contains("cannot be used with"), "{err}");
    assert!(!Path::new(&fresh).exists(), "a refused run writes nothing");
}
