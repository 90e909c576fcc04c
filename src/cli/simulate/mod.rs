//! `kvtrace simulate`: Dynamo's `python -m dynamo.replay` flags, turned into
//! [`plan::Options`], checked into a library plan by [`plan::plan`]; the library simulates and
//! reports.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::error::{Error, EXIT_OK};
use kvtrace::otel::SpanSink;
use kvtrace::simulate::offload::DEFAULT_CHUNK_TOKENS;
use kvtrace::simulate::spans::request_span;
use kvtrace::simulate::tier_link::LinkConfig;
use kvtrace::simulate::weka::NestedTimestamps;
use kvtrace::storage::config::{BackendConfig, L2Io, StorageConfig};

pub(super) mod plan;
mod prediction;

use super::otlp::{self, OtlpArgs};
use super::prometheus::PrometheusArgs;
use super::tiers::{apply_toml, TierArgs};
use super::{print_stdout, say_recorded, warn_line};
use plan::{Options, Router, TraceFormat};

#[derive(Clone, Copy, ValueEnum)]
enum ReplayMode {
    Offline,
    Online,
}

#[derive(Clone, Copy, ValueEnum)]
enum RouterKind {
    #[value(name = "round_robin")]
    RoundRobin,
    #[value(name = "kv_router")]
    KvRouter,
}

#[derive(Clone, Copy, ValueEnum)]
enum TraceFormatArg {
    #[value(name = "mooncake")]
    Mooncake,
    #[value(name = "mooncake-delta")]
    MooncakeDelta,
    #[value(name = "agentic_mooncake")]
    AgenticMooncake,
    #[value(name = "dynamo")]
    Dynamo,
    #[value(name = "weka")]
    Weka,
}

/// How a Weka trace's sub-agent calls are timed.
#[derive(Clone, Copy, ValueEnum)]
enum NestedBasisArg {
    Auto,
    Absolute,
    Relative,
}

#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "kvtrace simulate trace.jsonl --num-workers 4 --router-mode kv_router --extra-engine-args '{\"block_size\":512}'",
    "kvtrace simulate --input-tokens 5000 --output-tokens 500 --request-count 1000 --replay-concurrency 100",
]))]
pub(super) struct Args {
    /// JSONL request trace (or give --input-tokens/--output-tokens/--request-count); the
    /// dynamo format takes several files, its shards
    traces: Vec<PathBuf>,
    /// How the trace is written: mooncake (every row a whole prompt), mooncake-delta (a
    /// session's later rows hold only the new input), agentic_mooncake (requests that wait
    /// for others; version 2 header or legacy rows), dynamo (Dynamo's request-trace records),
    /// weka (Weka/AgentX agent traces: a .json or .jsonl file or a directory of them, their
    /// dependencies inferred as AISimulate infers them)
    #[arg(long, value_enum, default_value = "mooncake")]
    trace_format: TraceFormatArg,
    /// weka: sub-agent calls' timestamps are absolute, relative to their marker, or auto
    /// (relative when any comes before its marker)
    #[arg(long, value_enum, default_value = "auto")]
    nested_timestamp_basis: NestedBasisArg,
    /// offline: virtual time, as fast as possible, reproducible; online: live worker threads
    /// that sleep through every pass on the wall clock (speed it up with the engines'
    /// speedup_ratio and --arrival-speedup-ratio)
    #[arg(long, value_enum, default_value = "offline")]
    replay_mode: ReplayMode,
    #[arg(long, value_enum, default_value = "round_robin")]
    router_mode: RouterKind,
    /// Aggregated workers [default: 1]
    #[arg(long)]
    num_workers: Option<u32>,
    /// Prefill workers (disaggregated serving) [default: 1]
    #[arg(long)]
    num_prefill_workers: Option<u32>,
    /// Decode workers (disaggregated serving) [default: 1]
    #[arg(long)]
    num_decode_workers: Option<u32>,
    /// Closed loop: keep at most N requests (or multi-turn sessions) in flight
    #[arg(long, value_name = "N")]
    replay_concurrency: Option<u32>,
    /// Divide trace timestamps and inter-turn delays by this
    #[arg(long, default_value_t = 1.0)]
    arrival_speedup_ratio: f64,
    /// Tokens per hash id in the trace [default: 512; the dynamo format and agentic_mooncake
    /// version 2 carry their own, which this must then equal]
    #[arg(long)]
    trace_block_size: Option<u32>,
    /// Synthetic workload: prompt tokens per request
    #[arg(long)]
    input_tokens: Option<u32>,
    /// Synthetic workload: output tokens per request
    #[arg(long)]
    output_tokens: Option<u32>,
    /// Synthetic workload: requests (sessions when multi-turn)
    #[arg(long)]
    request_count: Option<u32>,
    /// Synthetic: Poisson arrivals at this many requests per second
    #[arg(long)]
    request_rate: Option<f64>,
    /// Seed of the Poisson arrivals
    #[arg(long, default_value_t = 42)]
    arrival_seed: u64,
    /// Synthetic: constant gap between arrivals (0 = all at once)
    #[arg(long)]
    arrival_interval_ms: Option<f64>,
    /// Synthetic: turns per session
    #[arg(long)]
    turns_per_session: Option<u32>,
    /// Synthetic: fraction of each prompt shared by its prefix group
    #[arg(long)]
    shared_prefix_ratio: Option<f64>,
    /// Synthetic: number of prefix groups
    #[arg(long)]
    num_prefix_groups: Option<u32>,
    /// Synthetic: delay between a turn's completion and the next turn
    #[arg(long)]
    inter_turn_delay_ms: Option<f64>,
    /// Engine arguments (JSON text or a JSON file), Dynamo's MockEngineArgs fields
    #[arg(long, value_name = "JSON")]
    extra_engine_args: Option<String>,
    /// Prefill engine arguments for disaggregated serving
    #[arg(long, value_name = "JSON")]
    prefill_engine_args: Option<String>,
    /// Decode engine arguments for disaggregated serving
    #[arg(long, value_name = "JSON")]
    decode_engine_args: Option<String>,
    /// kv_router configuration (JSON text or a JSON file), Dynamo's KvRouterConfig fields
    #[arg(long, value_name = "JSON")]
    router_config: Option<String>,
    /// Seed of the router's tie-breaking and the synthetic prefix groups
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Report file (default: kvtrace_simulate_report_<local time>.json)
    #[arg(long, value_name = "PATH")]
    report_json: Option<PathBuf>,
    /// One JSON line per request
    #[arg(long, value_name = "PATH")]
    report_jsonl: Option<PathBuf>,
    /// Also write the summary, per-request and tier tables as CSV files into DIR
    /// (simulate_summary.csv, simulate_requests.csv, simulate_tiers.csv)
    #[arg(long, value_name = "DIR")]
    report_csv: Option<PathBuf>,
    /// Also write them as an XLSX workbook (sheets Summary, Requests, Tiers)
    #[arg(long, value_name = "PATH")]
    report_xlsx: Option<PathBuf>,
    /// Goodput: time-to-first-token target
    #[arg(long, value_name = "MS")]
    sla_ttft_ms: Option<f64>,
    /// Goodput: mean inter-token latency target
    #[arg(long, value_name = "MS")]
    sla_itl_ms: Option<f64>,
    /// Goodput: end-to-end latency target
    #[arg(long, value_name = "MS")]
    sla_e2e_ms: Option<f64>,
    /// Add kvtrace's per-request views beside the pooled ones: each request's own mean
    /// inter-token latency and output rate (per_request_itl_ms, per_request_output_token_throughput)
    #[arg(long)]
    per_request_metrics: bool,
    /// No table and no progress display
    #[arg(short, long)]
    quiet: bool,
    /// KV offload: a TOML tier hierarchy (as `kvtrace replay --config`) for one StorageManager
    /// every engine shares; the tier flags below override it. L1 keeps sizes only unless the
    /// file sets `accounting_only = false`
    #[arg(long, value_name = "FILE", help_heading = "KV offload")]
    storage: Option<PathBuf>,
    /// KV offload: tokens per stored chunk
    #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_CHUNK_TOKENS, help_heading = "KV offload")]
    offload_chunk_size: u32,
    /// KV offload: GB/s of a load from L1 into the GPU (added to the pass)
    #[arg(
        long,
        value_name = "GBPS",
        default_value_t = 25.0,
        help_heading = "KV offload"
    )]
    offload_l1_gbps: f64,
    /// KV offload: GB/s of a load that comes from an L2 tier
    #[arg(
        long,
        value_name = "GBPS",
        default_value_t = 5.0,
        help_heading = "KV offload"
    )]
    offload_l2_gbps: f64,
    /// KV offload: time the L2 tier as measured — per-call latency and bandwidth fitted by a
    /// `kvtrace replay` summary JSON or a `kvtrace bench` report (their read_cost and
    /// write_cost) — with its I/O workers as lanes every engine shares; stores then hold lanes
    /// and loads wait behind them
    #[arg(
        long,
        value_name = "REPORT.json",
        help_heading = "KV offload",
        conflicts_with = "offload_l2_gbps"
    )]
    offload_calibration: Option<PathBuf>,
    /// KV offload: calls the calibrated L2 tier serves at once (default: the measured run's
    /// I/O workers, 1 for synchronous I/O)
    #[arg(
        long,
        value_name = "N",
        help_heading = "KV offload",
        requires = "offload_calibration"
    )]
    offload_l2_lanes: Option<u32>,
    /// KV offload: record every StorageManager call as an LMCT trace (a name ending in .zst
    /// is compressed), stamped with simulated time
    #[arg(long, value_name = "PATH", help_heading = "KV offload")]
    record: Option<PathBuf>,
    #[command(flatten)]
    tiers: TierArgs,
    #[command(flatten)]
    otlp: OtlpArgs,
    #[command(flatten)]
    prometheus: PrometheusArgs,
    /// AISimulate's prediction interface: a prediction YAML (traffic, engine, router, planner,
    /// evaluation) instead of the flags above; writes OUTPUT_DIR/prediction.json
    #[arg(
        long,
        value_name = "YAML",
        help_heading = "AISimulate prediction",
        conflicts_with_all = [
            "traces", "trace_format", "nested_timestamp_basis", "replay_mode", "router_mode",
            "num_workers", "num_prefill_workers", "num_decode_workers", "replay_concurrency",
            "arrival_speedup_ratio", "trace_block_size", "input_tokens", "output_tokens",
            "request_count", "request_rate", "arrival_seed", "arrival_interval_ms",
            "turns_per_session", "shared_prefix_ratio", "num_prefix_groups",
            "inter_turn_delay_ms", "extra_engine_args", "prefill_engine_args",
            "decode_engine_args", "router_config", "seed", "report_json", "report_jsonl",
            "report_csv", "report_xlsx", "sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms",
            "per_request_metrics",
            "storage", "record", "offload_calibration", "offload_l2_lanes",
        ]
    )]
    config: Option<PathBuf>,
    /// Set PATH (dotted, e.g. traffic.load.concurrency) to VALUE (YAML) after reading the
    /// configuration; repeatable, the last assignment to a path wins
    #[arg(
        long = "set",
        value_name = "PATH=VALUE",
        help_heading = "AISimulate prediction",
        requires = "config"
    )]
    sets: Vec<String>,
    /// Where prediction.json (and requests.jsonl) go
    #[arg(
        long,
        value_name = "DIR",
        default_value = "aisimulate-output",
        help_heading = "AISimulate prediction",
        requires = "config"
    )]
    output_dir: PathBuf,
    /// Replace prediction.json and requests.jsonl in an existing output directory
    #[arg(long, help_heading = "AISimulate prediction", requires = "config")]
    overwrite: bool,
    /// Write one record per request to OUTPUT_DIR/requests.jsonl
    #[arg(long, help_heading = "AISimulate prediction", requires = "config")]
    capture_per_request: bool,
    /// table: the metrics table; json: the report as one JSON object on stdout
    #[arg(
        long,
        value_enum,
        default_value = "table",
        help_heading = "AISimulate prediction",
        requires = "config"
    )]
    format: OutputFormat,
    /// engine: the engines alone (round robin); dynamo: with the router section
    #[arg(
        long,
        value_enum,
        default_value = "engine",
        help_heading = "AISimulate prediction",
        requires = "config"
    )]
    stack: Stack,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    Table,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum Stack {
    Engine,
    Dynamo,
}

impl Args {
    /// The StorageManager of a KV-offload run: `--storage` overridden by the tier flags.
    fn storage(&self) -> Result<Option<StorageConfig>, Error> {
        if self.storage.is_none() && self.tiers.l1_size_gb.is_none() {
            if self.tiers.given() {
                return Err(Error::usage(
                    "tier flags and --record need KV offload: give --storage FILE or --l1-size-gb",
                ));
            }
            return Ok(None);
        }
        let mut config = StorageConfig {
            l1_buffers: false,
            ..StorageConfig::default()
        };
        if let Some(path) = &self.storage {
            apply_toml(&mut config, path)?;
        }
        self.tiers.apply(&mut config)?;
        // The simulation moves no KV bytes: its memory tiers hold sizes (real buffers only
        // cost the machine memory: with 32 MiB chunks a run of the conversation trace took
        // 112–270 s against 1.6–2.0 s, and up to 1.2 GiB).
        let mut dropped = false;
        for tier in &mut config.l2 {
            if let BackendConfig::Memory { buffers } = &mut tier.backend {
                dropped |= std::mem::replace(buffers, false) && self.tiers.asks_l2_buffers();
            }
        }
        if dropped {
            warn_line("--l2-adapter \"buffers\": true: simulate's memory tiers hold sizes only (it moves no KV bytes)");
        }
        if config.l2_io != L2Io::Synchronous {
            return Err(Error::usage(
                "asynchronous L2 I/O is for replay and bench: simulate's offload models its loads' time from the tiers' bandwidth",
            ));
        }
        Ok(Some(config))
    }

    /// The L2 tier's measured costs, from `--offload-calibration`.
    fn l2_link(&self) -> Result<Option<LinkConfig>, Error> {
        let Some(path) = &self.offload_calibration else {
            return Ok(None);
        };
        if self.storage.is_none() && self.tiers.l1_size_gb.is_none() {
            return Err(Error::usage(
                "--offload-calibration times the KV offload's L2 tier: give --storage FILE or --l1-size-gb",
            ));
        }
        let origin = path.display().to_string();
        let text = kvtrace::limits::read_text(path, kvtrace::limits::MAX_CONFIG_BYTES)
            .map_err(|e| Error::io(origin.clone(), e))?;
        let report: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            Error::bad_input(format!("{origin}: {}", kvtrace::error::json_reason(&e)))
        })?;
        let mut link = LinkConfig::from_report(&report, &origin).map_err(Error::bad_input)?;
        match self.offload_l2_lanes {
            Some(0) => return Err(Error::usage("--offload-l2-lanes must be at least 1")),
            Some(n) => link.lanes = n,
            None => {}
        }
        Ok(Some(link))
    }

    pub(super) fn options(&self) -> Result<Options, Error> {
        if let Some(config) = &self.config {
            let run = prediction::Run {
                stack: match self.stack {
                    Stack::Engine => "engine",
                    Stack::Dynamo => "dynamo",
                }
                .into(),
                output_dir: self.output_dir.clone(),
                capture_per_request: self.capture_per_request,
            };
            return prediction::read(config, &self.sets)?
                .options(&run)
                .map_err(|e| e.in_file(config.display()));
        }
        Ok(Options {
            traces: self.traces.clone(),
            trace_format: match self.trace_format {
                TraceFormatArg::Mooncake => TraceFormat::Mooncake,
                TraceFormatArg::MooncakeDelta => TraceFormat::MooncakeDelta,
                TraceFormatArg::AgenticMooncake => TraceFormat::AgenticMooncake,
                TraceFormatArg::Dynamo => TraceFormat::Dynamo,
                TraceFormatArg::Weka => TraceFormat::Weka,
            },
            nested_timestamps: match self.nested_timestamp_basis {
                NestedBasisArg::Auto => NestedTimestamps::Auto,
                NestedBasisArg::Absolute => NestedTimestamps::Absolute,
                NestedBasisArg::Relative => NestedTimestamps::Relative,
            },
            carry_history: false,
            online: matches!(self.replay_mode, ReplayMode::Online),
            router: match self.router_mode {
                RouterKind::RoundRobin => Router::RoundRobin,
                RouterKind::KvRouter => Router::KvRouter,
            },
            num_workers: self.num_workers,
            num_prefill_workers: self.num_prefill_workers,
            num_decode_workers: self.num_decode_workers,
            replay_concurrency: self.replay_concurrency,
            arrival_speedup_ratio: self.arrival_speedup_ratio,
            trace_block_size: self.trace_block_size,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            request_count: self.request_count,
            request_rate: self.request_rate,
            arrival_seed: self.arrival_seed,
            arrival_interval_ms: self.arrival_interval_ms,
            turns_per_session: self.turns_per_session,
            shared_prefix_ratio: self.shared_prefix_ratio,
            num_prefix_groups: self.num_prefix_groups,
            inter_turn_delay_ms: self.inter_turn_delay_ms,
            extra_engine_args: self.extra_engine_args.clone(),
            prefill_engine_args: self.prefill_engine_args.clone(),
            decode_engine_args: self.decode_engine_args.clone(),
            router_config: self.router_config.clone(),
            seed: self.seed,
            sla_ttft_ms: self.sla_ttft_ms,
            sla_itl_ms: self.sla_itl_ms,
            sla_e2e_ms: self.sla_e2e_ms,
            per_request_metrics: self.per_request_metrics,
            storage: self.storage()?,
            offload_chunk_size: self.offload_chunk_size,
            offload_l1_gbps: self.offload_l1_gbps,
            offload_l2_gbps: self.offload_l2_gbps,
            offload_l2_link: self.l2_link()?,
            record: self.record.clone(),
            report_json: self.report_json.clone(),
            report_jsonl: self.report_jsonl.clone(),
            report_csv: self.report_csv.clone(),
            report_xlsx: self.report_xlsx.clone(),
            write_reports: true,
        })
    }
}

/// A prediction's output directory: made when absent; an existing one must be empty unless
/// `--overwrite` lets its prediction.json and requests.jsonl be replaced (other files stay).
fn prepare_output_dir(dir: &std::path::Path, overwrite: bool) -> Result<(), Error> {
    let shown = dir.display().to_string();
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() && !overwrite {
                return Err(Error::usage(format!(
                    "--output-dir {shown} exists and is not empty: choose another or add --overwrite"
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => kvtrace::output::create_dir(dir),
        Err(e) => Err(Error::io("cannot read the output directory", e).in_file(&shown)),
    }
}

fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
        bar.set_style(style);
    }
    // A message changes no spinner frame: the bar ticks on its own, so it moves between a
    // simulation's progress reports too.
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

pub(super) fn run(args: Args) -> Result<i32, Error> {
    crate::cli::guard(
        args.traces
            .iter()
            .chain(&args.storage)
            .map(PathBuf::as_path),
        [
            &args.report_json,
            &args.report_jsonl,
            &args.report_csv,
            &args.report_xlsx,
            &args.record,
        ]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .chain(args.otlp.file()),
    )?;
    let online = matches!(args.replay_mode, ReplayMode::Online);
    if online && args.tiers.given() {
        return Err(Error::usage(
            "KV offload (--storage, tier flags, --record) runs offline only: its calls follow the simulated clock",
        ));
    }
    let options = args.options()?;
    if args.config.is_some() {
        prepare_output_dir(&args.output_dir, args.overwrite)?;
        crate::cli::guard(
            options.traces.iter().map(PathBuf::as_path),
            [&options.report_json, &options.report_jsonl]
                .into_iter()
                .flatten()
                .map(PathBuf::as_path),
        )?;
    }
    let mut plan = plan::plan(&options)?;
    let trace = args.traces.first().map(|t| t.display().to_string());
    let served = args
        .prometheus
        .start("simulate", trace.as_deref().unwrap_or(""), None)?;
    if let Some(served) = &served {
        plan.observe(served.live.clone());
    }
    for w in args.tiers.warnings() {
        warn_line(w);
    }
    for w in plan.warnings() {
        warn_line(w);
    }
    let mut resource = vec![
        ("kvtrace.command".to_owned(), "simulate".to_owned()),
        ("kvtrace.seed".to_owned(), args.seed.to_string()),
    ];
    if let Some(trace) = args.traces.first() {
        resource.push(("kvtrace.trace".to_owned(), trace.display().to_string()));
    }
    let export = args.otlp.start(resource)?;
    let wall_start = kvtrace::clock::wall_secs();
    let bar = progress_bar(args.quiet);
    let total = plan.request_count();
    let clock = if plan.online() {
        "wall time"
    } else {
        "virtual time"
    };
    let finished = plan.run(&mut |ms, done| {
        bar.set_message(format!(
            "{clock} {:.1} s, {done}/{total} requests done",
            ms / 1e3
        ));
        if let Some(served) = &served {
            served.live.progress(done as f64 / total.max(1) as f64);
        }
    })?;
    bar.finish_and_clear();
    for w in finished.report.unserved(total) {
        warn_line(&w);
    }
    if let Some(export) = &export {
        for r in &finished.report.requests {
            export.request(request_span(r, wall_start));
        }
    }
    let exported = otlp::finish(export, args.quiet);
    if let Some(served) = served {
        served.finish(args.quiet);
    }
    if args.config.is_some() && matches!(args.format, OutputFormat::Json) {
        let path = &finished.report_path;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io("cannot read back", e).in_file(path.display()))?;
        let report: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_input(format!("{}: {e}", path.display())))?;
        print_stdout(&format!("{report}\n"))?;
    } else if !args.quiet {
        say_recorded(&finished.recordings);
        print_stdout(&format!(
            "{}Saved full report to: {}\n",
            finished.report.table(super::columns()),
            finished.report_path.display()
        ))?;
    }
    Ok(kvtrace::interrupt::exit_status()
        .or(exported)
        .unwrap_or(EXIT_OK))
}
