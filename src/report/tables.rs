//! Plain tables for reports that are not a replay's (a simulation's summary and requests):
//! rows of typed cells, written by the same CSV and XLSX exporters as the replay report, so
//! every kvtrace spreadsheet looks and sorts alike.

use serde_json::{Map, Value as Json};

use crate::error::Result;

/// One cell: numbers stay numbers, so spreadsheets can sort and chart them.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Number(f64),
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

    /// The CSV text: integers without a fraction, everything else as Rust prints it.
    pub fn text(&self) -> String {
        match self {
            Cell::Number(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{}", *v as i64),
            Cell::Number(v) => v.to_string(),
            Cell::Text(s) => s.clone(),
            Cell::Bool(b) => b.to_string(),
            Cell::Empty => String::new(),
        }
    }
}

/// A named table; the name becomes the CSV file stem and the XLSX sheet name.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub name: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// `metric, value` rows from a flat report map; nested values are left to their own
    /// tables.
    pub fn key_values(name: &str, map: &Map<String, Json>) -> Table {
        Table {
            name: name.into(),
            columns: vec!["metric".into(), "value".into()],
            rows: map
                .iter()
                .filter(|(_, v)| !v.is_array() && !v.is_object())
                .map(|(k, v)| vec![Cell::Text(k.clone()), Cell::of(v)])
                .collect(),
        }
    }

    /// One row per JSON object; the columns are the first object's keys in order.
    pub fn from_objects<'a>(name: &str, objects: impl IntoIterator<Item = &'a Json>) -> Table {
        let mut columns: Vec<String> = Vec::new();
        let mut rows = Vec::new();
        for object in objects {
            let Some(m) = object.as_object() else {
                continue;
            };
            if columns.is_empty() {
                columns = m.keys().cloned().collect();
            }
            rows.push(
                columns
                    .iter()
                    .map(|c| m.get(c).map_or(Cell::Empty, Cell::of))
                    .collect(),
            );
        }
        Table {
            name: name.into(),
            columns,
            rows,
        }
    }
}

/// Turns tables into files: `stem` names them (`<stem>_<table>.csv`, `<stem>.xlsx`).
pub trait TableExporter {
    fn table_files(&self, stem: &str, tables: &[Table]) -> Result<Vec<(String, Vec<u8>)>>;
}
