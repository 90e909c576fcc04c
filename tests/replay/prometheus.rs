//! `replay --prometheus-port` scraped by a real Prometheus server (Debian's `prometheus`,
//! started on loopback for the test): its query API must return the figures the replay's own
//! JSON report has. Skips with a message where `prometheus` is not installed (`.ci/run`
//! installs it).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::util::{free_ports, repo, scratch};

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP GET on loopback; the status and the body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// The value of an instant query that returns one series, if it returns one.
fn query(port: u16, promql: &str) -> Option<f64> {
    let escaped: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect();
    let (status, body) = get(port, &format!("/api/v1/query?query={escaped}"))?;
    assert_eq!(status, 200, "{body}");
    let answer: Json = serde_json::from_str(&body).ok()?;
    let result = answer["data"]["result"].as_array()?;
    assert!(result.len() <= 1, "{promql}: {body}");
    result.first()?["value"][1].as_str()?.parse().ok()
}

fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_real_prometheus_scrapes_the_figures_the_report_has() {
    if Command::new("prometheus")
        .arg("--version")
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!("SKIP: prometheus is not installed (apt-get install prometheus)");
        return;
    }
    let dir = scratch();
    let (metrics_port, prometheus_port) = free_ports();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: kvtrace\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .expect("config");
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    wait_for("prometheus ready", Duration::from_secs(30), || {
        get(prometheus_port, "/-/ready").is_some_and(|(s, _)| s == 200)
    });

    // A real LMCache recording under eviction pressure, paced at 10× its recorded speed
    // (about a second), its final figures served until the test has read them.
    let report = dir.path().join("report.json");
    let _replay = Killed(
        Command::new(env!("CARGO_BIN_EXE_kvtrace"))
            .args(["replay", &repo("testdata/lmcache/churn/lru_seed1.lct")])
            .args(["--speedup", "10", "--no-csv", "-q"])
            .arg("--output-dir")
            .arg(dir.path())
            .arg(format!("--json={}", report.display()))
            .args(["--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &metrics_port.to_string()])
            .args(["--prometheus-hold", "120"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kvtrace"),
    );
    // Scraped once the run has ended and written its report.
    wait_for("the final figures scraped", Duration::from_secs(60), || {
        query(prometheus_port, "kvtrace_finished") == Some(1.0)
    });
    let report: Json =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("JSON");
    let k = &report["kvtrace"];
    let hits = &k["hits"];
    let figure = |promql: &str| {
        query(prometheus_port, promql).unwrap_or_else(|| panic!("{promql}: no series"))
    };
    assert_eq!(
        figure("kvtrace_requests_total"),
        hits["requests"].as_f64().expect("requests")
    );
    assert_eq!(
        figure("kvtrace_requested_tokens_total"),
        hits["requested_tokens"].as_f64().expect("requested")
    );
    assert_eq!(
        figure("kvtrace_hit_tokens_total"),
        hits["hit_tokens"].as_f64().expect("hits")
    );
    let rate = figure("kvtrace_hit_rate");
    assert!((rate - hits["hit_rate"].as_f64().expect("rate")).abs() < 1e-12);
    assert_eq!(
        figure("kvtrace_records_total"),
        k["records"].as_f64().expect("records")
    );
    assert_eq!(
        figure("sum(kvtrace_calls_total)"),
        k["replayed"].as_f64().expect("replayed")
    );
    assert_eq!(
        figure("kvtrace_out_of_memory_calls_total"),
        k["calls"]["out_of_memory_calls"].as_f64().expect("oom")
    );
    let l1 = &k["tiers"][0];
    let name = l1["name"].as_str().expect("tier name");
    for (metric, field) in [
        ("kvtrace_tier_resident_bytes", "resident_bytes"),
        ("kvtrace_tier_evictions_total", "evictions"),
        ("kvtrace_tier_written_bytes_total", "bytes_written"),
    ] {
        assert_eq!(
            figure(&format!("{metric}{{tier=\"{name}\"}}")),
            l1[field].as_f64().expect("tier figure"),
            "{metric}"
        );
    }
    assert_eq!(
        figure("sum(kvtrace_requests_by_hit_tier_total)"),
        hits["requests"].as_f64().expect("requests")
    );
    assert!(figure("kvtrace_fidelity_compared_requests_total") > 0.0);
}

#[test]
fn prometheus_flags_that_cannot_apply_are_one_line_errors() {
    let trace = repo("testdata/lmcache/basic_lru.lct");
    let events = crate::util::shared().map(|s| s.join("lmcache/events_churn.lct"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let mut cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec![
                "replay".into(),
                trace.clone(),
                "--prometheus-hold".into(),
                "3".into(),
            ],
            2,
            "--prometheus-port",
        ),
        (
            vec![
                "replay".into(),
                trace.clone(),
                "--prometheus-port".into(),
                "9400".into(),
                "--prometheus-hold=-1".into(),
            ],
            2,
            "--prometheus-hold -1",
        ),
        (
            vec![
                "replay".into(),
                trace.clone(),
                "--no-csv".into(),
                "--prometheus-host".into(),
                "127.0.0.1".into(),
                "--prometheus-port".into(),
                port,
            ],
            1,
            "--prometheus-port: cannot listen on 127.0.0.1:",
        ),
        (
            vec![
                "bench".into(),
                "--suite".into(),
                "--prometheus-port".into(),
                "9400".into(),
            ],
            2,
            "--suite runs many scenarios",
        ),
        (
            vec![
                "bench".into(),
                "--mlperf-option".into(),
                "1".into(),
                "--open".into(),
                "--prometheus-port".into(),
                "9400".into(),
            ],
            2,
            "serve live figures from one bench run at a time",
        ),
    ];
    if let Some(events) = events {
        cases.push((
            vec![
                "replay".into(),
                events.display().to_string(),
                "--prometheus-port".into(),
                "9400".into(),
            ],
            2,
            "an events replay has none live",
        ));
    }
    for (args, code, needle) in cases {
        let err = crate::util::one_line_error(&crate::util::kvtrace(&args), code);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
