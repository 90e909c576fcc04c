//! OTLP export of replayed requests, received by in-test collectors (protobuf over HTTP decoded
//! with prost, gRPC served by tonic) and compared with the replay's own per-request report.
#![cfg(feature = "otel")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::util::{kvtrace, sample, scratch, shared, text};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

/// An OTLP/HTTP collector on a loopback port: every POST body decoded, answered 200.
fn http_collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let received: Received = Arc::default();
    let sink = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || serve_http(stream, &sink));
        }
    });
    (url, received)
}

fn serve_http(stream: TcpStream, sink: &Received) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut out = stream;
    loop {
        let mut length = None;
        let mut path = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(rest) = l.strip_prefix("POST ") {
                path = rest.split(' ').next().unwrap_or_default().to_owned();
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse::<usize>().ok();
                }
            }
        }
        let mut body = vec![0; length.expect("content-length")];
        reader.read_exact(&mut body).expect("body");
        assert_eq!(path, "/v1/traces", "a bare endpoint gets the traces path");
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("protobuf");
        sink.lock().expect("lock").push(request);
        let reply = ExportTraceServiceResponse::default().encode_to_vec();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        out.write_all(head.as_bytes()).expect("reply");
        out.write_all(&reply).expect("reply");
    }
}

struct Collector(Received);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().expect("lock").push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC collector on a loopback port, served while the runtime lives.
fn grpc_collector() -> (String, Received, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let received: Received = Arc::default();
    let incoming = {
        let _entered = rt.enter();
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind")
    };
    let url = format!("http://{}", incoming.local_addr().expect("addr"));
    let service = TraceServiceServer::new(Collector(received.clone()));
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    (url, received, rt)
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// The `request` roots by span id, after checking that every other span is one of
/// `children` and lies inside its root, in its trace.
fn nested<'a>(spans: &'a [Span], children: &[&str]) -> BTreeMap<Vec<u8>, &'a Span> {
    let roots: BTreeMap<Vec<u8>, &Span> = spans
        .iter()
        .filter(|s| s.name == "request")
        .map(|s| (s.span_id.clone(), s))
        .collect();
    for child in spans.iter().filter(|s| s.name != "request") {
        assert!(children.contains(&child.name.as_str()), "{}", child.name);
        let root = roots
            .get(&child.parent_span_id)
            .expect("every child under a request span");
        assert_eq!(child.trace_id, root.trace_id);
        assert!(child.start_time_unix_nano >= root.start_time_unix_nano);
        assert!(child.end_time_unix_nano <= root.end_time_unix_nano);
    }
    roots
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(&span.attributes, key) {
        Some(AnyValue::IntValue(i)) => *i,
        other => panic!("{}: {key} is {other:?}, not an int", span.name),
    }
}

fn string(attributes: &[KeyValue], key: &str) -> String {
    match attr(attributes, key) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        other => panic!("{key} is {other:?}, not a string"),
    }
}

/// Every span received, with its resource's attributes checked to say kvtrace and the trace.
fn spans(received: &Received, trace: &Path) -> Vec<Span> {
    let spans = spans_of(received, "replay");
    let requests = received.lock().expect("lock");
    for rs in requests.iter().flat_map(|r| &r.resource_spans) {
        let resource = &rs.resource.as_ref().expect("resource").attributes;
        assert_eq!(
            string(resource, "kvtrace.trace"),
            trace.display().to_string()
        );
        assert_eq!(string(resource, "kvtrace.config.digest").len(), 64);
    }
    spans
}

/// Every span received from `command`, the root of each tree holding its children.
fn spans_of(received: &Received, command: &str) -> Vec<Span> {
    let requests = received.lock().expect("lock");
    let mut out = Vec::new();
    for request in requests.iter() {
        for rs in &request.resource_spans {
            let resource = &rs.resource.as_ref().expect("resource").attributes;
            assert_eq!(string(resource, "service.name"), "kvtrace");
            assert_eq!(string(resource, "kvtrace.command"), command);
            for ss in &rs.scope_spans {
                out.extend(ss.spans.iter().cloned());
            }
        }
    }
    out
}

/// The wall time the recording's server stamped on each lookup (`t_wall` of every
/// `submit_prefetch_task` record), in trace order: the time a replayed request's span
/// belongs at, read from the records themselves rather than from the header's clocks.
fn lookup_wall_times(trace: &Path) -> Vec<f64> {
    let out = kvtrace(["dump".as_ref(), trace.as_os_str()]);
    text(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .filter(|r| {
            r["qualname"]
                .as_str()
                .is_some_and(|q| q.ends_with(".submit_prefetch_task"))
        })
        .map(|r| r["t_wall"].as_f64().expect("t_wall"))
        .collect()
}

/// `kvtrace replay TRACE -q --output-dir DIR --otlp-endpoint URL --otlp-protocol P EXTRA...`.
fn replay_exporting(
    trace: &Path,
    dir: &Path,
    url: &str,
    protocol: &str,
    extra: &[&std::ffi::OsStr],
) -> std::process::Output {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "replay".as_ref(),
        trace.as_os_str(),
        "-q".as_ref(),
        "--output-dir".as_ref(),
        dir.as_os_str(),
        "--otlp-endpoint".as_ref(),
        url.as_ref(),
        "--otlp-protocol".as_ref(),
        protocol.as_ref(),
    ];
    args.extend_from_slice(extra);
    kvtrace(args)
}

/// Replays `trace` exporting to `url` and checks that the collector got one `request` span
/// per request of the replay's report, with LMCache's attributes equal to the report's
/// figures, its children nested under it, and its time the request's trace time on the
/// recording's wall clock.
fn replay_and_compare(trace: &Path, url: &str, protocol: &str, received: &Received) {
    let dir = scratch();
    let out = replay_exporting(trace, dir.path(), url, protocol, &[]);
    assert!(
        out.status.code() == Some(0),
        "{:?}: {}",
        out.status,
        text(&out.stderr)
    );
    let spans = spans(received, trace);
    let roots = nested(&spans, &["mp.lookup_prefetch", "mp.retrieve", "mp.store"]);
    let mut looked_up: Vec<&Span> = roots
        .values()
        .copied()
        .filter(|s| attr(&s.attributes, "requested_tokens").is_some())
        .collect();
    looked_up.sort_by_key(|s| s.start_time_unix_nano);

    let csv = std::fs::read_to_string(dir.path().join("trace_replay_requests.csv")).expect("csv");
    let mut rows = csv.lines();
    let columns: Vec<&str> = rows.next().expect("header").split(',').collect();
    let col = |name: &str| columns.iter().position(|c| *c == name).expect(name);
    let rows: Vec<Vec<&str>> = rows.map(|l| l.split(',').collect()).collect();
    assert!(!rows.is_empty());
    assert_eq!(looked_up.len(), rows.len(), "one request span per request");
    let walls = lookup_wall_times(trace);
    assert_eq!(walls.len(), rows.len(), "one lookup record per request");
    for ((span, row), wall) in looked_up.iter().zip(&rows).zip(walls) {
        let field = |name: &str| row[col(name)];
        assert_eq!(
            string(&span.attributes, "session_id"),
            field("external_request_id")
        );
        assert_eq!(
            int(span, "hit_tokens").to_string(),
            field("hit_tokens"),
            "{row:?}"
        );
        assert_eq!(
            int(span, "requested_tokens").to_string(),
            field("requested_tokens")
        );
        let Some(AnyValue::DoubleValue(rate)) = attr(&span.attributes, "hit_rate") else {
            panic!("hit_rate is not a float");
        };
        // The CSV prints rates to 6 decimals.
        assert_eq!(format!("{rate:.6}"), field("hit_rate"), "{row:?}");
        assert_eq!(
            int(span, "l1_hit_keys") + int(span, "l2_hit_keys"),
            field("hit_chunks").parse::<i64>().expect("hit_chunks")
        );
        // The server stamps t_wall and t_mono a few microseconds apart.
        let wall_ns = wall * 1e9;
        assert!(
            (span.start_time_unix_nano as f64 - wall_ns).abs() < 1e6,
            "{} against the recorded {wall_ns}",
            span.start_time_unix_nano
        );
    }
    assert!(
        spans.iter().any(|s| s.name == "mp.lookup_prefetch"),
        "lookups are spans"
    );
    assert!(
        spans.iter().any(|s| s.name == "mp.store"),
        "stores are spans"
    );
}

#[test]
fn http_protobuf_export_carries_one_request_span_per_replayed_request() {
    let (url, received) = http_collector();
    replay_and_compare(&sample("basic_lru"), &url, "http-protobuf", &received);
}

#[test]
fn grpc_export_of_a_churn_trace_matches_the_replay_report() {
    let Some(shared) = shared() else {
        return;
    };
    let (url, received, _rt) = grpc_collector();
    replay_and_compare(
        &shared.join("lmcache/churn_arc.lct"),
        &url,
        "grpc",
        &received,
    );
}

#[test]
fn the_otlp_file_holds_the_spans_the_endpoint_got() {
    let (url, received) = http_collector();
    let dir = scratch();
    let file = dir.path().join("spans.jsonl");
    let trace = sample("basic_lru");
    let out = replay_exporting(
        &trace,
        dir.path(),
        &url,
        "http-protobuf",
        &["--otlp-file".as_ref(), file.as_os_str()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let from_file: Vec<(String, String)> = std::fs::read_to_string(&file)
        .expect("spans file")
        .lines()
        .flat_map(|line| {
            let request: serde_json::Value = serde_json::from_str(line).expect("OTLP JSON");
            let mut found = Vec::new();
            for rs in request["resourceSpans"].as_array().expect("resourceSpans") {
                for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
                    for s in ss["spans"].as_array().expect("spans") {
                        found.push((
                            s["spanId"].as_str().expect("hex id").to_owned(),
                            s["name"].as_str().expect("name").to_owned(),
                        ));
                    }
                }
            }
            found
        })
        .collect();
    let mut from_endpoint: Vec<(String, String)> = spans(&received, &trace)
        .iter()
        .map(|s| (hex(&s.span_id), s.name.clone()))
        .collect();
    let mut from_file = from_file;
    from_file.sort();
    from_endpoint.sort();
    assert!(!from_file.is_empty());
    assert_eq!(from_file, from_endpoint);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn an_endpoint_that_is_down_is_one_line_and_exit_1_with_the_reports_written() {
    let port = crate::util::free_port();
    let dir = scratch();
    let trace = sample("basic_lru");
    let url = format!("http://127.0.0.1:{port}");
    for protocol in ["grpc", "http-protobuf"] {
        let out = replay_exporting(&trace, dir.path(), &url, protocol, &["--json".as_ref()]);
        assert_eq!(out.status.code(), Some(1), "{protocol}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&url) && stderr.contains("failed"),
            "{stderr}"
        );
        for report in ["trace_replay_requests.csv", "trace_replay_summary.json"] {
            assert!(dir.path().join(report).is_file(), "{report} written");
        }
    }
}

#[test]
fn an_endpoint_that_is_not_a_url_is_a_usage_error() {
    let out = kvtrace([
        "replay".as_ref(),
        sample("basic_lru").as_os_str(),
        "-q".as_ref(),
        "--otlp-endpoint".as_ref(),
        "localhost:4317".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

/// A simulation exports one `request` span per simulated request, its hit the engine's
/// prefix-cache reuse as the report's per-request lines give it.
#[test]
fn simulate_exports_one_request_span_per_simulated_request() {
    let (url, received) = http_collector();
    let dir = scratch();
    let lines = dir.path().join("requests.jsonl");
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/mooncake/conversation_head300.jsonl");
    let out = kvtrace([
        "simulate".as_ref(),
        trace.as_os_str(),
        "-q".as_ref(),
        "--report-json".as_ref(),
        dir.path().join("report.json").as_os_str(),
        "--report-jsonl".as_ref(),
        lines.as_os_str(),
        "--otlp-endpoint".as_ref(),
        url.as_ref(),
        "--otlp-protocol".as_ref(),
        "http-protobuf".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let spans = spans_of(&received, "simulate");
    let roots = nested(
        &spans,
        &[
            "mp.lookup_prefetch",
            "kvtrace.queue",
            "kvtrace.prefill",
            "kvtrace.decode",
        ],
    );
    let by_id: BTreeMap<String, &Span> = roots
        .values()
        .map(|s| (string(&s.attributes, "session_id"), *s))
        .collect();
    let requests: Vec<serde_json::Value> = std::fs::read_to_string(&lines)
        .expect("jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(requests.len(), 300);
    assert_eq!(by_id.len(), requests.len(), "one request span per request");
    let mut reused = 0;
    for r in &requests {
        let id = format!(
            "{}/{}",
            r["session_id"].as_str().expect("id"),
            r["turn_index"]
        );
        let span = by_id.get(&id).unwrap_or_else(|| panic!("{id}"));
        let hit = r["reused_input_tokens"].as_i64().expect("reused");
        assert_eq!(int(span, "hit_tokens"), hit);
        assert_eq!(
            int(span, "requested_tokens"),
            r["input_length"].as_i64().expect("input")
        );
        reused += hit;
    }
    assert!(reused > 0, "the slice reuses prefixes");
}

/// A benchmark run exports one `request` span per completed request, each read and write a
/// child, the hit the prefix its reads found.
#[test]
fn bench_exports_one_request_span_per_completed_request() {
    let (url, received) = http_collector();
    let dir = scratch();
    let results = dir.path().join("results.json");
    let out = kvtrace([
        "bench".as_ref(),
        "--model".as_ref(),
        "tiny-1b".as_ref(),
        "--num-users".as_ref(),
        "3".as_ref(),
        "--duration".as_ref(),
        "3".as_ref(),
        "--cpu-mem-gb".as_ref(),
        "0.5".as_ref(),
        "--generation-mode".as_ref(),
        "none".as_ref(),
        "--cache-dir".as_ref(),
        dir.path().as_os_str(),
        "-q".as_ref(),
        "--output".as_ref(),
        results.as_os_str(),
        "--otlp-endpoint".as_ref(),
        url.as_ref(),
        "--otlp-protocol".as_ref(),
        "http-protobuf".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&results).expect("results")).expect("json");
    let spans = spans_of(&received, "bench");
    let roots = nested(&spans, &["mp.retrieve", "mp.store", "kvtrace.generation"]);
    assert_eq!(
        roots.len() as u64,
        report["requests_completed"].as_u64().expect("completed")
    );
    assert!(!roots.is_empty());
    for root in roots.values() {
        let (hit, requested) = (int(root, "hit_tokens"), int(root, "requested_tokens"));
        assert!(hit <= requested && requested > 0, "{hit} of {requested}");
        let Some(AnyValue::DoubleValue(rate)) = attr(&root.attributes, "hit_rate") else {
            panic!("hit_rate");
        };
        assert!((rate - hit as f64 / requested as f64).abs() < 1e-12);
    }
    assert!(spans.iter().any(|s| s.name == "mp.store"));
}

/// Flags that cannot mean anything together are usage errors: one line, exit 2.
#[test]
fn otlp_flags_that_cannot_apply_are_usage_errors() {
    let trace = sample("basic_lru");
    let dir = scratch();
    let file = dir.path().join("spans.jsonl");
    let with_timeout = |seconds: &'static str| -> Vec<&std::ffi::OsStr> {
        vec![
            "replay".as_ref(),
            trace.as_os_str(),
            "-q".as_ref(),
            "--otlp-file".as_ref(),
            file.as_os_str(),
            "--otlp-timeout".as_ref(),
            seconds.as_ref(),
        ]
    };
    let cases: [Vec<&std::ffi::OsStr>; 3] = [
        with_timeout("0"),
        with_timeout("nan"),
        vec![
            "bench".as_ref(),
            "--suite".as_ref(),
            "--otlp-file".as_ref(),
            file.as_os_str(),
        ],
    ];
    for args in cases {
        let out = kvtrace(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}
