//! The storage-tier flags `kvtrace replay` and `kvtrace simulate` share: each one overrides
//! the configuration it starts from (the trace's, a TOML file's, or the defaults).

use std::path::Path;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;
use kvtrace::error::{short, Error};
use kvtrace::storage::config::{
    self, gib_to_bytes, EvictionTiming, L2Config, L2Io, Placement, PrefetchPolicy, StorageConfig,
    StorePolicy,
};
use kvtrace::storage::eviction::PolicyKind;

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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum L2IoArg {
    /// Each backend call completes inside the call that causes it
    Synchronous,
    /// Backend calls run on worker threads behind bounded queues, per tier; the cache's
    /// decisions are the same
    Asynchronous,
}

#[derive(Clone, Copy, ValueEnum)]
enum Timing {
    /// Check the watermark once per interval of trace time (LMCache's controller)
    Periodic,
    /// Evict as soon as an allocation needs room
    Immediate,
}

/// `--eviction-policy`'s values, which help and shell completions offer; parsed by the
/// library's own names.
fn policies() -> impl TypedValueParser<Value = PolicyKind> {
    PossibleValuesParser::new([
        PossibleValue::new("LRU"),
        PossibleValue::new("ARC"),
        PossibleValue::new("FIFO"),
        PossibleValue::new("LFU"),
        PossibleValue::new("noop").alias("none"),
    ])
    .try_map(|name| name.parse::<PolicyKind>())
}

// Tier flags; each one given overrides the configuration it is applied to. (A plain comment:
// a doc comment here would become the about of every command that flattens these flags.)
#[derive(clap::Args)]
#[command(next_help_heading = "Storage tiers")]
pub(super) struct TierArgs {
    /// L1 memory pool size in GB (GiB, as LMCache reads it)
    #[arg(long, value_name = "GB")]
    pub l1_size_gb: Option<f64>,
    /// How L1 picks victims (any case, as LMCache reads it)
    #[arg(long, value_name = "POLICY", ignore_case = true, value_parser = policies())]
    eviction_policy: Option<PolicyKind>,
    #[arg(long, value_name = "FRACTION")]
    eviction_trigger_watermark: Option<f64>,
    #[arg(long, value_name = "FRACTION")]
    eviction_ratio: Option<f64>,
    /// When eviction runs (kvtrace)
    #[arg(long, value_enum)]
    eviction_timing: Option<Timing>,
    /// Seconds of trace time between periodic eviction passes (default 1.001: LMCache's
    /// controller sleeps 1 s, and each pass takes about a millisecond)
    #[arg(long, value_name = "SECONDS")]
    eviction_interval: Option<f64>,
    #[arg(long, value_name = "SECONDS")]
    l1_write_ttl_seconds: Option<f64>,
    #[arg(long, value_name = "SECONDS")]
    l1_read_ttl_seconds: Option<f64>,
    /// Keep only object sizes in L1, no buffers (traces bigger than RAM)
    #[arg(long, conflicts_with = "l1_touch_pages")]
    l1_accounting_only: bool,
    /// Write each object's pages as it is placed in L1's buffers, as a server's copy of its
    /// KV data would, so that the pool becomes resident (LMCache's replay does not)
    #[arg(long)]
    l1_touch_pages: bool,
    /// An L2 tier as JSON, repeatable: {"type":"memory"|"fs"|"redis"|"null", "capacity_gb": G,
    /// "eviction_policy": P}; fs takes "path", "direct" (O_DIRECT) and "fsync"
    /// (never|every_write); redis takes "url" and "prefix"
    #[arg(long, value_name = "JSON")]
    l2_adapter: Vec<String>,
    /// No L2 tier: L1 alone, whatever tiers the trace's header or --config describe
    #[arg(long, conflicts_with = "l2_adapter")]
    no_l2: bool,
    /// How objects reach the L2 tiers (kvtrace)
    #[arg(long, value_enum)]
    placement: Option<PlacementArg>,
    #[arg(long, value_enum)]
    l2_store_policy: Option<StorePolicyArg>,
    #[arg(long, value_enum)]
    l2_prefetch_policy: Option<PrefetchPolicyArg>,
    #[arg(long, value_name = "N")]
    l2_prefetch_max_in_flight: Option<u64>,
    /// How the L2 tiers' reads, writes and deletes run (kvtrace; default synchronous)
    #[arg(long, value_enum)]
    l2_io: Option<L2IoArg>,
    /// Calls that may wait in one tier's queues before the replay waits for room
    /// (asynchronous I/O; default 64)
    #[arg(long, value_name = "N")]
    l2_io_depth: Option<u32>,
    /// Worker threads per tier, each with its own backend connection (asynchronous I/O;
    /// default 4)
    #[arg(long, value_name = "N")]
    l2_io_workers: Option<u32>,
}

/// Finite and above zero (NaN is not).
pub(super) fn positive(v: f64) -> bool {
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

/// Applies a TOML hierarchy file to `config`.
pub(super) fn apply_toml(config: &mut StorageConfig, path: &Path) -> Result<(), Error> {
    let file = path.display().to_string();
    let text = kvtrace::limits::read_text(path, kvtrace::limits::MAX_CONFIG_BYTES)
        .map_err(|e| Error::io("cannot read", e).in_file(&file))?;
    config
        .apply_toml(&text)
        .map_err(|e| Error::usage(e).in_file(&file))
}

impl TierArgs {
    /// Whether L2 tiers were given by flag.
    pub(super) fn gives_l2(&self) -> bool {
        !self.l2_adapter.is_empty() || self.no_l2
    }

    /// Whether an `--l2-adapter` asks for real buffers in so many words.
    pub(super) fn asks_l2_buffers(&self) -> bool {
        self.l2_adapter.iter().any(|text| {
            serde_json::from_str::<serde_json::Value>(text)
                .is_ok_and(|v| v.get("buffers") == Some(&serde_json::Value::Bool(true)))
        })
    }

    /// Whether any tier flag was given.
    pub(super) fn given(&self) -> bool {
        self.l1_size_gb.is_some()
            || self.eviction_policy.is_some()
            || self.eviction_trigger_watermark.is_some()
            || self.eviction_ratio.is_some()
            || self.eviction_timing.is_some()
            || self.eviction_interval.is_some()
            || self.l1_write_ttl_seconds.is_some()
            || self.l1_read_ttl_seconds.is_some()
            || self.l1_accounting_only
            || self.l1_touch_pages
            || !self.l2_adapter.is_empty()
            || self.no_l2
            || self.placement.is_some()
            || self.l2_store_policy.is_some()
            || self.l2_prefetch_policy.is_some()
            || self.l2_prefetch_max_in_flight.is_some()
            || self.l2_io.is_some()
            || self.l2_io_depth.is_some()
            || self.l2_io_workers.is_some()
    }

    /// Whether asynchronous L2 I/O was asked for by flag.
    fn asynchronous_io(&self) -> bool {
        self.l2_io == Some(L2IoArg::Asynchronous)
            || (self.l2_io.is_none()
                && (self.l2_io_depth.is_some() || self.l2_io_workers.is_some()))
    }

    /// What the flags ask for that runs but cannot mean what the user wants: said as a
    /// warning, not refused (a sweep may include such a point on purpose).
    pub(super) fn warnings(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.l1_size_gb == Some(0.0) {
            out.push("--l1-size-gb 0: an L1 of no bytes holds nothing; every reservation is refused (OUT_OF_MEMORY) and only L2 tiers can hit");
        }
        out
    }

    /// Overrides `config` with every flag given, and refuses an L1 with real buffers larger
    /// than the memory available.
    pub(super) fn apply(&self, config: &mut StorageConfig) -> Result<(), Error> {
        if let Some(gb) = self.l1_size_gb {
            config.l1_size_bytes = gib("--l1-size-gb", gb)?;
        }
        if let Some(p) = self.eviction_policy {
            config.eviction.policy = p;
        }
        if let Some(w) = self.eviction_trigger_watermark {
            config.eviction.trigger_watermark = fraction("--eviction-trigger-watermark", w)?;
        }
        if let Some(r) = self.eviction_ratio {
            config.eviction.eviction_ratio = fraction("--eviction-ratio", r)?;
        }
        if self.eviction_interval.is_some_and(|i| !positive(i)) {
            return Err(Error::usage("--eviction-interval must be positive"));
        }
        let (interval_s, phase_s) = match config.eviction.timing {
            EvictionTiming::Periodic {
                interval_s,
                phase_s,
            } => (self.eviction_interval.unwrap_or(interval_s), phase_s),
            EvictionTiming::Immediate => (
                self.eviction_interval
                    .unwrap_or(config::DEFAULT_EVICTION_INTERVAL_S),
                0.0,
            ),
        };
        match (self.eviction_timing, self.eviction_interval) {
            (Some(Timing::Immediate), _) => config.eviction.timing = EvictionTiming::Immediate,
            (Some(Timing::Periodic), _) | (None, Some(_)) => {
                config.eviction.timing = EvictionTiming::Periodic {
                    interval_s,
                    phase_s,
                }
            }
            (None, None) => {}
        }
        if let Some(t) = self.l1_write_ttl_seconds {
            config.write_ttl_s =
                config::seconds("--l1-write-ttl-seconds", t).map_err(Error::usage)?;
        }
        if let Some(t) = self.l1_read_ttl_seconds {
            config.read_ttl_s =
                config::seconds("--l1-read-ttl-seconds", t).map_err(Error::usage)?;
        }
        if self.l1_accounting_only {
            config.l1_buffers = false;
        }
        if self.l1_touch_pages {
            config.l1_buffers = true;
            config.l1_touch_pages = true;
        }
        if let Some(available) = kvtrace::machine::available_memory() {
            let host_buffers = config.l1_buffers && config.l1_gpu_bandwidth_gbps.is_none();
            if host_buffers && config.l1_size_bytes > available {
                // The size as given: past 2^64 bytes the configured one is held at the most.
                let size = match self.l1_size_gb {
                    Some(gb) => format!("{} GiB", short(gb)),
                    None => format!(
                        "{:.1} GiB",
                        config.l1_size_bytes as f64 / (1u64 << 30) as f64
                    ),
                };
                return Err(Error::usage(format!(
                    "an L1 of {size} with real buffers exceeds the {:.1} GiB of memory available; \
                     use --l1-accounting-only or a smaller --l1-size-gb",
                    available as f64 / (1u64 << 30) as f64
                )));
            }
        }
        if self.no_l2 {
            config.l2.clear();
        }
        if !self.l2_adapter.is_empty() {
            config.l2 = self
                .l2_adapter
                .iter()
                .map(|a| l2_tier(a))
                .collect::<Result<_, _>>()?;
        }
        if let Some(p) = self.placement {
            config.placement = match p {
                PlacementArg::WriteThrough => Placement::WriteThrough,
                PlacementArg::Waterfall => Placement::Waterfall,
            };
        }
        if let Some(p) = self.l2_store_policy {
            config.store_policy = match p {
                StorePolicyArg::Default => StorePolicy::Default,
                StorePolicyArg::SkipL1 => StorePolicy::SkipL1,
            };
        }
        if let Some(p) = self.l2_prefetch_policy {
            config.prefetch_policy = match p {
                PrefetchPolicyArg::Default => PrefetchPolicy::Default,
                PrefetchPolicyArg::Retain => PrefetchPolicy::Retain,
            };
        }
        if let Some(n) = self.l2_prefetch_max_in_flight {
            config.prefetch_max_in_flight = n;
        }
        self.apply_io(config)
    }

    /// `--l2-io` and its depth and workers; a depth or a worker count alone means
    /// asynchronous.
    fn apply_io(&self, config: &mut StorageConfig) -> Result<(), Error> {
        if self.l2_io == Some(L2IoArg::Synchronous) {
            if self.l2_io_depth.is_some() || self.l2_io_workers.is_some() {
                return Err(Error::usage(
                    "--l2-io-depth and --l2-io-workers apply to --l2-io asynchronous",
                ));
            }
            config.l2_io = L2Io::Synchronous;
            return Ok(());
        }
        if !self.asynchronous_io() {
            return Ok(());
        }
        config.l2_io = config
            .l2_io
            .asynchronous_with(self.l2_io_depth, self.l2_io_workers)
            .map_err(|e| Error::usage(format!("--l2-io asynchronous: {e}")))?;
        Ok(())
    }
}
