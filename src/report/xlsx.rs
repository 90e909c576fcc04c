//! `trace_replay.xlsx`: sheets Summary, Ops, Requests, Tiers, Fidelity and Config. Numbers are stored
//! as numbers with display formats, so spreadsheets can sort, filter and chart them; every
//! table has a bold, frozen header row and an autofilter.

use rust_xlsxwriter::{Format, Workbook, Worksheet, XlsxError};
use serde_json::Value as Json;

use super::tables::{Cell, Table, TableExporter};
use super::{Exporter, ReplayReport, DIVERGENCE_COLUMNS, OP_COLUMNS, REQUEST_COLUMNS};
use crate::error::{Error, Result};

pub struct XlsxWorkbook;

/// Excel's row limit, header included.
const MAX_ROWS: usize = 1_048_576;

struct Formats {
    header: Format,
    int: Format,
    ms: Format,
    secs: Format,
    pct: Format,
}

fn xlsx_error(e: XlsxError) -> Error {
    Error::io(
        "cannot build the XLSX workbook",
        std::io::Error::other(e.to_string()),
    )
}

/// Writes a bold header, freezes it, and puts an autofilter over `rows` data rows.
fn table_header(
    ws: &mut Worksheet,
    f: &Formats,
    columns: &[&str],
    rows: usize,
) -> Result<(), XlsxError> {
    for (c, name) in columns.iter().enumerate() {
        ws.write_string_with_format(0, c as u16, *name, &f.header)?;
    }
    ws.set_freeze_panes(1, 0)?;
    ws.autofilter(0, 0, rows as u32, (columns.len() - 1) as u16)?;
    Ok(())
}

fn summary(
    ws: &mut Worksheet,
    f: &Formats,
    r: &ReplayReport,
    truncated: usize,
) -> Result<(), XlsxError> {
    ws.set_name("Summary")?;
    let h = &r.hits;
    let c = &r.calls;
    let texts: [(&str, &str); 7] = [
        ("trace", &r.trace),
        ("level", &r.level),
        ("pacing", &r.pacing),
        ("interrupted", if r.interrupted { "yes" } else { "no" }),
        ("config digest", &r.digest.result),
        ("recorded digest", &r.digest.recorded),
        ("run digest", &r.digest.run),
    ];
    let ints: [(&str, u64); 17] = [
        ("records", r.records),
        ("replayed", r.replayed),
        ("skipped", r.skipped),
        ("failed", r.failed),
        ("requests", h.requests),
        ("requested chunks", h.requested_chunks),
        ("hit chunks", h.hit_chunks),
        ("L1 hit chunks", h.l1_hit_chunks),
        ("L2 hit chunks", h.l2_hit_chunks),
        ("requested tokens", h.requested_tokens),
        ("hit tokens", h.hit_tokens),
        ("keys reserved", c.keys_reserved),
        ("keys not writable", c.keys_not_writable),
        ("OUT_OF_MEMORY reservations", c.out_of_memory_calls),
        ("OUT_OF_MEMORY keys", c.out_of_memory_keys),
        ("failed reads of prefetched keys", c.read_failures),
        ("request rows left out (Excel row limit)", truncated as u64),
    ];
    let rates: [(&str, f64); 3] = [
        ("hit rate", h.hit_rate),
        ("L1 hit rate", h.l1_hit_rate),
        ("L2 hit rate", h.l2_hit_rate),
    ];
    let mut row = 1u32;
    for (k, v) in texts {
        ws.write_string(row, 0, k)?;
        ws.write_string(row, 1, v)?;
        row += 1;
    }
    ws.write_string(row, 0, "duration (s)")?;
    ws.write_number_with_format(row, 1, r.duration_s, &f.secs)?;
    row += 1;
    for (k, v) in ints {
        ws.write_string(row, 0, k)?;
        ws.write_number_with_format(row, 1, v as f64, &f.int)?;
        row += 1;
    }
    for (k, v) in rates {
        ws.write_string(row, 0, k)?;
        ws.write_number_with_format(row, 1, v, &f.pct)?;
        row += 1;
    }
    table_header(ws, f, &["metric", "value"], row as usize - 1)?;
    ws.autofit();
    Ok(())
}

fn ops(ws: &mut Worksheet, f: &Formats, r: &ReplayReport) -> Result<(), XlsxError> {
    ws.set_name("Ops")?;
    table_header(ws, f, &OP_COLUMNS, r.ops.len())?;
    for (i, (q, s)) in r.ops.iter().enumerate() {
        let row = i as u32 + 1;
        ws.write_string(row, 0, q)?;
        ws.write_number_with_format(row, 1, s.count as f64, &f.int)?;
        ws.write_number_with_format(row, 2, s.errors as f64, &f.int)?;
        for (c, v) in [s.mean_ms, s.p50_ms, s.p90_ms, s.p99_ms, s.min_ms, s.max_ms]
            .into_iter()
            .enumerate()
        {
            ws.write_number_with_format(row, c as u16 + 3, v, &f.ms)?;
        }
    }
    ws.autofit();
    Ok(())
}

fn requests(
    ws: &mut Worksheet,
    f: &Formats,
    r: &ReplayReport,
    rows: usize,
) -> Result<(), XlsxError> {
    ws.set_name("Requests")?;
    table_header(ws, f, &REQUEST_COLUMNS, rows)?;
    for (i, q) in r.requests.iter().take(rows).enumerate() {
        let row = i as u32 + 1;
        let tokens = q.chunk_tokens.unwrap_or(0);
        ws.write_string(row, 0, &q.external_request_id)?;
        ws.write_number_with_format(row, 1, q.t, &f.secs)?;
        let counts = [
            q.requested_chunks,
            q.hit_chunks,
            q.l1_hit_chunks,
            q.l2_hit_chunks,
            tokens,
            q.requested_chunks * tokens,
            q.hit_chunks * tokens,
        ];
        for (c, v) in counts.into_iter().enumerate() {
            ws.write_number_with_format(row, c as u16 + 2, v as f64, &f.int)?;
        }
        ws.write_number_with_format(row, 9, q.hit_rate(), &f.pct)?;
        if let Some(n) = q.recorded_hit_chunks {
            ws.write_number_with_format(row, 10, n as f64, &f.int)?;
        }
    }
    ws.autofit();
    Ok(())
}

fn tiers(ws: &mut Worksheet, f: &Formats, r: &ReplayReport) -> Result<(), XlsxError> {
    ws.set_name("Tiers")?;
    let columns = [
        "tier",
        "backend",
        "capacity_bytes",
        "resident_bytes",
        "resident_objects",
        "peak_bytes",
        "bytes_written",
        "bytes_read",
        "writes",
        "reads",
        "evictions",
        "bytes_evicted",
        "write_errors",
        "read_errors",
        "delete_errors",
    ];
    table_header(ws, f, &columns, r.tiers.len())?;
    for (i, t) in r.tiers.iter().enumerate() {
        let row = i as u32 + 1;
        ws.write_string(row, 0, &t.name)?;
        ws.write_string(row, 1, &t.backend)?;
        if let Some(cap) = t.capacity_bytes {
            ws.write_number_with_format(row, 2, cap as f64, &f.int)?;
        }
        let values = [
            t.resident_bytes,
            t.resident_objects,
            t.peak_bytes,
            t.bytes_written,
            t.bytes_read,
            t.writes,
            t.reads,
            t.evictions,
            t.bytes_evicted,
            t.write_errors,
            t.read_errors,
            t.delete_errors,
        ];
        for (c, v) in values.into_iter().enumerate() {
            ws.write_number_with_format(row, c as u16 + 3, v as f64, &f.int)?;
        }
    }
    ws.autofit();
    Ok(())
}

/// `(dotted path, value)` of every leaf of a JSON value, in key order.
fn leaves(prefix: &str, v: &Json, out: &mut Vec<(String, Json)>) {
    match v {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&path, &m[k], out);
            }
        }
        Json::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                leaves(&format!("{prefix}[{i}]"), item, out);
            }
        }
        other => out.push((prefix.to_owned(), other.clone())),
    }
}

fn config(ws: &mut Worksheet, f: &Formats, r: &ReplayReport) -> Result<(), XlsxError> {
    ws.set_name("Config")?;
    let mut rows = Vec::new();
    leaves("", &r.config, &mut rows);
    table_header(ws, f, &["setting", "value"], rows.len())?;
    for (i, (path, value)) in rows.iter().enumerate() {
        let row = i as u32 + 1;
        ws.write_string(row, 0, path)?;
        match value {
            Json::Number(n) => {
                ws.write_number(row, 1, n.as_f64().unwrap_or(0.0))?;
            }
            Json::Bool(b) => {
                ws.write_boolean(row, 1, *b)?;
            }
            Json::String(s) => {
                ws.write_string(row, 1, s)?;
            }
            other => {
                ws.write_string(row, 1, other.to_string())?;
            }
        }
    }
    ws.autofit();
    Ok(())
}

/// The fidelity summary above the table of the first divergences.
fn fidelity(ws: &mut Worksheet, f: &Formats, r: &ReplayReport) -> Result<(), XlsxError> {
    ws.set_name("Fidelity")?;
    let fi = &r.fidelity;
    let ints: [(&str, u64); 11] = [
        ("requests", fi.requests),
        ("requests matching", fi.requests_matching),
        ("recorded hit chunks", fi.recorded_hit_chunks),
        ("replayed hit chunks", fi.replayed_hit_chunks),
        ("replayed L1 hit chunks", fi.replayed_l1_hit_chunks),
        ("replayed L2 hit chunks", fi.replayed_l2_hit_chunks),
        ("stores", fi.stores),
        ("stores matching", fi.stores_matching),
        ("recorded reserved keys", fi.recorded_reserved_keys),
        ("replayed reserved keys", fi.replayed_reserved_keys),
        ("divergences", fi.divergences),
    ];
    for (c, name) in DIVERGENCE_COLUMNS.iter().enumerate() {
        ws.write_string_with_format(0, c as u16, *name, &f.header)?;
    }
    let rows = fi.first_divergences.len();
    for (i, d) in fi.first_divergences.iter().enumerate() {
        let row = i as u32 + 1;
        ws.write_number_with_format(row, 0, d.record as f64, &f.int)?;
        ws.write_number_with_format(row, 1, d.offset as f64, &f.int)?;
        ws.write_number_with_format(row, 2, d.t_mono, &f.secs)?;
        ws.write_string(row, 3, d.kind)?;
        ws.write_string(row, 4, &d.request_id)?;
        ws.write_number_with_format(row, 5, d.recorded as f64, &f.int)?;
        ws.write_number_with_format(row, 6, d.replayed as f64, &f.int)?;
        if let Some(c) = d.chunk {
            ws.write_number_with_format(row, 7, c as f64, &f.int)?;
        }
        ws.write_string(row, 8, &d.reason)?;
    }
    ws.set_freeze_panes(1, 0)?;
    ws.autofilter(0, 0, rows as u32, (DIVERGENCE_COLUMNS.len() - 1) as u16)?;
    let mut row = rows as u32 + 2;
    for (k, v) in ints {
        ws.write_string(row, 0, k)?;
        ws.write_number_with_format(row, 1, v as f64, &f.int)?;
        row += 1;
    }
    ws.write_string(row, 0, "request match rate")?;
    ws.write_number_with_format(row, 1, fi.request_match_rate(), &f.pct)?;
    if let Some(p) = &r.eviction_phase {
        ws.write_string(row + 1, 0, "eviction phase (s)")?;
        ws.write_number_with_format(row + 1, 1, p.phase_s, &f.ms)?;
        ws.write_string(row + 2, 0, "eviction phase source")?;
        ws.write_string(row + 2, 1, p.source)?;
    }
    ws.autofit();
    Ok(())
}

fn formats() -> Formats {
    Formats {
        header: Format::new().set_bold(),
        int: Format::new().set_num_format("#,##0"),
        ms: Format::new().set_num_format("0.000000"),
        secs: Format::new().set_num_format("0.000"),
        pct: Format::new().set_num_format("0.0%"),
    }
}

fn build(report: &ReplayReport) -> Result<Vec<u8>, XlsxError> {
    let f = formats();
    let rows = report.requests.len().min(MAX_ROWS - 1);
    let mut wb = Workbook::new();
    summary(wb.add_worksheet(), &f, report, report.requests.len() - rows)?;
    ops(wb.add_worksheet(), &f, report)?;
    requests(wb.add_worksheet(), &f, report, rows)?;
    tiers(wb.add_worksheet(), &f, report)?;
    fidelity(wb.add_worksheet(), &f, report)?;
    config(wb.add_worksheet(), &f, report)?;
    wb.save_to_buffer()
}

impl Exporter for XlsxWorkbook {
    fn files(&self, report: &ReplayReport) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(vec![(
            "trace_replay.xlsx".into(),
            build(report).map_err(xlsx_error)?,
        )])
    }
}

/// One sheet per table; rows past Excel's limit are left out and counted in a last row.
fn table_sheet(ws: &mut Worksheet, f: &Formats, table: &Table) -> Result<(), XlsxError> {
    ws.set_name(&table.name)?;
    let rows = table.rows.len().min(MAX_ROWS - 2);
    let columns: Vec<&str> = table.columns.iter().map(String::as_str).collect();
    if !columns.is_empty() {
        table_header(ws, f, &columns, rows)?;
    }
    for (i, cells) in table.rows.iter().take(rows).enumerate() {
        let row = i as u32 + 1;
        for (c, cell) in cells.iter().enumerate() {
            let col = c as u16;
            match cell {
                Cell::Number(v) if v.fract() == 0.0 => {
                    ws.write_number_with_format(row, col, *v, &f.int)?;
                }
                Cell::Number(v) => {
                    ws.write_number(row, col, *v)?;
                }
                Cell::Text(s) => {
                    ws.write_string(row, col, s)?;
                }
                Cell::Bool(b) => {
                    ws.write_boolean(row, col, *b)?;
                }
                Cell::Empty => {}
            }
        }
    }
    if rows < table.rows.len() {
        let note = format!(
            "{} rows left out (Excel row limit)",
            table.rows.len() - rows
        );
        ws.write_string(rows as u32 + 1, 0, note)?;
    }
    ws.autofit();
    Ok(())
}

impl TableExporter for XlsxWorkbook {
    fn table_files(&self, stem: &str, tables: &[Table]) -> Result<Vec<(String, Vec<u8>)>> {
        let f = formats();
        let mut wb = Workbook::new();
        for t in tables {
            table_sheet(wb.add_worksheet(), &f, t).map_err(xlsx_error)?;
        }
        Ok(vec![(
            format!("{stem}.xlsx"),
            wb.save_to_buffer().map_err(xlsx_error)?,
        )])
    }
}
