//! `simulate --prometheus-port`: the endpoint's final figures are the report's.

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

#[test]
fn the_endpoint_ends_with_the_reports_figures() {
    let dir = scratch();
    let port = free_port();
    let report = dir.path().join("report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args([
            "simulate",
            &repo("testdata/mooncake/conversation_head300.jsonl"),
        ])
        .args(["--num-workers", "2", "-q"])
        .arg("--report-json")
        .arg(&report)
        .args(["--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &port.to_string()])
        .args(["--prometheus-hold", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvtrace");
    let start = Instant::now();
    let figures = loop {
        if let Some(f) = scrape(port).filter(|f| f.get("kvtrace_progress_ratio") == Some(&1.0)) {
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
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("JSON");
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
