//! Hostile and unlucky inputs: each case a probe once found (a panic, a destroyed input, a
//! hang, a path or server chosen by a trace, an unbounded allocation, an interrupt that lost
//! the run) now ends in one line and a documented exit status, or keeps the data.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{kvtrace, one_line_error, repo, sample, scratch, shared, text};

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A copy of `basic_lru` as lossless JSONL lines, to mutate.
fn jsonl_lines(dir: &Path) -> Vec<String> {
    let jsonl = dir.join("t.jsonl");
    let out = kvtrace(["convert", &path(&sample("basic_lru")), &path(&jsonl)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::read_to_string(&jsonl)
        .expect("jsonl")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Writes `lines` and converts them to `name.lct`.
fn lct_from(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let jsonl = dir.join(format!("{name}.jsonl"));
    std::fs::write(&jsonl, lines.join("\n") + "\n").expect("write");
    let lct = dir.join(format!("{name}.lct"));
    let out = kvtrace(["convert", &path(&jsonl), &path(&lct)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    lct
}

fn with_t_mono(line: &str, value: &str) -> String {
    let at = line.find("\"t_mono\":").expect("t_mono");
    let end = at + line[at..].find(",\"t_wall\"").expect("t_wall");
    format!("{}\"t_mono\":{value}{}", &line[..at], &line[end..])
}

#[test]
fn a_prompt_of_zero_tokens_is_a_one_line_error() {
    let dir = scratch();
    for (row, field) in [
        (
            r#"{"timestamp":0,"output_length":10,"hash_ids":[]}"#,
            "hash_ids",
        ),
        (
            r#"{"timestamp":0,"input_length":0,"output_length":10,"hash_ids":[1]}"#,
            "input_length",
        ),
    ] {
        let trace = dir.path().join("t.jsonl");
        std::fs::write(&trace, format!("{row}\n")).expect("write");
        let out = kvtrace(["simulate", &path(&trace), "-q"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "line 1: {field}: a request needs at least one prompt token"
            )),
            "{err}"
        );
    }
}

/// A plan or a sweep of a trace cut short (LMCache's own, a frame cut at byte 29,472)
/// replays the records before the cut and says so once, on stderr and in its JSON, as a
/// replay does; so do an events trace's replay, plan and sweep. They ran it silently.
#[test]
fn a_plan_a_sweep_and_an_events_replay_of_a_truncated_trace_say_so_once() {
    let dir = scratch();
    // `command` of `trace` exits 0 and says `cut` once on stderr and once among its JSON's
    // `warnings` (beside which the plan and the sweep may say that LMCache's controller
    // never ran at their smallest sizes: the trace spans less than a second).
    let says_once = |command: &[&str], trace: &str, cut: &str| {
        let json = dir.path().join("report.json");
        let mut args: Vec<String> = command.iter().map(|a| a.to_string()).collect();
        args.extend([
            trace.to_owned(),
            "-q".into(),
            format!("--json={}", path(&json)),
        ]);
        let out = kvtrace(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert_eq!(err.matches(cut).count(), 1, "{args:?}: {err}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("JSON");
        let said = report["warnings"].as_array().expect("warnings");
        let cuts = said
            .iter()
            .filter(|w| w.as_str().expect("text").starts_with(cut))
            .count();
        assert_eq!(cuts, 1, "{args:?}: {said:?}");
    };
    let trace = path(&sample("basic_lru.truncated"));
    for command in [
        vec!["plan", "--size-gb", "0.01"],
        vec!["sweep", "replay", "--l1-size-gb", "0.01,0.1"],
    ] {
        says_once(&command, &trace, "truncated frame at byte 29472");
    }
    // A whole trace has no such warning.
    let json = dir.path().join("whole.json");
    let whole = path(&sample("basic_lru"));
    let json_flag = format!("--json={}", path(&json));
    let out = kvtrace(["plan", &whole, "-q", &json_flag, "--size-gb", "0.01"]);
    let err = text(&out.stderr);
    assert!(out.status.success() && !err.contains("truncated"), "{err}");
    // An events-level trace cut at two thirds: its replay, plan and sweep say so too.
    let Some(shared) = shared() else { return };
    let events = std::fs::read(shared.join("lmcache/events_churn.lct")).expect("events trace");
    let cut = dir.path().join("events_cut.lct");
    std::fs::write(&cut, &events[..events.len() * 2 / 3]).expect("write");
    for command in [
        vec!["replay", "--no-csv"],
        vec!["plan", "--size-gb", "0.01"],
        vec!["sweep", "replay", "--l1-size-gb", "0.01,0.1"],
    ] {
        says_once(&command, &path(&cut), "truncated frame at byte");
    }
}

#[test]
fn convert_never_writes_over_its_input() {
    let dir = scratch();
    let a = dir.path().join("a.lct");
    std::fs::copy(sample("basic_lru"), &a).expect("copy");
    let before = std::fs::read(&a).expect("read");
    let b = dir.path().join("b.lct");
    std::fs::hard_link(&a, &b).expect("link");
    let out = kvtrace(["convert", &path(&a), &path(&b)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("same file"));
    let stdin = std::fs::File::open(&a).expect("open");
    let out = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(["convert", "-", &path(&a)])
        .stdin(stdin)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(&a).expect("read"),
        before,
        "the input is intact"
    );
}

#[test]
fn an_output_symlink_is_replaced_not_followed() {
    let dir = scratch();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "keep").expect("write");
    let link = dir.path().join("out.jsonl");
    std::os::unix::fs::symlink(&precious, &link).expect("link");
    let out = kvtrace(["convert", &path(&sample("basic_lru")), &path(&link)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&precious).expect("read"), "keep");
    assert!(!std::fs::symlink_metadata(&link).expect("m").is_symlink());
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
    assert_eq!(names.len(), 2, "no temporary file is left behind");
}

/// `--report-json /dev/stdout`, a FIFO, `/dev/null`: written into, never renamed over (which
/// put a plain file where the device or its link was, as root in `/dev` too); `/dev/full`
/// is an error naming the output.
#[test]
fn a_device_or_a_pipe_as_the_output_is_written_into_not_replaced() {
    let dir = scratch();
    let null = dir.path().join("null.jsonl");
    std::os::unix::fs::symlink("/dev/null", &null).expect("link");
    let out = kvtrace(["convert", &path(&sample("basic_lru")), &path(&null)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(std::fs::symlink_metadata(&null).expect("m").is_symlink());
    // Standard output a pipe, as a script's `| jq` has it, through a link of the scratch
    // directory's (`/dev/stdout` is one too) so that a regression replaces only that.
    let stdout = dir.path().join("stdout.json");
    std::os::unix::fs::symlink("/proc/self/fd/1", &stdout).expect("link");
    let simulate = [
        "simulate".to_string(),
        repo("testdata/traces/weka_sample.jsonl"),
        "--trace-format".into(),
        "weka".into(),
        "-q".into(),
        "--report-json".into(),
        path(&stdout),
    ];
    let out = kvtrace(&simulate);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the report");
    assert_eq!(report["num_requests"], 17);
    // Standard output redirected to a file (`> out.json`): a regular file behind the link,
    // written into all the same.
    let redirected = dir.path().join("out.json");
    let status = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(&simulate)
        .stdout(std::fs::File::create(&redirected).expect("create"))
        .status()
        .expect("run");
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&redirected).expect("read");
    let report: serde_json::Value = serde_json::from_str(&text).expect("the report");
    assert_eq!(report["num_requests"], 17);
    assert!(std::fs::symlink_metadata(&stdout).expect("m").is_symlink());
    let mut links = 3;
    if Path::new("/dev/full").exists() {
        links += 1;
        let full = dir.path().join("full.lct");
        std::os::unix::fs::symlink("/dev/full", &full).expect("link");
        let err = one_line_error(
            &kvtrace(["convert", &path(&sample("basic_lru")), &path(&full)]),
            1,
        );
        assert!(
            err.contains("full.lct") && err.contains("No space left"),
            "{err}"
        );
        assert!(std::fs::symlink_metadata(&full).expect("m").is_symlink());
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        links,
        "no temporary file is left behind"
    );
}

/// An output directory that is a file or a device is one line that says so, and the file is
/// left as it was (the system's answer was "File exists").
#[test]
fn an_output_directory_that_is_a_file_says_so() {
    let dir = scratch();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "kept").expect("write");
    let null = dir.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &null).expect("link");
    let trace = path(&sample("basic_lru"));
    for target in [&file, &null] {
        let shown = path(target);
        for argv in [
            vec!["replay", trace.as_str(), "--output-dir", &shown, "-q"],
            vec!["man", &shown],
        ] {
            let err = one_line_error(&kvtrace(&argv), 1);
            assert_eq!(
                err,
                format!("kvtrace: error: {shown}: cannot create: not a directory\n"),
                "{argv:?}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "kept");
    assert!(std::fs::symlink_metadata(&null).expect("m").is_symlink());
}

#[test]
fn absurd_record_times_neither_hang_nor_pass_silently() {
    let dir = scratch();
    let lines = jsonl_lines(dir.path());
    for value in ["1e19", "1.7e308"] {
        let mut mutated = lines.clone();
        mutated[5] = with_t_mono(&mutated[5], value);
        let lct = lct_from(dir.path(), "far", &mutated);
        let began = Instant::now();
        let out = kvtrace(["replay", &path(&lct), "-q", "--no-csv"]);
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{}",
            text(&out.stderr)
        );
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "{value} must not hang"
        );
    }
    let mut mutated = lines.clone();
    mutated[5] = with_t_mono(&mutated[5], r#"{"$f64":"inf"}"#);
    let lct = lct_from(dir.path(), "inf", &mutated);
    let out = kvtrace(["replay", &path(&lct), "-q", "--no-csv"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("t_mono: inf is not a time"), "{err}");
    assert!(err.contains("byte "), "names the offset: {err}");
}

#[test]
fn a_recorded_fs_tier_is_not_rebuilt_from_the_header() {
    let dir = scratch();
    let kv_dir = dir.path().join("recorded-tier");
    let trace = dir.path().join("t.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\":0,\"input_length\":1024,\"output_length\":4,\"hash_ids\":[1,2]}\n\
         {\"timestamp\":10,\"input_length\":1024,\"output_length\":4,\"hash_ids\":[1,2]}\n",
    )
    .expect("write");
    let lct = dir.path().join("t.lct");
    let adapter = format!("{{\"type\":\"fs\",\"path\":\"{}\"}}", path(&kv_dir));
    let out = kvtrace([
        "simulate",
        &path(&trace),
        "--l1-size-gb",
        "1",
        "--l2-adapter",
        &adapter,
        "--record",
        &path(&lct),
        "-q",
        "--report-json",
        &path(&dir.path().join("r.json")),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&kv_dir).expect("remove the tier");
    let out = kvtrace([
        "replay",
        &path(&lct),
        "-q",
        "--output-dir",
        &path(&dir.path().join("out")),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!kv_dir.exists(), "the header's path is never created");
    assert!(err.contains("was not rebuilt"), "{err}");
    assert!(err.contains(&path(&kv_dir)), "says which: {err}");
}

#[test]
fn a_frame_of_millions_of_items_is_refused_without_allocating_for_them() {
    let dir = scratch();
    let base = std::fs::read(sample("basic_lru")).expect("read");
    let header_len = u32::from_be_bytes(base[..4].try_into().expect("len")) as usize;
    let mut body = vec![0x85];
    let s = |b: &mut Vec<u8>, t: &str| {
        b.push(0xd9);
        b.push(t.len() as u8);
        b.extend_from_slice(t.as_bytes());
    };
    for (k, v) in [
        ("type", "record"),
        ("qualname", "lmcache.x.StorageManager.finish_write"),
    ] {
        s(&mut body, k);
        s(&mut body, v);
    }
    for k in ["t_mono", "t_wall"] {
        s(&mut body, k);
        body.push(0xcb);
        body.extend_from_slice(&1.0f64.to_be_bytes());
    }
    s(&mut body, "args");
    body.push(0x81);
    s(&mut body, "keys");
    let items: u32 = 8 << 20;
    body.push(0xdd);
    body.extend_from_slice(&items.to_be_bytes());
    body.resize(body.len() + items as usize, 0xc0);
    let mut file = base[..4 + header_len].to_vec();
    file.extend_from_slice(&(body.len() as u32).to_be_bytes());
    file.extend_from_slice(&body);
    let lct = dir.path().join("big.lct");
    std::fs::write(&lct, file).expect("write");
    for command in ["info", "dump"] {
        let out = kvtrace([command, &path(&lct)]);
        let err = text(&out.stderr);
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{command}: {err}"
        );
        assert!(err.contains("more than 4194304 items"), "{command}: {err}");
    }
}

#[test]
fn deep_values_round_trip_through_jsonl_and_oversized_frames_are_refused() {
    let dir = scratch();
    let mut lines = jsonl_lines(dir.path());
    // A record whose args nest 120 arrays deep: msgpack allows it, lossless JSON doubles it.
    let deep = format!(
        "{}1{}",
        "{\"$enc\":\"array16\",\"v\":[".repeat(60) + &"[".repeat(60),
        "]".repeat(60) + &"]}".repeat(60)
    );
    let at = lines[3].find("\"args\":").expect("args");
    lines[3] = format!("{}\"args\":{{\"deep\":{deep}}}}}", &lines[3][..at]);
    let lct = lct_from(dir.path(), "deep", &lines);
    let back = dir.path().join("back.jsonl");
    let out = kvtrace(["convert", &path(&lct), &path(&back)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let again = dir.path().join("again.lct");
    let out = kvtrace(["convert", &path(&back), &path(&again)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(&lct).expect("a"),
        std::fs::read(&again).expect("b")
    );

    let mut too_deep = jsonl_lines(dir.path());
    too_deep[3] = format!("{}1{}", "[".repeat(600), "]".repeat(600));
    let jsonl = dir.path().join("too_deep.jsonl");
    std::fs::write(&jsonl, too_deep.join("\n") + "\n").expect("write");
    let out = kvtrace(["convert", &path(&jsonl), &path(&dir.path().join("d.lct"))]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("line 4: json: nested 600 levels deep"),
        "{err}"
    );

    let big = format!("{{\"$frame_hex\":\"{}\"}}", "00".repeat(2 << 20));
    let mut oversized = jsonl_lines(dir.path());
    oversized.insert(2, big);
    let jsonl = dir.path().join("big.jsonl");
    std::fs::write(&jsonl, oversized.join("\n") + "\n").expect("write");
    let out = kvtrace([
        "convert",
        &path(&jsonl),
        &path(&dir.path().join("big.lct")),
        "--max-frame-bytes",
        "1048576",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("line 3: frame:"), "{err}");
}

/// A JSONL line is read into memory whole, so one with no end (a stream of bytes without a
/// newline) grew until the process was killed: a line may be 16 times the frame limit long,
/// and the frames before a longer one are kept as a bad line's are.
#[test]
fn a_jsonl_line_without_end_is_refused_at_its_limit() {
    let dir = scratch();
    let lines = jsonl_lines(dir.path());
    let endless = format!("{{\"a\":\"{}", "a".repeat(8 << 20));
    let jsonl = dir.path().join("endless.jsonl");
    std::fs::write(&jsonl, lines[..3].join("\n") + "\n" + &endless).expect("write");
    let cut = dir.path().join("cut.lct");
    let out = kvtrace([
        "convert",
        &path(&jsonl),
        &path(&cut),
        "--max-frame-bytes",
        "65536",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("line 4: frame: a line over 1048576 bytes"),
        "{err}"
    );
    let before = lct_from(dir.path(), "before", &lines[..3]);
    assert_eq!(
        std::fs::read(&cut).expect("cut"),
        std::fs::read(&before).expect("before")
    );
}

#[test]
fn a_fifo_is_replayed_once_read() {
    let dir = scratch();
    let fifo = dir.path().join("trace.fifo");
    let c = std::ffi::CString::new(path(&fifo)).expect("c");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let source = sample("basic_lru");
    let fifo_w = fifo.clone();
    let writer = std::thread::spawn(move || std::fs::copy(source, fifo_w));
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(["replay", &path(&fifo), "-q", "--no-csv"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let began = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if began.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("replay of a FIFO hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    writer.join().expect("writer").expect("copy");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn sigterm_during_a_recorded_simulation_keeps_a_whole_trace_and_the_reports() {
    let dir = scratch();
    let trace = dir.path().join("t.jsonl");
    // A long open-loop workload: far more than the second it is given.
    let rows: String = (0..200_000)
        .map(|i| {
            format!(
                "{{\"timestamp\":{},\"input_length\":2048,\"output_length\":64,\"hash_ids\":[{},{},{},{}]}}\n",
                i * 5,
                i % 97,
                i % 89 + 100,
                i + 1000,
                i + 500_000
            )
        })
        .collect();
    std::fs::write(&trace, rows).expect("write");
    let (lct, report) = (dir.path().join("s.lct"), dir.path().join("r.json"));
    let child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args([
            "simulate",
            &path(&trace),
            "--l1-size-gb",
            "1",
            "--record",
            &path(&lct),
            "--report-json",
            &path(&report),
            "-q",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("json");
    assert_eq!(report["interrupted"], true);
    let info = kvtrace(["info", &path(&lct)]);
    let shown = text(&info.stdout);
    assert_eq!(info.status.code(), Some(0), "{}", text(&info.stderr));
    assert!(shown.contains("complete:                   yes"), "{shown}");
    assert!(shown.contains("recorder trailer"), "{shown}");
}

#[test]
fn sigint_during_a_recorded_bench_keeps_its_reports_and_removes_its_cache() {
    let dir = scratch();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("cache");
    let (lct, report) = (dir.path().join("b.lct"), dir.path().join("b.json"));
    let child = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args([
            "bench",
            "--model",
            "tiny-1b",
            "--num-users",
            "8",
            "--duration",
            "60",
            "--cpu-mem-gb",
            "0.05",
            "--cache-dir",
            &path(&cache),
            "--cpu-tier-dir",
            &path(&cache),
            "--record",
            &path(&lct),
            "--output",
            &path(&report),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let began = Instant::now();
    let out = child.wait_with_output().expect("wait");
    assert!(began.elapsed() < Duration::from_secs(30), "stops promptly");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("json");
    assert_eq!(report["kvtrace"]["interrupted"], true);
    assert!(
        text(&out.stdout).contains("stopped by a signal: partial results"),
        "{}",
        text(&out.stdout)
    );
    let info = kvtrace(["info", &path(&lct)]);
    assert!(
        text(&info.stdout).contains("recorder trailer"),
        "{}",
        text(&info.stdout)
    );
    let left: Vec<_> = std::fs::read_dir(&cache).expect("cache").collect();
    assert!(
        left.is_empty(),
        "the run's cache directories are removed: {left:?}"
    );
}

/// `kvtrace ARGS` with every file it writes limited to `limit` bytes (RLIMIT_FSIZE, with
/// SIGXFSZ ignored): a write past it fails as a write to a full disk does.
fn kvtrace_with_file_limit(limit: u64, args: &[String]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvtrace"));
    command.args(args);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.output().expect("run kvtrace")
}

#[test]
fn a_full_disk_names_the_output_leaves_nothing_half_written_and_fails() {
    let dir = scratch();
    let s = |p: &Path| path(p);
    let jsonl = dir.path().join("out.jsonl");
    let out = kvtrace_with_file_limit(
        16 << 10,
        &["convert".into(), s(&sample("basic_lru")), s(&jsonl)],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}: cannot", s(&jsonl))),
        "names the output: {err}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "nothing left"
    );

    let tier = dir.path().join("tier");
    let adapter = format!("{{\"type\":\"fs\",\"path\":\"{}\"}}", s(&tier));
    let out = kvtrace_with_file_limit(
        64 << 10,
        &[
            "replay".into(),
            s(&sample("basic_lru")),
            "--l2-adapter".into(),
            adapter,
            "-q".into(),
            "--no-csv".into(),
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("call(s) failed"), "said even with -q: {err}");
    let partial = walk(&tier)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "kv"));
    assert_eq!(partial.count(), 0, "no partial object is left in the tier");

    let report = dir.path().join("b.json");
    let out = kvtrace_with_file_limit(
        64 << 10,
        &[
            "bench".into(),
            "--model".into(),
            "tiny-1b".into(),
            "--num-users".into(),
            "4".into(),
            "--duration".into(),
            "2".into(),
            "--cpu-mem-gb".into(),
            "0".into(),
            "--cache-dir".into(),
            s(dir.path()),
            "--generation-mode".into(),
            "none".into(),
            "--output".into(),
            s(&report),
            "-q".into(),
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("storage I/O failed"), "{err}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p)
            } else {
                vec![p]
            }
        })
        .collect()
}
