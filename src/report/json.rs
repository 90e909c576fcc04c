//! `trace_replay_summary.json`: LMCache's shape (`duration_s`, `ops`) with kvtrace's sections
//! added beside it, keys sorted and indented by two as LMCache writes it.

use serde_json::{json, Value};

use super::{Exporter, ReplayReport};
use crate::error::{Error, Result};

pub struct JsonSummary;

/// The summary as a JSON value; LMCache's keys first in meaning, every key sorted on output.
pub fn summary(report: &ReplayReport) -> Value {
    json!({
        "duration_s": report.duration_s,
        "ops": report.ops,
        "kvtrace": {
            "trace": report.trace,
            "level": report.level,
            "pacing": report.pacing,
            "records": report.records,
            "interrupted": report.interrupted,
            "replayed": report.replayed,
            "skipped": report.skipped,
            "failed": report.failed,
            "digest": report.digest,
            "config": report.config,
            "hits": report.hits,
            "calls": report.calls,
            "tiers": report.tiers,
            "tier_io": report.tier_io,
            "skip_reasons": report.skip_reasons,
            "failure_reasons": report.failure_reasons,
            "forced_exits": report.forced_exits,
            "fidelity": report.fidelity,
            "completions": report.completions,
            "eviction_phase": report.eviction_phase,
            "warnings": report.warnings,
        }
    })
}

impl Exporter for JsonSummary {
    fn files(&self, report: &ReplayReport) -> Result<Vec<(String, Vec<u8>)>> {
        let mut text = serde_json::to_string_pretty(&sorted(summary(report)))
            .map_err(|e| Error::io("cannot encode JSON", e.into()))?;
        text.push('\n');
        Ok(vec![(
            "trace_replay_summary.json".into(),
            text.into_bytes(),
        )])
    }
}

/// Sorts object keys recursively (serde_json keeps insertion order in this build).
pub fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
