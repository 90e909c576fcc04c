//! The spreadsheet row of a run: kv-cache.py's 99 columns in its order (27 run parameters,
//! 72 metrics), and the workbook's sheets — Summary (that row), Run Parameters, Performance
//! Metrics and QoS Metrics — so result collections built on its files keep working.

use serde_json::Value as Json;

use crate::report::tables::{Cell, Table};

/// The run parameters, in column order, as the caller fills them.
pub const PARAMETER_COLUMNS: [&str; 27] = [
    "Timestamp",
    "Model",
    "Num Users",
    "Duration (s)",
    "GPU Memory per Card (GiB)",
    "Num GPUs",
    "Tensor Parallel",
    "Total GPU Memory (GiB)",
    "CPU Memory (GiB)",
    "Generation Mode",
    "Performance Profile",
    "Multi-turn",
    "Prefix Caching",
    "RAG Enabled",
    "Autoscaling",
    "Seed",
    "Max Concurrent Allocs",
    "Request Rate",
    "Max Requests",
    "Dataset Path",
    "Cache Dir",
    "Storage Capacity (GiB)",
    "Precondition",
    "Precondition Size (GiB)",
    "Precondition Threads",
    "Trace Speedup",
    "Replay Cycles",
];

const PERCENTILES: [(&str, &str); 5] = [
    ("P50", "p50"),
    ("P95", "p95"),
    ("P99", "p99"),
    ("P99.9", "p999"),
    ("P99.99", "p9999"),
];

/// `(column, JSON pointer into the report)` for every metric column, in order.
fn metric_columns() -> Vec<(String, String)> {
    let mut cols: Vec<(String, String)> = [
        ("Total Requests", "/summary/total_requests"),
        ("Total Tokens", "/summary/total_tokens"),
        ("Elapsed Time (s)", "/summary/elapsed_time"),
        (
            "Avg Throughput (tok/s)",
            "/summary/avg_throughput_tokens_per_sec",
        ),
        (
            "Storage Throughput (tok/s)",
            "/summary/storage_throughput_tokens_per_sec",
        ),
        ("Requests/sec", "/summary/requests_per_second"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    for (label, key) in [
        ("E2E Latency", "end_to_end_latency_ms"),
        ("Storage Latency", "storage_io_latency_ms"),
    ] {
        cols.push((format!("{label} Mean (ms)"), format!("/summary/{key}/mean")));
        for (p, k) in PERCENTILES {
            cols.push((format!("{label} {p} (ms)"), format!("/summary/{key}/{k}")));
        }
    }
    cols.push((
        "Gen Latency Mean (ms)".into(),
        "/summary/generation_latency_ms/mean".into(),
    ));
    for (p, k) in &PERCENTILES[..3] {
        cols.push((
            format!("Gen Latency {p} (ms)"),
            format!("/summary/generation_latency_ms/{k}"),
        ));
    }
    let stats = "/summary/cache_stats";
    for dir in ["Read", "Write"] {
        for part in ["Total", "Device", "Host"] {
            for (p, k) in PERCENTILES {
                let key = match part {
                    "Total" => format!("storage_{}_{k}_ms", dir.to_lowercase()),
                    _ => format!(
                        "storage_{}_{}_{k}_ms",
                        dir.to_lowercase(),
                        part.to_lowercase()
                    ),
                };
                cols.push((
                    format!("Storage Tier {dir} {part} {p} (ms)"),
                    format!("{stats}/{key}"),
                ));
            }
        }
    }
    for (label, key) in [
        ("Cache Hit Rate", "cache_hit_rate"),
        ("Read/Write Ratio", "read_write_ratio"),
        ("Total Read (GiB)", "total_read_gb"),
        ("Total Write (GiB)", "total_write_gb"),
    ] {
        cols.push((label.into(), format!("{stats}/{key}")));
    }
    let tiers = [("GPU", "gpu"), ("CPU", "cpu"), ("Storage", "storage")];
    for dir in ["Written", "Read"] {
        for (label, key) in tiers {
            cols.push((
                format!("Tier {label} KV Bytes {dir} (GiB)"),
                format!("{stats}/tier_{key}_kv_bytes_{}_gb", dir.to_lowercase()),
            ));
        }
    }
    for (label, key) in tiers {
        for dir in ["Read", "Write"] {
            cols.push((
                format!("Tier {label} {dir} Bandwidth (GiB/s)"),
                format!("{stats}/tier_{key}_{}_bandwidth_gbps", dir.to_lowercase()),
            ));
        }
    }
    for (label, key) in tiers {
        cols.push((format!("{label} Entries"), format!("{stats}/{key}_entries")));
    }
    cols.push((
        "Multi-turn Hit Rate".into(),
        "/summary/multi_turn_stats/hit_rate".into(),
    ));
    cols
}

/// Every column name, in order.
pub fn columns() -> Vec<String> {
    PARAMETER_COLUMNS
        .iter()
        .map(|c| c.to_string())
        .chain(metric_columns().into_iter().map(|(c, _)| c))
        .collect()
}

/// The row: `parameters` (27 cells, in [`PARAMETER_COLUMNS`] order) and the metrics read
/// from the report (empty where the run has no such figure).
pub fn row(parameters: Vec<Cell>, report: &Json) -> Vec<Cell> {
    parameters
        .into_iter()
        .chain(
            metric_columns()
                .into_iter()
                .map(|(_, pointer)| report.pointer(&pointer).map_or(Cell::Empty, Cell::of)),
        )
        .collect()
}

/// The workbook's sheets.
pub fn tables(parameters: Vec<Cell>, report: &Json, throughput_profile: bool) -> Vec<Table> {
    let names = columns();
    let values = row(parameters, report);
    let pairs = |range: std::ops::Range<usize>| -> Vec<Vec<Cell>> {
        range
            .map(|i| vec![Cell::Text(names[i].clone()), values[i].clone()])
            .collect()
    };
    let qos = report.pointer("/summary/qos_metrics");
    let qos_rows = ["interactive", "responsive", "batch"]
        .iter()
        .map(|level| {
            let m = qos.and_then(|q| q.get(level));
            let get = |p: &str| m.and_then(|m| m.pointer(p)).map_or(Cell::Empty, Cell::of);
            let met = if throughput_profile {
                Cell::Text("N/A (throughput mode)".into())
            } else {
                get("/sla/met")
            };
            vec![
                Cell::Text(level.to_string()),
                get("/total_requests"),
                get("/latency_ms/p95"),
                get("/latency_ms/p99"),
                met,
                get("/sla/compliance"),
            ]
        })
        .collect();
    let pair_columns = |a: &str| vec![a.to_string(), "Value".to_string()];
    vec![
        Table {
            name: "Summary".into(),
            columns: names.clone(),
            rows: vec![values.clone()],
        },
        Table {
            name: "Run Parameters".into(),
            columns: pair_columns("Parameter"),
            rows: pairs(0..PARAMETER_COLUMNS.len()),
        },
        Table {
            name: "Performance Metrics".into(),
            columns: pair_columns("Metric"),
            rows: pairs(PARAMETER_COLUMNS.len()..names.len()),
        },
        Table {
            name: "QoS Metrics".into(),
            columns: [
                "QoS Level",
                "Total Requests",
                "Latency P95 (ms)",
                "Latency P99 (ms)",
                "SLA Met",
                "SLA Compliance",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            rows: qos_rows,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_are_99_columns_in_kv_cache_py_order() {
        let c = columns();
        assert_eq!(c.len(), 99);
        assert_eq!(c[0], "Timestamp");
        assert_eq!(c[26], "Replay Cycles");
        assert_eq!(c[27], "Total Requests");
        assert_eq!(c[33], "E2E Latency Mean (ms)");
        assert_eq!(c[45], "Gen Latency Mean (ms)");
        assert_eq!(c[49], "Storage Tier Read Total P50 (ms)");
        assert_eq!(c[79], "Cache Hit Rate");
        assert_eq!(c[98], "Multi-turn Hit Rate");
        let unique: std::collections::HashSet<&String> = c.iter().collect();
        assert_eq!(unique.len(), 99);
    }
}
