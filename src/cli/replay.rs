//! `kvtrace replay`.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::bus::Tracer;
use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::lmct::reader::ZSTD_MAGIC;
use kvtrace::lmct::TraceReader;
use kvtrace::replay::dispatch::Outcome;
use kvtrace::replay::{replay, Pacing, ReplayOptions};
use kvtrace::report::csv::CsvTables;
use kvtrace::report::json::JsonSummary;
use kvtrace::report::xlsx::XlsxWorkbook;
use kvtrace::report::{table, Exporter};
use kvtrace::storage::config::{
    self, gib_to_bytes, EvictionTiming, L2Config, Placement, PrefetchPolicy, StorageConfig,
    StorePolicy,
};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::StorageManager;

use super::{print_stdout, warn, ReadArgs};

#[derive(Clone, Copy, ValueEnum)]
enum Pace {
    /// Sleep to each record's recorded time (LMCache's only mode)
    Realtime,
    /// As fast as possible: deterministic counters and hits
    Afap,
}

#[derive(Clone, Copy, ValueEnum)]
enum StorePolicyArg {
    Default,
    SkipL1,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrefetchPolicyArg {
    Default,
    Retain,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlacementArg {
    /// Every admitted object is stored to every L2 tier (LMCache)
    WriteThrough,
    /// Objects enter L1; evicted ones move down tier by tier (MLPerf Storage KV-cache)
    Waterfall,
}

#[derive(Clone, Copy, ValueEnum)]
enum Timing {
    /// Check the watermark once per interval of trace time (LMCache's controller)
    Periodic,
    /// Evict as soon as an allocation needs room
    Immediate,
}

/// Re-issue every recorded StorageManager call against a fresh StorageManager and report what
/// the cache did: hits per request and tier, OUT_OF_MEMORY, evictions, bytes, call latencies
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  kvtrace replay trace.lct                        # the recorded configuration, as fast as possible\n  \
kvtrace replay trace.lct --l1-size-gb 0.05 --eviction-policy ARC --json\n  \
kvtrace replay trace.lct --pace realtime --speedup 10 --jsonl-out records.jsonl\n\n\
Without storage flags kvtrace rebuilds the configuration recorded in the trace's header; any flag \
given overrides it. LMCache's flag names and meanings are kept. Exit status 1 if any call failed."
)]
pub struct Args {
    /// Storage trace (.lct or .lct.zst)
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Pacing; afap unless --speedup is given
    #[arg(long, value_enum)]
    pace: Option<Pace>,
    /// Replay N times faster than recorded (implies --pace realtime)
    #[arg(long, value_name = "N")]
    speedup: Option<f64>,
    /// Also wait through the time before the first record
    #[arg(long)]
    keep_startup_gap: bool,
    /// A TOML file describing the hierarchy (see README); flags given as well override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// L1 memory pool size in GB (GiB, as LMCache reads it)
    #[arg(long, value_name = "GB")]
    l1_size_gb: Option<f64>,
    /// LRU, ARC, FIFO, LFU or noop
    #[arg(long, value_name = "POLICY")]
    eviction_policy: Option<PolicyKind>,
    #[arg(long, value_name = "FRACTION")]
    eviction_trigger_watermark: Option<f64>,
    #[arg(long, value_name = "FRACTION")]
    eviction_ratio: Option<f64>,
    /// When eviction runs (kvtrace)
    #[arg(long, value_enum)]
    eviction_timing: Option<Timing>,
    /// Seconds of trace time between periodic eviction checks (default 1)
    #[arg(long, value_name = "SECONDS")]
    eviction_interval: Option<f64>,
    #[arg(long, value_name = "SECONDS")]
    l1_write_ttl_seconds: Option<f64>,
    #[arg(long, value_name = "SECONDS")]
    l1_read_ttl_seconds: Option<f64>,
    /// Keep only object sizes in L1, no buffers (traces bigger than RAM)
    #[arg(long)]
    l1_accounting_only: bool,
    /// An L2 tier as JSON, repeatable: {"type":"memory"|"fs"|"redis"|"null", "capacity_gb": G,
    /// "eviction_policy": P}; fs takes "path", "direct" (O_DIRECT) and "fsync"
    /// (never|every_write); redis takes "url" and "prefix"
    #[arg(long, value_name = "JSON")]
    l2_adapter: Vec<String>,
    /// How objects reach the L2 tiers (kvtrace)
    #[arg(long, value_enum)]
    placement: Option<PlacementArg>,
    #[arg(long, value_enum)]
    l2_store_policy: Option<StorePolicyArg>,
    #[arg(long, value_enum)]
    l2_prefetch_policy: Option<PrefetchPolicyArg>,
    #[arg(long, value_name = "N")]
    l2_prefetch_max_in_flight: Option<u64>,
    /// Where the CSV and JSON reports go
    #[arg(long, value_name = "DIR", default_value = ".")]
    output_dir: PathBuf,
    /// Also write trace_replay_summary.json
    #[arg(long)]
    json: bool,
    /// Do not write the CSV reports
    #[arg(long)]
    no_csv: bool,
    /// Also write trace_replay.xlsx (sheets Summary, Ops, Requests, Tiers, Config)
    #[arg(long)]
    xlsx: bool,
    /// Write one JSON line per record
    #[arg(long, value_name = "PATH")]
    jsonl_out: Option<PathBuf>,
    /// One line per record on stdout
    #[arg(long)]
    verbose: bool,
    /// No terminal table and no progress bar
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    read: ReadArgs,
}

/// `MemAvailable` from /proc/meminfo, in bytes (Linux only).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Finite and above zero (NaN is not).
fn positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

fn fraction(name: &str, v: f64) -> Result<f64, Error> {
    config::fraction(name, v).map_err(Error::usage)
}

fn gib(name: &str, gb: f64) -> Result<u64, Error> {
    gib_to_bytes(gb).map_err(|e| Error::usage(format!("{name} {e}")))
}

fn l2_tier(text: &str) -> Result<L2Config, Error> {
    let bad = |why: String| Error::usage(format!("--l2-adapter {text}: {why}"));
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    L2Config::from_adapter(&v).map_err(bad)
}

/// The recorded configuration, overridden by every flag given.
fn storage_config(args: &Args, recorded: &str, shown: &str) -> Result<StorageConfig, Error> {
    let from_trace = StorageConfig::from_lmcache_json(recorded);
    let explicit = args.l1_size_gb.is_some() || args.config.is_some();
    let mut config = match (&from_trace, explicit) {
        (Some((c, notes)), _) => {
            for n in notes {
                warn(shown, n);
            }
            c.clone()
        }
        (None, true) => StorageConfig::default(),
        (None, false) => {
            return Err(Error::usage(
                "the trace records no storage configuration kvtrace can read; give one with --l1-size-gb or --config",
            ))
        }
    };
    if let Some(path) = &args.config {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io("cannot read", e).in_file(&file))?;
        config
            .apply_toml(&text)
            .map_err(|e| Error::usage(e).in_file(&file))?;
    }
    if let Some(gb) = args.l1_size_gb {
        config.l1_size_bytes = gib("--l1-size-gb", gb)?;
    }
    if let Some(p) = args.eviction_policy {
        config.eviction.policy = p;
    }
    if let Some(w) = args.eviction_trigger_watermark {
        config.eviction.trigger_watermark = fraction("--eviction-trigger-watermark", w)?;
    }
    if let Some(r) = args.eviction_ratio {
        config.eviction.eviction_ratio = fraction("--eviction-ratio", r)?;
    }
    if args.eviction_interval.is_some_and(|i| !positive(i)) {
        return Err(Error::usage("--eviction-interval must be positive"));
    }
    let interval_s = match config.eviction.timing {
        EvictionTiming::Periodic { interval_s } => args.eviction_interval.unwrap_or(interval_s),
        EvictionTiming::Immediate => args.eviction_interval.unwrap_or(1.0),
    };
    match (args.eviction_timing, args.eviction_interval) {
        (Some(Timing::Immediate), _) => config.eviction.timing = EvictionTiming::Immediate,
        (Some(Timing::Periodic), _) | (None, Some(_)) => {
            config.eviction.timing = EvictionTiming::Periodic { interval_s }
        }
        (None, None) => {}
    }
    if let Some(t) = args.l1_write_ttl_seconds {
        config.write_ttl_s = t;
    }
    if let Some(t) = args.l1_read_ttl_seconds {
        config.read_ttl_s = t;
    }
    if args.l1_accounting_only {
        config.l1_buffers = false;
    }
    if let Some(available) = available_memory() {
        let host_buffers = config.l1_buffers && config.l1_gpu_bandwidth_gbps.is_none();
        if host_buffers && config.l1_size_bytes > available {
            return Err(Error::usage(format!(
                "an L1 of {:.1} GiB with real buffers exceeds the {:.1} GiB of memory available; \
                 use --l1-accounting-only or a smaller --l1-size-gb",
                config.l1_size_bytes as f64 / (1u64 << 30) as f64,
                available as f64 / (1u64 << 30) as f64
            )));
        }
    }
    if !args.l2_adapter.is_empty() {
        config.l2 = args
            .l2_adapter
            .iter()
            .map(|a| l2_tier(a))
            .collect::<Result<_, _>>()?;
    }
    if let Some(p) = args.placement {
        config.placement = match p {
            PlacementArg::WriteThrough => Placement::WriteThrough,
            PlacementArg::Waterfall => Placement::Waterfall,
        };
    }
    if let Some(p) = args.l2_store_policy {
        config.store_policy = match p {
            StorePolicyArg::Default => StorePolicy::Default,
            StorePolicyArg::SkipL1 => StorePolicy::SkipL1,
        };
    }
    if let Some(p) = args.l2_prefetch_policy {
        config.prefetch_policy = match p {
            PrefetchPolicyArg::Default => PrefetchPolicy::Default,
            PrefetchPolicyArg::Retain => PrefetchPolicy::Retain,
        };
    }
    if let Some(n) = args.l2_prefetch_max_in_flight {
        config.prefetch_max_in_flight = n;
    }
    Ok(config)
}

fn pacing(args: &Args) -> Result<Pacing, Error> {
    match (args.pace, args.speedup) {
        (Some(Pace::Afap), Some(_)) => {
            Err(Error::usage("--speedup needs --pace realtime, not afap"))
        }
        (_, Some(s)) if !positive(s) => {
            Err(Error::usage(format!("--speedup {s}: must be positive")))
        }
        (_, Some(s)) => Ok(Pacing::Timed { speedup: s }),
        (Some(Pace::Realtime), None) => Ok(Pacing::Timed { speedup: 1.0 }),
        (Some(Pace::Afap) | None, None) => Ok(Pacing::AsFastAsPossible),
    }
}

/// The progress bar's unit: byte offsets against the file size for a plain trace (no second
/// pass over the file), records without a total for a compressed one.
fn progress_bar(path: &Path) -> (ProgressBar, bool) {
    let mut magic = [0u8; 4];
    let plain_size = File::open(path).ok().and_then(|mut f| {
        let compressed = f.read_exact(&mut magic).is_ok() && magic == ZSTD_MAGIC;
        let size = f.metadata().ok()?.len();
        (!compressed).then_some(size)
    });
    let (bar, template) = match plain_size {
        Some(size) => (
            ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr()),
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{spinner} {pos} records {per_sec}",
        ),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    (bar, plain_size.is_some())
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Error> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).map_err(|e| Error::io("cannot write", e).in_file(path.display()))
}

pub fn run(args: Args) -> Result<i32, Error> {
    let shown = args.file.display().to_string();
    let pacing = pacing(&args)?;
    let header = TraceReader::open(&args.file, args.read.options())
        .map_err(|e| e.in_file(&shown))?
        .header()
        .clone();
    let config = storage_config(&args, &header.sm_config_json, &shown)?;
    std::fs::create_dir_all(&args.output_dir)
        .map_err(|e| Error::io("cannot create", e).in_file(args.output_dir.display()))?;
    let mut jsonl = match &args.jsonl_out {
        Some(p) => {
            Some(BufWriter::new(File::create(p).map_err(|e| {
                Error::io("cannot create", e).in_file(p.display())
            })?))
        }
        None => None,
    };
    let show_bar = !args.quiet && !args.verbose && std::io::stderr().is_terminal();
    let (bar, by_bytes) = if show_bar {
        progress_bar(&args.file)
    } else {
        (ProgressBar::hidden(), false)
    };
    let mut sm = StorageManager::new(config, Tracer::disabled())?;
    let options = ReplayOptions {
        pacing,
        keep_startup_gap: args.keep_startup_gap,
        read: args.read.options(),
    };
    let mut out = std::io::stdout().lock();
    let mut io_error = None;
    let report = replay(&args.file, &mut sm, &options, |event| {
        if event.index % 4096 == 0 {
            bar.set_position(if by_bytes {
                event.record.offset
            } else {
                event.index
            });
        }
        let failed = !matches!(event.outcome, Outcome::Ok { .. });
        if args.verbose {
            let status = if failed { "FAIL" } else { "OK" };
            let line = format!(
                "  [{}]  {status:<4}  {:.3}ms  {}\n",
                event.index, event.latency_ms, event.record.qualname
            );
            if let Err(e) = out.write_all(line.as_bytes()) {
                io_error.get_or_insert(e);
            }
        }
        if let Some(w) = jsonl.as_mut() {
            let (kind, detail) = match event.outcome {
                Outcome::Ok { detail } => ("ok", detail),
                Outcome::Failed { reason } => ("failed", reason),
                Outcome::Skipped { reason } => ("skipped", reason),
            };
            let line = serde_json::json!({
                "qualname": event.record.qualname,
                "latency_ms": event.latency_ms,
                "failed": failed,
                "outcome": kind,
                "detail": detail,
            });
            if let Err(e) = serde_json::to_writer(&mut *w, &line)
                .map_err(std::io::Error::from)
                .and_then(|_| w.write_all(b"\n"))
            {
                io_error.get_or_insert(e);
            }
        }
    })?;
    bar.finish_and_clear();
    drop(out);
    if let Some(e) = io_error {
        return Err(Error::io("cannot write per-record output", e));
    }
    if let Some(mut w) = jsonl {
        w.flush()
            .map_err(|e| Error::io("cannot write --jsonl-out", e))?;
    }
    for w in &report.warnings {
        warn(&shown, w);
    }
    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    if !args.no_csv {
        exporters.push(Box::new(CsvTables));
    }
    if args.json {
        exporters.push(Box::new(JsonSummary));
    }
    if args.xlsx {
        exporters.push(Box::new(XlsxWorkbook));
    }
    for exporter in exporters {
        for (name, bytes) in exporter.files(&report)? {
            write_file(&args.output_dir, &name, &bytes)?;
        }
    }
    if !args.quiet {
        print_stdout(&table::render(&report))?;
    }
    Ok(if report.failed > 0 {
        EXIT_DATA
    } else {
        EXIT_OK
    })
}
