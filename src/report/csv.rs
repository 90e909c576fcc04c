//! CSV, one file per table: `trace_replay_ops.csv` with LMCache's columns and six decimals,
//! `trace_replay_requests.csv` (one row per prefetch, replayed and recorded hits side by
//! side), `trace_replay_tiers.csv` and `trace_replay_divergences.csv` (the first requests
//! and stores that differ from the recording, with a reason).

use super::tables::{Table, TableExporter};
use super::{Exporter, ReplayReport, DIVERGENCE_COLUMNS, OP_COLUMNS, REQUEST_COLUMNS};
use crate::error::{Error, Result};

pub struct CsvTables;

fn finish(w: csv::Writer<Vec<u8>>) -> Result<Vec<u8>> {
    w.into_inner()
        .map_err(|e| Error::io("cannot write CSV", std::io::Error::other(e.to_string())))
}

fn io(e: csv::Error) -> Error {
    Error::io("cannot write CSV", std::io::Error::other(e.to_string()))
}

impl Exporter for CsvTables {
    fn files(&self, report: &ReplayReport) -> Result<Vec<(String, Vec<u8>)>> {
        let mut ops = csv::Writer::from_writer(Vec::new());
        ops.write_record(OP_COLUMNS).map_err(io)?;
        for (q, s) in &report.ops {
            let f = |x: f64| format!("{x:.6}");
            ops.write_record([
                q.clone(),
                s.count.to_string(),
                s.errors.to_string(),
                f(s.mean_ms),
                f(s.p50_ms),
                f(s.p90_ms),
                f(s.p99_ms),
                f(s.min_ms),
                f(s.max_ms),
            ])
            .map_err(io)?;
        }
        let mut requests = csv::Writer::from_writer(Vec::new());
        requests.write_record(REQUEST_COLUMNS).map_err(io)?;
        for r in &report.requests {
            let tokens = r.chunk_tokens.unwrap_or(0);
            requests
                .write_record([
                    r.external_request_id.clone(),
                    format!("{:.6}", r.t),
                    r.requested_chunks.to_string(),
                    r.hit_chunks.to_string(),
                    r.l1_hit_chunks.to_string(),
                    r.l2_hit_chunks.to_string(),
                    r.chunk_tokens.map(|t| t.to_string()).unwrap_or_default(),
                    (r.requested_chunks * tokens).to_string(),
                    (r.hit_chunks * tokens).to_string(),
                    format!("{:.6}", r.hit_rate()),
                    r.recorded_hit_chunks
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                ])
                .map_err(io)?;
        }
        let mut divergences = csv::Writer::from_writer(Vec::new());
        divergences.write_record(DIVERGENCE_COLUMNS).map_err(io)?;
        for d in &report.fidelity.first_divergences {
            divergences
                .write_record([
                    d.record.to_string(),
                    d.offset.to_string(),
                    format!("{:.6}", d.t_mono),
                    d.kind.to_string(),
                    d.request_id.clone(),
                    d.recorded.to_string(),
                    d.replayed.to_string(),
                    d.chunk.map(|c| c.to_string()).unwrap_or_default(),
                    d.reason.clone(),
                ])
                .map_err(io)?;
        }
        let mut tiers = csv::Writer::from_writer(Vec::new());
        for t in &report.tiers {
            tiers.serialize(t).map_err(io)?;
        }
        Ok(vec![
            ("trace_replay_ops.csv".into(), finish(ops)?),
            ("trace_replay_requests.csv".into(), finish(requests)?),
            ("trace_replay_tiers.csv".into(), finish(tiers)?),
            ("trace_replay_divergences.csv".into(), finish(divergences)?),
        ])
    }
}

impl TableExporter for CsvTables {
    fn table_files(&self, stem: &str, tables: &[Table]) -> Result<Vec<(String, Vec<u8>)>> {
        tables
            .iter()
            .map(|t| {
                let mut w = csv::Writer::from_writer(Vec::new());
                w.write_record(&t.columns).map_err(io)?;
                for row in &t.rows {
                    w.write_record(row.iter().map(|c| c.text())).map_err(io)?;
                }
                Ok((format!("{stem}_{}.csv", t.name.to_lowercase()), finish(w)?))
            })
            .collect()
    }
}
