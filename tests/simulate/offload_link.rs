//! KV offload whose L2 tier is timed as measured (`--offload-calibration`): loads and stores
//! take the fitted cost of the tier's calls and share its lanes, so stores delay the loads
//! behind them. Expectations are computed here from the calibration's own numbers.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::engines::{offload_workload, simulate, without_live};
use crate::util::{kvtrace, one_line_error, repo, scratch, text};

/// A 256-token chunk at the workload's 1,024 bytes per token.
const CHUNK_BYTES: f64 = 262_144.0;

/// A report with one measured tier, shaped as `kvtrace bench` writes `storage_io`.
fn calibration(dir: &Path, name: &str, read: (f64, f64), write: (f64, f64)) -> String {
    let cost = |(latency_ms, mib_per_s): (f64, f64)| {
        json!({"calls": 10, "mean_bytes": CHUNK_BYTES, "one_size": true,
               "latency_ms": latency_ms, "mib_per_s": mib_per_s})
    };
    let report = json!({"storage_io": {"mode": "synchronous", "workers": null,
        "read_cost": cost(read), "write_cost": cost(write)}});
    let path = dir.join(name);
    std::fs::write(&path, report.to_string()).expect("write calibration");
    path.display().to_string()
}

/// The shared-prefix workload with a small L1 over the L2 `adapter`, so prefixes come back
/// from L2.
fn offload_args(adapter: &str, extra: &[&str]) -> Vec<String> {
    let mut args = offload_workload(&[
        "--l1-size-gb",
        "0.0125",
        "--eviction-timing",
        "immediate",
        "--l2-adapter",
        adapter,
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// [`offload_args`] over a memory L2, simulated.
fn run(dir: &Path, extra: &[&str]) -> Map<String, Value> {
    let args = offload_args("{\"type\":\"memory\"}", extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    without_live(simulate(dir, &refs))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn ms(latency_ms: f64, mib_per_s: f64, bytes: f64) -> f64 {
    latency_ms + bytes / 1_048_576.0 / mib_per_s * 1e3
}

#[test]
fn every_l2_call_costs_its_measured_time_and_every_l2_write_is_charged() {
    let dir = scratch();
    let (read, write) = ((0.4, 800.0), (1.5, 200.0));
    let cal = calibration(dir.path(), "cal.json", read, write);
    let r = run(dir.path(), &["--offload-calibration", &cal]);
    let link = &r["offload_l2_link"];
    assert_eq!(link["lanes"], 1);
    assert!(link["source"]
        .as_str()
        .is_some_and(|s| s.ends_with("cal.json: storage_io")));
    let (reads, writes) = (num(link, "reads"), num(link, "writes"));
    assert!(reads > 0.0 && writes > 0.0, "{link}");
    assert_eq!(num(link, "bytes_read"), reads * CHUNK_BYTES);
    assert_eq!(num(link, "bytes_written"), writes * CHUNK_BYTES);
    // The manager's own count of what reached L2.
    let l2 = &r["offload_tiers"][1];
    assert_eq!(num(l2, "writes"), writes);
    assert_eq!(num(l2, "bytes_written"), writes * CHUNK_BYTES);
    let busy = reads * ms(read.0, read.1, CHUNK_BYTES) + writes * ms(write.0, write.1, CHUNK_BYTES);
    assert!(
        (num(link, "busy_ms") - busy).abs() < 1e-6 * busy,
        "{} against {busy}",
        num(link, "busy_ms")
    );
    // Every chunk a load took from L2 is a read of the link.
    assert!(reads <= num(&Value::Object(r.clone()), "offload_l2_hit_chunks"));
    let u = num(link, "utilization");
    assert!(u > 0.0 && u <= 1.0, "{u}");
}

#[test]
fn stores_hold_the_lanes_the_loads_wait_for() {
    let dir = scratch();
    let fast = calibration(dir.path(), "fast.json", (0.5, 500.0), (0.0, 1e9));
    let slow = calibration(dir.path(), "slow.json", (0.5, 500.0), (40.0, 5.0));
    let quick = run(dir.path(), &["--offload-calibration", &fast]);
    let held = run(dir.path(), &["--offload-calibration", &slow]);
    let wait = |r: &Map<String, Value>| num(&r["offload_l2_link"], "read_wait_ms");
    assert!(
        wait(&held) > wait(&quick),
        "{} {}",
        wait(&held),
        wait(&quick)
    );
    let ttft = |r: &Map<String, Value>| r["mean_ttft_ms"].as_f64().expect("ttft");
    assert!(
        ttft(&held) > ttft(&quick),
        "loads behind slow stores come later: {} vs {}",
        ttft(&held),
        ttft(&quick)
    );

    // More lanes serve a load's chunks at once: less time loading.
    let one = run(dir.path(), &["--offload-calibration", &slow]);
    let eight = run(
        dir.path(),
        &["--offload-calibration", &slow, "--offload-l2-lanes", "8"],
    );
    assert_eq!(eight["offload_l2_link"]["lanes"], 8);
    let load = |r: &Map<String, Value>| r["offload_load_ms"].as_f64().expect("load");
    assert!(load(&eight) < load(&one), "{} {}", load(&eight), load(&one));
    assert_eq!(one, held, "the same configuration gives the same report");
}

#[test]
fn a_replay_of_a_real_tier_calibrates_the_simulation() {
    let dir = scratch();
    let summary = dir.path().join("replay.json");
    let out = kvtrace([
        "replay",
        // Its recorded L1 evicts: the file tier both stores and serves.
        &repo("testdata/lmcache/churn/l2fs_seed5.lct"),
        "--l2-adapter",
        &format!(
            "{{\"type\":\"fs\",\"path\":\"{}\"}}",
            dir.path().join("kv").display()
        ),
        &format!("--json={}", summary.display()),
        "--no-csv",
        "-q",
        "--output-dir",
        &dir.path().join("out").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let measured: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    let calls = &measured["kvtrace"]["tier_io"][0]["calls"];
    assert!(calls["read_cost"].is_object(), "{calls}");
    let r = run(
        dir.path(),
        &["--offload-calibration", &summary.display().to_string()],
    );
    let link = &r["offload_l2_link"];
    assert!(link["source"]
        .as_str()
        .is_some_and(|s| s.ends_with("replay.json: kvtrace.tier_io[0].calls (L2[0])")));
    assert_eq!(link["read_mib_per_s"], calls["read_cost"]["mib_per_s"]);
    assert_eq!(link["write_latency_ms"], calls["write_cost"]["latency_ms"]);
    assert_eq!(link["lanes"], 1, "synchronous I/O: one lane");
}

#[test]
fn agentic_traces_run_with_host_offload() {
    let dir = scratch();
    let r = without_live(simulate(
        dir.path(),
        &[
            &repo("testdata/traces/agentic_v2.jsonl"),
            "--trace-format",
            "agentic_mooncake",
            "--l1-size-gb",
            "1",
            "--offload-chunk-size",
            "64",
        ],
    ));
    assert_eq!(r["completed_requests"], r["num_requests"]);
    let get = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}"));
    assert!(get("offload_lookups") >= get("num_requests"));
    // The agents share their system prompt and plan: later calls find them stored.
    assert!(get("offload_hit_chunks") > 0.0);
    assert!(get("offload_stored_chunks") > 0.0);
}

#[test]
fn bad_calibrations_are_one_line_errors() {
    let dir = scratch();
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "{\"kvtrace\": {\"tier_io\": []}}").expect("write");
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"kvtrace\": ").expect("write");
    let cal = calibration(dir.path(), "cal.json", (0.1, 100.0), (0.1, 100.0));
    let out = kvtrace([
        "simulate",
        "--request-count",
        "4",
        "--input-tokens",
        "100",
        "--output-tokens",
        "2",
        "--offload-calibration",
        &cal,
        "-q",
    ]);
    let err = one_line_error(&out, 2);
    assert!(err.contains("give --storage FILE or --l1-size-gb"), "{err}");
    let cases: [(Vec<String>, i32, &str); 5] = [
        (
            vec!["--offload-calibration".into(), empty.display().to_string()],
            1,
            "empty.json: no measured tier",
        ),
        (
            vec!["--offload-calibration".into(), broken.display().to_string()],
            1,
            "broken.json: ",
        ),
        (
            vec![
                "--offload-calibration".into(),
                dir.path().join("absent.json").display().to_string(),
            ],
            1,
            "absent.json",
        ),
        (
            vec![
                "--offload-calibration".into(),
                cal.clone(),
                "--offload-l2-gbps".into(),
                "3".into(),
            ],
            2,
            "--offload-l2-gbps",
        ),
        (
            vec![
                "--offload-calibration".into(),
                cal,
                "--offload-l2-lanes".into(),
                "0".into(),
            ],
            2,
            "--offload-l2-lanes must be at least 1",
        ),
    ];
    for (extra, code, says) in cases {
        let mut args = vec![
            "simulate".to_string(),
            "--request-count".into(),
            "4".into(),
            "--l1-size-gb".into(),
            "1".into(),
            "-q".into(),
        ];
        args.extend(extra);
        let out = kvtrace(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!out.status.success());
        assert!(
            code == 2 || err.trim_end().lines().count() == 1,
            "one line: {err}"
        );
    }
}

/// A memory L2 holds sizes only in a simulation (it moves no KV bytes), with the same figures
/// as one asked for real buffers, which is told its buffers were dropped.
#[test]
fn memory_tiers_hold_sizes_only() {
    let dir = scratch();
    let sized = run(dir.path(), &[]);
    let tiers = sized["offload_tiers"].as_array().expect("tiers");
    assert_eq!(tiers[1]["backend"], "memory (accounting only)", "{tiers:?}");
    let report = dir.path().join("asked.json");
    let args = offload_args(
        "{\"type\":\"memory\",\"buffers\":true}",
        &["--report-json", &report.display().to_string(), "-q"],
    );
    let mut all = vec!["simulate".to_owned()];
    all.extend(args);
    let out = kvtrace(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("hold sizes only"),
        "{}",
        text(&out.stderr)
    );
    let asked: Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(report).expect("report")).expect("json");
    assert_eq!(without_live(asked), sized);
}
