//! `kvtrace bench --storage-io asynchronous`: the storage tier's calls through queues, every
//! call timed in the JSON and the workbook, and the flags' errors.

use calamine::{open_workbook, Reader, Xlsx};

use crate::util::{kvtrace, one_line_error, scratch, text, TINY_BENCH};

#[test]
fn queued_storage_io_is_timed_in_the_json_and_the_workbook() {
    let dir = scratch();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let cache = dir.path().display().to_string();
    let out = kvtrace(TINY_BENCH.iter().copied().chain([
        "--duration",
        "2",
        "--cache-dir",
        &cache,
        "--storage-io-depth",
        "8",
        "--storage-io-workers",
        "2",
        "--output",
        &p("r.json"),
        "--xlsx-output",
        &p("r.xlsx"),
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("r.json")).expect("json")).expect("json");
    let io = &json["kvtrace"]["storage_io"];
    assert_eq!(
        (&io["mode"], &io["queue_depth"], &io["workers"]),
        (&"asynchronous".into(), &8.into(), &2.into())
    );
    let storage = json["kvtrace"]["tiers"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["tier"] == "storage"))
        .expect("a storage tier");
    assert_eq!(
        io["writes"], storage["counters"]["writes"],
        "every storage write went through the queues"
    );
    // A request the deadline stopped gives up its queued read (skipped unless its worker
    // had begun it): the storage saw at least the reads the tier counted.
    assert!(io["reads"].as_u64() >= storage["counters"]["reads"].as_u64());
    assert!(io["writes"].as_u64().expect("count") > 0);
    assert_eq!(io["write_errors"], 0);
    for timing in ["queue_wait_ms", "service_ms", "end_to_end_ms"] {
        assert!(io[timing]["p99_ms"].is_number(), "{timing}: {io}");
    }
    assert!(io["end_to_end_ms"]["max_ms"].as_f64() >= io["service_ms"]["max_ms"].as_f64());
    let mut wb: Xlsx<_> = open_workbook(p("r.xlsx")).expect("valid xlsx");
    let sheet = wb
        .worksheet_range("Storage IO")
        .expect("a Storage IO sheet");
    let names: Vec<String> = sheet.rows().map(|r| r[0].to_string()).collect();
    for name in ["mode", "workers", "service_ms.p99_ms", "drain_s"] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
}

#[test]
fn storage_io_flags_that_cannot_hold_are_one_line_errors() {
    for (args, expected) in [
        (
            &["--storage-io", "synchronous", "--storage-io-depth", "4"][..],
            "--storage-io-depth and --storage-io-workers apply to --storage-io asynchronous",
        ),
        (
            &["--storage-io-depth", "2", "--storage-io-workers", "3"],
            "3 workers: from 1 to 256 and at most the queue depth (2)",
        ),
        (&["--storage-io-depth", "0"], "queue depth 0"),
        (
            &["--mlperf-option", "1", "--storage-io", "asynchronous"],
            "--storage-io: MLPerf Storage v3.0's CLOSED division fixes it",
        ),
    ] {
        let out = kvtrace(["bench"].iter().chain(args));
        let err = one_line_error(&out, 2);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}
