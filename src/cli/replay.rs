//! `kvtrace replay`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::ValueEnum;
use kvtrace::error::{short, Error, EXIT_DATA, EXIT_OK};
use kvtrace::rank::Rank;
use kvtrace::replay::client::{ClientChoice, Shape};
use kvtrace::replay::dispatch::Outcome;
use kvtrace::replay::events::fleet::{summarise, FleetStream};
use kvtrace::replay::events::{replay_events, server_config};
use kvtrace::replay::loaded::Loaded;
use kvtrace::replay::phase::PhaseChoice;
use kvtrace::replay::plan::{no_recorded_config, Options, Plan, Storage, NO_RECORDED_CONFIG};
use kvtrace::replay::shard::ShardMode;
use kvtrace::replay::{Pacing, ReplayOptions, MIN_SPEEDUP};
use kvtrace::report::{csv::Csv, json::Json, xlsx::Xlsx, Exporter, Report, Target};
use kvtrace::storage::config::{BackendConfig, StorageConfig, NAME_L2};

use super::otlp::{self, OtlpArgs};
use super::progress::{Progress, EVERY};
use super::prometheus::{span_sink, PrometheusArgs};
use super::rank::RankArgs;
use super::tiers::{apply_toml, positive, TierArgs};
use super::{print_stdout, warn, warn_line, OutputArg, ReadArgs};

#[derive(Clone, Copy, ValueEnum)]
enum Pace {
    /// Sleep to each record's recorded time (LMCache's only mode)
    Realtime,
    /// As fast as possible: deterministic counters and hits
    Afap,
}

#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace replay trace.lct  # the recorded configuration, as fast as possible",
        "kvtrace replay trace.lct --l1-size-gb 0.05 --eviction-policy ARC --json",
        "kvtrace replay trace.lct --pace realtime --speedup 10 --jsonl-out records.jsonl",
    ]) + "\nWithout storage flags kvtrace rebuilds the configuration recorded in the trace's header; any flag \
given overrides it. LMCache's flag names and meanings are kept. Exit status 1 if any call failed."
)]
pub(super) struct Args {
    /// Storage trace (.lct or .lct.zst); in rank mode, one per rank (rank i replays the
    /// i-th) or one that --shard splits
    #[arg(value_name = "FILE", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// Pacing; afap unless --speedup is given
    #[arg(long, value_enum)]
    pace: Option<Pace>,
    /// Replay N times faster than recorded (implies --pace realtime)
    #[arg(long, value_name = "N")]
    speedup: Option<f64>,
    /// Also wait through the time before the first record
    #[arg(long)]
    keep_startup_gap: bool,
    /// A TOML file describing the hierarchy (see docs/commands/replay.md); flags given as well override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    tiers: TierArgs,
    /// Where the CSV and JSON reports go
    #[arg(long, value_name = "DIR", default_value = ".")]
    output_dir: PathBuf,
    /// Also write the JSON summary: trace_replay_summary.json in --output-dir, or PATH
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    json: Option<OutputArg>,
    /// Do not write the CSV reports
    #[arg(long)]
    no_csv: bool,
    /// Also write the workbook (sheets Summary, Ops, Requests, Tiers, Config): trace_replay.xlsx
    /// in --output-dir, or PATH
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    xlsx: Option<OutputArg>,
    /// Also write each CSV table as Parquet (trace_replay_requests.parquet, ...) into
    /// --output-dir, or DIR
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    parquet: Option<OutputArg>,
    /// Write one JSON line per record
    #[arg(long, value_name = "PATH")]
    jsonl_out: Option<PathBuf>,
    /// One line per record on stdout
    #[arg(long)]
    verbose: bool,
    /// No terminal table and no progress bar
    #[arg(short, long)]
    quiet: bool,
    /// When the recorded server's L1 eviction controller started, in seconds after the
    /// trace's time origin (its passes follow every --eviction-interval); `auto` estimates it
    /// from the trace's own outcomes
    #[arg(long, value_name = "SECONDS|auto", default_value = "auto")]
    eviction_phase: String,
    /// Replay the calls alone: no end-of-session touch, and no writes or lock releases that
    /// a different outcome would have made the client do
    #[arg(long)]
    no_session_emulation: bool,
    /// The recorded client, for what it would have stored had the cache answered otherwise:
    /// vllm stores only the chunks after its hit prefix (more after a replayed miss, fewer
    /// after a replayed hit), sdk stores whole prompts, literal replays every call as
    /// recorded (LMCache's replay); auto infers it from the trace's stores
    #[arg(long, value_enum, default_value = "auto")]
    client: Client,
    /// Stop at the first call a tier refuses (a full disk, a lost Redis) instead of counting
    /// it and going on
    #[arg(long)]
    fail_fast: bool,
    /// Exit 1 when any request or store differs from the recording (regression pipelines)
    #[arg(long)]
    expect_fidelity: bool,
    /// In rank mode, how the ranks split one trace: whole requests in turn (by-request),
    /// by the hash of a session's first key (by-key), or each the whole trace (replicate)
    #[arg(long, value_enum, help_heading = "Rank mode (many processes, one run)")]
    shard: Option<Shard>,
    #[command(flatten)]
    ranks: RankArgs,
    #[command(flatten)]
    otlp: OtlpArgs,
    #[command(flatten)]
    prometheus: PrometheusArgs,
    #[command(flatten)]
    read: ReadArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Client {
    Auto,
    Vllm,
    Sdk,
    Literal,
}

impl Client {
    fn choice(self) -> ClientChoice {
        match self {
            Client::Auto => ClientChoice::Infer,
            Client::Vllm => ClientChoice::Given(Shape::Vllm),
            Client::Sdk => ClientChoice::Given(Shape::Sdk),
            Client::Literal => ClientChoice::Given(Shape::Literal),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Shard {
    ByRequest,
    ByKey,
    Replicate,
}

impl Shard {
    fn mode(self) -> ShardMode {
        match self {
            Shard::ByRequest => ShardMode::ByRequest,
            Shard::ByKey => ShardMode::ByKey,
            Shard::Replicate => ShardMode::Replicate,
        }
    }
}

/// What a rank replays: its trace, and how it takes its share of it (`None`: all of it).
fn rank_trace<'a>(
    args: &'a Args,
    rank: Option<&Rank>,
) -> Result<(&'a Path, Option<ShardMode>), Error> {
    let shard = args.shard.map(Shard::mode);
    let files = &args.files;
    match rank {
        None if files.len() > 1 => Err(Error::usage(format!(
            "{} traces given: several traces are replayed one per rank (--rank/--world-size or a launcher)",
            files.len()
        ))),
        None if shard.is_some() => Err(Error::usage(
            "--shard splits a trace between ranks: give --rank/--world-size or start under a launcher",
        )),
        None => Ok((&files[0], None)),
        Some(_) if files.len() == 1 => Ok((&files[0], Some(shard.unwrap_or(ShardMode::ByRequest)))),
        Some(r) if files.len() != r.world_size as usize => Err(Error::usage(format!(
            "{} traces for a world of {}: give one trace per rank, or one trace and --shard",
            files.len(),
            r.world_size
        ))),
        Some(_) if shard.is_some() => Err(Error::usage(
            "--shard splits one trace; with one trace per rank each rank replays its own",
        )),
        Some(r) => Ok((&files[r.rank as usize], None)),
    }
}

/// A rank's private copy of the tiers that would otherwise collide: file tiers get a
/// sub-directory per rank (a shared tier — Redis, a cluster — stays shared).
fn rank_tiers(config: &mut StorageConfig, rank: &Rank) {
    for tier in &mut config.l2 {
        if let BackendConfig::File { dir, .. } = &mut tier.backend {
            *dir = dir.join(rank.dir_name());
        }
    }
}

fn pacing(args: &Args) -> Result<Pacing, Error> {
    match (args.pace, args.speedup) {
        (Some(Pace::Afap), Some(_)) => {
            Err(Error::usage("--speedup needs --pace realtime, not afap"))
        }
        (_, Some(s)) if !positive(s) => Err(Error::usage(format!(
            "--speedup {}: must be positive",
            short(s)
        ))),
        (_, Some(s)) if s < MIN_SPEEDUP => Err(Error::usage(format!(
            "--speedup {}: below {MIN_SPEEDUP:e}, the slowest pacing (a trace millisecond \
             then takes 11.6 days)",
            short(s)
        ))),
        (_, Some(s)) => Ok(Pacing::Timed { speedup: s }),
        (Some(Pace::Realtime), None) => Ok(Pacing::Timed { speedup: 1.0 }),
        (Some(Pace::Afap) | None, None) => Ok(Pacing::AsFastAsPossible),
    }
}

fn phase(text: &str) -> Result<PhaseChoice, Error> {
    match text {
        "auto" => Ok(PhaseChoice::Estimate),
        text => match text.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(PhaseChoice::Fixed(s)),
            _ => Err(Error::usage(format!(
                "--eviction-phase {text}: expected a non-negative number of seconds or auto"
            ))),
        },
    }
}

/// Checks `args` as [`plan`] would, without reading the trace (a sweep checks every point
/// before it runs any), and returns the tiers they configure on top of the defaults.
pub(super) fn check(args: &Args) -> Result<StorageConfig, Error> {
    pacing(args)?;
    phase(&args.eviction_phase)?;
    let mut config = StorageConfig::default();
    if let Some(path) = &args.config {
        apply_toml(&mut config, path)?;
    }
    args.tiers.apply(&mut config)?;
    Ok(config)
}

/// How `args` read the trace.
pub(super) fn read_options(args: &Args) -> kvtrace::lmct::ReadOptions {
    args.read.options()
}

/// The replay `args` describe, as rank `rank` of a run when given; without `outputs`, one
/// that writes no report files and does not time its calls (a sweep's point, a planner's
/// size).
/// `loaded`: the trace decoded before, which many plans share.
pub(super) fn plan(
    args: &Args,
    outputs: bool,
    rank: Option<&Rank>,
    loaded: Option<Arc<Loaded>>,
) -> Result<Plan, Error> {
    let (file, shard) = rank_trace(args, rank)?;
    let output_dir = match rank {
        Some(r) => args.output_dir.join(r.dir_name()),
        None => args.output_dir.clone(),
    };
    let barrier = match rank {
        Some(r) => args.ranks.barrier(r, &args.output_dir)?,
        None => None,
    };
    // A file named by a flag is, in rank mode, this rank's own file beside it.
    let per_rank = |path: &Path| rank.map_or_else(|| path.to_owned(), |r| r.file_name(path));
    let target = |flag: &OutputArg| match flag.given() {
        Some(path) => Target::File(per_rank(path)),
        None => Target::Dir(output_dir.clone()),
    };
    let (parquet, parquet_dir) =
        super::parquet_output(
            args.parquet
                .as_ref()
                .map(|flag| match (flag.given(), rank) {
                    (Some(dir), Some(r)) => dir.join(r.dir_name()),
                    (Some(dir), None) => dir.to_owned(),
                    (None, _) => output_dir.clone(),
                }),
        )?;
    let formats: [(Option<Target>, &'static dyn Exporter, &'static str); 4] = [
        (
            (!args.no_csv).then(|| Target::Dir(output_dir.clone())),
            &Csv,
            "",
        ),
        (
            args.json.as_ref().map(target),
            &Json,
            "trace_replay_summary.json",
        ),
        (args.xlsx.as_ref().map(target), &Xlsx, "trace_replay.xlsx"),
        (parquet_dir, parquet, ""),
    ];
    let options = Options {
        replay: ReplayOptions {
            pacing: pacing(args)?,
            keep_startup_gap: args.keep_startup_gap,
            read: args.read.options(),
            emulate_sessions: !args.no_session_emulation,
            client: args.client.choice(),
            fail_fast: args.fail_fast,
            rank: rank.map(|r| (r.clone(), shard)),
            time_calls: outputs,
            ..ReplayOptions::default()
        },
        phase: phase(&args.eviction_phase)?,
        outputs: formats
            .into_iter()
            .filter(|_| outputs)
            .filter_map(|(target, exporter, name)| Some((exporter, target?, name)))
            .collect(),
        jsonl: args.jsonl_out.as_deref().filter(|_| outputs).map(per_rank),
        barrier,
        loaded,
    };
    let overrides = |config: &mut StorageConfig| {
        if let Some(path) = &args.config {
            apply_toml(config, path)?;
        }
        args.tiers.apply(config)?;
        if let Some(r) = rank {
            rank_tiers(config, r);
        }
        Ok(())
    };
    let storage = Storage::Recorded {
        overrides: &overrides,
        own_l2: args.tiers.gives_l2() || args.config.is_some(),
        complete: gives_whole_config(args),
    };
    Plan::new(file, storage, options).map_err(|mut e| {
        if e.message.ends_with(NO_RECORDED_CONFIG) {
            e.message += GIVE_CONFIG;
        }
        e
    })
}

/// Whether the flags make a whole configuration without the trace's: an L1 size or a file.
fn gives_whole_config(args: &Args) -> bool {
    args.tiers.l1_size_gb.is_some() || args.config.is_some()
}

/// What the error of a trace without a readable configuration, replayed without a whole
/// one, ends with.
const GIVE_CONFIG: &str = "; give one with --l1-size-gb or --config";

/// Whether `path` is an events-level trace (an unreadable one is left to the replay's own
/// error). Only a regular file is looked at: reading a pipe's header here would take it from
/// the replay that spools the pipe.
pub(super) fn is_events(path: &Path, args: &Args) -> bool {
    path.is_file()
        && kvtrace::lmct::TraceReader::open(path, args.read.options())
            .is_ok_and(|r| r.header().level == "events")
}

/// The configuration an events replay runs: `recorded`, the first file's (or the defaults,
/// when the flags give a whole one), then `--config` and the storage flags.
pub(super) fn events_config(args: &Args, recorded: &str) -> Result<StorageConfig, Error> {
    let mut config = match StorageConfig::read_lmcache_json(recorded) {
        Ok((config, _)) => {
            config.check_recorded().map_err(|e| {
                Error::data(0, "header.sm_config_json", e).in_file(args.files[0].display())
            })?;
            config
        }
        Err(_) if gives_whole_config(args) => StorageConfig::default(),
        Err(why) => {
            let mut e = no_recorded_config(args.files[0].display(), &why);
            e.message += GIVE_CONFIG;
            return Err(e);
        }
    };
    if let Some(path) = &args.config {
        apply_toml(&mut config, path)?;
    }
    args.tiers.apply(&mut config)?;
    Ok(config)
}

/// `kvtrace replay` of events traces: the fleet's stores and accesses against the tiers
/// (see [`kvtrace::replay::events`]).
fn run_events(args: &Args) -> Result<i32, Error> {
    if args.ranks.rank()?.is_some() || args.shard.is_some() {
        return Err(Error::usage(
            "an events replay runs the whole fleet in one process: give no rank or --shard",
        ));
    }
    if args.otlp.asked() {
        return Err(Error::usage(
            "request spans come from storage traces: an events trace has no requests to export",
        ));
    }
    if args.prometheus.asked() {
        return Err(Error::usage(
            "--prometheus-port serves a storage replay's figures; an events replay has none live",
        ));
    }
    let files: Vec<&Path> = args.files.iter().map(PathBuf::as_path).collect();
    let stream = FleetStream::load(&files, args.read.options())?;
    let base = events_config(args, &stream.sm_config_json)?;
    let outputs = kvtrace::report::outputs([
        (
            &Csv as &dyn Exporter,
            (!args.no_csv).then(|| Target::Dir(args.output_dir.clone())),
        ),
        (
            &Json,
            args.json.as_ref().map(|o| {
                Target::File(o.path(|| args.output_dir.join("events_replay_summary.json")))
            }),
        ),
        (
            &Xlsx,
            args.xlsx
                .as_ref()
                .map(|o| Target::File(o.path(|| args.output_dir.join("events_replay.xlsx")))),
        ),
        super::parquet_output(
            args.parquet
                .as_ref()
                .map(|o| o.path(|| args.output_dir.clone())),
        )?,
    ])?;
    let config_for = |server: usize| server_config(&base, server);
    let report = replay_events(&stream, &summarise(&stream), &config_for)?;
    for w in &report.warnings {
        match files.as_slice() {
            [file] => warn(&file.display().to_string(), w),
            _ => warn_line(w),
        }
    }
    for (exporter, target) in &outputs {
        kvtrace::report::write(&report, *exporter, target, "events_replay_summary.json")?;
    }
    if !args.quiet {
        print_stdout(&report.terminal())?;
    }
    Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
}

/// Refuses, before any work, an output that is one of the replay's inputs.
pub(super) fn guard(args: &Args) -> Result<(), Error> {
    crate::cli::guard(
        args.files.iter().chain(&args.config).map(PathBuf::as_path),
        args.jsonl_out
            .as_deref()
            .into_iter()
            .chain(args.json.as_ref().and_then(OutputArg::given))
            .chain(args.xlsx.as_ref().and_then(OutputArg::given))
            .chain(args.parquet.as_ref().and_then(OutputArg::given))
            .chain(args.otlp.file()),
    )
}

/// Records between two readings of the tiers' counters for the live figures.
const LIVE_EVERY: u64 = 1024;

pub(super) fn run(args: Args) -> Result<i32, Error> {
    guard(&args)?;
    if is_events(&args.files[0], &args) {
        return run_events(&args);
    }
    let rank = args.ranks.rank()?;
    // Checked before the output directory is made: a refused run leaves nothing behind.
    let shown = rank_trace(&args, rank.as_ref())?.0.display().to_string();
    // Held until the reports are written: a second run into the directory is refused.
    let _lock =
        if args.no_csv && args.json.is_none() && args.xlsx.is_none() && args.parquet.is_none() {
            None
        } else {
            let dir = match &rank {
                Some(r) => args.output_dir.join(r.dir_name()),
                None => args.output_dir.clone(),
            };
            Some(kvtrace::output::DirLock::acquire(&dir)?)
        };
    let mut plan = plan(&args, true, rank.as_ref(), None)?;
    let export = args.otlp.start(plan.span_resource())?;
    let served = args.prometheus.start("replay", &shown, rank.as_ref())?;
    if let Some(sink) = span_sink(served.as_ref(), export.clone().map(|e| e as _)) {
        plan.export_spans(sink);
    }
    let trace_bytes = std::fs::metadata(plan.input()).map_or(0, |m| m.len());
    for w in args.tiers.warnings() {
        warn_line(w);
    }
    for note in &plan.notes {
        if note.ends_with(NAME_L2) {
            warn(&shown, &format!("{note} (--l2-adapter or --config)"));
        } else {
            warn(&shown, note);
        }
    }
    let bar = Progress::reading(plan.input(), !args.quiet && !args.verbose);
    let mut out = std::io::stdout().lock();
    let mut io_error = None;
    let finished = plan.run(|event| {
        if event.index.is_multiple_of(EVERY) {
            bar.set(event.index, event.offset);
        }
        if let Some(served) = &served {
            let failed = matches!(event.outcome, Outcome::Failed { .. });
            let call = kvtrace::lmct::calls::short_name(event.qualname);
            served.live.call(&call, event.latency_ms / 1e3, failed);
            if event.index.is_multiple_of(LIVE_EVERY) {
                served
                    .live
                    .storage(&event.sm.tier_stats(), &event.sm.call_stats());
                if trace_bytes > 0 {
                    served
                        .live
                        .progress(event.offset as f64 / trace_bytes as f64);
                }
            }
        }
        if args.verbose {
            let failed = !matches!(event.outcome, Outcome::Ok { .. });
            let status = if failed { "FAIL" } else { "OK" };
            let line = format!(
                "  [{}]  {status:<4}  {:.3}ms  {}\n",
                event.index, event.latency_ms, event.qualname
            );
            if let Err(e) = out.write_all(line.as_bytes()) {
                io_error.get_or_insert(e);
            }
        }
    });
    bar.finish();
    drop(out);
    // A run that failed writes no OTLP file (the export is dropped unfinished).
    let finished = finished?;
    let exported = otlp::finish(export, args.quiet);
    if let Some(served) = served {
        let report = &finished.report;
        served.live.storage(&report.tiers, &report.calls);
        served.finish(args.quiet);
    }
    if let Some(e) = io_error {
        return Err(Error::io("cannot write per-record output", e));
    }
    let report = &finished.report;
    for w in &report.warnings {
        warn(&shown, w);
    }
    if !args.quiet {
        print_stdout(&report.terminal())?;
    }
    // Said even with -q: the exit status alone does not tell a full disk from a miss.
    if let Some(line) = finished.failure_line() {
        eprintln!("kvtrace: {line}");
    }
    if let Some(status) = kvtrace::interrupt::exit_status() {
        return Ok(status);
    }
    Ok(
        if exported.is_some()
            || report.failed > 0
            || (args.expect_fidelity && !report.fidelity.exact())
        {
            EXIT_DATA
        } else {
            EXIT_OK
        },
    )
}
