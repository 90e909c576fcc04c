//! `aisim-harness`: one request trace through AISimulate's engine (`aisimulate-core` 0.13.0)
//! with the settings `kvtrace simulate` is given, the report written as JSON. It loads the
//! trace with AISimulate's own loaders and lowers it as AISimulate's runtime does for
//! `aisimulate predict --stack engine` (timestamps normalised, round-robin placement,
//! polynomial timing); only the flags below are understood.
//!
//! usage: aisim-harness TRACE... --trace-format F [--trace-block-size N] [--num-workers N]
//!        [--extra-engine-args JSON] [--replay-concurrency N] [--arrival-speedup-ratio R]
//!        --report-json OUT [--requests-jsonl OUT]
//!        [--lifecycle-jsonl OUT] [--graph-json OUT]
//!        [--num-prefill-workers N --num-decode-workers N
//!         --prefill-engine-args JSON --decode-engine-args JSON]
//!
//! `--replay-concurrency N` is AISimulate's `concurrency` load (N sessions in flight, the
//! spec's `max_in_flight`), `--arrival-speedup-ratio R` its `trace_timestamps` load's
//! `speedup` (arrivals and delays divided by R after the starts are normalised), and the
//! engine argument `dp_size` its attention-DP ranks per worker (`aic_tp_size` their tensor-
//! parallel size, which counts GPUs).
//!
//! With prefill and decode workers the replay is disaggregated: each pool's engine takes its
//! own arguments (their `worker_type` is the pool's), requests are placed round robin in both.
//!
//! `--requests-jsonl` also writes AISimulate's per-request records, one JSON line each, to set
//! beside `kvtrace simulate --report-jsonl` where two runs part. `--lifecycle-jsonl` writes a
//! request graph's lifecycle transcript, the lines whose digest is the report's
//! `agentic_lifecycle_digest`; `--graph-json` a Weka corpus's graph as AISimulate's records,
//! in the order and form its `agentic_graph` digest covers.

use std::path::PathBuf;

use aisimulate_core::replay::loadgen::{
    load_agentic_mooncake, load_weka_agentic_graph, DynamoRequestTrace, Trace,
    ValidatedAgenticGraph, WorkloadDriver,
};
use aisimulate_core::replay::{
    ReplayEngineConfig, ReplayEngineFactory, ReplayRuntimeInput, ReplaySpec, ReplayTopology,
    Replayer, CURRENT_REPLAY_SPEC_VERSION,
};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

struct Args {
    traces: Vec<PathBuf>,
    format: String,
    trace_block_size: Option<usize>,
    workers: usize,
    /// Closed loop: this many sessions in flight.
    concurrency: Option<usize>,
    /// Arrival times and delays divided by this.
    speedup: f64,
    engine_args: Map<String, Value>,
    /// Disaggregated: the prefill and decode pools' sizes and engine arguments.
    pools: Option<[(usize, Map<String, Value>); 2]>,
    report: PathBuf,
    requests: Option<PathBuf>,
    lifecycle: Option<PathBuf>,
    graph: Option<PathBuf>,
}

fn object(flag: &str, text: &str) -> Result<Map<String, Value>> {
    serde_json::from_str::<Value>(text)?
        .as_object()
        .cloned()
        .with_context(|| format!("{flag}: a JSON object"))
}

fn parse() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        traces: Vec::new(),
        format: "mooncake".into(),
        trace_block_size: None,
        workers: 1,
        concurrency: None,
        speedup: 1.0,
        engine_args: Map::new(),
        pools: None,
        report: PathBuf::new(),
        requests: None,
        lifecycle: None,
        graph: None,
    };
    let mut prefill = (0, Map::new());
    let mut decode = (0, Map::new());
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--trace-format" => a.format = value()?,
            "--trace-block-size" => a.trace_block_size = Some(value()?.parse()?),
            "--num-workers" => a.workers = value()?.parse()?,
            "--replay-concurrency" => a.concurrency = Some(value()?.parse()?),
            "--arrival-speedup-ratio" => a.speedup = value()?.parse()?,
            "--extra-engine-args" => a.engine_args = object(&arg, &value()?)?,
            "--num-prefill-workers" => prefill.0 = value()?.parse()?,
            "--num-decode-workers" => decode.0 = value()?.parse()?,
            "--prefill-engine-args" => prefill.1 = object(&arg, &value()?)?,
            "--decode-engine-args" => decode.1 = object(&arg, &value()?)?,
            "--report-json" => a.report = value()?.into(),
            "--requests-jsonl" => a.requests = Some(value()?.into()),
            "--lifecycle-jsonl" => a.lifecycle = Some(value()?.into()),
            "--graph-json" => a.graph = Some(value()?.into()),
            "--router-mode" => {
                let mode = value()?;
                if mode != "round_robin" {
                    bail!("only round_robin placement is AISimulate's engine stack");
                }
            }
            flag if flag.starts_with("--") => bail!("{flag}: not understood by the harness"),
            path => a.traces.push(path.into()),
        }
    }
    if a.traces.is_empty() || a.report.as_os_str().is_empty() {
        bail!("usage: aisim-harness TRACE... --trace-format F --report-json OUT");
    }
    match (prefill.0, decode.0) {
        (0, 0) => {}
        (p, d) if p > 0 && d > 0 => a.pools = Some([prefill, decode]),
        _ => bail!("a disaggregated replay needs --num-prefill-workers and --num-decode-workers"),
    }
    Ok(a)
}

/// The engine settings, Dynamo's engine-argument names mapped onto AISimulate's rank, with
/// Dynamo's mocker defaults where the arguments are silent (the defaults kvtrace uses); a
/// disaggregated replay's pools each get their own. `dp_size` and the tensor-parallel size
/// (`aic_tp_size`) are the role's, not the rank's.
fn engine(a: &Args) -> Result<ReplayEngineConfig> {
    let Some([(_, prefill), (_, decode)]) = &a.pools else {
        let (rank, mut role) = rank(&a.engine_args)?;
        role.insert("rank".into(), rank);
        return Ok(serde_json::from_value(Value::Object(role))?);
    };
    let ((prefill_rank, mut prefill), (decode_rank, mut decode)) = (rank(prefill)?, rank(decode)?);
    prefill.insert("rank".into(), prefill_rank.clone());
    decode.insert("rank".into(), decode_rank);
    let mut config = prefill.clone();
    config.insert("prefill".into(), Value::Object(prefill));
    config.insert("decode".into(), Value::Object(decode));
    Ok(serde_json::from_value(Value::Object(config))?)
}

/// One role's rank settings, and its own (`dp_size`, `tensor_parallel_size`).
fn rank(args: &Map<String, Value>) -> Result<(Value, Map<String, Value>)> {
    let mut rank = json!({
        "backend": "vllm",
        "block_size": 64,
        "num_gpu_blocks": 16384,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "enable_prefix_caching": true,
        "enable_chunked_prefill": true,
        "timing_model": {"type": "polynomial"},
    });
    let mut role = Map::new();
    for (key, value) in args {
        let key = match key.as_str() {
            // kvtrace's selector of the model it follows; AISimulate is that model.
            "engine_version" => continue,
            "dp_size" | "aic_tp_size" => {
                let name = if key == "dp_size" {
                    key.as_str()
                } else {
                    "tensor_parallel_size"
                };
                role.insert(name.into(), value.clone());
                continue;
            }
            "engine_type" => "backend",
            "block_size"
            | "num_gpu_blocks"
            | "max_model_len"
            | "max_num_seqs"
            | "max_num_batched_tokens"
            | "enable_prefix_caching"
            | "enable_chunked_prefill"
            | "speedup_ratio"
            | "decode_speedup_ratio"
            | "preemption_mode"
            | "sglang"
            | "worker_type"
            | "kv_bytes_per_token"
            | "kv_transfer_bandwidth"
            | "kv_transfer_timing_mode"
            | "prefill_schedule_interval" => key.as_str(),
            other => bail!("engine argument {other}: not mapped by the harness"),
        };
        rank[key] = value.clone();
    }
    // Each backend's own block size where none is given, as AISimulate and kvtrace default.
    if args.get("block_size").is_none() {
        match rank["backend"].as_str() {
            Some("sglang") => rank["block_size"] = json!(1),
            Some("trtllm") => rank["block_size"] = json!(32),
            _ => {}
        }
    }
    Ok((rank, role))
}

/// The workload, lowered as AISimulate's runtime lowers a trace source: starts normalised,
/// then sped up, then a timestamp or concurrency driver (a request graph takes no concurrency).
fn driver(a: &Args, engine_block_size: usize) -> Result<WorkloadDriver> {
    let block = a.trace_block_size.unwrap_or(512);
    let one = || -> Result<&PathBuf> {
        match a.traces.as_slice() {
            [path] => Ok(path),
            _ => bail!("{} takes one trace file", a.format),
        }
    };
    let requests = |trace: Trace, delta: bool| -> Result<WorkloadDriver> {
        let trace = trace
            .normalize_session_starts()?
            .speed_up_timing(a.speedup)?;
        match (a.concurrency, delta) {
            (Some(cap), true) => {
                WorkloadDriver::new_concurrency_accumulating_deltas(trace, engine_block_size, cap)
            }
            (Some(cap), false) => WorkloadDriver::new_concurrency(trace, engine_block_size, cap),
            (None, true) => WorkloadDriver::new_trace_accumulating_deltas(trace, engine_block_size),
            (None, false) => WorkloadDriver::new_trace(trace, engine_block_size),
        }
    };
    // A graph's starts normalised and sped up, the form its digest covers.
    let prepare = |graph: ValidatedAgenticGraph| -> Result<ValidatedAgenticGraph> {
        if a.concurrency.is_some() {
            bail!("a request graph takes no --replay-concurrency");
        }
        graph.normalize_starts().speed_up_timing(a.speedup)
    };
    let graph = |graph: ValidatedAgenticGraph| {
        WorkloadDriver::new_agentic_trace_with_options(graph, engine_block_size, true, None)
    };
    match a.format.as_str() {
        "mooncake" => requests(Trace::from_mooncake(one()?, block)?, false),
        "mooncake-delta" => requests(Trace::from_mooncake(one()?, block)?, true),
        "agentic_mooncake" => graph(prepare(load_agentic_mooncake(one()?, block)?)?),
        "weka" => {
            let loaded = prepare(load_weka_agentic_graph(one()?, a.trace_block_size)?)?;
            if let Some(path) = &a.graph {
                let nodes = serde_json::to_string_pretty(loaded.nodes())?;
                std::fs::write(path, nodes + "\n")
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            graph(loaded)
        }
        "dynamo" => {
            match DynamoRequestTrace::from_request_trace_files(&a.traces, a.trace_block_size)? {
                DynamoRequestTrace::Standard(trace) => requests(trace, false),
                DynamoRequestTrace::Agentic(loaded) => graph(prepare(loaded)?),
            }
        }
        other => bail!("--trace-format {other}: not run by the harness"),
    }
}

fn main() -> Result<()> {
    let a = parse()?;
    let engine = engine(&a)?;
    let block = engine.rank.block_size;
    let topology = match &a.pools {
        None => ReplayTopology::aggregated(a.workers),
        Some([(prefill, _), (decode, _)]) => serde_json::from_value(json!({
            "kind": "disaggregated",
            "prefill": { "initial_workers": prefill },
            "decode": { "initial_workers": decode },
        }))?,
    };
    let spec = ReplaySpec {
        version: CURRENT_REPLAY_SPEC_VERSION,
        topology,
        engine: serde_json::to_value(&engine)?,
        adapters: Default::default(),
        max_sim_time_ms: None,
        max_in_flight: a.concurrency,
        record_per_request: a.requests.is_some(),
        sla: Default::default(),
        requests: Vec::new(),
    };
    let report = Replayer::new(spec, ReplayEngineFactory::new())?
        .with_runtime_input(ReplayRuntimeInput::Workload(driver(&a, block)?))
        .run()?;
    std::fs::write(&a.report, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", a.report.display()))?;
    if let (Some(path), Some(lifecycle)) = (&a.lifecycle, &report.agentic_lifecycle) {
        std::fs::write(path, lifecycle.to_jsonl()?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.requests {
        let mut lines = String::new();
        for record in &report.per_request {
            lines += &serde_json::to_string(record)?;
            lines.push('\n');
        }
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
