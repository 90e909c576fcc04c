//! The terminal form: the report's own text, as the command prints it.

use super::{Artifact, Exporter, Report};
use crate::error::Result;

pub struct Terminal;

impl Exporter for Terminal {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        Ok(vec![Artifact::single(report.terminal().into_bytes())])
    }
}
