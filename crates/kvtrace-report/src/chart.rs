//! Charts: what a report wants drawn, independent of how. The XLSX exporter turns each into a
//! native Excel chart over the data it writes beside it; the SVG exporter draws the first.

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
