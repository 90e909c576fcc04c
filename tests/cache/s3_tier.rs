//! The s3 tier against a real S3 server, `s3s-fs`, started on a loopback port for each test.
//! Skips with a message where `s3s-fs` is not installed (`.ci/run` installs it:
//! `cargo install s3s-fs --version 0.14.1 --features binary --locked`).
#![cfg(feature = "s3")]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{free_port, kvtrace_with, one_line_error, sample, scratch, text, KillOnDrop};
use kvtrace::replay::{replay, ReplayOptions};
use kvtrace::storage::backend::Backend;
use kvtrace::storage::config::{
    BackendConfig, EvictionTiming, L2Config, S3Location, StorageConfig,
};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::s3::{S3Tier, MULTIPART_BYTES};
use kvtrace::storage::{KeyId, StorageManager};

/// The credentials every server here is started with, and every client of this process
/// signs with: the environment is the process's, shared by the tests that run at once.
const ACCESS_KEY: &str = "kvtrace-test-key";
const SECRET_KEY: &str = "kvtrace-test-secret";
const BUCKET: &str = "kvtrace-test";

/// An s3s-fs child on 127.0.0.1 serving a directory, killed when dropped.
struct Server {
    _child: KillOnDrop,
    port: u16,
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

/// A server on a free port over a new scratch directory holding the bucket.
fn start() -> Option<Server> {
    let port = free_port();
    let dir = scratch();
    std::fs::create_dir(dir.path().join(BUCKET)).expect("bucket directory");
    let mut server = start_on(port, dir.path().to_owned())?;
    server._dir = Some(dir);
    Some(server)
}

/// A server on `port` over `root` (which holds the bucket's directory).
fn start_on(port: u16, root: PathBuf) -> Option<Server> {
    if Command::new("s3s-fs").arg("--help").output().is_err() {
        eprintln!(
            "SKIP: s3s-fs is not installed \
             (cargo install s3s-fs --version 0.14.1 --features binary --locked)"
        );
        return None;
    }
    // Every test of this file sets the same values, and no other test of the binary reads
    // AWS_* variables: the process's environment is shared by the tests that run at once.
    for (name, value) in [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    ] {
        std::env::set_var(name, value);
    }
    // A developer's or a runner's own AWS settings must not reach the loopback server.
    for name in [
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_PROFILE",
    ] {
        std::env::remove_var(name);
    }
    let child = Command::new("s3s-fs")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn s3s-fs");
    let server = Server {
        _child: KillOnDrop(child),
        port,
        root,
        _dir: None,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("s3s-fs did not listen on port {port}");
}

impl Server {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn location(&self, prefix: &str) -> S3Location {
        S3Location {
            endpoint: Some(self.endpoint()),
            bucket: BUCKET.into(),
            prefix: prefix.into(),
            region: None,
        }
    }

    fn adapter(&self, prefix: &str) -> String {
        format!(
            r#"{{"type":"s3","endpoint":"{}","bucket":"{BUCKET}","prefix":"{prefix}"}}"#,
            self.endpoint()
        )
    }

    /// The objects under `prefix`, as the server keeps them on disk: names and lengths.
    fn objects(&self, prefix: &str) -> Vec<(String, u64)> {
        let dir: PathBuf = self.root.join(BUCKET).join(prefix);
        let mut found: Vec<(String, u64)> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .map(|e| e.expect("entry"))
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| {
                        let len = e.metadata().expect("metadata").len();
                        (e.file_name().to_string_lossy().into_owned(), len)
                    })
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }
}

fn config(location: S3Location) -> StorageConfig {
    let mut c = StorageConfig {
        l1_size_bytes: 1 << 30,
        l2: vec![L2Config {
            backend: BackendConfig::S3(location),
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        }],
        ..StorageConfig::default()
    };
    c.eviction.timing = EvictionTiming::Immediate;
    c
}

/// `kvtrace replay` of basic_lru.lct with one s3 tier under `prefix` and `flags`; its JSON.
fn replay_into(server: &Server, prefix: &str, flags: &[&str]) -> serde_json::Value {
    let dir = scratch();
    let json = dir.path().join("r.json");
    let trace = sample("basic_lru").display().to_string();
    let adapter = server.adapter(prefix);
    let json_flag = format!("--json={}", json.display());
    let mut args = vec![
        "replay",
        &trace,
        "--no-csv",
        "-q",
        "--l2-adapter",
        &adapter,
        &json_flag,
    ];
    args.extend_from_slice(flags);
    let out = kvtrace_with(args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&std::fs::read(&json).expect("report")).expect("json")
}

#[test]
fn a_replay_writes_every_object_through_to_a_real_s3_server() {
    let Some(server) = start() else { return };
    let report = replay_into(&server, "run1", &[]);
    let tier = &report["kvtrace"]["tiers"][1];
    assert_eq!(tier["backend"], "s3", "{tier}");
    assert_eq!(
        tier["writes"], 13,
        "every admitted object is written through"
    );
    assert_eq!(tier["write_errors"], 0);
    // The server really holds the objects, under hash-derived names, with their full size.
    let objects = server.objects("run1");
    assert_eq!(objects.len(), 13, "{objects:?}");
    for (name, len) in &objects {
        assert!(
            name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}"
        );
        assert_eq!(*len, 131_072, "{name}");
    }
}

#[test]
fn asynchronous_io_lands_every_object_in_s3_before_the_replay_returns() {
    let Some(server) = start() else { return };
    let report = replay_into(&server, "queued", &["--l2-io", "asynchronous"]);
    let io = &report["kvtrace"]["tier_io"][0];
    assert_eq!(io["mode"], "asynchronous", "{io}");
    assert_eq!(io["calls"]["writes"], 13, "{io}");
    assert_eq!(io["calls"]["bytes_written"], 13 * 131_072, "{io}");
    assert_eq!(report["kvtrace"]["tiers"][1]["write_errors"], 0);
    assert_eq!(server.objects("queued").len(), 13);
}

#[test]
fn prefetches_load_what_l1_lost_back_from_s3() {
    let Some(server) = start() else { return };
    let sm = StorageManager::new(config(server.location("loads"))).expect("connect");
    crate::util::l2_serves_what_l1_lost(sm, |_| assert_eq!(server.objects("loads").len(), 3));
}

#[test]
fn a_large_object_goes_up_in_parts_and_reads_back_whole() {
    let Some(server) = start() else { return };
    let mut tier = S3Tier::connect(&server.location("big")).expect("connect");
    let size = 2 * MULTIPART_BYTES as u64 + 12345;
    tier.put(KeyId(7), size).expect("multipart upload");
    assert_eq!(server.objects("big"), vec![(format!("{:032x}", 7), size)]);
    assert!(tier.get(KeyId(7)).expect("get"));
    tier.delete(KeyId(7)).expect("delete");
    assert!(server.objects("big").is_empty());
    assert!(
        !tier.get(KeyId(7)).expect("get"),
        "a deleted object is a miss"
    );
}

#[test]
fn a_wrong_secret_is_one_line_and_exit_1() {
    let Some(server) = start() else { return };
    let trace = sample("basic_lru").display().to_string();
    let out = kvtrace_with(
        [
            "replay",
            &trace,
            "--no-csv",
            "-q",
            "--l2-adapter",
            &server.adapter("denied"),
        ],
        &[
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
        ],
    );
    let err = one_line_error(&out, 1);
    assert!(err.contains(&server.endpoint()), "{err}");
    assert!(server.objects("denied").is_empty());
}

#[test]
fn credentials_in_the_tier_configuration_are_refused() {
    let trace = sample("basic_lru").display().to_string();
    let adapter = r#"{"type":"s3","bucket":"kvtrace-test","secret_access_key":"x"}"#;
    let out = kvtrace_with(
        ["replay", &trace, "--no-csv", "-q", "--l2-adapter", adapter],
        &[],
    );
    let err = one_line_error(&out, 2);
    assert!(err.contains("AWS_SECRET_ACCESS_KEY"), "{err}");
}

#[test]
fn a_malformed_s3_tier_is_one_line_naming_the_field_and_exit_2() {
    let trace = sample("basic_lru").display().to_string();
    for (adapter, field) in [
        (r#"{"type":"s3"}"#, "\"bucket\""),
        (r#"{"type":"s3","bucket":""}"#, "\"bucket\""),
        (
            r#"{"type":"s3","bucket":"b","endpoint":"ftp://h"}"#,
            "endpoint",
        ),
        (r#"{"type":"s3","bucket":"b","prefix":7}"#, "prefix"),
    ] {
        let out = kvtrace_with(
            ["replay", &trace, "--no-csv", "-q", "--l2-adapter", adapter],
            &[],
        );
        let err = one_line_error(&out, 2);
        assert!(
            err.contains("--l2-adapter") && err.contains(field),
            "{adapter}: {err}"
        );
    }
}

#[test]
fn a_dead_server_fails_each_store_in_one_line_and_a_restarted_one_is_reconnected() {
    let Some(server) = start() else { return };
    let mut tier = S3Tier::connect(&server.location("dies")).expect("connect");
    tier.put(KeyId(1), 4096).expect("first store");
    let mut sm = StorageManager::new(config(server.location("dies-replay"))).expect("connect");
    let (port, root) = (server.port, server.root.clone());
    let keep = scratch();
    // The restarted server serves a copy of the same directory (the first one goes with the
    // first server).
    let copy = keep.path().to_owned();
    std::fs::create_dir_all(copy.join(BUCKET).join("dies")).expect("copy");
    for (name, _) in server.objects("dies") {
        let from = root.join(BUCKET).join("dies").join(&name);
        std::fs::copy(from, copy.join(BUCKET).join("dies").join(&name)).expect("copy object");
    }
    drop(server);
    let e = tier.put(KeyId(2), 4096).expect_err("no server").to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.starts_with("s3 http://127.0.0.1:"), "{e}");
    assert!(!tier.contains(KeyId(2)), "a failed store is not held");
    // Every store of a replay against the dead server is counted as failed.
    let r = replay(
        &sample("basic_lru"),
        &mut sm,
        &ReplayOptions::default(),
        |_| {},
    )
    .expect("replay");
    let s3 = &r.tiers[1];
    assert_eq!((s3.writes, s3.resident_objects), (0, 0));
    assert_eq!(s3.write_errors, 13, "every refused store is counted");
    assert!(r.failed > 0);
    // Back on the same port, the server is reached again once a second has passed.
    let restarted = start_on(port, copy).expect("restarted");
    std::thread::sleep(Duration::from_millis(1100));
    tier.put(KeyId(3), 4096)
        .expect("the restarted server takes the store");
    assert!(
        tier.get(KeyId(1)).expect("get"),
        "what the first server held is there"
    );
    assert_eq!(restarted.objects("dies").len(), 2);
}

#[test]
fn simulates_offload_lands_in_s3_with_the_same_report_as_a_file_tier() {
    let Some(server) = start() else { return };
    let dir = scratch();
    let run = |l2: &str| {
        use crate::simulate::engines::{offload_workload, simulate, without_live};
        let args = offload_workload(&[
            "--l1-size-gb",
            "0.0125",
            "--eviction-timing",
            "immediate",
            "--l2-adapter",
            l2,
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut v = without_live(simulate(dir.path(), &args));
        // The L2 tier's backend name is the one figure the place of the tier changes.
        let backend = v["offload_tiers"][1]["backend"].take();
        (v, backend)
    };
    let files = format!(
        r#"{{"type":"fs","path":"{}"}}"#,
        dir.path().join("l2").display()
    );
    let (on_s3, backend) = run(&server.adapter("offload"));
    assert_eq!(backend, "s3");
    assert!(on_s3["offload_l2_hit_chunks"].as_f64().expect("l2 hits") > 0.0);
    assert_eq!(on_s3, run(&files).0, "the tier's place changes no figure");
    let objects = server.objects("offload");
    assert_eq!(
        objects.len() as u64,
        on_s3["offload_tiers"][1]["resident_objects"]
            .as_u64()
            .expect("resident objects"),
        "the server holds every object the tier counts"
    );
    assert!(objects.iter().all(|(_, len)| *len == 256 * 1024));
}

#[test]
fn a_recorded_s3_tier_is_not_rebuilt_from_the_header() {
    let Some(server) = start() else { return };
    let dir = scratch();
    let lct = dir.path().join("t.lct");
    let (adapter, record) = (server.adapter("recorded"), lct.display().to_string());
    crate::simulate::engines::simulate(
        dir.path(),
        &[
            "--input-tokens",
            "1024",
            "--output-tokens",
            "4",
            "--request-count",
            "4",
            "--request-rate",
            "10",
            "--l1-size-gb",
            "1",
            "--l2-adapter",
            &adapter,
            "--record",
            &record,
        ],
    );
    let endpoint = server.endpoint();
    drop(server);
    let out = kvtrace_with(
        [
            "replay",
            &lct.display().to_string(),
            "-q",
            "--output-dir",
            &dir.path().join("out").display().to_string(),
        ],
        &[],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("was not rebuilt"), "{err}");
    assert!(
        err.contains(&format!("an s3 tier at {endpoint}")),
        "says which: {err}"
    );
}

#[test]
fn bench_keeps_its_storage_tier_in_s3() {
    let Some(server) = start() else { return };
    // Synchronous calls, then the same through queues: drained before the report, every
    // entry the tier holds is in the bucket either way.
    for (prefix, io) in [("bench", "synchronous"), ("bench-async", "asynchronous")] {
        let dir = scratch();
        let report = dir.path().join("bench.json");
        let report_arg = report.display().to_string();
        let adapter = server.adapter(prefix);
        let mut args = crate::util::TINY_BENCH.to_vec();
        args.extend([
            "--duration",
            "3",
            "--output",
            &report_arg,
            "--storage-tier",
            &adapter,
            "--storage-io",
            io,
        ]);
        let out = kvtrace_with(args, &[]);
        assert_eq!(out.status.code(), Some(0), "{io}: {}", text(&out.stderr));
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("json");
        assert_eq!(r["kvtrace"]["io_errors"], 0, "{io}: {}", r["kvtrace"]);
        assert_eq!(r["kvtrace"]["storage_io"]["mode"], io);
        let stats = &r["summary"]["cache_stats"];
        let entries = stats["storage_entries"].as_u64().expect("storage entries");
        assert!(entries > 0, "{io}: {stats}");
        assert!(
            stats["tier_storage_write_bandwidth_gbps"]
                .as_f64()
                .expect("write")
                > 0.0
        );
        // Every entry the tier holds is one object of the bucket, written whole.
        let objects = server.objects(prefix);
        assert_eq!(objects.len() as u64, entries, "{io}: {objects:?}");
        assert!(objects.iter().all(|(_, len)| *len > 0));
    }
}
