//! `simulate --prometheus-port` and `bench --prometheus-port`: the endpoint's final figures
//! are the report's.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::util::{free_port, repo, scratch};

/// The value of each `name value` line of the endpoint's text, by name (labels kept).
fn scrape(port: u16) -> Option<std::collections::BTreeMap<String, f64>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(
        text.lines()
            .filter(|l| l.starts_with("kvtrace_"))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect(),
    )
}

/// Runs kvtrace with `args` and the endpoint on a free port, and returns the figures it
/// serves once the run has ended (progress 1), and the report at `report`.
fn final_figures(
    args: &[&str],
    report: &std::path::Path,
) -> (std::collections::BTreeMap<String, f64>, Json) {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(args)
        .args(["--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &port.to_string()])
        .args(["--prometheus-hold", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvtrace");
    let start = Instant::now();
    let figures = loop {
        if let Some(f) = scrape(port).filter(|f| f.get("kvtrace_finished") == Some(&1.0)) {
            break f;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no final figures"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    let report: Json =
        serde_json::from_str(&std::fs::read_to_string(report).expect("report")).expect("JSON");
    (figures, report)
}

#[test]
fn the_simulation_ends_with_the_reports_figures() {
    let dir = scratch();
    let path = dir.path().join("report.json");
    let trace = repo("testdata/mooncake/conversation_head300.jsonl");
    let shown = path.display().to_string();
    let (figures, report) = final_figures(
        &[
            "simulate",
            &trace,
            "--num-workers",
            "2",
            "-q",
            "--report-json",
            &shown,
        ],
        &path,
    );
    let n = |key: &str| report[key].as_f64().unwrap_or_else(|| panic!("{key}"));
    assert_eq!(figures["kvtrace_requests_total"], n("completed_requests"));
    assert_eq!(
        figures["kvtrace_requests_by_status_total{status=\"completed\"}"],
        n("completed_requests")
    );
    assert_eq!(
        figures["kvtrace_output_tokens_total"],
        n("total_output_tokens")
    );
    assert_eq!(
        figures["kvtrace_requested_tokens_total"],
        n("total_input_tokens")
    );
    assert_eq!(figures["kvtrace_hit_rate"], n("prefix_cache_reused_ratio"));
    assert_eq!(
        figures["kvtrace_time_to_first_token_seconds_count"],
        n("completed_requests")
    );
}

#[test]
fn the_bench_ends_with_its_tiers_figures() {
    let dir = scratch();
    let path = dir.path().join("results.json");
    let cache = dir.path().join("cache");
    let (shown, cache) = (path.display().to_string(), cache.display().to_string());
    let mut args = crate::util::TINY_BENCH.to_vec();
    args.extend(["--duration", "2", "--output", &shown, "--cache-dir", &cache]);
    let (figures, report) = final_figures(&args, &path);
    for tier in report["kvtrace"]["tiers"].as_array().expect("tiers") {
        let name = tier["tier"].as_str().expect("tier");
        let c = &tier["counters"];
        let n = |key: &str| c[key].as_f64().unwrap_or_else(|| panic!("{key}"));
        let served = |metric: &str| figures[&format!("{metric}{{tier=\"{name}\"}}")];
        assert_eq!(
            served("kvtrace_tier_resident_bytes"),
            n("used_bytes"),
            "{name}"
        );
        assert_eq!(
            served("kvtrace_tier_written_bytes_total"),
            n("bytes_written")
        );
        assert_eq!(served("kvtrace_tier_read_bytes_total"), n("bytes_read"));
        assert_eq!(
            served("kvtrace_tier_evictions_total"),
            n("demotions") + n("deletions")
        );
    }
    // Every request served is counted, those the report leaves out as after the deadline too.
    let served = figures["kvtrace_requests_total"];
    let completed = report["requests_completed"].as_f64().expect("completed");
    let late = report["kvtrace"]["requests_after_deadline"]
        .as_f64()
        .expect("late");
    assert!(
        completed <= served && served <= completed + late,
        "{served}"
    );
}
