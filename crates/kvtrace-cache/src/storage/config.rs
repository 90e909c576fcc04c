//! The storage configuration, with LMCache's option names and defaults, and its JSON in the
//! shape LMCache 0.5.6 records, so that a replay with the recording's flags reports a digest
//! `match` instead of LMCache's perpetual MISMATCH.

use kvtrace_io::error::short;
use serde_json::{json, Value as Json};

use super::eviction::PolicyKind;
use super::file::FsyncPolicy;

/// LMCache's L1 eviction controller sleeps one second between passes and each pass adds
/// its own run time: the passes of the reference recordings came 1.0004–1.0016 s apart.
pub const DEFAULT_EVICTION_INTERVAL_S: f64 = 1.001;

/// When eviction runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EvictionTiming {
    /// At `phase_s + k × interval_s` of trace time (k = 1, 2, …), as LMCache's controller
    /// thread does from its start: bursts between passes can fail with OUT_OF_MEMORY. The
    /// phase is when the controller started relative to the trace's time origin, which a
    /// trace does not record (replay estimates it; see `replay::phase`).
    Periodic { interval_s: f64, phase_s: f64 },
    /// When an allocation does not fit: exactly as many victims as it needs, one at a time
    /// by policy (kvtrace's what-if timing; no watermark).
    Immediate,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    pub policy: PolicyKind,
    /// Usage fraction that triggers eviction (LMCache: 0.8).
    pub trigger_watermark: f64,
    /// Fraction of the capacity freed per eviction (LMCache: 0.2).
    pub eviction_ratio: f64,
    pub timing: EvictionTiming,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        EvictionConfig {
            policy: PolicyKind::Lru,
            trigger_watermark: 0.8,
            eviction_ratio: 0.2,
            timing: EvictionTiming::Periodic {
                interval_s: DEFAULT_EVICTION_INTERVAL_S,
                phase_s: 0.0,
            },
        }
    }
}

/// What happens to an object written to L1 (`--l2-store-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorePolicy {
    /// Store to every L2 and keep it in L1.
    Default,
    /// Store to every L2, then drop it from L1 (L1 as a write buffer).
    SkipL1,
}

/// What happens to objects a prefetch loaded from L2 (`--l2-prefetch-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchPolicy {
    /// Loaded objects leave L1 once their readers are done.
    Default,
    /// Loaded objects stay in L1.
    Retain,
}

/// How objects reach the L2 tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// LMCache: every admitted object is stored to every L2 tier at once.
    WriteThrough,
    /// MLPerf Storage's KV-cache benchmark: objects enter L1 only; what L1 evicts is moved
    /// down one tier, and each non-terminal tier keeps itself under 80 % of its capacity by
    /// moving its least recently used objects further down; only the last tier drops data.
    Waterfall,
}

/// How the L2 tiers' backend calls run. The cache's decisions (what is resident, what hits)
/// are the same either way; only when the bytes move differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L2Io {
    /// Each read, write and delete completes inside the manager call that causes it.
    Synchronous,
    /// Each tier's calls go through `workers` threads, each with its own backend connection
    /// and a share of `depth` queued calls; a call beyond that waits for room (as a server's
    /// store tasks wait for its thread pool). A key is always served by the same worker, so
    /// its write, reads and delete keep their order.
    Asynchronous { depth: u32, workers: u32 },
}

/// The largest queue depth and worker count an asynchronous tier takes.
pub const MAX_L2_IO_DEPTH: u32 = 1 << 16;
pub const MAX_L2_IO_WORKERS: u32 = 256;

/// Default depth and workers of asynchronous L2 I/O.
const DEFAULT_L2_IO_DEPTH: u32 = 64;
const DEFAULT_L2_IO_WORKERS: u32 = 4;

impl L2Io {
    /// An asynchronous mode, its figures checked: `depth` 1..=[`MAX_L2_IO_DEPTH`], `workers`
    /// 1..=[`MAX_L2_IO_WORKERS`] and at most `depth`.
    pub fn asynchronous(depth: u32, workers: u32) -> Result<L2Io, String> {
        if !(1..=MAX_L2_IO_DEPTH).contains(&depth) {
            return Err(format!("queue depth {depth}: from 1 to {MAX_L2_IO_DEPTH}"));
        }
        if !(1..=MAX_L2_IO_WORKERS.min(depth)).contains(&workers) {
            return Err(format!(
                "{workers} workers: from 1 to {} and at most the queue depth ({depth})",
                MAX_L2_IO_WORKERS
            ));
        }
        Ok(L2Io::Asynchronous { depth, workers })
    }

    /// The mode's name in reports: `synchronous` or `asynchronous`.
    pub fn name(self) -> &'static str {
        match self {
            L2Io::Synchronous => "synchronous",
            L2Io::Asynchronous { .. } => "asynchronous",
        }
    }

    /// Asynchronous I/O with the `depth` and `workers` given, the others taken from this
    /// mode (the defaults where it is synchronous); a depth below the workers not given
    /// takes as many workers as it has room for. What the flags and the TOML file both ask.
    pub fn asynchronous_with(
        self,
        depth: Option<u32>,
        workers: Option<u32>,
    ) -> Result<L2Io, String> {
        let (was_depth, was_workers) = match self {
            L2Io::Asynchronous { depth, workers } => (depth, workers),
            L2Io::Synchronous => (DEFAULT_L2_IO_DEPTH, DEFAULT_L2_IO_WORKERS),
        };
        let depth = depth.unwrap_or(was_depth);
        let workers = workers.unwrap_or(was_workers.min(depth.max(1)));
        L2Io::asynchronous(depth, workers)
    }
}

/// Where an `s3` tier keeps its objects. Its credentials are not here: they come from the
/// environment, as the AWS tools read them.
#[derive(Clone, Debug, PartialEq)]
pub struct S3Location {
    /// `http(s)://host[:port]` of an S3-compatible server; `None` for AWS S3 itself.
    pub endpoint: Option<String>,
    pub bucket: String,
    /// The objects' common name prefix (a "directory" of the bucket).
    pub prefix: String,
    /// The signing region; `None`: `AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
}

/// The backend kinds a tier can use.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendConfig {
    /// Real zero-filled buffers (`buffers: true`) or sizes only.
    Memory {
        buffers: bool,
    },
    /// One file per object under `dir`.
    File {
        dir: std::path::PathBuf,
        direct: bool,
        fsync: FsyncPolicy,
    },
    /// A Redis or Valkey server; objects live under `<prefix>:<key hash>`.
    Redis {
        url: String,
        prefix: String,
    },
    /// A Redis Cluster or Valkey cluster every rank of a run shares; objects live under
    /// `<prefix>:<key hash>`, spread over the cluster's slots. `nodes` are seed nodes: the
    /// rest of the cluster is learnt from them.
    RespCluster {
        nodes: Vec<String>,
        prefix: String,
    },
    /// An S3-compatible object store; objects live under `<prefix>/<key hash>`.
    S3(S3Location),
    /// A GPU memory budget: holds no bytes, charges `size / bandwidth` per transfer.
    Gpu {
        bandwidth_gbps: f64,
    },
    Null,
}

/// Host-to-device bandwidth a `gpu` tier assumes unless told otherwise: PCIe 4.0 x16 in
/// practice, GB/s.
pub const DEFAULT_GPU_BANDWIDTH_GBPS: f64 = 25.0;

/// The bandwidths a `gpu` tier accepts, GB/s: from 1 KB/s, below which one chunk's transfer
/// outlasts any run (and `size / bandwidth` overflows a duration), to 1 PB/s.
pub const GPU_BANDWIDTH_RANGE_GBPS: (f64, f64) = (1e-6, 1e6);

/// A GPU tier's bandwidth from its description, inside [`GPU_BANDWIDTH_RANGE_GBPS`].
fn gpu_bandwidth(v: Option<f64>, field: &str) -> Result<f64, String> {
    match v {
        None => Ok(DEFAULT_GPU_BANDWIDTH_GBPS),
        Some(b) => check_gpu_bandwidth(b, field),
    }
}

fn check_gpu_bandwidth(b: f64, field: &str) -> Result<f64, String> {
    let (low, high) = GPU_BANDWIDTH_RANGE_GBPS;
    if b.is_finite() && (low..=high).contains(&b) {
        Ok(b)
    } else {
        Err(format!("{field} {b}: must be from {low} to {high} GB/s"))
    }
}

/// One L2 tier.
#[derive(Clone, Debug, PartialEq)]
pub struct L2Config {
    pub backend: BackendConfig,
    /// `None`: unbounded.
    pub capacity_bytes: Option<u64>,
    pub policy: PolicyKind,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StorageConfig {
    pub l1_size_bytes: u64,
    /// L1 allocations are rounded up to this (a power of two; LMCache's `align_bytes`).
    pub l1_align_bytes: u64,
    /// Keep real L1 buffers; off for traces bigger than RAM.
    pub l1_buffers: bool,
    /// Write each object's pages as it is placed in the real buffers, as a server's copy of
    /// its KV data would, so that the pool becomes resident; off by default, as in LMCache's
    /// replay, which allocates its pool and never writes it (a storage trace carries no KV
    /// bytes).
    pub l1_touch_pages: bool,
    /// L1 is a GPU budget with this host-to-device bandwidth (GB/s) instead of host memory:
    /// the top tier of a GPU → CPU → disk waterfall on a machine without a GPU.
    pub l1_gpu_bandwidth_gbps: Option<f64>,
    pub eviction: EvictionConfig,
    pub l2: Vec<L2Config>,
    pub placement: Placement,
    pub store_policy: StorePolicy,
    pub prefetch_policy: PrefetchPolicy,
    pub prefetch_max_in_flight: u64,
    pub write_ttl_s: f64,
    pub read_ttl_s: f64,
    pub l2_io: L2Io,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            l1_size_bytes: 1 << 30,
            l1_align_bytes: 4096,
            l1_buffers: true,
            l1_touch_pages: false,
            l1_gpu_bandwidth_gbps: None,
            eviction: EvictionConfig::default(),
            l2: Vec::new(),
            placement: Placement::WriteThrough,
            store_policy: StorePolicy::Default,
            prefetch_policy: PrefetchPolicy::Default,
            prefetch_max_in_flight: 8,
            write_ttl_s: 600.0,
            read_ttl_s: 300.0,
            l2_io: L2Io::Synchronous,
        }
    }
}

impl StorageConfig {
    /// Checks the values a recorded header may carry that would make the model meaningless
    /// (a header is data: the reader refuses it rather than clamping it): every GPU tier's
    /// bandwidth within [`GPU_BANDWIDTH_RANGE_GBPS`].
    pub fn check_recorded(&self) -> Result<(), String> {
        if let Some(b) = self.l1_gpu_bandwidth_gbps {
            check_gpu_bandwidth(b, "kvtrace_l1_gpu_bandwidth_gbps")?;
        }
        for tier in &self.l2 {
            if let BackendConfig::Gpu { bandwidth_gbps } = tier.backend {
                check_gpu_bandwidth(bandwidth_gbps, "kvtrace_tier.bandwidth_gbps")?;
            }
        }
        Ok(())
    }
}

impl StorageConfig {
    /// The configuration as LMCache 0.5.6's `StorageManagerConfig` serialises it (format spec
    /// §4.3). Fields kvtrace does not model keep LMCache's defaults; `shm_name` is `""` as a
    /// server started without `--shm-name` records it. kvtrace-only settings (FIFO/LFU,
    /// immediate eviction, L2 tiers) appear under keys LMCache never writes, so they change
    /// the digest exactly when they change behaviour.
    pub fn to_lmcache_json(&self) -> Json {
        let eviction = json!({
            "eviction_policy": self.eviction.policy.name(),
            "eviction_ratio": self.eviction.eviction_ratio,
            "extra_logging_enabled": false,
            "extra_logging_interval": 10.0,
            "trigger_watermark": self.eviction.trigger_watermark,
        });
        let l1 = json!({
            "eviction": eviction,
            "gds_l1_config": null,
            "memory_config": {
                "align_bytes": self.l1_align_bytes,
                "devdax_path": null,
                "devdax_size_in_bytes": 0,
                "init_size_in_bytes": self.l1_size_bytes,
                "shm_name": "",
                "size_in_bytes": self.l1_size_bytes,
                "use_hugepages": false,
                "use_lazy": false,
            },
            "read_ttl_seconds": ttl_json(self.read_ttl_s),
            "tag": "_default",
            "write_ttl_seconds": ttl_json(self.write_ttl_s),
        });
        let mut config = json!({
            "eviction_config": eviction,
            "l1_manager_config": l1,
            "l1_manager_configs": [l1],
            "l2_adapter_config": { "adapters": self.l2.iter().map(L2Config::to_json).collect::<Vec<_>>() },
            "periodic_notifier_interval_ms": 5,
            "prefetch_max_in_flight": self.prefetch_max_in_flight,
            "prefetch_policy": match self.prefetch_policy {
                PrefetchPolicy::Default => "default",
                PrefetchPolicy::Retain => "retain",
            },
            "store_policy": match self.store_policy {
                StorePolicy::Default => "default",
                StorePolicy::SkipL1 => "skip_l1",
            },
        });
        if self.placement == Placement::Waterfall {
            config["kvtrace_placement"] = json!("waterfall");
        }
        if let Some(bw) = self.l1_gpu_bandwidth_gbps {
            config["kvtrace_l1_gpu_bandwidth_gbps"] = json!(bw);
        }
        if !self.l1_buffers {
            config["kvtrace_l1_accounting_only"] = json!(true);
        } else if self.l1_touch_pages {
            config["kvtrace_l1_touch_pages"] = json!(true);
        }
        match self.eviction.timing {
            EvictionTiming::Immediate => config["kvtrace_eviction_timing"] = json!("immediate"),
            EvictionTiming::Periodic { interval_s, .. }
                if interval_s != DEFAULT_EVICTION_INTERVAL_S =>
            {
                config["kvtrace_eviction_interval_s"] = json!(interval_s)
            }
            EvictionTiming::Periodic { .. } => {}
        }
        config
    }
}

impl StorageConfig {
    /// The configuration a trace recorded, read back from its `sm_config_json`, as far as
    /// kvtrace models it. `None` when the text is empty or not LMCache's shape. L2 adapters
    /// are not read (LMCache records them as object reprs), and tiers that would touch the
    /// file system or the network (`fs`, `redis`) are never rebuilt from a header: a trace
    /// never chooses a path or a server. The returned list says what was left out.
    pub fn from_lmcache_json(text: &str) -> Option<(StorageConfig, Vec<String>)> {
        StorageConfig::read_lmcache_json(text).ok()
    }

    /// [`StorageConfig::from_lmcache_json`], saying why the text is no configuration: not
    /// JSON (a damaged header), or JSON without the L1 fields LMCache writes.
    pub fn read_lmcache_json(text: &str) -> Result<(StorageConfig, Vec<String>), String> {
        if text.trim().is_empty() {
            return Err("empty".into());
        }
        let v: Json = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
        let missing = |what: &str| format!("no {what}");
        let l1 = v
            .get("l1_manager_config")
            .ok_or_else(|| missing("l1_manager_config"))?;
        let memory = l1
            .get("memory_config")
            .ok_or_else(|| missing("l1_manager_config.memory_config"))?;
        let eviction = v
            .get("eviction_config")
            .or_else(|| l1.get("eviction"))
            .ok_or_else(|| missing("eviction_config"))?;
        let mut notes = Vec::new();
        let mut config = StorageConfig {
            l1_size_bytes: memory
                .get("size_in_bytes")
                .and_then(Json::as_u64)
                .ok_or_else(|| missing("unsigned l1_manager_config.memory_config.size_in_bytes"))?,
            ..StorageConfig::default()
        };
        if let Some(align) = memory.get("align_bytes").and_then(Json::as_u64) {
            if align.is_power_of_two() {
                config.l1_align_bytes = align;
            } else {
                notes.push(format!(
                    "recorded align_bytes {align} is not a power of two; using 4096"
                ));
            }
        }
        if let Some(p) = eviction.get("eviction_policy").and_then(Json::as_str) {
            match p.parse() {
                Ok(policy) => config.eviction.policy = policy,
                Err(_) => notes.push(format!(
                    "recorded eviction policy {p:?} is not modelled; using LRU"
                )),
            }
        }
        if let Some(w) = eviction.get("trigger_watermark").and_then(Json::as_f64) {
            config.eviction.trigger_watermark = w;
        }
        if let Some(r) = eviction.get("eviction_ratio").and_then(Json::as_f64) {
            config.eviction.eviction_ratio = r;
        }
        for (key, slot) in [
            ("read_ttl_seconds", &mut config.read_ttl_s),
            ("write_ttl_seconds", &mut config.write_ttl_s),
        ] {
            if let Some(t) = l1.get(key).and_then(Json::as_f64) {
                match seconds(key, t) {
                    Ok(t) => *slot = t,
                    Err(e) => notes.push(format!("recorded {e}; using {slot} s")),
                }
            }
        }
        if v.get("store_policy").and_then(Json::as_str) == Some("skip_l1") {
            config.store_policy = StorePolicy::SkipL1;
        }
        if v.get("prefetch_policy").and_then(Json::as_str) == Some("retain") {
            config.prefetch_policy = PrefetchPolicy::Retain;
        }
        if let Some(n) = v.get("prefetch_max_in_flight").and_then(Json::as_u64) {
            config.prefetch_max_in_flight = n;
        }
        if v.get("kvtrace_placement").and_then(Json::as_str) == Some("waterfall") {
            config.placement = Placement::Waterfall;
        }
        config.l1_gpu_bandwidth_gbps = v
            .get("kvtrace_l1_gpu_bandwidth_gbps")
            .and_then(Json::as_f64);
        config.l1_buffers = v.get("kvtrace_l1_accounting_only") != Some(&Json::Bool(true));
        config.l1_touch_pages = v.get("kvtrace_l1_touch_pages") == Some(&Json::Bool(true));
        if v.get("kvtrace_eviction_timing").and_then(Json::as_str) == Some("immediate") {
            config.eviction.timing = EvictionTiming::Immediate;
        } else if let Some(i) = v.get("kvtrace_eviction_interval_s").and_then(Json::as_f64) {
            config.eviction.timing = EvictionTiming::Periodic {
                interval_s: i,
                phase_s: 0.0,
            };
        }
        let adapters = v
            .pointer("/l2_adapter_config/adapters")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default();
        let ours: Option<Vec<L2Config>> = adapters.iter().map(L2Config::from_json).collect();
        match ours {
            Some(tiers) => {
                config.l2 = tiers;
                notes.extend(config.drop_external_tiers());
            }
            None => notes.push(format!(
                "the recording had {} L2 adapter(s) kvtrace cannot rebuild; {NAME_L2}",
                adapters.len()
            )),
        }
        Ok((config, notes))
    }
}

/// How a note of [`StorageConfig::from_lmcache_json`] about a recorded L2 tier it did not
/// rebuild ends: such notes say nothing new to a replay that names its own L2 tiers.
pub const NAME_L2: &str = "name the L2 tiers to replay against";

impl StorageConfig {
    /// Removes the L2 tiers that would touch the file system or the network (`fs`, `redis`)
    /// and says which, one note each. A trace header is data: its paths and URLs must never
    /// choose where a replay writes, so a recorded configuration keeps only its memory-only
    /// tiers and the user names the others by flag or config file.
    fn drop_external_tiers(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        let mut index = 0;
        self.l2.retain(|tier| {
            index += 1;
            let what = match &tier.backend {
                BackendConfig::File { dir, .. } => format!("an fs tier at {}", dir.display()),
                BackendConfig::Redis { url, prefix } => {
                    format!("a redis tier at {url} under prefix {prefix:?}")
                }
                BackendConfig::RespCluster { nodes, prefix } => format!(
                    "a resp-cluster tier at {} under prefix {prefix:?}",
                    nodes.join(",")
                ),
                BackendConfig::S3(at) => format!(
                    "an s3 tier at {} bucket {:?}",
                    at.endpoint.as_deref().unwrap_or("AWS"),
                    at.bucket
                ),
                _ => return true,
            };
            notes.push(format!(
                "recorded L2 tier {index} ({what}) was not rebuilt: a trace never chooses a path \
                 or a server; {NAME_L2}"
            ));
            false
        });
        notes
    }
}

/// LMCache stores the TTLs as ints when they are whole seconds.
fn ttl_json(seconds: f64) -> Json {
    if seconds.fract() == 0.0 && seconds.abs() < 1e15 {
        json!(seconds as i64)
    } else {
        json!(seconds)
    }
}

impl L2Config {
    /// Reads back what [`L2Config::to_json`] wrote; `None` for LMCache's own adapters.
    fn from_json(v: &Json) -> Option<L2Config> {
        let tier = v.get("kvtrace_tier")?;
        let backend = match tier.get("type")?.as_str()? {
            "memory" => BackendConfig::Memory {
                buffers: tier.get("buffers")?.as_bool()?,
            },
            "file" => BackendConfig::File {
                dir: tier.get("path")?.as_str()?.into(),
                direct: tier.get("direct")?.as_bool()?,
                fsync: match tier.get("fsync")?.as_str()? {
                    "every_write" => FsyncPolicy::EveryWrite,
                    _ => FsyncPolicy::Never,
                },
            },
            "redis" => BackendConfig::Redis {
                url: tier.get("url")?.as_str()?.to_owned(),
                prefix: tier.get("prefix")?.as_str()?.to_owned(),
            },
            "resp-cluster" => BackendConfig::RespCluster {
                nodes: tier
                    .get("nodes")?
                    .as_array()?
                    .iter()
                    .map(|n| n.as_str().map(str::to_owned))
                    .collect::<Option<_>>()?,
                prefix: tier.get("prefix")?.as_str()?.to_owned(),
            },
            "s3" => BackendConfig::S3(S3Location {
                endpoint: tier.get("endpoint")?.as_str().map(str::to_owned),
                bucket: tier.get("bucket")?.as_str()?.to_owned(),
                prefix: tier.get("prefix")?.as_str()?.to_owned(),
                region: tier.get("region")?.as_str().map(str::to_owned),
            }),
            "gpu" => BackendConfig::Gpu {
                bandwidth_gbps: tier.get("bandwidth_gbps")?.as_f64()?,
            },
            "null" => BackendConfig::Null,
            _ => return None,
        };
        Some(L2Config {
            backend,
            capacity_bytes: v.get("capacity_bytes").and_then(Json::as_u64),
            policy: v.get("eviction_policy")?.as_str()?.parse().ok()?,
        })
    }

    fn to_json(&self) -> Json {
        let backend = match &self.backend {
            BackendConfig::Memory { buffers } => json!({"type": "memory", "buffers": buffers}),
            BackendConfig::File { dir, direct, fsync } => json!({
                "type": "file",
                "path": dir.display().to_string(),
                "direct": direct,
                "fsync": match fsync {
                    FsyncPolicy::Never => "never",
                    FsyncPolicy::EveryWrite => "every_write",
                },
            }),
            BackendConfig::Redis { url, prefix } => {
                json!({"type": "redis", "url": url, "prefix": prefix})
            }
            BackendConfig::RespCluster { nodes, prefix } => {
                json!({"type": "resp-cluster", "nodes": nodes, "prefix": prefix})
            }
            BackendConfig::S3(at) => json!({
                "type": "s3",
                "endpoint": at.endpoint,
                "bucket": at.bucket,
                "prefix": at.prefix,
                "region": at.region,
            }),
            BackendConfig::Gpu { bandwidth_gbps } => {
                json!({"type": "gpu", "bandwidth_gbps": bandwidth_gbps})
            }
            BackendConfig::Null => json!({"type": "null"}),
        };
        json!({
            "kvtrace_tier": backend,
            "capacity_bytes": self.capacity_bytes,
            "eviction_policy": self.policy.name(),
        })
    }
}

/// An s3 tier's place: `bucket` (required), `endpoint` (an `http://` or `https://` URL),
/// `prefix` (default `kvtrace`), `region`. Credentials are refused here: they belong in the
/// environment, where the AWS tools keep them, not in a file a run's outputs may quote.
fn s3_location(v: &Json) -> Result<S3Location, String> {
    let text = |field: &str| -> Result<Option<String>, String> {
        match v.get(field) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("an s3 tier's {field} must be a string")),
        }
    };
    for secret in [
        "access_key_id",
        "secret_access_key",
        "session_token",
        "aws_secret_access_key",
    ] {
        if v.get(secret).is_some() {
            return Err(format!(
                "an s3 tier takes no {secret}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                 (or a profile of ~/.aws/credentials) in the environment"
            ));
        }
    }
    let endpoint = text("endpoint")?;
    if let Some(e) = &endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return Err(format!(
                "endpoint {e:?}: expected an http:// or https:// URL"
            ));
        }
    }
    let bucket = text("bucket")?
        .filter(|b| !b.is_empty())
        .ok_or("an s3 tier needs \"bucket\"")?;
    Ok(S3Location {
        endpoint,
        bucket,
        prefix: text("prefix")?.unwrap_or_else(|| "kvtrace".into()),
        region: text("region")?,
    })
}

/// A cluster tier's seed nodes: a non-empty list of `redis://host:port` URLs.
fn cluster_nodes(v: Option<&Json>) -> Result<Vec<String>, String> {
    let list = v
        .and_then(Json::as_array)
        .filter(|l| !l.is_empty())
        .ok_or("a resp-cluster tier needs \"nodes\": [\"redis://host:port\", ...]")?;
    list.iter()
        .map(|n| match n.as_str() {
            Some(url) if url.starts_with("redis://") || url.starts_with("valkey://") => {
                Ok(url.to_owned())
            }
            _ => Err(format!("nodes: {n} is not a redis://host:port URL")),
        })
        .collect()
}

/// GiB (LMCache's "GB") to bytes; refuses negative and non-finite sizes.
pub fn gib_to_bytes(gb: f64) -> Result<u64, String> {
    if gb.is_finite() && gb >= 0.0 {
        Ok((gb * (1u64 << 30) as f64) as u64)
    } else {
        Err(format!("{}: expected a non-negative size", short(gb)))
    }
}

impl L2Config {
    /// An L2 tier from its adapter description, as `--l2-adapter` and the TOML file give it:
    /// `{"type": "memory"|"gpu"|"fs"|"redis"|"null", "capacity_gb", "eviction_policy", ...}`.
    pub fn from_adapter(v: &Json) -> Result<L2Config, String> {
        let backend = match v.get("type").and_then(|t| t.as_str()) {
            Some("memory" | "mock") => BackendConfig::Memory {
                buffers: v.get("buffers").and_then(|b| b.as_bool()).unwrap_or(true),
            },
            Some("null") => BackendConfig::Null,
            Some("gpu") => BackendConfig::Gpu {
                bandwidth_gbps: gpu_bandwidth(
                    v.get("bandwidth_gbps").and_then(|b| b.as_f64()),
                    "bandwidth_gbps",
                )?,
            },
            Some("fs" | "file") => BackendConfig::File {
                dir: v
                    .get("path")
                    .or_else(|| v.get("base_path"))
                    .and_then(|p| p.as_str())
                    .ok_or("a file tier needs \"path\"")?
                    .into(),
                direct: v.get("direct").and_then(|d| d.as_bool()).unwrap_or(false),
                fsync: match v.get("fsync").and_then(|f| f.as_str()) {
                    None | Some("never") => FsyncPolicy::Never,
                    Some("every_write") => FsyncPolicy::EveryWrite,
                    Some(other) => return Err(format!("fsync {other:?}: never or every_write")),
                },
            },
            Some("resp" | "redis" | "valkey") => BackendConfig::Redis {
                url: v
                    .get("url")
                    .and_then(|u| u.as_str())
                    .unwrap_or("redis://127.0.0.1:6379/0")
                    .to_owned(),
                prefix: v
                    .get("prefix")
                    .and_then(|p| p.as_str())
                    .unwrap_or("kvtrace")
                    .to_owned(),
            },
            Some("resp-cluster" | "redis-cluster" | "valkey-cluster") => {
                BackendConfig::RespCluster {
                    nodes: cluster_nodes(v.get("nodes"))?,
                    prefix: v
                        .get("prefix")
                        .and_then(|p| p.as_str())
                        .unwrap_or("kvtrace")
                        .to_owned(),
                }
            }
            Some("s3") => BackendConfig::S3(s3_location(v)?),
            Some(other) => {
                return Err(format!(
                    "tier type {other:?} is not available \
                     (memory, gpu, fs, redis, resp-cluster, s3, null)"
                ))
            }
            None => return Err("missing \"type\"".into()),
        };
        let capacity_bytes = match v.get("capacity_gb") {
            None | Some(serde_json::Value::Null) => None,
            Some(g) => Some(
                gib_to_bytes(g.as_f64().ok_or("capacity_gb: not a number")?)
                    .map_err(|e| format!("capacity_gb {e}"))?,
            ),
        };
        if matches!(backend, BackendConfig::RespCluster { .. }) && capacity_bytes.is_some() {
            return Err("capacity_gb: a resp-cluster tier is shared by every rank, so its capacity is the cluster's maxmemory, not a per-process figure".into());
        }
        let policy = match v.get("eviction_policy").and_then(|p| p.as_str()) {
            Some(p) => p.parse()?,
            None => PolicyKind::Lru,
        };
        Ok(L2Config {
            backend,
            capacity_bytes,
            policy,
        })
    }
}

/// The TOML file: every key optional, unknown keys refused by name.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlConfig {
    l1: Option<TomlL1>,
    placement: Option<String>,
    store_policy: Option<String>,
    prefetch_policy: Option<String>,
    prefetch_max_in_flight: Option<u64>,
    l2_io: Option<TomlL2Io>,
    #[serde(default)]
    l2: Vec<toml::Table>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlL2Io {
    mode: Option<String>,
    depth: Option<u32>,
    workers: Option<u32>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlL1 {
    size_gb: Option<f64>,
    eviction_policy: Option<String>,
    trigger_watermark: Option<f64>,
    eviction_ratio: Option<f64>,
    eviction_timing: Option<String>,
    eviction_interval_s: Option<f64>,
    write_ttl_s: Option<f64>,
    read_ttl_s: Option<f64>,
    accounting_only: Option<bool>,
    touch_pages: Option<bool>,
    device: Option<String>,
    bandwidth_gbps: Option<f64>,
}

/// A value that must lie in 0..=1 (watermarks, ratios).
pub fn fraction(name: &str, v: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{name} {}: expected a fraction between 0 and 1",
            short(v)
        ))
    }
}

/// A duration in seconds that must be finite and not negative (the L1's lock TTLs).
pub fn seconds(name: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{name} {}: expected seconds >= 0", short(v)))
    }
}

impl StorageConfig {
    /// Applies a TOML hierarchy description over this configuration (docs/commands/replay.md:
    /// "Configuration file"). `[[l2]]` tables, when present, replace the L2 tiers.
    pub fn apply_toml(&mut self, text: &str) -> Result<(), String> {
        let file: TomlConfig =
            toml::from_str(text).map_err(|e| e.to_string().replace('\n', " "))?;
        if let Some(l1) = file.l1 {
            if let Some(gb) = l1.size_gb {
                self.l1_size_bytes = gib_to_bytes(gb).map_err(|e| format!("l1.size_gb {e}"))?;
            }
            if let Some(p) = l1.eviction_policy {
                self.eviction.policy = p.parse().map_err(|e| format!("l1.eviction_policy: {e}"))?;
            }
            if let Some(w) = l1.trigger_watermark {
                self.eviction.trigger_watermark = fraction("l1.trigger_watermark", w)?;
            }
            if let Some(r) = l1.eviction_ratio {
                self.eviction.eviction_ratio = fraction("l1.eviction_ratio", r)?;
            }
            let interval_s = l1
                .eviction_interval_s
                .unwrap_or(DEFAULT_EVICTION_INTERVAL_S);
            if !(interval_s.is_finite() && interval_s > 0.0) {
                return Err(format!(
                    "l1.eviction_interval_s {interval_s}: must be positive"
                ));
            }
            match l1.eviction_timing.as_deref() {
                None if l1.eviction_interval_s.is_none() => {}
                None | Some("periodic") => {
                    let phase_s = match self.eviction.timing {
                        EvictionTiming::Periodic { phase_s, .. } => phase_s,
                        EvictionTiming::Immediate => 0.0,
                    };
                    self.eviction.timing = EvictionTiming::Periodic {
                        interval_s,
                        phase_s,
                    }
                }
                Some("immediate") => self.eviction.timing = EvictionTiming::Immediate,
                Some(other) => {
                    return Err(format!(
                        "l1.eviction_timing {other:?}: periodic or immediate"
                    ))
                }
            }
            if let Some(t) = l1.write_ttl_s {
                self.write_ttl_s = seconds("l1.write_ttl_s", t)?;
            }
            if let Some(t) = l1.read_ttl_s {
                self.read_ttl_s = seconds("l1.read_ttl_s", t)?;
            }
            if let Some(a) = l1.accounting_only {
                self.l1_buffers = !a;
            }
            if let Some(t) = l1.touch_pages {
                self.l1_touch_pages = t;
            }
            match l1.device.as_deref() {
                None | Some("cpu") if l1.bandwidth_gbps.is_none() => {}
                None | Some("gpu") => {
                    self.l1_gpu_bandwidth_gbps =
                        Some(gpu_bandwidth(l1.bandwidth_gbps, "l1.bandwidth_gbps")?)
                }
                Some("cpu") => {
                    return Err("l1.bandwidth_gbps applies to device = \"gpu\" only".into())
                }
                Some(other) => return Err(format!("l1.device {other:?}: cpu or gpu")),
            }
        }
        match file.placement.as_deref() {
            None => {}
            Some("write_through") => self.placement = Placement::WriteThrough,
            Some("waterfall") => self.placement = Placement::Waterfall,
            Some(other) => return Err(format!("placement {other:?}: write_through or waterfall")),
        }
        match file.store_policy.as_deref() {
            None => {}
            Some("default") => self.store_policy = StorePolicy::Default,
            Some("skip_l1") => self.store_policy = StorePolicy::SkipL1,
            Some(other) => return Err(format!("store_policy {other:?}: default or skip_l1")),
        }
        match file.prefetch_policy.as_deref() {
            None => {}
            Some("default") => self.prefetch_policy = PrefetchPolicy::Default,
            Some("retain") => self.prefetch_policy = PrefetchPolicy::Retain,
            Some(other) => return Err(format!("prefetch_policy {other:?}: default or retain")),
        }
        if let Some(n) = file.prefetch_max_in_flight {
            self.prefetch_max_in_flight = n;
        }
        if let Some(io) = file.l2_io {
            self.l2_io = match io.mode.as_deref() {
                Some("synchronous") => L2Io::Synchronous,
                None | Some("asynchronous") => self
                    .l2_io
                    .asynchronous_with(io.depth, io.workers)
                    .map_err(|e| format!("l2_io: {e}"))?,
                Some(other) => {
                    return Err(format!("l2_io.mode {other:?}: synchronous or asynchronous"))
                }
            };
        }
        if !file.l2.is_empty() {
            self.l2 = file
                .l2
                .iter()
                .enumerate()
                .map(|(i, table)| {
                    let json = serde_json::to_value(table).map_err(|e| e.to_string())?;
                    L2Config::from_adapter(&json).map_err(|e| format!("l2[{i}]: {e}"))
                })
                .collect::<Result<_, String>>()?;
        }
        Ok(())
    }
}

/// Gibibytes with as many decimals as the size needs (up to six): `0.0125`, `2`.
fn gib(bytes: u64) -> String {
    let text = format!("{:.6}", bytes as f64 / (1u64 << 30) as f64);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} GiB")
}

impl StorageConfig {
    /// The configuration in words, one (what, how) line per part a user sizes: L1 (with the
    /// objects it holds of `object_bytes`, when known), eviction and the L2 tiers. The
    /// eviction phase is not among them: it is the recording's, not a choice.
    pub fn in_words(&self, object_bytes: Option<u64>) -> Vec<(&'static str, String)> {
        let mut l1 = gib(self.l1_size_bytes);
        if let Some(size) = object_bytes.filter(|&s| s > 0) {
            let align = self.l1_align_bytes.max(1);
            let slot = size.div_ceil(align).saturating_mul(align).max(1);
            l1.push_str(&format!(
                " ({} objects of {} KiB)",
                self.l1_size_bytes / slot,
                size as f64 / 1024.0
            ));
        }
        if let Some(gbps) = self.l1_gpu_bandwidth_gbps {
            l1.push_str(&format!(", a GPU budget at {gbps} GB/s"));
        }
        let e = &self.eviction;
        let timing = match e.timing {
            EvictionTiming::Periodic { interval_s, .. } => {
                format!("a pass every {interval_s} s")
            }
            EvictionTiming::Immediate => "immediate (as allocations need room)".to_string(),
        };
        let eviction = format!(
            "{}, watermark {}, ratio {}, {timing}",
            e.policy.name(),
            e.trigger_watermark,
            e.eviction_ratio
        );
        let l2 = if self.l2.is_empty() {
            "none".to_string()
        } else {
            self.l2
                .iter()
                .map(|t| {
                    let kind = match &t.backend {
                        BackendConfig::Memory { .. } => "memory",
                        BackendConfig::File { .. } => "file",
                        BackendConfig::Redis { .. } => "redis",
                        BackendConfig::RespCluster { .. } => "redis cluster",
                        BackendConfig::S3(_) => "s3",
                        BackendConfig::Gpu { .. } => "gpu",
                        BackendConfig::Null => "null",
                    };
                    match t.capacity_bytes {
                        Some(c) => format!("{kind} {} {}", gib(c), t.policy.name()),
                        None => format!("{kind} (unbounded)"),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let l2 = match self.l2_io {
            L2Io::Asynchronous { depth, workers } if !self.l2.is_empty() => format!(
                "{l2}; asynchronous I/O, {workers} workers and {depth} queued calls per tier"
            ),
            _ => l2,
        };
        vec![("L1", l1), ("eviction", eviction), ("L2", l2)]
    }

    /// How many L2 adapters a recorded LMCache configuration names.
    pub fn adapters_in(lmcache_json: &str) -> usize {
        serde_json::from_str::<Json>(lmcache_json)
            .ok()
            .and_then(|v| {
                v.pointer("/l2_adapter_config/adapters")
                    .and_then(|a| a.as_array())
                    .map(Vec::len)
            })
            .unwrap_or(0)
    }

    /// A recorded LMCache configuration in words ([`StorageConfig::in_words`]), naming the
    /// adapters a replay does not rebuild from a header (a path or a server); `None` when
    /// kvtrace cannot read it.
    pub fn recorded_in_words(
        lmcache_json: &str,
        object_bytes: Option<u64>,
    ) -> Option<Vec<(&'static str, String)>> {
        let (config, _) = StorageConfig::from_lmcache_json(lmcache_json)?;
        let mut words = config.in_words(object_bytes);
        let missing = Self::adapters_in(lmcache_json).saturating_sub(config.l2.len());
        if missing > 0 {
            if let Some((_, l2)) = words.iter_mut().find(|(what, _)| *what == "L2") {
                let known = if config.l2.is_empty() {
                    String::new()
                } else {
                    format!("{l2}, ")
                };
                *l2 =
                    format!("{known}{missing} adapter(s) a replay does not rebuild from a header");
            }
        }
        Some(words)
    }
}
