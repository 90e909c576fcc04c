//! The run's results in kv-cache.py's JSON shape (same keys and units, so existing scripts
//! keep working), with kvtrace's additions under `kvtrace`: both pass/fail profiles, every
//! QoS target, the storage I/O throughput, requests finished after the deadline.

use serde_json::{json, Map, Value as Json};

use super::metrics::{percentile, Category, Collected, OpTimes};
use super::run::{BenchConfig, RunOutcome};
use super::tiers::{TierCounters, TierKind};
use super::users::QosLevel;

const GIB: f64 = (1u64 << 30) as f64;

/// The percentiles every latency figure reports, and their key suffixes.
const TAIL: [(f64, &str); 5] = [
    (50.0, "p50"),
    (95.0, "p95"),
    (99.0, "p99"),
    (99.9, "p999"),
    (99.99, "p9999"),
];

/// `{mean, p50, p95, p99, p999, p9999}` of seconds, in milliseconds.
fn latency_ms(values: &[f64]) -> Json {
    let ms = sorted_ms(values);
    let mean = if ms.is_empty() {
        0.0
    } else {
        ms.iter().sum::<f64>() / ms.len() as f64
    };
    let mut out = Map::new();
    out.insert("mean".into(), mean.into());
    for (p, label) in TAIL {
        out.insert(label.into(), percentile(&ms, p).into());
    }
    Json::Object(out)
}

/// `<prefix>_p50_ms` … `<prefix>_p9999_ms` of seconds.
fn insert_tail(map: &mut Map<String, Json>, prefix: &str, values: &[f64]) {
    let ms = sorted_ms(values);
    for (p, label) in TAIL {
        map.insert(format!("{prefix}_{label}_ms"), percentile(&ms, p).into());
    }
}

fn sorted_ms(values: &[f64]) -> Vec<f64> {
    let mut ms: Vec<f64> = values.iter().map(|s| s * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// One pass/fail criterion.
fn criterion(name: &str, target: f64, actual: f64, unit: &str, passed: bool) -> Json {
    json!({"name": name, "target": target, "actual": actual, "unit": unit, "passed": passed})
}

fn health(criteria: Vec<Json>) -> Json {
    let passed = criteria.iter().filter(|c| c["passed"] == true).count();
    json!({
        "overall_status": if passed == criteria.len() { "PASS" } else { "FAIL" },
        "passed_count": passed,
        "total_count": criteria.len(),
        "criteria": criteria,
    })
}

/// Everything the report needs besides the run itself.
pub struct ReportInput<'a> {
    pub config: &'a BenchConfig,
    pub outcome: &'a RunOutcome,
    pub tiers: &'a [(TierKind, TierCounters)],
    /// `latency` or `throughput`: which assessment is `storage_health`.
    pub profile: &'a str,
}

fn tier<'a>(input: &'a ReportInput<'_>, kind: TierKind) -> Option<&'a TierCounters> {
    input.tiers.iter().find(|(k, _)| *k == kind).map(|(_, c)| c)
}

fn ops(c: &Collected, kind: TierKind, write: bool) -> Option<&OpTimes> {
    c.ops.get(&(kind, write))
}

/// The JSON document.
pub fn build(input: &ReportInput<'_>) -> Json {
    let c = &input.outcome.collected;
    let elapsed = input.outcome.elapsed_s.max(1e-9);
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
    let rate = |h: u64, m: u64| {
        if h + m == 0 {
            0.0
        } else {
            h as f64 / (h + m) as f64
        }
    };

    let mut cache = Map::new();
    cache.insert("cache_hit_rate".into(), rate(hits, misses).into());
    cache.insert("cache_hits".into(), hits.into());
    cache.insert("cache_misses".into(), misses.into());
    let (mut read_bytes, mut write_bytes) = (0u64, 0u64);
    for kind in [TierKind::Gpu, TierKind::Cpu, TierKind::Storage] {
        let t = tier(input, kind).cloned().unwrap_or_default();
        let name = kind.name();
        cache.insert(format!("{name}_entries"), t.entries.into());
        cache.insert(
            format!("tier_{name}_kv_bytes_written_gb"),
            (t.bytes_written as f64 / GIB).into(),
        );
        cache.insert(
            format!("tier_{name}_kv_bytes_read_gb"),
            (t.bytes_read as f64 / GIB).into(),
        );
        cache.insert(
            format!("tier_{name}_read_bandwidth_gbps"),
            (t.bytes_read as f64 / GIB / elapsed).into(),
        );
        cache.insert(
            format!("tier_{name}_write_bandwidth_gbps"),
            (t.bytes_written as f64 / GIB / elapsed).into(),
        );
        read_bytes += t.bytes_read;
        write_bytes += t.bytes_written;
        for (write, dir) in [(false, "read"), (true, "write")] {
            if let Some(o) = ops(c, kind, write) {
                insert_tail(&mut cache, &format!("{name}_{dir}"), &o.total_s);
                if kind == TierKind::Storage {
                    insert_tail(&mut cache, &format!("storage_{dir}_device"), &o.device_s);
                    insert_tail(&mut cache, &format!("storage_{dir}_host"), &o.host_s);
                }
            }
        }
    }
    let gpu = tier(input, TierKind::Gpu).cloned().unwrap_or_default();
    let cpu = tier(input, TierKind::Cpu).cloned().unwrap_or_default();
    let nvme = tier(input, TierKind::Storage).cloned().unwrap_or_default();
    cache.insert(
        "gpu_memory_used_gb".into(),
        (gpu.used_bytes as f64 / GIB).into(),
    );
    cache.insert(
        "cpu_memory_used_gb".into(),
        (cpu.used_bytes as f64 / GIB).into(),
    );
    cache.insert("offloads_cpu".into(), gpu.demotions.into());
    cache.insert("offloads_storage".into(), cpu.demotions.into());
    cache.insert("prefill_writes".into(), c.prefill_writes.into());
    cache.insert("decode_reads".into(), c.decode_reads.into());
    cache.insert("system_prompt_hits".into(), sp_hits.into());
    cache.insert("common_phrase_hits".into(), 0.into());
    cache.insert("user_cache_hits".into(), category(Category::User).0.into());
    cache.insert("multi_turn_hits".into(), mt_hits.into());
    cache.insert("total_read_bytes".into(), read_bytes.into());
    cache.insert("total_write_bytes".into(), write_bytes.into());
    cache.insert("total_read_gb".into(), (read_bytes as f64 / GIB).into());
    cache.insert("total_write_gb".into(), (write_bytes as f64 / GIB).into());
    cache.insert(
        "read_write_ratio".into(),
        (if write_bytes == 0 {
            0.0
        } else {
            read_bytes as f64 / write_bytes as f64
        })
        .into(),
    );
    let count = |kind: TierKind, write: bool| ops(c, kind, write).map_or(0, |o| o.total_s.len());
    let all_ops = |write: bool| {
        [TierKind::Gpu, TierKind::Cpu, TierKind::Storage]
            .iter()
            .map(|&k| count(k, write))
            .sum::<usize>()
    };
    cache.insert("read_iops".into(), all_ops(false).into());
    cache.insert("write_iops".into(), all_ops(true).into());
    let bpt = input.config.model.bytes_per_token().max(1);
    cache.insert(
        "storage_tokens_processed".into(),
        ((nvme.bytes_read + nvme.bytes_written) / bpt).into(),
    );

    let latency_profile = latency_assessment(c, rate(hits, misses));
    let throughput_profile = health(vec![
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
    let chosen = if input.profile == "throughput" {
        throughput_profile.clone()
    } else {
        latency_profile.clone()
    };
    cache.insert("storage_health".into(), chosen);

    let qos = qos_metrics(c, input.profile == "throughput");
    let summary = json!({
        "total_requests": c.requests.len(),
        "total_tokens": tokens,
        "elapsed_time": elapsed,
        "avg_throughput_tokens_per_sec": tokens as f64 / elapsed,
        "total_storage_io_time": storage_total,
        "storage_throughput_tokens_per_sec": if storage_total > 0.0 { tokens as f64 / storage_total } else { 0.0 },
        "requests_per_second": c.requests.len() as f64 / elapsed,
        "end_to_end_latency_ms": latency_ms(&e2e),
        "storage_io_latency_ms": latency_ms(&storage),
        "generation_latency_ms": latency_ms(&generation),
        "cache_stats": Json::Object(cache),
        "qos_metrics": qos,
        "prefix_cache_stats": {
            "prefix_hits": sp_hits,
            "prefix_misses": sp_misses,
            "system_prompt_reuse": sp_hits,
            "common_phrase_reuse": 0,
            "bytes_saved": c.prefix_bytes_saved,
        },
        "autoscaling_stats": input.outcome.scale_events,
        "autoscaling_summary": autoscaling_summary(input),
        "multi_turn_stats": {
            "cache_hits": mt_hits,
            "cache_misses": mt_misses,
            "hit_rate": rate(mt_hits, mt_misses),
        },
    });
    let prefill: Vec<f64> = c.requests.iter().map(|r| r.prefill_s).collect();
    let decode: Vec<f64> = c.requests.iter().map(|r| r.decode_s).collect();
    json!({
        "requests_completed": c.requests.len(),
        "total_tokens_generated": tokens,
        "total_storage_io_latency": storage_total,
        "total_generation_latency": generation.iter().sum::<f64>(),
        "end_to_end_latencies": e2e,
        "storage_latencies": storage,
        "generation_latencies": generation,
        "throughput_timeline": input.outcome.timeline,
        "prefill_latencies": prefill,
        "decode_latencies": decode,
        "multi_turn_cache_hits": mt_hits,
        "multi_turn_cache_misses": mt_misses,
        "seed": input.config.seed,
        "summary": summary,
        "kvtrace": {
            "storage_io_throughput_gib_per_s": (read_bytes + write_bytes) as f64 / GIB / elapsed,
            "requests_after_deadline": input.outcome.late,
            "hit_rates": {
                "system_prompt": rate(sp_hits, sp_misses),
                "multi_turn": rate(mt_hits, mt_misses),
                "user": rate(category(Category::User).0, category(Category::User).1),
                "rag": rate(category(Category::Rag).0, category(Category::Rag).1),
            },
            "rag_hits": category(Category::Rag).0,
            "rag_misses": category(Category::Rag).1,
            "entries_without_room": c.no_room,
            "io_errors": c.io_errors,
            "first_io_error": c.first_io_error,
            "failed_demotions": input.tiers.iter().map(|(_, t)| t.move_errors).sum::<u64>(),
            "interrupted": input.outcome.interrupted,
            "assessments": {"latency": latency_profile, "throughput": throughput_profile},
            "tiers": input.tiers.iter().map(|(k, t)| json!({"tier": k.name(), "counters": t})).collect::<Vec<_>>(),
        },
    })
}

fn autoscaling_summary(input: &ReportInput<'_>) -> Json {
    let Some(a) = input.config.autoscale else {
        return json!({});
    };
    let o = input.outcome;
    let mut out = json!({
        "mode": a.mode,
        "target_saturation": a.target_saturation,
        "interval_s": a.interval_s,
        "initial_users": input.config.users,
        "final_users": o.final_users,
        "scale_events": o.scale_events.len(),
        "peak_live_users": o.timeline.iter().map(|t| t.live_users).max().unwrap_or(0),
    });
    if let Some((users, tps)) = o.peak {
        out["peak_users"] = users.into();
        out["peak_tokens_per_sec"] = tps.into();
    }
    out
}

/// The latency profile: storage write and read P95 (device time), CPU P95, hit rate.
fn latency_assessment(c: &Collected, hit_rate: f64) -> Json {
    let mut criteria = Vec::new();
    let p95 = |values: &[f64]| percentile(&sorted_ms(values), 95.0);
    if let Some(o) = ops(c, TierKind::Storage, true) {
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
    if let Some(o) = ops(c, TierKind::Storage, false) {
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
        .filter_map(|&w| ops(c, TierKind::Cpu, w))
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
    health(criteria)
}

/// Per QoS level: requests, latency, and compliance with its P95 target (kv-cache.py's
/// definition) plus kvtrace's check of the P99, P99.9 and P99.99 targets.
fn qos_metrics(c: &Collected, throughput_profile: bool) -> Json {
    let mut out = Map::new();
    for level in QosLevel::ALL {
        let e2e: Vec<f64> = c
            .requests
            .iter()
            .filter(|r| r.qos == level)
            .map(|r| r.e2e_s)
            .collect();
        if e2e.is_empty() {
            out.insert(level.name().into(), json!({"no_data": true}));
            continue;
        }
        let ms = sorted_ms(&e2e);
        let targets = level.targets_ms();
        let violations = ms.iter().filter(|&&v| v > targets[0]).count();
        let compliance = 1.0 - violations as f64 / ms.len() as f64;
        let tail: Vec<Json> = [(99.0, targets[1]), (99.9, targets[2]), (99.99, targets[3])]
            .iter()
            .map(|&(p, t)| {
                let actual = percentile(&ms, p);
                json!({"percentile": p, "target_ms": t, "actual_ms": actual, "met": actual <= t})
            })
            .collect();
        out.insert(
            level.name().into(),
            json!({
                "total_requests": ms.len(),
                "latency_ms": {
                    "mean": ms.iter().sum::<f64>() / ms.len() as f64,
                    "p50": percentile(&ms, 50.0),
                    "p95": percentile(&ms, 95.0),
                    "p99": percentile(&ms, 99.0),
                    "max": ms.last().copied().unwrap_or(0.0),
                },
                "sla": {
                    "target_p95_ms": targets[0],
                    "actual_p95_ms": percentile(&ms, 95.0),
                    "compliance": compliance,
                    "met": if throughput_profile { Json::from("N/A (throughput mode)") } else { Json::from(compliance >= 0.95) },
                    "kvtrace_tail_targets": tail,
                },
            }),
        );
    }
    Json::Object(out)
}
