//! OpenTelemetry spans of replayed requests, shaped as LMCache's own tracing shapes them, so
//! that a replayed workload lands in the same Jaeger or Tempo dashboards as the live one.
//!
//! LMCache (`--enable-tracing --otlp-endpoint URL`) opens a root span `request` per client
//! session with the children `mp.lookup_prefetch`, `mp.retrieve` and `mp.store`, and sets
//! `hit_tokens`, `requested_tokens` and `hit_rate` (0.0 when nothing was requested) on the
//! root when the lookup ends, beside its per-tier `l1_hit_tokens`/`l2_hit_tokens`. kvtrace
//! builds the same tree from each replayed session ([`RequestSpan`]) and hands it to a
//! [`SpanSink`]; [`SpanExport`] is the sink that sends the spans over OTLP (HTTP/protobuf or
//! gRPC) and/or writes them as OTLP JSON lines.
//!
//! The export runs on its own thread behind a bounded queue: a replay only queues each request
//! tree (the thread builds the SDK spans, batches and sends them), and a slow collector holds
//! it back (the queue is full) rather than losing spans.
//! After the first failed export to the endpoint, the rest are not sent (no run waits out one
//! timeout per batch); the failure is one line at the end, after every report is written.

#![warn(unreachable_pub)]

mod spans;

#[cfg(feature = "export")]
mod export;
#[cfg(feature = "export")]
mod file;

use std::path::PathBuf;
use std::time::Duration;

pub use spans::{Attr, RequestSpan, Span};

#[cfg(feature = "export")]
pub use export::SpanExport;

/// Where finished request spans go.
pub trait SpanSink: Send + Sync + std::fmt::Debug {
    fn request(&self, span: RequestSpan);
}

/// Every sink hears every request: spans exported and counted at once.
#[derive(Debug)]
pub struct SpanTee(pub Vec<std::sync::Arc<dyn SpanSink>>);

impl SpanSink for SpanTee {
    fn request(&self, span: RequestSpan) {
        if let Some((last, first)) = self.0.split_last() {
            for sink in first {
                sink.request(span.clone());
            }
            last.request(span);
        }
    }
}

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Protobuf over HTTP POST to `<endpoint>/v1/traces` (the collector's port 4318).
    HttpProtobuf,
    /// gRPC `TraceService/Export` (port 4317).
    Grpc,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }
}

/// What to export and where.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// The collector's URL, `None` for no network export.
    pub endpoint: Option<String>,
    pub protocol: Protocol,
    /// Also (or only) write the spans as OTLP JSON, one export request per line.
    pub file: Option<PathBuf>,
    /// Resource attributes beside `service.name` (`kvtrace` unless `OTEL_SERVICE_NAME` says
    /// otherwise) and `service.version`: which command, trace and configuration.
    pub resource: Vec<(String, String)>,
    /// How long one export call may take before it counts as failed.
    pub timeout: Duration,
}

/// What an export delivered.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportSummary {
    /// Spans built (roots and children).
    pub spans: u64,
    /// Spans the endpoint accepted.
    pub delivered: u64,
    /// Spans written to the file.
    pub written: u64,
    /// The first failure, one line: the endpoint or the file and why.
    pub error: Option<String>,
}

/// Without the `export` feature (kvtrace's `otel`) there is no export: [`SpanExport::start`] is
/// a one-line error.
#[cfg(not(feature = "export"))]
#[derive(Debug)]
pub struct SpanExport(std::convert::Infallible);

#[cfg(not(feature = "export"))]
impl SpanExport {
    pub fn start(_options: ExportOptions) -> kvtrace_io::Result<SpanExport> {
        Err(kvtrace_io::Error::usage(
            "this kvtrace was built without the `otel` feature: it exports no spans",
        ))
    }

    pub fn finish(self) -> ExportSummary {
        match self.0 {}
    }
}

#[cfg(not(feature = "export"))]
impl SpanSink for SpanExport {
    fn request(&self, _span: RequestSpan) {
        match self.0 {}
    }
}
