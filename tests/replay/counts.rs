//! Replay: LMCache's replayed/skipped/failed counts, the client's hits, the digest check,
//! determinism, eviction and L2 behaviour, and record → replay round trips.

use std::path::Path;

use crate::util::{sample, sample_text, scratch, shared};
use kvtrace::bus::recorder::{Recorder, RecorderOptions};
use kvtrace::bus::{BusOptions, EventBus};
use kvtrace::replay::report::ReplayReport;
use kvtrace::replay::{replay, ReplayOptions};
use kvtrace::storage::config::{
    BackendConfig, EvictionTiming, L2Config, L2Io, PrefetchPolicy, StorageConfig, StorePolicy,
};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::StorageManager;
use kvtrace::trace::synth::{self, SynthOptions};

fn run(path: &Path, config: StorageConfig) -> ReplayReport {
    let mut sm = StorageManager::new(config).expect("manager");
    replay(path, &mut sm, &ReplayOptions::default(), |_| {}).expect("replay")
}

fn recorded_config(path: &Path) -> StorageConfig {
    let reader = kvtrace::lmct::TraceReader::open(path, Default::default()).expect("open");
    StorageConfig::from_lmcache_json(&reader.header().sm_config_json)
        .expect("LMCache config")
        .0
}

#[test]
fn replayed_skipped_failed_match_lmcache_replay() {
    // From LMCache 0.5.6's `trace replay` of the same files (shared/lmcache/replay/*/stdout.txt).
    for (name, want) in [
        ("basic_lru", (41, 0, 0)),
        ("empty_arc", (0, 0, 0)),
        ("unknown_qualname", (2, 2, 0)),
    ] {
        let r = run(&sample(name), recorded_config(&sample(name)));
        assert_eq!((r.replayed, r.skipped, r.failed), want, "{name}");
    }
    let Some(shared) = shared() else { return };
    for (name, dir) in [
        ("basic_lru", "basic"),
        ("empty_arc", "empty"),
        ("unknown_qualname", "unknown"),
    ] {
        let stdout =
            std::fs::read_to_string(shared.join(format!("lmcache/replay/{dir}/stdout.txt")))
                .expect("stdout");
        let field = |label: &str| -> u64 {
            let line = stdout.lines().find(|l| l.starts_with(label)).expect(label);
            line.split_whitespace()
                .last()
                .expect("n")
                .parse()
                .expect("int")
        };
        let r = run(&sample(name), recorded_config(&sample(name)));
        assert_eq!(r.replayed, field("Records replayed:"), "{name}");
        assert_eq!(r.skipped, field("Records skipped:"), "{name}");
        assert_eq!(r.failed, field("Records failed:"), "{name}");
    }
}

#[test]
fn the_recorded_config_reproduces_the_hits_the_client_saw() {
    let r = run(&sample("basic_lru"), recorded_config(&sample("basic_lru")));
    let client: Vec<(u64, u64)> = sample_text("basic_lru.client.txt")
        .lines()
        .filter_map(|l| l.strip_prefix("CLIENT retrieve "))
        .map(|l| {
            let mut n = l.split_whitespace().map(|x| x.parse::<u64>().expect("n"));
            (n.next().expect("req"), n.next().expect("hit"))
        })
        .collect();
    let ours: Vec<(u64, u64)> = r
        .requests
        .iter()
        .map(|q| (q.requested_chunks, q.hit_chunks))
        .collect();
    assert_eq!(ours, client);
    assert_eq!(r.hits.requested_tokens, 41 * 64);
    assert_eq!(r.hits.hit_tokens, 27 * 64);
    assert_eq!(r.hits.l2_hit_chunks, 0);
    assert_eq!((r.calls.keys_reserved, r.calls.keys_not_writable), (13, 6));
    assert_eq!(r.failed, 0);
}

#[test]
fn digest_check_matches_the_recording_and_names_what_differs() {
    let r = run(&sample("basic_lru"), recorded_config(&sample("basic_lru")));
    assert_eq!(r.digest.result, "match");
    assert_eq!(r.digest.run, r.digest.recorded);
    let mut smaller = recorded_config(&sample("basic_lru"));
    smaller.l1_size_bytes /= 2;
    smaller.eviction.policy = PolicyKind::Arc;
    let r = run(&sample("basic_lru"), smaller);
    assert_eq!(r.digest.result, "MISMATCH");
    assert!(r
        .digest
        .differing_paths
        .contains(&"$.l1_manager_config.memory_config.size_in_bytes".to_string()));
    assert!(r
        .digest
        .differing_paths
        .contains(&"$.eviction_config.eviction_policy".to_string()));
}

fn generated(dir: &Path, records: u64) -> std::path::PathBuf {
    let path = dir.join("gen.lct");
    let options = SynthOptions {
        records,
        chunk_tokens: 16,
        num_layers: 2,
        hidden: 64,
        mean_gap_s: 0.01,
        ..SynthOptions::default()
    };
    synth::write_file(&options, &path, None, kvtrace::trace::QUIET).expect("generate");
    path
}

fn small(policy: PolicyKind, timing: EvictionTiming) -> StorageConfig {
    let mut c = StorageConfig {
        l1_size_bytes: 600 * 8192,
        ..StorageConfig::default()
    };
    c.eviction.policy = policy;
    c.eviction.timing = timing;
    c
}

#[test]
fn as_fast_as_possible_is_deterministic() {
    let dir = scratch();
    let path = generated(dir.path(), 20_000);
    let config = small(
        PolicyKind::Arc,
        EvictionTiming::Periodic {
            interval_s: 1.0,
            phase_s: 0.0,
        },
    );
    let a = run(&path, config.clone());
    let b = run(&path, config);
    assert_eq!(a.requests, b.requests);
    assert_eq!(a.calls, b.calls);
    assert_eq!(a.tiers, b.tiers);
    assert!(a.tiers[0].evictions > 0, "the small L1 must evict");
}

#[test]
fn periodic_eviction_runs_out_of_memory_in_bursts_and_immediate_does_not() {
    let dir = scratch();
    let path = generated(dir.path(), 20_000);
    let periodic = run(
        &path,
        small(
            PolicyKind::Lru,
            EvictionTiming::Periodic {
                interval_s: 1.0,
                phase_s: 0.0,
            },
        ),
    );
    let immediate = run(&path, small(PolicyKind::Lru, EvictionTiming::Immediate));
    assert!(periodic.calls.out_of_memory_calls > 0);
    assert_eq!(immediate.calls.out_of_memory_calls, 0);
    let noop = run(&path, small(PolicyKind::Noop, EvictionTiming::Immediate));
    assert_eq!(noop.tiers[0].evictions, 0);
    assert!(noop.calls.out_of_memory_calls > 0);
}

#[test]
fn every_policy_evicts_differently() {
    let dir = scratch();
    let path = generated(dir.path(), 20_000);
    let mut hits = Vec::new();
    for policy in [
        PolicyKind::Lru,
        PolicyKind::Arc,
        PolicyKind::Fifo,
        PolicyKind::Lfu,
    ] {
        let r = run(&path, small(policy, EvictionTiming::Immediate));
        // The generated reads assume an unbounded cache, so a small L1 misses some of them:
        // misses, not failed calls.
        assert_eq!(r.failed, 0);
        assert!(r.tiers[0].evictions > 0, "{policy}");
        hits.push(r.hits.hit_chunks);
    }
    hits.sort_unstable();
    hits.dedup();
    assert!(
        hits.len() >= 3,
        "policies should not all behave alike: {hits:?}"
    );
}

#[test]
fn write_through_l2_serves_what_l1_evicted() {
    let dir = scratch();
    let path = generated(dir.path(), 20_000);
    let base = small(PolicyKind::Lru, EvictionTiming::Immediate);
    let l1_only = run(&path, base.clone());
    let with_l2 = StorageConfig {
        l2: vec![L2Config {
            backend: BackendConfig::Memory { buffers: false },
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        }],
        ..base.clone()
    };
    let r = run(&path, with_l2.clone());
    assert!(r.hits.l2_hit_chunks > 0);
    assert!(r.hits.hit_chunks > l1_only.hits.hit_chunks);
    assert_eq!(
        r.tiers[1].bytes_written + r.tiers[1].bytes_read,
        r.tiers[0].bytes_written,
        "write-through: L1 writes are admissions plus loads from L2"
    );
    assert_eq!(
        r.hits.hit_chunks,
        r.hits.l1_hit_chunks + r.hits.l2_hit_chunks
    );

    let retain = run(
        &path,
        StorageConfig {
            prefetch_policy: PrefetchPolicy::Retain,
            ..with_l2.clone()
        },
    );
    assert!(
        retain.hits.l1_hit_chunks > r.hits.l1_hit_chunks,
        "retained loads hit L1 later"
    );
    let skip = run(
        &path,
        StorageConfig {
            store_policy: StorePolicy::SkipL1,
            ..with_l2
        },
    );
    assert_eq!(
        skip.hits.l1_hit_chunks, 0,
        "skip_l1 keeps nothing in L1 after the store"
    );
    assert!(skip.hits.l2_hit_chunks > 0);

    let null_l2 = run(
        &path,
        StorageConfig {
            l2: vec![L2Config {
                backend: BackendConfig::Null,
                capacity_bytes: None,
                policy: PolicyKind::Lru,
            }],
            ..base
        },
    );
    assert_eq!(null_l2.hits.l2_hit_chunks, 0);
    assert!(null_l2.tiers[1].bytes_written > 0);
}

#[test]
fn a_kvtrace_driven_manager_records_a_trace_that_replays_to_the_same_counters() {
    let dir = scratch();
    let source = generated(dir.path(), 5_000);
    let recorded = dir.path().join("recorded.lct");
    let config = small(PolicyKind::Lru, EvictionTiming::Immediate);
    let mut recorder = Recorder::create(&recorded, RecorderOptions::default()).expect("recorder");
    let json = kvtrace::lmct::digest::python_json(&config.to_lmcache_json());
    recorder.attach_storage_config(&json).expect("attach");
    let bus = EventBus::start(BusOptions::default(), vec![Box::new(recorder)]).expect("bus");
    let mut sm = StorageManager::new(config.clone()).expect("manager");
    let options = ReplayOptions {
        tracer: bus.tracer(),
        ..ReplayOptions::default()
    };
    let first = replay(&source, &mut sm, &options, |_| {}).expect("drive");
    drop(options);
    drop(sm);
    bus.close().expect("close");

    let second = run(&recorded, recorded_config(&recorded));
    assert_eq!(second.digest.result, "match");
    assert_eq!(second.requests.len(), first.requests.len());
    let hits = |r: &ReplayReport| r.requests.iter().map(|q| q.hit_chunks).collect::<Vec<_>>();
    assert_eq!(hits(&first), hits(&second));
    assert_eq!(first.calls, second.calls);
    assert_eq!(
        second.skip_reasons.get("kvtrace recorder trailer"),
        Some(&1)
    );
    // The recording has the source's calls, the exits the replayer closed for contexts the
    // source left open, and the trailer.
    let info =
        kvtrace::trace::inspect::inspect(&recorded, Default::default(), kvtrace::trace::QUIET)
            .expect("info");
    assert_eq!(info.total_records, 5_000 + first.forced_exits + 1);
}

/// A timed replay gives each kind of call a histogram of its latencies, one sample a call;
/// an untimed one (a sweep's or a planner's) gives none, and the same hits.
#[test]
fn only_a_timed_replay_keeps_latency_histograms() {
    let path = sample("basic_lru");
    let replay_with = |time_calls: bool| {
        let mut sm = StorageManager::new(recorded_config(&path)).expect("manager");
        let options = ReplayOptions {
            time_calls,
            ..ReplayOptions::default()
        };
        replay(&path, &mut sm, &options, |_| {}).expect("replay")
    };
    let (timed, untimed) = (replay_with(true), replay_with(false));
    let kinds: Vec<&String> = timed.latency_histograms.keys().collect();
    assert_eq!(kinds, timed.ops.keys().collect::<Vec<_>>());
    for (kind, text) in &timed.latency_histograms {
        let h = kvtrace::report::histogram::LatencyHistogram::decode(text).expect("decodes");
        assert_eq!(h.count(), timed.ops[kind].count, "{kind}");
    }
    assert!(untimed.latency_histograms.is_empty());
    assert_eq!(untimed.ops.len(), timed.ops.len());
    assert_eq!(untimed.hits, timed.hits);
}

#[test]
fn a_read_of_what_the_replay_did_not_keep_is_a_miss_not_a_failure() {
    let dir = scratch();
    let path = generated(dir.path(), 2_000);
    // No L1 room at all: every prefetch misses, so recorded reads find nothing.
    let r = run(
        &path,
        StorageConfig {
            l1_size_bytes: 0,
            ..StorageConfig::default()
        },
    );
    assert_eq!(
        r.failed, 0,
        "LMCache's read yields nothing and does not raise"
    );
    assert!(r.calls.read_failures > 0);
    let enter = &r.ops
        ["lmcache.v1.distributed.storage_manager.StorageManager.read_prefetched_results.__enter__"];
    assert_eq!(enter.errors, 0);
    let f = &r.fidelity;
    assert_eq!(f.replayed_hit_chunks, 0);
    assert!(f.recorded_hit_chunks > 0 && f.divergences > 0);
    let d = f
        .first_divergences
        .iter()
        .find(|d| d.kind == "retrieve")
        .expect("a retrieve diverges");
    assert!(d.recorded > d.replayed);
    assert!(d.reason.starts_with("allocation refused"), "{}", d.reason);
}

/// The manual's `--config` example, as a user pastes it (the block's two-space indent
/// removed), is a hierarchy kvtrace accepts, with every table and key it shows.
#[test]
fn the_manuals_config_example_parses_as_pasted() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/commands/replay.md"),
    )
    .expect("docs/commands/replay.md");
    let block = page
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a toml block");
    let pasted: String = block
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut config = StorageConfig::default();
    config.apply_toml(&pasted).expect("the example parses");
    assert_eq!(config.l2.len(), 4, "{pasted}");
    assert_eq!(
        config.l2_io,
        L2Io::Asynchronous {
            depth: 64,
            workers: 4
        }
    );
    // A depth below the default workers takes that many, as --l2-io-depth does.
    let mut shallow = StorageConfig::default();
    shallow
        .apply_toml("[l2_io]\ndepth = 2\n")
        .expect("a shallow queue");
    assert_eq!(
        shallow.l2_io,
        L2Io::Asynchronous {
            depth: 2,
            workers: 2
        }
    );
    for (bad, says) in [
        (
            "[l2_io]\nmode = \"sometimes\"\n",
            "l2_io.mode \"sometimes\"",
        ),
        ("[l2_io]\ndepth = 0\n", "l2_io: queue depth 0"),
        (
            "[l2_io]\ndepth = 2\nworkers = 3\n",
            "at most the queue depth (2)",
        ),
        ("[l2_io]\nqueue = 2\n", "unknown field `queue`"),
        (
            "[l1]\nread_ttl_s = -5\n",
            "l1.read_ttl_s -5: expected seconds >= 0",
        ),
        ("[l1]\nwrite_ttl_s = inf\n", "l1.write_ttl_s inf"),
    ] {
        let e = StorageConfig::default().apply_toml(bad).expect_err(bad);
        assert!(e.contains(says), "{bad}: {e}");
    }
    // A header's lock TTL that is no duration keeps the default, and says so.
    let header = r#"{"l1_manager_config": {"memory_config": {"size_in_bytes": 1048576},
        "read_ttl_seconds": -1, "write_ttl_seconds": 7},
        "eviction_config": {"eviction_policy": "LRU"}}"#;
    let (config, notes) = StorageConfig::read_lmcache_json(header).expect("a header");
    assert_eq!(config.read_ttl_s, StorageConfig::default().read_ttl_s);
    assert_eq!(config.write_ttl_s, 7.0);
    assert!(
        notes.iter().any(|n| n.contains("read_ttl_seconds -1")),
        "{notes:?}"
    );
}

/// A plan decodes the head of a trace to infer its client and estimate its phase, then
/// replays that head from memory and reads the file on after it. Over a trace longer than
/// the head, with an undecodable frame inside the head and one after it and a cut tail,
/// that replay is the one that reads the whole file (the client given, so no head is
/// decoded): the same requests, divergences, counts and warnings.
#[test]
fn a_replay_after_the_decoded_head_is_the_whole_read() {
    let dir = scratch();
    let whole = generated(dir.path(), 30_000);
    let mut bytes = std::fs::read(&whole).expect("read");
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() {
        frames.push(at);
        at += 4 + u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
    }
    assert!(frames.len() > 2 * kvtrace::replay::phase::ESTIMATE_RECORDS);
    for frame in [frames[3], frames[25_000]] {
        bytes[frame + 4..frame + 12].fill(0xc1);
    }
    bytes.truncate(bytes.len() - 100);
    let trace = dir.path().join("damaged.lct");
    std::fs::write(&trace, &bytes).expect("write");
    let replay = |out: &str, extra: &[&str]| {
        let out = dir.path().join(out);
        let mut args = vec![
            "replay".to_owned(),
            trace.display().to_string(),
            "--output-dir".to_owned(),
            out.display().to_string(),
            "--json".to_owned(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let run = crate::util::kvtrace(&args);
        assert_eq!(
            run.status.code(),
            Some(0),
            "{}",
            crate::util::text(&run.stderr)
        );
        let summary: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join("trace_replay_summary.json")).expect("summary"),
        )
        .expect("JSON");
        let csv = |name: &str| std::fs::read_to_string(out.join(name)).expect(name);
        (
            summary["kvtrace"].clone(),
            csv("trace_replay_requests.csv"),
            csv("trace_replay_divergences.csv"),
        )
    };
    let (after_head, requests, divergences) = replay("after-head", &[]);
    assert_eq!(after_head["client"]["source"], "inferred");
    let model = after_head["client"]["model"]
        .as_str()
        .expect("model")
        .to_owned();
    let (whole_read, whole_requests, whole_divergences) =
        replay("whole", &["--client", &model, "--eviction-phase", "0"]);
    assert_eq!(whole_read["client"]["source"], "given");
    assert_eq!(requests, whole_requests);
    assert_eq!(divergences, whole_divergences);
    for field in [
        "records",
        "replayed",
        "skipped",
        "failed",
        "warnings",
        "hits",
        "calls",
        "tiers",
        "fidelity",
        "completions",
    ] {
        assert_eq!(after_head[field], whole_read[field], "{field}");
    }
    let warnings = after_head["warnings"].to_string();
    assert_eq!(warnings.matches("skipped undecodable record").count(), 2);
    assert!(warnings.contains("truncated frame"), "{warnings}");
}
