//! Mock engine arguments, as the JSON of `--extra-engine-args`, `--prefill-engine-args` and
//! `--decode-engine-args` gives them: the same field names and defaults as Dynamo's
//! `MockEngineArgs`, so existing argument files keep working. An unknown field is an error
//! naming it; fields kvtrace accepts but does not model are reported as warnings.

use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::{json_reason, short};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineType {
    Vllm,
    Sglang,
    Trtllm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerType {
    Aggregated,
    Prefill,
    Decode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preemption {
    /// Preempt the newest running request (vLLM's default).
    Lifo,
    Fifo,
}

/// How the SGLang scheduler orders its waiting queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglangPolicy {
    Fifo,
    /// Longest prefix match first (FIFO once more than 128 requests wait).
    Lpm,
}

/// The `sglang` object of the engine arguments, SGLang's scheduler defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SglangArgs {
    pub schedule_policy: SglangPolicy,
    pub max_prefill_tokens: u64,
    pub chunked_prefill_size: u64,
    pub clip_max_new_tokens: u64,
    pub schedule_conservativeness: f64,
}

impl Default for SglangArgs {
    fn default() -> Self {
        SglangArgs {
            schedule_policy: SglangPolicy::Fifo,
            max_prefill_tokens: 16384,
            chunked_prefill_size: 8192,
            clip_max_new_tokens: 4096,
            schedule_conservativeness: 1.0,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RawSglang {
    schedule_policy: Option<String>,
    page_size: Option<u32>,
    max_prefill_tokens: Option<u64>,
    chunked_prefill_size: Option<u64>,
    clip_max_new_tokens: Option<u64>,
    schedule_conservativeness: Option<f64>,
}

impl SglangArgs {
    /// Parses the `sglang` object; returns its page size too.
    fn from_json(value: &Json) -> Result<(SglangArgs, Option<u32>), String> {
        let raw: RawSglang = serde_json::from_value(value.clone())
            .map_err(|e| format!("sglang: {}", json_reason(&e)))?;
        let schedule_policy = match raw.schedule_policy.as_deref() {
            None | Some("fifo") | Some("fcfs") => SglangPolicy::Fifo,
            Some("lpm") => SglangPolicy::Lpm,
            Some(other) => {
                return Err(format!(
                    "sglang.schedule_policy {other:?}: expected fifo, fcfs or lpm"
                ))
            }
        };
        let mut s = SglangArgs {
            schedule_policy,
            ..SglangArgs::default()
        };
        for (name, value, slot) in [
            (
                "max_prefill_tokens",
                raw.max_prefill_tokens,
                &mut s.max_prefill_tokens,
            ),
            (
                "chunked_prefill_size",
                raw.chunked_prefill_size,
                &mut s.chunked_prefill_size,
            ),
            (
                "clip_max_new_tokens",
                raw.clip_max_new_tokens,
                &mut s.clip_max_new_tokens,
            ),
        ] {
            match value {
                Some(0) => return Err(format!("sglang.{name} 0: expected at least 1")),
                Some(v) => *slot = v,
                None => {}
            }
        }
        if let Some(c) = raw.schedule_conservativeness {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!(
                    "sglang.schedule_conservativeness {}: expected a positive number",
                    short(c)
                ));
            }
            s.schedule_conservativeness = c;
        }
        Ok((s, raw.page_size.filter(|&p| p > 0)))
    }
}

/// The resolved engine configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineArgs {
    pub engine_type: EngineType,
    pub num_gpu_blocks: u64,
    pub block_size: u32,
    pub max_model_len: Option<u64>,
    pub max_num_seqs: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    pub enable_prefix_caching: bool,
    pub enable_chunked_prefill: bool,
    pub speedup_ratio: f64,
    pub decode_speedup_ratio: f64,
    pub dp_size: u32,
    /// AISimulate's vLLM cadence for ranks of attention DP: a rank starts prefill work
    /// only on every this-many-th pass of its worker while it decodes (1: every pass).
    pub prefill_schedule_interval: u32,
    pub worker_type: WorkerType,
    pub preemption: Preemption,
    /// GPUs behind one worker for the gpu-hours figures (tensor parallel size × DP size).
    pub tp_size: u32,
    /// KV bytes per token and link GB/s for the disaggregated transfer model (a prefill
    /// worker's own values time its handoffs).
    pub kv_bytes_per_token: Option<u64>,
    pub kv_transfer_bandwidth: Option<f64>,
    pub kv_transfer_timing: TransferTiming,
    pub sglang: SglangArgs,
    /// Whose scheduler model the engine follows where the two disagree.
    pub engine_version: EngineVersion,
}

/// The reference whose scheduler the engines reproduce where the two disagree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineVersion {
    /// Dynamo 1.4.2's mocker: every request that emits in a pass pays the decode step, whose
    /// time follows (for vLLM) the KV blocks resident in the pool.
    #[default]
    Dynamo142,
    /// AISimulate 0.13's engine: the first token comes out of the prefill forward pass for
    /// free, vLLM's decode step's time follows the decoding requests' context lengths, and
    /// SGLang's scheduler runs prefill passes alone (see [`crate::sglang`]); legacy agentic
    /// rows are ordered by id.
    Aisimulate013,
}

/// Which prompt tokens a handoff moves over the link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransferTiming {
    /// The whole prompt.
    #[default]
    FullPrompt,
    /// Only the blocks the decode worker did not already hold.
    DestinationMissing,
}

impl Default for EngineArgs {
    fn default() -> Self {
        EngineArgs {
            engine_type: EngineType::Vllm,
            num_gpu_blocks: 16384,
            block_size: 64,
            max_model_len: None,
            max_num_seqs: Some(256),
            max_num_batched_tokens: Some(8192),
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            speedup_ratio: 1.0,
            decode_speedup_ratio: 1.0,
            dp_size: 1,
            prefill_schedule_interval: 1,
            worker_type: WorkerType::Aggregated,
            preemption: Preemption::Lifo,
            tp_size: 1,
            kv_bytes_per_token: None,
            kv_transfer_bandwidth: None,
            kv_transfer_timing: TransferTiming::FullPrompt,
            sglang: SglangArgs::default(),
            engine_version: EngineVersion::Dynamo142,
        }
    }
}

/// `Some(None)` is an explicit JSON null ("unbounded"); `None` is an absent field.
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The JSON fields; everything optional, unknown ones refused.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Raw {
    engine_type: Option<String>,
    num_gpu_blocks: Option<u64>,
    block_size: Option<u32>,
    max_model_len: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    max_num_seqs: Option<Option<u64>>,
    #[serde(deserialize_with = "nullable")]
    max_num_batched_tokens: Option<Option<u64>>,
    enable_prefix_caching: Option<bool>,
    enable_chunked_prefill: Option<bool>,
    speedup_ratio: Option<f64>,
    decode_speedup_ratio: Option<f64>,
    dp_size: Option<u32>,
    prefill_schedule_interval: Option<u32>,
    /// AISimulate's SGLang rounds without prefill after a synchronized prefill; only 0
    /// (none) is modelled.
    prefill_decode_interval: Option<u64>,
    worker_type: Option<String>,
    is_prefill: Option<bool>,
    is_decode: Option<bool>,
    preemption_mode: Option<String>,
    aic_tp_size: Option<u32>,
    kv_bytes_per_token: Option<u64>,
    kv_transfer_bandwidth: Option<f64>,
    kv_transfer_timing_mode: Option<String>,
    router_queue_policy: Option<String>,
    sglang: Option<Json>,
    trtllm: Option<Json>,
    /// kvtrace's own: "dynamo-1.4.2" (default) or "aisimulate-0.13".
    engine_version: Option<String>,
    // Accepted for compatibility; they select models or live-mode plumbing kvtrace does not
    // have, so a value other than null is reported.
    g1_backend: Option<Json>,
    startup_time: Option<Json>,
    planner_profile_data: Option<Json>,
    aic_backend: Option<Json>,
    aic_system: Option<Json>,
    aic_backend_version: Option<Json>,
    aic_model_path: Option<Json>,
    aic_moe_tp_size: Option<Json>,
    aic_moe_ep_size: Option<Json>,
    aic_attention_dp_size: Option<Json>,
    aic_gemm_dtype: Option<Json>,
    aic_moe_dtype: Option<Json>,
    aic_fmha_dtype: Option<Json>,
    aic_kv_cache_dtype: Option<Json>,
    aic_comm_dtype: Option<Json>,
    aic_nextn: Option<Json>,
    aic_nextn_accept_rates: Option<Json>,
    aic_mtp_seed: Option<Json>,
    gpu_memory_utilization: Option<Json>,
    mem_fraction_static: Option<Json>,
    free_gpu_memory_fraction: Option<Json>,
    enable_local_indexer: Option<Json>,
    bootstrap_port: Option<Json>,
    handoff_session_timeout_ms: Option<Json>,
    num_g2_blocks: Option<Json>,
    num_g3_blocks: Option<Json>,
    enable_g4_storage: Option<Json>,
    offload_batch_size: Option<Json>,
    bandwidth_g1_to_g2_gbps: Option<Json>,
    bandwidth_g2_to_g1_gbps: Option<Json>,
    bandwidth_g2_to_g3_gbps: Option<Json>,
    bandwidth_g3_to_g2_gbps: Option<Json>,
    bandwidth_g2_to_g4_gbps: Option<Json>,
    bandwidth_g4_to_g2_gbps: Option<Json>,
    reasoning: Option<Json>,
    response_replay_trace_path: Option<Json>,
    zmq_kv_events_port: Option<Json>,
    zmq_replay_port: Option<Json>,
}

/// Parsed arguments plus what was accepted without effect.
pub struct Parsed {
    pub args: EngineArgs,
    pub warnings: Vec<String>,
    /// The router queue policy override, when given.
    pub router_queue_policy: Option<String>,
}

impl EngineArgs {
    /// Parses the JSON text; errors are one line naming the field.
    pub fn from_json(text: &str) -> Result<Parsed, String> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| json_reason(&e))?;
        let mut args = EngineArgs::default();
        let mut warnings = Vec::new();
        if let Some(t) = &raw.engine_type {
            args.engine_type = match t.as_str() {
                "vllm" => EngineType::Vllm,
                "sglang" => EngineType::Sglang,
                "trtllm" => EngineType::Trtllm,
                other => {
                    return Err(format!(
                        "engine_type {other:?}: expected vllm, sglang or trtllm"
                    ))
                }
            };
        }
        let mut page_size = None;
        if let Some(value) = raw.sglang.as_ref().filter(|v| !v.is_null()) {
            let (sglang, page) = SglangArgs::from_json(value)?;
            args.sglang = sglang;
            page_size = page;
        }
        args.block_size = match (raw.block_size, args.engine_type) {
            (Some(b), _) if b > 0 => b,
            (_, EngineType::Vllm) => 64,
            (_, EngineType::Sglang) => page_size.unwrap_or(1),
            (_, EngineType::Trtllm) => 32,
        };
        // A zero here never schedules anything: the run would end at once with every
        // request unserved, or hold none at all.
        for (name, value) in [
            ("num_gpu_blocks", raw.num_gpu_blocks),
            ("max_num_seqs", raw.max_num_seqs.flatten()),
            (
                "max_num_batched_tokens",
                raw.max_num_batched_tokens.flatten(),
            ),
        ] {
            if value == Some(0) {
                return Err(format!("{name} 0: expected at least 1"));
            }
        }
        if let Some(n) = raw.num_gpu_blocks {
            args.num_gpu_blocks = n;
        }
        args.max_model_len = raw.max_model_len;
        if let Some(v) = raw.max_num_seqs {
            args.max_num_seqs = v;
        }
        if let Some(v) = raw.max_num_batched_tokens {
            args.max_num_batched_tokens = v;
        }
        if let Some(v) = raw.enable_prefix_caching {
            args.enable_prefix_caching = v;
        }
        if let Some(v) = raw.enable_chunked_prefill {
            args.enable_chunked_prefill = v;
        }
        for (name, value, slot) in [
            ("speedup_ratio", raw.speedup_ratio, &mut args.speedup_ratio),
            (
                "decode_speedup_ratio",
                raw.decode_speedup_ratio,
                &mut args.decode_speedup_ratio,
            ),
        ] {
            if let Some(v) = value {
                if !v.is_finite() {
                    return Err(format!("{name} {}: expected a finite number", short(v)));
                }
                *slot = v;
            }
        }
        if let Some(d) = raw.dp_size {
            if d == 0 {
                return Err("dp_size 0: expected at least 1".into());
            }
            args.dp_size = d;
        }
        args.worker_type = match (raw.worker_type.as_deref(), raw.is_prefill, raw.is_decode) {
            (Some("prefill"), ..) | (None, Some(true), _) => WorkerType::Prefill,
            (Some("decode"), ..) | (None, _, Some(true)) => WorkerType::Decode,
            (Some("aggregated") | None, ..) => WorkerType::Aggregated,
            (Some(other), ..) => {
                return Err(format!(
                    "worker_type {other:?}: expected aggregated, prefill or decode"
                ))
            }
        };
        args.preemption = match raw.preemption_mode.as_deref() {
            None | Some("lifo") => Preemption::Lifo,
            Some("fifo") => Preemption::Fifo,
            Some(other) => return Err(format!("preemption_mode {other:?}: expected lifo or fifo")),
        };
        if let Some(tp) = raw.aic_tp_size {
            args.tp_size = tp.max(1);
        }
        args.engine_version = match raw.engine_version.as_deref() {
            None | Some("dynamo-1.4.2") => EngineVersion::Dynamo142,
            Some("aisimulate-0.13") => EngineVersion::Aisimulate013,
            Some(other) => {
                return Err(format!(
                    "engine_version {other:?}: expected dynamo-1.4.2 or aisimulate-0.13"
                ))
            }
        };
        if let Some(interval) = raw.prefill_schedule_interval {
            args.prefill_schedule_interval = interval;
            if interval == 0 {
                return Err("prefill_schedule_interval 0: expected at least 1".into());
            }
            if interval != 1 && args.engine_version == EngineVersion::Dynamo142 {
                return Err(format!(
                    "prefill_schedule_interval {interval}: Dynamo 1.4.2's engine has no prefill cadence (\"engine_version\": \"aisimulate-0.13\" models AISimulate's)"
                ));
            }
        }
        if let Some(rounds) = raw.prefill_decode_interval.filter(|&r| r != 0) {
            return Err(format!(
                "prefill_decode_interval {rounds}: SGLang's rounds without prefill are not modelled (they count idle rounds at one instant); use 0"
            ));
        }
        if args.engine_version == EngineVersion::Aisimulate013 {
            aisimulate_refusal(&args)?;
        }
        // AISimulate's SGLang ranks are attention-DP ranks, each given its share of the
        // chunked-prefill budget and a more eager admission, as SGLang itself sets them up at
        // launch; Dynamo 1.4.2 gives every rank the worker's settings.
        if args.engine_version == EngineVersion::Aisimulate013
            && args.engine_type == EngineType::Sglang
            && args.dp_size > 1
        {
            let whole = args.sglang.chunked_prefill_size;
            args.sglang.chunked_prefill_size = whole / u64::from(args.dp_size);
            if args.sglang.chunked_prefill_size == 0 {
                return Err(format!(
                    "dp_size {}: SGLang's attention DP gives each rank chunked_prefill_size / dp_size tokens, and {whole} / {} is none",
                    args.dp_size, args.dp_size
                ));
            }
            args.sglang.schedule_conservativeness *= 0.3;
        }
        // Dynamo 1.4.2 refuses the limit for the engines whose schedulers it does not reach;
        // AISimulate's schedulers all keep it.
        if args.engine_version == EngineVersion::Dynamo142
            && args.engine_type != EngineType::Vllm
            && args.max_model_len.is_some()
        {
            return Err(
                "max_model_len: Dynamo 1.4.2's engine takes it for engine_type vllm only (\"engine_version\": \"aisimulate-0.13\" takes it for every engine)"
                    .into(),
            );
        }
        args.kv_bytes_per_token = raw.kv_bytes_per_token;
        args.kv_transfer_bandwidth = raw.kv_transfer_bandwidth;
        args.kv_transfer_timing = match raw.kv_transfer_timing_mode.as_deref() {
            None | Some("full_prompt") => TransferTiming::FullPrompt,
            Some("destination_missing") => TransferTiming::DestinationMissing,
            Some(other) => {
                return Err(format!(
                    "kv_transfer_timing_mode {other:?}: expected full_prompt or destination_missing"
                ))
            }
        };
        if let Some(policy) = raw
            .trtllm
            .as_ref()
            .and_then(|t| t.get("capacity_scheduler_policy"))
        {
            if policy.as_str() != Some("guaranteed_no_evict") {
                return Err(format!(
                    "trtllm.capacity_scheduler_policy {policy}: only \"guaranteed_no_evict\" exists"
                ));
            }
        }
        for (name, value) in [
            ("planner_profile_data", &raw.planner_profile_data),
            ("aic_backend", &raw.aic_backend),
            ("aic_nextn", &raw.aic_nextn),
            ("num_g2_blocks", &raw.num_g2_blocks),
            ("num_g3_blocks", &raw.num_g3_blocks),
            ("startup_time", &raw.startup_time),
        ] {
            if value.as_ref().is_some_and(|v| !v.is_null()) {
                warnings.push(format!(
                    "{name} is accepted but not modelled; the polynomial timing model applies"
                ));
            }
        }
        if args.engine_version == EngineVersion::Dynamo142
            && args.engine_type == EngineType::Sglang
            && !args.enable_prefix_caching
        {
            warnings.push(
                "enable_prefix_caching false: Dynamo 1.4.2's SGLang scheduler caches prefixes regardless, and so does its engine here (\"engine_version\": \"aisimulate-0.13\" honours it)"
                    .into(),
            );
        }
        Ok(Parsed {
            args,
            warnings,
            router_queue_policy: raw.router_queue_policy,
        })
    }

    /// Whether `max_model_len` rules a prompt of `prompt_len` tokens out: at or past the
    /// limit, the schedulers of Dynamo 1.4.2 and AISimulate reject it.
    pub fn refuses_prompt(&self, prompt_len: u32) -> bool {
        self.max_model_len
            .is_some_and(|limit| u64::from(prompt_len) >= limit)
    }

    /// The output a request generates: `output_len`, cut to what `max_model_len` leaves after
    /// its prompt (at least one token), where both schedulers stop generating.
    pub fn output_within_model_len(&self, prompt_len: u32, output_len: u32) -> u32 {
        match self.max_model_len {
            Some(limit) => {
                let room = limit.saturating_sub(u64::from(prompt_len));
                output_len
                    .min(u32::try_from(room).unwrap_or(u32::MAX))
                    .max(1)
            }
            None => output_len,
        }
    }

    /// KV capacity in tokens.
    pub fn kv_tokens(&self) -> u64 {
        self.num_gpu_blocks
            .saturating_mul(u64::from(self.block_size))
    }

    /// What a decode pass's model milliseconds are divided by: the speed-up, and the
    /// decode's own on top of it.
    pub fn decode_divisor(&self) -> f64 {
        self.speedup_ratio * self.decode_speedup_ratio
    }

    /// The least time a decode pass of any batch takes ([`crate::perf::least_decode_ms`],
    /// quantized as the engines quantize a decode pass).
    pub fn least_decode_pass_ms(&self) -> f64 {
        crate::perf::quantized(crate::perf::least_decode_ms(), self.decode_divisor())
    }

    /// GPUs one worker stands for in the gpu-hours figures.
    pub fn gpus_per_worker(&self) -> u64 {
        u64::from(self.tp_size) * u64::from(self.dp_size)
    }
}

/// The settings AISimulate's engine refuses when it validates a rank, which its model here
/// refuses too rather than run a configuration that peer would not.
fn aisimulate_refusal(args: &EngineArgs) -> Result<(), String> {
    let why = " (AISimulate's engine refuses it)";
    match args.engine_type {
        EngineType::Sglang if !args.enable_chunked_prefill => {
            return Err(format!(
                "enable_chunked_prefill false: SGLang's scheduler always chunks{why}"
            ));
        }
        EngineType::Sglang
            if !args
                .sglang
                .chunked_prefill_size
                .is_multiple_of(u64::from(args.block_size)) =>
        {
            return Err(format!(
                "sglang.chunked_prefill_size {}: not a multiple of block_size {}{why}",
                args.sglang.chunked_prefill_size, args.block_size
            ));
        }
        EngineType::Vllm | EngineType::Trtllm if args.block_size < 2 => {
            return Err(format!(
                "block_size {}: vLLM and TRT-LLM blocks hold at least 2 tokens{why}",
                args.block_size
            ));
        }
        EngineType::Sglang | EngineType::Trtllm if args.prefill_schedule_interval != 1 => {
            return Err(format!(
                "prefill_schedule_interval {}: a cadence of vLLM's alone{why}",
                args.prefill_schedule_interval
            ));
        }
        _ => {}
    }
    for (name, ratio) in [
        ("speedup_ratio", args.speedup_ratio),
        ("decode_speedup_ratio", args.decode_speedup_ratio),
    ] {
        if ratio < 0.0 {
            return Err(format!("{name} {}: negative{why}", short(ratio)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_engine_specific_block_sizes() {
        let p = EngineArgs::from_json("{}").expect("empty");
        assert_eq!(p.args, EngineArgs::default());
        let t = EngineArgs::from_json(r#"{"engine_type": "trtllm"}"#).expect("trtllm");
        assert_eq!(t.args.block_size, 32);
        let s = EngineArgs::from_json(r#"{"engine_type": "sglang", "sglang": {"page_size": 16}}"#)
            .expect("sglang");
        assert_eq!(s.args.block_size, 16);
        let unbounded = EngineArgs::from_json(
            r#"{"max_num_seqs": null, "block_size": 512, "is_decode": true}"#,
        )
        .expect("nulls");
        assert_eq!(unbounded.args.max_num_seqs, None);
        assert_eq!(unbounded.args.worker_type, WorkerType::Decode);
    }

    /// Under AISimulate's engine SGLang's DP ranks are attention-DP ranks: 8192 / 3 = 2730
    /// tokens a chunk each and 0.3 of the conservativeness; Dynamo 1.4.2's and vLLM's keep
    /// the worker's settings.
    #[test]
    fn sglang_attention_dp_ranks_share_the_chunk_under_aisimulate() {
        let parse = |json: &str| EngineArgs::from_json(json).map(|p| p.args);
        let dp = parse(
            r#"{"engine_type": "sglang", "dp_size": 3, "sglang": {"schedule_conservativeness": 0.5}, "engine_version": "aisimulate-0.13"}"#,
        )
        .expect("aisimulate");
        assert_eq!(dp.sglang.chunked_prefill_size, 2730);
        assert_eq!(dp.sglang.schedule_conservativeness, 0.5 * 0.3);
        for json in [
            r#"{"engine_type": "sglang", "dp_size": 3}"#,
            r#"{"engine_type": "sglang", "engine_version": "aisimulate-0.13"}"#,
        ] {
            assert_eq!(
                parse(json).expect(json).sglang,
                SglangArgs::default(),
                "{json}"
            );
        }
        let e = parse(
            r#"{"engine_type": "sglang", "dp_size": 3, "sglang": {"chunked_prefill_size": 2}, "engine_version": "aisimulate-0.13"}"#,
        )
        .expect_err("no chunk left");
        assert!(e.starts_with("dp_size 3: "), "{e}");
    }

    /// What AISimulate's engine refuses when it validates a rank is refused under its model,
    /// in one line naming the field; Dynamo 1.4.2's model takes the same settings.
    #[test]
    fn aisimulate_refusals_are_kept() {
        for (json, field) in [
            (
                r#"{"engine_type": "sglang", "enable_chunked_prefill": false}"#,
                "enable_chunked_prefill false",
            ),
            (
                r#"{"engine_type": "sglang", "block_size": 64, "sglang": {"chunked_prefill_size": 100}}"#,
                "sglang.chunked_prefill_size 100",
            ),
            (r#"{"block_size": 1}"#, "block_size 1"),
            (
                r#"{"engine_type": "trtllm", "block_size": 1}"#,
                "block_size 1",
            ),
            (r#"{"decode_speedup_ratio": -2}"#, "decode_speedup_ratio -2"),
        ] {
            assert!(EngineArgs::from_json(json).is_ok(), "{json}");
            let aisimulate = format!(
                "{}, \"engine_version\": \"aisimulate-0.13\"}}",
                json.strip_suffix('}').expect("an object")
            );
            let e = EngineArgs::from_json(&aisimulate)
                .err()
                .unwrap_or_else(|| panic!("{aisimulate}: accepted"));
            assert!(e.starts_with(field), "{e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn prefill_cadences_are_taken_for_vllm_under_aisimulate_alone() {
        let aisimulate = r#""engine_version": "aisimulate-0.13""#;
        let ok = EngineArgs::from_json(&format!(
            r#"{{"prefill_schedule_interval": 4, "dp_size": 2, {aisimulate}}}"#
        ))
        .expect("vLLM under AISimulate's engine");
        assert_eq!(ok.args.prefill_schedule_interval, 4);
        for (json, expected) in [
            (
                format!(r#"{{"prefill_schedule_interval": 0, {aisimulate}}}"#),
                "prefill_schedule_interval 0: expected at least 1",
            ),
            (
                r#"{"prefill_schedule_interval": 2}"#.to_string(),
                "prefill_schedule_interval 2: Dynamo 1.4.2's engine has no prefill cadence",
            ),
            (
                format!(
                    r#"{{"engine_type": "sglang", "prefill_decode_interval": 3, {aisimulate}}}"#
                ),
                "prefill_decode_interval 3: SGLang's rounds without prefill are not modelled",
            ),
            (
                format!(
                    r#"{{"engine_type": "sglang", "prefill_schedule_interval": 2, {aisimulate}}}"#
                ),
                "prefill_schedule_interval 2: a cadence of vLLM's alone",
            ),
            (
                format!(
                    r#"{{"engine_type": "trtllm", "prefill_schedule_interval": 2, {aisimulate}}}"#
                ),
                "prefill_schedule_interval 2: a cadence of vLLM's alone",
            ),
        ] {
            let e = EngineArgs::from_json(&json).err().expect("refused");
            assert!(e.starts_with(expected), "{json}: {e}");
        }
    }

    #[test]
    fn unknown_and_bad_fields_are_named() {
        let e = EngineArgs::from_json(r#"{"blok_size": 4}"#)
            .err()
            .expect("unknown");
        assert!(e.contains("unknown field `blok_size`"), "{e}");
        assert!(!e.contains('\n'));
        for (json, expected) in [
            (r#"{"engine_type": "tgi"}"#, "engine_type \"tgi\""),
            (r#"{"worker_type": "both"}"#, "worker_type \"both\""),
            (r#"{"dp_size": 0}"#, "dp_size 0"),
            (
                r#"{"num_gpu_blocks": 0}"#,
                "num_gpu_blocks 0: expected at least 1",
            ),
            (r#"{"max_num_seqs": 0}"#, "max_num_seqs 0"),
            (
                r#"{"max_num_batched_tokens": 0}"#,
                "max_num_batched_tokens 0",
            ),
            (r#"{"block_size": "x"}"#, "invalid type"),
            (
                r#"{"engine_version": "dynamo-1.6"}"#,
                "engine_version \"dynamo-1.6\": expected dynamo-1.4.2 or aisimulate-0.13",
            ),
        ] {
            let e = EngineArgs::from_json(json).err().expect(json);
            assert!(e.contains(expected), "{json}: {e}");
        }
        let w = EngineArgs::from_json(r#"{"planner_profile_data": "p.npz"}"#).expect("ok");
        assert_eq!(w.warnings.len(), 1);
    }
}
