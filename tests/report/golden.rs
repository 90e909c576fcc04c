//! Golden outputs: every file `replay`, `simulate` and `bench` write, compared with snapshots
//! taken from the binary before the report refactor (issue 12), so the files and keys users
//! rely on stay as they were. Figures that measure the machine (call latencies, wall time,
//! bandwidth) are masked; everything else is compared to the byte, in order.
//!
//! `KVTRACE_BLESS=1 cargo test --test integration report::golden` rewrites the snapshots in
//! `testdata/golden/`; a change there is a change of output format and belongs in the
//! CHANGELOG.
#![allow(
    clippy::unwrap_used,
    reason = "a fixture that cannot be read is a failed test"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{scratch, text};
use calamine::{open_workbook, Data, DataType, Reader, Xlsx};
use serde_json::Value;

const MASK: &str = "<measured>";

/// Keys and column names whose values measure the machine, not the workload.
const MEASURED: [&str; 15] = [
    "duration_s",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "min_ms",
    "max_ms",
    "latency_ms",
    "write_seconds",
    "read_seconds",
    "write_mib_per_s",
    "read_mib_per_s",
    "mean_load_ms",
    "wall_time_ms",
    "processed_tokens_per_s",
];

/// The timings of a tier's backend calls (`tier_io[].calls`, `trace_replay_tier_io.csv`).
const MEASURED_CALLS: [&str; 8] = [
    "queue_wait_",
    "service_",
    "end_to_end_",
    "schedule_lag_",
    "span_s",
    "submit_stall_s",
    "drain_s",
    "mib_per_s",
];

fn measured(key: &str) -> bool {
    MEASURED.contains(&key)
        || MEASURED_CALLS.iter().any(|m| key.starts_with(m))
        || key == "processed_output_tokens_per_s"
        || key == "duration (s)"
        || key == "Timestamp"
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs kvtrace in the repository root (so recorded paths are relative and stable).
fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run kvtrace");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "kvtrace {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Masks measured values, keeping every key and its order.
fn mask_json(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "latency_histograms" {
                    // Encoded latencies: measured, one per call kind.
                    if let Value::Object(h) = v {
                        h.values_mut().for_each(|t| *t = Value::String(MASK.into()));
                    }
                } else if measured(k) && (v.is_number() || v.is_null()) {
                    *v = Value::String(MASK.into());
                } else {
                    mask_json(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_json),
        _ => {}
    }
}

/// The document's shape: every key in order with its value's type; an array shows its
/// first element only. For runs whose figures are all timing-dependent.
fn shape(v: &Value, path: &str, out: &mut String) {
    match v {
        Value::Object(map) => {
            writeln!(out, "{path} object").unwrap();
            for (k, v) in map {
                shape(v, &format!("{path}/{k}"), out);
            }
        }
        Value::Array(items) => {
            writeln!(out, "{path} array").unwrap();
            if let Some(first) = items.first() {
                shape(first, &format!("{path}/0"), out);
            }
        }
        Value::Null => writeln!(out, "{path} null").unwrap(),
        Value::Bool(_) => writeln!(out, "{path} bool").unwrap(),
        Value::Number(_) => writeln!(out, "{path} number").unwrap(),
        Value::String(_) => writeln!(out, "{path} string").unwrap(),
    }
}

fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The JSON file's text as written, then the same document with measured values masked.
fn masked_json_text(path: &Path) -> String {
    let mut v = json_file(path);
    mask_json(&mut v);
    serde_json::to_string_pretty(&v).unwrap() + "\n"
}

fn masked_jsonl(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut v: Value = serde_json::from_str(line).unwrap();
        mask_json(&mut v);
        out.push_str(&serde_json::to_string(&v).unwrap());
        out.push('\n');
    }
    out
}

/// A CSV file with the columns named in [`MEASURED`] masked, and the values of `metric,
/// value` rows that name one.
fn masked_csv(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.split_inclusive('\n');
    let Some(header) = lines.next() else {
        return String::new();
    };
    let masked: Vec<bool> = header.trim_end().split(',').map(measured).collect();
    let mut out = header.to_string();
    for line in lines {
        // No masked file has quoted commas in its rows.
        let cells: Vec<&str> = line.trim_end_matches('\n').split(',').collect();
        let row: Vec<&str> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let by_row = i > 0 && measured(cells[0]);
                if masked.get(i) == Some(&true) || by_row {
                    MASK
                } else {
                    c
                }
            })
            .collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

fn cell(d: &Data) -> String {
    match d {
        Data::Empty => String::new(),
        Data::String(s) => format!("s:{s}"),
        Data::Float(f) => format!("n:{f}"),
        Data::Int(i) => format!("n:{i}"),
        Data::Bool(b) => format!("b:{b}"),
        other => format!("?:{other:?}"),
    }
}

/// Every sheet of a workbook: its name, its header as text, and its other rows.
fn sheets(path: &Path) -> Vec<(String, Vec<String>, Vec<Vec<Data>>)> {
    let mut wb: Xlsx<_> = open_workbook(path).expect("valid xlsx");
    wb.sheet_names()
        .into_iter()
        .map(|name| {
            let range = wb.worksheet_range(&name).expect("sheet");
            let mut rows = range.rows();
            let header = rows
                .next()
                .map(|r| r.iter().map(|c| c.to_string()).collect())
                .unwrap_or_default();
            (name, header, rows.map(<[Data]>::to_vec).collect())
        })
        .collect()
}

/// Every sheet, row by row with typed cells; a cell under a measured column, or beside a
/// measured metric name, is masked.
fn masked_xlsx(path: &Path) -> String {
    let mut out = String::new();
    for (name, header, rows) in sheets(path) {
        writeln!(out, "## {name}\n{}", header.join("\t")).unwrap();
        for row in rows {
            let key = row.first().map(|c| c.to_string()).unwrap_or_default();
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let by_column = header.get(i).is_some_and(|h| measured(h));
                    if (by_column || (i > 0 && measured(&key))) && !c.is_empty() {
                        MASK.to_string()
                    } else {
                        cell(c)
                    }
                })
                .collect();
            writeln!(out, "{}", cells.join("\t")).unwrap();
        }
    }
    out
}

/// Sheet names and each sheet's first row and first column: the layout of a workbook whose
/// figures are all timing-dependent (a sheet headed by the run's timestamp shows it masked).
fn xlsx_layout(path: &Path) -> String {
    let mut out = String::new();
    for (name, header, rows) in sheets(path) {
        writeln!(out, "## {name}").unwrap();
        if !header.is_empty() {
            writeln!(out, "{}", header.join("\t")).unwrap();
        }
        let timestamped = header.first().is_some_and(|h| h == "Timestamp");
        for row in rows {
            let first = if timestamped {
                MASK.to_string()
            } else {
                row.first().map(cell).unwrap_or_default()
            };
            writeln!(out, "{first}").unwrap();
        }
    }
    out
}

/// Compares `actual` with `testdata/golden/<name>`, or writes it under `KVTRACE_BLESS`.
fn check(name: &str, actual: &str) {
    let path: PathBuf = root().join("testdata/golden").join(name);
    if std::env::var_os("KVTRACE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (KVTRACE_BLESS=1 writes it)", path.display()));
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{name} differs from its golden snapshot at line {}:\n  golden: {:?}\n  now:    {:?}",
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

/// A timing-dependent document's shape against its golden: every line of the run in the
/// golden's order, and every golden line there unless it is one a short run may lack — a
/// tier's latency tail (present once the tier served a read or write) or an array's first
/// element.
fn check_shape(name: &str, actual: &str) {
    if std::env::var_os("KVTRACE_BLESS").is_some() {
        return check(name, actual);
    }
    let path = root().join("testdata/golden").join(name);
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Which latencies a short run measures (a tier's reads, a finished request) varies.
    let optional = |l: &str| {
        (l.contains("/cache_stats/") && l.ends_with("_ms number"))
            || l.contains("/0")
            || l.contains("/latency_histograms/")
    };
    let mut run = actual.lines().peekable();
    for line in golden.lines() {
        if run.peek() == Some(&line) {
            run.next();
        } else {
            assert!(optional(line), "{name}: the run lacks {line:?}");
        }
    }
    assert!(run.peek().is_none(), "{name}: unexpected {:?}", run.peek());
}

fn replay_case(tag: &str, extra: &[&str]) {
    let dir = scratch();
    let out = dir.path().display().to_string();
    let jsonl = dir.path().join("records.jsonl").display().to_string();
    let mut args = vec![
        "replay",
        "testdata/lmcache/basic_lru.lct",
        "--json",
        "--xlsx",
        "-q",
        "--output-dir",
        &out,
        "--jsonl-out",
        &jsonl,
    ];
    args.extend_from_slice(extra);
    run(&args);
    for csv in ["ops", "requests", "tiers", "tier_io", "divergences"] {
        let file = format!("trace_replay_{csv}.csv");
        check(
            &format!("replay-{tag}/{file}"),
            &masked_csv(&dir.path().join(&file)),
        );
    }
    check(
        &format!("replay-{tag}/trace_replay_summary.json"),
        &masked_json_text(&dir.path().join("trace_replay_summary.json")),
    );
    check(
        &format!("replay-{tag}/trace_replay.xlsx.txt"),
        &masked_xlsx(&dir.path().join("trace_replay.xlsx")),
    );
    check(
        &format!("replay-{tag}/records.jsonl"),
        &masked_jsonl(Path::new(&jsonl)),
    );
}

#[test]
fn replay_outputs_keep_their_files_and_keys() {
    replay_case("recorded", &[]);
}

#[test]
fn replay_what_if_outputs_keep_their_files_and_keys() {
    replay_case(
        "what-if",
        &["--l1-size-gb", "0.0008", "--eviction-policy", "ARC"],
    );
}

/// An L2 tier behind a small L1, its calls on workers: the tier I/O table and `tier_io`.
#[test]
fn replay_tier_io_outputs_keep_their_files_and_keys() {
    replay_case(
        "tier-io",
        &[
            "--l1-size-gb",
            "0.0008",
            "--l2-adapter",
            r#"{"type":"memory"}"#,
            "--l2-io",
            "asynchronous",
        ],
    );
}

#[test]
fn simulate_outputs_keep_their_files_and_keys() {
    let dir = scratch();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let (json, jsonl, csv, xlsx) = (p("report.json"), p("requests.jsonl"), p("csv"), p("r.xlsx"));
    let table = run(&[
        "simulate",
        "testdata/mooncake/conversation_head300.jsonl",
        "--num-workers",
        "2",
        "--report-json",
        &json,
        "--report-jsonl",
        &jsonl,
        "--report-csv",
        &csv,
        "--report-xlsx",
        &xlsx,
    ]);
    let masked_table: String = table
        .lines()
        .map(|l| {
            if ["Wall Time", "Saved full report to"]
                .iter()
                .any(|m| l.contains(m))
            {
                MASK.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    check("simulate/terminal.txt", &(masked_table + "\n"));
    check("simulate/report.json", &masked_json_text(Path::new(&json)));
    check("simulate/requests.jsonl", &masked_jsonl(Path::new(&jsonl)));
    let mut names: Vec<_> = std::fs::read_dir(&csv)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for name in names {
        check(
            &format!("simulate/csv/{name}"),
            &masked_csv(&Path::new(&csv).join(&name)),
        );
    }
    check("simulate/report.xlsx.txt", &masked_xlsx(Path::new(&xlsx)));
}

/// The optional parts of the summary: SLA goodput, the per-request views and KV offload with
/// its tier table.
#[test]
fn simulate_optional_keys_and_tiers_keep_their_names() {
    let dir = scratch();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let (json, csv) = (p("report.json"), p("csv"));
    run(&[
        "simulate",
        "--input-tokens",
        "2048",
        "--output-tokens",
        "8",
        "--request-count",
        "40",
        "--shared-prefix-ratio",
        "0.75",
        "--num-prefix-groups",
        "2",
        "--request-rate",
        "20",
        "--num-workers",
        "2",
        "--extra-engine-args",
        "{\"kv_bytes_per_token\": 1024, \"num_gpu_blocks\": 128}",
        "--l1-size-gb",
        "0.05",
        "--sla-ttft-ms",
        "100",
        "--sla-itl-ms",
        "20",
        "--per-request-metrics",
        "--quiet",
        "--report-json",
        &json,
        "--report-csv",
        &csv,
    ]);
    check(
        "simulate/offload_report.json",
        &masked_json_text(Path::new(&json)),
    );
    for name in ["simulate_summary.csv", "simulate_tiers.csv"] {
        check(
            &format!("simulate/offload_csv/{name}"),
            &masked_csv(&Path::new(&csv).join(name)),
        );
    }
}

#[test]
fn bench_outputs_keep_their_files_and_keys() {
    let dir = scratch();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let (json, xlsx, csv, cache) = (p("b.json"), p("b.xlsx"), p("b.csv"), p("cache"));
    std::fs::create_dir_all(&cache).unwrap();
    run(&[
        "bench",
        "--num-users",
        "2",
        "--duration",
        "1",
        "--gpu-mem-gb",
        "0",
        "--model",
        "tiny-1b",
        "--no-fsync",
        "--cpu-mem-gb",
        "0.01",
        "--cache-dir",
        &cache,
        "--generation-mode",
        "none",
        "--seed",
        "7",
        "--output",
        &json,
        "--xlsx-output",
        &xlsx,
        "--csv",
        &csv,
        "-q",
    ]);
    let mut s = String::new();
    shape(&json_file(Path::new(&json)), "", &mut s);
    check_shape("bench/report.shape.txt", &s);
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    check(
        "bench/columns.csv",
        &(csv_text.lines().next().unwrap_or_default().to_string() + "\n"),
    );
    check("bench/workbook.layout.txt", &xlsx_layout(Path::new(&xlsx)));
}
