//! `kvtrace bench --mlperf-option`: MLPerf Storage v3.0's Options run as trials of ranks in
//! the rules' layout, the run summary checked against sums and means worked out here from
//! the ranks' own result files, and the CLOSED division's locks.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value as Json;

use crate::util::{kvtrace, one_line_error, scratch, text};

fn read(path: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
}

/// The one results file of `option_<o>/trial_<t>/rank_<r>`.
fn rank_result(root: &Path, o: u32, t: u32, r: u32) -> Json {
    let dir = root.join(format!("option_{o}/trial_{t}/rank_{r}"));
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0]
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("kvcache_results_") && name.ends_with(".json"),
        "{name}"
    );
    read(&files[0])
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: {a} != {b}"
    );
}

#[test]
fn two_ranks_two_trials_summarise_as_sums_within_a_trial_and_means_over_trials() {
    let dir = scratch();
    let root = dir.path().join("results");
    let cache = dir.path().join("cache");
    let spawn = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_kvtrace"))
            .args([
                "bench",
                "--mlperf-option",
                "1",
                "--open",
                "--model",
                "tiny-1b",
                "--num-users",
                "3",
                "--duration",
                "1",
                "--trials",
                "2",
                "--rank",
                rank,
                "--world-size",
                "2",
                "--run-id",
                "mlperf-test",
                "-q",
            ])
            .arg("--results-dir")
            .arg(&root)
            .arg("--cache-dir")
            .arg(&cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kvtrace")
    };
    let ranks = [spawn("0"), spawn("1")];
    for child in ranks {
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let summary = read(&root.join("kvcache_run_summary.json"));
    assert_eq!(summary["schema_version"], "1.0");
    assert_eq!(
        (
            &summary["total_ranks"],
            &summary["trials_per_option"],
            &summary["host_count"],
            &summary["npernode"]
        ),
        (&2.into(), &2.into(), &1.into(), &2.into())
    );
    let option = &summary["options"]["1"];
    assert_eq!(option["partial_failure"], false);
    assert_eq!(option["kvtrace"]["division"], "open");
    // Worked out here from the eight files: per trial the sum over both ranks, then the mean
    // of the two trials' sums; device P95s the largest anywhere.
    let stat = |doc: &Json, key: &str| doc["summary"]["cache_stats"][key].as_f64().unwrap_or(0.0);
    let mut sums = [[0.0f64; 4]; 2];
    let mut worst = [0.0f64; 2];
    for (t, sum) in sums.iter_mut().enumerate() {
        for r in 0..2 {
            let doc = rank_result(&root, 1, t as u32 + 1, r);
            let m = &doc["kvtrace"]["mlperf"];
            assert_eq!(
                (&m["option"], &m["trial"], &m["division"]),
                (&1.into(), &(t as u32 + 1).into(), &"open".into())
            );
            assert_eq!(doc["seed"], 42 + r, "the seed stays 42, plus the rank");
            sum[0] += stat(&doc, "tier_storage_read_bandwidth_gbps");
            sum[1] += stat(&doc, "tier_storage_write_bandwidth_gbps");
            sum[2] += doc["summary"]["storage_throughput_tokens_per_sec"]
                .as_f64()
                .unwrap();
            sum[3] += doc["kvtrace"]["cached_tokens_per_sec"].as_f64().unwrap();
            worst[0] = worst[0].max(stat(&doc, "storage_read_device_p95_ms"));
            worst[1] = worst[1].max(stat(&doc, "storage_write_device_p95_ms"));
        }
    }
    let mean = |i: usize| (sums[0][i] + sums[1][i]) / 2.0;
    close(
        option["aggregated_read_bandwidth_gbps"].as_f64().unwrap(),
        mean(0),
        "read",
    );
    close(
        option["aggregated_write_bandwidth_gbps"].as_f64().unwrap(),
        mean(1),
        "write",
    );
    close(
        option["aggregated_storage_throughput_tokens_per_sec"]
            .as_f64()
            .unwrap(),
        mean(2),
        "storage tokens/s",
    );
    close(
        option["kvtrace"]["cached_tokens_per_sec"].as_f64().unwrap(),
        mean(3),
        "cached tokens/s",
    );
    assert!(mean(1) > 0.0, "option 1 writes to storage");
    assert_eq!(
        option["aggregated_device_read_p95_ms"].as_f64().unwrap(),
        worst[0]
    );
    assert_eq!(
        option["aggregated_device_write_p95_ms"].as_f64().unwrap(),
        worst[1]
    );
    // `aggregate` on the directory says the same (its own date aside).
    let again = dir.path().join("again.json");
    let out = kvtrace([
        "aggregate".as_ref(),
        root.as_os_str(),
        format!("--json={}", again.display()).as_ref(),
        "-q".as_ref(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again = read(&again);
    assert_eq!(again["options"], summary["options"]);
    // A rank's results lost: listed, the Option a partial failure, exit 1.
    let lost = root.join("option_1/trial_2/rank_1");
    std::fs::remove_dir_all(&lost).expect("remove");
    let out = kvtrace([
        "aggregate".as_ref(),
        root.as_os_str(),
        format!("--json={}", dir.path().join("partial.json").display()).as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let partial = read(&dir.path().join("partial.json"));
    assert_eq!(partial["partial_failure"], true);
    let missing = &partial["options"]["1"]["missing_files"];
    assert_eq!(missing.as_array().map(Vec::len), Some(1), "{missing}");
    assert!(missing[0].as_str().unwrap().ends_with("trial_2/rank_1"));
    assert!(text(&out.stdout).contains("partial failure"));
}

#[test]
fn the_closed_division_refuses_every_flag_but_where_files_go() {
    let dir = scratch();
    let results = dir.path().join("r").display().to_string();
    for (args, expected) in [
        (
            &["--num-users", "3"][..],
            "--num-users: MLPerf Storage v3.0's CLOSED division fixes it",
        ),
        (&["--trials", "1"], "--trials: MLPerf Storage v3.0's CLOSED"),
        (
            &["--inter-option-delay", "0"],
            "--inter-option-delay: MLPerf Storage v3.0's CLOSED",
        ),
        (
            &["--direct-io"],
            "--direct-io: MLPerf Storage v3.0's CLOSED",
        ),
        (
            &["--open", "--output", "x.json"],
            "--output with --mlperf-option",
        ),
        (&["--open", "--trials", "0"], "--trials 0"),
        (
            &["--open", "--inter-option-delay=-1"],
            "--inter-option-delay -1",
        ),
    ] {
        let out = kvtrace(
            ["bench", "--mlperf-option", "2", "--results-dir", &results]
                .iter()
                .chain(args),
        );
        let err = one_line_error(&out, 2);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    let out = kvtrace(["bench", "--trials", "2"]);
    let err = one_line_error(&out, 2);
    assert!(err.contains("--mlperf-option"), "{err}");
    // Ranks must meet in one results directory: a rank of many does not invent its own.
    let out = kvtrace([
        "bench",
        "--mlperf-option",
        "1",
        "--rank",
        "1",
        "--world-size",
        "2",
        "--run-id",
        "r",
    ]);
    let err = one_line_error(&out, 2);
    assert!(
        err.contains("rank 1 of 2: give --results-dir, a directory every rank sees"),
        "{err}"
    );
    assert!(!dir.path().join("r").exists(), "nothing ran");
}
