//! The `kvtrace` binary: output, exit codes (0 ok, 1 data, 2 usage) and one-line errors.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::util::{kvtrace, one_line_error, one_rank_replay, sample, scratch, text, TINY_BENCH};

fn path(name: &str) -> String {
    sample(name).display().to_string()
}

#[test]
fn info_prints_lmcache_fields_and_kvtrace_additions() {
    let out = kvtrace(["info", &path("basic_lru")]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    for needle in [
        "level:                      storage",
        "total_records:              41",
        "StorageManager.submit_prefetch_task: 9",
        "start-up gap:               3.846s",
        "distinct keys:              14",
        "complete:                   yes",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in\n{stdout}");
    }
}

#[test]
fn info_json_has_one_object_per_file_and_warns_on_truncation() {
    let out = kvtrace([
        "info",
        "--json",
        &path("empty_arc"),
        &path("basic_lru.truncated"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v[0]["total_records"], 0);
    assert_eq!(v[1]["total_records"], 40);
    assert!(v[1]["truncated"]
        .as_str()
        .expect("text")
        .contains("byte 29472"));
    assert!(text(&out.stderr).contains("warning"));
}

#[test]
fn errors_are_one_line_with_file_offset_and_field_and_documented_exit_codes() {
    let dir = scratch();
    let garbage = dir.path().join("garbage.lct");
    std::fs::write(&garbage, b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1").expect("write");
    let out = kvtrace(["info", &garbage.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("garbage.lct: byte 0: header:"), "{err}");

    let missing = kvtrace(["info", "/no/such/file.lct"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("/no/such/file.lct: cannot open"));

    let usage = kvtrace(["info", "--no-such-flag", &path("basic_lru")]);
    assert_eq!(usage.status.code(), Some(2));
    let usage = kvtrace(["convert", &path("basic_lru"), "x.lct", "--schema", "2"]);
    assert_eq!(usage.status.code(), Some(2));
    assert_eq!(kvtrace(["--help"]).status.code(), Some(0));
}

#[test]
fn one_bad_file_does_not_hide_the_others() {
    let out = kvtrace(["info", "/no/such.lct", &path("empty_arc")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("total_records:              0"));
}

#[test]
fn dump_filters_limits_and_decodes_codec_tags() {
    let out = kvtrace(["dump", &path("basic_lru"), "--limit", "3"]);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl"))
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines[0]["magic"], "4c4d4354");
    let spec = &lines[1]["args"]["spec"];
    assert_eq!(spec["__t__"], "PrefetchTaskSpec");
    assert_eq!(spec["lock_mode"], "LOCK");
    assert_eq!(
        spec["key_groups"][0]["keys"][0]["chunk_hash"]
            .as_str()
            .map(str::len),
        Some(64)
    );

    let out = kvtrace([
        "dump",
        &path("basic_lru"),
        "--qualname",
        "*finish_write",
        "--no-header",
    ]);
    assert_eq!(text(&out.stdout).lines().count(), 4);
    let out = kvtrace([
        "dump",
        &path("unknown_qualname"),
        "--qualname",
        "mq.",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json array");
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    // tuple and set payloads are shown as plain arrays
    assert_eq!(
        v[1]["args"],
        serde_json::json!({"request_id": "r-1", "tuple_arg": [1, 2], "set_arg": [7]})
    );
}

#[test]
fn dump_reads_standard_input_and_stops_quietly_on_a_closed_pipe() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(["dump", "-", "--limit", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let bytes = std::fs::read(sample("basic_lru")).expect("read");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&bytes)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout).lines().count(), 2);

    let dir = scratch();
    let big = dir.path().join("big.lct");
    let gen = kvtrace(["generate", &big.display().to_string(), "--records", "20000"]);
    assert_eq!(gen.status.code(), Some(0));
    let piped = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; '{}' dump '{}' | head -n 1 >/dev/null",
            env!("CARGO_BIN_EXE_kvtrace"),
            big.display()
        ))
        .output()
        .expect("bash");
    assert!(piped.status.success(), "kvtrace failed on a closed pipe");
    assert!(
        !text(&piped.stderr).contains("error"),
        "{}",
        text(&piped.stderr)
    );
}

/// `info -` summarises what it reads from standard input, plain or zstd, as `info FILE` does
/// the file; an events trace from a pipe cannot be a fleet, which reads its traces twice.
#[test]
fn info_reads_standard_input_as_it_reads_the_file() {
    let piped = |args: &[&str], bytes: &[u8]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // A refusal may come before the input is read whole.
        let _ = child.stdin.take().expect("stdin").write_all(bytes);
        child.wait_with_output().expect("wait")
    };
    let summary = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v[0]["file"] = serde_json::Value::Null;
        v
    };
    let file = path("basic_lru");
    let plain = std::fs::read(&file).expect("read");
    let dir = scratch();
    let zst = dir.path().join("basic_lru.lct.zst").display().to_string();
    assert_eq!(kvtrace(["convert", &file, &zst]).status.code(), Some(0));
    let compressed = std::fs::read(&zst).expect("read");
    let whole = summary(&kvtrace(["info", "--json", &file]));
    assert_eq!(summary(&piped(&["info", "--json", "-"], &plain)), whole);
    let mut from_zstd = summary(&piped(&["info", "--json", "-"], &compressed));
    assert_eq!(from_zstd[0]["compressed"], true);
    from_zstd[0]["compressed"] = false.into();
    assert_eq!(from_zstd, whole);

    let Some(shared) = crate::util::shared() else {
        return;
    };
    let events = std::fs::read(shared.join("lmcache/events_churn.lct")).expect("events");
    let out = piped(&["info", "--fleet", "-"], &events);
    let err = one_line_error(&out, 2);
    assert!(
        err.contains("-: an events trace read from standard input"),
        "{err}"
    );
}

#[test]
fn convert_round_trips_byte_for_byte_through_jsonl_and_zstd() {
    let dir = scratch();
    for name in crate::util::SAMPLES {
        let original = std::fs::read(sample(name)).expect("read");
        let d = |f: &str| dir.path().join(format!("{name}.{f}")).display().to_string();
        for (via, back) in [("jsonl", "from-jsonl.lct"), ("lct.zst", "from-zst.lct")] {
            assert_eq!(
                kvtrace(["convert", &path(name), &d(via)]).status.code(),
                Some(0)
            );
            assert_eq!(
                kvtrace(["convert", &d(via), &d(back)]).status.code(),
                Some(0)
            );
            assert_eq!(
                std::fs::read(d(back)).expect("back"),
                original,
                "{name} via {via}"
            );
        }
    }
}

#[test]
fn convert_refuses_to_overwrite_its_input_and_names_bad_jsonl_lines() {
    let dir = scratch();
    let copy = dir.path().join("c.lct");
    std::fs::copy(sample("basic_lru"), &copy).expect("copy");
    let c = copy.display().to_string();
    assert_eq!(kvtrace(["convert", &c, &c]).status.code(), Some(2));
    assert_eq!(
        std::fs::read(&copy).expect("kept"),
        std::fs::read(sample("basic_lru")).expect("o")
    );

    let jsonl = dir.path().join("bad.jsonl");
    let good = kvtrace(["convert", &path("basic_lru"), &jsonl.display().to_string()]);
    assert_eq!(good.status.code(), Some(0));
    let mut lines: Vec<String> = std::fs::read_to_string(&jsonl)
        .expect("read")
        .lines()
        .map(String::from)
        .collect();
    lines[3] = "{\"args\": {\"$bin_hex\": \"zz\"}}".into();
    std::fs::write(&jsonl, lines.join("\n")).expect("write");
    let out_path = dir.path().join("partial.lct");
    let out = kvtrace([
        "convert",
        &jsonl.display().to_string(),
        &out_path.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.jsonl: line 4: value: $.args: $bin_hex"),
        "{err}"
    );
    // What was converted before the bad line is kept: the header and two records.
    let mut reader =
        kvtrace::lmct::TraceReader::open(&out_path, Default::default()).expect("partial");
    let mut n = 0;
    while reader.next_record().expect("record").is_some() {
        n += 1;
    }
    assert_eq!(n, 2);
}

#[test]
fn generate_is_deterministic_for_a_seed() {
    let dir = scratch();
    let a = dir.path().join("a.lct").display().to_string();
    let b = dir.path().join("b.lct").display().to_string();
    let c = dir.path().join("c.lct").display().to_string();
    for (p, seed) in [(&a, "5"), (&b, "5"), (&c, "6")] {
        let out = kvtrace(["generate", p, "--records", "3000", "--seed", seed]);
        assert_eq!(out.status.code(), Some(0));
    }
    let read = |p: &str| std::fs::read(p).expect("read");
    assert_eq!(read(&a), read(&b));
    assert_ne!(read(&a), read(&c));
    let out = kvtrace(["info", "--json", &a]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v[0]["total_records"], 3000);
    assert_eq!(v[0]["schema_variant"], "1 (LMCache 0.5.6)");
}

/// Replays `trace` with no storage flags and checks it is faithful: exit 0, nothing on
/// stderr, the recorded digest, every request's hits and every reservation as recorded.
/// Returns the hit chunks.
fn replays_faithfully_without_flags(trace: &str, out_dir: &str) -> u64 {
    let out = kvtrace([
        "replay",
        trace,
        "-q",
        "--json",
        "--expect-fidelity",
        "--output-dir",
        out_dir,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "",
        "no warning for a recorded configuration"
    );
    let summary = replay_summary(std::path::Path::new(out_dir));
    assert_eq!(summary["kvtrace"]["digest"]["result"], "match");
    let fidelity = &summary["kvtrace"]["fidelity"];
    assert_eq!(fidelity["requests"], fidelity["requests_matching"]);
    assert_eq!(fidelity["stores"], fidelity["stores_matching"]);
    assert_eq!(
        fidelity["recorded_hit_chunks"],
        fidelity["replayed_hit_chunks"]
    );
    fidelity["recorded_hit_chunks"].as_u64().expect("hits")
}

#[test]
fn a_generated_trace_replays_without_flags_and_reproduces_its_hits() {
    let dir = scratch();
    let trace = dir.path().join("g.lct").display().to_string();
    let out_dir = dir.path().join("out").display().to_string();
    assert!(kvtrace(["generate", &trace, "--records", "3000"])
        .status
        .success());
    assert!(replays_faithfully_without_flags(&trace, &out_dir) > 0);
}

/// `generate --from-mooncake`: per request one lookup and one reservation, reads only where
/// the modelled L1 holds a prefix, keys of their own in every loop; a replay without flags
/// (the recorded LRU L1, real buffers) reproduces every hit and every reservation.
#[test]
fn a_mooncake_request_trace_becomes_a_storage_trace_whose_hits_replay_exactly() {
    const ROWS: u64 = 300;
    let dir = scratch();
    let hits = |loops: &str, l1_chunks: &str| {
        let trace = dir.path().join("mc.lct").display().to_string();
        let out_dir = dir.path().join("out").display().to_string();
        let made = kvtrace([
            "generate",
            &trace,
            "--from-mooncake",
            "testdata/mooncake/conversation_head300.jsonl",
            "--loops",
            loops,
            "--l1-chunks",
            l1_chunks,
        ]);
        assert_eq!(made.status.code(), Some(0), "{}", text(&made.stderr));
        let info: serde_json::Value =
            serde_json::from_slice(&kvtrace(["info", &trace, "--json"]).stdout).expect("info");
        let ops = &info[0]["ops"];
        let count = |call: &str| {
            ops[format!("lmcache.v1.distributed.storage_manager.StorageManager.{call}")]
                .as_u64()
                .unwrap_or(0)
        };
        let requests = ROWS * loops.parse::<u64>().expect("loops");
        assert_eq!(count("submit_prefetch_task"), requests);
        assert_eq!(count("reserve_write"), requests);
        assert_eq!(
            count("read_prefetched_results.__enter__"),
            count("finish_read_prefetched")
        );
        assert!(count("finish_write") <= requests);
        replays_faithfully_without_flags(&trace, &out_dir)
    };
    let one = hits("1", "64");
    assert!(one > 0);
    assert_eq!(hits("2", "64"), 2 * one, "a loop hits nothing of another");
    assert!(hits("1", "4") < one, "a smaller L1 holds less");
}

/// Wrong `generate --from-mooncake` options: one line on stderr naming the flag or file, usage
/// exit 2 (a missing input is an I/O error, exit 1), and no trace written.
#[test]
fn bad_mooncake_generator_options_are_one_line_errors() {
    let dir = scratch();
    let out = dir.path().join("o.lct").display().to_string();
    let input = "testdata/mooncake/conversation_head300.jsonl";
    let cases: [(Vec<&str>, i32, &str); 5] = [
        (vec!["--from-mooncake", input, "--loops", "0"], 2, "--loops"),
        (
            vec!["--from-mooncake", input, "--l1-chunks", "0"],
            2,
            "--l1-chunks",
        ),
        (
            vec!["--from-mooncake", input, "--chunk-mib", "2000000"],
            2,
            "--chunk-mib",
        ),
        (vec!["--loops", "3"], 2, "--from-mooncake"),
        (vec!["--from-mooncake", "no/such.jsonl"], 1, "no/such.jsonl"),
    ];
    for (flags, code, named) in cases {
        let args: Vec<&str> = ["generate", out.as_str()]
            .into_iter()
            .chain(flags.clone())
            .collect();
        let run = kvtrace(args);
        let err = text(&run.stderr);
        assert_eq!(run.status.code(), Some(code), "{flags:?}: {err}");
        assert!(err.contains(named), "{flags:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(
            !std::path::Path::new(&out).exists(),
            "{flags:?} wrote a trace"
        );
    }
}

#[test]
fn a_bad_mooncake_row_is_one_line_naming_file_line_and_field() {
    let dir = scratch();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"hash_ids\": [1], \"output_length\": 1}\n{\"hash_ids\": [\"x\"], \"output_length\": 1}\n",
    )
    .expect("write");
    let out = kvtrace([
        "generate",
        &dir.path().join("o.lct").display().to_string(),
        "--from-mooncake",
        &input.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("bad.jsonl") && err.contains("line 2") && err.contains("hash_ids"),
        "{err}"
    );
}

#[test]
fn replay_writes_lmcache_shaped_reports_and_jsonl() {
    let dir = scratch();
    let out_dir = dir.path().display().to_string();
    let jsonl = dir.path().join("records.jsonl").display().to_string();
    let out = kvtrace([
        "replay",
        &path("basic_lru"),
        "--output-dir",
        &out_dir,
        "--json",
        "--jsonl-out",
        &jsonl,
        "-q",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "-q prints no table");
    let ops = std::fs::read_to_string(dir.path().join("trace_replay_ops.csv")).expect("ops csv");
    assert_eq!(
        ops.lines().next(),
        Some("qualname,count,errors,mean_ms,p50_ms,p90_ms,p99_ms,min_ms,max_ms")
    );
    assert_eq!(ops.lines().count(), 7);
    let summary = replay_summary(dir.path());
    let op = &summary["ops"]
        ["lmcache.v1.distributed.storage_manager.StorageManager.submit_prefetch_task"];
    let keys: Vec<&String> = op.as_object().expect("op").keys().collect();
    assert_eq!(
        keys,
        ["count", "errors", "max_ms", "mean_ms", "min_ms", "p50_ms", "p90_ms", "p99_ms"]
    );
    assert_eq!(op["count"], 9);
    assert_eq!(summary["kvtrace"]["hits"]["hit_chunks"], 27);
    assert_eq!(summary["kvtrace"]["digest"]["result"], "match");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .expect("jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(lines.len(), 41);
    assert_eq!(lines[0]["failed"], false);
    assert_eq!(lines[0]["detail"], "hit 0/4 chunks (L1 0, L2 0)");
    if let Some(shared) = crate::util::shared() {
        let theirs: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(shared.join("lmcache/replay/basic/trace_replay_summary.json"))
                .expect("lmcache"),
        )
        .expect("json");
        let names = |v: &serde_json::Value| {
            v["ops"]
                .as_object()
                .expect("ops")
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&summary), names(&theirs));
    }
}

#[test]
fn replay_prints_the_table_and_verbose_lines() {
    let dir = scratch();
    let out = kvtrace([
        "replay",
        &path("unknown_qualname"),
        "--no-csv",
        "--verbose",
        "--output-dir",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("  [3]  FAIL  0.000ms  lmcache.v1.distributed.storage_manager.StorageManager.touch_cached_keys"));
    assert!(stdout.contains("Records skipped:                                               2"));
    // The recording carried a per-process shared-memory name: equal but for that.
    assert!(
        stdout.contains("Config digest:     match (semantic) (rec=7246d987, run=2b3625f4)"),
        "{stdout}"
    );
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").next().is_none(),
        "--no-csv writes nothing"
    );
}

#[test]
fn replay_paces_in_real_time_with_a_speedup() {
    let dir = scratch();
    let d = dir.path().display().to_string();
    let trace = path("basic_lru");
    let summary = |extra: &[&str]| -> f64 {
        let mut args = vec!["replay", trace.as_str(), "--output-dir", &d, "--json", "-q"];
        args.extend(extra);
        assert_eq!(kvtrace(&args).status.code(), Some(0));
        let v = replay_summary(dir.path());
        v["duration_s"].as_f64().expect("duration")
    };
    // Records span 3.846 s .. 4.406 s of trace time.
    let sped = summary(&["--speedup", "10"]);
    assert!(sped >= 0.056, "{sped}");
    let with_gap = summary(&["--speedup", "10", "--keep-startup-gap"]);
    assert!(with_gap >= 0.44, "{with_gap}");
}

#[test]
fn replay_refuses_what_cannot_mean_anything() {
    let cases: [&[&str]; 6] = [
        &["--speedup", "0"],
        &["--speedup", "1e-300"],
        &["--pace", "afap", "--speedup", "2"],
        &["--l2-adapter", "{\"type\":\"s3\"}"],
        &["--eviction-ratio", "1.5"],
        &["--eviction-policy", "IsolatedLRU"],
    ];
    let trace = path("basic_lru");
    for extra in cases {
        let mut args = vec!["replay", trace.as_str(), "--no-csv", "-q"];
        args.extend(extra);
        let out = kvtrace(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stderr).lines().count(), 1, "{extra:?}");
    }
}

#[test]
fn replay_misses_exit_zero_unless_fidelity_is_expected_and_events_traces_are_refused() {
    let dir = scratch();
    let gen = dir.path().join("g.lct").display().to_string();
    assert_eq!(
        kvtrace(["generate", &gen, "--records", "2000"])
            .status
            .code(),
        Some(0)
    );
    let out = kvtrace(["replay", &gen, "--l1-size-gb", "0", "--no-csv", "-q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = kvtrace([
        "replay",
        &gen,
        "--l1-size-gb",
        "0",
        "--no-csv",
        "-q",
        "--expect-fidelity",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "every recorded hit is a replayed miss"
    );

    let metrics = dir.path().join("metrics.lct");
    let mut header = kvtrace::lmct::Header::storage(1.0, 2.0);
    header.level = "metrics".into();
    let w =
        kvtrace::lmct::TraceWriter::new(std::fs::File::create(&metrics).expect("create"), header);
    w.finish().expect("finish");
    let out = kvtrace([
        "replay",
        &metrics.display().to_string(),
        "--l1-size-gb",
        "1",
        "--no-csv",
        "-q",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("level: trace level is \"metrics\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn diff_flags_a_regression_between_two_replays() {
    let dir = scratch();
    let gen = dir.path().join("g.lct").display().to_string();
    assert_eq!(
        kvtrace([
            "generate",
            &gen,
            "--records",
            "3000",
            "--chunk-tokens",
            "16"
        ])
        .status
        .code(),
        Some(0)
    );
    let base = dir.path().join("base").display().to_string();
    let new = dir.path().join("new").display().to_string();
    for (out, size) in [(&base, "0.02"), (&new, "0.002")] {
        let r = kvtrace([
            "replay",
            &gen,
            "--l1-size-gb",
            size,
            "--l1-accounting-only",
            "--eviction-timing",
            "immediate",
            "--json",
            "--no-csv",
            "-q",
            "--output-dir",
            out,
        ]);
        assert!(
            r.status.code().is_some_and(|c| c <= 1),
            "{}",
            text(&r.stderr)
        );
    }
    let summary = |d: &str| format!("{d}/trace_replay_summary.json");
    // Latencies are live measurements: only the cache metrics decide here.
    let same = kvtrace([
        "diff",
        &summary(&base),
        &summary(&base),
        "--max-regression",
        "0",
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stdout));
    let worse = kvtrace([
        "diff",
        &summary(&base),
        &summary(&new),
        "--max-regression",
        "1000000",
        "--json",
    ]);
    let rows: serde_json::Value = serde_json::from_slice(&worse.stdout).expect("json");
    let hit = rows
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["metric"] == "hit rate")
        .expect("hit rate");
    assert!(
        hit["new"].as_f64() < hit["base"].as_f64(),
        "a 10x smaller L1 hits less"
    );
    let strict = kvtrace([
        "diff",
        &summary(&base),
        &summary(&new),
        "--max-regression",
        "1",
    ]);
    assert_eq!(strict.status.code(), Some(1));
    assert!(text(&strict.stdout).contains("hit rate"));
    assert!(text(&strict.stdout).contains("REGRESSED"));
    assert!(
        !text(&strict.stdout).contains('\x1b'),
        "no colour into a pipe"
    );
    // Colour where asked for (CLICOLOR_FORCE stands in for a terminal); NO_COLOR wins.
    let coloured = |no_color: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvtrace"));
        command
            .args([
                "diff",
                &summary(&base),
                &summary(&new),
                "--max-regression",
                "1",
            ])
            .env("CLICOLOR_FORCE", "1")
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            command.env("NO_COLOR", v);
        }
        text(&command.output().expect("run").stdout)
    };
    assert!(coloured(None).contains("\x1b[1;31mREGRESSED\x1b[0m"));
    assert!(!coloured(Some("1")).contains('\x1b'));
    assert_eq!(
        kvtrace(["diff", &summary(&base), "/no/such.json"])
            .status
            .code(),
        Some(1)
    );
}

#[test]
fn replay_reads_a_toml_hierarchy_and_flags_override_it() {
    let dir = scratch();
    let config = dir.path().join("hierarchy.toml");
    std::fs::write(
        &config,
        format!(
            "[l1]\nsize_gb = 0.001\neviction_policy = \"ARC\"\neviction_timing = \"immediate\"\naccounting_only = true\n\n\
             [[l2]]\ntype = \"memory\"\ncapacity_gb = 1\n\n[[l2]]\ntype = \"fs\"\npath = \"{}\"\n",
            dir.path().join("tier").display()
        ),
    )
    .expect("write");
    let out_dir = dir.path().join("out").display().to_string();
    let c = config.display().to_string();
    let out = kvtrace([
        "replay",
        &path("basic_lru"),
        "--config",
        &c,
        "--eviction-policy",
        "FIFO",
        "--json",
        "--no-csv",
        "-q",
        "--output-dir",
        &out_dir,
    ]);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        text(&out.stderr)
    );
    let summary = replay_summary(&dir.path().join("out"));
    let k = &summary["kvtrace"];
    assert_eq!(
        k["config"]["eviction_config"]["eviction_policy"], "FIFO",
        "the flag wins"
    );
    assert_eq!(
        k["config"]["kvtrace_eviction_timing"], "immediate",
        "the file applies"
    );
    assert_eq!(
        k["config"]["l1_manager_config"]["memory_config"]["size_in_bytes"],
        1_073_741
    );
    let tiers: Vec<&str> = k["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .map(|t| t["backend"].as_str().expect("b"))
        .collect();
    assert_eq!(tiers, ["memory (accounting only)", "memory", "file"]);
    assert_eq!(k["digest"]["result"], "MISMATCH");

    std::fs::write(&config, "[l1]\nsise_gb = 1\n").expect("write");
    let bad = kvtrace([
        "replay",
        &path("basic_lru"),
        "--config",
        &c,
        "--no-csv",
        "-q",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    let err = text(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("hierarchy.toml") && err.contains("sise_gb"),
        "{err}"
    );
}

/// What a command that reads files says of `-` as an input.
const STDIN_ONLY: &str =
    "-: standard input is read by info, dump and convert only; give this command a file";

/// Every other way a command line can be wrong: one line naming the problem, the documented
/// exit code.
#[test]
fn each_bad_argument_is_a_one_line_error_with_its_exit_code() {
    let dir = scratch();
    let d = |f: &str| dir.path().join(f).display().to_string();
    // A trace whose header records a configuration that is not LMCache's shape.
    let generated = d("no-lmcache-config.lct");
    let lossless = d("g.jsonl");
    assert!(kvtrace(["generate", &generated, "--records", "50"])
        .status
        .success());
    assert!(kvtrace(["convert", &generated, &lossless]).status.success());
    let text_in = std::fs::read_to_string(&lossless).expect("jsonl");
    let (header, rest) = text_in.split_once('\n').expect("header line");
    let mut header: serde_json::Value = serde_json::from_str(header).expect("header");
    header["sm_config_json"] = "{\"kvtrace_synth\": {}}".into();
    std::fs::write(&lossless, format!("{header}\n{rest}")).expect("write");
    std::fs::remove_file(&generated).expect("rm");
    assert!(kvtrace(["convert", &lossless, &generated]).status.success());
    // And one whose recorded configuration was damaged: not JSON any more.
    let damaged = d("damaged-config.lct");
    header["sm_config_json"] = "{\"l1_manager_config\": {\"memory_config\": ".into();
    std::fs::write(&lossless, format!("{header}\n{rest}")).expect("write");
    assert!(kvtrace(["convert", &lossless, &damaged]).status.success());
    let not_summary = d("not-a-summary.json");
    std::fs::write(&not_summary, "{\"hello\": 1}").expect("write");
    let basic = path("basic_lru");
    let copied = d("copied.lct");
    std::fs::copy(&basic, &copied).expect("copy");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["convert", &basic, "x.out", "--to", "csv"],
            2,
            "invalid value 'csv' for '--to <KIND>' [possible values: lct, lct.zst, jsonl, parquet, arrow]",
        ),
        (vec!["convert", &basic, "-"], 2, "needs --to"),
        (
            vec!["dump", &basic, "--qualname", "[unclosed"],
            2,
            "--qualname",
        ),
        (
            vec!["generate", &generated, "--chunk-tokens", "0"],
            2,
            "--chunk-tokens",
        ),
        (
            vec!["replay", &basic, "--l1-size-gb", "100000", "-q", "--no-csv"],
            2,
            "--l1-accounting-only",
        ),
        // The size as given, not the most bytes a size can hold.
        (
            vec!["replay", &basic, "--l1-size-gb", "1e300", "-q", "--no-csv"],
            2,
            "an L1 of 1e300 GiB with real buffers",
        ),
        (
            vec!["replay", &basic, "--client", "vllm2", "-q", "--no-csv"],
            2,
            "--client",
        ),
        // Standard input is read by info, dump and convert only; elsewhere `-` is refused,
        // not looked for as a file.
        (vec!["replay", "-", "-q", "--no-csv"], 2, STDIN_ONLY),
        (vec!["plan", "-", "--size-gb", "1"], 2, STDIN_ONLY),
        (vec!["diff", &basic, "-"], 2, STDIN_ONLY),
        (vec!["simulate", "-"], 2, STDIN_ONLY),
        (vec!["sweep", "replay", "-", "--l1-size-gb", "1,2"], 2, STDIN_ONLY),
        (vec!["replay", &basic, "--config", "-"], 2, STDIN_ONLY),
        // A configuration read whole is bounded: a device that never ends is refused at
        // 64 MiB, a grid at 4 KiB a point.
        (
            vec!["replay", &basic, "--config", "/dev/zero", "-q", "--no-csv"],
            1,
            "/dev/zero: cannot read: longer than 67108864 bytes",
        ),
        (
            vec!["sweep", "replay", &basic, "--grid", "/dev/zero"],
            1,
            "/dev/zero: cannot read: longer than 40960000 bytes",
        ),
        // A report is parsed as it is read: bytes that cannot begin one end the read.
        (
            vec!["diff", "/dev/zero", &not_summary],
            1,
            "/dev/zero: line 1: json: expected value at line 1 column 1",
        ),
        (
            vec!["aggregate", "/dev/zero"],
            1,
            "/dev/zero: line 1: json: expected value at line 1 column 1",
        ),
        // The old spelling `--json PATH` naming the input: the refusal alone, without the
        // note on the spelling.
        (
            vec!["sweep", "replay", &copied, "--l1-size-gb", "0.01,0.1", "-q", "--json", &copied],
            2,
            "input and output are the same file",
        ),
        (
            vec![
                "replay",
                &basic,
                "--eviction-interval",
                "0",
                "-q",
                "--no-csv",
            ],
            2,
            "--eviction-interval",
        ),
        (
            vec![
                "replay",
                &basic,
                "--l2-adapter",
                "{not json",
                "-q",
                "--no-csv",
            ],
            2,
            "--l2-adapter",
        ),
        (
            vec![
                "replay",
                &basic,
                "--l2-adapter",
                "{\"type\":\"fs\"}",
                "-q",
                "--no-csv",
            ],
            2,
            "needs \"path\"",
        ),
        (
            vec![
                "replay",
                &basic,
                "--l2-adapter",
                "{\"type\":\"fs\",\"path\":\"x\",\"fsync\":\"sometimes\"}",
                "-q",
            ],
            2,
            "fsync",
        ),
        (
            vec!["replay", &generated, "-q", "--no-csv"],
            2,
            "no-lmcache-config.lct: header.sm_config_json: no l1_manager_config: the trace \
             records no storage configuration kvtrace can read; give one with --l1-size-gb or \
             --config",
        ),
        (
            vec!["replay", &damaged, "-q", "--no-csv"],
            2,
            "damaged-config.lct: header.sm_config_json: not JSON (EOF while parsing a value at \
             line 1 column 40): the trace records no storage configuration",
        ),
        (
            vec!["diff", &not_summary, &not_summary],
            1,
            "not a replay summary",
        ),
        (
            vec!["diff", &not_summary, &not_summary, "--max-regression=-1"],
            2,
            "--max-regression",
        ),
    ];
    for (args, code, needle) in cases {
        let out = kvtrace(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("kvtrace: error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn replay_models_a_gpu_top_tier_from_the_toml_file() {
    let dir = scratch();
    let config = dir.path().join("gpu.toml");
    std::fs::write(
        &config,
        "placement = \"waterfall\"\n[l1]\ndevice = \"gpu\"\nbandwidth_gbps = 10\nsize_gb = 0.001\n\
         eviction_timing = \"immediate\"\n\n[[l2]]\ntype = \"memory\"\ncapacity_gb = 1\n",
    )
    .expect("write");
    let out_dir = dir.path().join("out").display().to_string();
    let c = config.display().to_string();
    let args = [
        "replay",
        &path("basic_lru"),
        "--config",
        &c,
        "--json",
        "--no-csv",
        "-q",
        "--output-dir",
        &out_dir,
    ];
    let out = kvtrace(args);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        text(&out.stderr)
    );
    let summary = replay_summary(&dir.path().join("out"));
    let k = &summary["kvtrace"];
    assert_eq!(k["config"]["kvtrace_l1_gpu_bandwidth_gbps"], 10.0);
    assert_eq!(k["tiers"][0]["backend"], "gpu (budget)");
    let l1_io = &k["tier_io"][0];
    assert_eq!(l1_io["name"], "L1");
    let written = k["tiers"][0]["bytes_written"].as_f64().expect("bytes");
    assert!(written > 0.0);
    let modelled = l1_io["write_seconds"].as_f64().expect("seconds");
    assert!(
        (modelled - written / 10e9).abs() < 1e-12,
        "{modelled} s for {written} bytes at 10 GB/s"
    );

    for (toml, expected) in [
        (
            "[l1]\ndevice = \"gpu\"\nbandwidth_gbps = -1\n",
            "l1.bandwidth_gbps -1",
        ),
        ("[l1]\ndevice = \"tpu\"\n", "l1.device \"tpu\": cpu or gpu"),
        (
            "[l1]\ndevice = \"cpu\"\nbandwidth_gbps = 5\n",
            "applies to device = \"gpu\" only",
        ),
        (
            "[[l2]]\ntype = \"gpu\"\nbandwidth_gbps = 0\n",
            "l2[0]: bandwidth_gbps 0",
        ),
    ] {
        std::fs::write(&config, toml).expect("write");
        let bad = kvtrace(args);
        let err = text(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{toml}: {err}");
        assert!(err.contains(expected), "{toml}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// The `trace_replay_summary.json` a replay wrote into `dir`.
fn replay_summary(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("trace_replay_summary.json")).expect("json");
    serde_json::from_str(&text).expect("summary")
}

#[test]
fn bare_kvtrace_lists_the_commands() {
    let out = kvtrace(std::iter::empty::<&str>());
    assert_eq!(out.status.code(), Some(2));
    let help = text(&out.stderr);
    for command in [
        "info", "dump", "convert", "generate", "replay", "diff", "simulate", "bench",
    ] {
        assert!(
            help.contains(&format!("  {command} ")),
            "{command} missing: {help}"
        );
    }
}

#[test]
fn help_examples_fit_80_columns_and_paste_as_they_stand() {
    for command in [
        "info", "dump", "convert", "generate", "replay", "diff", "simulate", "bench",
    ] {
        let out = kvtrace([command, "--help"]);
        let help = text(&out.stdout);
        let examples: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Examples:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(!examples.is_empty(), "{command}: no examples");
        for (i, line) in examples.iter().enumerate() {
            assert!(
                line.len() <= 80,
                "{command}: {line:?} is wider than 80 columns"
            );
            if line.trim_start().starts_with("kvtrace") || line.starts_with("      ") {
                let continued = examples.get(i + 1).is_some_and(|n| n.starts_with("      "));
                assert_eq!(line.ends_with(" \\"), continued, "{command}: {line:?}");
            }
        }
    }
}

#[test]
fn converting_a_clean_trace_warns_of_nothing() {
    let dir = scratch();
    let out_path = dir.path().join("t.lct.zst");
    let out = kvtrace([
        "convert",
        sample("basic_lru").to_str().unwrap(),
        out_path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let out = kvtrace(["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = text(&out.stdout);
        assert!(
            script.contains("replay") && script.contains("eviction-policy"),
            "{shell}"
        );
        // Flags with a fixed set of values offer them.
        for value in ["FIFO", "lct.zst", "deepseek-v3", "kv_router"] {
            assert!(script.contains(value), "{shell}: {value}");
        }
    }
    let bash = text(&kvtrace(["completions", "bash"]).stdout);
    assert!(bash.contains("\"LRU ARC FIFO LFU noop\""), "{bash}");
    let dir = scratch();
    let pages = dir.path().join("man1");
    let out = kvtrace(["man", &pages.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let replay = std::fs::read_to_string(pages.join("kvtrace-replay.1")).expect("page");
    assert!(replay.contains(".TH kvtrace-replay 1"), "{replay}");
    assert!(
        replay.contains("eviction\\-policy"),
        "options are documented"
    );
    assert!(pages.join("kvtrace.1").exists());

    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let out = kvtrace(["man", &file.join("man1").display().to_string()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("a-file/man1") && err.lines().count() == 1,
        "{err}"
    );
    let out = kvtrace(["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
}

/// A build without the `otel` feature says so in one line instead of replaying silently.
#[cfg(not(feature = "otel"))]
#[test]
fn otlp_flags_without_the_otel_feature_are_a_usage_error() {
    let out = kvtrace([
        "replay".as_ref(),
        sample("basic_lru").as_os_str(),
        "-q".as_ref(),
        "--otlp-file".as_ref(),
        "spans.jsonl".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("otel"), "{stderr}");
}

/// L1's real buffers: untouched by default, written with --l1-touch-pages; the hits are the
/// same either way, and the tier says which it was.
#[test]
fn l1_touch_pages_changes_what_is_resident_not_what_hits() {
    let dir = scratch();
    let trace = sample("basic_lru").display().to_string();
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name).display().to_string();
        let mut args = vec![
            "replay",
            trace.as_str(),
            "-q",
            "--json",
            "--output-dir",
            &out,
        ];
        args.extend_from_slice(extra);
        let r = kvtrace(&args);
        assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
        let summary = std::fs::read(format!("{out}/trace_replay_summary.json")).expect("summary");
        let v: serde_json::Value = serde_json::from_slice(&summary).expect("json");
        let k = &v["kvtrace"];
        (
            k["tiers"][0]["backend"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            k["hits"].clone(),
            k["config"]["kvtrace_l1_touch_pages"].clone(),
        )
    };
    let (plain, hits, flag) = run("plain", &[]);
    assert_eq!((plain.as_str(), flag), ("memory", serde_json::Value::Null));
    let (touched, touched_hits, flag) = run("touched", &["--l1-touch-pages"]);
    assert_eq!(touched, "memory (pages touched)");
    assert_eq!(flag, serde_json::Value::Bool(true));
    assert_eq!(touched_hits, hits);
    let both = kvtrace([
        "replay",
        trace.as_str(),
        "--l1-touch-pages",
        "--l1-accounting-only",
    ]);
    assert_eq!(both.status.code(), Some(2));
    assert_eq!(
        text(&both.stderr).trim().lines().count(),
        1,
        "{}",
        text(&both.stderr)
    );
}

#[test]
fn two_replays_of_one_trace_never_regress_and_diff_compares_simulate_reports() {
    let dir = scratch();
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/lmcache/basic_lru.lct");
    let trace = trace.to_str().expect("path");
    let summaries: Vec<String> = (0..4)
        .map(|i| {
            let out = dir.path().join(format!("r{i}"));
            let out = out.to_str().expect("dir");
            let r = kvtrace([
                "replay",
                trace,
                "--json",
                "--no-csv",
                "-q",
                "--output-dir",
                out,
            ]);
            assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
            format!("{out}/trace_replay_summary.json")
        })
        .collect();
    for pair in summaries.windows(2) {
        let gate = kvtrace(["diff", &pair[0], &pair[1], "--max-regression", "0"]);
        assert_eq!(gate.status.code(), Some(0), "{}", text(&gate.stdout));
        // Latencies when asked: live measurements, so their verdict is not asserted here (a
        // loaded machine can move a p99 past any floor); the rows are there and the floor is
        // stated.
        let timed = kvtrace(["diff", &pair[0], &pair[1], "--latency"]);
        assert!(timed.status.code().is_some_and(|c| c <= 1));
        assert!(text(&timed.stdout).contains("reserve_write p99_ms"));
        assert!(
            text(&timed.stdout).contains("noise"),
            "{}",
            text(&timed.stdout)
        );
    }

    let report = |name: &str, rate: &str| {
        let path = dir.path().join(name);
        let r = kvtrace([
            "simulate",
            "--input-tokens",
            "1024",
            "--output-tokens",
            "8",
            "--request-count",
            "40",
            "--request-rate",
            rate,
            "--report-json",
            path.to_str().expect("path"),
        ]);
        assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
        path.display().to_string()
    };
    let (a, b) = (report("a.json", "5"), report("b.json", "5"));
    let same = kvtrace(["diff", &a, &b, "--max-regression", "0"]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stdout));
    assert!(
        text(&same.stdout).contains("mean TTFT"),
        "{}",
        text(&same.stdout)
    );
    let mixed = kvtrace(["diff", &a, &summaries[0]]);
    assert_eq!(mixed.status.code(), Some(2), "{}", text(&mixed.stderr));
    assert_eq!(text(&mixed.stderr).lines().count(), 1);
}

/// One line, exit `code`, containing every `says`.
fn says(args: &[&str], code: i32, says: &[&str]) {
    let err = one_line_error(&kvtrace(args), code);
    for s in says {
        assert!(err.contains(s), "{args:?}: {err}");
    }
}

#[test]
fn flags_of_the_tools_users_come_from_point_the_right_way() {
    let t = path("basic_lru");
    says(
        &["replay", "--trace-file", &t],
        2,
        &["'--trace-file'", "kvtrace replay FILE.lct"],
    );
    says(
        &["replay", &t, "--l1-manager", "DRAM"],
        2,
        &["'--l1-manager'", "--l1-size-gb"],
    );
    says(
        &["simulate", "--block-size", "16"],
        2,
        &["'--block-size'", "--extra-engine-args"],
    );
    says(
        &["bench", "--precondition"],
        2,
        &["'--precondition'", "not in kvtrace bench"],
    );
    says(
        &["bench", "--config", "kv-cache.yaml"],
        2,
        &["'--config'", "not its YAML file"],
    );
}

#[test]
fn a_json_file_given_for_a_trace_says_what_it_is_and_where_it_goes() {
    let mooncake = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/mooncake/conversation_head300.jsonl");
    let mooncake = mooncake.to_str().expect("path");
    for command in ["replay", "info", "dump"] {
        says(
            &[command, mooncake, "-q"][..if command == "replay" { 3 } else { 2 }],
            1,
            &[
                "byte 0: header: JSON text",
                "kvtrace simulate",
                "--from-mooncake",
            ],
        );
    }
    let dir = scratch();
    let jsonl = dir.path().join("t.jsonl");
    let jsonl = jsonl.to_str().expect("path");
    let out = kvtrace(["convert", &path("basic_lru"), jsonl]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    says(
        &["replay", jsonl, "-q", "--no-csv"],
        1,
        &[
            "JSON Lines form of a trace",
            "kvtrace convert FILE.jsonl FILE.lct",
        ],
    );
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = kvtrace(["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let shown = text(&out.stdout);
    assert!(
        shown.starts_with(&format!("kvtrace {}", env!("CARGO_PKG_VERSION"))),
        "{shown}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match head {
        Ok(o) if o.status.success() => {
            let commit = text(&o.stdout).trim().to_owned();
            assert!(
                shown.contains(&format!("({commit} ")),
                "{shown} vs {commit}"
            );
        }
        _ => eprintln!("skipped: not a git checkout, the version names no commit"),
    }
}

#[test]
fn runs_that_cannot_mean_what_was_asked_say_so() {
    // An L1 of no bytes replays (a sweep may include it on purpose), with a warning.
    let out = kvtrace([
        "replay",
        &path("basic_lru"),
        "-q",
        "--no-csv",
        "--l1-size-gb",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--l1-size-gb 0: an L1 of no bytes holds nothing"),
        "{}",
        text(&out.stderr)
    );
    // A bench of a second cannot fill its percentiles.
    let dir = scratch();
    let result = dir.path().join("r.json");
    let cache = dir.path().join("cache");
    let mut args = TINY_BENCH.to_vec();
    args.extend(["--duration", "1"]);
    args.extend(["--cache-dir", cache.to_str().expect("path")]);
    args.extend(["--output", result.to_str().expect("path")]);
    let out = kvtrace(args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("request(s) completed in 1 s: the p95/p99 latencies"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn report_flags_share_one_shape_and_take_the_old_spelling_with_a_note() {
    let dir = scratch();
    let d = dir.path().display().to_string();
    let trace = path("basic_lru");
    // A bare flag writes the default file and leaves the next word an input.
    let out = kvtrace([
        "replay",
        "--json",
        &trace,
        "--no-csv",
        "-q",
        "--output-dir",
        &d,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = dir.path().join("trace_replay_summary.json");
    assert!(summary.is_file());
    // `=PATH` names the file; nothing lands in the output directory.
    let named = dir.path().join("named");
    std::fs::create_dir(&named).expect("mkdir");
    let (json, xlsx) = (named.join("r.json"), named.join("r.xlsx"));
    let out = kvtrace([
        "replay",
        &trace,
        "--no-csv",
        "-q",
        "--output-dir",
        &d,
        &format!("--json={}", json.display()),
        &format!("--xlsx={}", xlsx.display()),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(json.is_file() && xlsx.is_file());
    assert!(!dir.path().join("trace_replay.xlsx").exists());
    let replayed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("read")).expect("json");
    assert!(replayed["kvtrace"].is_object(), "{replayed}");
    // aggregate's older `--json PATH` still works, with one deprecation note.
    let merged = dir.path().join("merged.json");
    let rank = one_rank_replay(&sample("basic_lru"), &dir.path().join("ranks"));
    let rank = rank.display().to_string();
    let out = kvtrace([
        "aggregate",
        &rank,
        "-q",
        "--json",
        &merged.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(merged.is_file());
    let err = text(&out.stderr);
    assert_eq!(
        err.trim(),
        "kvtrace: warning: `--json PATH` is deprecated: write `--json=PATH` (`--json` alone writes the default file)",
    );
}

#[test]
fn what_the_commands_print_fits_100_columns() {
    let dir = scratch();
    let trace = path("basic_lru");
    let mooncake = crate::util::repo("testdata/mooncake/conversation_head300.jsonl");
    let report = dir.path().join("simulate.json").display().to_string();
    let runs: [&[&str]; 4] = [
        // A what-if replay lists where its configuration differs from the recorded one.
        &["replay", &trace, "--no-csv", "--l1-size-gb", "0.01"],
        &["simulate", &mooncake, "--report-json", &report],
        &[
            "sweep",
            "replay",
            &trace,
            "--l1-size-gb",
            "0.01,0.1,1",
            "--eviction-policy",
            "LRU,ARC",
        ],
        &["info", &trace],
    ];
    for args in runs {
        let out = kvtrace(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let stdout = text(&out.stdout);
        for line in stdout.lines() {
            assert!(line.chars().count() <= 100, "{args:?}: {line}");
        }
    }
}
