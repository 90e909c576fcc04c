//! `kvtrace diff`: compares two replay summaries (`trace_replay_summary.json`) on the metrics a
//! regression replay watches, and says which moved the wrong way by more than a threshold.

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

/// The watched metrics: JSON pointer into a summary, display name, direction.
fn watched(summary: &Json) -> Vec<(String, String, Better)> {
    let mut out: Vec<(String, String, Better)> = [
        ("/kvtrace/hits/hit_rate", "hit rate", Better::Higher),
        ("/kvtrace/hits/l1_hit_rate", "L1 hit rate", Better::Higher),
        ("/kvtrace/hits/l2_hit_rate", "L2 hit rate", Better::Higher),
        ("/kvtrace/hits/hit_tokens", "hit tokens", Better::Higher),
        ("/kvtrace/failed", "failed calls", Better::Lower),
        (
            "/kvtrace/calls/out_of_memory_keys",
            "OUT_OF_MEMORY keys",
            Better::Lower,
        ),
        (
            "/kvtrace/calls/read_failures",
            "failed reads",
            Better::Lower,
        ),
        ("/duration_s", "replay duration (s)", Better::Lower),
    ]
    .iter()
    .map(|(p, n, b)| (p.to_string(), n.to_string(), *b))
    .collect();
    if let Some(ops) = summary.get("ops").and_then(Json::as_object) {
        for q in ops.keys() {
            let short = crate::lmct::calls::short_name(q);
            let escaped = q.replace('~', "~0").replace('/', "~1");
            for stat in ["mean_ms", "p99_ms"] {
                out.push((
                    format!("/ops/{escaped}/{stat}"),
                    format!("{short} {stat}"),
                    Better::Lower,
                ));
            }
        }
    }
    out
}

/// Compares `new` against `base`; a row regresses when it moved the wrong way by more than
/// `max_regression_pct` percent (any move away from 0 counts as infinite).
pub fn diff(base: &Json, new: &Json, max_regression_pct: f64) -> Vec<DiffRow> {
    let mut rows = Vec::new();
    for (pointer, metric, better) in watched(base) {
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
            regressed: worse > max_regression_pct,
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

    #[test]
    fn only_moves_in_the_wrong_direction_beyond_the_threshold_regress() {
        let base = summary(0.5, 0, 1.0);
        let rows = diff(&base, &summary(0.6, 0, 1.04), 5.0);
        assert!(rows.iter().all(|r| !r.regressed), "{rows:?}");
        let rows = diff(&base, &summary(0.45, 3, 1.2), 5.0);
        let bad: Vec<&str> = rows
            .iter()
            .filter(|r| r.regressed)
            .map(|r| r.metric.as_str())
            .collect();
        assert_eq!(
            bad,
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
}
