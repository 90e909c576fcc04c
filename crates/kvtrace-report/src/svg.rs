//! SVG: a report's main chart as a picture, and its heat maps below it, for READMEs, CI
//! artefacts and terminals over SSH where no spreadsheet opens. Drawn with plotters' SVG
//! backend; text is left to the viewer's fonts, so the file is the same on every machine.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Artifact, Chart, Exporter, HeatMap, Report};
use kvtrace_io::error::{Error, Result};

pub struct Svg;

const WIDTH: u32 = 800;
/// Series of more points than this are drawn without markers.
const MAX_MARKED: usize = 24;
const HEIGHT: u32 = 480;
/// Height of one heat map below the chart.
const MAP_HEIGHT: u32 = 520;

/// Line colours, one per series in turn (a colour-blind-safe palette).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(240, 228, 66),
];

fn plot_error(e: impl std::fmt::Display) -> Error {
    Error::io(
        "cannot draw the chart",
        std::io::Error::other(e.to_string()),
    )
}

/// Pads a range that is a single value, so the axis has a width.
fn padded((lo, hi): (f64, f64)) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5 * lo.abs().max(1.0), hi + 0.5 * hi.abs().max(1.0))
    }
}

/// Draws `chart` as SVG text.
pub fn draw(chart: &Chart) -> Result<String> {
    render(Some(chart), &[])
}

/// The chart, when there is one, with the heat maps one below the other under it.
fn render(chart: Option<&Chart>, maps: &[HeatMap]) -> Result<String> {
    let height = chart.map_or(0, |_| HEIGHT) + maps.len() as u32 * MAP_HEIGHT;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let below = match chart {
            Some(chart) => {
                let (top, below) = root.split_vertically(HEIGHT);
                line_chart(&top, chart)?;
                below
            }
            None => root.clone(),
        };
        if !maps.is_empty() {
            for (area, map) in below.split_evenly((maps.len(), 1)).iter().zip(maps) {
                heat_map(area, map)?;
            }
        }
        root.present().map_err(plot_error)?;
    }
    Ok(out)
}

/// A line chart in `root`.
fn line_chart<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<()> {
    let ((x0, x1), (y0, y1)) = chart.bounds().unwrap_or(((0.0, 1.0), (0.0, 1.0)));
    let (x0, x1) = padded((x0, x1));
    let (y0, y1) = if chart.y_ratio {
        (0.0, y1.clamp(0.01, 1.0) * 1.05)
    } else {
        padded((y0.min(0.0), y1))
    };
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64);
    let percent = |v: &f64| format!("{:.0}%", v * 100.0);
    let plain = |v: &f64| format!("{v}");
    let y_format: &dyn Fn(&f64) -> String = if chart.y_ratio { &percent } else { &plain };
    macro_rules! lines {
        ($ctx:expr) => {{
            let mut ctx = $ctx;
            ctx.configure_mesh()
                .x_desc(&chart.x_title)
                .y_desc(&chart.y_title)
                .y_label_formatter(y_format)
                .draw()
                .map_err(plot_error)?;
            for (i, series) in chart.series.iter().enumerate() {
                let colour = PALETTE[i % PALETTE.len()];
                ctx.draw_series(LineSeries::new(
                    series.points.iter().copied(),
                    colour.stroke_width(2),
                ))
                .map_err(plot_error)?
                .label(&series.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                });
                // Markers on measured points; a dense computed curve is a plain line.
                if series.points.len() <= MAX_MARKED {
                    ctx.draw_series(
                        series
                            .points
                            .iter()
                            .map(|&p| Circle::new(p, 3, colour.filled())),
                    )
                    .map_err(plot_error)?;
                }
            }
            ctx.configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(plot_error)?;
        }};
    }
    if chart.x_log && x0 > 0.0 {
        lines!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(plot_error)?);
    } else {
        lines!(builder
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_error)?);
    }
    Ok(())
}

/// A heat map in `area`: a cell per value coloured on the viridis scale from the map's
/// smallest value (dark) to its largest (yellow), the value written in it; rows grow upwards.
/// Laid out by hand in pixels: plotters' discrete axes add a cell past the last.
fn heat_map<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, map: &HeatMap) -> Result<()> {
    let (columns, rows) = (map.x_labels.len(), map.y_labels.len());
    if columns == 0 || rows == 0 {
        return Ok(());
    }
    let (width, height) = area.dim_in_pixel();
    let (left, right, top, bottom) = (110i32, width as i32 - 24, 48i32, height as i32 - 64);
    let cell_w = (right - left) as f64 / columns as f64;
    let cell_h = (bottom - top) as f64 / rows as f64;
    // Column c spans x0..x1; row r (0 at the bottom) spans y0..y1.
    let x_at = |c: usize| left + (c as f64 * cell_w).round() as i32;
    let y_at = |r: usize| bottom - (r as f64 * cell_h).round() as i32;
    let text = |size: u32, colour: &RGBColor, h: HPos, v: VPos| {
        ("sans-serif", size)
            .into_font()
            .color(colour)
            .pos(Pos::new(h, v))
    };
    area.draw(&Text::new(
        map.title.as_str(),
        (width as i32 / 2, 10),
        text(20, &BLACK, HPos::Center, VPos::Top),
    ))
    .map_err(plot_error)?;
    let (lo, hi) = map.range().unwrap_or((0.0, 1.0));
    let share = |v: f64| if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
    for (r, row) in map.values.iter().enumerate().take(rows) {
        for (c, v) in row.iter().enumerate().take(columns) {
            let Some(v) = *v else { continue };
            let (x0, x1, y0, y1) = (x_at(c), x_at(c + 1), y_at(r + 1), y_at(r));
            let h = share(v);
            area.draw(&Rectangle::new(
                [(x0, y0), (x1, y1)],
                ViridisRGB.get_color(h as f32).filled(),
            ))
            .map_err(plot_error)?;
            // Dark text on the light half of the scale, white on the dark half.
            let ink = if h > 0.55 { BLACK } else { WHITE };
            area.draw(&Text::new(
                map.label(v),
                ((x0 + x1) / 2, (y0 + y1) / 2),
                text(13, &ink, HPos::Center, VPos::Center),
            ))
            .map_err(plot_error)?;
        }
    }
    let axis = BLACK.stroke_width(1);
    area.draw(&PathElement::new(
        vec![(left, top), (left, bottom), (right, bottom)],
        axis,
    ))
    .map_err(plot_error)?;
    for (c, label) in map.x_labels.iter().enumerate() {
        let x = (x_at(c) + x_at(c + 1)) / 2;
        area.draw(&Text::new(
            label.as_str(),
            (x, bottom + 8),
            text(13, &BLACK, HPos::Center, VPos::Top),
        ))
        .map_err(plot_error)?;
    }
    for (r, label) in map.y_labels.iter().enumerate() {
        let y = (y_at(r) + y_at(r + 1)) / 2;
        area.draw(&Text::new(
            label.as_str(),
            (left - 8, y),
            text(13, &BLACK, HPos::Right, VPos::Center),
        ))
        .map_err(plot_error)?;
    }
    area.draw(&Text::new(
        map.x_title.as_str(),
        ((left + right) / 2, bottom + 36),
        text(14, &BLACK, HPos::Center, VPos::Top),
    ))
    .map_err(plot_error)?;
    area.draw(&Text::new(
        map.y_title.as_str(),
        (6, (top + bottom) / 2),
        ("sans-serif", 14)
            .into_font()
            .transform(FontTransform::Rotate270)
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top)),
    ))
    .map_err(plot_error)?;
    Ok(())
}

impl Exporter for Svg {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let charts = report.charts();
        let maps = report.heat_maps();
        if charts.is_empty() && maps.is_empty() {
            return Err(Error::usage("this report has no chart to draw"));
        }
        Ok(vec![Artifact::single(
            render(charts.first(), &maps)?.into_bytes(),
        )])
    }
}
