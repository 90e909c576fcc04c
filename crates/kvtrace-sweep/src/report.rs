//! A sweep as every format sees it: one row per point on a Points sheet, a sheet per family of
//! figures, the main curve as a chart (one line per combination of the other flags that
//! vary), and in the terminal a compact table with the best point of each line.

use std::fmt::Write as _;

use serde_json::{json, Map, Value as Json};

use super::replay::{ReplayPoint, ReplaySweep};
use super::simulate::SimulateSweep;
use super::Point;
use crate::error::Result;
use kvtrace_report::table::Unit;
use kvtrace_report::terminal::{escape_line, fold};
use kvtrace_report::units::{bytes, percent as pct};
use kvtrace_report::{Cell, Chart, JsonStyle, Report, Series, Table};

const GIB: f64 = (1u64 << 30) as f64;

/// The stack-distance curve's line: what it models, in a legend's words.
const CURVE_NAME: &str = "idealised: immediate LRU, every miss stored (stack distances)";

/// The model curve's line: full replays, as the points.
const MODEL_CURVE_NAME: &str = "LMCache model (full replays)";

/// Whether an axis's values grow by doubling (or faster): then a log scale spreads them
/// evenly where a linear one crowds the small ones into a corner.
fn doubling(values: &[f64]) -> bool {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| *x > 0.0).collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v.len() >= 3 && v.windows(2).all(|w| w[1] / w[0] >= 1.8)
}

/// The flags any point sets, in the order they first appear.
fn flags(points: &[&Point]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in points {
        for (f, _) in &p.settings {
            if !out.contains(f) {
                out.push(f.clone());
            }
        }
    }
    out
}

/// A setting as a typed cell: numbers and switches stay numbers and booleans.
fn setting_cell(value: Option<&str>) -> Cell {
    match value {
        None => Cell::Empty,
        Some("true") => Cell::Bool(true),
        Some("false") => Cell::Bool(false),
        Some(v) => match v.parse::<f64>() {
            Ok(x) if x.is_finite() => Cell::Number(x),
            _ => Cell::text(v),
        },
    }
}

/// A table whose first columns name the point and its settings.
fn point_table(points: &[&Point], columns: &[&str]) -> Table {
    let flags = flags(points);
    let mut head = vec!["point".to_string()];
    head.extend(flags.iter().cloned());
    head.extend(columns.iter().map(|c| c.to_string()));
    let mut t = Table::new(&head);
    t.rows = points
        .iter()
        .map(|p| {
            let mut row = vec![Cell::text(&p.name)];
            row.extend(flags.iter().map(|f| setting_cell(p.get(f))));
            row
        })
        .collect();
    t
}

/// The flags whose values differ between points.
fn varying(points: &[&Point]) -> Vec<String> {
    flags(points)
        .into_iter()
        .filter(|f| {
            let first = points.first().and_then(|p| p.get(f));
            points.iter().any(|p| p.get(f) != first)
        })
        .collect()
}

/// The x axis of the main chart: the first of `preferred` that varies with numeric values,
/// else the first such flag.
fn x_flag(points: &[&Point], preferred: &[&str]) -> Option<String> {
    let numeric = |f: &str| {
        points
            .iter()
            .all(|p| p.get(f).is_some_and(|v| v.parse::<f64>().is_ok()))
    };
    let varying = varying(points);
    preferred
        .iter()
        .map(|f| f.to_string())
        .find(|f| varying.contains(f) && numeric(f))
        .or_else(|| varying.iter().find(|f| numeric(f)).cloned())
}

/// The line a point belongs to: the other varying flags' values.
fn line_of(point: &Point, varying: &[String], x: &str) -> String {
    let name = varying
        .iter()
        .filter(|f| *f != x)
        .filter_map(|f| point.get(f).map(|v| format!("{f}={v}")))
        .collect::<Vec<_>>()
        .join(" ");
    if name.is_empty() {
        "all".into()
    } else {
        name
    }
}

/// Lines of `(x, y)` by the point's line, in the order lines first appear, each sorted by x.
fn lines(
    points: &[&Point],
    x: &str,
    x_of: &dyn Fn(usize) -> f64,
    y_of: &dyn Fn(usize) -> f64,
) -> Vec<Series> {
    let varying = varying(points);
    let mut out: Vec<Series> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let name = line_of(p, &varying, x);
        let at = match out.iter().position(|s| s.name == name) {
            Some(at) => at,
            None => {
                out.push(Series {
                    name,
                    points: Vec::new(),
                });
                out.len() - 1
            }
        };
        out[at].points.push((x_of(i), y_of(i)));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

fn settings_json(p: &Point) -> Json {
    Json::Object(
        p.settings
            .iter()
            .map(|(f, v)| (f.clone(), Json::String(v.clone())))
            .collect(),
    )
}

fn ratio(v: f64) -> Cell {
    Cell::Measure(v, Unit::Ratio)
}

/// Lays out rows of text in columns, the first left-aligned, the rest right-aligned.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::from(" ");
        for (c, cell) in r.iter().enumerate() {
            if c == 0 {
                let _ = write!(line, " {cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(line, "  {cell:>w$}", w = widths[c]);
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

impl ReplaySweep {
    fn refs(&self) -> Vec<&Point> {
        self.points.iter().map(|p| &p.point).collect()
    }

    /// The flag on the main chart's x axis: the L1 size when it varies, else another
    /// numeric flag.
    fn x_axis(&self) -> Option<String> {
        x_flag(&self.refs(), &["l1-size-gb"])
    }

    /// Point `i`'s x: the L1 size in GiB it ran (as the configuration has it), or the flag's
    /// value.
    fn x_value(&self, i: usize, x: &str) -> f64 {
        let p = &self.points[i];
        if x == "l1-size-gb" {
            p.figures.l1_size_bytes as f64 / GIB
        } else {
            p.point.get(x).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        }
    }

    /// The curve's points over the chart's L1 range: 64 sizes evenly spread on a log scale,
    /// plus every size a point replayed, each at least large enough for the largest request.
    pub fn curve_points(&self) -> Vec<(f64, f64)> {
        let Some(curve) = &self.curve else {
            return Vec::new();
        };
        let sizes: Vec<f64> = self
            .points
            .iter()
            .map(|p| p.figures.l1_size_bytes as f64)
            .filter(|&b| b > 0.0)
            .collect();
        let (lo, hi) = sizes.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &b| {
            (lo.min(b), hi.max(b))
        });
        if sizes.is_empty() {
            return Vec::new();
        }
        let mut at: Vec<f64> = (0..64)
            .map(|i| lo * (hi / lo).powf(i as f64 / 63.0))
            .chain(sizes.iter().copied())
            .collect();
        at.sort_by(f64::total_cmp);
        at.dedup();
        at.into_iter()
            .filter(|&b| curve.capacity(b as u64) >= curve.largest_request)
            .map(|b| (b / GIB, curve.hit_rate(curve.capacity(b as u64))))
            .collect()
    }

    fn point_json(p: &ReplayPoint) -> Json {
        let f = &p.figures;
        json!({
            "name": p.point.name,
            "settings": settings_json(&p.point),
            "replay_s": p.replay_s,
            "figures": {
                "l1_size_bytes": f.l1_size_bytes,
                "eviction_policy": f.eviction_policy,
                "hit_rate": f.hit_rate,
                "l1_hit_rate": f.l1_hit_rate,
                "l2_hit_rate": f.l2_hit_rate,
                "request_hit_rate_p10": f.request_hit_rate[0],
                "request_hit_rate_p50": f.request_hit_rate[1],
                "request_hit_rate_p90": f.request_hit_rate[2],
                "out_of_memory_calls": f.out_of_memory_calls,
                "out_of_memory_keys": f.out_of_memory_keys,
                "evictions": f.evictions,
                "request_match_rate": f.request_match_rate,
                "divergences": f.divergences,
            },
            "replay": p.summary,
        })
    }

    /// The best point of each line: the highest hit rate, then the smaller L1, then the
    /// earlier point.
    fn best(&self) -> Vec<(String, usize)> {
        let refs = self.refs();
        let varying = varying(&refs);
        let x = self.x_axis().unwrap_or_default();
        let mut best: Vec<(String, usize)> = Vec::new();
        for (i, p) in self.points.iter().enumerate() {
            let line = line_of(&p.point, &varying, &x);
            let better = |j: usize| {
                let (a, b) = (&p.figures, &self.points[j].figures);
                a.hit_rate > b.hit_rate
                    || (a.hit_rate == b.hit_rate && a.l1_size_bytes < b.l1_size_bytes)
            };
            match best.iter_mut().find(|(l, _)| *l == line) {
                Some((_, j)) if better(*j) => *j = i,
                Some(_) => {}
                None => best.push((line, i)),
            }
        }
        best
    }
}

impl Report for ReplaySweep {
    fn document(&self) -> Result<Json> {
        let curve = match &self.curve {
            Some(c) => json!({
                "model": "idealised: LRU stack distances in one pass, an immediate LRU of the whole L1 and a client that stores every chunk it missed; not LMCache's periodic controller (see model_curve)",
                "largest_request_chunks": c.largest_request,
                "object_bytes": c.object_bytes,
                "requests": c.requests,
                "requested_chunks": c.requested_chunks,
                "saturation_objects": c.saturation(),
                "points": self.curve_points().iter().map(|(gib, rate)| json!({"l1_size_gb": gib, "hit_rate": rate})).collect::<Vec<_>>(),
            }),
            None => Json::Null,
        };
        let model_curve = match self.model_curves.is_empty() {
            true => Json::Null,
            false => json!({
                "model": "full replays at each size: LMCache's eviction controller (watermark, ratio, periodic passes) and the recorded client's model, as every point",
                "lines": self.model_curves.iter().map(|m| json!({
                    "line": m.line,
                    "points": m.points.iter().map(|(gib, rate)| json!({"l1_size_gb": gib, "hit_rate": rate})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            }),
        };
        Ok(json!({
            "trace": self.trace,
            "points": self.points.iter().map(Self::point_json).collect::<Vec<_>>(),
            "model_curve": model_curve,
            "lru_curve": curve,
            "lru_curve_note": self.curve_note,
            "warnings": self.warnings,
            "interrupted": crate::interrupt::requested().is_some(),
        }))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let refs = self.refs();
        let mut points = point_table(
            &refs,
            &[
                "hit_rate",
                "l1_hit_rate",
                "l2_hit_rate",
                "request_hit_rate_p50",
                "out_of_memory_calls",
                "evictions",
                "request_match_rate",
                "divergences",
                "failed",
                "replay_s",
            ],
        )
        .sheet("Points")
        .csv("sweep_points.csv");
        let mut hits = point_table(
            &refs,
            &[
                "requests",
                "requested_chunks",
                "hit_chunks",
                "hit_rate",
                "l1_hit_rate",
                "l2_hit_rate",
                "request_hit_rate_p10",
                "request_hit_rate_p50",
                "request_hit_rate_p90",
            ],
        )
        .sheet("Hits")
        .csv("sweep_hits.csv");
        let mut capacity = point_table(
            &refs,
            &[
                "l1_size_bytes",
                "out_of_memory_calls",
                "out_of_memory_keys",
                "evictions",
            ],
        )
        .sheet("Capacity")
        .csv("sweep_capacity.csv");
        let mut fidelity = point_table(
            &refs,
            &[
                "requests",
                "requests_matching",
                "request_match_rate",
                "stores",
                "stores_matching",
                "divergences",
            ],
        )
        .sheet("Fidelity")
        .csv("sweep_fidelity.csv");
        let mut tiers = Table::new(&["point", "tier", "bytes_written", "bytes_read", "peak_bytes"])
            .sheet("Tiers")
            .csv("sweep_tiers.csv");
        for (i, p) in self.points.iter().enumerate() {
            let f = &p.figures;
            points.rows[i].extend([
                ratio(f.hit_rate),
                ratio(f.l1_hit_rate),
                ratio(f.l2_hit_rate),
                ratio(f.request_hit_rate[1]),
                Cell::Count(f.out_of_memory_calls),
                Cell::Count(f.evictions),
                ratio(f.request_match_rate),
                Cell::Count(f.divergences),
                Cell::Count(f.failed),
                Cell::Measure(p.replay_s, Unit::Seconds),
            ]);
            hits.rows[i].extend([
                Cell::Count(f.requests),
                Cell::Count(f.requested_chunks),
                Cell::Count(f.hit_chunks),
                ratio(f.hit_rate),
                ratio(f.l1_hit_rate),
                ratio(f.l2_hit_rate),
                ratio(f.request_hit_rate[0]),
                ratio(f.request_hit_rate[1]),
                ratio(f.request_hit_rate[2]),
            ]);
            capacity.rows[i].extend([
                Cell::Count(f.l1_size_bytes),
                Cell::Count(f.out_of_memory_calls),
                Cell::Count(f.out_of_memory_keys),
                Cell::Count(f.evictions),
            ]);
            fidelity.rows[i].extend([
                Cell::Count(f.fidelity_requests),
                Cell::Count(f.fidelity_requests_matching),
                ratio(f.request_match_rate),
                Cell::Count(f.stores),
                Cell::Count(f.stores_matching),
                Cell::Count(f.divergences),
            ]);
            for (tier, written, read, peak) in &f.tier_bytes {
                tiers.rows.push(vec![
                    Cell::text(&p.point.name),
                    Cell::text(tier),
                    Cell::Count(*written),
                    Cell::Count(*read),
                    Cell::Count(*peak),
                ]);
            }
        }
        let mut out = vec![points, hits, capacity, tiers, fidelity];
        if !self.model_curves.is_empty() {
            let mut t = Table::new(&["line", "l1_size_gb", "hit_rate"])
                .sheet("Model curve")
                .csv("sweep_model_curve.csv");
            t.rows = self
                .model_curves
                .iter()
                .flat_map(|m| {
                    m.points.iter().map(|&(gib, rate)| {
                        vec![Cell::text(&m.line), Cell::Number(gib), ratio(rate)]
                    })
                })
                .collect();
            out.push(t);
        }
        if self.curve.is_some() {
            let mut t = Table::new(&["l1_size_gb", "hit_rate"])
                .sheet("Idealised LRU curve")
                .csv("sweep_lru_curve.csv");
            t.rows = self
                .curve_points()
                .into_iter()
                .map(|(gib, rate)| vec![Cell::Number(gib), ratio(rate)])
                .collect();
            out.push(t);
        }
        out
    }

    fn charts(&self) -> Vec<Chart> {
        let refs = self.refs();
        let Some(x) = self.x_axis() else {
            return Vec::new();
        };
        let x_of = |i: usize| self.x_value(i, &x);
        let x_title = if x == "l1-size-gb" {
            "L1 size (GiB)".to_string()
        } else {
            x.clone()
        };
        // Each line's model curve passes through its points (full replays at their sizes and
        // between them): drawn instead of the points' own polyline, one line per line.
        let mut series = if x == "l1-size-gb" && !self.model_curves.is_empty() {
            self.model_curves
                .iter()
                .map(|m| Series {
                    name: format!("{} — {MODEL_CURVE_NAME}", m.line),
                    points: m.points.clone(),
                })
                .collect()
        } else {
            lines(&refs, &x, &x_of, &|i| self.points[i].figures.hit_rate)
        };
        let curve = self.curve_points();
        if x == "l1-size-gb" && !curve.is_empty() {
            series.push(Series {
                name: CURVE_NAME.into(),
                points: curve,
            });
        }
        let x_log = doubling(&(0..self.points.len()).map(x_of).collect::<Vec<_>>());
        let mut charts = vec![Chart {
            title: format!("Hit rate vs {x_title}"),
            x_title: x_title.clone(),
            y_title: "hit rate".into(),
            y_ratio: true,
            x_log,
            series,
        }];
        if self.points.iter().any(|p| p.figures.l2_hit_rate > 0.0) {
            charts.push(Chart {
                title: format!("L2 hit rate vs {x_title}"),
                x_title: x_title.clone(),
                y_title: "L2 hit rate".into(),
                y_ratio: true,
                x_log,
                series: lines(&refs, &x, &x_of, &|i| self.points[i].figures.l2_hit_rate),
            });
        }
        charts.push(Chart {
            title: format!("Evictions vs {x_title}"),
            x_title,
            y_title: "evictions".into(),
            y_ratio: false,
            x_log,
            series: lines(&refs, &x, &x_of, &|i| {
                self.points[i].figures.evictions as f64
            }),
        });
        charts
    }

    fn terminal(&self) -> String {
        let mut rows = vec![[
            "point",
            "hit",
            "L1",
            "L2",
            "req p50",
            "OOM",
            "evictions",
            "match",
            "time",
        ]
        .map(String::from)
        .to_vec()];
        // Names and the trace's path may come from files (a grid, a rank's slice): escaped.
        for p in &self.points {
            let f = &p.figures;
            rows.push(vec![
                escape_line(&p.point.name).into_owned(),
                pct(f.hit_rate),
                pct(f.l1_hit_rate),
                pct(f.l2_hit_rate),
                pct(f.request_hit_rate[1]),
                f.out_of_memory_calls.to_string(),
                f.evictions.to_string(),
                if f.fidelity_requests == 0 {
                    "-".to_owned()
                } else {
                    pct(f.request_match_rate)
                },
                format!("{:.3}s", p.replay_s),
            ]);
        }
        let mut out = format!(
            "Sweep of {} over {} configurations\n\n",
            escape_line(&self.trace),
            self.points.len()
        );
        out += &columns(&rows);
        out += "\nBest per line (highest hit rate, then the smaller L1):\n";
        for (line, i) in self.best() {
            let p = &self.points[i];
            out += &fold(
                &format!(
                    "  {}: {} — hit {} with L1 {}",
                    escape_line(&line),
                    escape_line(&p.point.name),
                    pct(p.figures.hit_rate),
                    bytes(p.figures.l1_size_bytes)
                ),
                4,
            );
        }
        if let Some(c) = &self.curve {
            out += "\n";
            out += &fold(
                &format!(
                    "LRU stack distances (one pass): {} of {} chunks hit with unbounded L1; \
                     nothing more hits past {} objects ({})",
                    c.hit_chunks(u64::MAX),
                    c.requested_chunks,
                    c.saturation(),
                    bytes(c.saturation().saturating_mul(c.object_bytes)),
                ),
                2,
            );
        }
        if let Some(note) = &self.curve_note {
            out += "\n";
            out += &fold(&format!("No LRU stack-distance curve: {note}"), 2);
        }
        if let Some(first) = self.model_curves.first() {
            let _ = writeln!(
                out,
                "\nModel curves (full replays at {} sizes; all in the JSON, CSV and workbook):",
                first.points.len()
            );
            for m in &self.model_curves {
                let at: Vec<String> = m
                    .points
                    .iter()
                    .step_by(4)
                    .map(|(gib, rate)| format!("{gib:.4} GiB {}", pct(*rate)))
                    .collect();
                out += &fold(&format!("  {}: {}", m.line, at.join(", ")), 4);
            }
        }
        out
    }
}

/// The figures the simulate sweep's Points sheet shows: its column and the report key it reads
/// (Dynamo's report names the median `median_…`; the sheet says p50).
const SIMULATE_FIGURES: [(&str, &str); 10] = [
    ("p50_ttft_ms", "median_ttft_ms"),
    ("p90_ttft_ms", "p90_ttft_ms"),
    ("p99_ttft_ms", "p99_ttft_ms"),
    ("p50_itl_ms", "median_itl_ms"),
    ("p90_itl_ms", "p90_itl_ms"),
    ("p99_itl_ms", "p99_itl_ms"),
    ("p90_e2e_latency_ms", "p90_e2e_latency_ms"),
    ("request_throughput_rps", "request_throughput_rps"),
    ("output_throughput_tok_s", "output_throughput_tok_s"),
    ("prefix_cache_reused_ratio", "prefix_cache_reused_ratio"),
];

impl SimulateSweep {
    fn refs(&self) -> Vec<&Point> {
        self.points.iter().map(|p| &p.point).collect()
    }

    fn figure(&self, i: usize, key: &str) -> f64 {
        self.points[i].figure(key)
    }

    fn has_offload(&self) -> bool {
        self.points
            .iter()
            .any(|p| p.summary.contains_key("offload_hit_rate"))
    }

    fn x_axis(&self) -> Option<String> {
        x_flag(
            &self.refs(),
            &["num-workers", "num-decode-workers", "num-prefill-workers"],
        )
    }

    fn x_value(&self, i: usize, x: &str) -> f64 {
        self.points[i]
            .point
            .get(x)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// The best point of each line: with an SLA, the one that meets it at the smallest x (the
    /// fewest workers), then the lowest TTFT p90; without, the lowest TTFT p90.
    fn best(&self) -> Vec<(String, Option<usize>)> {
        let refs = self.refs();
        let varying = varying(&refs);
        let x = self.x_axis().unwrap_or_default();
        let mut best: Vec<(String, Option<usize>)> = Vec::new();
        for (i, p) in self.points.iter().enumerate() {
            let line = line_of(&p.point, &varying, &x);
            let eligible = p.meets(&self.sla);
            let key = |j: usize| (self.x_value(j, &x), self.figure(j, "p90_ttft_ms"));
            let better = |j: usize| {
                let (a, b) = (key(i), key(j));
                let by_x = !self.sla.is_empty() && !x.is_empty();
                if by_x {
                    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
                } else {
                    a.1 < b.1
                }
            };
            match best.iter_mut().find(|(l, _)| *l == line) {
                Some((_, slot)) => match slot {
                    Some(j) if eligible && better(*j) => *slot = Some(i),
                    None if eligible => *slot = Some(i),
                    _ => {}
                },
                None => best.push((line, eligible.then_some(i))),
            }
        }
        best
    }
}

impl Report for SimulateSweep {
    fn document(&self) -> Result<Json> {
        let sla: Vec<Json> = self
            .sla
            .iter()
            .map(
                |b| json!({"metric": b.name, "key": b.key, "limit": b.limit, "at_most": b.at_most}),
            )
            .collect();
        let points: Vec<Json> = self
            .points
            .iter()
            .map(|p| {
                json!({
                    "name": p.point.name,
                    "settings": settings_json(&p.point),
                    "meets_sla": (!self.sla.is_empty()).then(|| p.meets(&self.sla)),
                    "wall_time_ms": p.wall_time_ms,
                    "report": Json::Object(p.summary.clone()),
                })
            })
            .collect();
        Ok(json!({
            "trace": self.trace,
            "sla": sla,
            "points": points,
            "interrupted": crate::interrupt::requested().is_some(),
        }))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let refs = self.refs();
        let mut head: Vec<&str> = SIMULATE_FIGURES.iter().map(|(column, _)| *column).collect();
        if self.has_offload() {
            head.push("offload_hit_rate");
        }
        if !self.sla.is_empty() {
            head.push("meets_sla");
        }
        let mut points = point_table(&refs, &head)
            .sheet("Points")
            .csv("sweep_points.csv");
        let families = ["ttft", "ttst", "tpot", "itl", "e2e_latency"];
        let stats = ["mean", "median", "p90", "p95", "p99"];
        let latency_keys: Vec<String> = families
            .iter()
            .flat_map(|f| stats.iter().map(move |s| format!("{s}_{f}_ms")))
            .collect();
        let latency_head: Vec<&str> = latency_keys.iter().map(String::as_str).collect();
        let mut latency = point_table(&refs, &latency_head)
            .sheet("Latency")
            .csv("sweep_latency.csv");
        let throughput_keys = [
            "completed_requests",
            "duration_ms",
            "request_throughput_rps",
            "input_throughput_tok_s",
            "output_throughput_tok_s",
            "total_throughput_tok_s",
            "gpu_hours",
        ];
        let mut throughput = point_table(&refs, &throughput_keys)
            .sheet("Throughput")
            .csv("sweep_throughput.csv");
        let cache_keys: Vec<String> = self
            .points
            .iter()
            .flat_map(|p| p.summary.keys())
            .filter(|k| k.contains("prefix_cache") || k.starts_with("offload_"))
            .fold(Vec::new(), |mut v, k| {
                if !v.contains(k)
                    && self.points.iter().all(|p| {
                        p.summary
                            .get(k.as_str())
                            .is_none_or(|v| !v.is_object() && !v.is_array())
                    })
                {
                    v.push(k.clone());
                }
                v
            });
        let cache_head: Vec<&str> = cache_keys.iter().map(String::as_str).collect();
        let mut cache = point_table(&refs, &cache_head)
            .sheet("Cache")
            .csv("sweep_cache.csv");
        let value = |p: &Map<String, Json>, k: &str| match p.get(k) {
            Some(v) if k.ends_with("ratio") || k.ends_with("rate") => {
                v.as_f64().map_or(Cell::Empty, ratio)
            }
            Some(v) if k.ends_with("_ms") => v
                .as_f64()
                .map_or(Cell::Empty, |x| Cell::Measure(x, Unit::Millis)),
            Some(v) => Cell::of(v),
            None => Cell::Empty,
        };
        for (i, p) in self.points.iter().enumerate() {
            for (_, key) in SIMULATE_FIGURES {
                points.rows[i].push(value(&p.summary, key));
            }
            if self.has_offload() {
                points.rows[i].push(value(&p.summary, "offload_hit_rate"));
            }
            if !self.sla.is_empty() {
                points.rows[i].push(Cell::Bool(p.meets(&self.sla)));
            }
            latency.rows[i].extend(latency_keys.iter().map(|k| value(&p.summary, k)));
            throughput.rows[i].extend(throughput_keys.iter().map(|k| value(&p.summary, k)));
            cache.rows[i].extend(cache_keys.iter().map(|k| value(&p.summary, k)));
        }
        vec![points, latency, throughput, cache]
    }

    fn charts(&self) -> Vec<Chart> {
        let refs = self.refs();
        let Some(x) = self.x_axis() else {
            return Vec::new();
        };
        let x_of = |i: usize| self.x_value(i, &x);
        let chart = |title: &str, y_title: &str, key: &str, y_ratio: bool| Chart {
            title: format!("{title} vs {x}"),
            x_title: x.clone(),
            y_title: y_title.into(),
            y_ratio,
            x_log: false,
            series: lines(&refs, &x, &x_of, &|i| self.figure(i, key)),
        };
        let mut charts = vec![
            chart("TTFT p90", "TTFT p90 (ms)", "p90_ttft_ms", false),
            chart("ITL p90", "ITL p90 (ms)", "p90_itl_ms", false),
            chart(
                "Output throughput",
                "output tokens/s",
                "output_throughput_tok_s",
                false,
            ),
        ];
        if self.has_offload() {
            charts.push(chart(
                "KV offload hit rate",
                "hit rate",
                "offload_hit_rate",
                true,
            ));
        }
        charts
    }

    fn terminal(&self) -> String {
        let mut head: Vec<String> = vec!["point".into()];
        head.extend(
            [
                "TTFT p90",
                "ITL p90",
                "E2E p90",
                "req/s",
                "out tok/s",
                "reuse",
            ]
            .map(String::from),
        );
        if !self.sla.is_empty() {
            head.push("SLA".into());
        }
        let mut rows = vec![head];
        for (i, p) in self.points.iter().enumerate() {
            let mut row = vec![
                p.point.name.clone(),
                format!("{:.1}", self.figure(i, "p90_ttft_ms")),
                format!("{:.2}", self.figure(i, "p90_itl_ms")),
                format!("{:.1}", self.figure(i, "p90_e2e_latency_ms")),
                format!("{:.2}", self.figure(i, "request_throughput_rps")),
                format!("{:.0}", self.figure(i, "output_throughput_tok_s")),
                pct(self.figure(i, "prefix_cache_reused_ratio")),
            ];
            if !self.sla.is_empty() {
                row.push(
                    if p.meets(&self.sla) {
                        "meets"
                    } else {
                        "misses"
                    }
                    .into(),
                );
            }
            rows.push(row);
        }
        let mut out = format!(
            "Sweep of {} over {} configurations (latencies in ms)\n\n",
            self.trace,
            self.points.len()
        );
        out += &columns(&rows);
        let rule = if self.sla.is_empty() {
            "lowest TTFT p90".to_string()
        } else {
            let bounds: Vec<String> = self
                .sla
                .iter()
                .map(|b| {
                    format!(
                        "{} {} {}",
                        b.name,
                        if b.at_most { "≤" } else { "≥" },
                        b.limit
                    )
                })
                .collect();
            format!(
                "meets {} with the fewest workers, then the lowest TTFT p90",
                bounds.join(", ")
            )
        };
        let _ = writeln!(out, "\nBest per line ({rule}):");
        for (line, best) in self.best() {
            let text = match best {
                Some(i) => format!(
                    "  {line}: {} — TTFT p90 {:.1} ms, {:.0} output tokens/s",
                    self.points[i].point.name,
                    self.figure(i, "p90_ttft_ms"),
                    self.figure(i, "output_throughput_tok_s")
                ),
                None => format!("  {line}: no point meets the SLA"),
            };
            out += &fold(&text, 4);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::doubling;

    #[test]
    fn sizes_that_double_get_a_log_axis_and_even_steps_do_not() {
        assert!(doubling(&[0.0125, 0.025, 0.05, 0.1]));
        assert!(doubling(&[1.0, 4.0, 16.0, 4.0]));
        assert!(!doubling(&[0.002, 0.004, 0.006, 0.008]));
        assert!(!doubling(&[1.0, 2.0]));
        assert!(!doubling(&[]));
    }
}
