//! CSV: one file per table that names one, header first (a sheet's footer stays in the
//! sheet).

use super::{Artifact, Exporter, Report};
use kvtrace_io::error::{Error, Result};

pub struct Csv;

fn io(e: impl std::fmt::Display) -> Error {
    Error::io("cannot write CSV", std::io::Error::other(e.to_string()))
}

impl Exporter for Csv {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let mut out = Vec::new();
        for t in report.tables() {
            let Some(name) = t.csv else {
                continue;
            };
            let mut w = csv::Writer::from_writer(Vec::new());
            w.write_record(&t.columns).map_err(io)?;
            let mut cell = String::new();
            for row in &t.rows {
                for c in row {
                    cell.clear();
                    c.write_csv(&mut cell);
                    w.write_field(&cell).map_err(io)?;
                }
                // An empty record ends the one its fields began.
                w.write_record(None::<&[u8]>).map_err(io)?;
            }
            out.push(Artifact {
                name: Some(name),
                bytes: w.into_inner().map_err(io)?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Cell, Table, Unit};
    use crate::JsonStyle;

    struct Tables(Vec<Table>);

    impl Report for Tables {
        fn document(&self) -> Result<serde_json::Value> {
            Ok(serde_json::Value::Null)
        }
        fn json_style(&self) -> JsonStyle {
            JsonStyle::Pretty
        }
        fn tables(&self) -> Vec<Table> {
            self.0.clone()
        }
        fn terminal(&self) -> String {
            String::new()
        }
    }

    /// Cells written into one buffer field by field make the files the csv crate makes of
    /// each row's strings: quoting, a lone empty field, numbers of every kind.
    #[test]
    fn rows_written_field_by_field_are_the_crates_records() {
        let mut pairs = Table::new(&["a", "b"]).csv("pairs.csv");
        pairs.rows = vec![
            vec![Cell::Count(7), Cell::Measure(0.1234567, Unit::Ratio)],
            vec![Cell::text("x,y"), Cell::text("say \"hi\"\nthere")],
            vec![Cell::Number(3.0), Cell::Number(-0.25)],
            vec![Cell::Bool(true), Cell::Number(1e20)],
            vec![Cell::Empty, Cell::Empty],
        ];
        let mut single = Table::new(&["only"]).csv("single.csv");
        single.rows = vec![
            vec![Cell::Empty],
            vec![Cell::text("")],
            vec![Cell::Count(0)],
        ];
        let tables = vec![pairs, single];
        let artifacts = Csv.export(&Tables(tables.clone())).expect("export");
        assert_eq!(artifacts.len(), 2);
        for (table, artifact) in tables.iter().zip(&artifacts) {
            let mut expected = csv::Writer::from_writer(Vec::new());
            expected.write_record(&table.columns).expect("header");
            for row in &table.rows {
                expected
                    .write_record(row.iter().map(Cell::csv))
                    .expect("row");
            }
            let expected = expected.into_inner().expect("bytes");
            assert_eq!(artifact.bytes, expected, "{:?}", table.csv);
        }
        assert!(String::from_utf8_lossy(&artifacts[1].bytes).contains("\n\"\"\n"));
    }
}
