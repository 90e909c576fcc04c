//! `kvtrace diff`: compares two reports of the same kind — two replay summaries
//! (`trace_replay_summary.json`) or two simulate reports (`--report-json`) — on the figures a
//! regression gate watches, and says which moved the wrong way by more than a threshold.
//!
//! By default the gate watches what is deterministic: a replay's hits per tier, OUT_OF_MEMORY,
//! evictions, failed calls and reads and its fidelity; a simulate report's figures, all on
//! the simulated clock. A replay's call latencies and duration are live measurements of a few
//! microseconds a call, so two replays of one trace differ in them by noise: they are watched
//! only when asked, and then a move smaller than a noise floor never regresses.

use serde::Serialize;
use serde_json::Value as Json;

/// Which way a metric should move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Better {
    Higher,
    Lower,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DiffRow {
    pub metric: String,
    pub base: f64,
    pub new: f64,
    /// Relative change in percent; infinite when the base is 0 and the new value is not.
    pub change_pct: f64,
    pub better: Better,
    pub regressed: bool,
}

/// What the gate watches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiffOptions {
    /// Largest tolerated move in the wrong direction, in percent.
    pub max_regression_pct: f64,
    /// Also watch a replay's per-call latencies and duration, with the noise floors.
    pub latency: bool,
}

/// A replay's per-call latency moves less than this (ms) are noise: a call takes microseconds,
/// two runs of one trace differ by about a microsecond at the mean, and the p99 of a short
/// trace's few calls on a busy machine by tens of microseconds (seen: 46 → 101 µs).
pub const LATENCY_NOISE_FLOOR_MS: f64 = 0.1;

/// A replay's duration moves less than this (s) are noise.
pub const DURATION_NOISE_FLOOR_S: f64 = 0.1;

/// The kind of report a summary is, by its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Replay,
    Simulate,
    Bench,
}

impl Kind {
    pub fn of(report: &Json) -> Option<Kind> {
        if report.pointer("/kvtrace/hits").is_some() {
            Some(Kind::Replay)
        } else if report.get("completed_requests").is_some() && report.get("mean_ttft_ms").is_some()
        {
            Some(Kind::Simulate)
        } else if report.get("requests_completed").is_some()
            && report.pointer("/summary/cache_stats").is_some()
        {
            Some(Kind::Bench)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Replay => "replay summary",
            Kind::Simulate => "simulate report",
            Kind::Bench => "bench report",
        }
    }
}

/// One watched figure: JSON pointer, display name, direction, noise floor (absolute).
type Watched = (String, String, Better, f64);

fn list(items: &[(&str, &str, Better)]) -> Vec<Watched> {
    items
        .iter()
        .map(|(p, n, b)| (p.to_string(), n.to_string(), *b, 0.0))
        .collect()
}

/// The watched figures of a report of `kind`.
fn watched(kind: Kind, report: &Json, latency: bool) -> Vec<Watched> {
    use Better::{Higher, Lower};
    match kind {
        Kind::Simulate => list(&[
            ("/completed_requests", "completed requests", Higher),
            (
                "/request_throughput_rps",
                "request throughput (rps)",
                Higher,
            ),
            (
                "/output_throughput_tok_s",
                "output throughput (tok/s)",
                Higher,
            ),
            ("/mean_ttft_ms", "mean TTFT (ms)", Lower),
            ("/p99_ttft_ms", "p99 TTFT (ms)", Lower),
            ("/mean_itl_ms", "mean ITL (ms)", Lower),
            ("/p99_itl_ms", "p99 ITL (ms)", Lower),
            ("/mean_e2e_latency_ms", "mean end-to-end (ms)", Lower),
            ("/prefix_cache_reused_ratio", "prefix cache reuse", Higher),
            ("/offload_hit_rate", "offload hit rate", Higher),
        ]),
        // A benchmark's figures are all live measurements of real storage: the threshold is
        // the gate, set to the run-to-run spread of the machine.
        Kind::Bench => list(&[
            ("/requests_completed", "requests completed", Higher),
            (
                "/summary/cache_stats/cache_hit_rate",
                "cache hit rate",
                Higher,
            ),
            (
                "/summary/avg_throughput_tokens_per_sec",
                "throughput (tok/s)",
                Higher,
            ),
            (
                "/summary/storage_throughput_tokens_per_sec",
                "storage throughput (tok/s)",
                Higher,
            ),
            ("/summary/requests_per_second", "requests/s", Higher),
            (
                "/summary/end_to_end_latency_ms/p95",
                "p95 end-to-end (ms)",
                Lower,
            ),
            (
                "/summary/storage_io_latency_ms/p95",
                "p95 storage I/O (ms)",
                Lower,
            ),
            (
                "/summary/cache_stats/storage_read_device_p95_ms",
                "p95 device read (ms)",
                Lower,
            ),
        ]),
        Kind::Replay => {
            let mut out = list(&[
                ("/kvtrace/hits/hit_rate", "hit rate", Higher),
                ("/kvtrace/hits/l1_hit_rate", "L1 hit rate", Higher),
                ("/kvtrace/hits/l2_hit_rate", "L2 hit rate", Higher),
                ("/kvtrace/hits/hit_tokens", "hit tokens", Higher),
                ("/kvtrace/failed", "failed calls", Lower),
                (
                    "/kvtrace/calls/out_of_memory_keys",
                    "OUT_OF_MEMORY keys",
                    Lower,
                ),
                ("/kvtrace/calls/read_failures", "failed reads", Lower),
                (
                    "/kvtrace/fidelity/requests_matching",
                    "requests matching the recording",
                    Higher,
                ),
            ]);
            let tiers = report.pointer("/kvtrace/tiers").and_then(Json::as_array);
            for (i, tier) in tiers.into_iter().flatten().enumerate() {
                let name = tier.get("name").and_then(Json::as_str).unwrap_or("tier");
                out.push((
                    format!("/kvtrace/tiers/{i}/evictions"),
                    format!("{name} evictions"),
                    Lower,
                    0.0,
                ));
            }
            if latency {
                out.push((
                    "/duration_s".into(),
                    "replay duration (s)".into(),
                    Lower,
                    DURATION_NOISE_FLOOR_S,
                ));
                let ops = report.get("ops").and_then(Json::as_object);
                for q in ops.into_iter().flat_map(|o| o.keys()) {
                    let short = crate::lmct::calls::short_name(q);
                    let escaped = q.replace('~', "~0").replace('/', "~1");
                    for stat in ["mean_ms", "p99_ms"] {
                        out.push((
                            format!("/ops/{escaped}/{stat}"),
                            format!("{short} {stat}"),
                            Lower,
                            LATENCY_NOISE_FLOOR_MS,
                        ));
                    }
                }
            }
            out
        }
    }
}

/// Compares `new` against `base`, both reports of `kind`; a row regresses when it moved the
/// wrong way by more than the threshold (any move away from 0 counts as infinite) and, for a
/// live measurement, by more than its noise floor.
pub fn diff(kind: Kind, base: &Json, new: &Json, options: DiffOptions) -> Vec<DiffRow> {
    let mut rows = Vec::new();
    for (pointer, metric, better, floor) in watched(kind, base, options.latency) {
        let (Some(b), Some(n)) = (
            base.pointer(&pointer).and_then(Json::as_f64),
            new.pointer(&pointer).and_then(Json::as_f64),
        ) else {
            continue;
        };
        let change_pct = if b == n {
            0.0
        } else if b == 0.0 {
            f64::INFINITY.copysign(n)
        } else {
            (n - b) / b.abs() * 100.0
        };
        let worse = match better {
            Better::Higher => -change_pct,
            Better::Lower => change_pct,
        };
        rows.push(DiffRow {
            metric,
            base: b,
            new: n,
            change_pct,
            better,
            regressed: worse > options.max_regression_pct && (n - b).abs() > floor,
        });
    }
    rows
}

/// The delta table for a terminal.
pub fn render(rows: &[DiffRow]) -> String {
    let width = rows
        .iter()
        .map(|r| r.metric.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut s = format!(
        "{:<width$}  {:>14}  {:>14}  {:>9}  verdict\n",
        "metric", "base", "new", "change"
    );
    for r in rows {
        let change = if r.change_pct.is_finite() {
            format!("{:+.1}%", r.change_pct)
        } else {
            "new".into()
        };
        let verdict = if r.regressed {
            "REGRESSED"
        } else if r.change_pct == 0.0 {
            "="
        } else {
            "ok"
        };
        s.push_str(&format!(
            "{:<width$}  {:>14.6}  {:>14.6}  {:>9}  {verdict}\n",
            r.metric, r.base, r.new, change
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(hit_rate: f64, oom: u64, mean: f64) -> Json {
        json!({
            "duration_s": 1.0,
            "ops": {"q.submit_prefetch_task": {"mean_ms": mean, "p99_ms": mean}},
            "kvtrace": {"failed": 0, "hits": {"hit_rate": hit_rate, "l1_hit_rate": hit_rate, "l2_hit_rate": 0.0, "hit_tokens": 10},
                        "calls": {"out_of_memory_keys": oom, "read_failures": 0}}
        })
    }

    fn gate(latency: bool) -> DiffOptions {
        DiffOptions {
            max_regression_pct: 5.0,
            latency,
        }
    }

    fn regressed(rows: &[DiffRow]) -> Vec<&str> {
        rows.iter()
            .filter(|r| r.regressed)
            .map(|r| r.metric.as_str())
            .collect()
    }

    #[test]
    fn only_moves_in_the_wrong_direction_beyond_the_threshold_regress() {
        let base = summary(0.5, 0, 1.0);
        let rows = diff(Kind::Replay, &base, &summary(0.6, 0, 1.04), gate(true));
        assert!(rows.iter().all(|r| !r.regressed), "{rows:?}");
        let rows = diff(Kind::Replay, &base, &summary(0.45, 3, 1.2), gate(true));
        assert_eq!(
            regressed(&rows),
            [
                "hit rate",
                "L1 hit rate",
                "OUT_OF_MEMORY keys",
                "q.submit_prefetch_task mean_ms",
                "q.submit_prefetch_task p99_ms"
            ]
        );
        assert!(render(&rows).contains("REGRESSED"));
    }

    #[test]
    fn latencies_are_watched_only_when_asked_and_then_above_the_noise_floor() {
        // A few microseconds of noise: +300 % of a 0.002 ms call, under the floor.
        let base = summary(0.5, 0, 0.002);
        let noisy = summary(0.5, 0, 0.008);
        assert!(diff(Kind::Replay, &base, &noisy, gate(false))
            .iter()
            .all(|r| !r.metric.contains("_ms")));
        assert!(regressed(&diff(Kind::Replay, &base, &noisy, gate(true))).is_empty());
        let slow = summary(0.5, 0, 0.2);
        assert_eq!(
            regressed(&diff(Kind::Replay, &base, &slow, gate(true))).len(),
            2
        );
    }

    #[test]
    fn simulate_reports_compare_on_their_own_figures() {
        let report = |ttft: f64, rps: f64| {
            json!({"completed_requests": 100, "mean_ttft_ms": ttft, "p99_ttft_ms": ttft,
                   "request_throughput_rps": rps, "wall_time_ms": 7.0})
        };
        let base = report(100.0, 10.0);
        assert_eq!(Kind::of(&base), Some(Kind::Simulate));
        assert_eq!(Kind::of(&summary(0.5, 0, 1.0)), Some(Kind::Replay));
        let better = diff(Kind::Simulate, &base, &report(80.0, 12.0), gate(false));
        assert!(regressed(&better).is_empty(), "{better:?}");
        let worse = diff(Kind::Simulate, &base, &report(130.0, 10.0), gate(false));
        assert_eq!(regressed(&worse), ["mean TTFT (ms)", "p99 TTFT (ms)"]);
        assert!(worse.iter().all(|r| r.metric != "wall_time_ms"));
    }

    #[test]
    fn bench_reports_compare_on_hits_throughput_and_tail_latency() {
        let report = |hit: f64, p95: f64| {
            json!({"requests_completed": 50, "summary": {
                "avg_throughput_tokens_per_sec": 1000.0,
                "end_to_end_latency_ms": {"p95": p95},
                "cache_stats": {"cache_hit_rate": hit}}})
        };
        let base = report(0.5, 10.0);
        assert_eq!(Kind::of(&base), Some(Kind::Bench));
        let worse = diff(Kind::Bench, &base, &report(0.4, 12.0), gate(false));
        assert_eq!(regressed(&worse), ["cache hit rate", "p95 end-to-end (ms)"]);
        assert!(regressed(&diff(Kind::Bench, &base, &report(0.6, 9.0), gate(false))).is_empty());
    }
}
