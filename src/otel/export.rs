//! [`SpanExport`]: request spans through the OpenTelemetry SDK to an OTLP endpoint and/or an
//! OTLP JSON file, on an exporter thread of its own.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;

use super::file::JsonLines;
use super::{Attr, ExportOptions, ExportSummary, Protocol, RequestSpan, Span, SpanSink};
use crate::error::{Error, Result};

/// Spans a batch carries at most (the SDK's own default).
const BATCH_SPANS: usize = 512;
/// Spans waiting for the exporter thread before a replay is held back.
const QUEUE_SPANS: usize = 64 * 1024;
/// How long a partial batch waits for more spans.
const BATCH_DELAY: Duration = Duration::from_millis(200);

/// Sends request spans to an OTLP endpoint and/or file (see the module docs of
/// [`crate::otel`]). Dropping it without [`SpanExport::finish`] still flushes.
pub struct SpanExport {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    result: Arc<Mutex<Option<ExportSummary>>>,
    built: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SpanExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpanExport")
    }
}

impl SpanExport {
    /// Builds the exporters `options` ask for and starts the exporter thread. Fails (one
    /// line) on a malformed endpoint or a file that cannot be created; an endpoint that does
    /// not answer is found out at the first export.
    pub fn start(options: ExportOptions) -> Result<SpanExport> {
        let resource = resource(&options);
        let mut runtime = None;
        let mut otlp = match &options.endpoint {
            None => None,
            Some(url) => Some(
                match options.protocol {
                    Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                        .with_http()
                        .with_endpoint(http_traces_url(url)?)
                        .with_timeout(options.timeout)
                        .build(),
                    Protocol::Grpc => {
                        check_url(url)?;
                        // tonic's channel spawns its connection onto the runtime it is built in.
                        let rt = tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(1)
                            .enable_all()
                            .build()
                            .map_err(|e| Error::io("cannot start the gRPC runtime", e))?;
                        let built = {
                            let _entered = rt.enter();
                            opentelemetry_otlp::SpanExporter::builder()
                                .with_tonic()
                                .with_endpoint(url.clone())
                                .with_timeout(options.timeout)
                                .build()
                        };
                        runtime = Some(rt);
                        built
                    }
                }
                .map_err(|e| Error::usage(format!("--otlp-endpoint {url}: {e}")))?,
            ),
        };
        if let Some(exporter) = &mut otlp {
            exporter.set_resource(&resource);
        }
        let file = match &options.file {
            Some(path) => Some(JsonLines::create(path, &resource)?),
            None => None,
        };
        let sinks = Sinks {
            otlp: otlp.map(|exporter| Endpoint {
                exporter,
                runtime,
                url: options.endpoint.clone().unwrap_or_default(),
                protocol: options.protocol,
                failed: false,
            }),
            file,
            summary: ExportSummary::default(),
        };
        let result = Arc::new(Mutex::new(None));
        let processor = QueueProcessor::start(sinks, result.clone());
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("kvtrace");
        Ok(SpanExport {
            provider,
            tracer,
            result,
            built: Default::default(),
        })
    }

    /// Sends what is queued and stops the exporter thread; what was delivered, written and
    /// the first failure.
    pub fn finish(self) -> ExportSummary {
        // The processor's shutdown waits for the thread, whatever the SDK says of it.
        let _ = self.provider.shutdown();
        let mut summary = self
            .result
            .lock()
            .map(|mut r| r.take().unwrap_or_default())
            .unwrap_or_default();
        summary.spans = self.built.load(std::sync::atomic::Ordering::Relaxed);
        summary
    }

    fn start_span(&self, span: &Span, parent: &Context) -> opentelemetry_sdk::trace::Span {
        let kind = if span.name == "request" {
            SpanKind::Server
        } else {
            SpanKind::Internal
        };
        self.tracer
            .span_builder(span.name)
            .with_kind(kind)
            .with_start_time(wall(span.start_s))
            .with_attributes(
                span.attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(*k, value(v))),
            )
            .start_with_context(&self.tracer, parent)
    }
}

impl SpanSink for SpanExport {
    fn request(&self, span: RequestSpan) {
        let root = self.start_span(&span.root, &Context::new());
        let cx = Context::new().with_span(root);
        for child in &span.children {
            let mut s = self.start_span(child, &cx);
            s.end_with_timestamp(wall(child.end_s));
        }
        cx.span().end_with_timestamp(wall(span.root.end_s));
        self.built
            .fetch_add(span.span_count(), std::sync::atomic::Ordering::Relaxed);
    }
}

fn value(v: &Attr) -> Value {
    match v {
        Attr::Int(i) => Value::I64(*i),
        Attr::Float(f) => Value::F64(*f),
        Attr::Str(s) => Value::String(s.clone().into()),
    }
}

/// Unix seconds as a `SystemTime`; a time a trace's header cannot mean (negative, not finite,
/// past the year 5000) is the epoch.
fn wall(s: f64) -> SystemTime {
    if s.is_finite() && (0.0..1e11).contains(&s) {
        UNIX_EPOCH + Duration::from_secs_f64(s)
    } else {
        UNIX_EPOCH
    }
}

fn resource(options: &ExportOptions) -> Resource {
    let mut builder = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        builder = builder.with_service_name("kvtrace");
    }
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attributes(
            options
                .resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

fn check_url(url: &str) -> Result<()> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "--otlp-endpoint {url}: expected an http:// or https:// URL"
        )))
    }
}

/// The collector's traces URL: `/v1/traces` appended to a bare `http://host:4318`, any other
/// path kept as given.
fn http_traces_url(url: &str) -> Result<String> {
    check_url(url)?;
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    Ok(match after_scheme.find('/') {
        None => format!("{url}/v1/traces"),
        Some(i) if after_scheme[i..] == *"/" => format!("{}v1/traces", url),
        Some(_) => url.to_owned(),
    })
}

/// Where the exporter thread sends a batch.
struct Sinks {
    otlp: Option<Endpoint>,
    file: Option<JsonLines>,
    summary: ExportSummary,
}

struct Endpoint {
    exporter: opentelemetry_otlp::SpanExporter,
    runtime: Option<tokio::runtime::Runtime>,
    url: String,
    protocol: Protocol,
    failed: bool,
}

impl Endpoint {
    fn export(&mut self, batch: Vec<SpanData>) -> OTelSdkResult {
        let future = self.exporter.export(batch);
        match &self.runtime {
            Some(rt) => rt.block_on(future),
            None => block_on(future),
        }
    }
}

impl Sinks {
    fn export(&mut self, batch: Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        if let Some(file) = &mut self.file {
            match file.write(&batch) {
                Ok(()) => self.summary.written += n,
                Err(e) => {
                    self.summary.error.get_or_insert(e);
                }
            }
        }
        let Some(endpoint) = self.otlp.as_mut().filter(|e| !e.failed) else {
            return;
        };
        match endpoint.export(batch) {
            Ok(()) => self.summary.delivered += n,
            Err(e) => {
                endpoint.failed = true;
                self.summary.error.get_or_insert(format!(
                    "OTLP export to {} ({}) failed: {}",
                    endpoint.url,
                    endpoint.protocol.name(),
                    one_line(&e.to_string())
                ));
            }
        }
    }

    fn finish(mut self) -> ExportSummary {
        if let Some(file) = self.file.take() {
            if let Err(e) = file.finish() {
                self.summary.error.get_or_insert(e);
            }
        }
        if let Some(endpoint) = self.otlp.take() {
            let _ = endpoint.exporter.shutdown();
            if let Some(rt) = endpoint.runtime {
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
        self.summary
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A span processor that hands every finished span to the exporter thread through a bounded
/// queue: a full queue holds the replay back instead of dropping spans, as the SDK's batch
/// processor would.
#[derive(Debug)]
struct QueueProcessor {
    queue: Mutex<Option<Sender<SpanData>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl QueueProcessor {
    fn start(sinks: Sinks, result: Arc<Mutex<Option<ExportSummary>>>) -> QueueProcessor {
        let (tx, rx) = bounded(QUEUE_SPANS);
        let thread = std::thread::Builder::new()
            .name("kvtrace-otlp".into())
            .spawn(move || {
                let summary = drain(rx, sinks);
                if let Ok(mut r) = result.lock() {
                    *r = Some(summary);
                }
            })
            .ok();
        QueueProcessor {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(thread),
        }
    }
}

/// The exporter thread: batches of up to [`BATCH_SPANS`], a partial one after
/// [`BATCH_DELAY`] without a new span, until the queue closes.
fn drain(rx: Receiver<SpanData>, mut sinks: Sinks) -> ExportSummary {
    let mut batch = Vec::with_capacity(BATCH_SPANS);
    loop {
        match rx.recv_timeout(BATCH_DELAY) {
            Ok(span) => {
                batch.push(span);
                if batch.len() >= BATCH_SPANS {
                    sinks.export(std::mem::take(&mut batch));
                }
            }
            Err(RecvTimeoutError::Timeout) => sinks.export(std::mem::take(&mut batch)),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    sinks.export(batch);
    sinks.finish()
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if let Ok(queue) = self.queue.lock() {
            if let Some(tx) = queue.as_ref() {
                let _ = tx.send(span);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        if let Ok(mut queue) = self.queue.lock() {
            queue.take();
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        Ok(())
    }
}

/// Runs a future to completion on this thread. The HTTP exporter's blocking client must not
/// run inside a Tokio runtime, so its futures are driven here instead.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
