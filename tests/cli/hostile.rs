//! Round three of hostile inputs, on the surfaces added since the second: rank mode,
//! aggregate, sweep, OTel files, generate from Mooncake, the start barrier, concurrent runs
//! and signals. Each case is a probe's finding (a destroyed input, a panic, an abort, a hang,
//! a forged line) that now ends in one line and a documented exit status, or keeps the data.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{kvtrace, one_line_error, one_rank_replay, sample, scratch, text};
use serde_json::Value;

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A copy of `basic_lru` in `dir`.
fn trace_in(dir: &Path) -> PathBuf {
    let t = dir.join("t.lct");
    std::fs::copy(sample("basic_lru"), &t).expect("copy");
    t
}

/// `bad.lct` beside `trace`: its lossless JSONL with the header's first `from` replaced by
/// `to`, converted back.
fn forged_header(trace: &Path, from: &str, to: &str) -> PathBuf {
    let dir = trace.parent().expect("dir");
    let jsonl = dir.join("t.jsonl");
    let out = kvtrace(["convert", &path(trace), &path(&jsonl)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let text_form = std::fs::read_to_string(&jsonl).expect("read");
    assert!(text_form.contains(from), "{from}");
    std::fs::write(&jsonl, text_form.replacen(from, to, 1)).expect("write");
    let bad = dir.join("bad.lct");
    let out = kvtrace(["convert", &path(&jsonl), &path(&bad)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    bad
}

#[test]
fn no_output_flag_writes_over_an_input() {
    let dir = scratch();
    let t = trace_in(dir.path());
    let lct = std::fs::read(&t).expect("read");
    let link = dir.path().join("link.lct");
    std::os::unix::fs::symlink(&t, &link).expect("link");
    let m = dir.path().join("m.jsonl");
    std::fs::write(
        &m,
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":4,\"hash_ids\":[1,2]}\n",
    )
    .expect("write");
    let jsonl = std::fs::read(&m).expect("read");
    let (t, link, m) = (path(&t), path(&link), path(&m));
    let (json_t, xlsx_link) = (format!("--json={t}"), format!("--xlsx={link}"));
    let runs: Vec<Vec<&str>> = vec![
        vec!["replay", &t, "-q", "--otlp-file", &t],
        vec!["replay", &t, "-q", "--jsonl-out", &link],
        vec!["replay", &link, "-q", "--jsonl-out", &t],
        vec!["replay", &t, "-q", &json_t],
        vec!["replay", &t, "-q", &xlsx_link],
        vec!["sweep", "replay", &t, "-q", &json_t],
        vec!["sweep", "replay", &t, "-q", &xlsx_link],
        vec!["simulate", &m, "-q", "--report-json", &m],
        vec!["simulate", &m, "-q", "--report-jsonl", &m],
        vec!["simulate", &m, "-q", "--report-xlsx", &m],
        vec!["simulate", &m, "-q", "--otlp-file", &m],
        vec!["generate", &m, "--from-mooncake", &m],
    ];
    for args in runs {
        let err = one_line_error(&kvtrace(&args), 2);
        assert!(err.contains("same file"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(&t).expect("read"), lct, "the trace is intact");
    assert_eq!(
        std::fs::read(&m).expect("read"),
        jsonl,
        "the workload is intact"
    );
}

#[test]
fn aggregate_never_writes_over_a_rank_report() {
    let dir = scratch();
    let r0 = one_rank_replay(&trace_in(dir.path()), dir.path());
    let before = std::fs::read(&r0).expect("rank report");
    let flag = format!("--json={}", path(&r0));
    let err = one_line_error(&kvtrace(["aggregate", &path(&r0), &flag]), 2);
    assert!(err.contains("same file"), "{err}");
    assert_eq!(std::fs::read(&r0).expect("read"), before);
}

#[test]
fn gpu_bandwidths_a_duration_cannot_hold_are_refused_where_they_are_read() {
    let dir = scratch();
    let t = trace_in(dir.path());
    for bw in ["1e-300", "0", "-1"] {
        let adapter = format!("{{\"type\":\"gpu\",\"capacity_gb\":1,\"bandwidth_gbps\":{bw}}}");
        let out = kvtrace([
            "replay",
            &path(&t),
            "-q",
            "--no-csv",
            "--l2-adapter",
            &adapter,
        ]);
        let err = one_line_error(&out, 2);
        assert!(err.contains("bandwidth_gbps"), "{err}");
    }
    // The same value in a header is bad data.
    let bad = forged_header(
        &t,
        "\"sm_config_json\":\"{",
        "\"sm_config_json\":\"{\\\"kvtrace_l1_gpu_bandwidth_gbps\\\": 1e-300, ",
    );
    let out = kvtrace(["replay", &path(&bad), "-q", "--no-csv"]);
    let err = one_line_error(&out, 1);
    assert!(
        err.contains("bad.lct: byte 0: header.sm_config_json: kvtrace_l1_gpu_bandwidth_gbps"),
        "{err}"
    );
}

/// A long storage trace of kvtrace's synthetic workload.
fn long_trace(dir: &Path, records: u32) -> PathBuf {
    let t = dir.join("long.lct");
    let out = kvtrace(["generate", &path(&t), "--records", &records.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    t
}

fn terminated(args: &[&str], after: Duration) -> (std::process::Output, Duration) {
    let child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(after);
    let signalled = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().expect("wait");
    (out, signalled.elapsed())
}

#[test]
fn sigterm_during_info_says_the_counts_are_partial() {
    let dir = scratch();
    let t = long_trace(dir.path(), 3_000_000);
    let (out, _) = terminated(
        &["info", &path(&t), "--threads", "1"],
        Duration::from_millis(300),
    );
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert!(
        shown.contains("complete:                   unknown: interrupted"),
        "{shown}"
    );
    assert!(
        !shown.contains("complete:                   yes"),
        "{shown}"
    );
}

#[test]
fn sigterm_does_not_wait_for_an_endpoint_that_never_answers() {
    let dir = scratch();
    let t = long_trace(dir.path(), 400_000);
    // Accepts every connection and never answers one.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let spans = dir.path().join("spans.jsonl");
    let (out, waited) = terminated(
        &[
            "replay",
            &path(&t),
            "-q",
            "--no-csv",
            "--otlp-endpoint",
            &url,
            "--otlp-protocol",
            "http-protobuf",
            "--otlp-timeout",
            "60",
            "--otlp-file",
            &path(&spans),
        ],
        Duration::from_millis(1500),
    );
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert!(waited < Duration::from_secs(3), "exit took {waited:?}");
}

#[test]
fn a_failed_run_leaves_no_otlp_file_and_the_old_one_stands() {
    let dir = scratch();
    let spans = dir.path().join("spans.jsonl");
    std::fs::write(&spans, "earlier spans\n").expect("write");
    let missing = dir.path().join("missing.lct");
    let out = kvtrace([
        "replay",
        &path(&missing),
        "-q",
        "--otlp-file",
        &path(&spans),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&spans).expect("read"),
        "earlier spans\n"
    );
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
}

/// A rank report to forge, from a one-rank replay of `basic_lru`.
fn rank_report(dir: &Path) -> Value {
    let report = one_rank_replay(&trace_in(dir), &dir.join("run"));
    serde_json::from_str(&std::fs::read_to_string(report).expect("report")).expect("json")
}

#[test]
fn aggregate_refuses_forged_counts_and_world_sizes_in_one_line() {
    let dir = scratch();
    let good = rank_report(dir.path());
    let write = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        edit(&mut v);
        let p = dir.path().join(name);
        std::fs::write(&p, v.to_string()).expect("write");
        path(&p)
    };
    let two = |v: &mut Value, rank: u64| {
        v["kvtrace"]["rank"]["world_size"] = 2.into();
        v["kvtrace"]["rank"]["rank"] = rank.into();
    };
    let huge0 = write("huge0.json", &|v| {
        two(v, 0);
        v["kvtrace"]["replayed"] = u64::MAX.into();
    });
    let five1 = write("five1.json", &|v| {
        two(v, 1);
        v["kvtrace"]["replayed"] = 5.into();
    });
    let negative = write("negative.json", &|v| {
        v["kvtrace"]["calls"]["lookup"] = (-3).into()
    });
    let zero = write("zero.json", &|v| {
        v["kvtrace"]["rank"]["world_size"] = 0.into()
    });
    let forged = write("forged.json", &|v| {
        v["kvtrace"]["rank"]["world_size"] = 100_000_000u64.into();
        v["kvtrace"]["rank"]["rank"] = 5.into();
    });
    for (files, code, says) in [
        (vec![&huge0, &five1], 1, "passes 2^64 - 1"),
        (
            vec![&negative],
            1,
            "kvtrace.calls.lookup is -3, not a count",
        ),
        (vec![&zero], 1, "world_size is 0"),
        (
            vec![&forged],
            2,
            "rank(s) 0-4, 6-99999999 of 100000000 missing (99999999 in all)",
        ),
    ] {
        let mut args = vec!["aggregate", "-q"];
        args.extend(files.iter().map(|f| f.as_str()));
        let began = Instant::now();
        let err = one_line_error(&kvtrace(&args), code);
        assert!(err.contains(says), "{files:?}: {err}");
        assert!(began.elapsed() < Duration::from_secs(10));
    }
}

#[test]
fn aggregate_says_why_calls_failed_and_names_the_cluster() {
    let dir = scratch();
    let good = rank_report(dir.path());
    let why = "tier I/O failed: resp-cluster redis://10.0.0.1:7000: SET of N object(s): refused";
    let rank = |r: u64, failures: Value| {
        let mut v = good.clone();
        v["kvtrace"]["rank"]["world_size"] = 2.into();
        v["kvtrace"]["rank"]["rank"] = r.into();
        let failed: u64 = failures
            .as_object()
            .expect("map")
            .values()
            .map(|n| n.as_u64().expect("count"))
            .sum();
        v["kvtrace"]["failed"] = failed.into();
        v["kvtrace"]["failure_reasons"] = failures;
        let p = dir.path().join(format!("r{r}.json"));
        std::fs::write(&p, v.to_string()).expect("write");
        path(&p)
    };
    let r0 = rank(0, serde_json::json!({ why: 2 }));
    let r1 = rank(1, serde_json::json!({ why: 1, "failed to read": 1 }));
    let out = kvtrace(["aggregate", &r0, &r1]);
    // Failed calls make the run's status 1, as replay's.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains(&format!(
            "4 call(s) failed: 1 × failed to read; 3 × {why}\n"
        )),
        "{shown}"
    );
}

#[test]
fn aggregate_merges_many_tiers_in_linear_time() {
    let dir = scratch();
    let mut v = rank_report(dir.path());
    let tiers: Vec<Value> = (0..100_000)
        .map(|i| serde_json::json!({"name": format!("tier-{i}"), "reads": 1}))
        .collect();
    v["kvtrace"]["tiers"] = tiers.into();
    let p = dir.path().join("tiers.json");
    std::fs::write(&p, v.to_string()).expect("write");
    let began = Instant::now();
    let out = kvtrace(["aggregate", "-q", &path(&p)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
}

#[test]
fn concurrent_runs_into_one_directory_do_not_mix_their_reports() {
    let dir = scratch();
    let t = trace_in(dir.path());
    let shared = dir.path().join("shared");
    let lock = std::fs::create_dir_all(&shared).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(shared.join(".kvtrace.lock"))
    });
    let lock = lock.expect("lock file");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&lock);
    // SAFETY: flock on a descriptor this test owns: another run holding the directory.
    let held = unsafe { libc::flock(fd, libc::LOCK_EX) };
    assert_eq!(held, 0);
    let out = kvtrace(["replay", &path(&t), "-q", "--output-dir", &path(&shared)]);
    let err = one_line_error(&out, 2);
    assert!(
        err.contains("another kvtrace run is writing its reports here"),
        "{err}"
    );
    drop(lock);
    let out = kvtrace([
        "replay",
        &path(&t),
        "-q",
        "--json",
        "--output-dir",
        &path(&shared),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(shared.join("trace_replay_summary.json").is_file());
}

#[test]
fn what_a_killed_run_left_is_removed_by_the_next_and_named_by_info() {
    let dir = scratch();
    let t = trace_in(dir.path());
    // A process id no process has: above the kernel's largest.
    let left = dir.path().join(".out.lct.kvtrace-4194304999-0.tmp");
    std::fs::copy(&t, &left).expect("copy");
    let info = kvtrace(["info", &path(&left)]);
    let shown = text(&info.stdout);
    assert!(
        shown.contains("complete:                   no (no trailer)"),
        "{shown}"
    );
    let out = kvtrace(["convert", &path(&t), &path(&dir.path().join("out.lct"))]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!left.exists(), "the dead run's temporary file is gone");
    assert!(
        text(&out.stderr).contains("no longer running"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn rows_and_lines_past_their_limits_are_one_line_errors() {
    let dir = scratch();
    let m = dir.path().join("big.jsonl");
    let ids: Vec<String> = (0..100_001).map(|i| i.to_string()).collect();
    std::fs::write(
        &m,
        format!(
            "{{\"timestamp\":0,\"input_length\":10,\"output_length\":1,\"hash_ids\":[{}]}}\n",
            ids.join(",")
        ),
    )
    .expect("write");
    let out = kvtrace([
        "generate",
        &path(&dir.path().join("o.lct")),
        "--from-mooncake",
        &path(&m),
    ]);
    let err = one_line_error(&out, 1);
    assert!(err.contains("line 1: hash_ids: 100001 ids"), "{err}");
    let out = kvtrace([
        "bench",
        "--use-burst-trace",
        "--burst-trace-path",
        "/dev/zero",
        "--duration",
        "1",
    ]);
    let err = one_line_error(&out, 1);
    assert!(
        err.contains("line 1 is longer than 16777216 bytes"),
        "{err}"
    );
}

#[test]
fn strings_from_a_trace_reach_the_terminal_escaped() {
    let dir = scratch();
    let t = trace_in(dir.path());
    let bad = forged_header(
        &t,
        "\"sm_config_digest\":\"",
        "\"sm_config_digest\":\"\\u001b[2J\\nkvtrace: error: forged",
    );
    let info = kvtrace(["info", &path(&bad)]);
    let shown = text(&info.stdout);
    assert!(!shown.contains('\u{1b}'), "{shown}");
    assert!(
        !shown.lines().any(|l| l.starts_with("kvtrace: error")),
        "{shown}"
    );
    assert!(
        shown.contains("\\u{1b}[2J\\nkvtrace: error: forged"),
        "{shown}"
    );
}

#[test]
fn sweeps_past_the_point_cap_are_refused_before_any_runs() {
    let dir = scratch();
    let t = trace_in(dir.path());
    let sizes: Vec<String> = (1..=1000).map(|i| i.to_string()).collect();
    let sizes = sizes.join(",");
    let began = Instant::now();
    let out = kvtrace([
        "sweep",
        "replay",
        &path(&t),
        "-q",
        "--l1-size-gb",
        &sizes,
        "--eviction-phase",
        "0,1,2,3,4,5,6,7,8,9,10",
    ]);
    let err = one_line_error(&out, 2);
    assert!(err.contains("11000 points: more than the 10000"), "{err}");
    assert!(began.elapsed() < Duration::from_secs(10));
    let out = kvtrace([
        "sweep",
        "replay",
        &path(&t),
        "-q",
        "--l1-size-gb",
        "1,2",
        "--max-points",
        "1",
    ]);
    let err = one_line_error(&out, 2);
    assert!(err.contains("2 points: more than the 1"), "{err}");
}

/// The frames of an uncompressed LMCT file: (offset, length with its prefix).
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at + 4 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        out.push((at, 4 + len));
        at += 4 + len;
    }
    assert_eq!(at, bytes.len(), "whole frames");
    out
}

#[test]
fn a_recording_cut_at_a_frame_boundary_does_not_read_complete() {
    let dir = scratch();
    let lct = dir.path().join("rec.lct");
    let out = kvtrace([
        "simulate",
        &path(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/mooncake/conversation_head300.jsonl"),
        ),
        "--l1-size-gb",
        "1",
        "--record",
        &path(&lct),
        "-q",
        "--report-json",
        &path(&dir.path().join("r.json")),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let whole = text(&kvtrace(["info", &path(&lct)]).stdout);
    assert!(whole.contains("complete:                   yes"), "{whole}");

    let bytes = std::fs::read(&lct).expect("read");
    let frames = frames(&bytes);
    assert!(frames.len() > 3, "a header, records and a trailer");
    // Cut before the trailer, and again in the middle of the records.
    for keep in [frames.len() - 1, frames.len() / 2] {
        let (at, _) = frames[keep];
        let cut = dir.path().join(format!("cut-{keep}.lct"));
        std::fs::write(&cut, &bytes[..at]).expect("write");
        let info = kvtrace(["info", &path(&cut)]);
        let shown = text(&info.stdout);
        assert_eq!(info.status.code(), Some(0), "{}", text(&info.stderr));
        assert!(
            shown.contains(
                "complete:                   no (no trailer): a kvtrace recording cut short"
            ),
            "{shown}"
        );
    }
}

#[test]
fn a_refused_replay_leaves_no_directory_behind() {
    let dir = scratch();
    let t = path(&sample("basic_lru"));
    let out = dir.path().join("out/run");
    for extra in [
        vec![t.as_str(), "--rank", "0", "--world-size", "3"],
        vec!["--rank", "0", "--world-size", "2", "--run-id", "../x"],
        vec!["--shard", "by-key"],
    ] {
        let mut args = vec![
            "replay",
            t.as_str(),
            "-q",
            "--output-dir",
            out.to_str().expect("path"),
        ];
        args.extend(extra);
        one_line_error(&kvtrace(&args), 2);
        assert!(
            !dir.path().join("out").exists(),
            "{args:?} left its output directory"
        );
    }
}

#[test]
fn made_up_qualnames_cannot_grow_a_report() {
    let dir = scratch();
    let jsonl = dir.path().join("t.jsonl");
    let out = kvtrace(["convert", &path(&sample("basic_lru")), &path(&jsonl)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut text_form = std::fs::read_to_string(&jsonl).expect("read");
    for i in 0..100 {
        text_form.push_str(&format!(
            "{{\"type\":\"record\",\"t_mono\":99.0,\"t_wall\":1795297200.0,\"qualname\":\"made.up.q{i}\",\"args\":{{}}}}\n"
        ));
    }
    std::fs::write(&jsonl, text_form).expect("write");
    let lct = dir.path().join("t.lct");
    let out = kvtrace(["convert", &path(&jsonl), &path(&lct)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run = dir.path().join("run");
    let out = kvtrace([
        "replay",
        &path(&lct),
        "-q",
        "--json",
        "--no-csv",
        "--output-dir",
        &path(&run),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("trace_replay_summary.json")).expect("report"),
    )
    .expect("json");
    let reasons = summary["kvtrace"]["skip_reasons"]
        .as_object()
        .expect("skip reasons");
    assert_eq!(reasons.len(), 33, "{reasons:?}");
    let counted: u64 = reasons.values().map(|n| n.as_u64().expect("count")).sum();
    assert_eq!(
        counted,
        summary["kvtrace"]["skipped"].as_u64().expect("skipped")
    );
    assert!(reasons["other reasons"].as_u64().expect("count") >= 68);
}

#[test]
fn what_a_killed_bench_left_is_removed_by_the_next_and_a_live_ones_is_kept() {
    let dir = scratch();
    let cache = dir.path().join("cache");
    // A process id no process has (above the kernel's largest), and this test's own.
    let dead = cache.join("kvtrace-bench-4194304999-cache");
    let live = cache.join(format!("kvtrace-bench-{}-cache", std::process::id()));
    for d in [&dead, &live] {
        std::fs::create_dir_all(d).expect("mkdir");
        std::fs::write(d.join("entry.kv"), b"kv").expect("write");
    }
    let mut args = crate::util::TINY_BENCH.to_vec();
    args.extend([
        "--duration",
        "1",
        "--cache-dir",
        cache.to_str().expect("path"),
    ]);
    let output = dir.path().join("r.json");
    args.extend(["--output", output.to_str().expect("path")]);
    let out = kvtrace(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!dead.exists(), "the dead run's directory is gone");
    assert!(
        live.join("entry.kv").exists(),
        "a running process's is kept"
    );
    assert!(
        err.contains("left by kvtrace bench process 4194304999, which is no longer running"),
        "{err}"
    );
}

/// A synthetic workload or a pool too large for the machine is one line before any work (it
/// was an allocation failure's abort, or the kernel's kill, minutes in); engine arguments
/// that can never schedule anything are refused; a run that could not serve every request
/// says so.
#[test]
fn simulations_that_cannot_run_or_serve_say_so_in_one_line() {
    let dir = scratch();
    let report = path(&dir.path().join("r.json"));
    let synthetic = |extra: &[&str]| {
        let mut argv = vec![
            "simulate",
            "--output-tokens",
            "20",
            "--replay-concurrency",
            "2",
            "-q",
            "--report-json",
            &report,
        ];
        argv.extend_from_slice(extra);
        for (flag, default) in [("--request-count", "4"), ("--input-tokens", "1000")] {
            if !argv.contains(&flag) {
                argv.extend([flag, default]);
            }
        }
        kvtrace(&argv)
    };
    for (extra, needle) in [
        (
            &["--request-count", "4294967295"][..],
            "--request-count 4294967295",
        ),
        (&["--num-workers", "4294967295"], "4294967295 engines"),
        (
            &["--num-workers", "50000", "--replay-mode", "online"],
            "50000 workers, at most 4096",
        ),
        (
            &["--extra-engine-args", r#"{"max_num_seqs":0}"#],
            "max_num_seqs 0",
        ),
        (
            &["--extra-engine-args", r#"{"num_gpu_blocks":0}"#],
            "num_gpu_blocks 0",
        ),
        (
            &["--extra-engine-args", r#"{"max_num_batched_tokens":0}"#],
            "max_num_batched_tokens 0",
        ),
    ] {
        let err = one_line_error(&synthetic(extra), 2);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    // 1,000 tokens in 64-token blocks need 16 blocks; an engine of one holds none of them, so
    // no synthetic request (all of one length) could be served. With four billion tokens
    // that took minutes and 15 GB of prompts before the run rejected them all.
    for tokens in ["1000", "4000000000"] {
        let mut argv = vec!["--extra-engine-args", r#"{"num_gpu_blocks":1}"#];
        argv.extend(["--input-tokens", tokens]);
        let err = one_line_error(&synthetic(&argv), 2);
        let needle = format!("--input-tokens {tokens}: more than the 64 tokens of KV cache");
        assert!(err.contains(&needle), "{err}");
    }
    // In a trace, a prompt of 40 blocks is rejected by engines of 20, the one of 2 is served.
    let trace = dir.path().join("two.jsonl");
    let row = |t: u32, blocks: u64| {
        let ids: Vec<u64> = (0..blocks).collect();
        format!(
            r#"{{"timestamp": {t}, "input_length": {}, "output_length": 4, "hash_ids": {ids:?}}}"#,
            blocks * 512
        )
    };
    std::fs::write(&trace, format!("{}\n{}\n", row(0, 40), row(10, 2))).unwrap();
    let out = kvtrace([
        "simulate",
        &path(&trace),
        "--extra-engine-args",
        r#"{"num_gpu_blocks":20}"#,
        "-q",
        "--report-json",
        &report,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).trim(),
        "kvtrace: warning: 1 of 2 requests were rejected: each needs more KV blocks than an engine holds (num_gpu_blocks × block_size tokens) or has a prompt of max_model_len tokens or more"
    );
    let out = synthetic(&[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

/// Counts whose whole is started or allocated up front are bounded: more decoding threads
/// than a process may start was a panic at the refused spawn, four billion conversations an
/// allocation failure's abort.
#[test]
fn counts_held_from_the_start_are_bounded_in_one_line() {
    let dir = scratch();
    let trace = path(&sample("basic_lru"));
    let err = one_line_error(&kvtrace(["info", &trace, "--threads", "100000"]), 2);
    assert!(err.contains("0..=1024"), "{err}");
    let out = kvtrace(["info", &trace, "--threads", "1024"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let generated = path(&dir.path().join("g.lct"));
    let err = one_line_error(
        &kvtrace(["generate", "--conversations", "4294967295", &generated]),
        2,
    );
    assert!(err.contains("--conversations"), "{err}");
}
