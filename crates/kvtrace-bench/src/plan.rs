//! From a checked setup to a run: [`Setup`] holds what a user asks for (kv-cache.py's
//! settings and their defaults, checked by the caller), [`Plan::new`] sets the run up —
//! tiers, run directories, dataset, recording, every output path — before any time is
//! spent, and [`Plan::run`] runs it and writes the reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::autoscale::{AutoscaleConfig, AutoscaleMode};
use super::burst::{self, BurstReplay};
use super::calls::CallTrace;
use super::io::FileMode;
use super::iolog::IoLog;
use super::mlperf::MlperfTrial;
use super::models::{ModelConfig, DEFAULT_MODEL};
use super::rag::Corpus;
use super::report::{BenchReport, Profile, RankWindow, ReportInput};
use super::run::{run, BenchConfig, DecodeReads, MultiTurn, MAX_WORKERS};
use super::sharegpt::{self, Dataset};
use super::sheets::RunParameters;
use super::tiers::{TierCache, TierKind, TierSpec, TierStore};
use super::users::PersonaSet;
use kvtrace_cache::bus::recorder::start_recording;
use kvtrace_cache::bus::{EventBus, SubscriberReport, Tracer};
use kvtrace_cache::clock::local_stamp;
use kvtrace_cache::storage::config::{
    BackendConfig, EvictionConfig, EvictionTiming, L2Config, L2Io, Placement, S3Location,
    StorageConfig,
};
use kvtrace_io::error::{short, Error, Result};
use kvtrace_io::machine::{available_memory, free_bytes};
use kvtrace_io::output::{remove_dead_leftovers, Leftover};
use kvtrace_otel::SpanSink;
use kvtrace_rank::Rank;
use kvtrace_report::{csv::Csv, json::Json, xlsx::Xlsx, Exporter, Target};

const GIB: f64 = (1u64 << 30) as f64;

/// Milliseconds slept per generated token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    None,
    Fast,
    Realistic,
}

impl Generation {
    pub fn name(self) -> &'static str {
        match self {
            Generation::None => "none",
            Generation::Fast => "fast",
            Generation::Realistic => "realistic",
        }
    }

    fn ms_per_token(self) -> f64 {
        match self {
            Generation::None => 0.0,
            Generation::Fast => 2.0,
            Generation::Realistic => 30.0,
        }
    }
}

/// A run as its caller checked it: counts in range, sizes finite and >= 0, the GPU tier's
/// bandwidth and the autoscaler's interval positive. [`Default`] is kv-cache.py's defaults.
/// [`Plan::new`] refuses only what cannot be set up (a system directory, a missing parent,
/// a dataset and a log together), so a caller's own messages can name its own flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    pub model: ModelConfig,
    pub users: u32,
    pub duration: Duration,
    /// GiB of GPU memory on each GPU (the modelled GPU tier holds this on every one).
    pub gpu_mem_gb: f64,
    pub num_gpus: u32,
    /// Entries are split over this many GPUs (at most `num_gpus`); one share is stored.
    pub tensor_parallel: u32,
    /// The CPU tier's capacity; 0: no CPU tier.
    pub cpu_mem_gb: f64,
    /// Where the storage tier's files go (created when missing); the system temp
    /// directory when not given.
    pub cache_dir: Option<PathBuf>,
    pub generation: Generation,
    pub profile: Profile,
    pub multi_turn: MultiTurn,
    pub prefix_caching: bool,
    pub seed: u64,
    /// Entry writes in flight at once; 0: unlimited.
    pub max_concurrent_allocs: u32,
    /// Completed requests that end the run; 0: it runs for `duration`.
    pub max_requests: u64,
    pub storage: StorageTier,
    /// A modelled GPU tier (a capacity and bandwidth budget, no bytes moved).
    pub gpu_tier: bool,
    pub gpu_bandwidth_gbps: f64,
    /// Where the CPU tier's files go (a RAM-backed file system).
    pub cpu_tier_dir: PathBuf,
    pub direct_io: bool,
    pub fsync: bool,
    pub decode_reads: DecodeReads,
    pub personas: PersonaSet,
    pub workers: Option<u32>,
    pub rag: bool,
    /// Documents of the RAG corpus.
    pub rag_docs: u32,
    pub dataset_path: Option<PathBuf>,
    pub max_conversations: usize,
    /// A BurstGPT log to replay (not with a dataset).
    pub burst_trace: Option<PathBuf>,
    /// The log's times are divided by this; 0: no waiting.
    pub trace_speedup: f64,
    pub replay_cycles: u32,
    /// Submissions per second over all users; 0: as fast as users send.
    pub request_rate: f64,
    pub io_trace_log: Option<PathBuf>,
    pub record: Option<PathBuf>,
    /// The autoscaler's mode; `None`: a fixed user count.
    pub autoscale: Option<AutoscaleMode>,
    /// Storage saturation the qos mode aims at, 0–1.
    pub target_saturation: f64,
    pub autoscale_interval: Duration,
    /// The JSON report; `benchmark_results_<local time>.json` when not given.
    pub output: Option<PathBuf>,
    pub xlsx_output: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// The results row as Parquet.
    pub parquet: Option<PathBuf>,
    /// This process's place in a run of many: its seed is `seed` + rank, its files and
    /// cache directory carry the rank, its users' entries are its own.
    pub rank: Option<Rank>,
    /// Names the run (a launcher's job id or a name the user gives): the default key prefix
    /// of a cluster storage tier, so ranks of one run share keys and runs do not.
    pub run_id: Option<String>,
    /// The MLPerf Option and trial this run is, said in its results.
    pub mlperf: Option<MlperfTrial>,
    /// How the storage tier's reads, writes and deletes are made.
    pub storage_io: L2Io,
}

/// Where the storage tier keeps its entries.
#[derive(Clone, Debug, PartialEq)]
pub enum StorageTier {
    /// Files under the cache directory, holding this many GiB; 0: 95 % of the free space.
    Files { capacity_gb: f64 },
    /// A cluster every rank shares; its capacity is the cluster's maxmemory.
    Cluster(ClusterSpec),
    /// One object per entry in an S3-compatible bucket; its capacity is the bucket's.
    Object(S3Location),
}

impl StorageTier {
    /// Reads `--storage-tier`: `{"type":"resp-cluster",...}` or `{"type":"s3",...}`, as
    /// replay's L2 adapters are written; any other tier type is refused (files under the
    /// cache directory are the default storage tier).
    pub fn parse(text: &str) -> Result<StorageTier, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| kvtrace_io::error::json_reason(&e))?;
        match L2Config::from_adapter(&v)?.backend {
            BackendConfig::RespCluster { nodes, .. } => Ok(StorageTier::Cluster(ClusterSpec {
                nodes,
                prefix: v.get("prefix").and_then(|p| p.as_str()).map(str::to_owned),
            })),
            BackendConfig::S3(location) => Ok(StorageTier::Object(location)),
            _ => Err(
                "bench's storage tier is files under the cache directory, a \
                 \"resp-cluster\" or an \"s3\" bucket"
                    .into(),
            ),
        }
    }
}

/// A `resp-cluster` storage tier, written as replay's L2 adapters are.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSpec {
    pub nodes: Vec<String>,
    /// `None`: `kvtrace-bench-<run id>`.
    pub prefix: Option<String>,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            model: DEFAULT_MODEL,
            users: 100,
            duration: Duration::from_secs(60),
            gpu_mem_gb: 16.0,
            num_gpus: 1,
            tensor_parallel: 1,
            cpu_mem_gb: 32.0,
            cache_dir: None,
            generation: Generation::Realistic,
            profile: Profile::Latency,
            multi_turn: MultiTurn::AllPrevious,
            prefix_caching: true,
            seed: 0,
            max_concurrent_allocs: 0,
            max_requests: 0,
            storage: StorageTier::Files { capacity_gb: 0.0 },
            gpu_tier: false,
            gpu_bandwidth_gbps: 25.0,
            cpu_tier_dir: PathBuf::from("/dev/shm"),
            direct_io: false,
            fsync: true,
            decode_reads: DecodeReads::Amplified,
            personas: PersonaSet::Current,
            workers: None,
            rag: false,
            rag_docs: 10,
            dataset_path: None,
            max_conversations: 500,
            burst_trace: None,
            trace_speedup: 1.0,
            replay_cycles: 0,
            request_rate: 0.0,
            io_trace_log: None,
            record: None,
            autoscale: None,
            target_saturation: 0.8,
            autoscale_interval: Duration::from_secs(10),
            output: None,
            xlsx_output: None,
            csv: None,
            parquet: None,
            rank: None,
            run_id: None,
            mlperf: None,
            storage_io: L2Io::Synchronous,
        }
    }
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

/// A directory that removes itself when the run ends, interrupted or not.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for this run's `tier` under `parent`. One per tier, even when both
/// flags name the same parent: two tiers in one directory would hold an entry under one
/// path, and a demotion's delete of the source would remove the copy it just wrote. A rank
/// names itself too: ranks on many hosts may share `parent`, and process ids repeat there.
/// Before it, the directories of `tier` a bench that is no longer running left under
/// `parent` (killed before it could remove them) are removed, each with a line in `notes`.
/// `parent` must exist: a mistyped path is not created.
fn run_dir(
    parent: &Path,
    tier: &str,
    rank: Option<&Rank>,
    notes: &mut Vec<String>,
) -> Result<RunDir> {
    if !parent.is_dir() {
        return Err(Error::usage(format!(
            "{}: no such directory (the {tier} directory goes inside an existing one)",
            parent.display()
        )));
    }
    // `parent/kvtrace-bench-[RANK-]PID-TIER` directories whose PID is not running.
    let suffix = format!("-{tier}");
    notes.extend(remove_dead_leftovers(
        parent,
        Leftover::Dir,
        "kvtrace bench process",
        |name| {
            name.strip_prefix("kvtrace-bench-")?
                .strip_suffix(&suffix)?
                .rsplit('-')
                .next()?
                .parse()
                .ok()
        },
    ));
    let rank = rank
        .map(|r| format!("{}-", r.dir_name()))
        .unwrap_or_default();
    let dir = parent.join(format!("kvtrace-bench-{rank}{}-{tier}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| Error::io("cannot create", e).in_file(dir.display()))?;
    Ok(RunDir(dir))
}

/// GiB to bytes; a size the caller did not check (negative, not finite) is 0.
fn gib(v: f64) -> u64 {
    (v * GIB) as u64
}

/// The storage tier's parent directory: created when missing, never a system directory.
fn cache_parent(setup: &Setup) -> Result<PathBuf> {
    let parent = setup.cache_dir.clone().unwrap_or_else(std::env::temp_dir);
    let s = parent.display().to_string();
    let root = parent.canonicalize().is_ok_and(|p| p == Path::new("/"));
    if root
        || SYSTEM_DIRS
            .iter()
            .any(|d| s == *d || s.starts_with(&format!("{d}/")))
    {
        return Err(Error::usage(format!(
            "{s}: a system directory; the storage tier's files go elsewhere"
        )));
    }
    if parent.exists() && !parent.is_dir() {
        return Err(Error::usage(format!(
            "{s}: not a directory (the storage tier's files go in one)"
        )));
    }
    kvtrace_io::output::create_dir(&parent)?;
    Ok(parent)
}

/// A run, checked and set up, ready to start.
pub struct Plan {
    config: BenchConfig,
    cache: TierCache,
    io_log: Option<(Arc<IoLog>, PathBuf)>,
    /// The recording's path and the configuration its header describes.
    record: Option<(PathBuf, StorageConfig)>,
    /// Where the JSON report goes.
    output: PathBuf,
    /// Every report to write, its path checked before the run.
    outputs: Vec<(&'static dyn Exporter, Target)>,
    parameters: RunParameters,
    profile: Profile,
    rank: Option<Rank>,
    mlperf: Option<MlperfTrial>,
    /// The seed before the rank was added.
    base_seed: u64,
    /// Dropped after the run, removing the tiers' files.
    _dirs: Vec<RunDir>,
    /// Where each served request goes as a span tree.
    spans: Option<Arc<dyn SpanSink>>,
    /// What the user should know before the run starts.
    pub warnings: Vec<String>,
}

/// A finished run.
pub struct Finished {
    pub report: BenchReport,
    /// Where the JSON report went.
    pub results: PathBuf,
    /// What `--record` wrote.
    pub recordings: Vec<SubscriberReport>,
}

/// The Parquet slot of the outputs: the exporter writing the results row to `path`, or, not
/// asked, no target (and any exporter, which `outputs` then skips). A build without the
/// `parquet` feature refuses it in one line.
fn parquet_output(path: Option<PathBuf>) -> Result<(&'static dyn Exporter, Option<Target>)> {
    let Some(path) = path else {
        return Ok((&Csv, None));
    };
    #[cfg(feature = "parquet")]
    return Ok((&kvtrace_columnar::Parquet, Some(Target::File(path))));
    #[cfg(not(feature = "parquet"))]
    {
        let _ = path;
        Err(Error::usage(
            "a Parquet output needs kvtrace built with the parquet feature",
        ))
    }
}

impl Plan {
    pub fn new(setup: &Setup) -> Result<Plan> {
        let o = setup;
        let model = o.model;
        let users = o.users;
        // Entries are divided by it.
        let tp = o.tensor_parallel.max(1);
        let num_gpus = o.num_gpus;
        let gpu_bytes = gib(o.gpu_mem_gb).saturating_mul(u64::from(num_gpus));
        let cpu_bytes = gib(o.cpu_mem_gb);
        let per_rank = |p: &Path| {
            o.rank
                .as_ref()
                .map_or_else(|| p.to_owned(), |r| r.file_name(p))
        };
        let output = per_rank(
            &o.output
                .clone()
                .unwrap_or_else(|| format!("benchmark_results_{}.json", local_stamp()).into()),
        );
        let outputs = kvtrace_report::outputs([
            (&Json, Some(Target::File(output.clone()))),
            (
                &Xlsx,
                o.xlsx_output.as_deref().map(|p| Target::File(per_rank(p))),
            ),
            (&Csv, o.csv.as_deref().map(|p| Target::File(per_rank(p)))),
            parquet_output(o.parquet.as_deref().map(per_rank))?,
        ])?;
        let autoscale = autoscale(o, users);
        let dataset = dataset(o)?;
        let burst = burst(o)?;
        let mut warnings = dataset.1;
        let parent = cache_parent(o)?;
        let storage_dir = run_dir(&parent, "cache", o.rank.as_ref(), &mut warnings)?;
        let storage = match &o.storage {
            StorageTier::Cluster(cluster) => {
                let prefix = cluster.prefix.clone().unwrap_or_else(|| {
                    let run = o.run_id.clone().unwrap_or_else(|| {
                        format!(
                            "{}-{}",
                            std::process::id(),
                            kvtrace_cache::clock::wall_secs() as u64
                        )
                    });
                    format!("kvtrace-bench-{run}")
                });
                Storage::Cluster {
                    store: cluster_store(&cluster.nodes, &prefix)?,
                    nodes: cluster.nodes.clone(),
                    prefix,
                }
            }
            StorageTier::Object(location) => Storage::Object {
                store: object_store(location)?,
                location: location.clone(),
            },
            StorageTier::Files { capacity_gb } => Storage::Files(match gib(*capacity_gb) {
                0 => free_bytes(&storage_dir.0).map_or(u64::MAX, |b| b / 20 * 19),
                bytes => bytes,
            }),
        };
        let mut specs = Vec::new();
        if o.gpu_tier {
            specs.push(TierSpec {
                kind: TierKind::Gpu,
                capacity: Some(gpu_bytes),
                store: TierStore::Modelled {
                    gbps: o.gpu_bandwidth_gbps,
                },
            });
        }
        let mut dirs = vec![];
        if cpu_bytes > 0 {
            let d = run_dir(&o.cpu_tier_dir, "cpu-tier", o.rank.as_ref(), &mut warnings)?;
            let room = free_bytes(&d.0).into_iter().chain(available_memory()).min();
            if let Some(room) = room.filter(|&r| cpu_bytes > r) {
                warnings.push(format!(
                    "the CPU tier's {} GiB: {} has room for {:.1} GiB; the CPU tier will fail its writes past that",
                    short(o.cpu_mem_gb),
                    o.cpu_tier_dir.display(),
                    room as f64 / GIB
                ));
            }
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
            dirs.push(d);
        }
        specs.push(TierSpec {
            kind: TierKind::Storage,
            capacity: storage.capacity(),
            store: match &storage {
                Storage::Files(_) => TierStore::Files {
                    dir: storage_dir.0.clone(),
                    mode: FileMode {
                        direct: o.direct_io,
                        fsync: o.fsync,
                        drop_cache_before_read: true,
                    },
                },
                Storage::Cluster { store, .. } | Storage::Object { store, .. } => store.clone(),
            },
        });
        if o.io_trace_log.is_some() {
            for spec in &mut specs {
                spec.store = TierStore::Null;
            }
        }
        let mut cache = TierCache::with_storage_io(specs, o.storage_io)
            .map_err(|e| Error::io("cannot set up the tiers", e))?;
        let io_log = match &o.io_trace_log {
            Some(path) => {
                let path = per_rank(path);
                let log = Arc::new(IoLog::create(&path)?);
                cache = cache.with_log(Arc::clone(&log));
                Some((log, path))
            }
            None => None,
        };
        let seed = o.rank.as_ref().map_or(o.seed, |r| r.seed(o.seed));
        let config = BenchConfig {
            model,
            users,
            workers: o.workers.unwrap_or(users.min(500)).max(1),
            duration: o.duration,
            max_requests: o.max_requests,
            seed,
            personas: o.personas,
            multi_turn: o.multi_turn,
            prefix_caching: o.prefix_caching,
            system_prompt_tokens: [512, 1024, 2048],
            generation_ms_per_token: o.generation.ms_per_token(),
            decode_reads: o.decode_reads,
            max_concurrent_allocs: o.max_concurrent_allocs,
            tensor_parallel: tp,
            autoscale,
            dataset: dataset.0,
            burst,
            rag: o.rag.then(|| {
                let large = model.hidden >= 8192 || model.layers >= 64;
                Corpus::new(o.seed, o.rag_docs, large)
            }),
            replay_cycles: o.replay_cycles,
            request_rate: o.request_rate,
            user_scope: o
                .rank
                .as_ref()
                .map(|r| format!("{}/", r.dir_name()))
                .unwrap_or_default(),
        };
        let record = o
            .record
            .as_ref()
            .map(|path| {
                recorded_config(&config, cpu_bytes, &storage.adapter(&storage_dir.0))
                    .map(|c| (per_rank(path), c))
            })
            .transpose()?;
        let parameters = RunParameters {
            timestamp: local_stamp(),
            model: config.model.name.into(),
            num_users: users,
            duration_s: o.duration.as_secs_f64(),
            gpu_mem_per_card_gib: o.gpu_mem_gb,
            num_gpus,
            tensor_parallel: tp,
            total_gpu_mem_gib: if o.gpu_tier {
                gpu_bytes as f64 / GIB
            } else {
                0.0
            },
            cpu_mem_gib: o.cpu_mem_gb,
            generation_mode: o.generation.name(),
            performance_profile: o.profile.name(),
            multi_turn: config.multi_turn != MultiTurn::Off,
            prefix_caching: config.prefix_caching,
            rag: config.rag.is_some(),
            autoscaling: config.autoscale.is_some(),
            seed: config.seed,
            max_concurrent_allocs: o.max_concurrent_allocs,
            request_rate: config.request_rate,
            max_requests: config.max_requests,
            dataset_path: o.dataset_path.as_ref().map(|p| p.display().to_string()),
            cache_dir: match &storage {
                Storage::Files(_) => parent.display().to_string(),
                Storage::Cluster { nodes, .. } => format!("resp-cluster {}", nodes.join(",")),
                Storage::Object { location, .. } => format!(
                    "s3 {} bucket {}",
                    location.endpoint.as_deref().unwrap_or("(AWS)"),
                    location.bucket
                ),
            },
            storage_capacity_gib: storage.capacity().unwrap_or(0).min(u64::MAX / 2) as f64 / GIB,
            trace_speedup: config.burst.as_ref().map_or(1.0, |b| b.speedup),
            replay_cycles: config.replay_cycles,
        };
        dirs.push(storage_dir);
        Ok(Plan {
            config,
            cache,
            io_log,
            record,
            output,
            outputs,
            parameters,
            profile: o.profile,
            rank: o.rank.clone(),
            mlperf: o.mlperf.clone(),
            base_seed: o.seed,
            _dirs: dirs,
            warnings,
            spans: None,
        })
    }

    /// Sends each served request to `sink` as a span tree.
    pub fn export_spans(&mut self, sink: Arc<dyn SpanSink>) {
        self.spans = Some(sink);
    }

    /// The resource attributes that say which run spans come from.
    pub fn span_resource(&self) -> Vec<(String, String)> {
        let mut attributes = vec![
            ("kvtrace.command".to_owned(), "bench".to_owned()),
            (
                "kvtrace.model".to_owned(),
                self.config.model.name.to_owned(),
            ),
            ("kvtrace.seed".to_owned(), self.config.seed.to_string()),
            ("kvtrace.users".to_owned(), self.config.users.to_string()),
        ];
        if let Some(rank) = &self.rank {
            attributes.push(("kvtrace.rank".to_owned(), rank.rank.to_string()));
            attributes.push(("kvtrace.world_size".to_owned(), rank.world_size.to_string()));
        }
        attributes
    }

    pub fn duration_s(&self) -> f64 {
        self.config.duration.as_secs_f64()
    }

    /// Runs, writes the reports (the JSON always; XLSX and CSV when asked), and removes the
    /// tiers' files. `progress` hears the elapsed seconds, the requests done and the tier
    /// hierarchy (whose counters it may read; each read takes the hierarchy's lock).
    pub fn run(self, progress: &mut (dyn FnMut(f64, u64, &TierCache) + Send)) -> Result<Finished> {
        let per_token =
            self.config.model.bytes_per_token() / u64::from(self.config.tensor_parallel);
        let bus: Option<EventBus> = match &self.record {
            Some((path, storage)) => Some(start_recording(path, storage, false)?),
            None => None,
        };
        let calls = CallTrace::new(
            bus.as_ref().map_or_else(Tracer::disabled, EventBus::tracer),
            self.config.model.name,
            per_token,
        )
        .with_spans(self.spans.clone());
        let started_unix_s = kvtrace_cache::clock::wall_secs();
        let cache = &self.cache;
        let outcome = run(&self.config, cache, &calls, &mut |elapsed, done| {
            progress(elapsed, done, cache)
        })?;
        let finished_unix_s = kvtrace_cache::clock::wall_secs();
        drop(calls);
        let recordings = match bus {
            Some(bus) => bus.close()?,
            None => Vec::new(),
        };
        if let Some((log, path)) = &self.io_log {
            log.finish()
                .map_err(|e| Error::io("cannot write", e).in_file(path.display()))?;
        }
        // Queued storage calls finish before the tiers are counted; the drain is timed.
        self.cache.drain_storage();
        let tiers = self.cache.counters();
        let mut report = BenchReport::build(ReportInput {
            config: &self.config,
            outcome: &outcome,
            tiers: &tiers,
            demotions: &self.cache.demotion_times(),
            storage_io: self.cache.storage_io(),
            profile: self.profile,
            parameters: self.parameters.clone(),
        });
        report.kvtrace.rank = self.rank.clone().map(|rank| RankWindow {
            rank,
            base_seed: self.base_seed,
            started_unix_s,
            finished_unix_s,
        });
        report.kvtrace.mlperf = self.mlperf;
        for (exporter, target) in &self.outputs {
            kvtrace_report::write(&report, *exporter, target, "")?;
        }
        Ok(Finished {
            report,
            results: self.output,
            recordings,
        })
    }
}

/// The configuration a recording's header describes: the run's tiers as a waterfall
/// hierarchy, the CPU tier as L1 (raised to hold the largest entry the run can write, since
/// a StorageManager admits through L1) and the storage tier as a file L2.
fn recorded_config(
    config: &BenchConfig,
    cpu_bytes: u64,
    l2: &serde_json::Value,
) -> Result<StorageConfig> {
    let per_token = config.model.bytes_per_token() / u64::from(config.tensor_parallel);
    Ok(StorageConfig {
        l1_size_bytes: cpu_bytes.max(per_token * config.personas.max_context_tokens()),
        l1_buffers: false,
        placement: Placement::Waterfall,
        eviction: EvictionConfig {
            timing: EvictionTiming::Immediate,
            ..EvictionConfig::default()
        },
        l2: vec![L2Config::from_adapter(l2).map_err(Error::usage)?],
        ..StorageConfig::default()
    })
}

/// The storage tier: files of a capacity, or a shared cluster.
enum Storage {
    Files(u64),
    Cluster {
        store: TierStore,
        nodes: Vec<String>,
        prefix: String,
    },
    Object {
        store: TierStore,
        location: S3Location,
    },
}

impl Storage {
    /// The tier's capacity; a cluster's is its own maxmemory, not this process's to hold.
    fn capacity(&self) -> Option<u64> {
        match self {
            Storage::Files(bytes) => Some(*bytes),
            Storage::Cluster { .. } | Storage::Object { .. } => None,
        }
    }

    /// The tier as a replay `--l2-adapter` (what a recording's header says).
    fn adapter(&self, dir: &Path) -> serde_json::Value {
        match self {
            Storage::Files(bytes) => serde_json::json!({
                "type": "fs",
                "path": dir.display().to_string(),
                "capacity_gb": (*bytes).min(1 << 60) as f64 / GIB,
            }),
            Storage::Cluster { nodes, prefix, .. } => serde_json::json!({
                "type": "resp-cluster",
                "nodes": nodes,
                "prefix": prefix,
            }),
            Storage::Object { location, .. } => serde_json::json!({
                "type": "s3",
                "endpoint": location.endpoint,
                "bucket": location.bucket,
                "prefix": location.prefix,
                "region": location.region,
            }),
        }
    }
}

#[cfg(feature = "redis")]
fn cluster_store(nodes: &[String], prefix: &str) -> Result<TierStore> {
    super::cluster::ClusterStore::connect(nodes, prefix)
        .map(|c| TierStore::Cluster(Arc::new(c)))
        .map_err(|e| Error::io("the resp-cluster storage tier", e))
}

#[cfg(not(feature = "redis"))]
fn cluster_store(nodes: &[String], _: &str) -> Result<TierStore> {
    Err(Error::usage(format!(
        "the resp-cluster storage tier at {} needs a kvtrace built with the `redis` feature",
        nodes.join(",")
    )))
}

#[cfg(feature = "s3")]
fn object_store(location: &S3Location) -> Result<TierStore> {
    kvtrace_cache::storage::s3::S3Client::connect(location)
        .map(|c| TierStore::Object(Arc::new(c)))
        .map_err(|e| Error::io("the s3 storage tier", e))
}

#[cfg(not(feature = "s3"))]
fn object_store(location: &S3Location) -> Result<TierStore> {
    Err(Error::usage(format!(
        "the s3 storage tier of bucket {} needs a kvtrace built with the `s3` feature",
        location.bucket
    )))
}

/// The BurstGPT log, when one is given.
fn burst(o: &Setup) -> Result<Option<BurstReplay>> {
    let Some(path) = &o.burst_trace else {
        return Ok(None);
    };
    if o.dataset_path.is_some() {
        return Err(Error::usage(
            "a run sends a ShareGPT dataset's requests or a BurstGPT log's, not both",
        ));
    }
    Ok(Some(BurstReplay {
        rows: Arc::new(burst::load(path)?),
        speedup: o.trace_speedup,
    }))
}

/// The ShareGPT dataset, if one is given, and what could not be paired.
fn dataset(o: &Setup) -> Result<(Option<Arc<Dataset>>, Vec<String>)> {
    let Some(path) = &o.dataset_path else {
        return Ok((None, Vec::new()));
    };
    let d = sharegpt::load(path, o.max_conversations)?;
    let warnings = d
        .warning()
        .map(|w| format!("{}: {w}", path.display()))
        .into_iter()
        .collect();
    if d.conversations.is_empty() {
        return Err(Error::usage(format!(
            "{}: none of its {} conversations has a human message followed by a gpt message",
            path.display(),
            d.read
        )));
    }
    Ok((Some(Arc::new(d)), warnings))
}

fn autoscale(o: &Setup, users: u32) -> Option<AutoscaleConfig> {
    o.autoscale.map(|mode| AutoscaleConfig {
        mode,
        target_saturation: o.target_saturation,
        interval_s: o.autoscale_interval.as_secs_f64(),
        max_users: users.max(MAX_WORKERS),
    })
}

impl BenchReport {
    /// A line saying the storage failed, when it did: the figures of such a run are not the
    /// storage's.
    pub fn storage_failure(&self) -> Option<String> {
        let k = &self.kvtrace;
        if k.io_errors + k.failed_demotions == 0 {
            return None;
        }
        let first = k
            .first_io_error
            .as_ref()
            .map(|e| format!("; first: {e}"))
            .unwrap_or_default();
        Some(format!(
            "storage I/O failed: {} failed read(s) or write(s), {} failed demotion(s) (entries dropped){first}",
            k.io_errors, k.failed_demotions
        ))
    }
}
