//! [`SpanExport`]: request spans through the OpenTelemetry SDK to an OTLP endpoint and/or an
//! OTLP JSON file, on an exporter thread of its own.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};
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
use kvtrace_io::error::{Error, Result};

/// Spans a batch carries at most (the SDK's own default).
const BATCH_SPANS: usize = 512;
/// Requests waiting for the exporter thread before the caller is held back.
const QUEUE_REQUESTS: usize = 16 * 1024;
/// How long a stop asked for by a signal waits for the exporter thread (a stuck endpoint
/// must not hold the exit back for `--otlp-timeout`).
const INTERRUPTED_WAIT: Duration = Duration::from_millis(500);
/// How often a caller held back by a full queue looks for a signal.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// How long a partial batch waits for more spans.
const BATCH_DELAY: Duration = Duration::from_millis(200);

/// Sends request spans to an OTLP endpoint and/or file (see the module docs of
/// [`crate`]). The caller only queues each [`RequestSpan`]; the exporter thread builds
/// the SDK spans, batches and sends them. Dropping it without [`SpanExport::finish`] still
/// flushes the endpoint but leaves no file: only a finished run's spans are written.
pub struct SpanExport {
    queue: Option<Sender<RequestSpan>>,
    thread: Option<JoinHandle<()>>,
    summary: Option<Receiver<ExportSummary>>,
    /// Set by [`SpanExport::finish`]: the file is renamed into place.
    keep_file: Arc<AtomicBool>,
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
        kvtrace_io::tls::install_provider();
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
                .map_err(|e| Error::usage(format!("OTLP endpoint {url}: {e}")))?,
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
        let ended = Arc::new(Mutex::new(Vec::new()));
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(Collect(ended.clone()))
            .build();
        let (tx, rx) = bounded(QUEUE_REQUESTS);
        let (summary_tx, summary_rx) = bounded(1);
        let keep_file = Arc::new(AtomicBool::new(false));
        let keep = keep_file.clone();
        let thread = std::thread::Builder::new()
            .name("kvtrace-otlp".into())
            .spawn(move || {
                yield_to_the_run();
                let builder = Builder {
                    tracer: provider.tracer("kvtrace"),
                    ended,
                };
                let summary = drain(rx, &builder, sinks, &keep);
                let _ = provider.shutdown();
                let _ = summary_tx.send(summary);
            })
            .map_err(|e| Error::io("cannot start the OTLP export thread", e))?;
        Ok(SpanExport {
            queue: Some(tx),
            thread: Some(thread),
            summary: Some(summary_rx),
            keep_file,
        })
    }

    /// Sends what is queued, writes the file into place and stops the exporter thread;
    /// what was built, delivered, written, and the first failure. After a signal it waits
    /// `INTERRUPTED_WAIT` at most, and says so when the thread was still busy.
    pub fn finish(mut self) -> ExportSummary {
        self.keep_file.store(true, Ordering::SeqCst);
        self.stop()
    }

    fn stop(&mut self) -> ExportSummary {
        self.queue.take();
        let Some(summary) = self.summary.take() else {
            return ExportSummary::default();
        };
        let received = match kvtrace_io::interrupt::requested() {
            Some(_) => summary.recv_timeout(INTERRUPTED_WAIT).ok(),
            None => summary.recv().ok(),
        };
        match received {
            Some(summary) => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
                summary
            }
            // After a signal the thread is left blocked in the endpoint's export; the
            // process exits without it.
            None => ExportSummary {
                error: Some(match kvtrace_io::interrupt::requested() {
                    Some(_) => "OTLP export: interrupted while the endpoint was still answering; the rest of the spans were not sent".into(),
                    None => "OTLP export: the exporter thread failed".into(),
                }),
                ..ExportSummary::default()
            },
        }
    }
}

impl Drop for SpanExport {
    fn drop(&mut self) {
        self.stop();
    }
}

impl SpanSink for SpanExport {
    /// Queues `span`; a full queue holds the run back until the exporter thread catches up,
    /// or a signal asks the run to stop (the span is then dropped).
    fn request(&self, span: RequestSpan) {
        let Some(queue) = &self.queue else {
            return;
        };
        let mut span = span;
        loop {
            match queue.send_timeout(span, SIGNAL_POLL) {
                Ok(()) | Err(SendTimeoutError::Disconnected(_)) => return,
                Err(SendTimeoutError::Timeout(back)) => {
                    if kvtrace_io::interrupt::requested().is_some() {
                        return;
                    }
                    span = back;
                }
            }
        }
    }
}

/// Lowers this thread's scheduling priority to the lowest (nice 19), so that on a machine
/// with fewer cores than busy threads the export waits for the replay, not the other way
/// round; the bounded queue still holds the replay back if the export falls too far behind.
fn yield_to_the_run() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id changes nothing but its nice value.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
    }
}

/// Turns request trees into SDK spans on the exporter thread; [`Collect`] hands the ended
/// ones back.
struct Builder {
    tracer: SdkTracer,
    ended: Arc<Mutex<Vec<SpanData>>>,
}

impl Builder {
    fn build(&self, span: &RequestSpan) {
        let root = self.start(&span.root, &Context::new());
        let cx = Context::new().with_span(root);
        for child in &span.children {
            let mut s = self.start(child, &cx);
            s.end_with_timestamp(wall(child.end_s));
        }
        cx.span().end_with_timestamp(wall(span.root.end_s));
    }

    fn start(&self, span: &Span, parent: &Context) -> opentelemetry_sdk::trace::Span {
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

    fn take(&self) -> Vec<SpanData> {
        self.ended
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }

    fn pending(&self) -> usize {
        self.ended.lock().map_or(0, |v| v.len())
    }
}

/// The exporter thread: builds each request's spans, sends a batch once [`BATCH_SPANS`] have
/// ended or [`BATCH_DELAY`] passed without a request, until the queue closes.
fn drain(
    rx: Receiver<RequestSpan>,
    builder: &Builder,
    mut sinks: Sinks,
    keep_file: &AtomicBool,
) -> ExportSummary {
    loop {
        match rx.recv_timeout(BATCH_DELAY) {
            Ok(span) => {
                sinks.summary.spans += span.span_count();
                builder.build(&span);
                if builder.pending() >= BATCH_SPANS {
                    sinks.export(builder.take());
                }
            }
            Err(RecvTimeoutError::Timeout) => sinks.export(builder.take()),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    sinks.export(builder.take());
    sinks.finish(keep_file.load(Ordering::SeqCst))
}

/// The span processor: every ended span, kept for the exporter thread's next batch.
#[derive(Debug)]
struct Collect(Arc<Mutex<Vec<SpanData>>>);

impl SpanProcessor for Collect {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if let Ok(mut ended) = self.0.lock() {
            ended.push(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
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
            "OTLP endpoint {url}: expected an http:// or https:// URL"
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
    fn export(&mut self, mut batch: Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        // After a signal the endpoint gets nothing more: an export may block for the timeout.
        let endpoint = self
            .otlp
            .as_mut()
            .filter(|e| !e.failed && kvtrace_io::interrupt::requested().is_none());
        if let Some(file) = &mut self.file {
            // The file takes the batch itself unless the endpoint needs it too.
            let spans = match endpoint {
                Some(_) => batch.clone(),
                None => std::mem::take(&mut batch),
            };
            match file.write(spans) {
                Ok(()) => self.summary.written += n,
                Err(e) => {
                    self.summary.error.get_or_insert(e);
                }
            }
        }
        let Some(endpoint) = endpoint else {
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

    /// Ends the sinks; the file is renamed into place only when `keep_file` (a run that
    /// failed leaves none, and no temporary file either).
    fn finish(mut self, keep_file: bool) -> ExportSummary {
        if let Some(file) = self.file.take().filter(|_| keep_file) {
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
