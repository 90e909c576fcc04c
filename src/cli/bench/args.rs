//! `kvtrace bench`'s flags: MLPerf Storage kv-cache.py's names and defaults, checked under
//! their names and turned into a [`kvtrace::bench::plan::Setup`].

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::ValueEnum;
use kvtrace::bench::autoscale::AutoscaleMode;
use kvtrace::bench::models::{model, MODELS};
use kvtrace::bench::plan::{Generation, Setup, StorageTier};
use kvtrace::bench::report::Profile as ProfileKind;
use kvtrace::bench::run::{DecodeReads, MultiTurn};
use kvtrace::bench::users::PersonaSet;
use kvtrace::error::{short, Error};
use kvtrace::rank::launcher_run_id;
use kvtrace::storage::config::L2Io;

use crate::cli::otlp::OtlpArgs;
use crate::cli::prometheus::PrometheusArgs;
use crate::cli::rank::RankArgs;
use crate::cli::tiers::{positive, L2IoArg};

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
    /// Storage write/read P95, CPU P95 and hit rate against kv-cache.py's targets
    Latency,
    /// Storage bandwidth; QoS compliance is not judged
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
    /// kv-cache.py's current persona ranges
    Current,
    /// The ranges kv-cache.py used in January 2026
    #[value(name = "january-2026")]
    January2026,
}

#[derive(clap::Args, Clone)]
#[command(after_help = crate::cli::examples(&[
    "kvtrace bench --model llama3.1-8b --num-users 20 --duration 30 --cpu-mem-gb 4 --cache-dir /mnt/nvme",
    "kvtrace bench --cpu-mem-gb 0 --gpu-mem-gb 0 --generation-mode none --duration 60 --xlsx-output run.xlsx",
    "kvtrace bench --suite --duration 20 --output suite-reports",
    "kvtrace bench --mlperf-option all --cache-dir /mnt/nvme/kv --results-dir /results/kv",
    "mpirun -np 4 kvtrace bench --num-users 10 --duration 60 --output run.json --storage-tier '{\"type\":\"resp-cluster\",\"nodes\":[\"redis://10.0.0.5:7000\"]}'",
]))]
pub(crate) struct Args {
    /// Model whose KV geometry sizes the entries
    #[arg(long, default_value = "llama3.1-8b",
          value_parser = PossibleValuesParser::new(MODELS.map(|m| m.name)))]
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
    /// GPUs; with --gpu-tier model the GPU tier holds --gpu-mem-gb on each
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
    /// The storage tier in a Redis Cluster or Valkey cluster instead of files:
    /// '{"type":"resp-cluster","nodes":["redis://127.0.0.1:7000",...],"prefix":"P"}'. Every
    /// rank of a run shares it (the default prefix names the run); its capacity is the
    /// cluster's maxmemory; entries stay there after the run. Or an S3-compatible bucket,
    /// one object per entry: '{"type":"s3","endpoint":"http://host:9000","bucket":"B"}'
    /// (credentials from AWS_* or ~/.aws/credentials)
    #[arg(long, value_name = "JSON")]
    storage_tier: Option<String>,
    /// Time spent generating each output token
    #[arg(long, value_enum, default_value = "realistic")]
    generation_mode: GenerationMode,
    /// Which pass/fail assessment is storage_health
    #[arg(long, value_enum, default_value = "latency")]
    performance_profile: Profile,
    /// Turns do not read the KV of earlier turns
    #[arg(long)]
    disable_multi_turn: bool,
    /// Shared system prompts are written again instead of read
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
    /// Also write the 99-column row as Parquet (typed columns)
    #[arg(long, value_name = "PATH")]
    parquet: Option<PathBuf>,
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
    /// How the storage tier's reads, writes and deletes are made [default: synchronous;
    /// asynchronous when --storage-io-depth or --storage-io-workers is given]
    #[arg(long, value_enum, value_name = "MODE")]
    storage_io: Option<L2IoArg>,
    /// Calls that may wait in the storage tier's queues before a request waits for room
    /// (asynchronous I/O; default 64)
    #[arg(long, value_name = "N")]
    storage_io_depth: Option<u32>,
    /// Worker threads of the storage tier, each with its own connection (asynchronous I/O;
    /// default 4)
    #[arg(long, value_name = "N")]
    storage_io_workers: Option<u32>,
    /// Storage tier I/O bypasses the page cache (O_DIRECT)
    #[arg(long)]
    direct_io: bool,
    /// Do not fsync each storage write (kv-cache.py always does)
    #[arg(long)]
    no_fsync: bool,
    /// How often decoding reads a request's entry back
    #[arg(long, value_enum, default_value = "amplified")]
    decode_reads: DecodeReadsArg,
    /// Which earlier turns a new turn reads
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
    /// Documents in the corpus (at most 10,000,000: each is listed from the start)
    #[arg(long, default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(..=10_000_000))]
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
    /// What the autoscaler aims at
    #[arg(long, value_enum, default_value = "qos")]
    autoscaler_mode: AutoscalerModeArg,
    /// Saturation the qos autoscaler aims at (0–1)
    #[arg(long, default_value_t = 0.8)]
    target_saturation: f64,
    /// Seconds between autoscaler decisions
    #[arg(long, default_value_t = 10.0)]
    autoscale_interval: f64,
    /// Run MLPerf Storage v3.0's KV-cache workload Option 1, 2 or 3 (or `all`, one after
    /// another) as its CLOSED division fixes it: the Option's model, users, duration, tier
    /// sizes and max-concurrent-allocs, no generation time, seed 42, 3 trials, 90 s between
    /// Options. Each trial's results go to --results-dir as option_<O>/trial_<T>/rank_<N>/,
    /// and the run's kvcache_run_summary.json beside them. Only --cache-dir, --results-dir,
    /// -q and the rank flags may be given; anything else needs --open
    #[arg(long, value_name = "OPTION", value_parser = ["1", "2", "3", "all"],
          help_heading = "MLPerf Storage v3.0")]
    pub mlperf_option: Option<String>,
    /// Where an MLPerf run's results go [default: kvcache-results-<local time>]
    #[arg(
        long,
        value_name = "DIR",
        requires = "mlperf_option",
        help_heading = "MLPerf Storage v3.0"
    )]
    pub results_dir: Option<PathBuf>,
    /// Mark the MLPerf run OPEN: every flag given supersedes the Option's value, and
    /// --trials and --inter-option-delay may change
    #[arg(long, requires = "mlperf_option", help_heading = "MLPerf Storage v3.0")]
    pub open: bool,
    /// Trials of each Option (CLOSED: 3)
    #[arg(long, value_name = "N", default_value_t = kvtrace::bench::mlperf::CLOSED_TRIALS,
          requires = "mlperf_option", help_heading = "MLPerf Storage v3.0")]
    pub trials: u32,
    /// Seconds between two Options (CLOSED: 90)
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 90.0,
        requires = "mlperf_option",
        help_heading = "MLPerf Storage v3.0"
    )]
    pub inter_option_delay: f64,
    /// Run nine scenarios (storage only, tiered, GPU on top, no prefix caching, single
    /// turn, single decode read, RAG, qos autoscaling, capacity search) sized to this
    /// machine, each for --duration, and print one comparison table; --output names the
    /// directory for their reports
    #[arg(long)]
    pub suite: bool,
    /// No console summary and no progress bar
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub ranks: RankArgs,
    #[command(flatten)]
    pub otlp: OtlpArgs,
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
}

impl Args {
    /// Refuses, before any work, an output that is one of the bench's inputs.
    pub(crate) fn guard(&self) -> Result<(), Error> {
        crate::cli::guard(
            self.dataset_path
                .iter()
                .chain(self.use_burst_trace.then_some(&self.burst_trace_path))
                .map(PathBuf::as_path),
            [
                &self.output,
                &self.xlsx_output,
                &self.csv,
                &self.parquet,
                &self.io_trace_log,
                &self.record,
            ]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
            .chain(self.otlp.file()),
        )
    }

    /// The checked setup, the rank included (from the flags or the launcher's environment).
    pub(crate) fn setup(&self) -> Result<Setup, Error> {
        let users = count("--num-users", self.num_users, 1, 100_000)?;
        if !(positive(self.duration) && self.duration <= 86_400.0) {
            return Err(Error::usage(format!(
                "--duration {}: expected seconds between 0 and 86400",
                short(self.duration)
            )));
        }
        let num_gpus = count("--num-gpus", self.num_gpus, 1, 65_536)?;
        let tensor_parallel = count("--tensor-parallel", self.tensor_parallel, 1, 65_536)?;
        if tensor_parallel > num_gpus {
            return Err(Error::usage(format!(
                "--tensor-parallel {tensor_parallel} exceeds --num-gpus {num_gpus}"
            )));
        }
        let max_concurrent_allocs = count(
            "--max-concurrent-allocs",
            self.max_concurrent_allocs,
            0,
            i64::from(u32::MAX),
        )?;
        let max_requests = u64::try_from(self.max_requests).map_err(|_| {
            Error::usage(format!(
                "--max-requests {}: expected 0 or more",
                self.max_requests
            ))
        })?;
        not_negative("--request-rate", self.request_rate, "requests per second")?;
        if !positive(self.gpu_bandwidth_gbps) {
            return Err(Error::usage("--gpu-bandwidth-gbps must be positive"));
        }
        let storage = match &self.storage_tier {
            Some(json) => {
                if self.storage_capacity_gb != 0.0 {
                    return Err(Error::usage("--storage-capacity-gb: a resp-cluster or s3 storage tier's capacity is the cluster's maxmemory or the bucket's"));
                }
                StorageTier::parse(json)
                    .map_err(|e| Error::usage(format!("--storage-tier: {e}")))?
            }
            None => StorageTier::Files {
                capacity_gb: not_negative(
                    "--storage-capacity-gb",
                    self.storage_capacity_gb,
                    "a size",
                )?,
            },
        };
        if self.use_burst_trace {
            if self.dataset_path.is_some() {
                return Err(Error::usage(
                    "give either --dataset-path or --use-burst-trace, not both",
                ));
            }
            not_negative("--trace-speedup", self.trace_speedup, "a number")?;
        }
        if self.enable_autoscaling {
            if !(0.0..=1.0).contains(&self.target_saturation) {
                return Err(Error::usage(format!(
                    "--target-saturation {}: expected 0 to 1",
                    short(self.target_saturation)
                )));
            }
            if !positive(self.autoscale_interval) {
                return Err(Error::usage("--autoscale-interval must be positive"));
            }
        }
        Ok(Setup {
            model: *model(&self.model).map_err(|e| Error::usage(format!("--model: {e}")))?,
            users,
            duration: Duration::from_secs_f64(self.duration),
            gpu_mem_gb: not_negative("--gpu-mem-gb", self.gpu_mem_gb, "a size")?,
            num_gpus,
            tensor_parallel,
            cpu_mem_gb: not_negative("--cpu-mem-gb", self.cpu_mem_gb, "a size")?,
            cache_dir: self.cache_dir.clone(),
            generation: match self.generation_mode {
                GenerationMode::None => Generation::None,
                GenerationMode::Fast => Generation::Fast,
                GenerationMode::Realistic => Generation::Realistic,
            },
            profile: match self.performance_profile {
                Profile::Latency => ProfileKind::Latency,
                Profile::Throughput => ProfileKind::Throughput,
            },
            multi_turn: match (self.disable_multi_turn, self.multi_turn_reads) {
                (true, _) => MultiTurn::Off,
                (false, TurnReads::All) => MultiTurn::AllPrevious,
                (false, TurnReads::Previous) => MultiTurn::PreviousOnly,
            },
            prefix_caching: !self.disable_prefix_caching,
            seed: self.seed,
            max_concurrent_allocs,
            max_requests,
            storage,
            gpu_tier: self.gpu_tier == GpuTier::Model,
            gpu_bandwidth_gbps: self.gpu_bandwidth_gbps,
            cpu_tier_dir: self.cpu_tier_dir.clone(),
            direct_io: self.direct_io,
            fsync: !self.no_fsync,
            decode_reads: match self.decode_reads {
                DecodeReadsArg::Amplified => DecodeReads::Amplified,
                DecodeReadsArg::Single => DecodeReads::Single,
            },
            personas: match self.personas {
                Personas::Current => PersonaSet::Current,
                Personas::January2026 => PersonaSet::January2026,
            },
            workers: self.workers,
            rag: self.enable_rag,
            rag_docs: self.rag_num_docs,
            dataset_path: self.dataset_path.clone(),
            max_conversations: self.max_conversations,
            burst_trace: self.use_burst_trace.then(|| self.burst_trace_path.clone()),
            trace_speedup: self.trace_speedup,
            replay_cycles: self.replay_cycles,
            request_rate: self.request_rate,
            io_trace_log: self.io_trace_log.clone(),
            record: self.record.clone(),
            autoscale: self
                .enable_autoscaling
                .then_some(match self.autoscaler_mode {
                    AutoscalerModeArg::Qos => AutoscaleMode::Qos,
                    AutoscalerModeArg::Capacity => AutoscaleMode::Capacity,
                }),
            target_saturation: self.target_saturation,
            // Checked above when the autoscaler runs; unused when it does not.
            autoscale_interval: Duration::try_from_secs_f64(self.autoscale_interval)
                .unwrap_or_default(),
            output: self.output.clone(),
            xlsx_output: self.xlsx_output.clone(),
            csv: self.csv.clone(),
            parquet: self.parquet.clone(),
            rank: self.ranks.rank()?,
            run_id: self
                .ranks
                .run_id
                .clone()
                .or_else(|| launcher_run_id(|name| std::env::var(name).ok())),
            mlperf: None,
            storage_io: self.storage_io()?,
        })
    }
}

impl Args {
    /// The storage tier's I/O mode the flags ask for.
    fn storage_io(&self) -> Result<L2Io, Error> {
        let sizes = self.storage_io_depth.is_some() || self.storage_io_workers.is_some();
        match self.storage_io {
            Some(L2IoArg::Synchronous) if sizes => Err(Error::usage(
                "--storage-io-depth and --storage-io-workers apply to --storage-io asynchronous",
            )),
            Some(L2IoArg::Synchronous) => Ok(L2Io::Synchronous),
            None if !sizes => Ok(L2Io::Synchronous),
            _ => L2Io::Synchronous
                .asynchronous_with(self.storage_io_depth, self.storage_io_workers)
                .map_err(|e| Error::usage(format!("--storage-io asynchronous: {e}"))),
        }
    }
}

/// `v`, a size or a rate, when it is finite and >= 0; else the flag's error saying `what` it
/// should be.
fn not_negative(flag: &str, v: f64, what: &str) -> Result<f64, Error> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(Error::usage(format!(
            "{flag} {}: expected {what} >= 0",
            short(v)
        )))
    }
}

fn count(flag: &str, v: i64, min: i64, max: i64) -> Result<u32, Error> {
    match u32::try_from(v) {
        Ok(n) if (min..=max).contains(&v) => Ok(n),
        _ => Err(Error::usage(format!("{flag} {v}: expected {min} to {max}"))),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn the_flags_defaults_are_the_librarys() {
        let bench = Bench::try_parse_from(["bench"]).unwrap();
        let setup = bench.args.setup().unwrap();
        // The launcher's environment may name a run; nothing else comes from outside.
        assert_eq!(
            Setup {
                run_id: None,
                ..setup
            },
            Setup::default()
        );
    }
}
