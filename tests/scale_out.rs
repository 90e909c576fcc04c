//! Rank mode against a real 3-master Redis Cluster on loopback: `mpirun -np 4` replay and
//! bench ranks sharing the cluster, `kvtrace aggregate` over their reports, a resharding during a run,
//! and a node killed during a run. Skips with a message where `redis-server`/`redis-cli` or
//! `mpirun` are not installed (`.ci/run` installs them).
#![cfg(feature = "redis")]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::{installed, kvtrace, mpirun, sample, scratch, text, TINY_BENCH};
use serde_json::Value;

/// Three cluster-enabled redis-server children, all masters, killed when dropped.
struct Cluster {
    nodes: Vec<(u16, Child)>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free port whose cluster bus port (+10000) is free too, and which is neither of the
/// `taken` ports nor their bus ports: the probe's listener is closed before redis-server binds,
/// so the OS may hand the same port out again before the node that was given it listens.
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("port")
            .local_addr()
            .expect("addr")
            .port();
        if port >= 55000 {
            continue;
        }
        let bus = port + 10000;
        let clashes = taken
            .iter()
            .any(|&t| [t, t + 10000].contains(&port) || [t, t + 10000].contains(&bus));
        if !clashes && TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    text(&out.stdout).trim().to_owned()
}

impl Cluster {
    fn start() -> Option<Cluster> {
        if !installed("redis-server") || !installed("redis-cli") {
            return None;
        }
        let dir = scratch();
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let taken: Vec<u16> = nodes.iter().map(|n: &(u16, Child)| n.0).collect();
            let port = free_port(&taken);
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server");
            nodes.push((port, child));
        }
        let cluster = Cluster { nodes, _dir: dir };
        for port in cluster.ports() {
            let began = Instant::now();
            while cli(port, &["ping"]) != "PONG" {
                assert!(began.elapsed() < Duration::from_secs(10), "node {port}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let addresses: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(created.status.success(), "{}", text(&created.stdout));
        let began = Instant::now();
        while !cluster.ports().iter().all(|&p| {
            let info = cli(p, &["cluster", "info"]);
            info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
        }) {
            assert!(began.elapsed() < Duration::from_secs(20), "cluster not ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(cluster)
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.0).collect()
    }

    fn adapter(&self) -> String {
        format!(
            r#"{{"type":"resp-cluster","nodes":["redis://127.0.0.1:{}"]}}"#,
            self.ports()[0]
        )
    }

    /// Objects held over every master.
    fn keys(&self) -> u64 {
        self.ports()
            .iter()
            .map(|&p| cli(p, &["dbsize"]).parse::<u64>().expect("dbsize"))
            .sum()
    }
}

fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("trace_replay_summary.json")).expect("summary");
    serde_json::from_str(&text).expect("json")
}

fn n(v: &Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} in {v}"))
}

/// The cluster tier's entry of a replay summary.
fn cluster_tier(s: &Value) -> &Value {
    s["kvtrace"]["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .find(|t| t["backend"] == "resp-cluster")
        .expect("a resp-cluster tier")
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\n{}{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn mpirun_ranks_share_the_cluster_and_aggregate_adds_them_up() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = scratch();
    let trace = sample("basic_lru");
    let trace = trace.to_str().expect("path");
    let run = dir.path().join("run");
    let adapter = cluster.adapter();
    let Some(out) = mpirun(
        4,
        &[
            "replay",
            trace,
            "-q",
            "--json",
            "--shard",
            "by-request",
            "--output-dir",
            run.to_str().expect("path"),
            "--l2-adapter",
            &adapter,
        ],
    ) else {
        return;
    };
    ok(&out);
    let ranks: Vec<PathBuf> = (0..4).map(|r| run.join(format!("rank-{r:05}"))).collect();
    let reports: Vec<Value> = ranks.iter().map(|d| summary(d)).collect();
    for (r, s) in reports.iter().enumerate() {
        assert_eq!(n(s, "kvtrace.rank.rank"), r as u64);
        assert_eq!(n(s, "kvtrace.rank.world_size"), 4);
        assert_eq!(
            s["kvtrace"]["rank"]["source"],
            "OMPI_COMM_WORLD_RANK (Open MPI)"
        );
        let requests = std::fs::read_to_string(ranks[r].join("trace_replay_requests.csv"))
            .expect("requests csv");
        assert!(requests.starts_with("rank,"), "{requests}");
    }

    // The ranks together replayed the trace once: what one process replays alone.
    let single = dir.path().join("single");
    ok(&kvtrace([
        "replay",
        trace,
        "-q",
        "--json",
        "--output-dir",
        single.to_str().expect("path"),
        "--l2-adapter",
        r#"{"type":"memory"}"#,
    ]));
    let single = summary(&single);
    let sum = |path: &str| reports.iter().map(|s| n(s, path)).sum::<u64>();
    assert_eq!(sum("kvtrace.replayed"), n(&single, "kvtrace.replayed"));
    assert_eq!(
        sum("kvtrace.hits.requests"),
        n(&single, "kvtrace.hits.requests")
    );
    // Every object some rank stored is in the cluster, once.
    let stored = single["kvtrace"]["tiers"][1]["resident_objects"]
        .as_u64()
        .expect("L2 objects");
    assert_eq!(cluster.keys(), stored);

    // Whether one of the concurrent ranks loads an object before or after another rank stored
    // it is a race of the launcher's scheduling, so cross-rank hits are checked where they are
    // certain: a process that stored nothing finds every rank's objects, and each of its L2
    // loads is a cross-rank hit.
    let reader = dir.path().join("reader");
    ok(&kvtrace([
        "replay",
        trace,
        "-q",
        "--json",
        "--l1-size-gb",
        "0.001",
        "--output-dir",
        reader.to_str().expect("path"),
        "--l2-adapter",
        &adapter,
    ]));
    let reader = summary(&reader);
    let tier = cluster_tier(&reader);
    assert!(n(tier, "reads") > 0);
    assert_eq!(n(tier, "cross_rank_hits"), n(tier, "reads"));

    // The aggregate is what the ranks report, summed; percentiles from every call.
    let merged = dir.path().join("aggregate.json");
    let mut args = vec!["aggregate".to_owned(), "-q".into(), "--json".into()];
    args.push(merged.to_str().expect("path").into());
    args.extend(ranks.iter().map(|d| d.to_str().expect("path").to_owned()));
    ok(&kvtrace(&args));
    let merged: Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).expect("aggregate")).expect("json");
    assert_eq!(n(&merged, "world_size"), 4);
    assert_eq!(n(&merged, "replayed"), sum("kvtrace.replayed"));
    assert_eq!(
        n(&merged, "hits.hit_chunks"),
        sum("kvtrace.hits.hit_chunks")
    );
    assert_eq!(
        n(&merged, "calls.keys_admitted"),
        sum("kvtrace.calls.keys_admitted")
    );
    let ops = merged["ops"].as_object().expect("ops");
    for (q, op) in ops {
        let per_rank: u64 = reports
            .iter()
            .map(|s| s["ops"][q]["count"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(n(op, "count"), per_rank, "{q}");
        let max_p95 = op["max_rank_p95_ms"].as_f64().expect("p95");
        assert!(op["p95_ms"].as_f64().expect("p95") <= max_p95 + 1e-9, "{q}");
    }
    let tier = merged["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .find(|t| t["backend"] == "resp-cluster")
        .expect("cluster tier");
    let cross: u64 = reports
        .iter()
        .map(|s| n(cluster_tier(s), "cross_rank_hits"))
        .sum();
    assert_eq!(n(tier, "cross_rank_hits"), cross);
}

fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

/// The storage tier's counters of a bench result.
fn bench_storage(s: &Value) -> &Value {
    &s["kvtrace"]["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .find(|t| t["tier"] == "storage")
        .expect("a storage tier")["counters"]
}

#[test]
fn mpirun_bench_ranks_share_the_cluster_storage_tier() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = scratch();
    let output = dir.path().join("bench.json");
    let csv = dir.path().join("bench.csv");
    let tier = format!(
        r#"{{"type":"resp-cluster","nodes":["redis://127.0.0.1:{}"],"prefix":"shared"}}"#,
        cluster.ports()[1]
    );
    // Base seed 2: rank 0 (seed 2) looks up shared system prompts in its first requests.
    let mut args: Vec<&str> = TINY_BENCH.to_vec();
    args.extend([
        "--seed",
        "2",
        "--duration",
        "3",
        "--output",
        output.to_str().expect("path"),
        "--csv",
        csv.to_str().expect("path"),
        "--storage-tier",
        &tier,
    ]);
    let Some(out) = mpirun(4, &args) else {
        return;
    };
    ok(&out);
    let reports: Vec<Value> = (0..4)
        .map(|r| json_file(&dir.path().join(format!("bench.rank-{r:05}.json"))))
        .collect();
    for (r, s) in reports.iter().enumerate() {
        assert_eq!(n(s, "kvtrace.rank.rank"), r as u64);
        assert_eq!(n(s, "kvtrace.rank.world_size"), 4);
        assert_eq!(n(s, "seed"), 2 + r as u64, "seed = base + rank");
        assert_eq!(
            n(s, "kvtrace.io_errors"),
            0,
            "{}",
            s["kvtrace"]["first_io_error"]
        );
        assert!(
            n(bench_storage(s), "writes") > 0,
            "rank {r} wrote to the cluster"
        );
        let row = std::fs::read_to_string(dir.path().join(format!("bench.rank-{r:05}.csv")))
            .expect("csv");
        assert!(row.starts_with("rank,"), "{row}");
        assert!(row
            .lines()
            .nth(1)
            .expect("row")
            .starts_with(&format!("{r},")));
    }
    let sp_lookups = n(&reports[0], "summary.prefix_cache_stats.prefix_hits")
        + n(&reports[0], "summary.prefix_cache_stats.prefix_misses");
    assert!(sp_lookups > 0, "rank 0 (seed 2) looked up a system prompt");
    // Every entry is a header and its 256 KiB values in the cluster.
    assert!(
        cluster.keys()
            > reports
                .iter()
                .map(|s| n(bench_storage(s), "writes"))
                .sum::<u64>()
    );

    // A process with rank 0's seed draws rank 0's requests: its system-prompt lookups find
    // the entries the ranks wrote, reads of another process's writes.
    let reader = dir.path().join("reader.json");
    let mut args: Vec<&str> = TINY_BENCH.to_vec();
    args.extend([
        "--seed",
        "2",
        "--duration",
        "2",
        "--output",
        reader.to_str().expect("path"),
        "--storage-tier",
        &tier,
    ]);
    ok(&kvtrace(&args));
    let reader = json_file(&reader);
    assert!(n(bench_storage(&reader), "cross_rank_hits") > 0, "{reader}");
    assert!(n(&reader, "summary.prefix_cache_stats.prefix_hits") > 0);

    // The aggregate is the ranks' sums; percentiles from every request of the run.
    let merged = dir.path().join("aggregate.json");
    let mut args = vec!["aggregate".to_owned(), "-q".into(), "--json".into()];
    args.push(merged.to_str().expect("path").into());
    args.extend((0..4).map(|r| {
        dir.path()
            .join(format!("bench.rank-{r:05}.json"))
            .to_str()
            .expect("path")
            .to_owned()
    }));
    ok(&kvtrace(&args));
    let merged = json_file(&merged);
    let sum = |path: &str| reports.iter().map(|s| n(s, path)).sum::<u64>();
    assert_eq!(n(&merged, "world_size"), 4);
    assert_eq!(n(&merged, "requests_completed"), sum("requests_completed"));
    assert_eq!(n(&merged, "total_tokens"), sum("total_tokens_generated"));
    assert_eq!(
        n(&merged, "cache_hits"),
        sum("summary.cache_stats.cache_hits")
    );
    let storage = merged["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .find(|t| t["tier"] == "storage")
        .expect("storage");
    assert_eq!(
        n(storage, "writes"),
        reports
            .iter()
            .map(|s| n(bench_storage(s), "writes"))
            .sum::<u64>()
    );
    let reads: u64 = reports.iter().map(|s| n(bench_storage(s), "reads")).sum();
    assert_eq!(n(&merged, "ops.storage_read.count"), reads);
    // MLPerf Storage v3.0's trial (Rules.md §6.3.4): bandwidths and storage throughput are
    // the ranks' sums, device P95s the worst rank's, from the ranks' own reports.
    let x = |v: &Value, path: &str| -> f64 {
        path.split('.')
            .fold(v, |v, k| &v[k])
            .as_f64()
            .unwrap_or(0.0)
    };
    let stats = "summary.cache_stats";
    for (merged_key, rank_key) in [
        (
            "aggregated_read_bandwidth_gbps",
            "tier_storage_read_bandwidth_gbps",
        ),
        (
            "aggregated_write_bandwidth_gbps",
            "tier_storage_write_bandwidth_gbps",
        ),
    ] {
        let sum: f64 = reports
            .iter()
            .map(|s| x(s, &format!("{stats}.{rank_key}")))
            .sum();
        assert!(sum > 0.0, "{rank_key}");
        assert!(
            (x(&merged["mlperf"], merged_key) - sum).abs() <= 1e-9 * sum,
            "{merged_key}"
        );
    }
    let worst = reports
        .iter()
        .map(|s| x(s, &format!("{stats}.storage_write_device_p95_ms")))
        .fold(0.0, f64::max);
    assert_eq!(
        x(&merged["mlperf"], "aggregated_device_write_p95_ms"),
        worst
    );
}

/// The generated trace the longer runs replay: 3,000 records over about 5 s of trace time,
/// small objects.
fn paced_trace(dir: &Path) -> PathBuf {
    let trace = dir.join("synth.lct");
    ok(&kvtrace([
        "generate",
        trace.to_str().expect("path"),
        "--records",
        "3000",
        "--chunk-tokens",
        "2",
    ]));
    trace
}

fn paced_replay(trace: &Path, out: &Path, adapter: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(["replay", trace.to_str().expect("path"), "-q", "--json"])
        .args(["--pace", "realtime", "--speedup", "2"])
        .args(["--output-dir", out.to_str().expect("path")])
        .args(["--l2-adapter", adapter])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvtrace")
}

#[test]
fn a_resharding_during_a_run_loses_nothing() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = scratch();
    let trace = paced_trace(dir.path());
    let out = dir.path().join("out");
    let replay = paced_replay(&trace, &out, &cluster.adapter(), &[]);
    std::thread::sleep(Duration::from_millis(500));
    let ports = cluster.ports();
    let (from, to) = (
        cli(ports[0], &["cluster", "myid"]),
        cli(ports[1], &["cluster", "myid"]),
    );
    let moved = Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", ports[0])])
        .args(["--cluster-from", &from, "--cluster-to", &to])
        .args(["--cluster-slots", "3000", "--cluster-yes"])
        .output()
        .expect("reshard");
    assert!(moved.status.success(), "{}", text(&moved.stdout));
    let result = replay.wait_with_output().expect("replay");
    ok(&result);
    let s = summary(&out);
    assert_eq!(n(&s, "kvtrace.failed"), 0);
    let tier = cluster_tier(&s);
    assert_eq!(n(tier, "write_errors") + n(tier, "read_errors"), 0);
    // Every object written is still there, wherever its slot went.
    assert_eq!(cluster.keys(), n(tier, "writes"));
    assert!(n(tier, "writes") > 0);
}

#[test]
fn a_killed_node_is_a_one_line_error_and_the_reports_are_kept() {
    let Some(mut cluster) = Cluster::start() else {
        return;
    };
    let dir = scratch();
    let trace = paced_trace(dir.path());
    let out = dir.path().join("out");
    let began = Instant::now();
    let replay = paced_replay(&trace, &out, &cluster.adapter(), &["--fail-fast"]);
    std::thread::sleep(Duration::from_millis(700));
    let (_, node) = &mut cluster.nodes[2];
    node.kill().expect("kill");
    node.wait().expect("wait");
    let result = replay.wait_with_output().expect("replay");
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(result.status.code(), Some(1), "{}", text(&result.stderr));
    // One line says where it stopped and why (the cluster named), one how many failed.
    let err = text(&result.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].contains("fail fast: stopped") && lines[0].contains("resp-cluster"),
        "{err}"
    );
    // The count line says why too, the cluster named with its ports.
    let first = format!("resp-cluster redis://127.0.0.1:{}", cluster.ports()[0]);
    assert!(
        lines[1].contains("1 call(s) failed: 1 × tier I/O failed: ") && lines[1].contains(&first),
        "{err}"
    );
    // The report of what ran before the failure is written, and says why it stopped.
    let s = summary(&out);
    assert_eq!(n(&s, "kvtrace.failed"), 1);
    let tier = cluster_tier(&s);
    assert!(n(tier, "writes") > 0);
    let warnings = s["kvtrace"]["warnings"].to_string();
    assert!(warnings.contains("fail fast: stopped"), "{warnings}");
    let reasons = s["kvtrace"]["failure_reasons"].to_string();
    assert!(
        reasons.contains("tier I/O failed") && reasons.contains(&first),
        "{reasons}"
    );
}

#[test]
fn a_rank_that_never_arrives_is_named_at_the_barrier() {
    let dir = scratch();
    let trace = sample("basic_lru");
    let out = kvtrace([
        "replay",
        trace.to_str().expect("path"),
        "-q",
        "--rank",
        "0",
        "--world-size",
        "3",
        "--run-id",
        "lonely",
        "--barrier-timeout",
        "0.3",
        "--output-dir",
        dir.path().to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("rank(s) 1, 2 of 3 did not arrive"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn rank_flags_that_cannot_mean_anything_are_usage_errors() {
    let trace = sample("basic_lru");
    let trace = trace.to_str().expect("path");
    for args in [
        vec!["replay", trace, "--shard", "by-key"],
        vec!["replay", trace, trace],
        vec!["replay", trace, "--rank", "2", "--world-size", "2"],
        vec!["replay", trace, trace, "--rank", "0", "--world-size", "3"],
        vec![
            "replay",
            trace,
            "--rank",
            "0",
            "--world-size",
            "2",
            "--run-id",
            "../x",
        ],
        vec!["bench", "--suite", "--rank", "0", "--world-size", "2"],
        vec!["bench", "--storage-tier", r#"{"type":"fs","path":"/tmp"}"#],
        vec!["bench", "--storage-tier", "{not json"],
        vec![
            "bench",
            "--storage-tier",
            r#"{"type":"resp-cluster","nodes":["redis://127.0.0.1:1"],"capacity_gb":1}"#,
        ],
        vec![
            "bench",
            "--storage-capacity-gb",
            "1",
            "--storage-tier",
            r#"{"type":"resp-cluster","nodes":["redis://127.0.0.1:1"]}"#,
        ],
    ] {
        let out = kvtrace(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stderr).lines().count(), 1, "{args:?}");
    }
    // A cluster that does not answer: one line naming it, exit 1, before any time is spent.
    let out = kvtrace([
        "bench",
        "--storage-tier",
        r#"{"type":"resp-cluster","nodes":["redis://127.0.0.1:1"]}"#,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("resp-cluster redis://127.0.0.1:1"),
        "{stderr}"
    );
}

#[test]
fn aggregate_refuses_reports_that_are_not_one_run_with_one_line() {
    let dir = scratch();
    let trace = sample("basic_lru");
    let trace = trace.to_str().expect("path");
    let out = dir.path().to_str().expect("path");
    ok(&kvtrace([
        "replay",
        trace,
        "-q",
        "--json",
        "--rank",
        "0",
        "--world-size",
        "1",
        "--output-dir",
        out,
    ]));
    let rank0 = summary(&dir.path().join("rank-00000"));
    let write = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut v = rank0.clone();
        edit(&mut v);
        let path = dir.path().join(name);
        std::fs::write(&path, v.to_string()).expect("write");
        path.to_str().expect("path").to_owned()
    };
    let good = write("good.json", &|_| {});
    let no_rank = write("plain.json", &|v| v["kvtrace"]["rank"] = Value::Null);
    let of_two = write("of-two.json", &|v| {
        v["kvtrace"]["rank"]["world_size"] = 2.into()
    });
    let rank1_of_two = write("r1.json", &|v| {
        v["kvtrace"]["rank"]["rank"] = 1.into();
        v["kvtrace"]["rank"]["world_size"] = 2.into();
    });
    let bad_histogram = write("hist.json", &|v| {
        let h = v["kvtrace"]["latency_histograms"]
            .as_object_mut()
            .expect("map");
        let first = h.keys().next().expect("one").clone();
        h.insert(first, "!!!".into());
    });
    let not_json = dir.path().join("broken.json");
    std::fs::write(&not_json, "{\"kvtrace\": ").expect("write");
    let not_json = not_json.to_str().expect("path").to_owned();
    let bench = dir.path().join("bench.json");
    std::fs::write(
        &bench,
        r#"{"requests_completed": 1, "kvtrace": {"rank": null}}"#,
    )
    .expect("write");
    let bench = bench.to_str().expect("path").to_owned();
    for (files, code, says) in [
        (vec![&no_rank], 2, "not a kvtrace replay summary of a rank"),
        (vec![&of_two], 2, "rank(s) 1 of 2 missing"),
        (vec![&good, &good], 2, "are both rank 0"),
        (vec![&good, &rank1_of_two], 2, "world size 2 differs"),
        (vec![&bad_histogram], 2, "not base64"),
        (vec![&not_json], 1, "broken.json"),
        (vec![&bench], 2, "not a kvtrace bench result of a rank"),
        (vec![&good, &bench], 2, "is a bench result and"),
    ] {
        let mut args = vec!["aggregate", "-q"];
        args.extend(files.iter().map(|f| f.as_str()));
        let out = kvtrace(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{files:?}: {err}");
        assert!(err.contains(says), "{files:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let merged = kvtrace(["aggregate", good.as_str()]);
    ok(&merged);
    assert!(
        text(&merged.stdout).starts_with("1 ranks, 41 calls"),
        "{}",
        text(&merged.stdout)
    );
}
