//! The JSON document, in the style the report asks for (see [`JsonStyle`]), with a final
//! newline.

use serde_json::Value;

use super::{Artifact, Exporter, JsonStyle, Report};
use kvtrace_io::error::{Error, Result};
use kvtrace_lmct::pyjson::python_json_indented;

pub struct Json;

impl Exporter for Json {
    fn export(&self, report: &dyn Report) -> Result<Vec<Artifact>> {
        let doc = report.document()?;
        let mut text = match report.json_style() {
            JsonStyle::Pretty => pretty(&doc)?,
            JsonStyle::PrettySorted => pretty(&sorted(doc))?,
            JsonStyle::Python => python_json_indented(&doc, 2),
        };
        text.push('\n');
        Ok(vec![Artifact::single(text.into_bytes())])
    }
}

fn pretty(v: &Value) -> Result<String> {
    serde_json::to_string_pretty(v).map_err(|e| Error::io("cannot encode JSON", e.into()))
}

/// Sorts object keys recursively (serde_json keeps insertion order in this build).
pub fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
