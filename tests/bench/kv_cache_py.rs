//! `kvtrace bench` end to end: kv-cache.py's JSON, the 99-column workbook and CSV, the
//! recording and I/O log, ShareGPT and BurstGPT workloads, the suite, and one-line errors.

use crate::util::{kvtrace, scratch, text};
use calamine::{open_workbook, Data, Reader, Xlsx};

#[test]
fn a_bench_run_writes_kv_cache_py_json_and_the_99_column_workbook_and_csv() {
    let dir = scratch();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::create_dir_all(dir.path().join("nvme")).expect("dir");
    std::fs::create_dir_all(dir.path().join("cpu")).expect("dir");
    let out = kvtrace([
        "bench",
        "--model",
        "tiny-1b",
        "--num-users",
        "4",
        "--duration",
        "2",
        "--cpu-mem-gb",
        "0.05",
        "--cache-dir",
        &p("nvme"),
        "--cpu-tier-dir",
        &p("cpu"),
        "--generation-mode",
        "none",
        "--personas",
        "january-2026",
        "--seed",
        "1",
        "--output",
        &p("r.json"),
        "--xlsx-output",
        &p("r.xlsx"),
        "--csv",
        &p("r.csv"),
        "--record",
        &p("rec.lct"),
        "-q",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("r.json")).expect("json")).expect("json");

    // The recording replays to the same hits under the configuration it carries.
    let replay = kvtrace([
        "replay",
        &p("rec.lct"),
        "--l1-accounting-only",
        "--l2-adapter",
        &format!("{{\"type\":\"fs\",\"path\":\"{}\"}}", p("replay-l2")),
        "--json",
        "--no-csv",
        "-q",
        "--output-dir",
        &p("replay"),
    ]);
    assert_eq!(replay.status.code(), Some(0), "{}", text(&replay.stderr));
    let replayed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("replay/trace_replay_summary.json"))
            .expect("summary"),
    )
    .expect("json");
    assert_eq!(replayed["kvtrace"]["failed"], 0);
    assert_eq!(
        replayed["kvtrace"]["hits"]["hit_chunks"], json["summary"]["cache_stats"]["cache_hits"],
        "every hit of the run is a hit of its replay"
    );
    let completed = json["requests_completed"].as_u64().expect("count");
    assert!(completed > 0);
    assert_eq!(json["summary"]["total_requests"], completed);
    for key in [
        "end_to_end_latency_ms",
        "storage_io_latency_ms",
        "cache_stats",
        "qos_metrics",
        "multi_turn_stats",
        "prefix_cache_stats",
    ] {
        assert!(json["summary"].get(key).is_some(), "summary.{key}");
    }
    let stats = &json["summary"]["cache_stats"];
    assert!(
        stats["tier_storage_kv_bytes_written_gb"]
            .as_f64()
            .expect("gb")
            > 0.0
    );
    assert!(stats["storage_health"]["criteria"].is_array());

    let mut wb: Xlsx<_> = open_workbook(p("r.xlsx")).expect("valid xlsx");
    assert_eq!(
        wb.sheet_names(),
        [
            "Summary",
            "Run Parameters",
            "Performance Metrics",
            "QoS Metrics",
            "Storage IO"
        ]
    );
    let summary = wb.worksheet_range("Summary").expect("summary");
    assert_eq!(summary.width(), 99);
    assert_eq!(summary.get((0, 0)), Some(&Data::String("Timestamp".into())));
    assert_eq!(
        summary.get((0, 98)),
        Some(&Data::String("Multi-turn Hit Rate".into()))
    );
    assert_eq!(summary.get((1, 1)), Some(&Data::String("tiny-1b".into())));
    assert_eq!(summary.get((1, 27)), Some(&Data::Float(completed as f64)));
    let csv = std::fs::read_to_string(p("r.csv")).expect("csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next().expect("header").split(',').count(), 99);
    assert!(lines.next().expect("row").contains(",tiny-1b,"));
    assert_eq!(
        std::fs::read_dir(dir.path().join("nvme"))
            .expect("dir")
            .count(),
        0,
        "the run removes its entries"
    );
}

#[test]
fn bad_bench_flags_are_one_line_usage_errors() {
    let cases: [(&[&str], &str); 6] = [
        (&["--num-users", "0"], "--num-users 0"),
        (&["--cpu-mem-gb=-1"], "--cpu-mem-gb -1"),
        (&["--storage-capacity-gb=-2"], "--storage-capacity-gb -2"),
        (&["--cache-dir", "/etc"], "a system directory"),
        (
            &["--model", "llama9"],
            "invalid value 'llama9' for '--model <MODEL>'",
        ),
        (&["--tensor-parallel", "2"], "exceeds --num-gpus 1"),
    ];
    for (args, expected) in cases {
        let out = kvtrace(std::iter::once("bench").chain(args.iter().copied()));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn a_bench_io_trace_log_lists_every_tier_operation_without_touching_the_devices() {
    let dir = scratch();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let out = small_bench(dir.path(), "20", &["--io-trace-log", &p("io.csv")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let log = std::fs::read_to_string(p("io.csv")).expect("log");
    let mut lines = log.lines();
    assert_eq!(
        lines.next(),
        Some("Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.iter().all(|r| r.len() == 6));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("r.json")).expect("json")).expect("json");
    let writes = rows.iter().filter(|r| r[1] == "Write").count() as u64;
    let reads = rows.iter().filter(|r| r[1] == "Read").count() as u64;
    let stats = &json["summary"]["cache_stats"];
    assert!(writes > 0 && reads > 0);
    assert_eq!(
        reads,
        stats["read_iops"].as_u64().expect("reads"),
        "one row per read"
    );
}

#[cfg(feature = "tiktoken")]
#[test]
fn a_sharegpt_dataset_drives_the_requests_at_the_asked_rate() {
    let missing = kvtrace(["bench", "--dataset-path", "/no/such/sharegpt.json"]);
    let err = text(&missing.stderr);
    assert_eq!(missing.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/no/such/sharegpt.json") && err.contains("cannot read the dataset"));

    let Some(shared) = crate::util::shared() else {
        return;
    };
    let dir = scratch();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let dataset = shared.join("traces/sharegpt/sharegpt_llm_test.json");
    let dataset = dataset.display().to_string();
    let out = small_bench(
        dir.path(),
        "8",
        &["--dataset-path", &dataset, "--request-rate", "20"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("6 of 365 conversations have no human message followed by a gpt message"),
        "{}",
        text(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("r.json")).expect("json")).expect("json");
    let done = json["requests_completed"].as_u64().expect("count");
    assert!(done > 0);
    assert!(done <= 2 * 20 + 1, "paced at 20/s: {done} in 2 s");
}

/// A 2-second tiny-1b bench run with tiers under `dir`, its report at `dir/r.json`.
fn small_bench(dir: &std::path::Path, users: &str, extra: &[&str]) -> std::process::Output {
    let d = dir.display().to_string();
    let report = dir.join("r.json").display().to_string();
    let mut args = vec![
        "bench",
        "--model",
        "tiny-1b",
        "--num-users",
        users,
        "--duration",
        "2",
        "--cpu-mem-gb",
        "0.05",
        "--cache-dir",
        &d,
        "--cpu-tier-dir",
        &d,
        "--generation-mode",
        "none",
        "--output",
        &report,
        "-q",
    ];
    args.extend_from_slice(extra);
    kvtrace(args)
}

#[test]
fn a_burstgpt_log_is_replayed_at_its_recorded_times() {
    let dir = scratch();
    let log = dir.path().join("burst.csv");
    let mut csv =
        String::from("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n");
    for i in 0..200 {
        csv += &format!(
            "{},ChatGPT,{},20,0,Conversation log\n",
            100.0 + f64::from(i) * 0.1,
            200 + i
        );
    }
    std::fs::write(&log, csv).expect("write");
    let log = log.display().to_string();
    let run = |speedup: &str| {
        let out = small_bench(
            dir.path(),
            "8",
            &[
                "--use-burst-trace",
                "--burst-trace-path",
                &log,
                "--trace-speedup",
                speedup,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("r.json")).expect("json"),
        )
        .expect("json");
        json["requests_completed"].as_u64().expect("count")
    };
    let timed = run("1");
    assert!(
        timed > 0 && timed <= 21,
        "10 rows a second for 2 s: {timed}"
    );
    assert!(
        run("0") > timed,
        "without waiting, more of the log is served"
    );
    // A due time past what the clock holds is never reached within the run (it was a
    // panic of every user thread), for the log's times and for a request rate alike.
    assert!(run("1e-300") <= 8, "at most each user's first row");
    let out = small_bench(dir.path(), "2", &["--request-rate", "1e-300"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let missing = kvtrace([
        "bench",
        "--use-burst-trace",
        "--burst-trace-path",
        "/no/burst*.csv",
    ]);
    let err = text(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no CSV file matches") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn the_suite_runs_nine_scenarios_and_prints_one_table() {
    let dir = scratch();
    let d = dir.path().display().to_string();
    let reports = dir.path().join("suite");
    let out = kvtrace([
        "bench",
        "--suite",
        "--model",
        "tiny-1b",
        "--duration",
        "1",
        "--cache-dir",
        &d,
        "--cpu-tier-dir",
        &d,
        "--generation-mode",
        "none",
        "--output",
        &reports.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(table.lines().count(), 10, "{table}");
    for name in ["storage-only", "tiered", "rag", "capacity"] {
        assert!(
            table.lines().any(|l| l.starts_with(name)),
            "{name}: {table}"
        );
        assert!(reports.join(format!("{name}.json")).exists());
    }
}

#[test]
fn every_other_bad_bench_input_is_one_line_with_its_exit_code() {
    let dir = scratch();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let sharegpt = file(
        "ok.json",
        r#"[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hi"}]}]"#,
    );
    let unpairable = file(
        "gpt_first.json",
        r#"[{"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "hi"}]}]"#,
    );
    let not_sharegpt = file("bad.json", r#"[{"conversations": 3}]"#);
    let bad_burst = file(
        "bad.csv",
        "Timestamp,Request tokens,Response tokens\n1,10,5\n2,ten,5\n",
    );
    let mut cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["--duration", "0"], 2, "--duration 0"),
        (vec!["--max-requests=-1"], 2, "--max-requests -1"),
        (
            vec!["--max-concurrent-allocs=-1"],
            2,
            "--max-concurrent-allocs -1",
        ),
        (vec!["--request-rate=-5"], 2, "--request-rate -5"),
        // Each document is listed from the start: four billion was an allocation abort.
        (
            vec!["--enable-rag", "--rag-num-docs", "4294967295"],
            2,
            "--rag-num-docs",
        ),
        (
            vec!["--gpu-bandwidth-gbps", "0"],
            2,
            "--gpu-bandwidth-gbps must be positive",
        ),
        (vec!["--cache-dir", &not_sharegpt], 2, "not a directory"),
        (
            vec!["--enable-autoscaling", "--target-saturation", "1.5"],
            2,
            "--target-saturation 1.5",
        ),
        (
            vec!["--enable-autoscaling", "--autoscale-interval", "0"],
            2,
            "--autoscale-interval must be positive",
        ),
        (
            vec!["--use-burst-trace", "--trace-speedup=-1"],
            2,
            "--trace-speedup -1",
        ),
        (
            vec!["--use-burst-trace", "--dataset-path", &sharegpt],
            2,
            "either --dataset-path or --use-burst-trace",
        ),
        (
            vec!["--use-burst-trace", "--burst-trace-path", &bad_burst],
            1,
            "line 3: Request tokens: \"ten\" is not a number >= 0",
        ),
    ];
    if cfg!(feature = "tiktoken") {
        cases.extend([
            (
                vec!["--dataset-path", &unpairable],
                2,
                "none of its 1 conversations has a human message followed by a gpt message",
            ),
            (
                vec!["--dataset-path", &not_sharegpt],
                1,
                "line 1: column 20: not a ShareGPT list",
            ),
        ]);
    }
    let cache = dir.path().display().to_string();
    for (args, code, expected) in cases {
        let mut all = vec!["bench", "--cpu-tier-dir", &cache, "-q"];
        if !args.contains(&"--cache-dir") {
            all.extend(["--cache-dir", &cache]);
        }
        all.extend(args.iter().copied());
        let out = kvtrace(all);
        let err = text(&out.stderr);
        let errors: Vec<&str> = err.lines().filter(|l| !l.contains("warning")).collect();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(errors.len(), 1, "{args:?}: {err}");
        assert!(errors[0].contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn a_missing_cache_dir_is_created_and_left_empty() {
    let dir = scratch();
    let cache = dir.path().join("new/cache");
    let out = kvtrace([
        "bench",
        "--model",
        "tiny-1b",
        "--num-users",
        "1",
        "--duration",
        "0.5",
        "--cpu-mem-gb",
        "0",
        "--generation-mode",
        "none",
        "--no-fsync",
        "-q",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--output",
        dir.path().join("r.json").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(cache.is_dir(), "the cache directory is created");
    let left: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(left.is_empty(), "the run's files are removed: {left:?}");
}
