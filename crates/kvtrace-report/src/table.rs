//! Tables of typed cells: what every report gives the CSV and XLSX exporters, so every
//! kvtrace spreadsheet looks and sorts alike. A table says where it goes — a CSV file, an
//! XLSX sheet, or both — so one list of tables serves both formats.

use serde_json::{Map, Value as Json};

/// What a measured figure is, for its display format: six decimals in CSV (LMCache's
/// `trace_replay_*.csv`), a unit-appropriate number format in XLSX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Millis,
    Ratio,
}

/// One cell: numbers stay numbers, so spreadsheets can sort and chart them.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// A count or a size.
    Count(u64),
    /// Any other number, printed as Rust prints it (integers without a fraction).
    Number(f64),
    /// A measured figure with a unit.
    Measure(f64, Unit),
    Text(String),
    Bool(bool),
    Empty,
}

impl Cell {
    /// A JSON scalar as a cell; arrays and objects become their JSON text.
    pub fn of(value: &Json) -> Cell {
        match value {
            Json::Null => Cell::Empty,
            Json::Bool(b) => Cell::Bool(*b),
            Json::Number(n) => n.as_f64().map_or(Cell::Empty, Cell::Number),
            Json::String(s) => Cell::Text(s.clone()),
            other => Cell::Text(other.to_string()),
        }
    }

    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// The CSV text.
    pub fn csv(&self) -> String {
        let mut out = String::new();
        self.write_csv(&mut out);
        out
    }

    /// Appends the CSV text to `out`: a table's cells are written into one buffer rather
    /// than a string each (a replay's request table is a hundred thousand of them).
    pub fn write_csv(&self, out: &mut String) {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = match self {
            Cell::Count(n) => write!(out, "{n}"),
            Cell::Number(v) if v.fract() == 0.0 && v.abs() < 1e15 => write!(out, "{}", *v as i64),
            Cell::Number(v) => write!(out, "{v}"),
            Cell::Measure(v, _) => write!(out, "{v:.6}"),
            Cell::Text(s) => {
                out.push_str(s);
                Ok(())
            }
            Cell::Bool(b) => write!(out, "{b}"),
            Cell::Empty => Ok(()),
        };
    }
}

/// A table. `sheet` names its XLSX sheet, `csv` its CSV file; a table without one is left
/// out of that format. `footer` rows follow the table in its sheet after one blank row,
/// outside its autofilter (a summary beneath a listing).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub sheet: Option<String>,
    pub csv: Option<String>,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    pub footer: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(columns: &[S]) -> Table {
        Table {
            columns: columns.iter().map(|c| c.as_ref().to_string()).collect(),
            ..Table::default()
        }
    }

    /// The same table with a first column `name` holding `value` in every row (and footer
    /// row): which rank of a run the rows came from.
    pub fn with_first_column(mut self, name: &str, value: &Cell) -> Table {
        self.columns.insert(0, name.to_owned());
        for row in self.rows.iter_mut().chain(self.footer.iter_mut()) {
            row.insert(0, value.clone());
        }
        self
    }

    /// The same table as an XLSX sheet named `name`.
    pub fn sheet(mut self, name: &str) -> Table {
        self.sheet = Some(name.into());
        self
    }

    /// The same table as the CSV file `name`.
    pub fn csv(mut self, name: &str) -> Table {
        self.csv = Some(name.into());
        self
    }

    /// `metric, value` rows from a flat report map; nested values are left to their own
    /// tables.
    pub fn key_values(map: &Map<String, Json>) -> Table {
        let mut t = Table::new(&["metric", "value"]);
        t.rows = map
            .iter()
            .filter(|(_, v)| !v.is_array() && !v.is_object())
            .map(|(k, v)| vec![Cell::Text(k.clone()), Cell::of(v)])
            .collect();
        t
    }

    /// One row per JSON object; the columns are the first object's keys in order.
    pub fn from_objects<'a>(objects: impl IntoIterator<Item = &'a Json>) -> Table {
        let mut t = Table::default();
        for object in objects {
            let Some(m) = object.as_object() else {
                continue;
            };
            if t.columns.is_empty() {
                t.columns = m.keys().cloned().collect();
            }
            t.rows.push(
                t.columns
                    .iter()
                    .map(|c| m.get(c).map_or(Cell::Empty, Cell::of))
                    .collect(),
            );
        }
        t
    }
}
