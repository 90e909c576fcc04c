//! What-if sweeps: one trace, many configurations. A sweep is a list of [`Point`]s — the
//! cross product of flag lists ([`cross`]) or named configurations from a TOML grid
//! ([`grid`]) — each run exactly as the single command with those flags would run it, in
//! parallel over the cores ([`run_points`]), and gathered into one report
//! ([`replay::ReplaySweep`] or [`simulate::SimulateSweep`], each a [`kvtrace_report::Report`]).
//!
//! Points are independent runs of deterministic engines, so the sweep's figures do not
//! depend on how many run at once or in which order they finish.

#![warn(unreachable_pub)]

pub mod optimal;
pub mod plan;
pub mod ranks;
pub mod replay;
pub mod report;
pub mod simulate;
pub mod stack;

// The crates below, under the paths this code has always used.
use kvtrace_cache::storage;
use kvtrace_io::{error, interrupt};
use kvtrace_lmct as lmct;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// One flag and the values a sweep gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The flag's long name, without dashes.
    pub flag: String,
    pub values: Vec<String>,
}

impl Axis {
    /// `--flag a,b,c`: the values split at commas outside JSON brackets and quotes, so a list
    /// of JSON objects (`--l2-adapter '{"type":"fs","path":"d"},{"type":"null"}'`) splits
    /// into its objects. An empty list or item is an error naming the flag.
    pub fn parse(flag: &str, text: &str) -> Result<Axis> {
        let bad = |why: &str| Error::usage(format!("--{flag} {text:?}: {why}"));
        let mut values = Vec::new();
        let (mut depth, mut quoted, mut escaped) = (0i64, false, false);
        let mut item = String::new();
        for c in text.chars() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '{' | '[' if !quoted => depth += 1,
                '}' | ']' if !quoted => depth -= 1,
                ',' if !quoted && depth == 0 => {
                    values.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        if quoted || depth != 0 {
            return Err(bad("unbalanced quotes or brackets"));
        }
        values.push(item);
        let values: Vec<String> = values.into_iter().map(|v| v.trim().to_owned()).collect();
        if values.iter().any(String::is_empty) {
            return Err(bad("an empty value in the list"));
        }
        Ok(Axis {
            flag: flag.to_owned(),
            values,
        })
    }
}

/// One configuration of a sweep: a name and the flag values that make it.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub name: String,
    /// `(flag, value)` pairs in the order given; a switch takes `true` or `false`.
    pub settings: Vec<(String, String)>,
}

impl Point {
    /// The value this point gives `flag`, if any.
    pub fn get(&self, flag: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }
}

/// The points a sweep runs unless told it may run more: a cross product past it is most
/// likely a typo, and each finished point keeps its report until the sweep is written.
pub const DEFAULT_MAX_POINTS: u64 = 10_000;

/// How many points [`cross`] would make, known before any is: `None` past `u64`.
pub fn cross_count(axes: &[Axis]) -> Option<u64> {
    axes.iter()
        .try_fold(1u64, |n, a| n.checked_mul(a.values.len() as u64))
}

/// Refuses a sweep of more than `max` points, before any runs.
pub fn check_count(count: Option<u64>, max: u64) -> Result<()> {
    match count {
        Some(n) if n <= max => Ok(()),
        Some(n) => Err(Error::usage(format!(
            "{n} points: more than the {max} a sweep runs unless --max-points allows more"
        ))),
        None => Err(Error::usage(
            "the lists make more than 2^64 points: not a sweep that can finish",
        )),
    }
}

/// Every combination of the axes' values, the first axis varying slowest; each point named by
/// the values of the axes that vary. Check [`cross_count`] first: the points are made here.
pub fn cross(axes: &[Axis]) -> Vec<Point> {
    let mut points = vec![Point {
        name: String::new(),
        settings: Vec::new(),
    }];
    for axis in axes {
        points = points
            .into_iter()
            .flat_map(|p| {
                axis.values.iter().map(move |v| {
                    let mut p = p.clone();
                    p.settings.push((axis.flag.clone(), v.clone()));
                    p
                })
            })
            .collect();
    }
    for p in &mut points {
        p.name = p
            .settings
            .iter()
            .zip(axes)
            .filter(|(_, axis)| axis.values.len() > 1)
            .map(|((f, v), _)| format!("{f}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        if p.name.is_empty() {
            p.name = "base".into();
        }
    }
    points
}

/// Named configurations from a TOML file: one `[[point]]` table each, with a `name` and the
/// flags it sets (`l1-size-gb = 2`, `eviction-policy = "ARC"`, `l1-accounting-only = true`;
/// an L2 adapter as its JSON text). Every point is the base flags plus its own.
pub fn grid(path: &Path, max_points: u64) -> Result<Vec<Point>> {
    let shown = path.display().to_string();
    // A point's table takes tens of bytes; a file far larger than the cap allows is refused
    // before it is read into memory.
    let limit = max_points.saturating_mul(4096).max(1 << 20);
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io("cannot read", e).in_file(&shown))?
        .len();
    if size > limit {
        return Err(Error::usage(format!(
            "{size} bytes: more than a grid of at most {max_points} points needs (--max-points)"
        ))
        .in_file(&shown));
    }
    // Bounded again as it is read: a device or a pipe has no size to check.
    let text = kvtrace_io::limits::read_text(path, limit)
        .map_err(|e| Error::io("cannot read", e).in_file(&shown))?;
    let bad = |why: String| Error::usage(why).in_file(&shown);
    let doc: toml::Table =
        toml::from_str(&text).map_err(|e| bad(e.to_string().replace('\n', " ")))?;
    let mut points = Vec::new();
    for (key, value) in &doc {
        if key != "point" {
            return Err(bad(format!(
                "{key}: unknown table; a grid is [[point]] tables"
            )));
        }
        let Some(tables) = value.as_array() else {
            return Err(bad("point: expected [[point]] tables".into()));
        };
        check_count(Some(tables.len() as u64), max_points).map_err(|e| e.in_file(&shown))?;
        for (i, table) in tables.iter().enumerate() {
            let Some(table) = table.as_table() else {
                return Err(bad(format!("point {}: expected a table", i + 1)));
            };
            let mut name = format!("point {}", i + 1);
            let mut settings = Vec::new();
            for (flag, v) in table {
                let text = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(n) => n.to_string(),
                    toml::Value::Float(x) => x.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    _ => {
                        return Err(bad(format!(
                            "point {}: {flag}: expected a string, number or boolean",
                            i + 1
                        )))
                    }
                };
                if flag == "name" {
                    name = text;
                } else {
                    settings.push((flag.clone(), text));
                }
            }
            points.push(Point { name, settings });
        }
    }
    if points.is_empty() {
        return Err(bad("no [[point]] tables".into()));
    }
    Ok(points)
}

/// Adds the warnings `said` that `warnings` does not hold yet, in order: every replay of a
/// trace says the trace's own, and a sweep or a plan says each once.
fn warn_once(warnings: &mut Vec<String>, said: Vec<String>) {
    for w in said {
        if !warnings.contains(&w) {
            warnings.push(w);
        }
    }
}

/// Runs `run` for every point index on up to `jobs` threads and returns the results in point
/// order. After a point fails no new point starts, and the failure of the lowest-numbered
/// failed point is returned; after an interrupt the points that finished are returned.
/// `done` hears each finished point.
pub fn run_points<T: Send>(
    count: usize,
    jobs: usize,
    run: &(dyn Fn(usize) -> Result<T> + Sync),
    done: &(dyn Fn(usize) + Sync),
) -> Result<Vec<T>> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<T>>>> = Mutex::new((0..count).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, count.max(1)) {
            scope.spawn(|| loop {
                if failed.load(Ordering::Relaxed) || crate::interrupt::requested().is_some() {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let result = run(i);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                if let Ok(mut slots) = results.lock() {
                    slots[i] = Some(result);
                }
                done(i);
            });
        }
    });
    let slots = results
        .into_inner()
        .map_err(|_| Error::usage("a sweep point's thread panicked"))?;
    let mut out = Vec::with_capacity(count);
    for slot in slots {
        match slot {
            Some(Ok(t)) => out.push(t),
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_outside_json() {
        let a = Axis::parse(
            "l2-adapter",
            r#"{"type":"fs","path":"a,b"}, {"type":"null"}"#,
        )
        .unwrap();
        assert_eq!(
            a.values,
            [r#"{"type":"fs","path":"a,b"}"#, r#"{"type":"null"}"#]
        );
        assert_eq!(
            Axis::parse("x", "0.5,1,2").unwrap().values,
            ["0.5", "1", "2"]
        );
        for bad in ["", "1,,2", "1,", "{\"a\":1"] {
            let e = Axis::parse("l1-size-gb", bad).unwrap_err().to_string();
            assert!(e.starts_with("--l1-size-gb"), "{e}");
        }
    }

    #[test]
    fn the_cross_product_varies_the_last_axis_fastest_and_names_what_varies() {
        let axes = [
            Axis::parse("a", "1,2").unwrap(),
            Axis::parse("b", "x").unwrap(),
            Axis::parse("c", "p,q").unwrap(),
        ];
        let names: Vec<String> = cross(&axes).into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["a=1 c=p", "a=1 c=q", "a=2 c=p", "a=2 c=q"]);
        assert_eq!(cross(&[]).len(), 1);
    }

    #[test]
    fn points_come_back_in_order_and_the_first_failure_wins() {
        let ok = run_points(9, 3, &|i| Ok(i * 10), &|_| {}).unwrap();
        assert_eq!(ok, (0..9).map(|i| i * 10).collect::<Vec<_>>());
        let e = run_points(
            9,
            1,
            &|i| {
                if i >= 4 {
                    Err(Error::usage(format!("point {i}")))
                } else {
                    Ok(i)
                }
            },
            &|_| {},
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "point 4");
    }

    #[test]
    fn a_grid_names_its_points() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        std::fs::write(
            &path,
            "[[point]]\nname = \"small\"\nl1-size-gb = 0.5\n[[point]]\neviction-policy = \"ARC\"\nl1-accounting-only = true\n",
        )
        .unwrap();
        let points = grid(&path, DEFAULT_MAX_POINTS).unwrap();
        assert_eq!(points[0].name, "small");
        assert_eq!(points[0].get("l1-size-gb"), Some("0.5"));
        assert_eq!(points[1].name, "point 2");
        assert_eq!(points[1].get("l1-accounting-only"), Some("true"));
        std::fs::write(&path, "[other]\n").unwrap();
        assert!(grid(&path, DEFAULT_MAX_POINTS)
            .unwrap_err()
            .to_string()
            .contains("unknown table"));
    }
}
