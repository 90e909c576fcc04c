//! The OpenTelemetry flags every engine takes (`--otlp-endpoint`, `--otlp-protocol`,
//! `--otlp-file`), turned into a [`SpanExport`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use kvtrace::error::Error;
use kvtrace::otel::{ExportOptions, ExportSummary, Protocol, SpanExport};

#[derive(Clone, Copy, ValueEnum)]
enum OtlpProtocol {
    /// gRPC, as LMCache's own exporter (the collector's port 4317)
    Grpc,
    /// Protobuf over HTTP (port 4318; a bare URL gets /v1/traces)
    HttpProtobuf,
}

#[derive(clap::Args, Clone)]
pub(super) struct OtlpArgs {
    /// Export each request as LMCache's `request` span tree (hit_tokens, requested_tokens,
    /// hit_rate; mp.lookup_prefetch, mp.retrieve, mp.store) to this OTLP collector, e.g.
    /// http://localhost:4317
    #[arg(long, value_name = "URL", help_heading = "OpenTelemetry")]
    otlp_endpoint: Option<String>,
    /// The OTLP transport of --otlp-endpoint
    #[arg(
        long,
        value_enum,
        default_value = "grpc",
        help_heading = "OpenTelemetry"
    )]
    otlp_protocol: OtlpProtocol,
    /// Also write the spans as OTLP JSON, one export request per line
    #[arg(long, value_name = "PATH", help_heading = "OpenTelemetry")]
    otlp_file: Option<PathBuf>,
    /// Seconds one export may take before the endpoint counts as failed
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10.0,
        help_heading = "OpenTelemetry"
    )]
    otlp_timeout: f64,
}

impl OtlpArgs {
    /// The OTLP JSON file asked for, an output like any other.
    pub(super) fn file(&self) -> Option<&std::path::Path> {
        self.otlp_file.as_deref()
    }

    /// Whether any export was asked for.
    pub(super) fn asked(&self) -> bool {
        self.otlp_endpoint.is_some() || self.otlp_file.is_some()
    }

    /// The export these flags ask for, labelled with `resource`; `None` when none is asked.
    pub(super) fn start(
        &self,
        resource: Vec<(String, String)>,
    ) -> Result<Option<Arc<SpanExport>>, Error> {
        if !self.asked() {
            return Ok(None);
        }
        if !(self.otlp_timeout.is_finite() && self.otlp_timeout > 0.0) {
            return Err(Error::usage(format!(
                "--otlp-timeout {}: must be a positive number of seconds",
                self.otlp_timeout
            )));
        }
        let protocol = match self.otlp_protocol {
            OtlpProtocol::Grpc => Protocol::Grpc,
            OtlpProtocol::HttpProtobuf => Protocol::HttpProtobuf,
        };
        let export = SpanExport::start(ExportOptions {
            endpoint: self.otlp_endpoint.clone(),
            protocol,
            file: self.otlp_file.clone(),
            resource,
            timeout: Duration::from_secs_f64(self.otlp_timeout.min(3600.0)),
        })?;
        Ok(Some(Arc::new(export)))
    }
}

/// Flushes `export` once the run that fed it has ended: a failure is one line on stderr and
/// exit status 1 (the reports are already written); otherwise a note of what went where.
pub(super) fn finish(export: Option<Arc<SpanExport>>, quiet: bool) -> Option<i32> {
    let export = export?;
    let summary = match Arc::try_unwrap(export) {
        Ok(export) => export.finish(),
        Err(_) => ExportSummary {
            error: Some("OTLP export: spans were still being built when the run ended".into()),
            ..ExportSummary::default()
        },
    };
    if let Some(e) = &summary.error {
        eprintln!("kvtrace: {e}");
        return Some(kvtrace::error::EXIT_DATA);
    }
    if !quiet {
        eprintln!(
            "kvtrace: OpenTelemetry: {} spans built, {} delivered to the endpoint, {} written to the file",
            summary.spans, summary.delivered, summary.written
        );
    }
    None
}
