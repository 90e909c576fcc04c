//! The real LMCache 0.5.6 files: counts as LMCache's own `trace info` printed them, byte-exact
//! re-encoding, digest reproduction, truncation, and the golden decodes in ../shared.

use std::collections::BTreeMap;

use crate::util::{kvtrace, sample, sample_text, scratch, shared, SAMPLES};
use kvtrace::lmct::digest::{config_digest, python_json};
use kvtrace::lmct::json::to_lossless;
use kvtrace::lmct::msgpack::{encode_to_vec, RawValue};
use kvtrace::lmct::{Frame, Header, ReadOptions, TraceReader};
use kvtrace::trace::inspect::inspect;
use kvtrace::trace::QUIET;

/// What LMCache's `trace info` printed: total, per-qualname counts, duration, digest.
struct LmcacheInfo {
    total: u64,
    ops: BTreeMap<String, u64>,
    duration: String,
    digest: String,
}

fn parse_info(text: &str) -> LmcacheInfo {
    let mut info = LmcacheInfo {
        total: 0,
        ops: BTreeMap::new(),
        duration: String::new(),
        digest: String::new(),
    };
    let mut in_ops = false;
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("total_records:") {
            info.total = v.trim().parse().expect("total");
        } else if let Some(v) = t.strip_prefix("duration:") {
            info.duration = v.trim().to_string();
        } else if let Some(v) = t.strip_prefix("sm_config_digest:") {
            info.digest = v.trim().to_string();
        } else if t.starts_with("ops:") {
            in_ops = true;
        } else if in_ops {
            let (q, n) = t.rsplit_once(": ").expect("op line");
            info.ops.insert(q.to_string(), n.parse().expect("count"));
        }
    }
    info
}

#[test]
fn counts_match_lmcache_trace_info() {
    for name in SAMPLES {
        let expected = parse_info(&sample_text(&format!("{name}.info.txt")));
        let info = inspect(&sample(name), ReadOptions::default(), QUIET).expect(name);
        assert_eq!(info.total_records, expected.total, "{name} total");
        assert_eq!(info.ops, expected.ops, "{name} ops");
        assert_eq!(
            format!("{:.3}s", info.duration_s),
            expected.duration,
            "{name} duration"
        );
        assert_eq!(info.sm_config_digest, expected.digest, "{name} digest");
        assert!(
            info.digest_verified && info.config_canonical,
            "{name} digest check"
        );
        assert_eq!(info.schema_variant, "1 (LMCache 0.5.6)");
    }
}

#[test]
fn every_frame_reencodes_to_the_original_bytes() {
    for name in SAMPLES {
        let bytes = std::fs::read(sample(name)).expect("read");
        let mut reader = TraceReader::open(&sample(name), ReadOptions::default()).expect(name);
        // Typed header through the writer's encoder.
        let mut header = Vec::new();
        reader.header().encode(&mut header);
        assert_eq!(header, reader.header_body(), "{name} header");
        assert_eq!(&bytes[4..4 + header.len()], &header[..]);
        let mut frames = 1;
        while let Some(frame) = reader.next_frame().expect("frame") {
            let Frame::Record(r) = frame else {
                panic!("{name}: undecodable frame")
            };
            // Typed record and the generic value tree both give the original bytes.
            let mut typed = Vec::new();
            r.to_record().encode(&mut typed);
            assert_eq!(typed, r.body, "{name} record at {}", r.offset);
            let generic = encode_to_vec(&RawValue::parse(r.body).expect("valid").to_value());
            assert_eq!(generic, r.body, "{name} generic at {}", r.offset);
            let start = r.offset as usize + 4;
            assert_eq!(&bytes[start..start + r.body.len()], r.body);
            frames += 1;
        }
        assert!(frames > 0);
    }
}

#[test]
fn config_digest_is_reproduced_from_the_json() {
    for name in SAMPLES {
        let reader = TraceReader::open(&sample(name), ReadOptions::default()).expect(name);
        let h: &Header = reader.header();
        assert_eq!(
            config_digest(&h.sm_config_json),
            h.sm_config_digest,
            "{name}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&h.sm_config_json).expect("json");
        assert_eq!(
            python_json(&parsed),
            h.sm_config_json,
            "{name} canonical text"
        );
    }
}

#[test]
fn truncated_file_keeps_forty_records_and_names_the_offset() {
    let mut reader =
        TraceReader::open(&sample("basic_lru.truncated"), ReadOptions::default()).expect("open");
    let mut n = 0;
    while reader.next_record().expect("record").is_some() {
        n += 1;
    }
    assert_eq!(n, 40);
    let t = reader.summary().truncation.clone().expect("truncation");
    assert_eq!((t.offset, t.declared, t.available), (29472, Some(400), 300));
    // LMCache reports the body offset: "truncated frame body at offset 29476 (got 300 of 400)".
    assert!(t.to_string().contains("body starts at byte 29476"));
    assert_eq!(t.bytes.len(), 304);
}

#[test]
fn header_only_file_has_no_records() {
    let mut reader = TraceReader::open(&sample("empty_arc"), ReadOptions::default()).expect("open");
    assert!(reader.next_record().expect("eof").is_none());
    assert_eq!(reader.header().level, "storage");
    assert!(reader.summary().truncation.is_none());
    assert_eq!(
        std::fs::metadata(sample("empty_arc")).expect("meta").len(),
        1504
    );
}

#[test]
fn unknown_qualnames_are_read_and_counted() {
    let info = inspect(&sample("unknown_qualname"), ReadOptions::default(), QUIET).expect("info");
    assert_eq!(info.ops["mq.lookup"], 1);
    assert_eq!(
        info.ops["lmcache.v1.distributed.storage_manager.StorageManager.touch_cached_keys"],
        1
    );
}

#[test]
fn basic_lru_implied_bytes_follow_the_client_log() {
    // 14 distinct chunks of [2, 4, 64, 128] bf16 = 131072 bytes each (13 from the four
    // conversations, one more from the final prefix-only retrieve).
    let info = inspect(&sample("basic_lru"), ReadOptions::default(), QUIET).expect("info");
    assert_eq!(info.distinct_keys, 14);
    assert_eq!(info.payload.object_sizes, vec![131072]);
    assert_eq!(info.payload.chunk_tokens, Some(64));
    // The client stored 4+5+6+4 chunks, of which 13 were new: 13 finished writes.
    assert_eq!(info.payload.written, 13 * 131072);
    // Every retrieved chunk in run_logs/basic_lru.client.txt was read once: 27 chunks.
    let retrieved: u64 = sample_text("basic_lru.client.txt")
        .lines()
        .filter_map(|l| l.strip_prefix("CLIENT retrieve "))
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .expect("hits")
                .parse::<u64>()
                .expect("n")
        })
        .sum();
    assert_eq!(info.payload.read, retrieved * 131072);
    assert!((info.startup_gap_s.expect("gap") - 3.846).abs() < 1e-3);
}

#[test]
fn lossless_json_equals_the_independent_golden_decode() {
    let Some(shared) = shared() else { return };
    for name in SAMPLES {
        let golden: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(shared.join(format!("lmcache/decoded/{name}.json")))
                .expect("golden"),
        )
        .expect("json");
        let frames = golden["frames"].as_array().expect("frames");
        let mut reader = TraceReader::open(&sample(name), ReadOptions::default()).expect(name);
        let header = RawValue::parse(reader.header_body())
            .expect("header")
            .to_value();
        assert_eq!(to_lossless(&header), frames[0]["value"], "{name} header");
        let mut i = 1;
        while let Some(r) = reader.next_record().expect("record") {
            assert_eq!(
                frames[i]["offset"].as_u64(),
                Some(r.offset),
                "{name} offset"
            );
            let value = RawValue::parse(r.body).expect("valid").to_value();
            assert_eq!(to_lossless(&value), frames[i]["value"], "{name} frame {i}");
            i += 1;
        }
        assert_eq!(i, frames.len(), "{name} frame count");
    }
}

#[test]
fn repository_samples_are_the_shared_ones() {
    let Some(shared) = shared() else { return };
    for name in SAMPLES {
        let ours = std::fs::read(sample(name)).expect("ours");
        let theirs = std::fs::read(shared.join(format!("lmcache/{name}.lct"))).expect("shared");
        assert_eq!(ours, theirs, "{name}");
    }
}

/// An events-level recording: `kvtrace info` prints LMCache's own summary of it — header,
/// ops and the `events:` block (instances and incarnations, batches by type/tier/backend/
/// scope, entries, store bytes, lifecycle) — line for line, with one thread or several.
#[test]
fn events_info_is_lmcache_s_summary_line_for_line() {
    let Some(shared) = shared() else { return };
    let dir = shared.join("lmcache");
    let expected = std::fs::read_to_string(dir.join("events_churn.info.txt")).expect("info");
    for threads in [1, 3] {
        let options = ReadOptions {
            threads,
            ..ReadOptions::default()
        };
        let info = inspect(&dir.join("events_churn.lct"), options, QUIET).expect("inspect");
        let text = info.render();
        let (lmcache, ours) = text.split_once("  kvtrace:\n").expect("kvtrace block");
        let (_, lmcache) = lmcache.split_once('\n').expect("file line");
        let (_, expected) = expected.split_once('\n').expect("file line");
        assert_eq!(lmcache, expected, "{threads} thread(s)");
        assert!(ours.contains("store bytes l1:"), "{ours}");
        let events = info.events.expect("events summary");
        assert_eq!(events.store_bytes, 7_602_176);
        assert_eq!(events.store_bytes_per_tier["l1"], events.store_bytes);
    }
}

/// An events-level recording converts to JSON lines and back, and through zstd, byte for
/// byte.
#[test]
fn events_traces_convert_byte_for_byte() {
    let Some(shared) = shared() else { return };
    let original = shared.join("lmcache/events_churn.lct");
    let dir = scratch();
    for via in ["events.jsonl", "events.lct.zst"] {
        let (mid, back) = (dir.path().join(via), dir.path().join(format!("{via}.lct")));
        for (from, to) in [(&original, &mid), (&mid, &back)] {
            let out = kvtrace([
                "convert",
                from.to_str().expect("path"),
                to.to_str().expect("path"),
            ]);
            assert!(out.status.success(), "{via}: {:?}", out);
        }
        assert_eq!(
            std::fs::read(&back).expect("back"),
            std::fs::read(&original).expect("original"),
            "{via}"
        );
    }
}

/// Two servers' events traces merge by wall clock into one fleet summary. The second server
/// is the recorded one under another id, a quarter second later: each server's figures are
/// the recording's (computed independently from its dump: 302 of 580 accesses found their
/// key resident, L1 peaked at 4 MiB), the fleet's are their sums, and the merged stream
/// spans both.
#[test]
fn two_events_traces_merge_into_one_fleet_summary() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let original = shared.join("lmcache/events_churn.lct");
    let second = second_server(&original, dir.path());
    let info = |files: &[&std::path::Path]| -> serde_json::Value {
        let mut args = vec!["info", "--json", "--fleet"];
        args.extend(files.iter().map(|f| f.to_str().expect("path")));
        let out = kvtrace(args);
        assert!(out.status.success(), "{out:?}");
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        all.as_array().expect("array").last().expect("fleet")["fleet"].clone()
    };
    let one = info(&[&original]);
    let n = |v: &serde_json::Value, path: &str| -> u64 {
        path.split('.')
            .fold(v, |v, k| &v[k])
            .as_u64()
            .unwrap_or_else(|| panic!("{path}"))
    };
    assert_eq!(n(&one, "fleet.accesses"), 580);
    assert_eq!(n(&one, "fleet.access_hits"), 302);
    assert_eq!(n(&one, "fleet.stores"), 58);
    assert_eq!(n(&one, "fleet.peak_bytes_per_tier.l1"), 4_194_304);
    assert_eq!(n(&one, "fleet.store_bytes_per_tier.l1"), 7_602_176);
    assert_eq!(
        n(&one, "fleet.resident_bytes_per_tier.l1"),
        0,
        "a stop mark empties the server's tiers"
    );

    let both = info(&[&original, &second]);
    assert_eq!(n(&both, "records"), 2 * n(&one, "records"));
    let duration = both["duration_s"].as_f64().expect("duration");
    assert!((duration - one["duration_s"].as_f64().expect("duration") - 0.25).abs() < 1e-6);
    let instances = both["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 2);
    assert_eq!(instances[0][0], RECORDED_ID);
    assert_eq!(instances[1][0], "second-server");
    for (_, per) in instances.iter().map(|i| (&i[0], &i[1])) {
        assert_eq!(per, &one["fleet"], "each server alone is the recording");
    }
    for key in [
        "accesses",
        "access_hits",
        "stores",
        "store_bytes_per_tier.l1",
    ] {
        assert_eq!(
            n(&both, &format!("fleet.{key}")),
            2 * n(&one, &format!("fleet.{key}")),
            "{key}"
        );
    }
    let peak = n(&both, "fleet.peak_bytes_per_tier.l1");
    assert!(peak > 4_194_304 && peak <= 2 * 4_194_304, "{peak}");
    let occupancy = both["occupancy"].as_array().expect("occupancy");
    assert_eq!(occupancy.len(), 21);
    assert!(occupancy
        .iter()
        .any(|o| o["bytes_per_tier"]["l1"].as_u64().unwrap_or(0) > 4_194_304));

    let out = kvtrace([
        "info",
        original.to_str().expect("path"),
        second.to_str().expect("path"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Fleet: 2 events traces merged by wall clock"),
        "{text}"
    );
    assert!(text.contains("hit ratio 0.5207"), "{text}");

    // A file that cannot be read is reported, and the others still make the fleet.
    let missing = dir.path().join("missing.lct");
    let out = kvtrace([
        "info",
        missing.to_str().expect("path"),
        original.to_str().expect("path"),
        second.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Fleet: 2 events traces merged by wall clock"),
        "{text}"
    );
}

/// The instance id of the server that recorded `events_churn.lct`.
const RECORDED_ID: &str = "c7a60394-2eac-4335-9739-8937f231c47a";

/// A second server for a fleet: `original` under the id `second-server`, its wall clock a
/// quarter second later, written into `dir`.
fn second_server(original: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
    let jsonl = dir.join("a.jsonl");
    let out = kvtrace([
        "convert",
        original.to_str().expect("path"),
        jsonl.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let shifted: Vec<String> = std::fs::read_to_string(&jsonl)
        .expect("jsonl")
        .replace(RECORDED_ID, "second-server")
        .lines()
        .map(|line| {
            let mut v: serde_json::Value = serde_json::from_str(line).expect("line");
            if let Some(t) = v.get("t_wall").and_then(|t| t.as_f64()) {
                v["t_wall"] = serde_json::json!(t + 0.25);
            }
            v.to_string()
        })
        .collect();
    let second_jsonl = dir.join("b.jsonl");
    std::fs::write(&second_jsonl, shifted.join("\n") + "\n").expect("write");
    let second = dir.join("b.lct");
    let out = kvtrace([
        "convert",
        second_jsonl.to_str().expect("path"),
        second.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{out:?}");
    second
}

/// An events trace replays against a tier configuration: with the recorded one, the share
/// of accesses that hit is the recording's within 1 % and L1 evicts what the recording
/// deleted; a larger L1 hits more and evicts nothing; a smaller one hits less, and an L2
/// behind it serves some of what L1 lost. Two servers replay on a manager each, and the run
/// is deterministic.
#[test]
fn an_events_trace_replays_against_a_tier_configuration() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let original = shared.join("lmcache/events_churn.lct");
    let second = second_server(&original, dir.path());
    let replay = |name: &str, files: &[&std::path::Path], flags: &[&str]| -> serde_json::Value {
        let out_dir = dir.path().join(name);
        let mut args = vec!["replay".to_owned()];
        args.extend(files.iter().map(|f| f.to_str().expect("path").to_owned()));
        args.extend(["-q", "--json", "--output-dir"].map(String::from));
        args.push(out_dir.to_str().expect("path").to_owned());
        args.extend(flags.iter().map(|f| f.to_string()));
        let out = kvtrace(&args);
        assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
        assert!(out_dir.join("events_replay_servers.csv").is_file());
        let text =
            std::fs::read_to_string(out_dir.join("events_replay_summary.json")).expect("summary");
        let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["duration_s"] = serde_json::Value::Null;
        v["fleet"].clone()
    };
    let n = |v: &serde_json::Value, key: &str| v[key].as_u64().unwrap_or_else(|| panic!("{key}"));
    let recorded = replay("recorded", &[&original], &[]);
    assert_eq!(n(&recorded, "lookups"), 580);
    assert_eq!(n(&recorded, "recorded_hits"), 302);
    assert!(n(&recorded, "hits").abs_diff(302) <= 5, "{recorded}");
    assert_eq!(n(&recorded, "evictions"), n(&recorded, "recorded_deletes"));
    assert_eq!(
        recorded,
        replay("again", &[&original], &[]),
        "deterministic"
    );

    let large = replay("large", &[&original], &["--l1-size-gb", "1"]);
    assert!(n(&large, "hits") >= n(&recorded, "hits"));
    assert_eq!(n(&large, "evictions"), 0);
    let small = replay("small", &[&original], &["--l1-size-gb", "0.002"]);
    assert!(n(&small, "hits") < n(&recorded, "hits"), "{small}");
    let backed = replay(
        "backed",
        &[&original],
        &[
            "--l1-size-gb",
            "0.002",
            "--l2-adapter",
            r#"{"type":"memory"}"#,
        ],
    );
    assert!(n(&backed, "l2_hits") > 0, "{backed}");
    assert!(
        n(&backed, "evictions") > n(&small, "evictions"),
        "a load from L2 takes its stored size in L1: {backed}"
    );

    let fleet = replay("fleet", &[&original, &second], &[]);
    for key in [
        "lookups",
        "recorded_hits",
        "hits",
        "evictions",
        "stores_written",
    ] {
        assert_eq!(n(&fleet, key), 2 * n(&recorded, key), "{key}");
    }

    // An events replay is one process for the whole fleet, and has no requests to export.
    for flags in [
        &["--rank", "0", "--world-size", "2"][..],
        &["--otlp-file", "spans.jsonl"][..],
    ] {
        let mut args = vec!["replay", original.to_str().expect("path"), "-q"];
        args.extend(flags);
        let out = kvtrace(args);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    }

    // A sweep's points are these replays.
    let swept = dir.path().join("sweep.json");
    let out = kvtrace([
        "sweep",
        "replay",
        original.to_str().expect("path"),
        "--l1-size-gb",
        "0.002,1",
        "-q",
        "--json",
        swept.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let swept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&swept).expect("sweep")).expect("json");
    let points = swept["points"].as_array().expect("points");
    assert_eq!(points.len(), 2);
    for (point, single) in points.iter().zip([&small, &large]) {
        assert_eq!(point["replay"]["fleet"], *single, "{}", point["name"]);
        let rate = point["figures"]["hit_rate"].as_f64().expect("hit_rate");
        assert_eq!(rate, single["hit_ratio"].as_f64().expect("hit_ratio"));
    }
}
