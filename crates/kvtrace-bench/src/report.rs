//! The run's results in kv-cache.py's JSON shape (same keys, same order, same units, so
//! existing scripts keep working), with kvtrace's additions under `kvtrace`: both pass/fail
//! profiles, every QoS target, the storage I/O throughput, requests finished after the
//! deadline. As a [`Report`] it is also kv-cache.py's workbook ([`super::sheets`]) and the
//! console summary.

use std::collections::BTreeMap;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::Value as Json;

use super::autoscale::{AutoscaleMode, ScaleEvent};
use super::metrics::{percentile, Category, Collected, OpTimes};
use super::mlperf::MlperfTrial;
use super::run::{BenchConfig, RunOutcome, TimelinePoint};
use super::sheets::{self, RunParameters};
use super::storage_io::StorageIoReport;
use super::tiers::{TierCounters, TierKind};
use super::users::QosLevel;
use kvtrace_io::error::{Error, Result};
use kvtrace_rank::Rank;
use kvtrace_report::histogram::LatencyHistogram;
use kvtrace_report::{JsonStyle, Report, Table};

const GIB: f64 = (1u64 << 30) as f64;

/// The percentiles every latency tail reports, and their key suffixes.
pub const TAIL: [(f64, &str); 5] = [
    (50.0, "p50"),
    (95.0, "p95"),
    (99.0, "p99"),
    (99.9, "p999"),
    (99.99, "p9999"),
];

/// Which assessment is `storage_health`, and whether QoS compliance is judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Profile {
    #[default]
    Latency,
    Throughput,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Latency => "latency",
            Profile::Throughput => "throughput",
        }
    }
}

/// `{mean, p50, p95, p99, p999, p9999}` in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LatencyMs {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub p9999: f64,
}

impl LatencyMs {
    fn of(seconds: &[f64]) -> LatencyMs {
        let ms = sorted_ms(seconds);
        let t = Tail::of_sorted(&ms).0;
        LatencyMs {
            mean: mean(&ms),
            p50: t[0],
            p95: t[1],
            p99: t[2],
            p999: t[3],
            p9999: t[4],
        }
    }
}

/// The [`TAIL`] percentiles of one operation's times, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tail(pub [f64; 5]);

impl Tail {
    fn of(seconds: &[f64]) -> Tail {
        Tail::of_sorted(&sorted_ms(seconds))
    }

    fn of_sorted(ms: &[f64]) -> Tail {
        Tail(TAIL.map(|(p, _)| percentile(ms, p)))
    }
}

/// A tier's operations in one direction: the whole time, and for the storage tier its
/// device (durability flush or read) and host (copy) parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpTails {
    pub total: Tail,
    pub device: Option<Tail>,
    pub host: Option<Tail>,
}

/// One tier's operations in one direction, the demotions' reads and writes pooled with the
/// requests' own: kv-cache.py leaves eviction-driven I/O out of its P95s (MLPerf Storage
/// issue #421), so a tier filled only by demotions shows no write latency there at all.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LatencyWithDemotions {
    pub tier: &'static str,
    pub direction: &'static str,
    pub request_ops: usize,
    pub demotion_ops: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    /// The storage tier's device part (the flush of a write, the cold read): the part
    /// MLPerf's device P95 measures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_p95_ms: Option<f64>,
}

/// What one tier moved and held.
#[derive(Clone, Debug, PartialEq)]
pub struct TierFigures {
    pub kind: TierKind,
    pub entries: u64,
    pub kv_bytes_written_gb: f64,
    pub kv_bytes_read_gb: f64,
    pub read_bandwidth_gbps: f64,
    pub write_bandwidth_gbps: f64,
    /// Present once the tier served a read.
    pub read: Option<OpTails>,
    /// Present once the tier took a write.
    pub write: Option<OpTails>,
}

/// One pass/fail criterion.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Criterion {
    pub name: String,
    pub target: f64,
    pub actual: f64,
    pub unit: &'static str,
    pub passed: bool,
}

/// An assessment: PASS when every criterion passed.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Health {
    pub overall_status: &'static str,
    pub passed_count: usize,
    pub total_count: usize,
    pub criteria: Vec<Criterion>,
}

impl Health {
    fn of(criteria: Vec<Criterion>) -> Health {
        let passed = criteria.iter().filter(|c| c.passed).count();
        Health {
            overall_status: if passed == criteria.len() {
                "PASS"
            } else {
                "FAIL"
            },
            passed_count: passed,
            total_count: criteria.len(),
            criteria,
        }
    }

    pub fn passed(&self) -> bool {
        self.passed_count == self.total_count
    }
}

/// kv-cache.py's `cache_stats`. Per-tier figures are written under the tier's name
/// (`gpu_entries`, `tier_cpu_kv_bytes_read_gb`, `storage_read_p95_ms`, …).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheStats {
    pub cache_hit_rate: f64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// GPU, CPU and storage, in that order.
    pub tiers: Vec<TierFigures>,
    pub gpu_memory_used_gb: f64,
    pub cpu_memory_used_gb: f64,
    pub offloads_cpu: u64,
    pub offloads_storage: u64,
    pub prefill_writes: u64,
    pub decode_reads: u64,
    pub system_prompt_hits: u64,
    pub user_cache_hits: u64,
    pub multi_turn_hits: u64,
    pub total_read_bytes: u64,
    pub total_write_bytes: u64,
    pub total_read_gb: f64,
    pub total_write_gb: f64,
    pub read_write_ratio: f64,
    pub read_iops: usize,
    pub write_iops: usize,
    pub storage_tokens_processed: u64,
    pub storage_health: Health,
}

impl CacheStats {
    pub fn tier(&self, kind: TierKind) -> Option<&TierFigures> {
        self.tiers.iter().find(|t| t.kind == kind)
    }
}

impl Serialize for CacheStats {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("cache_hit_rate", &self.cache_hit_rate)?;
        m.serialize_entry("cache_hits", &self.cache_hits)?;
        m.serialize_entry("cache_misses", &self.cache_misses)?;
        for t in &self.tiers {
            let name = t.kind.name();
            m.serialize_entry(&format!("{name}_entries"), &t.entries)?;
            m.serialize_entry(
                &format!("tier_{name}_kv_bytes_written_gb"),
                &t.kv_bytes_written_gb,
            )?;
            m.serialize_entry(
                &format!("tier_{name}_kv_bytes_read_gb"),
                &t.kv_bytes_read_gb,
            )?;
            m.serialize_entry(
                &format!("tier_{name}_read_bandwidth_gbps"),
                &t.read_bandwidth_gbps,
            )?;
            m.serialize_entry(
                &format!("tier_{name}_write_bandwidth_gbps"),
                &t.write_bandwidth_gbps,
            )?;
            for (dir, ops) in [("read", &t.read), ("write", &t.write)] {
                let Some(ops) = ops else { continue };
                let parts = [
                    (format!("{name}_{dir}"), Some(ops.total)),
                    (format!("storage_{dir}_device"), ops.device),
                    (format!("storage_{dir}_host"), ops.host),
                ];
                for (prefix, tail) in parts {
                    let Some(tail) = tail else { continue };
                    for ((_, label), v) in TAIL.iter().zip(tail.0) {
                        m.serialize_entry(&format!("{prefix}_{label}_ms"), &v)?;
                    }
                }
            }
        }
        m.serialize_entry("gpu_memory_used_gb", &self.gpu_memory_used_gb)?;
        m.serialize_entry("cpu_memory_used_gb", &self.cpu_memory_used_gb)?;
        m.serialize_entry("offloads_cpu", &self.offloads_cpu)?;
        m.serialize_entry("offloads_storage", &self.offloads_storage)?;
        m.serialize_entry("prefill_writes", &self.prefill_writes)?;
        m.serialize_entry("decode_reads", &self.decode_reads)?;
        m.serialize_entry("system_prompt_hits", &self.system_prompt_hits)?;
        // kv-cache.py's common-phrase cache has no counterpart here.
        m.serialize_entry("common_phrase_hits", &0)?;
        m.serialize_entry("user_cache_hits", &self.user_cache_hits)?;
        m.serialize_entry("multi_turn_hits", &self.multi_turn_hits)?;
        m.serialize_entry("total_read_bytes", &self.total_read_bytes)?;
        m.serialize_entry("total_write_bytes", &self.total_write_bytes)?;
        m.serialize_entry("total_read_gb", &self.total_read_gb)?;
        m.serialize_entry("total_write_gb", &self.total_write_gb)?;
        m.serialize_entry("read_write_ratio", &self.read_write_ratio)?;
        m.serialize_entry("read_iops", &self.read_iops)?;
        m.serialize_entry("write_iops", &self.write_iops)?;
        m.serialize_entry("storage_tokens_processed", &self.storage_tokens_processed)?;
        m.serialize_entry("storage_health", &self.storage_health)?;
        m.end()
    }
}

/// Whether a QoS level met its P95 target; not judged in the throughput profile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SlaMet {
    Judged(bool),
    NotJudged,
}

impl SlaMet {
    pub const NOT_JUDGED: &'static str = "N/A (throughput mode)";
}

impl Serialize for SlaMet {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            SlaMet::Judged(met) => s.serialize_bool(*met),
            SlaMet::NotJudged => s.serialize_str(Self::NOT_JUDGED),
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TailTarget {
    pub percentile: f64,
    pub target_ms: f64,
    pub actual_ms: f64,
    pub met: bool,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Sla {
    pub target_p95_ms: f64,
    pub actual_p95_ms: f64,
    pub compliance: f64,
    pub met: SlaMet,
    pub kvtrace_tail_targets: Vec<TailTarget>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QosLatency {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QosFigures {
    pub total_requests: usize,
    pub latency_ms: QosLatency,
    pub sla: Sla,
}

/// One QoS level: its figures, or `{"no_data": true}` when it served no request.
#[derive(Clone, Debug, PartialEq)]
pub enum QosLevelReport {
    NoData,
    Served(QosFigures),
}

impl Serialize for QosLevelReport {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            QosLevelReport::Served(f) => f.serialize(s),
            QosLevelReport::NoData => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("no_data", &true)?;
                m.end()
            }
        }
    }
}

/// Per QoS level, in [`QosLevel::ALL`] order, written as a map by level name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QosMetrics(pub Vec<(QosLevel, QosLevelReport)>);

impl QosMetrics {
    pub fn get(&self, level: QosLevel) -> Option<&QosFigures> {
        self.0.iter().find_map(|(l, r)| match r {
            QosLevelReport::Served(f) if *l == level => Some(f),
            _ => None,
        })
    }
}

impl Serialize for QosMetrics {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (level, r) in &self.0 {
            m.serialize_entry(level.name(), r)?;
        }
        m.end()
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PrefixCacheStats {
    pub prefix_hits: u64,
    pub prefix_misses: u64,
    pub system_prompt_reuse: u64,
    pub common_phrase_reuse: u64,
    pub bytes_saved: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Autoscaling {
    pub mode: AutoscaleMode,
    pub target_saturation: f64,
    pub interval_s: f64,
    pub initial_users: u32,
    pub final_users: u32,
    pub scale_events: usize,
    pub peak_live_users: u32,
    /// Capacity mode: the user count with the best throughput, and that throughput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_users: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_tokens_per_sec: Option<f64>,
}

/// The autoscaler's summary; `{}` for a run without one, as kv-cache.py writes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AutoscalingSummary(pub Option<Autoscaling>);

impl Serialize for AutoscalingSummary {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match &self.0 {
            Some(a) => a.serialize(s),
            None => s.serialize_map(Some(0))?.end(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HitCounts {
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub hit_rate: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    pub total_requests: usize,
    pub total_tokens: u64,
    pub elapsed_time: f64,
    pub avg_throughput_tokens_per_sec: f64,
    pub total_storage_io_time: f64,
    pub storage_throughput_tokens_per_sec: f64,
    pub requests_per_second: f64,
    pub end_to_end_latency_ms: LatencyMs,
    pub storage_io_latency_ms: LatencyMs,
    pub generation_latency_ms: LatencyMs,
    pub cache_stats: CacheStats,
    pub qos_metrics: QosMetrics,
    pub prefix_cache_stats: PrefixCacheStats,
    pub autoscaling_stats: Vec<ScaleEvent>,
    pub autoscaling_summary: AutoscalingSummary,
    pub multi_turn_stats: HitCounts,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HitRates {
    pub system_prompt: f64,
    pub multi_turn: f64,
    pub user: f64,
    pub rag: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Assessments {
    pub latency: Health,
    pub throughput: Health,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TierReport {
    pub tier: &'static str,
    pub counters: TierCounters,
}

/// A rank's place in a run of many, and its measured window: what `kvtrace aggregate`
/// merges ranks by.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RankWindow {
    #[serde(flatten)]
    pub rank: Rank,
    /// The run's seed; this rank's is `base_seed` + rank.
    pub base_seed: u64,
    /// Start and end of the run, in seconds since the Unix epoch.
    pub started_unix_s: f64,
    pub finished_unix_s: f64,
}

/// kvtrace's additions.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Extras {
    pub storage_io_throughput_gib_per_s: f64,
    /// Tokens whose KV was read back from the storage tier: cached tokens, not computed
    /// ones, so a faster client CPU cannot raise them (MLPerf Storage issue #334).
    pub cached_tokens: u64,
    /// `cached_tokens` over the run's wall time.
    pub cached_tokens_per_sec: f64,
    /// Per tier and direction, the latency percentiles with demotion I/O included.
    pub latency_with_demotions: Vec<LatencyWithDemotions>,
    /// The storage tier's reads, writes and deletes: how they were made (synchronously or
    /// through queues), counted and timed (queue wait, service, end to end).
    pub storage_io: Option<StorageIoReport>,
    /// Requests that finished after the deadline and are not counted.
    pub requests_after_deadline: u64,
    pub hit_rates: HitRates,
    pub rag_hits: u64,
    pub rag_misses: u64,
    pub entries_without_room: u64,
    pub io_errors: u64,
    pub first_io_error: Option<String>,
    pub failed_demotions: u64,
    pub interrupted: bool,
    pub assessments: Assessments,
    pub tiers: Vec<TierReport>,
    /// In rank mode, which rank this is.
    pub rank: Option<RankWindow>,
    /// Which MLPerf Option and trial this run is, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlperf: Option<MlperfTrial>,
    /// Every latency the report gives percentiles of, as a mergeable HdrHistogram (see
    /// [`kvtrace_report::histogram`]): `end_to_end`, `storage_io`, `generation`, and
    /// `<tier>_read` / `<tier>_write` per tier that served one.
    pub latency_histograms: BTreeMap<String, String>,
}

/// Everything a bench run measured.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct BenchReport {
    pub requests_completed: usize,
    pub total_tokens_generated: u64,
    pub total_storage_io_latency: f64,
    pub total_generation_latency: f64,
    pub end_to_end_latencies: Vec<f64>,
    pub storage_latencies: Vec<f64>,
    pub generation_latencies: Vec<f64>,
    pub throughput_timeline: Vec<TimelinePoint>,
    pub prefill_latencies: Vec<f64>,
    pub decode_latencies: Vec<f64>,
    pub multi_turn_cache_hits: u64,
    pub multi_turn_cache_misses: u64,
    pub seed: u64,
    pub summary: Summary,
    pub kvtrace: Extras,
    /// The workbook's run-parameter columns.
    #[serde(skip)]
    pub parameters: RunParameters,
    #[serde(skip)]
    pub profile: Profile,
}

/// Everything the report needs besides the run itself.
pub struct ReportInput<'a> {
    pub config: &'a BenchConfig,
    pub outcome: &'a RunOutcome,
    pub tiers: &'a [(TierKind, TierCounters)],
    /// The demotions' reads and writes, by `(tier, is_write)`.
    pub demotions: &'a BTreeMap<(TierKind, bool), OpTimes>,
    /// The storage tier's calls, timed one by one.
    pub storage_io: Option<StorageIoReport>,
    pub profile: Profile,
    pub parameters: RunParameters,
}

fn sorted_ms(values: &[f64]) -> Vec<f64> {
    let mut ms: Vec<f64> = values.iter().map(|s| s * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

fn rate(hits: u64, misses: u64) -> f64 {
    if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    }
}

fn criterion(name: &str, target: f64, actual: f64, unit: &'static str, passed: bool) -> Criterion {
    Criterion {
        name: name.into(),
        target,
        actual,
        unit,
        passed,
    }
}

const KINDS: [TierKind; 3] = [TierKind::Gpu, TierKind::Cpu, TierKind::Storage];

/// Each tier's and direction's percentiles over its requests' operations and its
/// demotions' together, for every pair that has either.
fn with_demotions(
    c: &Collected,
    demotions: &BTreeMap<(TierKind, bool), OpTimes>,
) -> Vec<LatencyWithDemotions> {
    let mut out = Vec::new();
    for kind in KINDS {
        for write in [false, true] {
            let own = c.ops.get(&(kind, write));
            let moved = demotions.get(&(kind, write));
            let count = |o: Option<&OpTimes>| o.map_or(0, |o| o.total_s.len());
            if count(own) + count(moved) == 0 {
                continue;
            }
            let pooled = |f: fn(&OpTimes) -> &Vec<f64>| {
                let all: Vec<f64> = own.into_iter().chain(moved).flat_map(f).copied().collect();
                sorted_ms(&all)
            };
            let total = pooled(|o| &o.total_s);
            out.push(LatencyWithDemotions {
                tier: kind.name(),
                direction: if write { "write" } else { "read" },
                request_ops: count(own),
                demotion_ops: count(moved),
                p50_ms: percentile(&total, 50.0),
                p95_ms: percentile(&total, 95.0),
                p99_ms: percentile(&total, 99.0),
                device_p95_ms: (kind == TierKind::Storage)
                    .then(|| percentile(&pooled(|o| &o.device_s), 95.0)),
            });
        }
    }
    out
}

impl BenchReport {
    pub fn build(input: ReportInput<'_>) -> BenchReport {
        let c = &input.outcome.collected;
        let elapsed = input.outcome.elapsed_s.max(1e-9);
        let counters = |kind: TierKind| {
            input
                .tiers
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, c)| c.clone())
                .unwrap_or_default()
        };
        let ops = |kind: TierKind, write: bool| -> Option<&OpTimes> { c.ops.get(&(kind, write)) };
        let tokens: u64 = c.requests.iter().map(|r| r.tokens).sum();
        let e2e: Vec<f64> = c.requests.iter().map(|r| r.e2e_s).collect();
        let storage: Vec<f64> = c.requests.iter().map(|r| r.storage_s).collect();
        let generation: Vec<f64> = c.requests.iter().map(|r| r.generation_s).collect();
        let storage_total: f64 = storage.iter().sum();
        let (hits, misses) = c
            .hits
            .values()
            .fold((0, 0), |(h, m), (a, b)| (h + a, m + b));
        let category = |k: Category| c.hits.get(&k).copied().unwrap_or((0, 0));
        let (mt_hits, mt_misses) = category(Category::MultiTurn);
        let (sp_hits, sp_misses) = category(Category::SystemPrompt);
        let (user_hits, user_misses) = category(Category::User);
        let (rag_hits, rag_misses) = category(Category::Rag);

        let mut tiers = Vec::new();
        let (mut read_bytes, mut write_bytes) = (0u64, 0u64);
        for kind in KINDS {
            let t = counters(kind);
            let tails = |write: bool| {
                ops(kind, write).map(|o| OpTails {
                    total: Tail::of(&o.total_s),
                    device: (kind == TierKind::Storage).then(|| Tail::of(&o.device_s)),
                    host: (kind == TierKind::Storage).then(|| Tail::of(&o.host_s)),
                })
            };
            tiers.push(TierFigures {
                kind,
                entries: t.entries,
                kv_bytes_written_gb: t.bytes_written as f64 / GIB,
                kv_bytes_read_gb: t.bytes_read as f64 / GIB,
                read_bandwidth_gbps: t.bytes_read as f64 / GIB / elapsed,
                write_bandwidth_gbps: t.bytes_written as f64 / GIB / elapsed,
                read: tails(false),
                write: tails(true),
            });
            read_bytes += t.bytes_read;
            write_bytes += t.bytes_written;
        }
        let (gpu, cpu, nvme) = (
            counters(TierKind::Gpu),
            counters(TierKind::Cpu),
            counters(TierKind::Storage),
        );
        let all_ops = |write: bool| {
            KINDS
                .iter()
                .map(|&k| ops(k, write).map_or(0, |o| o.total_s.len()))
                .sum::<usize>()
        };
        let latency = latency_assessment(c, rate(hits, misses));
        let throughput = Health::of(vec![
            criterion(
                "Storage read bandwidth",
                0.0,
                nvme.bytes_read as f64 / GIB / elapsed,
                "GiB/s",
                nvme.bytes_read > 0,
            ),
            criterion(
                "Storage write bandwidth",
                0.0,
                nvme.bytes_written as f64 / GIB / elapsed,
                "GiB/s",
                nvme.bytes_written > 0,
            ),
        ]);
        let bpt = input.config.model.bytes_per_token().max(1);
        // A stored entry is one rank's share of the KV of its tokens.
        let stored_per_token = (bpt / u64::from(input.config.tensor_parallel.max(1))).max(1);
        let cached_tokens = nvme.bytes_read / stored_per_token;
        let cache_stats = CacheStats {
            cache_hit_rate: rate(hits, misses),
            cache_hits: hits,
            cache_misses: misses,
            tiers,
            gpu_memory_used_gb: gpu.used_bytes as f64 / GIB,
            cpu_memory_used_gb: cpu.used_bytes as f64 / GIB,
            offloads_cpu: gpu.demotions,
            offloads_storage: cpu.demotions,
            prefill_writes: c.prefill_writes,
            decode_reads: c.decode_reads,
            system_prompt_hits: sp_hits,
            user_cache_hits: user_hits,
            multi_turn_hits: mt_hits,
            total_read_bytes: read_bytes,
            total_write_bytes: write_bytes,
            total_read_gb: read_bytes as f64 / GIB,
            total_write_gb: write_bytes as f64 / GIB,
            read_write_ratio: if write_bytes == 0 {
                0.0
            } else {
                read_bytes as f64 / write_bytes as f64
            },
            read_iops: all_ops(false),
            write_iops: all_ops(true),
            storage_tokens_processed: (nvme.bytes_read + nvme.bytes_written) / bpt,
            storage_health: match input.profile {
                Profile::Throughput => throughput.clone(),
                Profile::Latency => latency.clone(),
            },
        };
        let o = input.outcome;
        let autoscaling = input.config.autoscale.map(|a| Autoscaling {
            mode: a.mode,
            target_saturation: a.target_saturation,
            interval_s: a.interval_s,
            initial_users: input.config.users,
            final_users: o.final_users,
            scale_events: o.scale_events.len(),
            peak_live_users: o.timeline.iter().map(|t| t.live_users).max().unwrap_or(0),
            peak_users: o.peak.map(|p| p.0),
            peak_tokens_per_sec: o.peak.map(|p| p.1),
        });
        let summary = Summary {
            total_requests: c.requests.len(),
            total_tokens: tokens,
            elapsed_time: elapsed,
            avg_throughput_tokens_per_sec: tokens as f64 / elapsed,
            total_storage_io_time: storage_total,
            storage_throughput_tokens_per_sec: if storage_total > 0.0 {
                tokens as f64 / storage_total
            } else {
                0.0
            },
            requests_per_second: c.requests.len() as f64 / elapsed,
            end_to_end_latency_ms: LatencyMs::of(&e2e),
            storage_io_latency_ms: LatencyMs::of(&storage),
            generation_latency_ms: LatencyMs::of(&generation),
            cache_stats,
            qos_metrics: qos_metrics(c, input.profile),
            prefix_cache_stats: PrefixCacheStats {
                prefix_hits: sp_hits,
                prefix_misses: sp_misses,
                system_prompt_reuse: sp_hits,
                common_phrase_reuse: 0,
                bytes_saved: c.prefix_bytes_saved,
            },
            autoscaling_stats: o.scale_events.clone(),
            autoscaling_summary: AutoscalingSummary(autoscaling),
            multi_turn_stats: HitCounts {
                cache_hits: mt_hits,
                cache_misses: mt_misses,
                hit_rate: rate(mt_hits, mt_misses),
            },
        };
        let latency_histograms = histograms(
            [
                ("end_to_end".to_owned(), &e2e),
                ("storage_io".to_owned(), &storage),
                ("generation".to_owned(), &generation),
            ]
            .into_iter()
            .chain(c.ops.iter().map(|((kind, write), o)| {
                let dir = if *write { "write" } else { "read" };
                (format!("{}_{dir}", kind.name()), &o.total_s)
            })),
        );
        BenchReport {
            requests_completed: c.requests.len(),
            total_tokens_generated: tokens,
            total_storage_io_latency: storage_total,
            total_generation_latency: generation.iter().sum(),
            end_to_end_latencies: e2e,
            storage_latencies: storage,
            generation_latencies: generation,
            throughput_timeline: o.timeline.clone(),
            prefill_latencies: c.requests.iter().map(|r| r.prefill_s).collect(),
            decode_latencies: c.requests.iter().map(|r| r.decode_s).collect(),
            multi_turn_cache_hits: mt_hits,
            multi_turn_cache_misses: mt_misses,
            seed: input.config.seed,
            summary,
            kvtrace: Extras {
                storage_io_throughput_gib_per_s: (read_bytes + write_bytes) as f64 / GIB / elapsed,
                cached_tokens,
                cached_tokens_per_sec: cached_tokens as f64 / elapsed,
                latency_with_demotions: with_demotions(c, input.demotions),
                storage_io: input.storage_io.clone(),
                requests_after_deadline: o.late,
                hit_rates: HitRates {
                    system_prompt: rate(sp_hits, sp_misses),
                    multi_turn: rate(mt_hits, mt_misses),
                    user: rate(user_hits, user_misses),
                    rag: rate(rag_hits, rag_misses),
                },
                rag_hits,
                rag_misses,
                entries_without_room: c.no_room,
                io_errors: c.io_errors
                    + input
                        .tiers
                        .iter()
                        .map(|(_, t)| t.queued_write_errors)
                        .sum::<u64>(),
                first_io_error: c.first_io_error.clone(),
                failed_demotions: input.tiers.iter().map(|(_, t)| t.move_errors).sum(),
                interrupted: o.interrupted,
                assessments: Assessments {
                    latency,
                    throughput,
                },
                tiers: input
                    .tiers
                    .iter()
                    .map(|(k, t)| TierReport {
                        tier: k.name(),
                        counters: t.clone(),
                    })
                    .collect(),
                rank: None,
                mlperf: None,
                latency_histograms,
            },
            parameters: input.parameters,
            profile: input.profile,
        }
    }

    /// The console summary: what a user looks at first.
    pub fn console(&self) -> String {
        let s = &self.summary;
        let c = &s.cache_stats;
        let mut out = String::from("kvtrace bench\n");
        if let Some(r) = &self.kvtrace.rank {
            let cross: u64 = self
                .kvtrace
                .tiers
                .iter()
                .map(|t| t.counters.cross_rank_hits)
                .sum();
            out += &format!(
                "  rank {} of {} ({}), seed {}; reads of other ranks' entries: {cross}\n",
                r.rank.rank, r.rank.world_size, r.rank.source, self.seed
            );
        }
        if self.kvtrace.interrupted {
            out += "  stopped by a signal: partial results, marked \"interrupted\": true in the report\n";
        }
        let late = match self.kvtrace.requests_after_deadline {
            0 => String::new(),
            n => format!(" (+{n} finished after the deadline, not counted)"),
        };
        out += &format!(
            "  requests {} in {:.1} s ({:.2}/s), {} tokens{late}\n",
            s.total_requests, s.elapsed_time, s.requests_per_second, s.total_tokens
        );
        out += &format!(
            "  throughput: {:.1} tok/s wall clock, {:.1} tok/s storage, {:.3} GiB/s storage I/O\n",
            s.avg_throughput_tokens_per_sec,
            s.storage_throughput_tokens_per_sec,
            self.kvtrace.storage_io_throughput_gib_per_s
        );
        for (label, l) in [
            ("E2E", &s.end_to_end_latency_ms),
            ("storage", &s.storage_io_latency_ms),
        ] {
            out += &format!(
                "  {label} latency ms: p50 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}\n",
                l.p50, l.p95, l.p99, l.p999
            );
        }
        let storage = c.tier(TierKind::Storage);
        out += &format!(
            "  cache hit rate {:.1} %, read {:.2} GiB, written {:.2} GiB (storage tier: read {:.2}, written {:.2})\n",
            100.0 * c.cache_hit_rate,
            c.total_read_gb,
            c.total_write_gb,
            storage.map_or(0.0, |t| t.kv_bytes_read_gb),
            storage.map_or(0.0, |t| t.kv_bytes_written_gb),
        );
        if let Some(t) = storage {
            let device = |dir: &str| {
                self.kvtrace
                    .latency_with_demotions
                    .iter()
                    .find(|l| l.tier == "storage" && l.direction == dir)
                    .and_then(|l| l.device_p95_ms)
                    .unwrap_or(0.0)
            };
            out += &format!(
                "  storage only: {:.1} cached tok/s ({} tokens read back from {} storage entries); device P95 with demotions: read {:.1} ms, write {:.1} ms\n",
                self.kvtrace.cached_tokens_per_sec,
                self.kvtrace.cached_tokens,
                t.entries,
                device("read"),
                device("write"),
            );
        }
        if let Some(io) = self
            .kvtrace
            .storage_io
            .as_ref()
            .filter(|io| io.mode == "asynchronous")
        {
            let k = &io.calls;
            out += &format!(
                "  storage I/O asynchronous ({} workers, depth {}): queue wait p50 {:.2} p99 {:.2} ms, service p50 {:.2} p99 {:.2} ms, end to end p99 {:.2} ms; waited {:.2} s for queue room, drained in {:.2} s\n",
                io.workers.unwrap_or(0),
                io.queue_depth.unwrap_or(0),
                k.queue_wait_ms.p50_ms,
                k.queue_wait_ms.p99_ms,
                k.service_ms.p50_ms,
                k.service_ms.p99_ms,
                k.end_to_end_ms.p99_ms,
                k.submit_stall_s,
                k.drain_s,
            );
        }
        let health = &c.storage_health;
        let failed: Vec<String> = health
            .criteria
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("{}: {:.3} {}", c.name, c.actual, c.unit))
            .collect();
        let why = if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join("; "))
        };
        out += &format!(
            "  assessment ({} profile): {}{why}\n",
            self.profile.name(),
            health.overall_status
        );
        out
    }
}

impl Report for BenchReport {
    fn document(&self) -> Result<Json> {
        serde_json::to_value(self).map_err(|e| Error::io("cannot encode JSON", e.into()))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    /// kv-cache.py's tables; in rank mode each with a first column `rank`.
    fn tables(&self) -> Vec<Table> {
        let tables = sheets::tables(self);
        match &self.kvtrace.rank {
            Some(r) => {
                let rank = kvtrace_report::Cell::Count(u64::from(r.rank.rank));
                tables
                    .into_iter()
                    .map(|t| t.with_first_column("rank", &rank))
                    .collect()
            }
            None => tables,
        }
    }

    fn terminal(&self) -> String {
        self.console()
    }
}

/// Each named series of seconds as an encoded HdrHistogram of milliseconds.
fn histograms<'a>(
    series: impl Iterator<Item = (String, &'a Vec<f64>)>,
) -> BTreeMap<String, String> {
    series
        .filter(|(_, seconds)| !seconds.is_empty())
        .map(|(name, seconds)| {
            let mut h = LatencyHistogram::new();
            for s in seconds {
                h.record_ms(s * 1e3);
            }
            (name, h.encode())
        })
        .collect()
}

/// The latency profile: storage write and read P95 (device time), CPU P95, hit rate.
fn latency_assessment(c: &Collected, hit_rate: f64) -> Health {
    let mut criteria = Vec::new();
    let p95 = |values: &[f64]| percentile(&sorted_ms(values), 95.0);
    if let Some(o) = c.ops.get(&(TierKind::Storage, true)) {
        // Device time is the durability flush; without one, the whole write.
        let flushed = o.device_s.iter().any(|&d| d > 0.0);
        let v = p95(if flushed { &o.device_s } else { &o.total_s });
        criteria.push(criterion(
            "Storage write P95 < 500ms",
            500.0,
            v,
            "ms",
            v < 500.0,
        ));
    }
    if let Some(o) = c.ops.get(&(TierKind::Storage, false)) {
        let v = p95(&o.device_s);
        criteria.push(criterion(
            "Storage read P95 < 200ms",
            200.0,
            v,
            "ms",
            v < 200.0,
        ));
    }
    let cpu: Vec<f64> = [true, false]
        .iter()
        .filter_map(|&w| c.ops.get(&(TierKind::Cpu, w)))
        .flat_map(|o| o.total_s.iter().copied())
        .collect();
    if !cpu.is_empty() {
        let v = p95(&cpu);
        criteria.push(criterion("CPU RAM P95 < 150ms", 150.0, v, "ms", v < 150.0));
    }
    if !c.hits.is_empty() {
        criteria.push(criterion(
            "Cache hit rate > 30%",
            0.3,
            hit_rate,
            "ratio",
            hit_rate > 0.3,
        ));
    }
    Health::of(criteria)
}

/// Per QoS level: requests, latency, and compliance with its P95 target (kv-cache.py's
/// definition) plus kvtrace's check of the P99, P99.9 and P99.99 targets.
fn qos_metrics(c: &Collected, profile: Profile) -> QosMetrics {
    let levels = QosLevel::ALL.map(|level| {
        let e2e: Vec<f64> = c
            .requests
            .iter()
            .filter(|r| r.qos == level)
            .map(|r| r.e2e_s)
            .collect();
        if e2e.is_empty() {
            return (level, QosLevelReport::NoData);
        }
        let ms = sorted_ms(&e2e);
        let targets = level.targets_ms();
        let violations = ms.iter().filter(|&&v| v > targets[0]).count();
        let compliance = 1.0 - violations as f64 / ms.len() as f64;
        let tail = [(99.0, targets[1]), (99.9, targets[2]), (99.99, targets[3])]
            .iter()
            .map(|&(p, t)| {
                let actual = percentile(&ms, p);
                TailTarget {
                    percentile: p,
                    target_ms: t,
                    actual_ms: actual,
                    met: actual <= t,
                }
            })
            .collect();
        let figures = QosFigures {
            total_requests: ms.len(),
            latency_ms: QosLatency {
                mean: mean(&ms),
                p50: percentile(&ms, 50.0),
                p95: percentile(&ms, 95.0),
                p99: percentile(&ms, 99.0),
                max: ms.last().copied().unwrap_or(0.0),
            },
            sla: Sla {
                target_p95_ms: targets[0],
                actual_p95_ms: percentile(&ms, 95.0),
                compliance,
                met: match profile {
                    Profile::Throughput => SlaMet::NotJudged,
                    Profile::Latency => SlaMet::Judged(compliance >= 0.95),
                },
                kvtrace_tail_targets: tail,
            },
        };
        (level, QosLevelReport::Served(figures))
    });
    QosMetrics(levels.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::IoTime;

    fn times(device_s: &[f64]) -> OpTimes {
        let mut o = OpTimes::default();
        for &d in device_s {
            o.push(IoTime {
                host_s: 0.0,
                device_s: d,
            });
        }
        o
    }

    #[test]
    fn demotion_io_is_pooled_with_the_requests_own_and_counted_apart() {
        let mut c = Collected::default();
        c.ops.insert((TierKind::Storage, true), times(&[0.1, 0.2]));
        let demotions = BTreeMap::from([
            ((TierKind::Storage, true), times(&[0.3])),
            ((TierKind::Cpu, false), times(&[0.05])),
        ]);
        let got = with_demotions(&c, &demotions);
        assert_eq!(got.len(), 2, "{got:?}");
        let cpu = &got[0];
        assert_eq!((cpu.tier, cpu.direction), ("cpu", "read"));
        assert_eq!((cpu.request_ops, cpu.demotion_ops), (0, 1));
        assert_eq!(cpu.device_p95_ms, None, "device time is the storage tier's");
        let w = &got[1];
        assert_eq!((w.tier, w.direction), ("storage", "write"));
        assert_eq!((w.request_ops, w.demotion_ops), (2, 1));
        // 100, 200 and 300 ms: the median 200; the P95 interpolates 90 % of the way from
        // 200 to 300 (the requests' own two alone would give 195).
        assert!((w.p50_ms - 200.0).abs() < 1e-9);
        assert!((w.p95_ms - 290.0).abs() < 1e-9, "{}", w.p95_ms);
        assert!((w.device_p95_ms.unwrap() - 290.0).abs() < 1e-9);
    }
}
