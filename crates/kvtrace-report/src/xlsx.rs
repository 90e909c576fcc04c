//! XLSX: one sheet per table that names one. Numbers are stored as numbers with display
//! formats, so spreadsheets can sort, filter and chart them; every table has a bold, frozen
//! header row and an autofilter. Rows past Excel's limit are left out and counted in a last
//! row. A report's charts become native Excel line charts on a Charts sheet, drawn from the
//! numbers they plot, written on a Chart data sheet (two columns per line). A heat map is a
//! sheet of its values, row and column labels around them, under a three-colour scale.

use rust_xlsxwriter::{
    Chart as XlsxChart, ChartType, ConditionalFormat3ColorScale, Format, Workbook, Worksheet,
    XlsxError,
};

use super::{Artifact, Cell, Chart, Exporter, HeatMap, Report, Table, Unit};
use kvtrace_io::error::{Error, Result};

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

/// Height of one chart on the Charts sheet, in rows (the default chart is 15 rows high).
const CHART_ROWS: u32 = 22;

/// The Charts sheet, the charts one below the other, and the Chart data sheet of their
/// points.
fn charts(f: &Formats, charts: &[Chart]) -> Result<(Worksheet, Worksheet), XlsxError> {
    const DATA: &str = "Chart data";
    let mut drawn = Vec::new();
    let mut data = Worksheet::new();
    data.set_name(DATA)?;
    let mut col: u16 = 0;
    for chart in charts {
        let mut c = XlsxChart::new(ChartType::ScatterStraightWithMarkers);
        c.title().set_name(&chart.title);
        c.x_axis().set_name(&chart.x_title);
        c.y_axis().set_name(&chart.y_title);
        if chart.y_ratio {
            c.y_axis().set_num_format("0%");
        }
        if chart.x_log {
            c.x_axis().set_log_base(10);
        }
        c.set_width(720).set_height(CHART_ROWS * 20 - 20);
        for series in &chart.series {
            data.write_string_with_format(
                0,
                col,
                format!("{}: {}", chart.title, series.name),
                &f.header,
            )?;
            data.write_string_with_format(1, col, &chart.x_title, &f.header)?;
            data.write_string_with_format(1, col + 1, &series.name, &f.header)?;
            for (i, (x, y)) in series.points.iter().enumerate() {
                data.write_number(i as u32 + 2, col, *x)?;
                data.write_number(i as u32 + 2, col + 1, *y)?;
            }
            let last = series.points.len().max(1) as u32 + 1;
            c.add_series()
                .set_name(series.name.as_str())
                .set_categories((DATA, 2, col, last, col))
                .set_values((DATA, 2, col + 1, last, col + 1));
            col += 3;
        }
        drawn.push(c);
    }
    let mut sheet = Worksheet::new();
    sheet.set_name("Charts")?;
    for (i, c) in drawn.iter().enumerate() {
        sheet.insert_chart(i as u32 * CHART_ROWS, 0, c)?;
    }
    // Printed, one chart to a page: a break below each, each page one chart wide.
    let breaks: Vec<u32> = (1..drawn.len() as u32).map(|i| i * CHART_ROWS).collect();
    sheet.set_page_breaks(&breaks)?;
    sheet.set_landscape();
    sheet.set_print_fit_to_pages(1, 0);
    Ok((sheet, data))
}

/// A heat map's sheet: its title, the column labels under the x title, each row's label
/// and values, and a red-yellow-green scale over the values (low red, high green).
fn heat_map(f: &Formats, map: &HeatMap) -> Result<Worksheet, XlsxError> {
    let mut ws = Worksheet::new();
    ws.set_name(&map.sheet)?;
    ws.write_string_with_format(0, 0, &map.title, &f.header)?;
    ws.write_string_with_format(1, 1, &map.x_title, &f.header)?;
    ws.write_string_with_format(2, 0, &map.y_title, &f.header)?;
    for (c, label) in map.x_labels.iter().enumerate() {
        ws.write_string_with_format(2, c as u16 + 1, label, &f.header)?;
    }
    let value = if map.ratio { &f.pct } else { &f.secs };
    for (r, (label, row)) in map.y_labels.iter().zip(&map.values).enumerate() {
        let r = r as u32 + 3;
        ws.write_string_with_format(r, 0, label, &f.header)?;
        for (c, v) in row.iter().enumerate() {
            if let Some(v) = v {
                ws.write_number_with_format(r, c as u16 + 1, *v, value)?;
            }
        }
    }
    let (rows, cols) = (map.y_labels.len() as u32, map.x_labels.len() as u16);
    if rows > 0 && cols > 0 {
        let scale = ConditionalFormat3ColorScale::new()
            .set_minimum_color("#F8696B")
            .set_midpoint_color("#FFEB84")
            .set_maximum_color("#63BE7B");
        ws.add_conditional_format(3, 1, rows + 2, cols, &scale)?;
    }
    ws.set_freeze_panes(3, 1)?;
    ws.autofit();
    Ok(ws)
}

impl Exporter for Xlsx {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let f = Formats::new();
        let mut wb = Workbook::new();
        let drawn = report.charts();
        // The charts follow the first sheet; their data goes last.
        let (mut chart_sheet, mut data) = match drawn.is_empty() {
            true => (None, None),
            false => {
                let (c, d) = charts(&f, &drawn).map_err(xlsx_error)?;
                (Some(c), Some(d))
            }
        };
        for t in report.tables() {
            if let Some(name) = &t.sheet {
                sheet(wb.add_worksheet(), &f, name, &t).map_err(xlsx_error)?;
                if let Some(c) = chart_sheet.take() {
                    wb.push_worksheet(c);
                }
            }
        }
        for map in report.heat_maps() {
            wb.push_worksheet(heat_map(&f, &map).map_err(xlsx_error)?);
        }
        for last in [chart_sheet, data.take()].into_iter().flatten() {
            wb.push_worksheet(last);
        }
        let bytes = wb.save_to_buffer().map_err(xlsx_error)?;
        Ok(vec![Artifact::single(bytes)])
    }
}
