//! The workbook of a run: kv-cache.py's 99 columns in its order (27 run parameters, 72
//! metrics), and its sheets — Summary (that row), Run Parameters, Performance Metrics and QoS
//! Metrics — so result collections built on its files keep working. `--csv` is the Summary
//! sheet alone.

use super::report::{BenchReport, LatencyMs, OpTails, Profile, SlaMet, Tail, TierFigures};
use super::tiers::TierKind;
use super::users::QosLevel;
use kvtrace_report::{Cell, Table};

/// The run's settings, as the workbook's first 27 columns show them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunParameters {
    pub timestamp: String,
    pub model: String,
    pub num_users: u32,
    pub duration_s: f64,
    pub gpu_mem_per_card_gib: f64,
    pub num_gpus: u32,
    pub tensor_parallel: u32,
    /// The modelled GPU tier's capacity; 0 without one.
    pub total_gpu_mem_gib: f64,
    pub cpu_mem_gib: f64,
    pub generation_mode: &'static str,
    pub performance_profile: &'static str,
    pub multi_turn: bool,
    pub prefix_caching: bool,
    pub rag: bool,
    pub autoscaling: bool,
    pub seed: u64,
    pub max_concurrent_allocs: u32,
    pub request_rate: f64,
    pub max_requests: u64,
    pub dataset_path: Option<String>,
    pub cache_dir: String,
    pub storage_capacity_gib: f64,
    pub trace_speedup: f64,
    pub replay_cycles: u32,
}

impl RunParameters {
    /// The 27 cells, in [`PARAMETER_COLUMNS`] order. kvtrace has no preconditioning pass:
    /// those three columns say so.
    pub fn cells(&self) -> Vec<Cell> {
        let yes = |b: bool| Cell::text(if b { "Yes" } else { "No" });
        let n = Cell::Number;
        vec![
            Cell::text(&self.timestamp),
            Cell::text(&self.model),
            n(f64::from(self.num_users)),
            n(self.duration_s),
            n(self.gpu_mem_per_card_gib),
            n(f64::from(self.num_gpus)),
            n(f64::from(self.tensor_parallel)),
            n(self.total_gpu_mem_gib),
            n(self.cpu_mem_gib),
            Cell::text(self.generation_mode),
            Cell::text(self.performance_profile),
            yes(self.multi_turn),
            yes(self.prefix_caching),
            yes(self.rag),
            yes(self.autoscaling),
            n(self.seed as f64),
            n(f64::from(self.max_concurrent_allocs)),
            n(self.request_rate),
            n(self.max_requests as f64),
            self.dataset_path.as_ref().map_or(Cell::Empty, Cell::text),
            Cell::text(&self.cache_dir),
            n(self.storage_capacity_gib),
            yes(false),
            n(0.0),
            n(0.0),
            n(self.trace_speedup),
            n(f64::from(self.replay_cycles)),
        ]
    }
}

/// Reads one part of a direction's latency tails.
type TailPart = fn(&OpTails) -> Option<Tail>;
/// Reads one figure of a tier.
type TierFigure = fn(&TierFigures) -> f64;

const PERCENTILES: [&str; 5] = ["P50", "P95", "P99", "P99.9", "P99.99"];

fn latency(out: &mut Vec<(String, Cell)>, label: &str, l: &LatencyMs, all: bool) {
    out.push((format!("{label} Mean (ms)"), Cell::Number(l.mean)));
    let values = [l.p50, l.p95, l.p99, l.p999, l.p9999];
    let n = if all { 5 } else { 3 };
    for (p, v) in PERCENTILES.iter().zip(values).take(n) {
        out.push((format!("{label} {p} (ms)"), Cell::Number(v)));
    }
}

/// The 72 metric columns and their cells (empty where the run has no such figure).
fn metrics(r: &BenchReport) -> Vec<(String, Cell)> {
    let s = &r.summary;
    let c = &s.cache_stats;
    let n = Cell::Number;
    let mut out: Vec<(String, Cell)> = vec![
        ("Total Requests".into(), n(s.total_requests as f64)),
        ("Total Tokens".into(), n(s.total_tokens as f64)),
        ("Elapsed Time (s)".into(), n(s.elapsed_time)),
        (
            "Avg Throughput (tok/s)".into(),
            n(s.avg_throughput_tokens_per_sec),
        ),
        (
            "Storage Throughput (tok/s)".into(),
            n(s.storage_throughput_tokens_per_sec),
        ),
        ("Requests/sec".into(), n(s.requests_per_second)),
    ];
    latency(&mut out, "E2E Latency", &s.end_to_end_latency_ms, true);
    latency(&mut out, "Storage Latency", &s.storage_io_latency_ms, true);
    latency(&mut out, "Gen Latency", &s.generation_latency_ms, false);
    let storage = c.tier(TierKind::Storage);
    for (dir, ops) in [
        ("Read", storage.and_then(|t| t.read.as_ref())),
        ("Write", storage.and_then(|t| t.write.as_ref())),
    ] {
        let parts: [(&str, TailPart); 3] = [
            ("Total", |o| Some(o.total)),
            ("Device", |o| o.device),
            ("Host", |o| o.host),
        ];
        for (part, get) in parts {
            let tail = ops.and_then(get);
            for (i, p) in PERCENTILES.iter().enumerate() {
                out.push((
                    format!("Storage Tier {dir} {part} {p} (ms)"),
                    tail.map_or(Cell::Empty, |t| n(t.0[i])),
                ));
            }
        }
    }
    out.push(("Cache Hit Rate".into(), n(c.cache_hit_rate)));
    out.push(("Read/Write Ratio".into(), n(c.read_write_ratio)));
    out.push(("Total Read (GiB)".into(), n(c.total_read_gb)));
    out.push(("Total Write (GiB)".into(), n(c.total_write_gb)));
    let tiers = [
        ("GPU", TierKind::Gpu),
        ("CPU", TierKind::Cpu),
        ("Storage", TierKind::Storage),
    ];
    let figure =
        |kind: TierKind, f: fn(&TierFigures) -> f64| c.tier(kind).map_or(Cell::Empty, |t| n(f(t)));
    let by_direction: [(&str, TierFigure); 2] = [
        ("Written", |t| t.kv_bytes_written_gb),
        ("Read", |t| t.kv_bytes_read_gb),
    ];
    for (dir, f) in by_direction {
        for (label, kind) in tiers {
            out.push((
                format!("Tier {label} KV Bytes {dir} (GiB)"),
                figure(kind, f),
            ));
        }
    }
    for (label, kind) in tiers {
        out.push((
            format!("Tier {label} Read Bandwidth (GiB/s)"),
            figure(kind, |t| t.read_bandwidth_gbps),
        ));
        out.push((
            format!("Tier {label} Write Bandwidth (GiB/s)"),
            figure(kind, |t| t.write_bandwidth_gbps),
        ));
    }
    for (label, kind) in tiers {
        out.push((
            format!("{label} Entries"),
            figure(kind, |t| t.entries as f64),
        ));
    }
    out.push(("Multi-turn Hit Rate".into(), n(s.multi_turn_stats.hit_rate)));
    out
}

/// Every column name, in order.
pub fn columns() -> Vec<String> {
    PARAMETER_COLUMNS
        .iter()
        .map(|c| c.to_string())
        .chain(metrics(&BenchReport::default()).into_iter().map(|(c, _)| c))
        .collect()
}

/// The workbook's sheets; the Summary sheet is also the CSV file.
pub fn tables(r: &BenchReport) -> Vec<Table> {
    let (metric_names, metric_cells): (Vec<String>, Vec<Cell>) = metrics(r).into_iter().unzip();
    let names: Vec<String> = PARAMETER_COLUMNS
        .iter()
        .map(|c| c.to_string())
        .chain(metric_names)
        .collect();
    let values: Vec<Cell> = r
        .parameters
        .cells()
        .into_iter()
        .chain(metric_cells)
        .collect();
    let pairs = |first: &str, range: std::ops::Range<usize>| {
        let mut t = Table::new(&[first, "Value"]);
        t.rows = range
            .map(|i| vec![Cell::Text(names[i].clone()), values[i].clone()])
            .collect();
        t
    };
    let mut qos = Table::new(&[
        "QoS Level",
        "Total Requests",
        "Latency P95 (ms)",
        "Latency P99 (ms)",
        "SLA Met",
        "SLA Compliance",
    ])
    .sheet("QoS Metrics");
    for level in QosLevel::ALL {
        let f = r.summary.qos_metrics.get(level);
        let n = |v: Option<f64>| v.map_or(Cell::Empty, Cell::Number);
        qos.rows.push(vec![
            Cell::text(level.name()),
            n(f.map(|f| f.total_requests as f64)),
            n(f.map(|f| f.latency_ms.p95)),
            n(f.map(|f| f.latency_ms.p99)),
            match (f.map(|f| f.sla.met), r.profile) {
                (_, Profile::Throughput) => Cell::text(SlaMet::NOT_JUDGED),
                (Some(SlaMet::Judged(met)), _) => Cell::Bool(met),
                _ => Cell::Empty,
            },
            n(f.map(|f| f.sla.compliance)),
        ]);
    }
    let mut summary = Table::new(&names).sheet("Summary").csv("results.csv");
    summary.rows.push(values.clone());
    let mut tables = vec![
        summary,
        pairs("Parameter", 0..PARAMETER_COLUMNS.len()).sheet("Run Parameters"),
        pairs("Metric", PARAMETER_COLUMNS.len()..names.len()).sheet("Performance Metrics"),
        qos,
    ];
    if let Some(io) = &r.kvtrace.storage_io {
        let mut t = Table::new(&["Metric", "Value"]).sheet("Storage IO");
        flatten(
            "",
            &serde_json::to_value(io).unwrap_or_default(),
            &mut t.rows,
        );
        tables.push(t);
    }
    tables
}

/// A JSON document as one row per leaf, each named by its path (`service_ms.p99_ms`).
fn flatten(path: &str, v: &serde_json::Value, rows: &mut Vec<Vec<Cell>>) {
    use serde_json::Value;
    let cell = match v {
        Value::Object(map) => {
            for (k, v) in map {
                let inner = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten(&inner, v, rows);
            }
            return;
        }
        Value::Number(n) => n.as_f64().map_or(Cell::Empty, Cell::Number),
        Value::String(s) => Cell::text(s),
        Value::Bool(b) => Cell::Bool(*b),
        Value::Null | Value::Array(_) => Cell::Empty,
    };
    rows.push(vec![Cell::text(path), cell]);
}

/// The run-parameter columns, in order.
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
