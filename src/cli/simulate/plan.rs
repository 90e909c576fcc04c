//! From `simulate`'s flags to a [`Plan`]: [`Options`] holds what the user asked for (the flags
//! of Dynamo's `python -m dynamo.replay`, and kvtrace's KV offload) and [`plan`] checks it all,
//! naming the flag at fault — engine arguments, worker pools, workload, router, SLA, offload,
//! every output path — before any time is spent.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use kvtrace::clock::local_stamp;
use kvtrace::error::{short, Error, Result};
use kvtrace::report::{csv::Csv, json::Json, jsonl::Jsonl, xlsx::Xlsx, Target};
use kvtrace::simulate::agentic::read_agentic_mooncake;
use kvtrace::simulate::args::{EngineArgs, EngineType, EngineVersion, WorkerType};
use kvtrace::simulate::collector::Sla;
use kvtrace::simulate::dynamo_trace::read_dynamo_request_trace;
use kvtrace::simulate::event_loop::{PrefillPool, SimConfig};
use kvtrace::simulate::mooncake::{read_mooncake, read_mooncake_delta, GIVE_BLOCK_SIZE};
use kvtrace::simulate::offload::{OffloadConfig, DEFAULT_CHUNK_TOKENS, DEFAULT_KV_BYTES_PER_TOKEN};
use kvtrace::simulate::plan::{Plan, Setup};
use kvtrace::simulate::router::{KvRouterConfig, QueuePolicy, RouterMode};
use kvtrace::simulate::tier_link::LinkConfig;
use kvtrace::simulate::weka::{read_weka, NestedTimestamps};
use kvtrace::simulate::workload::{
    SyntheticArrivals, SyntheticSpec, Workload, DEFAULT_TRACE_BLOCK_SIZE,
};
use kvtrace::storage::config::StorageConfig;

/// How requests are placed on workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Router {
    #[default]
    RoundRobin,
    KvRouter,
}

/// How a request trace is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum TraceFormat {
    #[default]
    Mooncake,
    MooncakeDelta,
    AgenticMooncake,
    Dynamo,
    Weka,
}

/// Everything a simulation can be asked for; [`Default`] is Dynamo's defaults.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Options {
    /// JSONL request traces (several only in the dynamo format); none: the synthetic
    /// workload below.
    pub(crate) traces: Vec<PathBuf>,
    pub(crate) trace_format: TraceFormat,
    /// How a Weka trace's sub-agent calls are timed.
    pub(crate) nested_timestamps: NestedTimestamps,
    /// Synthetic sessions whose turns extend the previous prompt and output.
    pub(crate) carry_history: bool,
    /// Live worker threads on the wall clock instead of virtual time.
    pub(crate) online: bool,
    pub(crate) router: Router,
    pub(crate) num_workers: Option<u32>,
    pub(crate) num_prefill_workers: Option<u32>,
    pub(crate) num_decode_workers: Option<u32>,
    pub(crate) replay_concurrency: Option<u32>,
    pub(crate) arrival_speedup_ratio: f64,
    /// Tokens per hash id; `None`: the trace's own, or 512.
    pub(crate) trace_block_size: Option<u32>,
    pub(crate) input_tokens: Option<u32>,
    pub(crate) output_tokens: Option<u32>,
    pub(crate) request_count: Option<u32>,
    pub(crate) request_rate: Option<f64>,
    pub(crate) arrival_seed: u64,
    pub(crate) arrival_interval_ms: Option<f64>,
    pub(crate) turns_per_session: Option<u32>,
    pub(crate) shared_prefix_ratio: Option<f64>,
    pub(crate) num_prefix_groups: Option<u32>,
    pub(crate) inter_turn_delay_ms: Option<f64>,
    /// Engine arguments: JSON text, or the name of a file holding it.
    pub(crate) extra_engine_args: Option<String>,
    pub(crate) prefill_engine_args: Option<String>,
    pub(crate) decode_engine_args: Option<String>,
    pub(crate) router_config: Option<String>,
    pub(crate) seed: u64,
    pub(crate) sla_ttft_ms: Option<f64>,
    pub(crate) sla_itl_ms: Option<f64>,
    pub sla_e2e_ms: Option<f64>,
    /// Add each request's inter-token latency and output rate to the summary.
    pub(crate) per_request_metrics: bool,
    /// KV offload through a shared StorageManager of this configuration.
    pub(crate) storage: Option<StorageConfig>,
    pub(crate) offload_chunk_size: u32,
    pub offload_l1_gbps: f64,
    pub offload_l2_gbps: f64,
    /// The L2 tier timed as a measured, shared link instead of `offload_l2_gbps`.
    pub(crate) offload_l2_link: Option<LinkConfig>,
    /// Record the offload's StorageManager calls as LMCT.
    pub(crate) record: Option<PathBuf>,
    /// The JSON report; `kvtrace_simulate_report_<local time>.json` when not given.
    pub(crate) report_json: Option<PathBuf>,
    pub(crate) report_jsonl: Option<PathBuf>,
    /// A directory for `simulate_{summary,requests,tiers}.csv`.
    pub(crate) report_csv: Option<PathBuf>,
    pub(crate) report_xlsx: Option<PathBuf>,
    /// Write the report files (off for a sweep's point, which reports through the sweep).
    pub(crate) write_reports: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            traces: Vec::new(),
            trace_format: TraceFormat::Mooncake,
            nested_timestamps: NestedTimestamps::Auto,
            carry_history: false,
            online: false,
            router: Router::RoundRobin,
            num_workers: None,
            num_prefill_workers: None,
            num_decode_workers: None,
            replay_concurrency: None,
            arrival_speedup_ratio: 1.0,
            trace_block_size: None,
            input_tokens: None,
            output_tokens: None,
            request_count: None,
            request_rate: None,
            arrival_seed: 42,
            arrival_interval_ms: None,
            turns_per_session: None,
            shared_prefix_ratio: None,
            num_prefix_groups: None,
            inter_turn_delay_ms: None,
            extra_engine_args: None,
            prefill_engine_args: None,
            decode_engine_args: None,
            router_config: None,
            seed: 42,
            sla_ttft_ms: None,
            sla_itl_ms: None,
            sla_e2e_ms: None,
            per_request_metrics: false,
            storage: None,
            offload_chunk_size: DEFAULT_CHUNK_TOKENS,
            offload_l1_gbps: 25.0,
            offload_l2_gbps: 5.0,
            offload_l2_link: None,
            record: None,
            report_json: None,
            report_jsonl: None,
            report_csv: None,
            report_xlsx: None,
            write_reports: true,
        }
    }
}

/// The worker pools a run serves with.
struct Pools {
    /// The engines that generate tokens (aggregated, or the decode pool).
    engine: EngineArgs,
    workers: u32,
    prefill: Option<PrefillPool>,
    /// The router queue policy the engine arguments override, if any.
    queue: Option<QueuePolicy>,
}

impl Pools {
    /// Each pool's engine arguments with how many engines (workers × data-parallel ranks)
    /// it runs: the decode or aggregated pool, then the prefill pool.
    fn each(&self) -> impl Iterator<Item = (&EngineArgs, u64)> {
        let engines = |workers: u32, e: &EngineArgs| u64::from(workers) * u64::from(e.dp_size);
        std::iter::once((&self.engine, engines(self.workers, &self.engine))).chain(
            self.prefill
                .as_ref()
                .map(|p| (&p.engine, engines(p.workers, &p.engine))),
        )
    }

    /// How many engines serve, in all.
    fn engines(&self) -> u64 {
        self.each().map(|(_, n)| n).sum()
    }

    /// How many KV blocks the engines hold at most, all of them together.
    fn engine_blocks(&self) -> u64 {
        self.each()
            .map(|(e, n)| n.saturating_mul(e.num_gpu_blocks))
            .fold(0, u64::saturating_add)
    }

    /// The most KV cache, in tokens, that any one engine holds.
    fn largest_kv_tokens(&self) -> u64 {
        self.each().map(|(e, _)| e.kv_tokens()).max().unwrap_or(0)
    }
}

/// The simulation `o` asks for, every flag checked.
pub(crate) fn plan(o: &Options) -> Result<Plan> {
    if o.online && (o.storage.is_some() || o.record.is_some()) {
        return Err(Error::usage(
            "KV offload (--storage, tier flags, --record) runs offline only: its calls follow the simulated clock",
        ));
    }
    if o.record.is_some() && o.storage.is_none() {
        return Err(Error::usage(
            "tier flags and --record need KV offload: give --storage FILE or --l1-size-gb",
        ));
    }
    if o.replay_concurrency == Some(0) {
        return Err(Error::usage("--replay-concurrency must be at least 1"));
    }
    let mut warnings = Vec::new();
    let pools = pools(o, &mut warnings)?;
    let engines = pools.engines();
    fits_in_memory(
        &format!("{engines} engines (workers × dp_size)"),
        engines.saturating_mul(ENGINE_FOOTPRINT_BYTES),
    )?;
    let live =
        u64::from(pools.workers) + pools.prefill.as_ref().map_or(0, |p| u64::from(p.workers));
    if o.online && live > MAX_LIVE_WORKERS {
        return Err(Error::usage(format!(
            "--replay-mode online runs a thread a worker: {live} workers, at most {MAX_LIVE_WORKERS} (offline replay takes more)"
        )));
    }
    let router = router_mode(o, pools.queue)?;
    let workload = workload(o, &pools)?;
    let sla = Sla {
        ttft_ms: o
            .sla_ttft_ms
            .map(|v| positive("--sla-ttft-ms", v))
            .transpose()?,
        itl_ms: o
            .sla_itl_ms
            .map(|v| positive("--sla-itl-ms", v))
            .transpose()?,
        e2e_ms: o
            .sla_e2e_ms
            .map(|v| positive("--sla-e2e-ms", v))
            .transpose()?,
    };
    let report_path = o.report_json.clone().unwrap_or_else(|| {
        PathBuf::from(format!("kvtrace_simulate_report_{}.json", local_stamp()))
    });
    let asked = |target: Option<Target>| target.filter(|_| o.write_reports);
    let outputs = kvtrace::report::outputs([
        (&Json, asked(Some(Target::File(report_path.clone())))),
        (&Jsonl, asked(o.report_jsonl.clone().map(Target::File))),
        (&Csv, asked(o.report_csv.clone().map(Target::Dir))),
        (&Xlsx, asked(o.report_xlsx.clone().map(Target::File))),
    ])?;
    let offload = match &o.storage {
        Some(storage) => {
            if o.offload_chunk_size == 0 {
                return Err(Error::usage("--offload-chunk-size must be at least 1"));
            }
            let config = OffloadConfig {
                chunk_tokens: o.offload_chunk_size,
                kv_bytes_per_token: pools
                    .engine
                    .kv_bytes_per_token
                    .unwrap_or(DEFAULT_KV_BYTES_PER_TOKEN),
                l1_load_gbps: positive("--offload-l1-gbps", o.offload_l1_gbps)?,
                l2_load_gbps: positive("--offload-l2-gbps", o.offload_l2_gbps)?,
                l2_link: o.offload_l2_link.clone(),
                model_name: "kvtrace/simulate".into(),
            };
            Some((storage.clone(), config))
        }
        None => None,
    };
    Plan::new(Setup {
        workload,
        config: SimConfig {
            engine: pools.engine,
            workers: pools.workers,
            prefill: pools.prefill,
            router,
            concurrency: o.replay_concurrency,
            seed: o.seed,
            online: o.online,
            observer: None,
        },
        sla,
        per_request_metrics: o.per_request_metrics,
        offload,
        record: o.record.clone(),
        report_path,
        outputs,
        warnings,
    })
}

/// JSON given inline or as a file name.
fn json_text(flag: &str, value: &str) -> Result<String> {
    if value.trim_start().starts_with('{') {
        Ok(value.to_owned())
    } else {
        kvtrace::limits::read_text(Path::new(value), kvtrace::limits::MAX_CONFIG_BYTES)
            .map_err(|e| Error::io(format!("{flag}: cannot read"), e).in_file(value))
    }
}

/// Engine arguments and the router queue policy they override, if any.
fn engine_args(
    flag: &str,
    value: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<(EngineArgs, Option<QueuePolicy>)> {
    let text = match value {
        Some(v) => json_text(flag, v)?,
        None => "{}".into(),
    };
    let parsed = EngineArgs::from_json(&text).map_err(|e| Error::usage(format!("{flag}: {e}")))?;
    warnings.extend(parsed.warnings.iter().map(|w| format!("{flag}: {w}")));
    let queue_policy = parsed
        .router_queue_policy
        .map(|p| QueuePolicy::parse(&p).map_err(|e| Error::usage(format!("{flag}: {e}"))))
        .transpose()?;
    Ok((parsed.args, queue_policy))
}

fn at_least_one(flag: &str, n: Option<u32>) -> Result<u32> {
    match n {
        Some(0) => Err(Error::usage(format!("{flag} must be at least 1"))),
        n => Ok(n.unwrap_or(1)),
    }
}

/// The decode (or aggregated) engines and their count, the prefill pool of a disaggregated
/// run, and the router queue policy the engine arguments override.
fn pools(o: &Options, warnings: &mut Vec<String>) -> Result<Pools> {
    let staged = o.prefill_engine_args.is_some() || o.decode_engine_args.is_some();
    let staged_counts = o.num_prefill_workers.is_some() || o.num_decode_workers.is_some();
    if !staged {
        if staged_counts {
            return Err(Error::usage(
                "--num-prefill-workers/--num-decode-workers need --prefill-engine-args and --decode-engine-args",
            ));
        }
        let workers = at_least_one("--num-workers", o.num_workers)?;
        let (engine, queue) = engine_args(
            "--extra-engine-args",
            o.extra_engine_args.as_deref(),
            warnings,
        )?;
        if engine.worker_type != WorkerType::Aggregated {
            return Err(Error::usage(
                "--extra-engine-args: worker_type prefill/decode belongs in --prefill-engine-args/--decode-engine-args",
            ));
        }
        return Ok(Pools {
            engine,
            workers,
            prefill: None,
            queue,
        });
    }
    let (Some(p), Some(d)) = (&o.prefill_engine_args, &o.decode_engine_args) else {
        return Err(Error::usage(
            "disaggregated serving needs both --prefill-engine-args and --decode-engine-args",
        ));
    };
    if o.extra_engine_args.is_some() || o.num_workers.is_some() {
        return Err(Error::usage(
            "--extra-engine-args/--num-workers describe aggregated workers; a disaggregated run takes --prefill-engine-args/--decode-engine-args and --num-prefill-workers/--num-decode-workers",
        ));
    }
    let (mut prefill, queue) = engine_args("--prefill-engine-args", Some(p), warnings)?;
    let (mut decode, _) = engine_args("--decode-engine-args", Some(d), warnings)?;
    for (flag, a, want) in [
        ("--prefill-engine-args", &prefill, WorkerType::Prefill),
        ("--decode-engine-args", &decode, WorkerType::Decode),
    ] {
        if a.worker_type != want && a.worker_type != WorkerType::Aggregated {
            let name = if want == WorkerType::Prefill {
                "prefill"
            } else {
                "decode"
            };
            return Err(Error::usage(format!(
                "{flag}: worker_type must be \"{name}\" (or left out)"
            )));
        }
    }
    prefill.worker_type = WorkerType::Prefill;
    decode.worker_type = WorkerType::Decode;
    if prefill.engine_type != decode.engine_type {
        return Err(Error::usage(
            "prefill and decode engine_type differ: the KV handoff needs one engine on both sides",
        ));
    }
    // What Dynamo 1.4.2's handoff refuses and AISimulate's takes, when either pool follows
    // Dynamo 1.4.2.
    let dynamo = prefill.engine_version == EngineVersion::Dynamo142
        || decode.engine_version == EngineVersion::Dynamo142;
    if dynamo && prefill.engine_type == EngineType::Trtllm {
        return Err(Error::usage(
            "disaggregated trtllm: Dynamo 1.4.2 refuses it (\"engine_version\": \"aisimulate-0.13\" on both pools models AISimulate's)",
        ));
    }
    if dynamo && prefill.block_size != decode.block_size {
        return Err(Error::usage(format!(
            "prefill and decode block sizes differ ({} and {}): Dynamo 1.4.2's KV handoff needs one block size (\"engine_version\": \"aisimulate-0.13\" on both pools takes two)",
            prefill.block_size, decode.block_size
        )));
    }
    // Its prefill worker generates a delta turn's output unseen, so the next prompt would
    // repeat what no decode worker wrote; AISimulate's hands every output token to the
    // decode worker.
    if dynamo && o.trace_format == TraceFormat::MooncakeDelta && !o.traces.is_empty() {
        return Err(Error::usage(
            "--trace-format mooncake-delta replays on aggregated workers only under Dynamo 1.4.2's engine, as Dynamo does (\"engine_version\": \"aisimulate-0.13\" replays it disaggregated)",
        ));
    }
    let pool = PrefillPool {
        engine: prefill,
        workers: at_least_one("--num-prefill-workers", o.num_prefill_workers)?,
    };
    let workers = at_least_one("--num-decode-workers", o.num_decode_workers)?;
    Ok(Pools {
        engine: decode,
        workers,
        prefill: Some(pool),
        queue,
    })
}

fn positive(flag: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Error::usage(format!(
            "{flag} {}: expected a positive number",
            short(v)
        )))
    }
}

/// The workload `o` names for `pools` to serve: its trace files, or the synthetic requests
/// its flags describe.
fn workload(o: &Options, pools: &Pools) -> Result<Workload> {
    let engine = &pools.engine;
    let block_size = engine.block_size;
    let synthetic = [
        o.input_tokens.is_some(),
        o.output_tokens.is_some(),
        o.request_count.is_some(),
    ];
    let synthetic_only = [
        ("--arrival-interval-ms", o.arrival_interval_ms.is_some()),
        ("--request-rate", o.request_rate.is_some()),
        ("--turns-per-session", o.turns_per_session.is_some()),
        ("--shared-prefix-ratio", o.shared_prefix_ratio.is_some()),
        ("--num-prefix-groups", o.num_prefix_groups.is_some()),
        ("--inter-turn-delay-ms", o.inter_turn_delay_ms.is_some()),
    ];
    positive("--arrival-speedup-ratio", o.arrival_speedup_ratio)?;
    if !o.traces.is_empty() {
        if synthetic.iter().any(|&s| s) {
            return Err(Error::usage(
                "give either a trace file or --input-tokens/--output-tokens/--request-count, not both",
            ));
        }
        if let Some((flag, _)) = synthetic_only.iter().find(|(_, set)| *set) {
            return Err(Error::usage(format!(
                "{flag} applies to synthetic workloads only, not to a trace file"
            )));
        }
        let w = read_traces(o, engine.engine_version)?;
        // AISimulate refuses such a time too ("must be finite").
        if !w.times_are_finite() {
            return Err(Error::usage(format!(
                "--arrival-speedup-ratio {}: the trace's times, slowed down by it, pass the largest time there is",
                short(o.arrival_speedup_ratio)
            )));
        }
        if w.graph.is_some() && o.replay_concurrency.is_some() {
            return Err(Error::usage(
                "--replay-concurrency: an agentic trace's requests start when what they wait for ends, not when a slot frees; replay it by its timestamps",
            ));
        }
        return Ok(w);
    }
    let (Some(input), Some(output), Some(count)) =
        (o.input_tokens, o.output_tokens, o.request_count)
    else {
        return Err(Error::usage(
            "give a trace file, or all of --input-tokens, --output-tokens and --request-count",
        ));
    };
    let drivers = [
        o.replay_concurrency.is_some(),
        o.request_rate.is_some(),
        o.arrival_interval_ms.is_some(),
    ];
    if drivers.iter().filter(|&&d| d).count() != 1 {
        return Err(Error::usage(
            "a synthetic workload needs exactly one of --replay-concurrency, --request-rate and --arrival-interval-ms",
        ));
    }
    let arrivals = match (o.request_rate, o.arrival_interval_ms) {
        (Some(rate), _) => SyntheticArrivals::Rate {
            per_s: positive("--request-rate", rate)?,
            seed: o.arrival_seed,
        },
        (_, Some(ms)) if ms.is_finite() && ms >= 0.0 => SyntheticArrivals::Interval { ms },
        (_, Some(ms)) => {
            return Err(Error::usage(format!(
                "--arrival-interval-ms {}: expected a number >= 0",
                short(ms)
            )))
        }
        _ => SyntheticArrivals::Burst,
    };
    let ratio = o.shared_prefix_ratio.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Error::usage(format!(
            "--shared-prefix-ratio {}: expected a fraction between 0 and 1",
            short(ratio)
        )));
    }
    let delay = o.inter_turn_delay_ms.unwrap_or(0.0);
    if !(delay.is_finite() && delay >= 0.0) {
        return Err(Error::usage(format!(
            "--inter-turn-delay-ms {}: expected a number >= 0",
            short(delay)
        )));
    }
    if input == 0 || count == 0 || o.turns_per_session == Some(0) {
        return Err(Error::usage(
            "--input-tokens, --request-count and --turns-per-session must be at least 1",
        ));
    }
    // Every synthetic prompt is `input` tokens long, so one that no engine's KV cache can hold
    // would leave every request rejected or waiting, after building prompts that may be
    // billions of tokens (minutes and gigabytes for nothing).
    let largest_kv = pools.largest_kv_tokens();
    if u64::from(input) > largest_kv {
        return Err(Error::usage(format!(
            "--input-tokens {input}: more than the {largest_kv} tokens of KV cache any engine holds (num_gpu_blocks × block_size), so no request could be served"
        )));
    }
    let spec = SyntheticSpec {
        input_tokens: input,
        output_tokens: output,
        count,
        turns: o.turns_per_session.unwrap_or(1),
        shared_prefix_ratio: ratio,
        prefix_groups: o.num_prefix_groups.unwrap_or(0),
        inter_turn_delay_ms: delay,
        block_size,
        arrivals,
        seed: o.seed,
        carry_history: o.carry_history,
    };
    fits_in_memory(
        &format!(
            "--request-count {count} of --input-tokens {input} (× --turns-per-session {})",
            spec.turns
        ),
        spec.footprint_bytes(pools.engine_blocks()),
    )?;
    Ok(spec.build())
}

/// The most workers `--replay-mode online` starts, a thread each: 4,096 start in about a
/// second here, while tens of thousands ran out of the memory a thread's guard pages take
/// (an abort).
const MAX_LIVE_WORKERS: u64 = 4096;

/// About the bytes one engine (a worker's data-parallel rank) holds before its KV cache
/// fills, measured on this build (10^5 to 10^6 workers: 1.1 to 1.2 KB each, vLLM or
/// SGLang); its blocks are taken as they are used.
const ENGINE_FOOTPRINT_BYTES: u64 = 1200;

/// Refuses what would take more memory than the machine has free, `what` naming the flags,
/// in place of a run that the allocator or the kernel ends without a word.
fn fits_in_memory(what: &str, bytes: u64) -> Result<()> {
    let Some(available) = kvtrace::machine::available_memory() else {
        return Ok(());
    };
    if bytes <= available {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(Error::usage(format!(
        "{what}: about {:.1} GiB to hold, more than the {:.1} GiB of memory available",
        gib(bytes),
        gib(available)
    )))
}

/// Reads the trace files in their format (legacy agentic rows as `engine` reads them), their
/// arrivals sped up by `--arrival-speedup-ratio`. Only the dynamo format is split into shards.
fn read_traces(o: &Options, engine: EngineVersion) -> Result<Workload> {
    if o.trace_block_size == Some(0) {
        return Err(Error::usage("--trace-block-size must be at least 1"));
    }
    let block = o.trace_block_size.unwrap_or(DEFAULT_TRACE_BLOCK_SIZE);
    let open = |path: &PathBuf| -> Result<(String, Box<dyn BufRead + Send>)> {
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
        let reader: Box<dyn BufRead + Send> = if path.extension().is_some_and(|x| x == "gz") {
            Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(file)))
        } else {
            Box::new(BufReader::new(file))
        };
        Ok((shown, reader))
    };
    let speedup = o.arrival_speedup_ratio;
    if o.trace_format == TraceFormat::Dynamo {
        let sources = o.traces.iter().map(open).collect::<Result<Vec<_>>>()?;
        let mut w = read_dynamo_request_trace(sources, o.trace_block_size)?;
        w.speed_up_arrivals(speedup);
        return Ok(w);
    }
    if o.traces.len() > 1 {
        return Err(Error::usage(
            "one trace file at a time (only --trace-format dynamo reads several shards; a weka corpus is one directory)",
        ));
    }
    if o.trace_format == TraceFormat::Weka {
        return read_weka(
            &o.traces[0],
            o.trace_block_size,
            o.nested_timestamps,
            speedup,
        );
    }
    let (shown, reader) = open(&o.traces[0])?;
    let read = match o.trace_format {
        TraceFormat::Mooncake => read_mooncake(reader, block),
        TraceFormat::MooncakeDelta => read_mooncake_delta(reader, block),
        TraceFormat::AgenticMooncake => {
            read_agentic_mooncake(reader, o.trace_block_size, engine, &shown, speedup)
        }
        TraceFormat::Dynamo | TraceFormat::Weka => unreachable!("read above"),
    };
    let mut w = read.map_err(|mut e| {
        if e.message.ends_with(GIVE_BLOCK_SIZE) {
            e.message += " with --trace-block-size";
        }
        e.in_file(&shown)
    })?;
    if o.trace_format != TraceFormat::AgenticMooncake {
        w.speed_up_arrivals(speedup);
    }
    Ok(w)
}

fn router_mode(o: &Options, queue_override: Option<QueuePolicy>) -> Result<RouterMode> {
    match o.router {
        Router::RoundRobin => {
            if o.router_config.is_some() {
                return Err(Error::usage(
                    "--router-config configures the kv_router; add --router-mode kv_router",
                ));
            }
            Ok(RouterMode::RoundRobin)
        }
        Router::KvRouter => {
            let mut config = match &o.router_config {
                Some(v) => KvRouterConfig::from_json(&json_text("--router-config", v)?)
                    .map_err(|e| Error::usage(format!("--router-config: {e}")))?,
                None => KvRouterConfig::default(),
            };
            if let Some(policy) = queue_override {
                config.router_queue_policy = policy;
            }
            Ok(RouterMode::KvRouter(config))
        }
    }
}
