//! The simulation report as users read it: the JSON file (Dynamo's keys, sorted, indent 2,
//! Python's number formatting, so existing scripts parse and diff it unchanged), the
//! AIPerf-style table on stdout, one JSON line per request, and the Summary, Requests and
//! Tiers tables.

use serde_json::{Map, Value as Json};

use super::collector::RequestRecord;
use crate::error::Result;
use crate::report::{JsonStyle, Report, Table};

/// A finished simulation: Dynamo's summary keys (kvtrace's offload keys beside them) and
/// every request.
pub struct SimulateReport {
    /// Keys sorted, as Dynamo writes them.
    pub summary: Map<String, Json>,
    pub requests: Vec<RequestRecord>,
}

impl Report for SimulateReport {
    fn document(&self) -> Result<Json> {
        Ok(Json::Object(self.summary.clone()))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Python
    }

    /// Summary (every scalar key), Requests (one row per request, the JSONL's fields) and,
    /// with KV offload, Tiers.
    fn tables(&self) -> Vec<Table> {
        let requests = self.records();
        let mut out = vec![
            Table::key_values(&self.summary)
                .sheet("Summary")
                .csv("simulate_summary.csv"),
            Table::from_objects(&requests)
                .sheet("Requests")
                .csv("simulate_requests.csv"),
        ];
        if let Some(Json::Array(tiers)) = self.summary.get("offload_tiers") {
            out.push(
                Table::from_objects(tiers)
                    .sheet("Tiers")
                    .csv("simulate_tiers.csv"),
            );
        }
        out
    }

    fn records(&self) -> Vec<Json> {
        self.requests.iter().map(request_json).collect()
    }

    fn terminal(&self) -> String {
        table(&self.summary)
    }
}

/// `{:,.2f}`: two decimals with thousands separators.
pub fn grouped(v: f64) -> String {
    let text = format!("{:.2}", v.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, "00"));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    let sign = if v < 0.0 && !text.trim_matches(['0', '.']).is_empty() {
        "-"
    } else {
        ""
    };
    format!("{sign}{out}.{frac}")
}

/// Rows of the table: label and the report key stem of its distribution, or a single key.
const DISTRIBUTIONS: [(&str, &str); 5] = [
    ("Time to First Token (ms)", "ttft_ms"),
    ("Time to Second Token (ms)", "ttst_ms"),
    ("Request Latency (ms)", "e2e_latency_ms"),
    ("Inter Token Latency (ms)", "itl_ms"),
    (
        "Output Token Throughput Per User (tokens/sec/user)",
        "output_token_throughput_per_user",
    ),
];
const SINGLES: [(&str, &str); 3] = [
    (
        "Output Token Throughput (tokens/sec)",
        "output_throughput_tok_s",
    ),
    (
        "Request Throughput (requests/sec)",
        "request_throughput_rps",
    ),
    ("Request Count (requests)", "completed_requests"),
];
const COLUMNS: [&str; 7] = ["avg", "min", "max", "p99", "p90", "p75", "std"];

/// The metrics table with its title, in heavy box-drawing characters.
fn table(summary: &Map<String, Json>) -> String {
    let get = |k: &str| summary.get(k).and_then(Json::as_f64).unwrap_or(0.0);
    let mut rows: Vec<Vec<String>> = DISTRIBUTIONS
        .iter()
        .map(|(label, stem)| {
            let mut row = vec![label.to_string()];
            for c in COLUMNS {
                let prefix = if c == "avg" { "mean" } else { c };
                row.push(grouped(get(&format!("{prefix}_{stem}"))));
            }
            row
        })
        .collect();
    for (label, key) in SINGLES {
        let mut row = vec![label.to_string(), grouped(get(key))];
        row.extend(std::iter::repeat_n("N/A".to_string(), COLUMNS.len() - 1));
        rows.push(row);
    }
    let header: Vec<String> = std::iter::once("Metric")
        .chain(COLUMNS)
        .map(str::to_owned)
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .chain(std::iter::once(&header))
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let rule = |left: &str, mid: &str, right: &str| {
        let parts: Vec<String> = widths.iter().map(|w| "━".repeat(w + 2)).collect();
        format!("{left}{}{right}\n", parts.join(mid))
    };
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                if i == 0 {
                    format!(" {c:<w$} ")
                } else {
                    format!(" {c:>w$} ")
                }
            })
            .collect();
        format!("┃{}┃\n", parts.join("┃"))
    };
    let mut out = String::from("NVIDIA AIPerf | LLM Metrics\n");
    out += &rule("┏", "┳", "┓");
    out += &line(&header);
    out += &rule("┡", "╇", "┩");
    for row in &rows {
        out += &line(row);
    }
    out += &rule("└", "┴", "┘");
    out += &format!("Wall Time (ms): {}\n", grouped(get("wall_time_ms")));
    out += &format!(
        "Prefix Cache Reused Ratio: {}\n",
        grouped(get("prefix_cache_reused_ratio"))
    );
    out += &format!(
        "First Admission Prefix Cache Reused Ratio: {}\n",
        grouped(get("first_admission_prefix_cache_reused_ratio"))
    );
    out
}

/// One request: its times, lengths, workers and terminal status.
fn request_json(r: &RequestRecord) -> Json {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.insert("ttft_ms".into(), serde_json::json!(r.ttft()));
        m.insert("ttst_ms".into(), serde_json::json!(r.ttst()));
        m.insert("e2e_latency_ms".into(), serde_json::json!(r.e2e()));
        m.insert("itl_ms".into(), serde_json::json!(r.tpot()));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::grouped;

    #[test]
    fn numbers_are_grouped_like_python() {
        assert_eq!(grouped(14915.586), "14,915.59");
        assert_eq!(grouped(1000.0), "1,000.00");
        assert_eq!(grouped(0.004), "0.00");
        assert_eq!(grouped(-1234567.891), "-1,234,567.89");
        assert_eq!(grouped(999.999), "1,000.00");
    }
}
