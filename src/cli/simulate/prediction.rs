//! AISimulate's prediction interface: `simulate --config prediction.yaml [--set PATH=VALUE]`.
//! The YAML (`traffic`, `engine`, `router`, `planner`, `evaluation`, `execution`) is read into
//! strict types — an unknown field anywhere is an error naming its path, as AISimulate's own
//! loader refuses it — and turned into the same [`Options`] the flags make, with the engine
//! following AISimulate 0.13's pass timing. What kvtrace does not model (AIC's performance
//! database behind `timing: default` and `capacity: default`, host and G3 offload, speculation,
//! lanes and snapshots of agentic replay, the planner) is refused in one line that says what
//! to write instead, never run with a silent substitute.

use std::path::{Path, PathBuf};

use kvtrace::error::{Error, Result};
use kvtrace::simulate::mooncake::MAX_PROMPT_TOKENS;
use kvtrace::simulate::weka::NestedTimestamps;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::plan::{Options, Router, TraceFormat};

/// Reads `path`, applies the `--set` assignments left to right, and checks the result.
pub(crate) fn read(path: &Path, sets: &[String]) -> Result<Prediction> {
    let shown = path.display().to_string();
    let text = kvtrace::limits::read_text(path, kvtrace::limits::MAX_CONFIG_BYTES)
        .map_err(|e| Error::io("cannot read", e).in_file(&shown))?;
    let yaml: serde_norway::Value = serde_norway::from_str(&text)
        .map_err(|e| Error::usage(format!("{shown}: not YAML: {e}")))?;
    let mut tree: Value =
        serde_json::to_value(yaml).map_err(|e| Error::usage(format!("{shown}: {e}")))?;
    if tree.is_null() {
        tree = Value::Object(Map::new());
    }
    if !tree.is_object() {
        return Err(Error::usage(format!(
            "{shown}: expected a mapping of sections"
        )));
    }
    for set in sets {
        assign(&mut tree, set)?;
    }
    serde_path_to_error::deserialize(tree).map_err(|e| {
        let at = e.path().to_string();
        let reason = e.into_inner().to_string();
        Error::usage(format!("{shown}: {at}: {reason}"))
    })
}

/// `--set a.b.c=VALUE`: the value parsed as YAML, placed at the dotted path (made if absent).
fn assign(tree: &mut Value, set: &str) -> Result<()> {
    let Some((path, value)) = set.split_once('=') else {
        return Err(Error::usage(format!("--set {set}: expected PATH=VALUE")));
    };
    let keys: Vec<&str> = path.split('.').collect();
    if keys
        .iter()
        .any(|k| k.is_empty() || k.parse::<usize>().is_ok())
    {
        return Err(Error::usage(format!(
            "--set {path}: a dotted path of field names (sequences are set whole)"
        )));
    }
    let value: serde_norway::Value = serde_norway::from_str(value)
        .map_err(|e| Error::usage(format!("--set {path}: not a YAML value: {e}")))?;
    let value =
        serde_json::to_value(value).map_err(|e| Error::usage(format!("--set {path}: {e}")))?;
    let mut at = tree;
    for key in &keys[..keys.len() - 1] {
        let map = at.as_object_mut().ok_or_else(|| {
            Error::usage(format!(
                "--set {path}: {key} is inside a value, not a mapping"
            ))
        })?;
        at = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if at.is_null() {
            *at = Value::Object(Map::new());
        }
    }
    let map = at
        .as_object_mut()
        .ok_or_else(|| Error::usage(format!("--set {path}: the parent is not a mapping")))?;
    map.insert(keys[keys.len() - 1].to_string(), value);
    Ok(())
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Prediction {
    #[serde(default)]
    traffic: Option<Traffic>,
    engine: Engine,
    #[serde(default)]
    router: Option<RouterSection>,
    #[serde(default)]
    planner: Option<Planner>,
    #[serde(default)]
    evaluation: Option<Evaluation>,
    /// Host RAM/CPU budgets for AISimulate's supervisor: kvtrace runs in a few MiB.
    #[serde(default)]
    #[allow(dead_code)]
    execution: Option<Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Traffic {
    source: Source,
    load: Load,
    #[serde(default)]
    stop: Option<Stop>,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "type", deny_unknown_fields)]
enum Source {
    #[serde(rename = "synthetic")]
    Synthetic {
        #[serde(default = "default_input")]
        input_tokens: u32,
        #[serde(default = "default_output")]
        output_tokens: u32,
        #[serde(default)]
        images: Option<Value>,
    },
    #[serde(rename = "synthetic-session")]
    SyntheticSession {
        #[serde(default = "default_input")]
        new_input_tokens_per_turn: u32,
        #[serde(default = "default_output")]
        output_tokens_per_turn: u32,
        session: SessionShape,
    },
    #[serde(rename = "trace")]
    Trace {
        paths: Vec<PathBuf>,
        #[serde(default = "default_format")]
        format: String,
        #[serde(default)]
        block_size: Option<u32>,
        #[serde(default)]
        nested_timestamp_basis: Option<String>,
    },
}

fn default_input() -> u32 {
    1024
}
fn default_output() -> u32 {
    128
}
fn default_format() -> String {
    "mooncake".into()
}
fn default_turns() -> u32 {
    4
}
fn one() -> f64 {
    1.0
}
fn default_seed() -> u64 {
    42
}
fn default_concurrency() -> u32 {
    10
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct SessionShape {
    #[serde(default = "default_turns")]
    turns: u32,
    #[serde(default)]
    shared_prefix_ratio: f64,
    #[serde(default)]
    prefix_groups: u32,
    #[serde(default)]
    inter_turn_delay_ms: f64,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "type", deny_unknown_fields)]
enum Load {
    #[serde(rename = "concurrency")]
    Concurrency {
        #[serde(default = "default_concurrency")]
        concurrency: u32,
    },
    #[serde(rename = "poisson")]
    Poisson {
        #[serde(default)]
        requests_per_second: Option<f64>,
        #[serde(default)]
        sessions_per_second: Option<f64>,
        #[serde(default = "default_seed")]
        seed: u64,
    },
    #[serde(rename = "constant_rate")]
    ConstantRate {
        #[serde(default)]
        requests_per_second: Option<f64>,
        #[serde(default)]
        sessions_per_second: Option<f64>,
    },
    #[serde(rename = "trace_timestamps")]
    TraceTimestamps {
        #[serde(default = "one")]
        speedup: f64,
        #[serde(default)]
        agentic_lanes: Option<u64>,
        #[serde(default)]
        agentic_snapshot: Option<Value>,
        #[serde(default)]
        agentic_warmup: Option<bool>,
        #[serde(default)]
        agentic_profile: Option<Value>,
    },
    #[serde(rename = "kv_capacity_fraction")]
    KvCapacityFraction {
        #[allow(dead_code)]
        fraction: f64,
    },
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct Stop {
    #[serde(default)]
    requests: Option<u32>,
    #[serde(default)]
    requests_per_load_unit: Option<f64>,
    #[serde(default)]
    sessions: Option<u32>,
    #[serde(default)]
    sessions_per_load_unit: Option<f64>,
    #[serde(default)]
    max_virtual_time_seconds: Option<f64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Engine {
    #[serde(default = "default_mode")]
    mode: String,
    /// Names the model and GPU whose AIC performance data AISimulate's default timing reads;
    /// kvtrace's polynomial model does not depend on them.
    #[allow(dead_code)]
    model: String,
    #[allow(dead_code)]
    hardware: String,
    #[serde(default = "default_backend")]
    backend: String,
    #[serde(default)]
    #[allow(dead_code)]
    backend_version: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    context_length: Option<Value>,
    #[serde(default)]
    speculation: Option<Value>,
    workers: Workers,
    #[serde(default)]
    kv_transfer: Option<KvTransfer>,
    #[serde(default)]
    afd: Option<Value>,
}

fn default_mode() -> String {
    "aggregated".into()
}
fn default_backend() -> String {
    "vllm".into()
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Workers {
    #[serde(default)]
    aggregated: Option<Role>,
    #[serde(default)]
    prefill: Option<Role>,
    #[serde(default)]
    decode: Option<Role>,
    #[serde(default)]
    encoder: Option<Value>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Role {
    #[serde(default)]
    parallelism: Parallelism,
    #[serde(default)]
    scheduler: Scheduler,
    #[serde(default)]
    kv_cache: KvCache,
    #[serde(default)]
    timing: Timing,
    #[serde(default)]
    startup_seconds: f64,
    #[serde(default)]
    #[allow(dead_code)]
    hardware: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct Parallelism {
    #[serde(default = "one_u32")]
    replicas: u32,
    #[serde(default = "one_u32")]
    tensor: u32,
    #[serde(default = "one_u32")]
    pipeline: u32,
    #[serde(default = "one_u32")]
    attention_data: u32,
    #[serde(default = "one_u32")]
    #[allow(dead_code)]
    moe_tensor: u32,
    #[serde(default = "one_u32")]
    #[allow(dead_code)]
    moe_expert: u32,
}

fn one_u32() -> u32 {
    1
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism {
            replicas: 1,
            tensor: 1,
            pipeline: 1,
            attention_data: 1,
            moe_tensor: 1,
            moe_expert: 1,
        }
    }
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Scheduler {
    #[serde(default)]
    max_batched_tokens: Option<u64>,
    #[serde(default)]
    max_sequences: Option<u64>,
    #[serde(default)]
    prefill_schedule_interval: Option<u64>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
struct KvCache {
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    prefix_caching: Option<bool>,
    #[serde(default)]
    bytes_per_token: Option<Value>,
    #[serde(default)]
    capacity: Option<Capacity>,
    #[serde(default)]
    host_offload: Option<Value>,
    #[serde(default)]
    g3_offload: Option<Value>,
    #[serde(default)]
    state_cache: Option<Value>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct Capacity {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    blocks: Option<u64>,
    #[serde(default)]
    bytes: Option<u64>,
    #[serde(default)]
    memory_fraction: Option<f64>,
    #[serde(default)]
    cuda_graph_reserved_bytes: Option<u64>,
}

#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Timing {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    prefill_ms: Option<f64>,
    #[serde(default)]
    decode_ms: Option<f64>,
    #[serde(default)]
    forward_model: Option<String>,
    #[serde(default)]
    fpm_parquet_path: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct KvTransfer {
    #[serde(default)]
    bytes_per_token: Option<Value>,
    #[serde(default)]
    bandwidth_gb_per_second: Option<f64>,
    #[serde(default)]
    timing_mode: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RouterSection {
    #[serde(default = "default_policy")]
    policy: String,
    #[serde(default)]
    prefill_load_model: Option<LoadModel>,
    #[serde(default)]
    overlap_score_credit: Option<f64>,
    #[serde(default)]
    prefill_load_scale: Option<f64>,
    #[serde(default)]
    temperature: Option<f64>,
}

fn default_policy() -> String {
    "round_robin".into()
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct LoadModel {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Debug)]
struct Planner {
    #[serde(default = "disabled")]
    policy: String,
    #[serde(flatten)]
    #[allow(dead_code)]
    rest: Map<String, Value>,
}

fn disabled() -> String {
    "disabled".into()
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Evaluation {
    #[serde(default)]
    sla: Option<Sla>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Sla {
    #[serde(default)]
    ttft_ms: Option<f64>,
    #[serde(default)]
    itl_ms: Option<f64>,
    #[serde(default)]
    e2e_ms: Option<f64>,
}

/// The CLI-only choices that go with a configuration.
pub(crate) struct Run {
    pub(crate) stack: String,
    pub(crate) output_dir: PathBuf,
    pub(crate) capture_per_request: bool,
}

/// A refusal naming the configuration path and what to write instead.
fn refuse(at: &str, why: &str) -> Error {
    Error::usage(format!("{at}: {why}"))
}

impl Prediction {
    /// The simulation this configuration describes, as [`Options`].
    pub(crate) fn options(self, run: &Run) -> Result<Options> {
        let mut o = Options::default();
        if let Some(a) = &self.engine.afd {
            if !a.is_null() {
                return Err(refuse(
                    "engine.afd",
                    "attention-FFN disaggregation is not modelled",
                ));
            }
        }
        if self
            .engine
            .speculation
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            return Err(refuse(
                "engine.speculation",
                "speculative decoding is not modelled",
            ));
        }
        if self
            .engine
            .workers
            .encoder
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            return Err(refuse(
                "engine.workers.encoder",
                "encoder pools (EPD) are not modelled",
            ));
        }
        let backend = match self.engine.backend.as_str() {
            b @ ("vllm" | "sglang" | "trtllm") => b,
            other => {
                return Err(refuse(
                    "engine.backend",
                    &format!("{other:?}: expected vllm, sglang or trtllm"),
                ))
            }
        };
        match self.engine.mode.as_str() {
            "aggregated" => {
                if self.engine.workers.prefill.is_some() || self.engine.workers.decode.is_some() {
                    return Err(refuse(
                        "engine.workers",
                        "an aggregated deployment has only workers.aggregated",
                    ));
                }
                if self.engine.kv_transfer.is_some() {
                    return Err(refuse(
                        "engine.kv_transfer",
                        "applies to disaggregated mode only",
                    ));
                }
                let role = self.engine.workers.aggregated.as_ref();
                let role = role.map_or_else(Role::default, |r| r.clone());
                o.num_workers = Some(role.parallelism.replicas);
                o.extra_engine_args =
                    Some(role.engine_args("engine.workers.aggregated", backend, None)?);
            }
            "disaggregated" => {
                if self.engine.workers.aggregated.is_some() {
                    return Err(refuse(
                        "engine.workers.aggregated",
                        "a disaggregated deployment has workers.prefill and workers.decode",
                    ));
                }
                let transfer = self.engine.kv_transfer.as_ref();
                let (Some(prefill), Some(decode)) =
                    (&self.engine.workers.prefill, &self.engine.workers.decode)
                else {
                    return Err(refuse(
                        "engine.workers",
                        "a disaggregated deployment needs workers.prefill and workers.decode",
                    ));
                };
                o.num_prefill_workers = Some(prefill.parallelism.replicas);
                o.num_decode_workers = Some(decode.parallelism.replicas);
                o.prefill_engine_args = Some(prefill.engine_args(
                    "engine.workers.prefill",
                    backend,
                    Some(("prefill", transfer)),
                )?);
                o.decode_engine_args = Some(decode.engine_args(
                    "engine.workers.decode",
                    backend,
                    Some(("decode", transfer)),
                )?);
            }
            "afd" => return Err(refuse("engine.mode", "afd is not modelled")),
            other => {
                return Err(refuse(
                    "engine.mode",
                    &format!("{other:?}: expected aggregated or disaggregated"),
                ))
            }
        }
        self.traffic_options(&mut o)?;
        if let Some(r) = &self.router {
            if run.stack != "dynamo" {
                return Err(refuse(
                    "router",
                    "the router section belongs to the dynamo stack: add --stack dynamo",
                ));
            }
            let model = r
                .prefill_load_model
                .as_ref()
                .map_or("none", |m| m.kind.as_str());
            match (r.policy.as_str(), model) {
                ("round_robin", "none") => {
                    if r.overlap_score_credit.is_some()
                        || r.prefill_load_scale.is_some()
                        || r.temperature.is_some()
                    {
                        return Err(refuse(
                            "router",
                            "overlap_score_credit, prefill_load_scale and temperature are kv_router's",
                        ));
                    }
                }
                ("round_robin", other) => {
                    return Err(refuse(
                        "router.prefill_load_model.type",
                        &format!("{other:?} is incompatible with router.policy='round_robin'; use policy='kv_router' or type='none'"),
                    ))
                }
                ("kv_router", "none") => {
                    o.router = Router::KvRouter;
                    let mut config = Map::new();
                    for (key, value) in [
                        ("overlap_score_credit", r.overlap_score_credit),
                        ("prefill_load_scale", r.prefill_load_scale),
                        ("router_temperature", r.temperature),
                    ] {
                        if let Some(v) = value {
                            config.insert(key.into(), v.into());
                        }
                    }
                    o.router_config = Some(Value::Object(config).to_string());
                }
                ("kv_router", other) => {
                    return Err(refuse(
                        "router.prefill_load_model.type",
                        &format!("{other:?}: AIC's prefill load model is not modelled; use none"),
                    ))
                }
                (other, _) => {
                    return Err(refuse(
                        "router.policy",
                        &format!("{other:?}: expected round_robin or kv_router"),
                    ))
                }
            }
        }
        if let Some(p) = &self.planner {
            if p.policy != "disabled" {
                return Err(refuse(
                    "planner.policy",
                    "the planner is not modelled; use disabled",
                ));
            }
        }
        if let Some(sla) = self.evaluation.and_then(|e| e.sla) {
            if sla.e2e_ms.is_some() && (sla.ttft_ms.is_some() || sla.itl_ms.is_some()) {
                return Err(refuse(
                    "evaluation.sla.e2e_ms",
                    "e2e_ms excludes ttft_ms and itl_ms",
                ));
            }
            o.sla_ttft_ms = sla.ttft_ms;
            o.sla_itl_ms = sla.itl_ms;
            o.sla_e2e_ms = sla.e2e_ms;
        }
        o.report_json = Some(run.output_dir.join("prediction.json"));
        o.report_jsonl = run
            .capture_per_request
            .then(|| run.output_dir.join("requests.jsonl"));
        Ok(o)
    }

    fn traffic_options(&self, o: &mut Options) -> Result<()> {
        let default = Traffic {
            source: Source::Synthetic {
                input_tokens: 1024,
                output_tokens: 128,
                images: None,
            },
            load: Load::Concurrency { concurrency: 10 },
            stop: Some(Stop {
                requests: Some(100),
                ..Stop::default()
            }),
        };
        let traffic = self.traffic.as_ref().unwrap_or(&default);
        let stop = traffic.stop.as_ref();
        if stop.and_then(|s| s.max_virtual_time_seconds).is_some() {
            return Err(refuse(
                "traffic.stop.max_virtual_time_seconds",
                "a virtual-time cutoff is not modelled; the trace runs to its end",
            ));
        }
        // The load's own unit, for the stop counts given per unit.
        let (unit, sessions) = match &traffic.source {
            Source::Synthetic { images, .. } => {
                if images.as_ref().is_some_and(|v| !v.is_null()) {
                    return Err(refuse(
                        "traffic.source.images",
                        "multimodal requests are not modelled",
                    ));
                }
                (None, false)
            }
            Source::SyntheticSession { .. } => (None, true),
            Source::Trace { .. } => (Some(()), false),
        };
        match &traffic.load {
            Load::Concurrency { concurrency } => o.replay_concurrency = Some(*concurrency),
            Load::Poisson {
                requests_per_second,
                sessions_per_second,
                seed,
            } => {
                o.request_rate = Some(rate(*requests_per_second, *sessions_per_second, sessions)?);
                o.arrival_seed = *seed;
            }
            Load::ConstantRate {
                requests_per_second,
                sessions_per_second,
            } => {
                let r = rate(*requests_per_second, *sessions_per_second, sessions)?;
                o.arrival_interval_ms = Some(1000.0 / r);
            }
            Load::TraceTimestamps {
                speedup,
                agentic_lanes,
                agentic_snapshot,
                agentic_warmup,
                agentic_profile,
            } => {
                if unit.is_none() {
                    return Err(refuse(
                        "traffic.load.type",
                        "trace_timestamps is for trace sources; synthetic load is concurrency, poisson or constant_rate",
                    ));
                }
                if agentic_lanes.is_some()
                    || agentic_snapshot.as_ref().is_some_and(|v| !v.is_null())
                    || agentic_warmup == &Some(true)
                    || agentic_profile.as_ref().is_some_and(|v| !v.is_null())
                {
                    return Err(refuse(
                        "traffic.load",
                        "agentic lanes, snapshots, warm-up and profiles are not modelled",
                    ));
                }
                o.arrival_speedup_ratio = *speedup;
            }
            Load::KvCapacityFraction { .. } => {
                return Err(refuse(
                    "traffic.load.type",
                    "kv_capacity_fraction belongs to recommendations",
                ))
            }
        }
        let load_unit = o
            .replay_concurrency
            .map(f64::from)
            .or(o.request_rate)
            .or(o.arrival_interval_ms.map(|ms| 1000.0 / ms));
        match &traffic.source {
            Source::Trace {
                paths,
                format,
                block_size,
                nested_timestamp_basis,
            } => {
                o.trace_format = match format.as_str() {
                    "mooncake" => TraceFormat::Mooncake,
                    "mooncake-delta" => TraceFormat::MooncakeDelta,
                    "agentic_mooncake" => TraceFormat::AgenticMooncake,
                    "dynamo" => TraceFormat::Dynamo,
                    "weka" => TraceFormat::Weka,
                    other => {
                        return Err(refuse(
                            "traffic.source.format",
                            &format!("{other:?}: kvtrace reads mooncake, mooncake-delta, agentic_mooncake, dynamo and weka"),
                        ))
                    }
                };
                o.nested_timestamps = match nested_timestamp_basis.as_deref() {
                    None | Some("auto") => NestedTimestamps::Auto,
                    Some("absolute") => NestedTimestamps::Absolute,
                    Some("relative") => NestedTimestamps::Relative,
                    Some(other) => {
                        return Err(refuse(
                            "traffic.source.nested_timestamp_basis",
                            &format!("{other:?}: expected auto, absolute or relative"),
                        ))
                    }
                };
                if nested_timestamp_basis.is_some() && o.trace_format != TraceFormat::Weka {
                    return Err(refuse(
                        "traffic.source.nested_timestamp_basis",
                        "applies to weka traces only",
                    ));
                }
                if stop.is_some_and(|s| {
                    s.requests.is_some()
                        || s.sessions.is_some()
                        || s.requests_per_load_unit.is_some()
                        || s.sessions_per_load_unit.is_some()
                }) {
                    return Err(refuse(
                        "traffic.stop",
                        "a trace source runs to the end of its trace",
                    ));
                }
                o.traces = paths.clone();
                o.trace_block_size = *block_size;
            }
            Source::Synthetic {
                input_tokens,
                output_tokens,
                ..
            } => {
                o.input_tokens = Some(*input_tokens);
                o.output_tokens = Some(*output_tokens);
                o.request_count = Some(count(stop, "requests", load_unit)?);
            }
            Source::SyntheticSession {
                new_input_tokens_per_turn,
                output_tokens_per_turn,
                session,
            } => {
                if session.turns < 2 {
                    return Err(refuse("traffic.source.session.turns", "at least 2"));
                }
                let longest = u64::from(session.turns)
                    * (u64::from(*new_input_tokens_per_turn) + u64::from(*output_tokens_per_turn));
                if longest > u64::from(MAX_PROMPT_TOKENS) {
                    return Err(refuse(
                        "traffic.source",
                        &format!("a session's last prompt would hold {longest} tokens, more than {MAX_PROMPT_TOKENS}"),
                    ));
                }
                o.input_tokens = Some(*new_input_tokens_per_turn);
                o.output_tokens = Some(*output_tokens_per_turn);
                o.request_count = Some(count(stop, "sessions", load_unit)?);
                o.turns_per_session = Some(session.turns);
                o.shared_prefix_ratio = Some(session.shared_prefix_ratio);
                o.num_prefix_groups = Some(session.prefix_groups);
                o.inter_turn_delay_ms = Some(session.inter_turn_delay_ms);
                o.carry_history = true;
                // AISimulate draws a session's prefix group from seed 0.
                o.seed = 0;
            }
        }
        Ok(())
    }
}

/// The open-loop rate in the source's unit.
fn rate(requests: Option<f64>, sessions: Option<f64>, session_source: bool) -> Result<f64> {
    let (given, wrong, name) = if session_source {
        (sessions, requests, "sessions_per_second")
    } else {
        (requests, sessions, "requests_per_second")
    };
    if wrong.is_some() {
        return Err(refuse(
            "traffic.load",
            &format!("this source's rate is {name}"),
        ));
    }
    match given {
        Some(r) if r.is_finite() && r > 0.0 => Ok(r),
        Some(r) => Err(refuse(
            &format!("traffic.load.{name}"),
            &format!("must be greater than 0, got {r}"),
        )),
        None => Err(refuse(&format!("traffic.load.{name}"), "missing field")),
    }
}

/// How many requests (or sessions) the stop condition asks for: a count, or a count per
/// load unit resolved as `max(1, round(count × unit))`.
fn count(stop: Option<&Stop>, unit_name: &str, load_unit: Option<f64>) -> Result<u32> {
    let (fixed, per_unit) = match (unit_name, stop) {
        (_, None) => (None, None),
        ("requests", Some(s)) => {
            if s.sessions.is_some() || s.sessions_per_load_unit.is_some() {
                return Err(refuse("traffic.stop", "a request source stops by requests"));
            }
            (s.requests, s.requests_per_load_unit)
        }
        (_, Some(s)) => {
            if s.requests.is_some() || s.requests_per_load_unit.is_some() {
                return Err(refuse("traffic.stop", "a session source stops by sessions"));
            }
            (s.sessions, s.sessions_per_load_unit)
        }
    };
    match (fixed, per_unit, load_unit) {
        (Some(_), Some(_), _) => Err(refuse(
            &format!("traffic.stop.{unit_name}"),
            "give a count or a count per load unit, not both",
        )),
        (Some(0), ..) => Err(refuse(
            &format!("traffic.stop.{unit_name}"),
            "must be positive",
        )),
        (Some(n), ..) => Ok(n),
        (None, Some(x), Some(unit)) if x > 0.0 => Ok(((x * unit).round() as u32).max(1)),
        (None, Some(x), _) => Err(refuse(
            &format!("traffic.stop.{unit_name}_per_load_unit"),
            &format!("must be positive, got {x}"),
        )),
        (None, None, _) => Err(refuse(
            &format!("traffic.stop.{unit_name}"),
            "missing: give a count for a synthetic source",
        )),
    }
}

impl Role {
    /// The role's engine arguments (Dynamo's names, kvtrace's JSON), AISimulate's timing.
    fn engine_args(
        &self,
        at: &str,
        backend: &str,
        stage: Option<(&str, Option<&KvTransfer>)>,
    ) -> Result<String> {
        let refuse_at = |field: &str, why: &str| refuse(&format!("{at}.{field}"), why);
        if self.startup_seconds != 0.0 {
            return Err(refuse_at(
                "startup_seconds",
                "worker start-up is not modelled; use 0",
            ));
        }
        let kv = &self.kv_cache;
        // AISimulate's G2/G3 tiers are vLLM's native offload on fixed bandwidths; kvtrace's
        // offload is LMCache's connector on a StorageManager with measured tier costs, which
        // these fields cannot describe.
        let offload_instead = "AISimulate's native G2/G3 offload is not modelled; kvtrace's KV offload (LMCache's connector, tier costs measured by replay or bench) runs with the flags: kvtrace simulate --l1-size-gb GB --l2-adapter JSON --offload-calibration REPORT.json";
        for (field, value, why) in [
            ("kv_cache.host_offload", &kv.host_offload, offload_instead),
            ("kv_cache.g3_offload", &kv.g3_offload, offload_instead),
            ("kv_cache.state_cache", &kv.state_cache, "not modelled yet"),
        ] {
            if value.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(refuse_at(field, why));
            }
        }
        match self.timing.kind.as_deref() {
            Some("polynomial") => {}
            None | Some("default") => {
                return Err(refuse_at(
                    "timing.type",
                    "default timing reads AIC's performance data for the model and hardware, which kvtrace does not have; write timing: {type: polynomial}",
                ))
            }
            Some("fixed") => return Err(refuse_at("timing.type", "fixed timing is not modelled yet; use polynomial")),
            Some(other) => return Err(refuse_at("timing.type", &format!("{other:?}: expected polynomial"))),
        }
        if self.timing.prefill_ms.is_some()
            || self.timing.decode_ms.is_some()
            || self.timing.forward_model.is_some()
            || self.timing.fpm_parquet_path.is_some()
        {
            return Err(refuse_at(
                "timing",
                "polynomial timing takes no other field",
            ));
        }
        let p = &self.parallelism;
        let mut args = Map::new();
        args.insert("engine_type".into(), backend.into());
        args.insert("engine_version".into(), "aisimulate-0.13".into());
        args.insert("aic_tp_size".into(), (p.tensor * p.pipeline).into());
        args.insert("dp_size".into(), p.attention_data.into());
        if let Some(v) = self.scheduler.max_batched_tokens {
            args.insert("max_num_batched_tokens".into(), v.into());
        }
        if let Some(v) = self.scheduler.prefill_schedule_interval {
            args.insert("prefill_schedule_interval".into(), v.into());
        }
        if let Some(v) = self.scheduler.max_sequences {
            args.insert("max_num_seqs".into(), v.into());
        } else if matches!(stage, Some(("prefill", _))) {
            args.insert("max_num_seqs".into(), 1.into());
        }
        if let Some(b) = kv.block_size {
            args.insert("block_size".into(), b.into());
        }
        if let Some(c) = kv.prefix_caching {
            args.insert("enable_prefix_caching".into(), c.into());
        }
        match &kv.capacity {
            None => {
                return Err(refuse_at(
                    "kv_cache.capacity",
                    "the default capacity is estimated from the model's memory with AIC's data; write capacity: {type: fixed, blocks: N}",
                ))
            }
            Some(c) if c.kind == "fixed" => {
                if c.memory_fraction.is_some() || c.cuda_graph_reserved_bytes.is_some_and(|b| b != 0) {
                    return Err(refuse_at("kv_cache.capacity", "fixed capacity takes blocks or bytes only"));
                }
                let blocks = match (c.blocks, c.bytes) {
                    (Some(b), None) => b,
                    (None, Some(bytes)) => {
                        let per_token = kv.bytes_per_token.as_ref().and_then(Value::as_u64).filter(|&t| t > 0);
                        let (Some(block), Some(per_token)) = (kv.block_size, per_token) else {
                            return Err(refuse_at(
                                "kv_cache.capacity.bytes",
                                "needs an explicit block_size and a numeric bytes_per_token",
                            ));
                        };
                        bytes / (u64::from(block) * per_token)
                    }
                    _ => return Err(refuse_at("kv_cache.capacity", "give exactly one of blocks and bytes")),
                };
                if blocks == 0 {
                    return Err(refuse_at("kv_cache.capacity.blocks", "must be positive"));
                }
                args.insert("num_gpu_blocks".into(), blocks.into());
            }
            Some(c) => {
                return Err(refuse_at(
                    "kv_cache.capacity.type",
                    &format!("{:?}: the default capacity needs AIC's memory model; use fixed", c.kind),
                ))
            }
        }
        if let Some((worker, transfer)) = stage {
            args.insert("worker_type".into(), worker.into());
            if let (Some(t), "prefill") = (transfer, worker) {
                if let Some(bw) = t.bandwidth_gb_per_second {
                    args.insert("kv_transfer_bandwidth".into(), bw.into());
                }
                match t.bytes_per_token.as_ref() {
                    None => {}
                    Some(Value::Number(n)) => {
                        args.insert("kv_bytes_per_token".into(), n.clone().into());
                    }
                    Some(Value::String(s))
                        if s == "auto" && t.bandwidth_gb_per_second.is_some() =>
                    {
                        return Err(refuse(
                            "engine.kv_transfer.bytes_per_token",
                            "auto needs AIC's model data; give the bytes",
                        ))
                    }
                    Some(Value::String(s)) if s == "auto" => {}
                    Some(other) => {
                        return Err(refuse(
                            "engine.kv_transfer.bytes_per_token",
                            &format!("{other}: expected a positive integer"),
                        ))
                    }
                }
            }
            if worker == "prefill" {
                // AISimulate charges a transfer for what the decode worker lacks by default.
                let mode = transfer
                    .and_then(|t| t.timing_mode.clone())
                    .unwrap_or_else(|| "destination_missing".into());
                args.insert("kv_transfer_timing_mode".into(), mode.into());
            }
        }
        Ok(Value::Object(args).to_string())
    }
}
