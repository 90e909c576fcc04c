//! A report's table as one record batch, and the Parquet exporter: one `.parquet` file per
//! table that has a CSV file, under the CSV file's name, so the per-request, per-divergence and
//! per-point tables land beside their CSV twins with types a dataframe keeps (counts as
//! integers, figures as floats, flags as booleans).

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, StringBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use kvtrace_io::error::{Error, Result};
use kvtrace_report::{Artifact, Cell, Exporter, Report, Table};

use parquet::arrow::ArrowWriter;

use crate::write::parquet_properties;

/// What a column's cells hold, widened until every cell fits: counts that meet other numbers
/// become floats, and anything that meets text becomes text (as the CSV shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Empty,
    Count,
    Number,
    Bool,
    Text,
}

impl Kind {
    fn of(cell: &Cell) -> Kind {
        match cell {
            Cell::Empty => Kind::Empty,
            Cell::Count(_) => Kind::Count,
            Cell::Number(_) | Cell::Measure(..) => Kind::Number,
            Cell::Bool(_) => Kind::Bool,
            Cell::Text(_) => Kind::Text,
        }
    }

    fn widen(self, other: Kind) -> Kind {
        use Kind::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Empty, b) => b,
            (a, Empty) => a,
            (Count, Number) | (Number, Count) => Number,
            _ => Text,
        }
    }
}

/// The table's rows (not its footer, a summary for the eye) as a record batch.
pub fn to_batch(table: &Table) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(table.columns.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(table.columns.len());
    for (i, name) in table.columns.iter().enumerate() {
        let cells = || {
            table
                .rows
                .iter()
                .map(move |row| row.get(i).unwrap_or(&Cell::Empty))
        };
        let kind = cells().map(Kind::of).fold(Kind::Empty, Kind::widen);
        let (data_type, array): (DataType, ArrayRef) = match kind {
            Kind::Count => {
                let mut b = UInt64Builder::new();
                for c in cells() {
                    b.append_option(match c {
                        Cell::Count(n) => Some(*n),
                        _ => None,
                    });
                }
                (DataType::UInt64, Arc::new(b.finish()))
            }
            Kind::Number => {
                let mut b = Float64Builder::new();
                for c in cells() {
                    b.append_option(match c {
                        Cell::Count(n) => Some(*n as f64),
                        Cell::Number(v) | Cell::Measure(v, _) => Some(*v),
                        _ => None,
                    });
                }
                (DataType::Float64, Arc::new(b.finish()))
            }
            Kind::Bool => {
                let mut b = BooleanBuilder::new();
                for c in cells() {
                    b.append_option(match c {
                        Cell::Bool(v) => Some(*v),
                        _ => None,
                    });
                }
                (DataType::Boolean, Arc::new(b.finish()))
            }
            Kind::Text | Kind::Empty => {
                let mut b = StringBuilder::new();
                for c in cells() {
                    match c {
                        Cell::Empty => b.append_null(),
                        other => b.append_value(other.csv()),
                    }
                }
                (DataType::Utf8, Arc::new(b.finish()))
            }
        };
        fields.push(Field::new(name, data_type, true));
        arrays.push(array);
    }
    let schema = Arc::new(Schema::new(fields));
    RecordBatch::try_new(schema, arrays)
        .map_err(|e| Error::bad_input(format!("table {:?}: {e}", table.csv)))
}

/// The bytes of `batch` as a Parquet file.
pub fn parquet_bytes(batch: &RecordBatch) -> Result<Vec<u8>> {
    let fail = |e: parquet::errors::ParquetError| {
        Error::io("cannot write Parquet", std::io::Error::other(e.to_string()))
    };
    let props = parquet_properties(&batch.schema());
    let mut writer = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props)).map_err(fail)?;
    writer.write(batch).map_err(fail)?;
    writer.into_inner().map_err(fail)
}

/// Parquet: one file per table that has a CSV name, `NAME.parquet` for `NAME.csv`.
pub struct Parquet;

impl Exporter for Parquet {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let mut out = Vec::new();
        for table in report.tables() {
            let Some(name) = &table.csv else {
                continue;
            };
            let stem = name.strip_suffix(".csv").unwrap_or(name);
            out.push(Artifact {
                name: Some(format!("{stem}.parquet")),
                bytes: parquet_bytes(&to_batch(&table)?)?,
            });
        }
        Ok(out)
    }
}
