//! Charts: what a report wants drawn, independent of how. The XLSX exporter turns each line
//! chart into a native Excel chart over the data it writes beside it, and each heat map into a
//! sheet of its values under a colour scale; the SVG exporter draws the first line chart and
//! every heat map below it.

/// One line of a chart: `(x, y)` points in x order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart of numeric x and y.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_title: String,
    pub y_title: String,
    /// The y values are shares (0..1), shown as percentages.
    pub y_ratio: bool,
    /// Draw the x axis on a log scale (capacities spanning decades).
    pub x_log: bool,
    pub series: Vec<Series>,
}

impl Chart {
    /// The smallest and largest x and y of every series; `None` with no points.
    pub fn bounds(&self) -> Option<((f64, f64), (f64, f64))> {
        let mut it = self.series.iter().flat_map(|s| s.points.iter().copied());
        let (x0, y0) = it.next()?;
        Some(
            it.fold(((x0, x0), (y0, y0)), |((xl, xh), (yl, yh)), (x, y)| {
                ((xl.min(x), xh.max(x)), (yl.min(y), yh.max(y)))
            }),
        )
    }
}

/// A heat map: a value for each pair of two sizes (a grid of L1 × L2 capacities), drawn as
/// coloured cells — a colour scale in XLSX, filled squares in SVG — where a line chart would
/// need a line per row.
#[derive(Clone, Debug, PartialEq)]
pub struct HeatMap {
    pub title: String,
    /// The XLSX sheet it gets (at most 31 characters, Excel's limit).
    pub sheet: String,
    /// What the columns are (the x axis), and each column's label.
    pub x_title: String,
    pub x_labels: Vec<String>,
    /// What the rows are (the y axis, drawn growing upwards), and each row's label.
    pub y_title: String,
    pub y_labels: Vec<String>,
    /// `values[row][column]`; `None` where no value was measured.
    pub values: Vec<Vec<Option<f64>>>,
    /// The values are shares (0..1), shown as percentages.
    pub ratio: bool,
}

impl HeatMap {
    /// The smallest and largest value; `None` when no cell has one.
    pub fn range(&self) -> Option<(f64, f64)> {
        let mut it = self.values.iter().flatten().flatten().copied();
        let first = it.next()?;
        Some(it.fold((first, first), |(lo, hi), v| (lo.min(v), hi.max(v))))
    }

    /// A value as its cell shows it.
    pub fn label(&self, v: f64) -> String {
        if self.ratio {
            format!("{:.1}%", v * 100.0)
        } else if v.abs() >= 100.0 || v == 0.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    }
}
