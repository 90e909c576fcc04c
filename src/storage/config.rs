//! The storage configuration, with LMCache's option names and defaults, and its JSON in the
//! shape LMCache 0.5.6 records, so that a replay with the recording's flags reports a digest
//! `match` instead of LMCache's perpetual MISMATCH.

use serde_json::{json, Value as Json};

use super::eviction::PolicyKind;
use super::file::FsyncPolicy;

/// When eviction runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EvictionTiming {
    /// Every `interval_s` of trace time, as LMCache's 1-second controller does: bursts
    /// between ticks can fail with OUT_OF_MEMORY.
    Periodic { interval_s: f64 },
    /// Whenever an allocation would cross the watermark or not fit.
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
            timing: EvictionTiming::Periodic { interval_s: 1.0 },
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
    Null,
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
    /// Keep real L1 buffers; off for traces bigger than RAM.
    pub l1_buffers: bool,
    pub eviction: EvictionConfig,
    pub l2: Vec<L2Config>,
    pub store_policy: StorePolicy,
    pub prefetch_policy: PrefetchPolicy,
    pub prefetch_max_in_flight: u64,
    pub write_ttl_s: f64,
    pub read_ttl_s: f64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            l1_size_bytes: 1 << 30,
            l1_buffers: true,
            eviction: EvictionConfig::default(),
            l2: Vec::new(),
            store_policy: StorePolicy::Default,
            prefetch_policy: PrefetchPolicy::Default,
            prefetch_max_in_flight: 8,
            write_ttl_s: 600.0,
            read_ttl_s: 300.0,
        }
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
                "align_bytes": 4096,
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
        match self.eviction.timing {
            EvictionTiming::Immediate => config["kvtrace_eviction_timing"] = json!("immediate"),
            EvictionTiming::Periodic { interval_s } if interval_s != 1.0 => {
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
    /// are not read (LMCache records them as object reprs); the returned list says so.
    pub fn from_lmcache_json(text: &str) -> Option<(StorageConfig, Vec<String>)> {
        let v: Json = serde_json::from_str(text).ok()?;
        let l1 = v.get("l1_manager_config")?;
        let memory = l1.get("memory_config")?;
        let eviction = v.get("eviction_config").or_else(|| l1.get("eviction"))?;
        let mut notes = Vec::new();
        let mut config = StorageConfig {
            l1_size_bytes: memory.get("size_in_bytes")?.as_u64()?,
            ..StorageConfig::default()
        };
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
        if let Some(t) = l1.get("read_ttl_seconds").and_then(Json::as_f64) {
            config.read_ttl_s = t;
        }
        if let Some(t) = l1.get("write_ttl_seconds").and_then(Json::as_f64) {
            config.write_ttl_s = t;
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
        if v.get("kvtrace_eviction_timing").and_then(Json::as_str) == Some("immediate") {
            config.eviction.timing = EvictionTiming::Immediate;
        } else if let Some(i) = v.get("kvtrace_eviction_interval_s").and_then(Json::as_f64) {
            config.eviction.timing = EvictionTiming::Periodic { interval_s: i };
        }
        let adapters = v
            .pointer("/l2_adapter_config/adapters")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default();
        let ours: Option<Vec<L2Config>> = adapters.iter().map(L2Config::from_json).collect();
        match ours {
            Some(tiers) => config.l2 = tiers,
            None => notes.push(format!(
                "the recording had {} L2 adapter(s) kvtrace cannot rebuild; give them with --l2-adapter",
                adapters.len()
            )),
        }
        Some((config, notes))
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
            BackendConfig::Null => json!({"type": "null"}),
        };
        json!({
            "kvtrace_tier": backend,
            "capacity_bytes": self.capacity_bytes,
            "eviction_policy": self.policy.name(),
        })
    }
}
