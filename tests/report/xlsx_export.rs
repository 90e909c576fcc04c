//! The XLSX workbook, read back with an independent reader: sheet names, numbers stored as
//! numbers, frozen headers and autofilters.

use std::io::Read;

use crate::util::{kvtrace, sample, scratch, text};
use calamine::{open_workbook, Data, Reader, Xlsx};

#[test]
fn the_workbook_has_every_sheet_with_numbers_as_numbers() {
    let dir = scratch();
    let trace = sample("basic_lru").display().to_string();
    let out_dir = dir.path().display().to_string();
    let out = kvtrace([
        "replay",
        &trace,
        "--xlsx",
        "--no-csv",
        "-q",
        "--output-dir",
        &out_dir,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let path = dir.path().join("trace_replay.xlsx");
    let mut wb: Xlsx<_> = open_workbook(&path).expect("valid xlsx");
    assert_eq!(
        wb.sheet_names(),
        ["Summary", "Ops", "Requests", "Tiers", "Tier IO", "Fidelity", "Config"]
    );
    let fidelity = wb.worksheet_range("Fidelity").expect("fidelity");
    let matching = fidelity
        .rows()
        .find(|r| r[0] == Data::String("requests matching".into()))
        .expect("requests matching");
    assert_eq!(
        matching[1],
        Data::Float(9.0),
        "basic_lru: all 9 requests match"
    );
    let requests = wb.worksheet_range("Requests").expect("requests");
    let header: Vec<Data> = requests.rows().next().expect("header").to_vec();
    assert_eq!(
        header.last(),
        Some(&Data::String("recorded_hit_chunks".into()))
    );

    let summary = wb.worksheet_range("Summary").expect("summary");
    let value = |name: &str| -> Data {
        let row = summary
            .rows()
            .find(|r| r[0] == Data::String(name.into()))
            .expect(name);
        row[1].clone()
    };
    assert_eq!(value("replayed"), Data::Float(41.0));
    assert_eq!(value("hit chunks"), Data::Float(27.0));
    assert_eq!(value("config digest"), Data::String("match".into()));
    let Data::Float(rate) = value("hit rate") else {
        panic!("hit rate is not a number")
    };
    assert!((rate - 27.0 / 41.0).abs() < 1e-12);

    let requests = wb.worksheet_range("Requests").expect("requests");
    let header: Vec<String> = requests
        .rows()
        .next()
        .expect("header")
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(
        header[..4],
        [
            "external_request_id",
            "t_mono",
            "requested_chunks",
            "hit_chunks"
        ]
    );
    let hits: Vec<f64> = requests
        .rows()
        .skip(1)
        .map(|r| match r[3] {
            Data::Float(x) => x,
            _ => f64::NAN,
        })
        .collect();
    assert_eq!(hits, [0.0, 2.0, 2.0, 2.0, 4.0, 5.0, 6.0, 4.0, 2.0]);

    let ops = wb.worksheet_range("Ops").expect("ops");
    assert_eq!(ops.height(), 7);
    assert!(
        matches!(ops.get((1, 1)), Some(Data::Float(_))),
        "counts are numbers"
    );
    let config = wb.worksheet_range("Config").expect("config");
    assert!(config.rows().any(|r| r[0]
        == Data::String("l1_manager_config.memory_config.size_in_bytes".into())
        && r[1] == Data::Float(268435456.0)));

    // Frozen header row and an autofilter on every sheet (read from the sheet XML).
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&path).expect("open")).expect("zip");
    for i in 1..=5 {
        let mut xml = String::new();
        zip.by_name(&format!("xl/worksheets/sheet{i}.xml"))
            .expect("sheet")
            .read_to_string(&mut xml)
            .expect("xml");
        assert!(
            xml.contains("state=\"frozen\""),
            "sheet {i} header not frozen"
        );
        assert!(xml.contains("<autoFilter"), "sheet {i} has no autofilter");
    }
}

#[test]
fn a_simulation_exports_its_summary_requests_and_tiers_as_xlsx_and_csv() {
    let dir = scratch();
    let xlsx = dir.path().join("sim.xlsx");
    let csv_dir = dir.path().join("csv");
    let report = dir.path().join("sim.json");
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/mooncake/conversation_head300.jsonl");
    let out = kvtrace([
        "simulate",
        &trace.display().to_string(),
        "--l1-size-gb",
        "4",
        "--report-json",
        &report.display().to_string(),
        "--report-xlsx",
        &xlsx.display().to_string(),
        "--report-csv",
        &csv_dir.display().to_string(),
        "-q",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("json");

    let mut wb: Xlsx<_> = open_workbook(&xlsx).expect("valid xlsx");
    assert_eq!(wb.sheet_names(), ["Summary", "Requests", "Tiers"]);
    let summary = wb.worksheet_range("Summary").expect("summary");
    let value = |name: &str| {
        summary
            .rows()
            .find(|r| r[0] == Data::String(name.into()))
            .map(|r| r[1].clone())
            .expect(name)
    };
    assert_eq!(value("completed_requests"), Data::Float(300.0));
    assert_eq!(
        value("mean_ttft_ms"),
        Data::Float(json["mean_ttft_ms"].as_f64().expect("ttft"))
    );
    let requests = wb.worksheet_range("Requests").expect("requests");
    assert_eq!(requests.height(), 301, "a header and one row per request");
    let tiers = wb.worksheet_range("Tiers").expect("tiers");
    assert_eq!(tiers.get((1, 0)), Some(&Data::String("L1".into())));

    let requests_csv = std::fs::read_to_string(csv_dir.join("simulate_requests.csv")).expect("csv");
    assert_eq!(requests_csv.lines().count(), 301);
    assert!(requests_csv.starts_with("session_id,turn_index,"));
    let summary_csv = std::fs::read_to_string(csv_dir.join("simulate_summary.csv")).expect("csv");
    assert!(summary_csv.lines().any(|l| l == "completed_requests,300"));
    assert!(csv_dir.join("simulate_tiers.csv").exists());
}
