//! What a running replay or bench has done so far, for Prometheus. [`Live`] holds the figures
//! (counters, gauges and histograms from `prometheus-client`); the engines feed it through the
//! hooks they already have: each finished request arrives as its span tree ([`SpanSink`]) or,
//! from the serving simulation, as its record ([`RequestObserver`]); each replayed call and
//! the tiers' counters come from the command's per-record callback.
//! [`Endpoint`] serves the figures at `/metrics` on a port of the user's choosing, in the
//! OpenMetrics text format a Prometheus server scrapes.
//!
//! Names follow Prometheus' conventions (`kvtrace_` prefix, base units, `_total` counters, one
//! label per dimension); the request figures mirror LMCache's own (`lmcache:num_requested_tokens`,
//! `lmcache:num_hit_tokens`, `lmcache:retrieve_hit_rate`) as `kvtrace_requested_tokens_total`,
//! `kvtrace_hit_tokens_total` and `kvtrace_hit_rate`. The whole list is in
//! docs/guides/prometheus.md, and the Grafana dashboard in tools/grafana uses only these.

#![warn(unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvtrace_cache::storage::{CallStats, TierStats};
use kvtrace_io::error::{Error, Result};
use kvtrace_otel::{Attr, RequestSpan, SpanSink};
use kvtrace_simulate::collector::RequestRecord;
use kvtrace_simulate::event_loop::RequestObserver;
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpanLabel {
    span: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    command: String,
    trace: String,
    rank: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Latency buckets from 10 µs to about 84 s (×2.2 each): a StorageManager call's bookkeeping
/// and a request over a slow tier both land inside.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.2, 21))
}

/// The live figures of one run.
pub struct Live {
    registry: Registry,
    requests: Counter,
    requested_tokens: Counter,
    hit_tokens: Counter,
    hit_rate: FloatGauge,
    requests_by_tier: Family<TierLabel, Counter>,
    fidelity_compared: Counter,
    fidelity_divergent: Counter,
    request_seconds: Histogram,
    requests_by_status: Family<StatusLabel, Counter>,
    ttft_seconds: Histogram,
    tpot_seconds: Histogram,
    output_tokens: Counter,
    span_seconds: Family<SpanLabel, Histogram>,
    calls: Family<CallLabel, Counter>,
    call_errors: Family<CallLabel, Counter>,
    call_seconds: Family<CallLabel, Histogram>,
    records: Counter,
    progress: FloatGauge,
    finished: Gauge,
    out_of_memory: Counter,
    tier_resident: Family<TierLabel, Gauge>,
    tier_capacity: Family<TierLabel, Gauge>,
    tier_evictions: Family<TierLabel, Counter>,
    tier_written: Family<TierLabel, Counter>,
    tier_read: Family<TierLabel, Counter>,
    tier_errors: Family<TierLabel, Counter>,
    /// Hit and requested tokens so far, for the hit rate.
    tokens: Mutex<(u64, u64)>,
}

/// A gauge set to a figure kept elsewhere (the bytes a tier holds).
fn set_gauge(gauge: &Gauge, value: u64) {
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
}

/// A counter brought up to a total kept elsewhere (a tier's own counters, which only grow
/// during a run): it moves by the difference, so it stays a true counter for `rate()`.
fn catch_up(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

impl Live {
    /// The figures of a `command` run (`replay`, `bench`) over `trace` (empty for none), as
    /// `rank` of a run of many (empty for a single process).
    pub fn new(command: &str, trace: &str, rank: &str) -> Arc<Live> {
        let mut registry = Registry::with_prefix("kvtrace");
        let info = Family::<RunLabels, Gauge>::default();
        info.get_or_create(&RunLabels {
            command: command.to_owned(),
            trace: trace.to_owned(),
            rank: rank.to_owned(),
        })
        .set(1);
        registry.register("run", "The run these figures come from (always 1)", info);
        let live = Live {
            requests: Counter::default(),
            requested_tokens: Counter::default(),
            hit_tokens: Counter::default(),
            hit_rate: FloatGauge::default(),
            requests_by_tier: Family::default(),
            fidelity_compared: Counter::default(),
            fidelity_divergent: Counter::default(),
            request_seconds: latency_histogram(),
            requests_by_status: Family::default(),
            ttft_seconds: latency_histogram(),
            tpot_seconds: latency_histogram(),
            output_tokens: Counter::default(),
            span_seconds: Family::new_with_constructor(latency_histogram),
            calls: Family::default(),
            call_errors: Family::default(),
            call_seconds: Family::new_with_constructor(latency_histogram),
            records: Counter::default(),
            progress: FloatGauge::default(),
            finished: Gauge::default(),
            out_of_memory: Counter::default(),
            tier_resident: Family::default(),
            tier_capacity: Family::default(),
            tier_evictions: Family::default(),
            tier_written: Family::default(),
            tier_read: Family::default(),
            tier_errors: Family::default(),
            tokens: Mutex::new((0, 0)),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("requests", "Requests finished", live.requests.clone());
        r.register(
            "requested_tokens",
            "Tokens the finished requests looked up (LMCache: num_requested_tokens)",
            live.requested_tokens.clone(),
        );
        r.register(
            "hit_tokens",
            "Tokens found in a tier (LMCache: num_hit_tokens)",
            live.hit_tokens.clone(),
        );
        r.register(
            "hit_rate",
            "Hit tokens over requested tokens so far (LMCache: retrieve_hit_rate)",
            live.hit_rate.clone(),
        );
        r.register(
            "requests_by_hit_tier",
            "Finished requests by the deepest tier that served a hit (none: a miss)",
            live.requests_by_tier.clone(),
        );
        r.register(
            "fidelity_compared_requests",
            "Replayed requests whose recorded hits are known",
            live.fidelity_compared.clone(),
        );
        r.register(
            "fidelity_divergent_requests",
            "Replayed requests whose hit chunks differ from the recorded server's",
            live.fidelity_divergent.clone(),
        );
        r.register_with_unit(
            "request_duration",
            "A request from its lookup to its last transfer",
            Unit::Seconds,
            live.request_seconds.clone(),
        );
        r.register(
            "requests_by_status",
            "Simulated requests that ended, by how (completed, rejected)",
            live.requests_by_status.clone(),
        );
        r.register_with_unit(
            "time_to_first_token",
            "Simulated time to first token",
            Unit::Seconds,
            live.ttft_seconds.clone(),
        );
        r.register_with_unit(
            "time_per_output_token",
            "Simulated time per output token after the first",
            Unit::Seconds,
            live.tpot_seconds.clone(),
        );
        r.register(
            "output_tokens",
            "Tokens the simulated requests generated",
            live.output_tokens.clone(),
        );
        r.register_with_unit(
            "span_duration",
            "The parts of a request: mp.lookup_prefetch, mp.retrieve, mp.store",
            Unit::Seconds,
            live.span_seconds.clone(),
        );
        r.register("calls", "StorageManager calls replayed", live.calls.clone());
        r.register(
            "call_errors",
            "StorageManager calls a tier refused",
            live.call_errors.clone(),
        );
        r.register_with_unit(
            "call_duration",
            "Bookkeeping time of one StorageManager call",
            Unit::Seconds,
            live.call_seconds.clone(),
        );
        r.register("records", "Trace records replayed", live.records.clone());
        r.register(
            "progress_ratio",
            "How far the run is, 0 to 1 (bytes of the trace read, or time of the bench run)",
            live.progress.clone(),
        );
        r.register(
            "finished",
            "1 once the run has ended and written its reports: the figures are final",
            live.finished.clone(),
        );
        r.register(
            "out_of_memory_calls",
            "reserve_write calls that found no room (OUT_OF_MEMORY), so far",
            live.out_of_memory.clone(),
        );
        r.register_with_unit(
            "tier_resident",
            "Bytes a tier holds now",
            Unit::Bytes,
            live.tier_resident.clone(),
        );
        r.register_with_unit(
            "tier_capacity",
            "A tier's capacity",
            Unit::Bytes,
            live.tier_capacity.clone(),
        );
        r.register(
            "tier_evictions",
            "Objects a tier evicted so far",
            live.tier_evictions.clone(),
        );
        r.register_with_unit(
            "tier_written",
            "Bytes stored into a tier so far",
            Unit::Bytes,
            live.tier_written.clone(),
        );
        r.register_with_unit(
            "tier_read",
            "Bytes loaded from a tier so far",
            Unit::Bytes,
            live.tier_read.clone(),
        );
        r.register(
            "tier_errors",
            "Stores, loads and deletes a tier's backend refused so far",
            live.tier_errors.clone(),
        );
        Arc::new(Live { registry, ..live })
    }

    /// One replayed StorageManager call: its short name, bookkeeping time, whether a tier
    /// refused it.
    pub fn call(&self, call: &str, seconds: f64, failed: bool) {
        let label = CallLabel {
            call: call.to_owned(),
        };
        self.calls.get_or_create(&label).inc();
        if failed {
            self.call_errors.get_or_create(&label).inc();
        }
        self.call_seconds.get_or_create(&label).observe(seconds);
        self.records.inc();
    }

    /// How far the run is, 0 to 1.
    pub fn progress(&self, ratio: f64) {
        self.progress.set(ratio.clamp(0.0, 1.0));
    }

    /// The run has ended and its reports are written: every figure is final.
    pub fn finish(&self) {
        self.progress.set(1.0);
        self.finished.set(1);
    }

    /// The tiers' and the manager's counters as they stand.
    pub fn storage(&self, tiers: &[TierStats], calls: &CallStats) {
        catch_up(&self.out_of_memory, calls.out_of_memory_calls);
        for t in tiers {
            let label = TierLabel {
                tier: t.name.clone(),
            };
            set_gauge(&self.tier_resident.get_or_create(&label), t.resident_bytes);
            if let Some(capacity) = t.capacity_bytes {
                set_gauge(&self.tier_capacity.get_or_create(&label), capacity);
            }
            catch_up(&self.tier_evictions.get_or_create(&label), t.evictions);
            catch_up(&self.tier_written.get_or_create(&label), t.bytes_written);
            catch_up(&self.tier_read.get_or_create(&label), t.bytes_read);
            let errors = t.write_errors + t.read_errors + t.delete_errors;
            catch_up(&self.tier_errors.get_or_create(&label), errors);
        }
    }

    /// The figures in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

fn int(span: &RequestSpan, key: &str) -> Option<i64> {
    span.root.attributes.iter().find_map(|(k, v)| match v {
        Attr::Int(n) if *k == key => Some(*n),
        _ => None,
    })
}

fn text<'a>(span: &'a RequestSpan, key: &str) -> Option<&'a str> {
    span.root.attributes.iter().find_map(|(k, v)| match v {
        Attr::Str(s) if *k == key => Some(s.as_str()),
        _ => None,
    })
}

impl SpanSink for Live {
    fn request(&self, span: RequestSpan) {
        let requested = int(&span, "requested_tokens").unwrap_or(0).max(0) as u64;
        let hit = int(&span, "hit_tokens").unwrap_or(0).max(0) as u64;
        self.requests.inc();
        self.tokens(hit, requested);
        let tier = text(&span, "kvtrace.hit_tier").unwrap_or("none");
        self.requests_by_tier
            .get_or_create(&TierLabel {
                tier: tier.to_owned(),
            })
            .inc();
        if let (Some(hits), Some(recorded)) = (
            int(&span, "kvtrace.hit_chunks"),
            int(&span, "kvtrace.recorded_hit_chunks"),
        ) {
            self.fidelity_compared.inc();
            if hits != recorded {
                self.fidelity_divergent.inc();
            }
        }
        self.request_seconds
            .observe(span.root.end_s - span.root.start_s);
        for child in &span.children {
            self.span_seconds
                .get_or_create(&SpanLabel {
                    span: child.name.to_owned(),
                })
                .observe(child.end_s - child.start_s);
        }
    }
}

impl Live {
    /// Hit and requested tokens of one request, into the totals and the hit rate.
    fn tokens(&self, hit: u64, requested: u64) {
        self.requested_tokens.inc_by(requested);
        self.hit_tokens.inc_by(hit);
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.0 += hit;
            tokens.1 += requested;
            if tokens.1 > 0 {
                self.hit_rate.set(tokens.0 as f64 / tokens.1 as f64);
            }
        }
    }
}

/// The serving simulation's requests: a prompt's reused prefix is its hit tokens (the prefix
/// cache's hit rate), times are the simulation's clock (virtual offline, wall online).
impl RequestObserver for Live {
    fn ended(&self, r: &RequestRecord) {
        self.requests.inc();
        let status = r.terminal_status.name();
        self.requests_by_status
            .get_or_create(&StatusLabel {
                status: status.to_owned(),
            })
            .inc();
        self.tokens(u64::from(r.reused_input_tokens), u64::from(r.input_length));
        self.output_tokens.inc_by(u64::from(r.output_length));
        if let Some(ttft) = r.ttft() {
            self.ttft_seconds.observe(ttft / 1e3);
        }
        if let Some(tpot) = r.tpot() {
            self.tpot_seconds.observe(tpot / 1e3);
        }
        if let Some(e2e) = r.e2e() {
            self.request_seconds.observe(e2e / 1e3);
        }
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// The HTTP endpoint serving a [`Live`]'s figures at `/metrics` (anything else is 404), on
/// its own thread until dropped.
pub struct Endpoint {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
    scrapes: Arc<AtomicU64>,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Endpoint {
    /// Listens on `addr` (port 0: any free port) and serves `live`.
    pub fn start(addr: SocketAddr, live: Arc<Live>) -> Result<Endpoint> {
        let server = tiny_http::Server::http(addr).map_err(|e| {
            Error::io(
                format!("cannot listen on {addr}"),
                std::io::Error::other(e.to_string()),
            )
        })?;
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let scrapes = Arc::new(AtomicU64::new(0));
        let content_type = tiny_http::Header::from_bytes("Content-Type", OPENMETRICS)
            .map_err(|()| Error::bad_input("the OpenMetrics content type"))?;
        let serving = (server.clone(), scrapes.clone());
        let thread = std::thread::Builder::new()
            .name("prometheus".into())
            .spawn(move || {
                let (server, scrapes) = serving;
                for request in server.incoming_requests() {
                    let path = request.url().split('?').next().unwrap_or("");
                    let response = if path == "/metrics" {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                        tiny_http::Response::from_string(live.encode())
                            .with_header(content_type.clone())
                    } else {
                        tiny_http::Response::from_string("kvtrace serves /metrics\n")
                            .with_status_code(404)
                    };
                    // A scraper that hung up is its own business.
                    let _ = request.respond(response);
                }
            })
            .map_err(|e| Error::io("cannot start the metrics endpoint", e))?;
        Ok(Endpoint {
            server,
            thread: Some(thread),
            addr,
            scrapes,
        })
    }

    /// Where it listens (the port chosen when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Scrapes of `/metrics` answered so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::io::{Read, Write};

    use kvtrace_otel::Span;

    use super::*;

    fn request(requested: i64, hit: i64, recorded: i64, tier: &str) -> RequestSpan {
        let root = Span::new("request", 10.0, 10.5)
            .with("requested_tokens", Attr::Int(requested))
            .with("hit_tokens", Attr::Int(hit))
            .with("kvtrace.hit_chunks", Attr::Int(hit / 16))
            .with("kvtrace.recorded_hit_chunks", Attr::Int(recorded))
            .with("kvtrace.hit_tier", Attr::Str(tier.into()));
        let mut span = RequestSpan {
            root,
            children: Vec::new(),
        };
        span.push(Span::new("mp.retrieve", 10.1, 10.2));
        span
    }

    fn fed() -> Arc<Live> {
        let live = Live::new("replay", "t.lct", "");
        live.request(request(64, 32, 2, "l1"));
        live.request(request(64, 0, 1, "none"));
        live.call("finish_write", 2e-6, false);
        live.call("reserve_write", 3e-6, true);
        live.progress(0.5);
        let tier = TierStats {
            name: "L1".into(),
            capacity_bytes: Some(1 << 20),
            resident_bytes: 4096,
            evictions: 3,
            bytes_written: 8192,
            ..TierStats::default()
        };
        let calls = CallStats {
            out_of_memory_calls: 2,
            ..CallStats::default()
        };
        live.storage(std::slice::from_ref(&tier), &calls);
        live.storage(
            &[TierStats {
                evictions: 5,
                ..tier
            }],
            &calls,
        );
        live
    }

    /// `name{labels} value` lines as a map from the series to its value.
    fn series(text: &str) -> BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    #[test]
    fn request_spans_and_counters_become_the_figures() {
        let s = series(&fed().encode());
        assert_eq!(s["kvtrace_requests_total"], 2.0);
        assert_eq!(s["kvtrace_requested_tokens_total"], 128.0);
        assert_eq!(s["kvtrace_hit_tokens_total"], 32.0);
        assert_eq!(s["kvtrace_hit_rate"], 0.25);
        assert_eq!(s["kvtrace_requests_by_hit_tier_total{tier=\"l1\"}"], 1.0);
        // 32 hit tokens are 2 chunks of 16 (recorded 2); 0 hit chunks against 1 recorded.
        assert_eq!(s["kvtrace_fidelity_compared_requests_total"], 2.0);
        assert_eq!(s["kvtrace_fidelity_divergent_requests_total"], 1.0);
        assert_eq!(s["kvtrace_request_duration_seconds_count"], 2.0);
        assert_eq!(s["kvtrace_calls_total{call=\"reserve_write\"}"], 1.0);
        assert_eq!(s["kvtrace_call_errors_total{call=\"reserve_write\"}"], 1.0);
        assert_eq!(s["kvtrace_records_total"], 2.0);
        assert_eq!(s["kvtrace_progress_ratio"], 0.5);
        assert_eq!(s["kvtrace_out_of_memory_calls_total"], 2.0);
        assert_eq!(
            s["kvtrace_tier_evictions_total{tier=\"L1\"}"], 5.0,
            "caught up, not added"
        );
        assert_eq!(s["kvtrace_tier_resident_bytes{tier=\"L1\"}"], 4096.0);
        assert_eq!(s["kvtrace_tier_capacity_bytes{tier=\"L1\"}"], 1048576.0);
        assert_eq!(s["kvtrace_finished"], 0.0);
        let live = fed();
        live.finish();
        let s = series(&live.encode());
        assert_eq!(
            (s["kvtrace_finished"], s["kvtrace_progress_ratio"]),
            (1.0, 1.0)
        );
    }

    /// Every metric the Grafana dashboard queries is one kvtrace serves.
    #[test]
    fn the_dashboard_uses_only_served_metrics() {
        let served: BTreeSet<String> = series(&fed().encode())
            .keys()
            .map(|k| k.split('{').next().unwrap_or_default().to_owned())
            .collect();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tools/grafana/kvtrace-dashboard.json"
        );
        let dashboard = std::fs::read_to_string(path).expect("dashboard");
        let mut used = BTreeSet::new();
        for (at, _) in dashboard.match_indices("kvtrace_") {
            let name: String = dashboard[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            used.insert(name);
        }
        assert!(used.len() > 10, "{used:?}");
        let unknown: Vec<&String> = used.difference(&served).collect();
        assert!(unknown.is_empty(), "not served: {unknown:?}");
    }

    #[test]
    fn the_endpoint_serves_metrics_and_nothing_else() {
        let endpoint =
            Endpoint::start("127.0.0.1:0".parse().expect("addr"), fed()).expect("listen");
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(endpoint.addr()).expect("connect");
            write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("send");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("read");
            out
        };
        let metrics = get("/metrics");
        assert!(
            metrics.starts_with("HTTP/1.1 200") || metrics.starts_with("HTTP/1.0 200"),
            "{metrics}"
        );
        assert!(metrics.contains("application/openmetrics-text"));
        assert!(metrics.contains("kvtrace_requests_total 2"));
        assert!(metrics.trim_end().ends_with("# EOF"));
        assert!(get("/other").contains(" 404 "));
        assert_eq!(endpoint.scrapes(), 1);
        let taken = Endpoint::start(endpoint.addr(), fed());
        let err = taken.err().expect("the port is taken").to_string();
        assert!(err.contains("cannot listen on 127.0.0.1:"), "{err}");
    }
}
