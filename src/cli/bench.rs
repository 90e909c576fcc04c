//! `kvtrace bench`: MLPerf Storage's KV-cache benchmark flags, real I/O through kvtrace's
//! tiers.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::bench::autoscale::{AutoscaleConfig, AutoscaleMode};
use kvtrace::bench::burst::{self, BurstReplay};
use kvtrace::bench::calls::CallTrace;
use kvtrace::bench::export;
use kvtrace::bench::io::FileMode;
use kvtrace::bench::iolog::IoLog;
use kvtrace::bench::models::model;
use kvtrace::bench::rag::Corpus;
use kvtrace::bench::report::{build, ReportInput};
use kvtrace::bench::run::{run as run_bench, BenchConfig, DecodeReads, MultiTurn, MAX_WORKERS};
use kvtrace::bench::sharegpt::{self, Dataset};
use kvtrace::bench::tiers::{TierCache, TierKind, TierSpec, TierStore};
use kvtrace::bench::users::PersonaSet;
use kvtrace::bus::{EventBus, Tracer};
use kvtrace::clock::local_stamp;
use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::report::csv::CsvTables;
use kvtrace::report::tables::{Cell, TableExporter};
use kvtrace::report::xlsx::XlsxWorkbook;
use kvtrace::storage::config::{
    EvictionConfig, EvictionTiming, L2Config, Placement, StorageConfig,
};

use super::tiers::available_memory;
use super::{finish_recording, print_stdout, start_recording, write_file};

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum GenerationMode {
    /// No generation time
    None,
    /// 2 ms per generated token
    Fast,
    /// 30 ms per generated token
    Realistic,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Profile {
    Latency,
    Throughput,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum GpuTier {
    /// No GPU tier (kvtrace moves no bytes to a GPU)
    Off,
    /// A capacity and bandwidth budget: entries placed there cost size / --gpu-bandwidth-gbps
    Model,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum DecodeReadsArg {
    /// Once, then once more per 32 generated tokens, as kv-cache.py does
    Amplified,
    /// Once
    Single,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum TurnReads {
    /// Every earlier turn of the conversation
    All,
    /// Only the previous turn (kv-cache.py before March 2026)
    Previous,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum AutoscalerModeArg {
    /// Hold storage saturation near --target-saturation
    Qos,
    /// Find the user count with the highest throughput, then stop
    Capacity,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Personas {
    Current,
    #[value(name = "january-2026")]
    January2026,
}

/// A KV-cache storage benchmark with MLPerf Storage kv-cache.py's flags and outputs:
/// simulated users write and re-read whole KV entries through GPU, CPU and storage tiers
/// with real I/O, and the run reports throughput, latency percentiles, hit rates and QoS
#[derive(clap::Args, Clone)]
#[command(after_help = "Examples:\n  \
    kvtrace bench --model llama3.1-8b --num-users 20 --duration 30 --cpu-mem-gb 4 --cache-dir /mnt/nvme\n  \
    kvtrace bench --cpu-mem-gb 0 --gpu-mem-gb 0 --generation-mode none --duration 60 --xlsx-output run.xlsx")]
pub struct Args {
    /// Model whose KV geometry sizes the entries
    #[arg(long, default_value = "llama3.1-8b")]
    model: String,
    /// Simulated users
    #[arg(long, default_value_t = 100)]
    num_users: i64,
    /// Seconds to run; requests completing later are not counted
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// GPU memory per GPU in GiB (used with --gpu-tier model)
    #[arg(long, default_value_t = 16.0)]
    gpu_mem_gb: f64,
    #[arg(long, default_value_t = 1)]
    num_gpus: i64,
    /// Entries are split over this many GPUs; one rank's share is stored
    #[arg(long, default_value_t = 1)]
    tensor_parallel: i64,
    /// CPU tier in GiB (0: none)
    #[arg(long, default_value_t = 32.0)]
    cpu_mem_gb: f64,
    /// Directory of the storage tier (default: a temporary directory)
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "realistic")]
    generation_mode: GenerationMode,
    /// Which pass/fail assessment is storage_health
    #[arg(long, value_enum, default_value = "latency")]
    performance_profile: Profile,
    #[arg(long)]
    disable_multi_turn: bool,
    #[arg(long)]
    disable_prefix_caching: bool,
    /// Same seed, same request sequence per user
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Entry writes in flight at once (0: unlimited)
    #[arg(long, default_value_t = 0)]
    max_concurrent_allocs: i64,
    /// Stop after this many completed requests (0: run for --duration)
    #[arg(long, default_value_t = 0)]
    max_requests: i64,
    /// Storage tier capacity in GiB (0: 95 % of the free space under --cache-dir)
    #[arg(long, default_value_t = 0.0)]
    storage_capacity_gb: f64,
    /// Results JSON (default: benchmark_results_<local time>.json)
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
    /// Also write the results workbook (99-column Summary row and detail sheets)
    #[arg(long, value_name = "PATH")]
    xlsx_output: Option<PathBuf>,
    /// Also write the 99-column row as CSV
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
    /// GPU tier: off (as kv-cache.py without CUDA) or a modelled budget
    #[arg(long, value_enum, default_value = "off")]
    gpu_tier: GpuTier,
    /// Bandwidth of the modelled GPU tier
    #[arg(long, default_value_t = 25.0)]
    gpu_bandwidth_gbps: f64,
    /// Where the CPU tier keeps its bytes (shared memory, so they count as host memory but
    /// not as this process's RSS)
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    cpu_tier_dir: PathBuf,
    /// Storage tier I/O bypasses the page cache (O_DIRECT)
    #[arg(long)]
    direct_io: bool,
    /// Do not fsync each storage write (kv-cache.py always does)
    #[arg(long)]
    no_fsync: bool,
    #[arg(long, value_enum, default_value = "amplified")]
    decode_reads: DecodeReadsArg,
    #[arg(long, value_enum, default_value = "all")]
    multi_turn_reads: TurnReads,
    /// User persona ranges
    #[arg(long, value_enum, default_value = "current")]
    personas: Personas,
    /// Worker threads serving requests (default: one per user, at most 500)
    #[arg(long)]
    workers: Option<u32>,
    /// Ingest a document corpus at the start and let one request in ten read the KV of
    /// its top 5 chunks of a document
    #[arg(long)]
    enable_rag: bool,
    /// Documents in the corpus
    #[arg(long, default_value_t = 10)]
    rag_num_docs: u32,
    /// ShareGPT JSON: its human → gpt exchanges become the requests (tokens counted with
    /// cl100k_base) instead of the personas' synthetic ones
    #[arg(long, value_name = "FILE")]
    dataset_path: Option<PathBuf>,
    /// Conversations read from the dataset
    #[arg(long, default_value_t = 500)]
    max_conversations: usize,
    /// Replay a BurstGPT request log (see --burst-trace-path) instead of the personas
    #[arg(long)]
    use_burst_trace: bool,
    /// BurstGPT CSV file, directory of CSV files, or glob
    #[arg(
        long,
        value_name = "PATH",
        default_value = "BurstGPT/data/BurstGPT_1.csv"
    )]
    burst_trace_path: PathBuf,
    /// Divide the log's timestamps by this (0: send without waiting)
    #[arg(long, default_value_t = 1.0)]
    trace_speedup: f64,
    /// Passes over the dataset or log (0: until the run ends)
    #[arg(long, default_value_t = 0)]
    replay_cycles: u32,
    /// Submissions per second over all users (0: as fast as users send)
    #[arg(long, default_value_t = 0.0)]
    request_rate: f64,
    /// Log every tier write, read and eviction as CSV (Timestamp, Operation,
    /// Object_Size_Bytes, Tier, Key, Phase; .zst compresses). As in kv-cache.py's trace mode,
    /// the tiers then keep no bytes and take no time
    #[arg(long, value_name = "FILE")]
    io_trace_log: Option<PathBuf>,
    /// Record every entry write and read as the StorageManager calls an LMCache server
    /// makes (LMCT; a name ending in .zst is compressed), for `kvtrace replay`
    #[arg(long, value_name = "PATH")]
    record: Option<PathBuf>,
    /// Let the autoscaler change the number of live users
    #[arg(long)]
    enable_autoscaling: bool,
    #[arg(long, value_enum, default_value = "qos")]
    autoscaler_mode: AutoscalerModeArg,
    /// Saturation the qos autoscaler aims at (0–1)
    #[arg(long, default_value_t = 0.8)]
    target_saturation: f64,
    /// Seconds between autoscaler decisions
    #[arg(long, default_value_t = 10.0)]
    autoscale_interval: f64,
    /// Run nine scenarios (storage only, tiered, GPU on top, no prefix caching, single
    /// turn, single decode read, RAG, qos autoscaling, capacity search) sized to this
    /// machine, each for --duration, and print one comparison table; --output names the
    /// directory for their reports
    #[arg(long)]
    suite: bool,
    /// No console summary and no progress bar
    #[arg(short, long)]
    quiet: bool,
}

/// Directories no benchmark may write into.
const SYSTEM_DIRS: [&str; 10] = [
    "/etc",
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/boot",
    "/sys",
    "/proc",
    "/dev",
    "/root",
];

fn gib(flag: &str, v: f64) -> Result<u64, Error> {
    if v.is_finite() && v >= 0.0 {
        Ok((v * (1u64 << 30) as f64) as u64)
    } else {
        Err(Error::usage(format!("{flag} {v}: expected a size >= 0")))
    }
}

fn count(flag: &str, v: i64, min: i64, max: i64) -> Result<u32, Error> {
    if (min..=max).contains(&v) {
        Ok(v as u32)
    } else {
        Err(Error::usage(format!("{flag} {v}: expected {min} to {max}")))
    }
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills in.
    (unsafe { libc::statvfs(path.as_ptr(), &mut s) } == 0)
        .then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

/// A directory that removes itself when the run ends.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for this run under `parent`; `what` names the flag, and a flag that
/// names a storage location (`--cache-dir`) may not point into a system directory.
fn run_dir(parent: &Path, what: &str) -> Result<RunDir, Error> {
    let s = parent.display().to_string();
    if what == "--cache-dir"
        && SYSTEM_DIRS
            .iter()
            .any(|d| s == *d || s.starts_with(&format!("{d}/")))
    {
        return Err(Error::usage(format!(
            "{what} {s}: a system directory; choose another"
        )));
    }
    // One directory per tier, even when both flags name the same parent: two tiers in one
    // directory would hold an entry under one path, and a demotion's delete of the source
    // would remove the copy it just wrote.
    let tier = what.trim_start_matches("--").trim_end_matches("-dir");
    let dir = parent.join(format!("kvtrace-bench-{}-{tier}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io("cannot create", e).in_file(dir.display()))?;
    Ok(RunDir(dir))
}

pub fn run(args: Args) -> Result<i32, Error> {
    if args.suite {
        return suite(&args);
    }
    let report = run_once(&args)?;
    Ok(exit_status(&report))
}

/// 128 + the signal after an interrupt; 1 when storage I/O failed (said on stderr even with
/// -q: the figures of such a run are not the storage's); else 0.
fn exit_status(report: &serde_json::Value) -> i32 {
    if let Some(status) = kvtrace::interrupt::exit_status() {
        return status;
    }
    let count = |key: &str| {
        report
            .pointer(&format!("/kvtrace/{key}"))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let (io_errors, demotions) = (count("io_errors"), count("failed_demotions"));
    if io_errors + demotions == 0 {
        return EXIT_OK;
    }
    let first = report
        .pointer("/kvtrace/first_io_error")
        .and_then(serde_json::Value::as_str)
        .map(|e| format!("; first: {e}"))
        .unwrap_or_default();
    eprintln!(
        "kvtrace: storage I/O failed: {io_errors} failed read(s) or write(s), {demotions} failed demotion(s) (entries dropped){first}"
    );
    EXIT_DATA
}

/// One run: writes its files, prints its summary unless quiet, returns the report.
fn run_once(args: &Args) -> Result<serde_json::Value, Error> {
    let model = *model(&args.model).map_err(|e| Error::usage(format!("--model: {e}")))?;
    let users = count("--num-users", args.num_users, 1, 100_000)?;
    if !(args.duration.is_finite() && args.duration > 0.0 && args.duration <= 86_400.0) {
        return Err(Error::usage(format!(
            "--duration {}: expected seconds between 0 and 86400",
            args.duration
        )));
    }
    let num_gpus = count("--num-gpus", args.num_gpus, 1, 65_536)?;
    let tp = count("--tensor-parallel", args.tensor_parallel, 1, 65_536)?;
    if tp > num_gpus {
        return Err(Error::usage(format!(
            "--tensor-parallel {tp} exceeds --num-gpus {num_gpus}"
        )));
    }
    let gpu_bytes = gib("--gpu-mem-gb", args.gpu_mem_gb)? * u64::from(num_gpus);
    let cpu_bytes = gib("--cpu-mem-gb", args.cpu_mem_gb)?;
    let storage_bytes = gib("--storage-capacity-gb", args.storage_capacity_gb)?;
    let allocs = count(
        "--max-concurrent-allocs",
        args.max_concurrent_allocs,
        0,
        i64::from(u32::MAX),
    )?;
    if args.max_requests < 0 {
        return Err(Error::usage(format!(
            "--max-requests {}: expected 0 or more",
            args.max_requests
        )));
    }
    if !(args.request_rate.is_finite() && args.request_rate >= 0.0) {
        return Err(Error::usage(format!(
            "--request-rate {}: expected requests per second >= 0",
            args.request_rate
        )));
    }
    if !(args.gpu_bandwidth_gbps.is_finite() && args.gpu_bandwidth_gbps > 0.0) {
        return Err(Error::usage("--gpu-bandwidth-gbps must be positive"));
    }
    let cache_parent = args.cache_dir.clone().unwrap_or_else(std::env::temp_dir);
    if !cache_parent.is_dir() {
        return Err(Error::usage(format!(
            "--cache-dir {}: not a directory",
            cache_parent.display()
        )));
    }
    let storage_dir = run_dir(&cache_parent, "--cache-dir")?;
    let capacity = if storage_bytes > 0 {
        storage_bytes
    } else {
        free_bytes(&storage_dir.0).map_or(u64::MAX, |b| b / 20 * 19)
    };
    let mut specs = Vec::new();
    if args.gpu_tier == GpuTier::Model {
        specs.push(TierSpec {
            kind: TierKind::Gpu,
            capacity: Some(gpu_bytes),
            store: TierStore::Modelled {
                gbps: args.gpu_bandwidth_gbps,
            },
        });
    }
    let cpu_dir = if cpu_bytes > 0 {
        let d = run_dir(&args.cpu_tier_dir, "--cpu-tier-dir")?;
        specs.push(TierSpec {
            kind: TierKind::Cpu,
            capacity: Some(cpu_bytes),
            store: TierStore::Files {
                dir: d.0.clone(),
                mode: FileMode {
                    direct: false,
                    fsync: false,
                    drop_cache_before_read: false,
                },
            },
        });
        Some(d)
    } else {
        None
    };
    specs.push(TierSpec {
        kind: TierKind::Storage,
        capacity: Some(capacity),
        store: TierStore::Files {
            dir: storage_dir.0.clone(),
            mode: FileMode {
                direct: args.direct_io,
                fsync: !args.no_fsync,
                drop_cache_before_read: true,
            },
        },
    });
    if args.io_trace_log.is_some() {
        for spec in &mut specs {
            spec.store = TierStore::Null;
        }
    }
    let mut cache = TierCache::new(specs).map_err(|e| Error::io("cannot set up the tiers", e))?;
    let io_log = match &args.io_trace_log {
        Some(path) => {
            let log = Arc::new(IoLog::create(path)?);
            cache = cache.with_log(Arc::clone(&log));
            Some((log, path))
        }
        None => None,
    };
    let config = BenchConfig {
        model,
        users,
        workers: args.workers.unwrap_or(users.min(500)).max(1),
        duration: Duration::from_secs_f64(args.duration),
        max_requests: args.max_requests as u64,
        seed: args.seed,
        personas: match args.personas {
            Personas::Current => PersonaSet::Current,
            Personas::January2026 => PersonaSet::January2026,
        },
        multi_turn: match (args.disable_multi_turn, args.multi_turn_reads) {
            (true, _) => MultiTurn::Off,
            (false, TurnReads::All) => MultiTurn::AllPrevious,
            (false, TurnReads::Previous) => MultiTurn::PreviousOnly,
        },
        prefix_caching: !args.disable_prefix_caching,
        system_prompt_tokens: [512, 1024, 2048],
        generation_ms_per_token: match args.generation_mode {
            GenerationMode::None => 0.0,
            GenerationMode::Fast => 2.0,
            GenerationMode::Realistic => 30.0,
        },
        decode_reads: match args.decode_reads {
            DecodeReadsArg::Amplified => DecodeReads::Amplified,
            DecodeReadsArg::Single => DecodeReads::Single,
        },
        max_concurrent_allocs: allocs,
        tensor_parallel: tp,
        autoscale: autoscale(args, users)?,
        dataset: dataset(args)?,
        burst: burst(args)?,
        rag: args.enable_rag.then(|| {
            let large = model.hidden >= 8192 || model.layers >= 64;
            Corpus::new(args.seed, args.rag_num_docs, large)
        }),
        replay_cycles: args.replay_cycles,
        request_rate: args.request_rate,
    };
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("benchmark_results_{}.json", local_stamp())));
    for path in [Some(&output), args.xlsx_output.as_ref(), args.csv.as_ref()]
        .into_iter()
        .flatten()
    {
        kvtrace::output::check_writable(path)?;
    }
    let bar = if args.quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(
            Some((args.duration * 10.0) as u64),
            ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {msg}") {
            bar.set_style(style);
        }
        bar
    };
    let mut progress = |elapsed: f64, done: u64| {
        bar.set_position((elapsed * 10.0) as u64);
        bar.set_message(format!(
            "{elapsed:.0}/{:.0} s, {done} requests",
            args.duration
        ));
    };
    let (calls, bus) = recording(args, &config, cpu_bytes, capacity, &storage_dir.0)?;
    let outcome = run_bench(&config, &cache, &calls, &mut progress)?;
    bar.finish_and_clear();
    drop(calls);
    if let Some(bus) = bus {
        finish_recording(bus, args.quiet)?;
    }
    if let Some((log, path)) = io_log {
        log.finish()
            .map_err(|e| Error::io("cannot write", e).in_file(path.display()))?;
    }
    let tiers = cache.counters();
    let profile = match args.performance_profile {
        Profile::Latency => "latency",
        Profile::Throughput => "throughput",
    };
    let report = build(&ReportInput {
        config: &config,
        outcome: &outcome,
        tiers: &tiers,
        profile,
    });
    let mut text = serde_json::to_string_pretty(&report).unwrap_or_default();
    text.push('\n');
    write_file(&output, text.as_bytes())?;
    let parameters = parameters(args, &config, &cache_parent, capacity, gpu_bytes);
    if let Some(path) = &args.xlsx_output {
        let tables = export::tables(parameters.clone(), &report, profile == "throughput");
        for (_, bytes) in XlsxWorkbook.table_files("results", &tables)? {
            write_file(path, &bytes)?;
        }
    }
    if let Some(path) = &args.csv {
        let tables = export::tables(parameters, &report, profile == "throughput");
        for (_, bytes) in CsvTables.table_files("results", &tables[..1])? {
            write_file(path, &bytes)?;
        }
    }
    drop(cpu_dir);
    if !args.quiet {
        print_stdout(&console_summary(&report, &output))?;
    }
    Ok(report)
}

/// The scenarios of `--suite`: a name, what it shows, and how it changes the base run.
type Scenario = (&'static str, &'static str, fn(&mut Args));

const SCENARIOS: [Scenario; 9] = [
    (
        "storage-only",
        "no CPU tier: every byte is storage I/O",
        |a| a.cpu_mem_gb = 0.0,
    ),
    ("tiered", "CPU tier in front of storage (waterfall)", |_| {}),
    ("gpu-cpu-storage", "a modelled GPU tier on top", |a| {
        a.gpu_tier = GpuTier::Model
    }),
    ("no-prefix-caching", "shared prefixes recomputed", |a| {
        a.disable_prefix_caching = true
    }),
    ("single-turn", "no conversation history reads", |a| {
        a.disable_multi_turn = true
    }),
    ("single-decode-read", "decode reads each entry once", |a| {
        a.decode_reads = DecodeReadsArg::Single
    }),
    ("rag", "document retrieval on one request in ten", |a| {
        a.enable_rag = true
    }),
    ("autoscale-qos", "users follow storage saturation", |a| {
        a.enable_autoscaling = true;
        a.autoscaler_mode = AutoscalerModeArg::Qos;
    }),
    (
        "capacity",
        "users grow until throughput stops improving",
        |a| {
            a.enable_autoscaling = true;
            a.autoscaler_mode = AutoscalerModeArg::Capacity;
        },
    ),
];

/// `--suite`: nine scenarios sized to this machine, one comparison table.
fn suite(args: &Args) -> Result<i32, Error> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as i64;
    let memory_gib = available_memory().unwrap_or(8 << 30) as f64 / (1u64 << 30) as f64;
    let users = args.num_users.min(8 * cores).max(1);
    let cpu_gb = (memory_gib / 4.0)
        .clamp(0.5, 32.0)
        .min(args.cpu_mem_gb.max(0.5));
    let dir = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("kvtrace_suite_{}", local_stamp())));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io("cannot create", e).in_file(dir.display()))?;
    eprintln!(
        "kvtrace: suite on {cores} cores, {memory_gib:.0} GiB available: {users} users, {cpu_gb:.1} GiB CPU tier, {} s per scenario; reports in {}",
        args.duration,
        dir.display()
    );
    let mut table = String::from(
        "scenario              requests   tok/s  storage GiB/s  E2E p95 ms  read p95 ms  hit rate  assessment\n",
    );
    for (name, what, change) in SCENARIOS {
        let mut a = args.clone();
        a.suite = false;
        a.quiet = true;
        a.num_users = users;
        a.cpu_mem_gb = cpu_gb;
        a.xlsx_output = None;
        a.csv = None;
        a.record = None;
        a.io_trace_log = None;
        a.autoscale_interval = (args.duration / 6.0).max(1.0);
        change(&mut a);
        a.output = Some(dir.join(format!("{name}.json")));
        eprintln!("kvtrace: {name}: {what}");
        let r = run_once(&a)?;
        let f = |p: &str| r.pointer(p).and_then(|v| v.as_f64()).unwrap_or(0.0);
        table += &format!(
            "{name:<20} {:>9.0} {:>7.1} {:>14.3} {:>11.1} {:>12.1} {:>8.1}%  {}\n",
            f("/summary/total_requests"),
            f("/summary/avg_throughput_tokens_per_sec"),
            f("/kvtrace/storage_io_throughput_gib_per_s"),
            f("/summary/end_to_end_latency_ms/p95"),
            f("/summary/cache_stats/storage_read_p95_ms"),
            100.0 * f("/summary/cache_stats/cache_hit_rate"),
            r.pointer("/summary/cache_stats/storage_health/overall_status")
                .and_then(|v| v.as_str())
                .unwrap_or("?"),
        );
        if kvtrace::interrupt::requested().is_some() {
            break;
        }
    }
    print_stdout(&table)?;
    Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
}

/// The call trace of the run and, with `--record`, the bus recording it. The trace's
/// header describes the run's tiers as a waterfall hierarchy: the CPU tier as L1 (raised to
/// hold the largest entry the run can write, since a StorageManager admits through L1), the
/// storage tier as a file L2.
fn recording(
    args: &Args,
    config: &BenchConfig,
    cpu_bytes: u64,
    storage_bytes: u64,
    storage_dir: &Path,
) -> Result<(CallTrace, Option<EventBus>), Error> {
    let per_token = config.model.bytes_per_token() / u64::from(config.tensor_parallel);
    let Some(path) = &args.record else {
        return Ok((
            CallTrace::new(Tracer::disabled(), config.model.name, per_token),
            None,
        ));
    };
    let l2 = serde_json::json!({
        "type": "fs",
        "path": storage_dir.display().to_string(),
        "capacity_gb": storage_bytes.min(1 << 60) as f64 / (1u64 << 30) as f64,
    });
    let storage = StorageConfig {
        l1_size_bytes: cpu_bytes.max(per_token * config.personas.max_context_tokens()),
        l1_buffers: false,
        placement: Placement::Waterfall,
        eviction: EvictionConfig {
            timing: EvictionTiming::Immediate,
            ..EvictionConfig::default()
        },
        l2: vec![L2Config::from_adapter(&l2).map_err(Error::usage)?],
        ..StorageConfig::default()
    };
    let bus = start_recording(path, &storage, false)?;
    Ok((
        CallTrace::new(bus.tracer(), config.model.name, per_token),
        Some(bus),
    ))
}

/// The BurstGPT log, with `--use-burst-trace`.
fn burst(args: &Args) -> Result<Option<BurstReplay>, Error> {
    if !args.use_burst_trace {
        return Ok(None);
    }
    if args.dataset_path.is_some() {
        return Err(Error::usage(
            "give either --dataset-path or --use-burst-trace, not both",
        ));
    }
    if !(args.trace_speedup.is_finite() && args.trace_speedup >= 0.0) {
        return Err(Error::usage(format!(
            "--trace-speedup {}: expected a number >= 0",
            args.trace_speedup
        )));
    }
    Ok(Some(BurstReplay {
        rows: Arc::new(burst::load(&args.burst_trace_path)?),
        speedup: args.trace_speedup,
    }))
}

/// The ShareGPT dataset, if one is given; says what could not be paired.
fn dataset(args: &Args) -> Result<Option<Arc<Dataset>>, Error> {
    let Some(path) = &args.dataset_path else {
        return Ok(None);
    };
    let d = sharegpt::load(path, args.max_conversations)?;
    if let Some(w) = d.warning() {
        eprintln!("kvtrace: warning: {}: {w}", path.display());
    }
    if d.conversations.is_empty() {
        return Err(Error::usage(format!(
            "--dataset-path {}: none of its {} conversations has a human message followed by a gpt message",
            path.display(),
            d.read
        )));
    }
    Ok(Some(Arc::new(d)))
}

fn autoscale(args: &Args, users: u32) -> Result<Option<AutoscaleConfig>, Error> {
    if !args.enable_autoscaling {
        return Ok(None);
    }
    if !(0.0..=1.0).contains(&args.target_saturation) {
        return Err(Error::usage(format!(
            "--target-saturation {}: expected 0 to 1",
            args.target_saturation
        )));
    }
    if !(args.autoscale_interval.is_finite() && args.autoscale_interval > 0.0) {
        return Err(Error::usage("--autoscale-interval must be positive"));
    }
    Ok(Some(AutoscaleConfig {
        mode: match args.autoscaler_mode {
            AutoscalerModeArg::Qos => AutoscaleMode::Qos,
            AutoscalerModeArg::Capacity => AutoscaleMode::Capacity,
        },
        target_saturation: args.target_saturation,
        interval_s: args.autoscale_interval,
        max_users: users.max(MAX_WORKERS),
    }))
}

/// The 27 run-parameter cells, in the workbook's column order.
fn parameters(
    args: &Args,
    config: &BenchConfig,
    cache_dir: &Path,
    capacity: u64,
    gpu_bytes: u64,
) -> Vec<Cell> {
    let gib = |b: u64| Cell::Number(b as f64 / (1u64 << 30) as f64);
    let yes = |b: bool| Cell::Text(if b { "Yes" } else { "No" }.into());
    let n = |v: f64| Cell::Number(v);
    vec![
        Cell::Text(local_stamp()),
        Cell::Text(config.model.name.into()),
        n(f64::from(config.users)),
        n(args.duration),
        n(args.gpu_mem_gb),
        n(args.num_gpus as f64),
        n(args.tensor_parallel as f64),
        if args.gpu_tier == GpuTier::Model {
            gib(gpu_bytes)
        } else {
            n(0.0)
        },
        n(args.cpu_mem_gb),
        Cell::Text(
            match args.generation_mode {
                GenerationMode::None => "none",
                GenerationMode::Fast => "fast",
                GenerationMode::Realistic => "realistic",
            }
            .into(),
        ),
        Cell::Text(match args.performance_profile {
            Profile::Latency => "latency".into(),
            Profile::Throughput => "throughput".into(),
        }),
        yes(config.multi_turn != MultiTurn::Off),
        yes(config.prefix_caching),
        yes(config.rag.is_some()),
        yes(config.autoscale.is_some()),
        n(config.seed as f64),
        n(f64::from(config.max_concurrent_allocs)),
        n(config.request_rate),
        n(config.max_requests as f64),
        args.dataset_path
            .as_ref()
            .map_or(Cell::Empty, |p| Cell::Text(p.display().to_string())),
        Cell::Text(cache_dir.display().to_string()),
        gib(capacity.min(u64::MAX / 2)),
        yes(false),
        n(0.0),
        n(0.0),
        n(config.burst.as_ref().map_or(1.0, |b| b.speedup)),
        n(f64::from(config.replay_cycles)),
    ]
}

/// The figures a user looks at first.
fn console_summary(report: &serde_json::Value, output: &Path) -> String {
    let f = |p: &str| report.pointer(p).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let s = "/summary";
    let c = "/summary/cache_stats";
    let mut out = String::from("kvtrace bench\n");
    out += &format!(
        "  requests {:.0} in {:.1} s ({:.2}/s), {:.0} tokens\n",
        f(&format!("{s}/total_requests")),
        f(&format!("{s}/elapsed_time")),
        f(&format!("{s}/requests_per_second")),
        f(&format!("{s}/total_tokens"))
    );
    out += &format!(
        "  throughput: {:.1} tok/s wall clock, {:.1} tok/s storage, {:.3} GiB/s storage I/O\n",
        f(&format!("{s}/avg_throughput_tokens_per_sec")),
        f(&format!("{s}/storage_throughput_tokens_per_sec")),
        f("/kvtrace/storage_io_throughput_gib_per_s")
    );
    for (label, key) in [
        ("E2E", "end_to_end_latency_ms"),
        ("storage", "storage_io_latency_ms"),
    ] {
        out += &format!(
            "  {label} latency ms: p50 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}\n",
            f(&format!("{s}/{key}/p50")),
            f(&format!("{s}/{key}/p95")),
            f(&format!("{s}/{key}/p99")),
            f(&format!("{s}/{key}/p999"))
        );
    }
    out += &format!(
        "  cache hit rate {:.1} %, read {:.2} GiB, written {:.2} GiB (storage tier: read {:.2}, written {:.2})\n",
        100.0 * f(&format!("{c}/cache_hit_rate")),
        f(&format!("{c}/total_read_gb")),
        f(&format!("{c}/total_write_gb")),
        f(&format!("{c}/tier_storage_kv_bytes_read_gb")),
        f(&format!("{c}/tier_storage_kv_bytes_written_gb"))
    );
    let status = report
        .pointer(&format!("{c}/storage_health/overall_status"))
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    out += &format!("  assessment: {status}\n  results: {}\n", output.display());
    out
}
