//! Replay tells the truth: real LMCache 0.5.6 recordings made under eviction pressure,
//! replayed with the configuration they record, reproduce what the client got request by
//! request; another configuration reports each difference with a reason.

use std::path::{Path, PathBuf};

use crate::util::{kvtrace, scratch, shared, text};
use kvtrace::replay::client::{resolve, ClientChoice};
use kvtrace::replay::phase::{settle, PhaseChoice};
use kvtrace::replay::report::ReplayReport;
use kvtrace::replay::session::SessionModel;
use kvtrace::replay::{replay, ReplayOptions, Source};
use kvtrace::storage::config::{L2Config, L2Io, StorageConfig};
use kvtrace::storage::StorageManager;

/// The chunks the SDK client got back, one per retrieve, in order.
pub(crate) fn client_hits(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .expect("client log")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"retrieve")).then(|| f[3].parse().expect("count"))
        })
        .collect()
}

/// Replays `trace` as `kvtrace replay` does without storage flags: the recorded
/// configuration (an fs adapter in `l2_dir` where the recording had one, its calls run as
/// `io` says), the eviction phase estimated from the trace.
fn replay_recorded(trace: &Path, l2_dir: Option<&Path>, io: L2Io) -> ReplayReport {
    let reader = kvtrace::lmct::TraceReader::open(trace, Default::default()).expect("open");
    let recorded = reader.header().sm_config_json.clone();
    let (mut config, _) = StorageConfig::from_lmcache_json(&recorded).expect("LMCache config");
    if let Some(dir) = l2_dir {
        let adapter = serde_json::json!({"type": "fs", "base_path": dir});
        config.l2 = vec![L2Config::from_adapter(&adapter).expect("fs adapter")];
    }
    config.l2_io = io;
    let mut options = ReplayOptions::default();
    let client = resolve(Source::File(trace), options.read, &options.client).expect("client");
    options.client = ClientChoice::Resolved(client.clone());
    let follow = SessionModel {
        emulate: true,
        client,
    };
    let phase = settle(
        Source::File(trace),
        None,
        options.read,
        &recorded,
        &mut config,
        PhaseChoice::Estimate,
        &follow,
    )
    .expect("phase");
    let mut sm = StorageManager::new(config).expect("manager");
    let mut report = replay(trace, &mut sm, &options, |_| {}).expect("replay");
    report.eviction_phase = phase;
    report
}

/// A recording with an fs tier is checked twice: with synchronous tier I/O, and with the
/// tier's calls on two workers behind a queue of two, which must change no figure.
fn check_against_client(trace: &Path, client: &Path) {
    let name = trace.file_name().and_then(|n| n.to_str()).unwrap_or("");
    check_io_against_client(trace, client, L2Io::Synchronous);
    if name.contains("l2fs") {
        let io = L2Io::asynchronous(2, 2).expect("mode");
        check_io_against_client(trace, client, io);
    }
}

fn check_io_against_client(trace: &Path, client: &Path, io: L2Io) {
    let dir = scratch();
    let name = format!(
        "{} ({io:?})",
        trace.file_name().and_then(|n| n.to_str()).unwrap_or("")
    );
    let l2 = name.contains("l2fs").then(|| dir.path().join("l2"));
    let report = replay_recorded(trace, l2.as_deref(), io);
    let want = client_hits(client);
    let got: Vec<u64> = report.requests.iter().map(|r| r.hit_chunks).collect();
    assert_eq!(got.len(), want.len(), "{name}: one request per retrieve");
    let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    assert!(
        differ.is_empty(),
        "{name}: requests {differ:?} differ from the client"
    );
    assert_eq!(report.failed, 0, "{name}");
    assert!(report.fidelity.exact(), "{name}: {:?}", report.fidelity);
    assert!(
        report.calls.eviction_passes > 0,
        "{name}: recorded under pressure"
    );
    if l2.is_some() {
        assert_eq!(
            report.fidelity.replayed_l2_hit_chunks,
            l2_hits_on_server(
                &client
                    .with_extension("")
                    .with_extension("server_excerpt.txt")
            ),
            "{name}: the L2 share of the hits, as the server logged it"
        );
        // Every write the cache counted reached the disk, every read found its file.
        let (tier, io) = (&report.tiers[1], &report.tier_io[0].calls);
        assert_eq!(io.writes, tier.writes, "{name}: {io:?}");
        assert_eq!(
            io.lost_reads + tier.write_errors + tier.read_errors,
            0,
            "{name}"
        );
        let files = walk(&dir.path().join("l2"));
        assert_eq!(files, tier.resident_objects, "{name}: object files on disk");
    }
}

/// The object files under `dir`.
fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.expect("entry").path())
                .map(|p| {
                    if p.is_dir() {
                        walk(&p)
                    } else {
                        u64::from(p.extension().is_some_and(|e| e == "kv"))
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The sum of "y L2" over the server's "Prefetch request completed … (x L1, y L2)" lines.
fn l2_hits_on_server(excerpt: &Path) -> u64 {
    std::fs::read_to_string(excerpt)
        .expect("excerpt")
        .lines()
        .filter_map(|l| {
            let tail = l.split(" L1, ").nth(1)?;
            tail.split(" L2)").next()?.parse::<u64>().ok()
        })
        .sum()
}

/// `trace_replay_summary.json` of a replay's output directory.
fn summary_json(dir: &Path) -> serde_json::Value {
    let bytes = std::fs::read(dir.join("trace_replay_summary.json")).expect("json");
    serde_json::from_slice(&bytes).expect("parse")
}

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/lmcache/churn")
}

#[test]
fn bundled_churn_recordings_replay_to_what_the_client_got() {
    let mut n = 0;
    for entry in std::fs::read_dir(bundled()).expect("churn dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("lct") {
            continue;
        }
        check_against_client(&path, &path.with_extension("client.txt"));
        n += 1;
    }
    assert_eq!(n, 7);
}

#[test]
fn shared_churn_recordings_replay_to_what_the_client_got() {
    let Some(shared) = shared() else { return };
    let lmcache = shared.join("lmcache");
    for name in ["churn_lru", "churn_arc", "churn_l2fs"] {
        check_against_client(
            &lmcache.join(format!("{name}.lct")),
            &lmcache.join(format!("run_logs/{name}.client.txt")),
        );
    }
}

#[test]
fn a_what_if_replay_reports_each_difference_and_fails_only_when_asked() {
    let trace = bundled().join("lru_seed1.lct");
    let dir = scratch();
    let out = dir.path().display().to_string();
    let args = [
        "replay",
        trace.to_str().expect("path"),
        "--l1-size-gb",
        "0.002",
        "--output-dir",
        &out,
        "--json",
    ];
    let run = kvtrace(args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let table = text(&run.stdout);
    assert!(table.contains("Requests whose hits match:"), "{table}");
    assert!(table.contains("evicted earlier") || table.contains("allocation refused"));
    let summary = summary_json(dir.path());
    let f = &summary["kvtrace"]["fidelity"];
    let requests = f["requests"].as_u64().expect("requests");
    let matching = f["requests_matching"].as_u64().expect("matching");
    assert!(matching < requests, "half the L1 changes some requests");
    assert!(f["replayed_hit_chunks"].as_u64() < f["recorded_hit_chunks"].as_u64());
    let first = &f["first_divergences"][0];
    assert!(first["record"].as_u64().expect("record") > 0);
    assert!(first["offset"].as_u64().expect("offset") > 0);
    assert!(!first["reason"].as_str().expect("reason").is_empty());
    let rows = std::fs::read_to_string(dir.path().join("trace_replay_requests.csv")).expect("csv");
    let header = rows.lines().next().expect("header");
    assert!(header.contains("hit_chunks") && header.ends_with("recorded_hit_chunks"));
    assert_eq!(rows.lines().count() as u64, requests + 1);

    let strict = kvtrace(args.iter().copied().chain(["--expect-fidelity", "-q"]));
    assert_eq!(strict.status.code(), Some(1));
    let recorded = kvtrace([
        "replay",
        trace.to_str().expect("path"),
        "--no-csv",
        "-q",
        "--expect-fidelity",
    ]);
    assert_eq!(
        recorded.status.code(),
        Some(0),
        "{}",
        text(&recorded.stderr)
    );
}

#[test]
fn the_phase_estimate_is_deterministic_and_a_pinned_phase_is_used_as_given() {
    let trace = bundled().join("arc_seed2.lct");
    let a = replay_recorded(&trace, None, L2Io::Synchronous);
    let b = replay_recorded(&trace, None, L2Io::Synchronous);
    let (pa, pb) = (
        a.eviction_phase.expect("phase"),
        b.eviction_phase.expect("phase"),
    );
    assert_eq!(pa, pb);
    assert_eq!(pa.source, "estimated");
    // The plateau may wrap around the interval (its end before its start).
    let [from, to] = pa.plateau_s;
    let inside = if from <= to {
        from <= pa.phase_s && pa.phase_s <= to
    } else {
        pa.phase_s >= from || pa.phase_s <= to
    };
    assert!(inside, "{pa:?}");
    assert_eq!(a.requests, b.requests);

    let dir = scratch();
    let out = kvtrace([
        "replay",
        trace.to_str().expect("path"),
        "--eviction-phase",
        "0.5",
        "--json",
        "--no-csv",
        "-q",
        "--output-dir",
        dir.path().to_str().expect("dir"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let phase = &summary_json(dir.path())["kvtrace"]["eviction_phase"];
    assert_eq!(phase["source"], "flag");
    assert_eq!(phase["phase_s"], 0.5);
    let bad = kvtrace([
        "replay",
        trace.to_str().expect("path"),
        "--eviction-phase=-1",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    let err = text(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--eviction-phase"), "{err}");
}

/// A trace written straight through the recorder API: 300 stores of distinct 64 KiB chunks
/// one microsecond apart into a 1 MiB L1.
fn time_compressed_trace(path: &Path) {
    use kvtrace::lmct::calls::StorageCall;
    let config = StorageConfig {
        l1_size_bytes: 1 << 20,
        ..StorageConfig::default()
    };
    let layout = crate::util::layout(64);
    let mut trace = crate::util::TraceBuilder::create(path, &config);
    for i in 0..300u32 {
        let keys = [crate::util::key(i.to_le_bytes().repeat(8))];
        let t = 0.5 + f64::from(2 * i) * 1e-6;
        trace
            .call(
                t,
                StorageCall::ReserveWrite {
                    keys: &keys,
                    layout_desc: &layout,
                },
            )
            .call(t + 1e-6, StorageCall::FinishWrite { keys: &keys });
    }
    trace.finish();
}

#[test]
fn a_time_compressed_trace_gets_one_warning_with_the_remedy() {
    let dir = scratch();
    let trace = dir.path().join("compressed.lct");
    time_compressed_trace(&trace);
    let path = trace.to_str().expect("path");
    let out = kvtrace(["replay", path, "--no-csv", "-q"]);
    assert_eq!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("OUT_OF_MEMORY"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("replay with immediate eviction timing"),
        "{err}"
    );
    let fixed = kvtrace([
        "replay",
        path,
        "--no-csv",
        "-q",
        "--eviction-timing",
        "immediate",
    ]);
    assert_eq!(fixed.status.code(), Some(0));
    assert!(!text(&fixed.stderr).contains("OUT_OF_MEMORY"));
}

/// The what-if recordings (`../shared/lmcache/whatif/`): one workload of a vLLM-like client
/// run against real servers of several L1 sizes and policies, named
/// `<workload>_<size with p for .>_<policy>[<rest>]`. Every file found is checked, so
/// recordings added there are checked too. Returns (name, workload key, size, policy, path).
pub(crate) fn whatif_recordings(shared: &Path) -> Vec<(String, String, String, String, PathBuf)> {
    let dir = shared.join("lmcache/whatif");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("whatif dir") {
        let path = entry.expect("entry").path();
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".lct"))
        else {
            continue;
        };
        if !path.with_extension("client.txt").exists() {
            continue;
        }
        let parts: Vec<&str> = stem.split('_').collect();
        let Some(i) = parts.iter().position(|p| {
            p.split_once('p')
                .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        }) else {
            continue;
        };
        let Some(policy) = parts.get(i + 1) else {
            continue;
        };
        let workload = format!("{}|{}", parts[..i].join("_"), parts[i + 2..].join("_"));
        found.push((
            stem.to_owned(),
            workload,
            parts[i].replace('p', "."),
            policy.to_uppercase(),
            path,
        ));
    }
    found.sort();
    found
}

/// Each request's hits when `trace` is replayed by the CLI with `flags`, and the summary.
fn replayed_hits(trace: &Path, flags: &[&str]) -> (Vec<u64>, serde_json::Value) {
    let dir = scratch();
    let out = dir.path().to_str().expect("dir");
    let mut args = vec!["replay", trace.to_str().expect("path"), "--json", "-q"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--output-dir", out]);
    let run = kvtrace(&args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let rows = std::fs::read_to_string(dir.path().join("trace_replay_requests.csv")).expect("csv");
    let mut lines = rows.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = header
        .iter()
        .position(|&h| h == "hit_chunks")
        .expect("hit_chunks");
    let hits = lines
        .map(|l| l.split(',').nth(col).expect("cell").parse().expect("count"))
        .collect();
    (hits, summary_json(dir.path()))
}

/// Chunks requested per retrieve, from the client log.
pub(crate) fn client_requested(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .expect("client log")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"retrieve")).then(|| f[2].parse::<u64>().expect("count"))
        })
        .sum()
}

#[test]
fn whatif_recordings_replay_to_what_their_own_clients_got() {
    let Some(shared) = shared() else { return };
    let recordings = whatif_recordings(&shared);
    assert!(recordings.len() >= 4, "{recordings:?}");
    for (name, _, _, _, path) in &recordings {
        let (got, summary) = replayed_hits(path, &[]);
        let want = client_hits(&path.with_extension("client.txt"));
        assert_eq!(got, want, "{name}: request by request");
        let client = &summary["kvtrace"]["client"];
        assert_eq!(client["model"], "vllm", "{name}: {client}");
        assert_eq!(client["source"], "inferred", "{name}");
    }
}

#[test]
fn whatif_replays_predict_the_real_server_of_another_size_request_by_request() {
    let Some(shared) = shared() else { return };
    let recordings = whatif_recordings(&shared);
    let mut pairs = 0;
    for (a, work_a, _, _, trace) in &recordings {
        for (b, work_b, size, policy, truth_path) in &recordings {
            if work_a != work_b || a == b {
                continue;
            }
            let truth_log = truth_path.with_extension("client.txt");
            let truth = client_hits(&truth_log);
            let requested = client_requested(&truth_log) as f64;
            let flags = ["--l1-size-gb", size.as_str(), "--eviction-policy", policy];
            let (got, _) = replayed_hits(trace, &flags);
            assert_eq!(got.len(), truth.len(), "{a} as {b}: one row per request");
            let exact = got.iter().zip(&truth).filter(|(g, t)| g == t).count();
            let pp = 100.0 * (got.iter().sum::<u64>() as f64 - truth.iter().sum::<u64>() as f64)
                / requested;
            assert!(
                exact as f64 >= 0.95 * truth.len() as f64,
                "{a} as {b}: {exact}/{} requests exact",
                truth.len()
            );
            assert!(pp.abs() <= 1.0, "{a} as {b}: {pp:+.2} pp");
            pairs += 1;
        }
    }
    assert!(pairs >= 12, "{pairs} cross-replays");
}

#[test]
fn asynchronous_tier_io_predicts_request_by_request_what_synchronous_io_does() {
    let Some(shared) = shared() else { return };
    let recordings = whatif_recordings(&shared);
    let (name, _, _, _, trace) = recordings.first().expect("a what-if recording");
    let dir = scratch();
    let run = |io: &[&str], tier: &str| {
        let path = dir.path().join(tier);
        let adapter = format!(
            r#"{{"type":"fs","path":"{}","capacity_gb":0.01}}"#,
            path.display()
        );
        let mut flags = vec!["--l1-size-gb", "0.005", "--l2-adapter", &adapter];
        flags.extend_from_slice(io);
        replayed_hits(trace, &flags)
    };
    let (sync_hits, sync) = run(&[], "sync");
    let (async_hits, asynchronous) = run(
        &[
            "--l2-io",
            "asynchronous",
            "--l2-io-depth",
            "4",
            "--l2-io-workers",
            "2",
        ],
        "async",
    );
    assert_eq!(async_hits, sync_hits, "{name}: request by request");
    let k = |v: &serde_json::Value, field: &str| v["kvtrace"][field].clone();
    for field in ["hits", "fidelity", "calls", "tiers"] {
        assert_eq!(k(&asynchronous, field), k(&sync, field), "{name}: {field}");
    }
    let l2 = &k(&asynchronous, "tiers")[1];
    assert!(
        l2["reads"].as_u64() > Some(0),
        "{name}: the L2 tier served hits: {l2}"
    );
    assert!(
        l2["evictions"].as_u64() > Some(0),
        "{name}: and evicted: {l2}"
    );
    let io = &k(&asynchronous, "tier_io")[0];
    assert_eq!(io["mode"], "asynchronous");
    assert_eq!(io["calls"]["writes"], l2["writes"], "{io}");
    assert_eq!(io["calls"]["lost_reads"], 0, "{io}");
}

#[test]
fn the_client_shape_is_inferred_from_the_stores_and_can_be_named() {
    let Some(shared) = shared() else { return };
    let churn = shared.join("lmcache/churn_lru.lct");
    let (_, summary) = replayed_hits(&churn, &[]);
    assert_eq!(summary["kvtrace"]["client"]["model"], "sdk");
    let whatif = shared.join("lmcache/whatif/vllm_s21_0p05_lru.lct");
    // Named literal, a smaller L1 replays the recorded stores as they are: nothing added.
    let (_, literal) = replayed_hits(&whatif, &["--l1-size-gb", "0.0125", "--client", "literal"]);
    let c = &literal["kvtrace"]["client"];
    assert_eq!(c["model"], "literal");
    assert_eq!(c["source"], "given");
    assert_eq!(c["stores_resized"], 0);
    assert_eq!(c["stores_added"], 0);
    let (_, vllm) = replayed_hits(&whatif, &["--l1-size-gb", "0.0125"]);
    let c = &vllm["kvtrace"]["client"];
    assert_eq!(c["model"], "vllm");
    assert!(c["stores_resized"].as_u64().expect("resized") > 0, "{c}");
    assert!(c["keys_added"].as_u64().expect("added") > 0, "{c}");
}

#[test]
fn the_report_leads_with_the_configuration_replayed_and_what_the_recording_ran() {
    let trace = bundled().join("lru_seed1.lct");
    let path = trace.to_str().expect("path");
    let run = kvtrace(["replay", path, "--l1-size-gb", "0.002", "--no-csv"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let table = text(&run.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[1].contains("Answer"), "{table}");
    assert!(
        lines[2].starts_with("L1:") && lines[2].contains("0.002 GiB"),
        "{table}"
    );
    assert!(lines[3].trim_start().starts_with("recorded:"), "{table}");
    let answer_end = lines
        .iter()
        .position(|l| l.contains("Overall"))
        .expect("Overall");
    let answer = lines[..answer_end].join("\n");
    for row in [
        "Eviction:",
        "L2:",
        "Client model:",
        "Hit rate (L1 + L2):",
        "Requests whose hits match",
    ] {
        assert!(answer.contains(row), "{row} in {answer}");
    }
    // Latencies in microseconds: a replayed call takes a few, which milliseconds hid as 0.00.
    assert!(table.contains("Per-Op Latency (µs)"), "{table}");

    let info = text(&kvtrace(["info", path]).stdout);
    let recorded_l1 = info
        .lines()
        .find(|l| l.trim_start().starts_with("recorded L1:"))
        .expect("recorded L1 in info");
    assert!(
        recorded_l1.contains("GiB") && recorded_l1.contains("objects of"),
        "{info}"
    );
    assert!(info.contains("recorded eviction:"), "{info}");
}
