//! SVG: a report's main chart as a picture, for READMEs, CI artefacts and terminals over SSH
//! where no spreadsheet opens. Drawn with plotters' SVG backend; text is left to the viewer's
//! fonts, so the file is the same on every machine.

use plotters::prelude::*;

use super::{Artifact, Chart, Exporter, Report};
use kvtrace_io::error::{Error, Result};

pub struct Svg;

const WIDTH: u32 = 800;
/// Series of more points than this are drawn without markers.
const MAX_MARKED: usize = 24;
const HEIGHT: u32 = 480;

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
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let ((x0, x1), (y0, y1)) = chart.bounds().unwrap_or(((0.0, 1.0), (0.0, 1.0)));
        let (x0, x1) = padded((x0, x1));
        let (y0, y1) = if chart.y_ratio {
            (0.0, y1.clamp(0.01, 1.0) * 1.05)
        } else {
            padded((y0.min(0.0), y1))
        };
        let mut builder = ChartBuilder::on(&root);
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
        root.present().map_err(plot_error)?;
    }
    Ok(out)
}

impl Exporter for Svg {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let charts = report.charts();
        let Some(chart) = charts.first() else {
            return Err(Error::usage("this report has no chart to draw"));
        };
        Ok(vec![Artifact::single(draw(chart)?.into_bytes())])
    }
}
