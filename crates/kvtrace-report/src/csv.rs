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
            for row in &t.rows {
                w.write_record(row.iter().map(|c| c.csv())).map_err(io)?;
            }
            out.push(Artifact {
                name: Some(name),
                bytes: w.into_inner().map_err(io)?,
            });
        }
        Ok(out)
    }
}
