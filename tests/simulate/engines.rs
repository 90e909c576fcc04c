//! `kvtrace simulate`: parity with the reference report, Mooncake traces through both
//! routers, per-request output and the one-line errors.

use std::path::{Path, PathBuf};

use crate::util::{kvtrace, kvtrace_with, scratch, shared, text};
use serde_json::Value;

fn mooncake_slice() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/mooncake/conversation_head300.jsonl")
        .display()
        .to_string()
}

/// Runs `kvtrace simulate ARGS --report-json DIR/report.json -q` and reads the report.
pub(crate) fn simulate(dir: &Path, args: &[&str]) -> serde_json::Map<String, Value> {
    let report = dir.join("report.json");
    let mut all: Vec<String> = vec!["simulate".into()];
    all.extend(args.iter().map(|s| s.to_string()));
    all.extend([
        "--report-json".into(),
        report.display().to_string(),
        "-q".into(),
    ]);
    let out = kvtrace(&all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(report).expect("report")).expect("json");
    v.as_object().expect("object").clone()
}

/// Keys that measure the simulator's own speed, not the simulated system.
fn live(key: &str) -> bool {
    matches!(
        key,
        "wall_time_ms" | "processed_tokens_per_s" | "processed_output_tokens_per_s"
    )
}

pub(crate) fn without_live(
    mut m: serde_json::Map<String, Value>,
) -> serde_json::Map<String, Value> {
    m.retain(|k, _| !live(k));
    m
}

#[test]
fn reproduces_the_reference_report_of_a_synthetic_closed_loop() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let report = dir.path().join("r.json");
    // Dynamo printed its table through rich on a terminal wide enough for all of it.
    let out = kvtrace_with(
        [
            "simulate",
            "--input-tokens",
            "5000",
            "--output-tokens",
            "500",
            "--request-count",
            "1000",
            "--num-workers",
            "1",
            "--replay-mode",
            "offline",
            "--replay-concurrency",
            "100",
            "--extra-engine-args",
            "{\"block_size\":512}",
            "--report-json",
            &report.display().to_string(),
        ],
        &[("COLUMNS", "200")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ours: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("ours")).expect("json");
    let path = shared.join("dynamo/synthetic_1w_conc100.report.json");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("reference")).expect("json");
    let (ours, reference) = (
        ours.as_object().expect("o"),
        reference.as_object().expect("r"),
    );
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "the same 74 keys, sorted"
    );
    for (key, want) in reference {
        if live(key) {
            continue;
        }
        let (got, want) = (ours[key].as_f64().expect("n"), want.as_f64().expect("n"));
        let rel = (got - want).abs() / want.abs().max(1e-12);
        assert!(rel <= 1e-6, "{key}: {got} vs {want}");
    }
    let printed = text(&out.stdout);
    let expected =
        std::fs::read_to_string(shared.join("dynamo/synthetic_1w_conc100.stdout.txt")).expect("t");
    let same_lines = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("Wall Time") && !l.starts_with("Saved full report"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(same_lines(&printed), same_lines(&expected), "the table");
}

#[test]
fn mooncake_trace_through_both_routers_is_reproducible() {
    let dir = scratch();
    let trace = mooncake_slice();
    let engine = "{\"block_size\": 64, \"num_gpu_blocks\": 4096}";
    let run = |router: &str, seed: &str| {
        without_live(simulate(
            dir.path(),
            &[
                &trace,
                "--num-workers",
                "3",
                "--router-mode",
                router,
                "--extra-engine-args",
                engine,
                "--seed",
                seed,
            ],
        ))
    };
    let rr = run("round_robin", "1");
    assert_eq!(rr["num_requests"], 300);
    assert_eq!(rr["completed_requests"], 300);
    assert_eq!(rr.len(), 71);
    let kv = run("kv_router", "1");
    assert_eq!(kv, run("kv_router", "1"), "same seed, same report");
    let reuse =
        |m: &serde_json::Map<String, Value>| m["prefix_cache_reused_ratio"].as_f64().expect("r");
    assert!(
        reuse(&kv) > reuse(&rr),
        "kv_router follows cached prefixes: {} vs {}",
        reuse(&kv),
        reuse(&rr)
    );
    let jsonl = dir.path().join("faster.jsonl");
    simulate(
        dir.path(),
        &[
            &trace,
            "--arrival-speedup-ratio",
            "4",
            "--report-jsonl",
            &jsonl.display().to_string(),
        ],
    );
    let last_arrival = std::fs::read_to_string(&jsonl)
        .expect("jsonl")
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("line")["arrival_time_ms"]
                .as_f64()
                .expect("t")
        })
        .fold(0.0, f64::max);
    assert_eq!(
        last_arrival,
        102_000.0 / 4.0,
        "timestamps divided by the ratio"
    );
}

#[test]
fn per_request_lines_and_rejections() {
    let dir = scratch();
    let jsonl = dir.path().join("requests.jsonl");
    let report = simulate(
        dir.path(),
        &[
            &mooncake_slice(),
            "--extra-engine-args",
            "{\"block_size\": 512, \"num_gpu_blocks\": 20}",
            "--report-jsonl",
            &jsonl.display().to_string(),
            "--sla-ttft-ms",
            "1000",
            "--per-request-metrics",
        ],
    );
    let tpot = report["mean_tpot_ms"].as_f64().expect("tpot");
    let own = report["mean_per_request_itl_ms"]
        .as_f64()
        .expect("per-request itl");
    assert!((tpot - own).abs() < 1e-9, "a request's own ITL is its TPOT");
    assert!(
        report["p99_per_request_output_token_throughput"]
            .as_f64()
            .expect("rate")
            > 0.0
    );
    let lines: Vec<Value> = std::fs::read_to_string(&jsonl)
        .expect("jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(lines.len(), 300);
    let rejected = lines
        .iter()
        .filter(|l| l["terminal_status"] == "rejected")
        .count();
    assert!(rejected > 0, "prompts above 20 blocks of 512 cannot fit");
    assert_eq!(report["num_requests"], 300);
    assert_eq!(report["completed_requests"], 300 - rejected);
    let done = lines
        .iter()
        .find(|l| l["terminal_status"] == "completed")
        .expect("one completed");
    let ttft = done["ttft_ms"].as_f64().expect("ttft");
    let first = done["first_token_ms"].as_f64().expect("first");
    let arrival = done["arrival_time_ms"].as_f64().expect("arrival");
    assert!((ttft - (first - arrival)).abs() < 1e-9);
    assert!(report["goodput_completed_requests"].as_u64().expect("g") <= 300);
}

#[test]
fn a_single_prompt_matches_the_timing_model_spot_check() {
    let dir = scratch();
    let r = simulate(
        dir.path(),
        &[
            "--input-tokens",
            "5000",
            "--output-tokens",
            "20",
            "--request-count",
            "1",
            "--replay-concurrency",
            "1",
            "--extra-engine-args",
            "{\"block_size\": 512, \"speedup_ratio\": 2, \"decode_speedup_ratio\": 4}",
        ],
    );
    let get = |k: &str| r[k].as_f64().expect(k);
    assert!((get("mean_ttft_ms") - 52.193).abs() < 1e-3);
    assert!((get("mean_itl_ms") - 0.72162).abs() < 1e-5);
}

/// The two references' vLLM pass timing, computed here from the polynomial model: Dynamo
/// 1.4.2 adds a decode step to the pass that completes a prompt, timed by the KV blocks the
/// pool holds; AISimulate 0.13 samples the first token from the prefill pass, and times each
/// decode step by the decoding requests' context lengths.
#[test]
fn engine_version_selects_whose_pass_timing_the_engine_follows() {
    let dir = scratch();
    let trace = dir.path().join("one.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 3, \"hash_ids\": [1, 2]}\n",
    )
    .expect("write");
    let prefill = |n: f64| 4.209989e-07 * (n * n) + 1.518344e-02 * n + 1.650142e+01;
    let decode = |u: f64| -25.74 * (u * u) + 54.01 * u + 5.74;
    let capacity = 16384.0 * 64.0;
    let ns = |ms: f64| (ms * 1e6).round() / 1e6;
    for (version, ttft, itl) in [
        (
            "dynamo-1.4.2",
            ns(prefill(1000.0)) + ns(decode(1024.0 / capacity)),
            // Tokens 1001 and 1002 still fit the 16 blocks of 64 the prompt filled.
            ns(decode(1024.0 / capacity)),
        ),
        (
            "aisimulate-0.13",
            ns(prefill(1000.0)),
            ns(decode(1001.0 / capacity)),
        ),
    ] {
        let r = simulate(
            dir.path(),
            &[
                &trace.display().to_string(),
                "--extra-engine-args",
                &format!("{{\"engine_version\": \"{version}\"}}"),
            ],
        );
        let get = |k: &str| r[k].as_f64().expect(k);
        assert!(
            (get("mean_ttft_ms") - ttft).abs() < 1e-9,
            "{version}: {r:?}"
        );
        assert!((get("min_itl_ms") - itl).abs() < 1e-9, "{version}: {r:?}");
    }
}

#[test]
fn meaningless_combinations_are_one_line_usage_errors() {
    let trace = mooncake_slice();
    let synthetic = [
        "--input-tokens",
        "5",
        "--output-tokens",
        "5",
        "--request-count",
        "2",
    ];
    let with =
        |extra: &[&'static str]| -> Vec<&str> { synthetic.iter().chain(extra).copied().collect() };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![&trace, "--input-tokens", "5"], "not both"),
        (
            vec!["--input-tokens", "5", "--output-tokens", "5"],
            "all of --input-tokens",
        ),
        (
            vec![&trace, "--turns-per-session", "2"],
            "--turns-per-session applies to synthetic",
        ),
        (
            vec![
                "--input-tokens",
                "5",
                "--output-tokens",
                "5",
                "--request-count",
                "2",
            ],
            "exactly one of --replay-concurrency",
        ),
        (
            vec![&trace, "--extra-engine-args", "{\"blok_size\": 4}"],
            "unknown field `blok_size`",
        ),
        (
            vec![&trace, "--extra-engine-args", "{\"engine_type\": \"tgi\"}"],
            "engine_type \"tgi\"",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"engine_type\": \"sglang\", \"max_model_len\": 4000}",
            ],
            "max_model_len: Dynamo 1.4.2's engine takes it for engine_type vllm only",
        ),
        (
            vec![&trace, "--router-config", "{\"x\": 1}"],
            "--router-config configures",
        ),
        (
            vec![
                &trace,
                "--router-mode",
                "kv_router",
                "--router-config",
                "{\"x\": 1}",
            ],
            "unknown field `x`",
        ),
        (
            vec![&trace, "--num-workers", "0"],
            "--num-workers must be at least 1",
        ),
        (
            vec![&trace, "--replay-concurrency", "0"],
            "--replay-concurrency must be at least 1",
        ),
        (
            vec![&trace, "--arrival-speedup-ratio", "0"],
            "--arrival-speedup-ratio 0",
        ),
        (
            vec![&trace, "--arrival-speedup-ratio", "1e-320"],
            "--arrival-speedup-ratio 1e-320: the trace's times, slowed down by it, pass",
        ),
        (
            vec![&trace, "--trace-block-size", "0"],
            "--trace-block-size must be at least 1",
        ),
        (
            vec![&trace, "--replay-mode", "online", "--l1-size-gb", "1"],
            "runs offline only",
        ),
        (
            vec![&trace, "--num-prefill-workers", "1"],
            "need --prefill-engine-args and --decode-engine-args",
        ),
        (
            vec![&trace, "--prefill-engine-args", "{}"],
            "needs both --prefill-engine-args and --decode-engine-args",
        ),
        (
            vec![
                &trace,
                "--prefill-engine-args",
                "{\"worker_type\": \"decode\"}",
                "--decode-engine-args",
                "{}",
            ],
            "--prefill-engine-args: worker_type must be \"prefill\"",
        ),
        (
            vec![
                &trace,
                "--prefill-engine-args",
                "{\"block_size\": 32}",
                "--decode-engine-args",
                "{\"block_size\": 64}",
            ],
            "block sizes differ (32 and 64)",
        ),
        (
            vec![
                &trace,
                "--prefill-engine-args",
                "{}",
                "--decode-engine-args",
                "{}",
                "--num-workers",
                "2",
            ],
            "describe aggregated workers",
        ),
        (
            vec![
                &trace,
                "--prefill-engine-args",
                "{\"engine_type\": \"sglang\", \"block_size\": 64}",
                "--decode-engine-args",
                "{\"block_size\": 64}",
            ],
            "prefill and decode engine_type differ",
        ),
        (
            vec![
                &trace,
                "--prefill-engine-args",
                "{\"engine_type\": \"trtllm\"}",
                "--decode-engine-args",
                "{\"engine_type\": \"trtllm\"}",
            ],
            "disaggregated trtllm: Dynamo 1.4.2 refuses it",
        ),
        (
            vec![
                "testdata/traces/mooncake_delta.jsonl",
                "--trace-format",
                "mooncake-delta",
                "--trace-block-size",
                "64",
                "--prefill-engine-args",
                "{}",
                "--decode-engine-args",
                "{\"engine_version\": \"aisimulate-0.13\"}",
            ],
            "aggregated workers only under Dynamo 1.4.2's engine",
        ),
        (
            vec![
                &trace,
                "--prefill-engine-args",
                "{\"kv_transfer_timing_mode\": \"eager\"}",
                "--decode-engine-args",
                "{}",
            ],
            "kv_transfer_timing_mode \"eager\": expected full_prompt or destination_missing",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"engine_type\": \"sglang\"}",
                "--l1-size-gb",
                "1",
            ],
            "KV offload models LMCache's vLLM connector",
        ),
        (vec![&trace, "--eviction-policy", "LRU"], "need KV offload"),
        (vec![&trace, "--record", "x.lct"], "need KV offload"),
        (
            vec![&trace, "--l1-size-gb", "1", "--offload-chunk-size", "0"],
            "--offload-chunk-size must be at least 1",
        ),
        (
            vec![&trace, "--l1-size-gb", "1", "--offload-l2-gbps", "0"],
            "--offload-l2-gbps 0",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"engine_type\": \"sglang\", \"sglang\": {\"schedule_policy\": \"random\"}}",
            ],
            "sglang.schedule_policy \"random\"",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"sglang\": {\"pagesize\": 4}}",
            ],
            "sglang: unknown field `pagesize`",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"engine_type\": \"sglang\", \"enable_chunked_prefill\": false, \"engine_version\": \"aisimulate-0.13\"}",
            ],
            "--extra-engine-args: enable_chunked_prefill false: SGLang's scheduler always chunks (AISimulate's engine refuses it)",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"engine_type\": \"sglang\", \"dp_size\": 3, \"sglang\": {\"chunked_prefill_size\": 2}, \"engine_version\": \"aisimulate-0.13\"}",
            ],
            "--extra-engine-args: dp_size 3: SGLang's attention DP gives each rank",
        ),
        (
            vec![
                &trace,
                "--extra-engine-args",
                "{\"worker_type\": \"prefill\"}",
            ],
            "worker_type prefill/decode",
        ),
        (vec![&trace, "--sla-ttft-ms=-1"], "--sla-ttft-ms -1"),
        (with(&["--request-rate", "0"]), "--request-rate 0"),
        (
            with(&["--arrival-interval-ms=-1"]),
            "--arrival-interval-ms -1",
        ),
        (
            with(&["--replay-concurrency", "2", "--shared-prefix-ratio", "1.5"]),
            "--shared-prefix-ratio 1.5",
        ),
        (
            with(&["--replay-concurrency", "2", "--inter-turn-delay-ms=-3"]),
            "--inter-turn-delay-ms -3",
        ),
        (
            with(&["--replay-concurrency", "2", "--turns-per-session", "0"]),
            "must be at least 1",
        ),
    ];
    for (args, expected) in cases {
        let out = kvtrace(std::iter::once("simulate").chain(args.iter().copied()));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    let missing = kvtrace([
        "simulate",
        &trace,
        "--extra-engine-args",
        "/no/such/args.json",
    ]);
    let err = text(&missing.stderr);
    assert_eq!(
        missing.status.code(),
        Some(1),
        "an unreadable file is an I/O error: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/no/such/args.json") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn a_bad_trace_row_names_file_line_and_field() {
    let dir = scratch();
    let bad: PathBuf = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n\
         {\"timestamp\": 1, \"input_length\": 2000, \"output_length\": 2, \"hash_ids\": [1, 2]}\n",
    )
    .expect("write");
    let out = kvtrace(["simulate", &bad.display().to_string(), "-q"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad.jsonl") && err.contains("line 2") && err.contains("hash_ids"));
    assert!(err.contains("--trace-block-size"), "{err}");
}

#[test]
fn disaggregated_pools_hand_prompts_to_decode_workers_under_both_routers() {
    let dir = scratch();
    let trace = mooncake_slice();
    let disagg = |router: &str, prefill_args: &str| {
        simulate(
            dir.path(),
            &[
                &trace,
                "--router-mode",
                router,
                "--prefill-engine-args",
                prefill_args,
                "--decode-engine-args",
                "{\"worker_type\": \"decode\"}",
                "--num-prefill-workers",
                "2",
                "--num-decode-workers",
                "2",
            ],
        )
    };
    let get = |m: &serde_json::Map<String, Value>, k: &str| m[k].as_f64().expect(k);
    let aggregated = simulate(dir.path(), &[&trace, "--num-workers", "4"]);
    for router in ["round_robin", "kv_router"] {
        let r = disagg(router, "{\"worker_type\": \"prefill\"}");
        assert_eq!(r["completed_requests"], 300, "{router}");
        assert!(get(&r, "prefill_worker_seconds") > 0.0, "{router}");
        assert!(
            get(&r, "p99_ttst_ms") < get(&aggregated, "p99_ttst_ms") / 4.0,
            "{router}: decode workers never stall behind a prefill chunk"
        );
    }
    let plain = disagg("kv_router", "{}");
    let linked = disagg(
        "kv_router",
        "{\"kv_bytes_per_token\": 131072, \"kv_transfer_bandwidth\": 1.0}",
    );
    let mean_transfer_ms = get(&linked, "total_input_tokens") / 300.0 * 131_072.0 / 1e6;
    assert!(
        get(&linked, "mean_ttft_ms") - get(&plain, "mean_ttft_ms") > 0.5 * mean_transfer_ms,
        "the KV transfer delays the first token"
    );
}

/// A shared-prefix workload on small GPU caches: prefixes evicted from the GPU come back
/// from the store.
pub(crate) fn offload_workload(extra: &[&str]) -> Vec<String> {
    let base = [
        "--input-tokens",
        "4096",
        "--output-tokens",
        "16",
        "--request-count",
        "200",
        "--shared-prefix-ratio",
        "0.75",
        "--num-prefix-groups",
        "4",
        "--request-rate",
        "20",
        "--num-workers",
        "4",
        "--extra-engine-args",
        "{\"kv_bytes_per_token\": 1024, \"num_gpu_blocks\": 256}",
    ];
    base.iter().chain(extra).map(|s| s.to_string()).collect()
}

#[test]
fn kv_offload_serves_evicted_prefixes_and_its_recording_replays_to_the_same_hits() {
    let dir = scratch();
    let run = |extra: &[&str]| {
        let args = offload_workload(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        without_live(simulate(dir.path(), &refs))
    };
    let tier = |name: &str| {
        format!(
            "{{\"type\":\"fs\",\"path\":\"{}\",\"capacity_gb\":0.1}}",
            dir.path().join(name).display()
        )
    };
    let recording = dir.path().join("rec.lct");
    let rec = recording.display().to_string();
    let (tier_a, tier_b) = (tier("l2a"), tier("l2b"));
    let store = |l2: &str, record: Option<&str>| {
        let mut extra = vec![
            "--l1-size-gb",
            "0.0125",
            "--eviction-timing",
            "immediate",
            "--l2-adapter",
        ];
        extra.push(l2);
        if let Some(r) = record {
            extra.extend(["--record", r]);
        }
        run(&extra)
    };
    let base = run(&[]);
    let with = store(&tier_a, Some(&rec));
    let get = |m: &serde_json::Map<String, Value>, k: &str| m[k].as_f64().expect(k);
    assert!(get(&with, "offload_l1_hit_chunks") > 0.0);
    assert!(
        get(&with, "offload_l2_hit_chunks") > 0.0,
        "the file tier serves"
    );
    assert!(
        get(&with, "mean_ttft_ms") < get(&base, "mean_ttft_ms"),
        "loading beats recomputing: {} vs {}",
        get(&with, "mean_ttft_ms"),
        get(&base, "mean_ttft_ms")
    );
    assert_eq!(
        with,
        store(&tier_b, None),
        "same workload, same store, same report"
    );

    // kvtrace's simulated server does not apply LMCache's end-of-session touch of the whole
    // prompt, which a replay's session model does: that moves recency, so which tier serves a
    // hit and which stores find their chunks resident, not whether a request hits. Without the
    // session model the replay is the simulated server, call for call.
    let replayed = |name: &str, extra: &[&str]| {
        let out_dir = dir.path().join(name);
        let tier = format!(
            "{{\"type\":\"fs\",\"path\":\"{}\",\"capacity_gb\":0.1}}",
            dir.path().join(format!("{name}-l2")).display()
        );
        let mut args = vec![
            "replay".to_string(),
            rec.clone(),
            "--l1-accounting-only".into(),
            "--l2-adapter".into(),
            tier,
            "--json".into(),
            "--no-csv".into(),
            "-q".into(),
            "--output-dir".into(),
            out_dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = kvtrace(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let summary: Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join("trace_replay_summary.json")).expect("summary"),
        )
        .expect("json");
        summary["kvtrace"].clone()
    };
    let k = replayed("default", &[]);
    assert_eq!(k["failed"], 0);
    assert_eq!(k["hits"]["hit_chunks"], with["offload_hit_chunks"]);
    let k = replayed("calls", &["--no-session-emulation"]);
    assert_eq!(k["failed"], 0);
    assert_eq!(k["hits"]["hit_chunks"], with["offload_hit_chunks"]);
    assert_eq!(k["hits"]["l2_hit_chunks"], with["offload_l2_hit_chunks"]);
    assert_eq!(k["calls"]["keys_admitted"], with["offload_stored_chunks"]);
    assert_eq!(k["calls"]["prefetches"], with["offload_lookups"]);
}

#[test]
fn online_mode_serves_everything_on_live_workers_in_real_time() {
    let dir = scratch();
    let run = |mode: &str| {
        simulate(
            dir.path(),
            &[
                "--input-tokens",
                "2000",
                "--output-tokens",
                "50",
                "--request-count",
                "100",
                "--replay-concurrency",
                "20",
                "--num-workers",
                "2",
                "--router-mode",
                "kv_router",
                "--extra-engine-args",
                "{\"speedup_ratio\": 20}",
                "--replay-mode",
                mode,
            ],
        )
    };
    let offline = run("offline");
    let online = run("online");
    assert_eq!(online["completed_requests"], 100);
    assert_eq!(online.len(), offline.len(), "the same report keys");
    let get = |m: &serde_json::Map<String, Value>, k: &str| m[k].as_f64().expect(k);
    assert!(
        get(&online, "wall_time_ms") >= 0.9 * get(&offline, "duration_ms"),
        "live workers sleep through the modelled pass times: {} ms vs {} ms simulated",
        get(&online, "wall_time_ms"),
        get(&offline, "duration_ms")
    );
}

#[test]
fn the_sglang_and_trtllm_engines_serve_a_trace() {
    let dir = scratch();
    let trace = mooncake_slice();
    let run = |engine: &str| simulate(dir.path(), &[&trace, "--extra-engine-args", engine]);
    let vllm = run("{\"block_size\": 16}");
    let sglang = run("{\"engine_type\": \"sglang\", \"sglang\": {\"page_size\": 16, \"schedule_policy\": \"lpm\"}}");
    let trtllm = run("{\"engine_type\": \"trtllm\", \"block_size\": 16}");
    for r in [&sglang, &trtllm] {
        assert_eq!(r["completed_requests"], 300);
        assert_ne!(
            r["mean_ttft_ms"], vllm["mean_ttft_ms"],
            "each scheduler admits differently"
        );
    }
}

/// Online, Dynamo 1.4.2 has no clock of its own to integrate: each worker is provisioned for
/// the run's duration, which ends at the last completed request, not at a rejection after it
/// (offline, `testdata/dynamo/rejected-last-*-rr` hold both rules to Dynamo's own reports).
/// Checked against Dynamo 1.4.2 by hand on 2026-12-07 (`--replay-mode online`, one and two
/// workers: 0.449 s and 2 × 0.427 s worker-seconds, with the rejection at 5 s).
#[test]
fn an_online_run_is_provisioned_for_its_duration() {
    let dir = scratch();
    for workers in ["1", "2"] {
        let report = simulate(
            dir.path(),
            &[
                "testdata/traces/mooncake_rejected.jsonl",
                "--replay-mode",
                "online",
                "--arrival-speedup-ratio",
                "10",
                "--num-workers",
                workers,
                "--extra-engine-args",
                "{\"block_size\": 16, \"num_gpu_blocks\": 64, \"speedup_ratio\": 20}",
            ],
        );
        assert_eq!(report["completed_requests"], 2);
        let get = |k: &str| report[k].as_f64().expect(k);
        let duration_s = get("duration_ms") / 1e3;
        // The rejected request arrives at 5 s / 10 = 500 ms, long after both completions
        // (about 450 ms of modelled time, run 20 times faster).
        assert!(
            duration_s < 0.5,
            "{duration_s} s: the rejection does not end the run"
        );
        let expected = duration_s * workers.parse::<f64>().unwrap();
        assert!(
            (get("decode_worker_seconds") - expected).abs() <= 1e-12 * expected,
            "{} worker-seconds for {workers} workers over {duration_s} s",
            get("decode_worker_seconds")
        );
    }
}
