//! Asynchronous tier I/O: the same cache figures as synchronous I/O, the backend calls timed
//! per tier in every output, a refused write dropped from the accounting, and flags checked.

use calamine::{open_workbook, Data, Reader, Xlsx};

use crate::util::{kvtrace, one_line_error, sample, scratch, text};
use kvtrace::storage::config::{BackendConfig, EvictionTiming, L2Config, L2Io, StorageConfig};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::file::FsyncPolicy;
use kvtrace::storage::{KeyId, PrefetchGroup, PrefetchRequest, StorageManager};

/// Replays the bundled L2 churn recording (an fs tier under eviction pressure) into `out`
/// with `flags`; the summary.
fn replay_churn(out: &std::path::Path, flags: &[&str]) -> serde_json::Value {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/lmcache/churn/l2fs_seed5.lct");
    let tier = format!(r#"{{"type":"fs","path":"{}"}}"#, out.join("l2").display());
    let mut args = vec![
        "replay",
        trace.to_str().expect("path"),
        "-q",
        "--json",
        "--xlsx",
        "--l2-adapter",
        &tier,
        "--output-dir",
        out.to_str().expect("dir"),
    ];
    args.extend_from_slice(flags);
    let run = kvtrace(&args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let bytes = std::fs::read(out.join("trace_replay_summary.json")).expect("summary");
    serde_json::from_slice(&bytes).expect("json")
}

#[test]
fn a_replay_with_asynchronous_io_has_the_figures_of_a_synchronous_one() {
    let dir = scratch();
    let (a, b) = (dir.path().join("sync"), dir.path().join("async"));
    let sync = replay_churn(&a, &[]);
    // Two workers and a queue of two: the replay waits for room, the figures must not move.
    let flags = [
        "--l2-io",
        "asynchronous",
        "--l2-io-depth",
        "2",
        "--l2-io-workers",
        "2",
    ];
    let asynchronous = replay_churn(&b, &flags);
    for field in ["hits", "fidelity", "calls", "tiers", "requests"] {
        assert_eq!(
            asynchronous["kvtrace"][field], sync["kvtrace"][field],
            "{field}"
        );
    }
    let requests = |d: &std::path::Path| {
        std::fs::read_to_string(d.join("trace_replay_requests.csv")).expect("requests")
    };
    assert_eq!(requests(&b), requests(&a));

    let l2 = &sync["kvtrace"]["tiers"][1];
    for (doc, mode) in [(&sync, "synchronous"), (&asynchronous, "asynchronous")] {
        let io = &doc["kvtrace"]["tier_io"][0];
        assert_eq!(io["mode"], mode, "{io}");
        let calls = &io["calls"];
        assert_eq!(
            calls["writes"], l2["writes"],
            "{mode}: one call per write: {io}"
        );
        assert_eq!(calls["bytes_written"], l2["bytes_written"], "{mode}");
        assert_eq!(calls["lost_reads"], 0, "{mode}");
        assert!(calls["service_ms"]["p50_ms"].as_f64() > Some(0.0), "{io}");
        assert!(calls["schedule_lag_ms"].is_null(), "unpaced: {io}");
    }
    let io = &asynchronous["kvtrace"]["tier_io"][0];
    assert_eq!(
        (io["queue_depth"].as_u64(), io["workers"].as_u64()),
        (Some(2), Some(2))
    );
    let sync_io = &sync["kvtrace"]["tier_io"][0];
    assert_eq!(
        sync_io["calls"]["queue_wait_ms"]["max_ms"], 0.0,
        "{sync_io}"
    );
    assert!(sync_io["queue_depth"].is_null());
}

#[test]
fn the_tier_io_table_is_in_the_csv_and_the_workbook() {
    let dir = scratch();
    let out = dir.path().join("paced");
    let doc = replay_churn(
        &out,
        &[
            "--l2-io",
            "asynchronous",
            "--pace",
            "realtime",
            "--speedup",
            "50",
        ],
    );
    let csv = std::fs::read_to_string(out.join("trace_replay_tier_io.csv")).expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let row: Vec<&str> = lines.next().expect("one L2 tier").split(',').collect();
    assert!(lines.next().is_none(), "{csv}");
    let cell = |name: &str| row[header.iter().position(|&h| h == name).expect(name)];
    assert_eq!(cell("name"), "L2[0]");
    assert_eq!(cell("mode"), "asynchronous");
    assert_eq!((cell("queue_depth"), cell("workers")), ("64", "4"));
    let writes = doc["kvtrace"]["tiers"][1]["writes"].to_string();
    assert_eq!(cell("writes"), writes);
    // Paced: every call has a due time, so the lag columns are filled.
    let lag: f64 = cell("schedule_lag_p99_ms").parse().expect("a lag");
    assert!(lag >= 0.0);
    let io = &doc["kvtrace"]["tier_io"][0]["calls"];
    assert!(io["schedule_lag_ms"]["p50_ms"].is_number(), "{io}");

    let mut wb: Xlsx<_> = open_workbook(out.join("trace_replay.xlsx")).expect("xlsx");
    let sheet = wb.worksheet_range("Tier IO").expect("a Tier IO sheet");
    let rows: Vec<&[Data]> = sheet.rows().collect();
    assert_eq!(rows[0][0], Data::String("tier".into()));
    assert_eq!(rows[1][0], Data::String("L2[0]".into()));
    assert_eq!(rows[1][4].to_string(), writes, "writes, a number");
}

/// A manager with L1 of `l1` bytes and one file tier in `dir`, its calls on workers.
fn file_manager(dir: &std::path::Path, l1: u64) -> StorageManager {
    let mut config = StorageConfig {
        l1_size_bytes: l1,
        l1_align_bytes: 8,
        l2: vec![L2Config {
            backend: BackendConfig::File {
                dir: dir.to_path_buf(),
                direct: false,
                fsync: FsyncPolicy::Never,
            },
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        }],
        l2_io: L2Io::asynchronous(4, 2).expect("mode"),
        ..StorageConfig::default()
    };
    config.eviction.timing = EvictionTiming::Immediate;
    StorageManager::new(config).expect("tiers")
}

#[test]
fn a_write_the_disk_refuses_leaves_nothing_resident_and_is_counted() {
    let dir = scratch();
    let (good, bad) = (KeyId(0x1 << 124), KeyId(0x2 << 124));
    // The bad key's fan-out directory is a plain file: its object cannot be created.
    std::fs::write(dir.path().join(&bad.hex()[..2]), b"in the way").expect("blocker");
    let mut sm = file_manager(dir.path(), 1 << 20);
    let keys = [good, bad];
    assert_eq!(sm.reserve_write(&keys, 1000).reserved.len(), 2);
    assert_eq!(sm.finish_write(&keys).expect("queued, not failed").len(), 2);
    sm.drain_io();
    let tier = &sm.tier_stats()[1];
    assert_eq!((tier.writes, tier.write_errors), (2, 1), "{tier:?}");
    assert_eq!(
        tier.resident_objects, 1,
        "only the stored object is resident"
    );
    let io = &sm.tier_io()[0].calls;
    assert_eq!(io.bytes_written, 1000, "{io:?}");
    assert!(
        io.first_error.as_deref().is_some_and(|e| !e.contains('\n')),
        "{io:?}"
    );

    // Without L1, a prefetch finds the good object in L2 and not the refused one.
    sm.clear();
    let group = PrefetchGroup {
        keys: keys.to_vec(),
        object_bytes: 1000,
        chunk_tokens: None,
        window: -1,
    };
    let request = PrefetchRequest {
        groups: std::slice::from_ref(&group),
        prefix_only: false,
        readers: 1,
        lock: true,
        skip_l2: false,
    };
    let outcome = sm.submit_prefetch(&request, "r").expect("prefetch");
    assert_eq!((outcome.hit_chunks, outcome.l2_hit_chunks), (1, 1));
    sm.drain_io();
    assert_eq!(sm.tier_io()[0].calls.lost_reads, 0);
}

#[test]
fn io_flags_are_checked_in_one_line() {
    let trace = sample("basic_lru").display().to_string();
    let dir = scratch();
    let out = dir.path().to_str().expect("dir");
    for (flags, says) in [
        (
            vec!["--l2-io", "synchronous", "--l2-io-depth", "4"],
            "apply to --l2-io asynchronous",
        ),
        (vec!["--l2-io-depth", "0"], "queue depth 0"),
        (vec!["--l2-io-workers", "300"], "workers"),
        // The L1's lock TTLs are durations (a negative or NaN one was taken as it came).
        (
            vec!["--l1-read-ttl-seconds=-5"],
            "--l1-read-ttl-seconds -5: expected seconds >= 0",
        ),
        (
            vec!["--l1-write-ttl-seconds", "NaN"],
            "--l1-write-ttl-seconds NaN",
        ),
    ] {
        let mut args = vec!["replay", &trace, "-q", "--output-dir", out];
        args.extend_from_slice(&flags);
        let e = one_line_error(&kvtrace(&args), 2);
        assert!(e.contains(says), "{flags:?}: {e}");
    }
    let run = kvtrace([
        "simulate",
        "--input-tokens",
        "100",
        "--output-tokens",
        "10",
        "--request-count",
        "2",
        "--l1-size-gb",
        "1",
        "--l2-io",
        "asynchronous",
    ]);
    let e = one_line_error(&run, 2);
    assert!(
        e.contains("asynchronous L2 I/O is for replay and bench"),
        "{e}"
    );
}
