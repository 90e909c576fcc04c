//! `kvtrace simulate`: Dynamo's `python -m dynamo.replay` flags, kvtrace's engines.

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::bus::{EventBus, Tracer};
use kvtrace::clock::local_stamp;
use kvtrace::error::{Error, EXIT_OK};
use kvtrace::output::{check_writable, OutputFile};
use kvtrace::report::csv::CsvTables;
use kvtrace::report::tables::{Table, TableExporter};
use kvtrace::report::xlsx::XlsxWorkbook;
use kvtrace::simulate::args::{EngineArgs, EngineType, WorkerType};
use kvtrace::simulate::collector::Sla;
use kvtrace::simulate::offline::{simulate, PrefillPool, SimConfig};
use kvtrace::simulate::offload::{
    Offload, OffloadConfig, DEFAULT_CHUNK_TOKENS, DEFAULT_KV_BYTES_PER_TOKEN,
};
use kvtrace::simulate::output::{report_json, request_line, table, tables};
use kvtrace::simulate::router::{KvRouterConfig, QueuePolicy, RouterMode};
use kvtrace::simulate::workload::{
    read_mooncake, SyntheticArrivals, SyntheticSpec, Workload, DEFAULT_TRACE_BLOCK_SIZE,
};
use kvtrace::storage::config::StorageConfig;
use kvtrace::storage::StorageManager;

use super::tiers::{apply_toml, TierArgs};
use super::{finish_recording, print_stdout, start_recording, write_file};

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

/// Simulate serving a request trace (Mooncake JSONL) or a synthetic workload on mock engines
/// and report latency and throughput — the flags and report of `python -m dynamo.replay`
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    kvtrace simulate trace.jsonl --num-workers 4 --router-mode kv_router --extra-engine-args '{\"block_size\":512}'\n  \
    kvtrace simulate --input-tokens 5000 --output-tokens 500 --request-count 1000 --replay-concurrency 100")]
pub struct Args {
    /// Mooncake-style JSONL request trace (or give --input-tokens/--output-tokens/--request-count)
    trace: Option<PathBuf>,
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
    /// Tokens per hash id in the trace
    #[arg(long, default_value_t = DEFAULT_TRACE_BLOCK_SIZE)]
    trace_block_size: u32,
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
    /// KV offload: record every StorageManager call as an LMCT trace (a name ending in .zst
    /// is compressed), stamped with simulated time
    #[arg(long, value_name = "PATH", help_heading = "KV offload")]
    record: Option<PathBuf>,
    #[command(flatten)]
    tiers: TierArgs,
}

/// JSON given inline or as a file name.
fn json_text(flag: &str, value: &str) -> Result<String, Error> {
    if value.trim_start().starts_with('{') {
        Ok(value.to_owned())
    } else {
        std::fs::read_to_string(value)
            .map_err(|e| Error::io(format!("{flag}: cannot read"), e).in_file(value))
    }
}

/// Engine arguments and the router queue policy they override, if any.
fn engine_args(
    flag: &str,
    value: Option<&str>,
) -> Result<(EngineArgs, Option<QueuePolicy>), Error> {
    let text = match value {
        Some(v) => json_text(flag, v)?,
        None => "{}".into(),
    };
    let parsed = EngineArgs::from_json(&text).map_err(|e| Error::usage(format!("{flag}: {e}")))?;
    for w in &parsed.warnings {
        eprintln!("kvtrace: warning: {flag}: {w}");
    }
    let queue_policy = parsed
        .router_queue_policy
        .map(|p| QueuePolicy::parse(&p).map_err(|e| Error::usage(format!("{flag}: {e}"))))
        .transpose()?;
    Ok((parsed.args, queue_policy))
}

fn at_least_one(flag: &str, n: Option<u32>) -> Result<u32, Error> {
    match n {
        Some(0) => Err(Error::usage(format!("{flag} must be at least 1"))),
        n => Ok(n.unwrap_or(1)),
    }
}

/// The decode (or aggregated) engines and their count, the prefill pool of a disaggregated
/// run, and the router queue policy the engine arguments override.
fn pools(
    args: &Args,
) -> Result<(EngineArgs, u32, Option<PrefillPool>, Option<QueuePolicy>), Error> {
    let staged = args.prefill_engine_args.is_some() || args.decode_engine_args.is_some();
    let staged_counts = args.num_prefill_workers.is_some() || args.num_decode_workers.is_some();
    if !staged {
        if staged_counts {
            return Err(Error::usage(
                "--num-prefill-workers/--num-decode-workers need --prefill-engine-args and --decode-engine-args",
            ));
        }
        let workers = at_least_one("--num-workers", args.num_workers)?;
        let (engine, queue) =
            engine_args("--extra-engine-args", args.extra_engine_args.as_deref())?;
        if engine.worker_type != WorkerType::Aggregated {
            return Err(Error::usage(
                "--extra-engine-args: worker_type prefill/decode belongs in --prefill-engine-args/--decode-engine-args",
            ));
        }
        return Ok((engine, workers, None, queue));
    }
    let (Some(p), Some(d)) = (&args.prefill_engine_args, &args.decode_engine_args) else {
        return Err(Error::usage(
            "disaggregated serving needs both --prefill-engine-args and --decode-engine-args",
        ));
    };
    if args.extra_engine_args.is_some() || args.num_workers.is_some() {
        return Err(Error::usage(
            "--extra-engine-args/--num-workers describe aggregated workers; a disaggregated run takes --prefill-engine-args/--decode-engine-args and --num-prefill-workers/--num-decode-workers",
        ));
    }
    let (mut prefill, queue) = engine_args("--prefill-engine-args", Some(p))?;
    let (mut decode, _) = engine_args("--decode-engine-args", Some(d))?;
    for (flag, a, want) in [
        ("--prefill-engine-args", &prefill, WorkerType::Prefill),
        ("--decode-engine-args", &decode, WorkerType::Decode),
    ] {
        if a.worker_type != want && a.worker_type != WorkerType::Aggregated {
            let name = if want == WorkerType::Prefill {
                "prefill"
            } else {
                "decode"
            };
            return Err(Error::usage(format!(
                "{flag}: worker_type must be \"{name}\" (or left out)"
            )));
        }
    }
    prefill.worker_type = WorkerType::Prefill;
    decode.worker_type = WorkerType::Decode;
    if prefill.engine_type != decode.engine_type {
        return Err(Error::usage(
            "prefill and decode engine_type differ: the KV handoff needs one engine on both sides",
        ));
    }
    if prefill.engine_type == EngineType::Trtllm {
        return Err(Error::usage(
            "disaggregated serving is modelled for vllm and sglang engines, not trtllm (as in Dynamo)",
        ));
    }
    if prefill.block_size != decode.block_size {
        return Err(Error::usage(format!(
            "prefill and decode block sizes differ ({} and {}): the KV handoff needs one block size",
            prefill.block_size, decode.block_size
        )));
    }
    let pool = PrefillPool {
        engine: prefill,
        workers: at_least_one("--num-prefill-workers", args.num_prefill_workers)?,
    };
    let workers = at_least_one("--num-decode-workers", args.num_decode_workers)?;
    Ok((decode, workers, Some(pool), queue))
}

fn positive(flag: &str, v: f64) -> Result<f64, Error> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Error::usage(format!(
            "{flag} {v}: expected a positive number"
        )))
    }
}

fn workload(args: &Args, block_size: u32) -> Result<Workload, Error> {
    let synthetic = [
        args.input_tokens.is_some(),
        args.output_tokens.is_some(),
        args.request_count.is_some(),
    ];
    let synthetic_only = [
        ("--arrival-interval-ms", args.arrival_interval_ms.is_some()),
        ("--request-rate", args.request_rate.is_some()),
        ("--turns-per-session", args.turns_per_session.is_some()),
        ("--shared-prefix-ratio", args.shared_prefix_ratio.is_some()),
        ("--num-prefix-groups", args.num_prefix_groups.is_some()),
        ("--inter-turn-delay-ms", args.inter_turn_delay_ms.is_some()),
    ];
    positive("--arrival-speedup-ratio", args.arrival_speedup_ratio)?;
    if let Some(path) = &args.trace {
        if synthetic.iter().any(|&s| s) {
            return Err(Error::usage(
                "give either a trace file or --input-tokens/--output-tokens/--request-count, not both",
            ));
        }
        if let Some((flag, _)) = synthetic_only.iter().find(|(_, set)| *set) {
            return Err(Error::usage(format!(
                "{flag} applies to synthetic workloads only, not to a trace file"
            )));
        }
        if args.trace_block_size == 0 {
            return Err(Error::usage("--trace-block-size must be at least 1"));
        }
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
        let mut w = read_mooncake(BufReader::new(file), args.trace_block_size)
            .map_err(|e| e.in_file(&shown))?;
        w.speed_up_arrivals(args.arrival_speedup_ratio);
        return Ok(w);
    }
    let (Some(input), Some(output), Some(count)) =
        (args.input_tokens, args.output_tokens, args.request_count)
    else {
        return Err(Error::usage(
            "give a trace file, or all of --input-tokens, --output-tokens and --request-count",
        ));
    };
    let drivers = [
        args.replay_concurrency.is_some(),
        args.request_rate.is_some(),
        args.arrival_interval_ms.is_some(),
    ];
    if drivers.iter().filter(|&&d| d).count() != 1 {
        return Err(Error::usage(
            "a synthetic workload needs exactly one of --replay-concurrency, --request-rate and --arrival-interval-ms",
        ));
    }
    let arrivals = match (args.request_rate, args.arrival_interval_ms) {
        (Some(rate), _) => SyntheticArrivals::Rate {
            per_s: positive("--request-rate", rate)?,
            seed: args.arrival_seed,
        },
        (_, Some(ms)) if ms.is_finite() && ms >= 0.0 => SyntheticArrivals::Interval { ms },
        (_, Some(ms)) => {
            return Err(Error::usage(format!(
                "--arrival-interval-ms {ms}: expected a number >= 0"
            )))
        }
        _ => SyntheticArrivals::Burst,
    };
    let ratio = args.shared_prefix_ratio.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Error::usage(format!(
            "--shared-prefix-ratio {ratio}: expected a fraction between 0 and 1"
        )));
    }
    let delay = args.inter_turn_delay_ms.unwrap_or(0.0);
    if !(delay.is_finite() && delay >= 0.0) {
        return Err(Error::usage(format!(
            "--inter-turn-delay-ms {delay}: expected a number >= 0"
        )));
    }
    if input == 0 || count == 0 || args.turns_per_session == Some(0) {
        return Err(Error::usage(
            "--input-tokens, --request-count and --turns-per-session must be at least 1",
        ));
    }
    Ok(SyntheticSpec {
        input_tokens: input,
        output_tokens: output,
        count,
        turns: args.turns_per_session.unwrap_or(1),
        shared_prefix_ratio: ratio,
        prefix_groups: args.num_prefix_groups.unwrap_or(0),
        inter_turn_delay_ms: delay,
        block_size,
        arrivals,
        seed: args.seed,
    }
    .build())
}

fn router_mode(args: &Args, queue_override: Option<QueuePolicy>) -> Result<RouterMode, Error> {
    match args.router_mode {
        RouterKind::RoundRobin => {
            if args.router_config.is_some() {
                return Err(Error::usage(
                    "--router-config configures the kv_router; add --router-mode kv_router",
                ));
            }
            Ok(RouterMode::RoundRobin)
        }
        RouterKind::KvRouter => {
            let mut config = match &args.router_config {
                Some(v) => KvRouterConfig::from_json(&json_text("--router-config", v)?)
                    .map_err(|e| Error::usage(format!("--router-config: {e}")))?,
                None => KvRouterConfig::default(),
            };
            if let Some(policy) = queue_override {
                config.router_queue_policy = policy;
            }
            Ok(RouterMode::KvRouter(config))
        }
    }
}

/// The shared StorageManager and, with `--record`, the bus that records its calls.
fn offload(
    args: &Args,
    kv_bytes_per_token: Option<u64>,
) -> Result<Option<(Offload, Option<EventBus>)>, Error> {
    if args.storage.is_none() && args.tiers.l1_size_gb.is_none() {
        if args.tiers.given() || args.record.is_some() {
            return Err(Error::usage(
                "tier flags and --record need KV offload: give --storage FILE or --l1-size-gb",
            ));
        }
        return Ok(None);
    }
    if args.offload_chunk_size == 0 {
        return Err(Error::usage("--offload-chunk-size must be at least 1"));
    }
    positive("--offload-l1-gbps", args.offload_l1_gbps)?;
    positive("--offload-l2-gbps", args.offload_l2_gbps)?;
    let mut config = StorageConfig {
        l1_buffers: false,
        ..StorageConfig::default()
    };
    if let Some(path) = &args.storage {
        apply_toml(&mut config, path)?;
    }
    args.tiers.apply(&mut config)?;
    let bus = args
        .record
        .as_ref()
        .map(|path| start_recording(path, &config, true))
        .transpose()?;
    let tracer = bus.as_ref().map_or_else(Tracer::disabled, EventBus::tracer);
    let sm = StorageManager::new(config, tracer.clone())?;
    let offload_config = OffloadConfig {
        chunk_tokens: args.offload_chunk_size,
        kv_bytes_per_token: kv_bytes_per_token.unwrap_or(DEFAULT_KV_BYTES_PER_TOKEN),
        l1_load_gbps: args.offload_l1_gbps,
        l2_load_gbps: args.offload_l2_gbps,
        model_name: "kvtrace/simulate".into(),
    };
    Ok(Some((Offload::new(sm, tracer, offload_config), bus)))
}

/// `--report-csv` and `--report-xlsx`.
fn export_tables(args: &Args, tables: &[Table]) -> Result<(), Error> {
    if let Some(dir) = &args.report_csv {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io("cannot create", e).in_file(dir.display()))?;
        for (name, bytes) in CsvTables.table_files("simulate", tables)? {
            write_file(&dir.join(name), &bytes)?;
        }
    }
    if let Some(path) = &args.report_xlsx {
        for (_, bytes) in XlsxWorkbook.table_files("simulate", tables)? {
            write_file(path, &bytes)?;
        }
    }
    Ok(())
}

fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
        bar.set_style(style);
    }
    bar
}

pub fn run(args: Args) -> Result<i32, Error> {
    let online = matches!(args.replay_mode, ReplayMode::Online);
    if online && (args.storage.is_some() || args.tiers.given() || args.record.is_some()) {
        return Err(Error::usage(
            "KV offload (--storage, tier flags, --record) runs offline only: its calls follow the simulated clock",
        ));
    }
    if args.replay_concurrency == Some(0) {
        return Err(Error::usage("--replay-concurrency must be at least 1"));
    }
    let (engine, workers, prefill, queue_override) = pools(&args)?;
    let router = router_mode(&args, queue_override)?;
    let workload = workload(&args, engine.block_size)?;
    let sla = Sla {
        ttft_ms: args
            .sla_ttft_ms
            .map(|v| positive("--sla-ttft-ms", v))
            .transpose()?,
        itl_ms: args
            .sla_itl_ms
            .map(|v| positive("--sla-itl-ms", v))
            .transpose()?,
        e2e_ms: args
            .sla_e2e_ms
            .map(|v| positive("--sla-e2e-ms", v))
            .transpose()?,
    };
    let report_path = args.report_json.clone().unwrap_or_else(|| {
        PathBuf::from(format!("kvtrace_simulate_report_{}.json", local_stamp()))
    });
    for path in [
        Some(&report_path),
        args.report_jsonl.as_ref(),
        args.report_xlsx.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        check_writable(path)?;
    }
    let mut offload = offload(&args, engine.kv_bytes_per_token)?;
    if offload.is_some() && engine.engine_type == EngineType::Sglang {
        return Err(Error::usage(
            "KV offload models LMCache's vLLM connector: use it with the vllm engine, not sglang",
        ));
    }
    let config = SimConfig {
        engine,
        workers,
        prefill,
        router,
        concurrency: args.replay_concurrency,
        seed: args.seed,
        online,
    };
    let bar = progress_bar(args.quiet);
    let total = workload.request_count();
    let connector = offload.as_mut().map(|(o, _)| o);
    let clock = if online { "wall time" } else { "virtual time" };
    let result = simulate(&workload, &config, connector, &mut |ms, done| {
        bar.set_message(format!(
            "{clock} {:.1} s, {done}/{total} requests done",
            ms / 1e3
        ));
    })?;
    bar.finish_and_clear();
    let mut summary = result
        .collector
        .summary(result.provision, result.wall_ms, sla);
    if args.per_request_metrics {
        summary.extend(result.collector.per_request_extras());
    }
    if result.interrupted {
        summary.insert("interrupted".into(), true.into());
    }
    if let Some((store, bus)) = offload {
        summary.extend(store.summary());
        drop(store);
        if let Some(bus) = bus {
            finish_recording(bus, args.quiet)?;
        }
    }
    summary.sort_keys();
    let mut text = report_json(&summary);
    text.push('\n');
    write_file(&report_path, text.as_bytes())?;
    if let Some(path) = &args.report_jsonl {
        let shown = path.display().to_string();
        let mut out = BufWriter::new(OutputFile::create(path)?);
        for r in &result.collector.records {
            writeln!(out, "{}", request_line(r))
                .map_err(|e| Error::io("cannot write", e).in_file(&shown))?;
        }
        out.into_inner()
            .map_err(|e| e.into_error())
            .and_then(OutputFile::commit)
            .map_err(|e| Error::io("cannot write", e).in_file(&shown))?;
    }
    if args.report_csv.is_some() || args.report_xlsx.is_some() {
        export_tables(&args, &tables(&summary, &result.collector.records))?;
    }
    if !args.quiet {
        print_stdout(&format!(
            "{}Saved full report to: {}\n",
            table(&summary),
            report_path.display()
        ))?;
    }
    Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
}
