//! The simulation report as users read it: the JSON file (Dynamo's keys, sorted, indent 2,
//! Python's number formatting, so existing scripts parse and diff it unchanged), the
//! AIPerf-style table on stdout, one JSON line per request, and the Summary, Requests and
//! Tiers tables.

use serde_json::Value as Json;

use super::collector::{RequestRecord, Status};
use super::summary::{Figures, PlayOutcome, Summary};
use crate::error::Result;
use kvtrace_report::{JsonStyle, Report, Table};

/// A finished simulation: its summary (Dynamo's keys, kvtrace's beside them) and every
/// request.
pub struct SimulateReport {
    pub summary: Summary,
    pub requests: Vec<RequestRecord>,
}

impl Report for SimulateReport {
    fn document(&self) -> Result<Json> {
        Ok(Json::Object(self.summary.to_map()))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Python
    }

    /// Summary (every scalar key), Requests (one row per request, the JSONL's fields), for
    /// a request graph under AISimulate's engine Plays (each play's outcome) and, with KV
    /// offload, Tiers.
    fn tables(&self) -> Vec<Table> {
        let requests = self.records();
        let summary = self.summary.to_map();
        let mut out = vec![
            Table::key_values(&summary)
                .sheet("Summary")
                .csv("simulate_summary.csv"),
            Table::from_objects(&requests)
                .sheet("Requests")
                .csv("simulate_requests.csv"),
        ];
        if let Some(a) = self
            .summary
            .aisimulate
            .as_ref()
            .filter(|a| !a.plays.is_empty())
        {
            let plays: Vec<Json> = a.plays.iter().map(PlayOutcome::to_row).collect();
            out.push(
                Table::from_objects(&plays)
                    .sheet("Plays")
                    .csv("simulate_plays.csv"),
            );
        }
        if let Some(offload) = &self.summary.offload {
            let tiers: Vec<Json> = offload
                .tiers
                .iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect();
            out.push(
                Table::from_objects(&tiers)
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
        self.table(TABLE_WIDTH)
    }
}

impl SimulateReport {
    /// What the run left unserved, a line each: requests rejected (a prompt no engine's KV
    /// cache can hold), requests skipped as their play had failed and, unless a signal
    /// stopped the run, requests still waiting or never sent when the engines had nothing
    /// more they could run. `planned` is the workload's request count. Such a report's
    /// figures cover the served requests only.
    pub fn unserved(&self, planned: usize) -> Vec<String> {
        let count = |status| {
            self.requests
                .iter()
                .filter(|r| r.terminal_status == status)
                .count()
        };
        let (rejected, failed, pending) = (
            count(Status::Rejected),
            count(Status::Failed),
            count(Status::Pending),
        );
        let skipped = self.summary.skipped as usize;
        let unsent = planned.saturating_sub(self.requests.len() + skipped);
        let mut lines = Vec::new();
        if rejected > 0 {
            lines.push(format!(
                "{rejected} of {planned} requests were rejected: each needs more KV blocks than an engine holds (num_gpu_blocks × block_size tokens) or has a prompt of max_model_len tokens or more"
            ));
        }
        if failed > 0 {
            lines.push(format!(
                "{failed} of {planned} requests failed: the decode worker each was handed to refused its prompt (more than its KV cache holds, or max_model_len tokens or more)"
            ));
        }
        if skipped > 0 {
            lines.push(format!(
                "{skipped} of {planned} requests were skipped: each waits for a rejected request, and AISimulate ends a play at its first failure"
            ));
        }
        if !self.summary.interrupted && pending + unsent > 0 {
            lines.push(format!(
                "{pending} of {planned} requests never finished and {unsent} were never sent: the engines stopped with nothing they could schedule"
            ));
        }
        lines
    }

    /// The AIPerf table drawn at most `width` columns wide, its metric names wrapped to fit as
    /// rich wraps them on a terminal that wide ([`Report::terminal`] draws it 100 wide).
    pub fn table(&self, width: usize) -> String {
        table(&self.summary, width)
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

const COLUMNS: [&str; 7] = ["avg", "min", "max", "p99", "p90", "p75", "std"];

/// The metrics table with its title, in heavy box-drawing characters.
fn table(s: &Summary, width: usize) -> String {
    let distributions = [
        ("Time to First Token (ms)", &s.ttft_ms),
        ("Time to Second Token (ms)", &s.ttst_ms),
        ("Request Latency (ms)", &s.e2e_latency_ms),
        ("Inter Token Latency (ms)", &s.itl_ms),
        (
            "Output Token Throughput Per User (tokens/sec/user)",
            &s.output_token_throughput_per_user,
        ),
    ];
    let singles = [
        (
            "Output Token Throughput (tokens/sec)",
            s.output_throughput_tok_s,
        ),
        (
            "Request Throughput (requests/sec)",
            s.request_throughput_rps,
        ),
        ("Request Count (requests)", s.completed_requests as f64),
    ];
    let columns = |f: &Figures| [f.mean, f.min, f.max, f.p99, f.p90, f.p75, f.std];
    let mut rows: Vec<Vec<String>> = distributions
        .iter()
        .map(|(label, f)| {
            std::iter::once(label.to_string())
                .chain(columns(f).map(grouped))
                .collect()
        })
        .collect();
    for (label, v) in singles {
        let mut row = vec![label.to_string(), grouped(v)];
        row.extend(std::iter::repeat_n("N/A".to_string(), COLUMNS.len() - 1));
        rows.push(row);
    }
    let header: Vec<String> = std::iter::once("Metric")
        .chain(COLUMNS)
        .map(str::to_owned)
        .collect();
    let mut widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .chain(std::iter::once(&header))
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    // As rich does on a narrow terminal, the metric names wrap so the table fits.
    let figures: usize = widths[1..].iter().map(|w| w + 3).sum();
    widths[0] = widths[0].min(width.saturating_sub(figures + 4).max(MIN_LABEL_WIDTH));
    let rule = |left: &str, mid: &str, right: &str| {
        let parts: Vec<String> = widths.iter().map(|w| "━".repeat(w + 2)).collect();
        format!("{left}{}{right}\n", parts.join(mid))
    };
    let line = |cells: &[String]| {
        let label = wrap(&cells[0], widths[0]);
        let mut out = String::new();
        for (n, part) in label.iter().enumerate() {
            let parts: Vec<String> = std::iter::once(format!(" {part:<w$} ", w = widths[0]))
                .chain(cells[1..].iter().zip(&widths[1..]).map(|(c, &w)| {
                    let c = if n == 0 { c.as_str() } else { "" };
                    format!(" {c:>w$} ")
                }))
                .collect();
            out += &format!("┃{}┃\n", parts.join("┃"));
        }
        out
    };
    let mut out = String::from("NVIDIA AIPerf | LLM Metrics\n");
    out += &rule("┏", "┳", "┓");
    out += &line(&header);
    out += &rule("┡", "╇", "┩");
    for row in &rows {
        out += &line(row);
    }
    out += &rule("└", "┴", "┘");
    out += &format!("Wall Time (ms): {}\n", grouped(s.wall_time_ms));
    out += &format!(
        "Prefix Cache Reused Ratio: {}\n",
        grouped(s.prefix_cache_reused_ratio)
    );
    out += &format!(
        "First Admission Prefix Cache Reused Ratio: {}\n",
        grouped(s.first_admission_prefix_cache_reused_ratio)
    );
    out
}

/// The widest the metrics table is drawn by default, in columns.
const TABLE_WIDTH: usize = 100;

/// The narrowest the metric names wrap to, whatever the figures need.
const MIN_LABEL_WIDTH: usize = 12;

/// `text` in lines of at most `width` characters, broken between words (a longer word is cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines: Vec<String> = Vec::new();
    let mut current = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > width {
            if !current.is_empty() {
                lines.push(std::mem::take(&mut current));
            }
            lines.push(word.drain(..width).collect());
        }
        let word: String = word.into_iter().collect();
        let len = current.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current += &word;
    }
    if !current.is_empty() || lines.is_empty() {
        lines.push(current);
    }
    lines
}

/// One request: its times, lengths, workers and terminal status.
fn request_json(r: &RequestRecord) -> Json {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.insert("ttft_ms".into(), serde_json::json!(r.ttft()));
        m.insert("ttst_ms".into(), serde_json::json!(r.ttst()));
        m.insert("e2e_latency_ms".into(), serde_json::json!(r.e2e()));
        m.insert("itl_ms".into(), serde_json::json!(r.tpot()));
        if let Some(prefill) = r.prefill_reused_input_tokens {
            m.insert("reused_input_tokens".into(), prefill.into());
        }
        if r.play.is_some() {
            m.insert("turn_index".into(), Json::Null);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::{grouped, wrap};

    #[test]
    fn labels_wrap_between_words_and_cut_longer_words() {
        assert_eq!(
            wrap("Time to First Token (ms)", 12),
            ["Time to", "First Token", "(ms)"]
        );
        assert_eq!(wrap("Metric", 12), ["Metric"]);
        assert_eq!(wrap("abcdefghij xy", 4), ["abcd", "efgh", "ij", "xy"]);
        assert_eq!(wrap("", 5), [""]);
    }

    #[test]
    fn numbers_are_grouped_like_python() {
        assert_eq!(grouped(14915.586), "14,915.59");
        assert_eq!(grouped(1000.0), "1,000.00");
        assert_eq!(grouped(0.004), "0.00");
        assert_eq!(grouped(-1234567.891), "-1,234,567.89");
        assert_eq!(grouped(999.999), "1,000.00");
    }
}
