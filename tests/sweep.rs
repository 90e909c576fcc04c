//! `kvtrace sweep`: every point is the single run of its configuration, the stack-distance
//! curve is the full replays' curve where its model holds, the workbook reads back with its
//! charts, and bad lists fail in one line naming the flag.

use std::path::{Path, PathBuf};

use crate::util::{kvtrace, scratch, shared, text};
use calamine::{open_workbook, Data, Reader, Xlsx};
use serde_json::Value;

fn churn(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("testdata/lmcache/churn/{name}.lct"))
}

fn mooncake_head() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/mooncake/conversation_head300.jsonl")
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read json")).expect("json")
}

/// A sheet's header row as text.
fn header(sheet: &calamine::Range<Data>) -> Vec<String> {
    sheet
        .rows()
        .next()
        .expect("header")
        .iter()
        .map(|c| c.to_string())
        .collect()
}

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        text(&out.stderr)
    );
}

/// The single replay's `kvtrace` summary less its live `tier_io` and `latency_histograms`.
fn single_replay(trace: &Path, flags: &[&str], dir: &Path) -> Value {
    let mut args = vec![
        "replay".to_string(),
        trace.display().to_string(),
        "-q".into(),
        "--json".into(),
        "--no-csv".into(),
        "--output-dir".into(),
        dir.display().to_string(),
    ];
    args.extend(flags.iter().map(|f| f.to_string()));
    ok(&kvtrace(&args));
    let mut doc = json(&dir.join("trace_replay_summary.json"));
    let mut summary = doc["kvtrace"].take();
    let map = summary.as_object_mut().expect("object");
    map.remove("tier_io");
    map.remove("latency_histograms");
    summary
}

#[test]
fn every_replay_point_is_the_single_replay_of_its_flags() {
    let dir = scratch();
    let trace = churn("lru_seed1");
    let out_json = dir.path().join("sweep.json");
    let out = kvtrace([
        "sweep",
        "replay",
        trace.to_str().expect("path"),
        "--l1-size-gb",
        "0.004,0.02",
        "--eviction-policy",
        "LRU,ARC",
        "--eviction-timing=periodic,immediate",
        "--jobs",
        "3",
        "-q",
        "--json",
        out_json.to_str().expect("path"),
    ]);
    ok(&out);
    let sweep = json(&out_json);
    let points = sweep["points"].as_array().expect("points");
    assert_eq!(points.len(), 8);
    for p in points {
        let s = &p["settings"];
        let flags = [
            format!("--l1-size-gb={}", s["l1-size-gb"].as_str().expect("size")),
            format!(
                "--eviction-policy={}",
                s["eviction-policy"].as_str().expect("policy")
            ),
            format!(
                "--eviction-timing={}",
                s["eviction-timing"].as_str().expect("timing")
            ),
            "--l1-accounting-only".into(),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let single = single_replay(&trace, &flags, &dir.path().join("single"));
        assert_eq!(p["replay"], single, "point {}", p["name"]);
    }
    // The points differ: the sweep did not run one configuration eight times.
    let rates: std::collections::BTreeSet<String> = points
        .iter()
        .map(|p| p["figures"]["hit_rate"].to_string())
        .collect();
    assert!(rates.len() > 1, "{rates:?}");
}

#[test]
fn a_grid_names_its_points_and_switches_and_repeatables_take_lists() {
    let dir = scratch();
    let grid = dir.path().join("grid.toml");
    std::fs::write(
        &grid,
        "[[point]]\nname = \"small L1, memory L2\"\nl1-size-gb = 0.004\nl2-adapter = '{\"type\":\"memory\"}'\n\
         [[point]]\nname = \"small L1 alone\"\nl1-size-gb = 0.004\n",
    )
    .expect("grid");
    let out_json = dir.path().join("grid.json");
    let trace = churn("lru_seed1");
    ok(&kvtrace([
        "sweep",
        "replay",
        trace.to_str().expect("path"),
        "--grid",
        grid.to_str().expect("path"),
        "--eviction-policy",
        "LRU",
        "-q",
        "--json",
        out_json.to_str().expect("path"),
    ]));
    let sweep = json(&out_json);
    let names: Vec<&str> = sweep["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["small L1, memory L2", "small L1 alone"]);
    let l2 = |i: usize| {
        sweep["points"][i]["figures"]["l2_hit_rate"]
            .as_f64()
            .expect("l2")
    };
    assert!(l2(0) > 0.0 && l2(1) == 0.0, "{} {}", l2(0), l2(1));

    // The same pair as lists: `none` leaves the repeatable flag out.
    let out_json = dir.path().join("lists.json");
    ok(&kvtrace([
        "sweep",
        "replay",
        trace.to_str().expect("path"),
        "--l1-size-gb",
        "0.004",
        "--l2-adapter",
        r#"{"type":"memory"},none"#,
        "--no-session-emulation",
        "false",
        "-q",
        "--json",
        out_json.to_str().expect("path"),
    ]));
    let lists = json(&out_json);
    for i in 0..2 {
        assert_eq!(
            lists["points"][i]["replay"]["hits"],
            sweep["points"][i]["replay"]["hits"]
        );
    }
}

#[test]
fn the_workbook_has_typed_points_family_sheets_and_native_charts() {
    let dir = scratch();
    let xlsx = dir.path().join("sweep.xlsx");
    let svg = dir.path().join("curve.svg");
    let csv = dir.path().join("csv");
    let trace = churn("lru_seed1");
    let out = kvtrace([
        "sweep",
        "replay",
        trace.to_str().expect("path"),
        "--l1-size-gb",
        "0.004,0.008,0.02",
        "--eviction-policy",
        "LRU,FIFO",
        "--xlsx",
        xlsx.to_str().expect("path"),
        "--plot",
        svg.to_str().expect("path"),
        "--csv",
        csv.to_str().expect("path"),
    ]);
    ok(&out);
    let terminal = text(&out.stdout);
    assert!(terminal.contains("Best per line"), "{terminal}");
    assert!(terminal.contains("eviction-policy=FIFO:"), "{terminal}");

    let mut wb: Xlsx<_> = open_workbook(&xlsx).expect("open workbook");
    let sheets = wb.sheet_names();
    for name in [
        "Points",
        "Charts",
        "Hits",
        "Capacity",
        "Tiers",
        "Fidelity",
        "Model curve",
        "Idealised LRU curve",
        "Chart data",
    ] {
        assert!(sheets.iter().any(|s| s == name), "{name} in {sheets:?}");
    }
    assert_eq!(sheets[0], "Points");
    assert_eq!(sheets[1], "Charts");
    let points = wb.worksheet_range("Points").expect("Points");
    let head = header(&points);
    assert_eq!(&head[..3], ["point", "l1-size-gb", "eviction-policy"]);
    assert_eq!(points.rows().count(), 7);
    let first = points.rows().nth(1).expect("row");
    assert!(
        matches!(first[1], Data::Float(v) if v == 0.004),
        "{:?}",
        first[1]
    );
    let hit = head.iter().position(|h| h == "hit_rate").expect("hit_rate");
    assert!(
        matches!(first[hit], Data::Float(v) if (0.0..=1.0).contains(&v)),
        "{:?}",
        first[hit]
    );

    let mut zip = zip::ZipArchive::new(std::fs::File::open(&xlsx).expect("open")).expect("zip");
    let charts: Vec<String> = zip
        .file_names()
        .filter(|n| n.starts_with("xl/charts/chart"))
        .map(String::from)
        .collect();
    assert!(!charts.is_empty(), "no chart part");
    let mut chart = String::new();
    std::io::Read::read_to_string(&mut zip.by_name(&charts[0]).expect("chart"), &mut chart)
        .expect("read chart");
    assert!(chart.contains("<c:scatterChart>"), "not a line chart");
    assert!(
        chart.contains("'Chart data'!"),
        "series not drawn from the data sheet"
    );

    let svg = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        svg.starts_with("<svg") && svg.contains("Hit rate vs L1 size"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    assert!(svg.contains("eviction-policy=LRU") && svg.contains("stack distances"));
    for f in ["sweep_points.csv", "sweep_hits.csv", "sweep_lru_curve.csv"] {
        assert!(csv.join(f).is_file(), "{f}");
    }
}

/// Hit rates of the curve at the sizes the points replayed.
fn curve_at_points(sweep: &Value) -> Vec<(f64, f64, f64)> {
    let curve = sweep["lru_curve"]["points"].as_array().expect("curve");
    sweep["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| {
            let gib = p["figures"]["l1_size_bytes"].as_f64().expect("size") / (1u64 << 30) as f64;
            let at = curve
                .iter()
                .find(|c| (c["l1_size_gb"].as_f64().expect("gb") - gib).abs() < 1e-12)
                .unwrap_or_else(|| panic!("no curve point at {gib} GiB"));
            (
                gib,
                p["figures"]["hit_rate"].as_f64().expect("rate"),
                at["hit_rate"].as_f64().expect("rate"),
            )
        })
        .collect()
}

/// `kvtrace sweep replay TRACE FLAGS... -q --json=DIR/sweep.json`, its JSON.
fn sweep_replay_json(trace: &Path, flags: &[&str], dir: &Path) -> Value {
    sweep_replay(trace, flags, dir).0
}

/// A replay sweep's JSON report and what it wrote to stderr.
fn sweep_replay(trace: &Path, flags: &[&str], dir: &Path) -> (Value, String) {
    let out_json = dir.join("sweep.json");
    let mut args = vec!["sweep", "replay", trace.to_str().expect("path")];
    args.extend_from_slice(flags);
    let flag = format!("--json={}", out_json.display());
    args.extend_from_slice(&["-q", &flag]);
    let out = kvtrace(&args);
    ok(&out);
    (json(&out_json), text(&out.stderr))
}

fn sweep_immediate_lru(trace: &Path, sizes: &str, dir: &Path) -> Value {
    let flags = [
        "--l1-size-gb",
        sizes,
        "--eviction-policy",
        "LRU",
        "--eviction-timing",
        "immediate",
    ];
    sweep_replay_json(trace, &flags, dir)
}

#[test]
fn the_stack_distance_curve_equals_full_replays_of_a_generated_trace() {
    let dir = scratch();
    let trace = dir.path().join("mc.lct");
    ok(&kvtrace([
        "generate",
        trace.to_str().expect("path"),
        "--from-mooncake",
        mooncake_head().to_str().expect("path"),
        "--l1-chunks",
        "256",
    ]));
    let sweep = sweep_immediate_lru(&trace, "0.25,0.5,1,1.5,2,4", dir.path());
    let at = curve_at_points(&sweep);
    for (gib, replay, curve) in &at {
        assert_eq!(replay, curve, "at {gib} GiB");
    }
    assert!(at[0].1 < at[at.len() - 1].1, "the curve is flat: {at:?}");
    assert_eq!(sweep["warnings"], serde_json::json!([]));
    // Under LMCache's controller (a pass a second) the records, microseconds apart, see no
    // pass while the small L1 refuses writes: the sweep says so once, not once a point.
    let flags = ["--l1-size-gb", "0.25,0.5", "--eviction-timing", "periodic"];
    let (periodic, said) = sweep_replay(&trace, &flags, dir.path());
    assert_eq!(said.matches("ran at most one pass").count(), 1, "{said}");
    assert_eq!(periodic["warnings"].as_array().map(Vec::len), Some(1));
}

#[test]
fn the_stack_distance_curve_equals_full_replays_of_the_mooncake_synthetic_trace() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let trace = dir.path().join("syn.lct");
    ok(&kvtrace([
        "generate",
        trace.to_str().expect("path"),
        "--from-mooncake",
        shared
            .join("traces/mooncake/synthetic_trace.jsonl")
            .to_str()
            .expect("path"),
        "--l1-chunks",
        "4096",
    ]));
    let sweep = sweep_immediate_lru(&trace, "1,2,4,8,16,32", dir.path());
    let at = curve_at_points(&sweep);
    for (gib, replay, curve) in &at {
        assert_eq!(replay, curve, "at {gib} GiB");
    }
    // From under 10 % to over 60 %: a whole curve, not one plateau.
    assert!(at[0].1 < 0.1 && at[5].1 > 0.6, "{at:?}");
}

#[test]
fn on_a_store_on_miss_recording_the_curve_meets_the_replays_once_nothing_is_evicted() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let trace = shared.join("lmcache/churn_lru.lct");
    // 128 KiB objects: 0.02 GiB holds all 149 distinct keys.
    let sweep = sweep_immediate_lru(&trace, "0.004,0.01,0.02,0.05", dir.path());
    let at = curve_at_points(&sweep);
    for (gib, replay, curve) in &at[2..] {
        assert_eq!(replay, curve, "at {gib} GiB");
    }
    // Below that, the recording has no store for requests it hit and a smaller L1 misses:
    // the replay cannot make them, the curve (a client storing its misses) does.
    for (gib, replay, curve) in &at[..2] {
        assert!(
            replay >= curve,
            "at {gib} GiB: replay {replay} < curve {curve}"
        );
    }
}

/// The model curve's hit rate at `gib`.
fn model_curve_at(sweep: &Value, gib: f64) -> f64 {
    sweep["model_curve"]["lines"][0]["points"]
        .as_array()
        .expect("model curve")
        .iter()
        .find(|p| (p["l1_size_gb"].as_f64().expect("size") - gib).abs() < 1e-9)
        .unwrap_or_else(|| panic!("no model curve point at {gib} GiB"))["hit_rate"]
        .as_f64()
        .expect("rate")
}

#[test]
fn the_model_curve_is_full_replays_and_meets_the_real_servers() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let whatif = shared.join("lmcache/whatif");
    let trace = whatif.join("vllm_s21_0p05_lru.lct");
    let sweep = sweep_replay_json(&trace, &["--l1-size-gb", "0.0125,0.025,0.05"], dir.path());
    let curve = sweep["model_curve"]["lines"][0]["points"]
        .as_array()
        .expect("curve");
    assert!(curve.len() >= 24, "{curve:?}");
    for (size, server) in [("0.0125", "0p0125"), ("0.025", "0p025"), ("0.05", "0p05")] {
        let gib: f64 = size.parse().expect("size");
        // The curve at a point's size is that point: full replays, not a model of them.
        let point = sweep["points"]
            .as_array()
            .expect("points")
            .iter()
            .find(|p| p["settings"]["l1-size-gb"] == size)
            .expect("point");
        let at = model_curve_at(
            &sweep,
            point["figures"]["l1_size_bytes"].as_f64().expect("bytes") / (1u64 << 30) as f64,
        );
        assert_eq!(
            at,
            point["figures"]["hit_rate"].as_f64().expect("rate"),
            "at {size} GiB"
        );
        // And the point is what the real server of that size did (its client log).
        let log = std::fs::read_to_string(whatif.join(format!("vllm_s21_{server}_lru.client.txt")))
            .expect("client log");
        let (mut requested, mut got) = (0u64, 0u64);
        for line in log.lines().filter(|l| l.starts_with("CLIENT retrieve")) {
            let f: Vec<u64> = line
                .split_whitespace()
                .skip(2)
                .map(|x| x.parse().expect("n"))
                .collect();
            requested += f[0];
            got += f[1];
        }
        let truth = got as f64 / requested as f64;
        assert!(
            (at - truth).abs() <= 0.01,
            "at {gib} GiB: {at} against the server's {truth}"
        );
    }
}

#[test]
fn every_simulate_point_is_the_single_simulation_of_its_flags() {
    let dir = scratch();
    let trace = mooncake_head();
    let out_json = dir.path().join("sweep.json");
    let xlsx = dir.path().join("sim.xlsx");
    let out = kvtrace([
        "sweep",
        "simulate",
        trace.to_str().expect("path"),
        "--num-workers",
        "1,2,4",
        "--router-mode",
        "round_robin,kv_router",
        "--extra-engine-args",
        r#"{"block_size":512}"#,
        "--sla",
        "ttft_p90_ms=2000,itl_p90_ms=100",
        "--json",
        out_json.to_str().expect("path"),
        "--xlsx",
        xlsx.to_str().expect("path"),
    ]);
    ok(&out);
    let terminal = text(&out.stdout);
    assert!(terminal.contains("router-mode=kv_router:"), "{terminal}");
    let sweep = json(&out_json);
    let points = sweep["points"].as_array().expect("points");
    assert_eq!(points.len(), 6);
    for p in points.iter().take(2).chain(points.iter().skip(5)) {
        let s = &p["settings"];
        let report = dir.path().join("single.json");
        ok(&kvtrace([
            "simulate",
            trace.to_str().expect("path"),
            "-q",
            &format!("--num-workers={}", s["num-workers"].as_str().expect("n")),
            &format!(
                "--router-mode={}",
                s["router-mode"].as_str().expect("router")
            ),
            r#"--extra-engine-args={"block_size":512}"#,
            "--report-json",
            report.to_str().expect("path"),
        ]));
        let mut single = json(&report);
        // Measured on this machine's clock (how fast kvtrace ran), not simulated.
        for live in [
            "wall_time_ms",
            "processed_tokens_per_s",
            "processed_output_tokens_per_s",
        ] {
            single.as_object_mut().expect("object").remove(live);
        }
        assert_eq!(p["report"], single, "point {}", p["name"]);
        let meets = p["report"]["p90_ttft_ms"].as_f64().expect("ttft") <= 2000.0
            && p["report"]["p90_itl_ms"].as_f64().expect("itl") <= 100.0;
        assert_eq!(p["meets_sla"], Value::Bool(meets));
    }
    let mut wb: Xlsx<_> = open_workbook(&xlsx).expect("open workbook");
    for name in ["Points", "Charts", "Latency", "Throughput", "Cache"] {
        assert!(wb.sheet_names().iter().any(|s| s == name), "{name}");
    }
    let points = wb.worksheet_range("Points").expect("Points");
    let head = header(&points);
    assert!(head.contains(&"meets_sla".to_string()), "{head:?}");
}

#[test]
fn bad_lists_fail_in_one_line_naming_the_flag() {
    let trace = churn("lru_seed1");
    let trace = trace.to_str().expect("path");
    for (flags, needle) in [
        (vec!["--l1-size-gb", ""], "--l1-size-gb"),
        (vec!["--l1-size-gb", "1,,2"], "--l1-size-gb"),
        (vec!["--l1-size-gb", "1,-2"], "--l1-size-gb"),
        (vec!["--eviction-policy", "LRU,MRU"], "--eviction-policy"),
        (vec!["--l1-accounting-only", "yes"], "--l1-accounting-only"),
        (vec!["--plot", "x.png", "--l1-size-gb", "1,2"], "--plot"),
        (vec!["--jobs", "0"], "--jobs"),
    ] {
        let mut args = vec!["sweep", "replay", trace, "-q"];
        args.extend(flags.iter().copied());
        let out = kvtrace(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
    let out = kvtrace([
        "sweep",
        "simulate",
        mooncake_head().to_str().expect("path"),
        "--num-workers",
        "1",
        "--sla",
        "ttft_p91_ms=3",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--sla") && err.trim_end().lines().count() == 1,
        "{err}"
    );
}

#[test]
fn every_point_lies_on_its_lines_model_curve_and_the_sizes_between_are_full_replays() {
    let dir = scratch();
    let flags = [
        "--l1-size-gb",
        "0.002,0.004,0.008",
        "--eviction-policy",
        "LRU,FIFO",
    ];
    let sweep = sweep_replay_json(&churn("lru_seed1"), &flags, dir.path());
    let lines = sweep["model_curve"]["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), 2, "one curve per policy");
    for p in sweep["points"].as_array().expect("points") {
        let policy = p["settings"]["eviction-policy"].as_str().expect("policy");
        let line = lines
            .iter()
            .find(|l| l["line"] == format!("eviction-policy={policy}"))
            .expect("the point's line");
        let gib = p["figures"]["l1_size_bytes"].as_f64().expect("bytes") / (1u64 << 30) as f64;
        let at = line["points"]
            .as_array()
            .expect("curve")
            .iter()
            .find(|q| (q["l1_size_gb"].as_f64().expect("size") - gib).abs() < 1e-9)
            .expect("the point's size on its curve");
        assert_eq!(
            at["hit_rate"], p["figures"]["hit_rate"],
            "{policy} at {gib} GiB"
        );
    }
    // A size no point replayed is the single replay of the line's flags at that size (the
    // points' own sizes are taken from the points).
    for line in lines {
        let policy = line["line"]
            .as_str()
            .and_then(|l| l.strip_prefix("eviction-policy="))
            .expect("policy line");
        let between = &line["points"].as_array().expect("curve")[5];
        let gib = between["l1_size_gb"].as_f64().expect("size");
        assert!(gib > 0.002 && gib < 0.004, "{gib}");
        let flags = [
            format!("--l1-size-gb={gib}"),
            format!("--eviction-policy={policy}"),
            "--l1-accounting-only".into(),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let single = single_replay(&churn("lru_seed1"), &flags, &dir.path().join("single"));
        assert_eq!(
            between["hit_rate"], single["hits"]["hit_rate"],
            "{policy} at {gib} GiB"
        );
    }
}

#[test]
fn an_interrupted_sweep_says_its_outputs_are_partial() {
    let dir = scratch();
    let trace = dir.path().join("long.lct");
    ok(&kvtrace([
        "generate",
        trace.to_str().expect("path"),
        "--records",
        "400000",
    ]));
    let out = dir.path().join("sweep.json");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(["sweep", "replay", trace.to_str().expect("path"), "-q"])
        .args(["--l1-size-gb", "0.5,1,2,4,8,16", "--jobs", "1"])
        // The older spelling, still taken with a note.
        .args(["--json", out.to_str().expect("path")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(std::time::Duration::from_millis(800));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let done = child.wait_with_output().expect("wait");
    let err = text(&done.stderr);
    assert_eq!(done.status.code(), Some(143), "{err}");
    assert!(
        err.contains("interrupted: the outputs hold only the points"),
        "{err}"
    );
    assert!(
        err.contains("`--json PATH` is deprecated: write `--json=PATH`"),
        "{err}"
    );
    assert_eq!(json(&out)["interrupted"], Value::Bool(true));
}

/// A sweep spread over ranks: `mpirun -np 3` ranks each replay their share of the points and
/// write a slice; `kvtrace aggregate` merges the slices into the sweep one process runs, point
/// for point (timings aside), and one workbook. Slices of different runs, a missing rank or a
/// point claimed twice are refused in one line.
#[test]
fn a_sweep_over_mpirun_ranks_merges_into_the_single_sweep() {
    let trace = churn("lru_seed1");
    let trace = trace.to_str().expect("path");
    let dir = scratch();
    let d = |name: &str| dir.path().join(name).display().to_string();
    let lists = [
        "--l1-size-gb",
        "0.001,0.002,0.004,0.008,0.016",
        "--eviction-policy",
        "LRU,ARC",
    ];
    let sliced = format!("--json={}", d("sweep.json"));
    let mut args = vec!["sweep", "replay", trace, "-q", &sliced];
    args.extend(lists);
    let Some(out) = crate::util::mpirun(3, &args) else {
        return;
    };
    ok(&out);
    let slices: Vec<String> = (0..3)
        .map(|r| d(&format!("sweep.rank-{r:05}.json")))
        .collect();
    for (r, s) in slices.iter().enumerate() {
        let slice = json(Path::new(s));
        assert_eq!(slice["rank"], r, "{s}");
        assert_eq!(slice["points_total"], 10);
    }
    let merged = format!("--json={}", d("merged.json"));
    let workbook = format!("--xlsx={}", d("merged.xlsx"));
    let mut args = vec!["aggregate", "-q", &merged, &workbook];
    args.extend(slices.iter().map(String::as_str));
    ok(&kvtrace(&args));
    let single = format!("--json={}", d("single.json"));
    let mut args = vec!["sweep", "replay", trace, "-q", &single];
    args.extend(lists);
    ok(&kvtrace(&args));
    let (merged, single) = (
        json(&dir.path().join("merged.json")),
        json(&dir.path().join("single.json")),
    );
    let points = |v: &Value| -> Vec<Value> {
        v["points"]
            .as_array()
            .expect("points")
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p.as_object_mut().expect("point").remove("replay_s");
                p
            })
            .collect()
    };
    assert_eq!(points(&merged).len(), 10);
    assert_eq!(points(&merged), points(&single));
    let mut book: Xlsx<_> = open_workbook(d("merged.xlsx")).expect("workbook");
    let sheet = book.worksheet_range("Points").expect("Points");
    assert_eq!(sheet.rows().count(), 11, "a header and the 10 points");
    // Refused: a missing rank, a slice of another run, a point claimed twice.
    let refused = |inputs: &[&str], needle: &str, code: i32| {
        let mut args = vec!["aggregate", "-q"];
        args.extend(inputs);
        let err = crate::util::one_line_error(&kvtrace(&args), code);
        assert!(err.contains(needle), "{needle}: {err}");
    };
    refused(&[&slices[0], &slices[1]], "rank(s) 2 missing", 2);
    let mut other = json(Path::new(&slices[2]));
    other["trace"] = "another.lct".into();
    std::fs::write(d("other.json"), other.to_string()).expect("write");
    refused(
        &[&slices[0], &slices[1], &d("other.json")],
        "slices of different runs",
        1,
    );
    let mut twice = json(Path::new(&slices[2]));
    let first = twice["points"][0].clone();
    twice["points"].as_array_mut().expect("points").push(first);
    std::fs::write(d("twice.json"), twice.to_string()).expect("write");
    refused(
        &[&slices[0], &slices[1], &d("twice.json")],
        "appears twice",
        1,
    );
    // Forged slices of rank 2, each refused in one line naming what is wrong.
    type Forge = fn(&mut Value);
    let forged: [(Forge, &str); 6] = [
        (|v| v["version"] = 2.into(), "version 2"),
        (|v| v["rank"] = 5.into(), "rank 5 of a world of 3"),
        (
            |v| v["points"][0]["index"] = 99.into(),
            "past the sweep's 10 points",
        ),
        (
            |v| v["points"][0]["index"] = 0.into(),
            "not a point of rank 2",
        ),
        (|v| v["points"] = Value::Array(Vec::new()), "in no slice"),
        (|v| v["extra"] = true.into(), "not a sweep slice"),
    ];
    for (forge, needle) in forged {
        let mut slice = json(Path::new(&slices[2]));
        forge(&mut slice);
        std::fs::write(d("forged.json"), slice.to_string()).expect("write");
        refused(&[&slices[0], &slices[1], &d("forged.json")], needle, 1);
    }
    std::fs::write(d("report.json"), "{}").expect("write");
    refused(
        &[&slices[0], &slices[1], &d("report.json")],
        "not a sweep slice, and the first input is one",
        2,
    );
    // A slice's strings reach the terminal escaped.
    let mut hostile = json(Path::new(&slices[2]));
    hostile["points"][0]["name"] = "\u{1b}[2Jpoint".into();
    std::fs::write(d("hostile.json"), hostile.to_string()).expect("write");
    let out = kvtrace(["aggregate", &slices[0], &slices[1], &d("hostile.json")]);
    ok(&out);
    assert!(
        !text(&out.stdout).contains('\u{1b}'),
        "{}",
        text(&out.stdout)
    );
    // Under a launcher a sweep writes its slice as JSON only.
    let Some(out) = crate::util::mpirun(
        2,
        &[
            "sweep",
            "replay",
            trace,
            "--l1-size-gb",
            "0.001,0.002",
            &workbook,
        ],
    ) else {
        return;
    };
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("kvtrace aggregate merges"),
        "{}",
        text(&out.stderr)
    );
}
