//! XLSX: one sheet per table that names one. Numbers are stored as numbers with display
//! formats, so spreadsheets can sort, filter and chart them; every table has a bold, frozen
//! header row and an autofilter. Rows past Excel's limit are left out and counted in a last
//! row.

use rust_xlsxwriter::{Format, Workbook, Worksheet, XlsxError};

use super::{Artifact, Cell, Exporter, Report, Table, Unit};
use crate::error::{Error, Result};

pub struct Xlsx;

/// Excel's row limit, header included.
const MAX_ROWS: usize = 1_048_576;

/// Data rows a sheet holds: Excel's limit less the header and the note of what was left out.
pub const MAX_DATA_ROWS: usize = MAX_ROWS - 2;

struct Formats {
    header: Format,
    int: Format,
    ms: Format,
    secs: Format,
    pct: Format,
}

impl Formats {
    fn new() -> Formats {
        Formats {
            header: Format::new().set_bold(),
            int: Format::new().set_num_format("#,##0"),
            ms: Format::new().set_num_format("0.000000"),
            secs: Format::new().set_num_format("0.000"),
            pct: Format::new().set_num_format("0.0%"),
        }
    }
}

fn xlsx_error(e: XlsxError) -> Error {
    Error::io(
        "cannot build the XLSX workbook",
        std::io::Error::other(e.to_string()),
    )
}

fn write_cell(
    ws: &mut Worksheet,
    f: &Formats,
    row: u32,
    col: u16,
    cell: &Cell,
) -> Result<(), XlsxError> {
    match cell {
        Cell::Count(n) => {
            ws.write_number_with_format(row, col, *n as f64, &f.int)?;
        }
        Cell::Number(v) if v.fract() == 0.0 => {
            ws.write_number_with_format(row, col, *v, &f.int)?;
        }
        Cell::Number(v) => {
            ws.write_number(row, col, *v)?;
        }
        Cell::Measure(v, unit) => {
            let format = match unit {
                Unit::Seconds => &f.secs,
                Unit::Millis => &f.ms,
                Unit::Ratio => &f.pct,
            };
            ws.write_number_with_format(row, col, *v, format)?;
        }
        Cell::Text(s) => {
            ws.write_string(row, col, s)?;
        }
        Cell::Bool(b) => {
            ws.write_boolean(row, col, *b)?;
        }
        Cell::Empty => {}
    }
    Ok(())
}

fn sheet(ws: &mut Worksheet, f: &Formats, name: &str, table: &Table) -> Result<(), XlsxError> {
    ws.set_name(name)?;
    let rows = table.rows.len().min(MAX_DATA_ROWS);
    for (c, name) in table.columns.iter().enumerate() {
        ws.write_string_with_format(0, c as u16, name, &f.header)?;
    }
    if !table.columns.is_empty() {
        ws.set_freeze_panes(1, 0)?;
        ws.autofilter(0, 0, rows as u32, (table.columns.len() - 1) as u16)?;
    }
    for (i, cells) in table.rows.iter().take(rows).enumerate() {
        for (c, cell) in cells.iter().enumerate() {
            write_cell(ws, f, i as u32 + 1, c as u16, cell)?;
        }
    }
    let mut next = rows as u32 + 1;
    if rows < table.rows.len() {
        let note = format!(
            "{} rows left out (Excel row limit)",
            table.rows.len() - rows
        );
        ws.write_string(next, 0, note)?;
        next += 1;
    }
    for (i, cells) in table.footer.iter().enumerate() {
        for (c, cell) in cells.iter().enumerate() {
            write_cell(ws, f, next + 1 + i as u32, c as u16, cell)?;
        }
    }
    ws.autofit();
    Ok(())
}

impl Exporter for Xlsx {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let f = Formats::new();
        let mut wb = Workbook::new();
        for t in report.tables() {
            if let Some(name) = &t.sheet {
                sheet(wb.add_worksheet(), &f, name, &t).map_err(xlsx_error)?;
            }
        }
        let bytes = wb.save_to_buffer().map_err(xlsx_error)?;
        Ok(vec![Artifact::single(bytes)])
    }
}
