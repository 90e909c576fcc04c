//! JSON Lines: one compact JSON value per line. [`JsonlWriter`] streams lines as a run
//! produces them (a replay's records); the [`Jsonl`] exporter writes a finished report's
//! [`Report::records`] with the same encoding.

use std::io::{BufWriter, Write};
use std::path::Path;

use serde::Serialize;

use super::{Artifact, Exporter, Report};
use kvtrace_io::error::{Error, Result};
use kvtrace_io::output::OutputFile;

pub struct Jsonl;

impl Exporter for Jsonl {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let mut out = Vec::new();
        for r in report.records() {
            line(&mut out, &r).map_err(|e| Error::io("cannot encode JSON", e))?;
        }
        Ok(vec![Artifact::single(out)])
    }
}

fn line(out: &mut impl Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

/// A JSONL file written line by line under a temporary name, in place once committed.
pub struct JsonlWriter {
    out: BufWriter<OutputFile>,
    shown: String,
}

impl JsonlWriter {
    pub fn create(path: &Path) -> Result<JsonlWriter> {
        Ok(JsonlWriter {
            out: BufWriter::new(OutputFile::create(path)?),
            shown: path.display().to_string(),
        })
    }

    pub fn write(&mut self, value: &impl Serialize) -> Result<()> {
        line(&mut self.out, value).map_err(|e| Error::io("cannot write", e).in_file(&self.shown))
    }

    /// Flushes and moves the file into place.
    pub fn commit(self) -> Result<()> {
        let shown = self.shown;
        self.out
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(OutputFile::commit)
            .map_err(|e| Error::io("cannot write", e).in_file(shown))
    }
}
