//! The export layer every command shares. A command's typed report implements [`Report`]:
//! its JSON document, its tables and its terminal text. One [`Exporter`] per format, one
//! small file each — [`json`], [`jsonl`], [`csv`], [`xlsx`], [`svg`], [`terminal`] — turns
//! any report into bytes, and [`write`](fn@write) puts them where the user asked, through a
//! temporary name.

#![warn(unreachable_pub)]

pub mod chart;
pub mod csv;
pub mod histogram;
pub mod json;
pub mod jsonl;
pub mod reasons;
pub mod svg;
pub mod table;
pub mod terminal;
pub mod units;
pub mod xlsx;

use std::path::PathBuf;

use serde_json::Value as Json;

pub use chart::{Chart, HeatMap, Series};
use kvtrace_io::error::{Error, Result};
use kvtrace_io::output::{check_writable, create_dir, write_atomic};
pub use table::{Cell, Table, Unit};

/// How a report's JSON document is written: each command keeps the form its users' scripts
/// were written against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonStyle {
    /// serde_json's pretty form, keys in the report's order.
    Pretty,
    /// serde_json's pretty form, keys sorted at every level (LMCache's `json.dump(...,
    /// sort_keys=True)` layout).
    PrettySorted,
    /// Python's `json.dumps(indent=2)`: Python's float text, so files diff cleanly against
    /// the peer's.
    Python,
}

/// A command's result, as every format sees it.
pub trait Report {
    /// The JSON document.
    fn document(&self) -> Result<Json>;
    fn json_style(&self) -> JsonStyle;
    /// The tables, in sheet order; each says whether it is a CSV file, a sheet, or both.
    fn tables(&self) -> Vec<Table>;
    /// One JSON value per line of the JSONL form.
    fn records(&self) -> Vec<Json> {
        Vec::new()
    }
    /// The charts, main one first: native charts in XLSX, the main one in SVG.
    fn charts(&self) -> Vec<Chart> {
        Vec::new()
    }
    /// The heat maps: a sheet each in XLSX, drawn below the main chart in SVG.
    fn heat_maps(&self) -> Vec<HeatMap> {
        Vec::new()
    }
    /// What the terminal shows.
    fn terminal(&self) -> String;
}

/// One output of an exporter: its own file name where the format makes several (CSV, one
/// file per table), or `None` for a single file the caller names.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    pub name: Option<String>,
    pub bytes: Vec<u8>,
}

impl Artifact {
    pub fn single(bytes: Vec<u8>) -> Artifact {
        Artifact { name: None, bytes }
    }
}

/// Turns a report into the bytes of one format.
pub trait Exporter {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>>;
}

/// Where a format's output goes: a file, or a directory for formats of several files.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    File(PathBuf),
    Dir(PathBuf),
}

impl Target {
    /// Fails now if the output could not be written later (a finished run is not lost to a
    /// bad path): a file's directory must exist and take writes; a directory is created.
    pub fn check(&self) -> Result<()> {
        match self {
            Target::File(path) => check_writable(path),
            Target::Dir(dir) => {
                create_dir(dir)?;
                check_writable(&dir.join(".kvtrace-check"))
            }
        }
    }
}

/// The outputs a command was asked for — each exporter whose target was given, in the order
/// listed — every target checked now, so a finished run is not lost to a bad path.
pub fn outputs<const N: usize>(
    asked: [(&'static dyn Exporter, Option<Target>); N],
) -> Result<Vec<(&'static dyn Exporter, Target)>> {
    let outputs: Vec<(&'static dyn Exporter, Target)> = asked
        .into_iter()
        .filter_map(|(exporter, target)| Some((exporter, target?)))
        .collect();
    for (_, target) in &outputs {
        target.check()?;
    }
    Ok(outputs)
}

/// Exports `report` and writes what comes out to `target`. A single-file format goes to a
/// [`Target::File`] or under `default_name` in a [`Target::Dir`]; a several-file format
/// goes into a directory, or, when it made exactly one file, to a [`Target::File`].
pub fn write(
    report: &dyn Report,
    exporter: &dyn Exporter,
    target: &Target,
    default_name: &str,
) -> Result<()> {
    let artifacts = exporter.export(report)?;
    let one = artifacts.len() == 1;
    for a in artifacts {
        let path = match (target, &a.name) {
            (Target::File(p), _) if one => p.clone(),
            (Target::File(p), _) => {
                return Err(Error::usage(format!(
                    "{}: this format writes several files; give a directory",
                    p.display()
                )))
            }
            (Target::Dir(d), Some(name)) => d.join(name),
            (Target::Dir(d), None) => d.join(default_name),
        };
        write_atomic(&path, &a.bytes)?;
    }
    Ok(())
}
