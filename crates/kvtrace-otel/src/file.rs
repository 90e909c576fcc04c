//! `--otlp-file`: the spans as OTLP JSON, one `ExportTraceServiceRequest` per line (the
//! layout of the OpenTelemetry Collector's file exporter), for offline tools. Written like
//! every other output: under a temporary name, renamed into place when the run ends well.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

use kvtrace_io::error::Result;
use kvtrace_io::output::OutputFile;

pub(crate) struct JsonLines {
    path: PathBuf,
    out: BufWriter<OutputFile>,
    resource: ResourceAttributesWithSchema,
}

impl JsonLines {
    pub(crate) fn create(path: &Path, resource: &Resource) -> Result<JsonLines> {
        let file = OutputFile::create(path)?;
        Ok(JsonLines {
            path: path.to_owned(),
            out: BufWriter::new(file),
            resource: resource.into(),
        })
    }

    /// Appends one line for `batch`; the error is one line naming the file.
    pub(crate) fn write(&mut self, batch: Vec<SpanData>) -> std::result::Result<(), String> {
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let mut line = serde_json::to_vec(&request).map_err(|e| self.failed(e.to_string()))?;
        line.push(b'\n');
        self.out
            .write_all(&line)
            .map_err(|e| self.failed(e.to_string()))
    }

    /// Flushes the lines and renames the file into place; dropping a `JsonLines` without
    /// this leaves no file (a run that failed).
    pub(crate) fn finish(self) -> std::result::Result<(), String> {
        let path = self.path.clone();
        let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        self.out
            .into_inner()
            .map_err(|e| failed(e.into_error()))?
            .commit()
            .map_err(failed)
    }

    fn failed(&self, why: String) -> String {
        format!("cannot write {}: {why}", self.path.display())
    }
}
