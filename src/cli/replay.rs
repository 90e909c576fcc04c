//! `kvtrace replay`.

use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::lmct::reader::ZSTD_MAGIC;
use kvtrace::lmct::TraceReader;
use kvtrace::replay::dispatch::Outcome;
use kvtrace::replay::phase::{settle, PhaseChoice};
use kvtrace::replay::spool::Spooled;
use kvtrace::replay::{replay, Pacing, ReplayOptions};
use kvtrace::report::jsonl::JsonlWriter;
use kvtrace::report::{self, csv::Csv, json::Json, xlsx::Xlsx, Exporter, Report, Target};
use kvtrace::storage::config::StorageConfig;
use kvtrace::storage::StorageManager;

use super::tiers::{apply_toml, positive, TierArgs};
use super::{print_stdout, warn, ReadArgs};

#[derive(Clone, Copy, ValueEnum)]
enum Pace {
    /// Sleep to each record's recorded time (LMCache's only mode)
    Realtime,
    /// As fast as possible: deterministic counters and hits
    Afap,
}

/// Re-issue every recorded StorageManager call against a fresh StorageManager and report what
/// the cache did: hits per request and tier, OUT_OF_MEMORY, evictions, bytes, call latencies
#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace replay trace.lct  # the recorded configuration, as fast as possible",
        "kvtrace replay trace.lct --l1-size-gb 0.05 --eviction-policy ARC --json",
        "kvtrace replay trace.lct --pace realtime --speedup 10 --jsonl-out records.jsonl",
    ]) + "\nWithout storage flags kvtrace rebuilds the configuration recorded in the trace's header; any flag \
given overrides it. LMCache's flag names and meanings are kept. Exit status 1 if any call failed."
)]
pub struct Args {
    /// Storage trace (.lct or .lct.zst)
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Pacing; afap unless --speedup is given
    #[arg(long, value_enum)]
    pace: Option<Pace>,
    /// Replay N times faster than recorded (implies --pace realtime)
    #[arg(long, value_name = "N")]
    speedup: Option<f64>,
    /// Also wait through the time before the first record
    #[arg(long)]
    keep_startup_gap: bool,
    /// A TOML file describing the hierarchy (see README); flags given as well override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    tiers: TierArgs,
    /// Where the CSV and JSON reports go
    #[arg(long, value_name = "DIR", default_value = ".")]
    output_dir: PathBuf,
    /// Also write trace_replay_summary.json
    #[arg(long)]
    json: bool,
    /// Do not write the CSV reports
    #[arg(long)]
    no_csv: bool,
    /// Also write trace_replay.xlsx (sheets Summary, Ops, Requests, Tiers, Config)
    #[arg(long)]
    xlsx: bool,
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
    /// Stop at the first call a tier refuses (a full disk, a lost Redis) instead of counting
    /// it and going on
    #[arg(long)]
    fail_fast: bool,
    /// Exit 1 when any request or store differs from the recording (regression pipelines)
    #[arg(long)]
    expect_fidelity: bool,
    #[command(flatten)]
    read: ReadArgs,
}

/// The recorded configuration, overridden by every flag given.
fn storage_config(args: &Args, recorded: &str, shown: &str) -> Result<StorageConfig, Error> {
    let from_trace = StorageConfig::from_lmcache_json(recorded);
    let explicit = args.tiers.l1_size_gb.is_some() || args.config.is_some();
    let mut config = match (&from_trace, explicit) {
        (Some((c, notes)), _) => {
            let tiers_given = args.tiers.gives_l2() || args.config.is_some();
            for n in notes {
                if !(tiers_given && n.contains("--l2-adapter")) {
                    warn(shown, n);
                }
            }
            c.clone()
        }
        (None, true) => StorageConfig::default(),
        (None, false) => {
            return Err(Error::usage(
                "the trace records no storage configuration kvtrace can read; give one with --l1-size-gb or --config",
            ))
        }
    };
    if let Some(path) = &args.config {
        apply_toml(&mut config, path)?;
    }
    args.tiers.apply(&mut config)?;
    Ok(config)
}

fn pacing(args: &Args) -> Result<Pacing, Error> {
    match (args.pace, args.speedup) {
        (Some(Pace::Afap), Some(_)) => {
            Err(Error::usage("--speedup needs --pace realtime, not afap"))
        }
        (_, Some(s)) if !positive(s) => {
            Err(Error::usage(format!("--speedup {s}: must be positive")))
        }
        (_, Some(s)) => Ok(Pacing::Timed { speedup: s }),
        (Some(Pace::Realtime), None) => Ok(Pacing::Timed { speedup: 1.0 }),
        (Some(Pace::Afap) | None, None) => Ok(Pacing::AsFastAsPossible),
    }
}

/// The progress bar's unit: byte offsets against the file size for a plain trace (no second
/// pass over the file), records without a total for a compressed one.
fn progress_bar(path: &Path) -> (ProgressBar, bool) {
    let mut magic = [0u8; 4];
    let plain_size = File::open(path).ok().and_then(|mut f| {
        let compressed = f.read_exact(&mut magic).is_ok() && magic == ZSTD_MAGIC;
        let size = f.metadata().ok()?.len();
        (!compressed).then_some(size)
    });
    let (bar, template) = match plain_size {
        Some(size) => (
            ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr()),
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{spinner} {pos} records {per_sec}",
        ),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    (bar, plain_size.is_some())
}

pub fn run(args: Args) -> Result<i32, Error> {
    let shown = args.file.display().to_string();
    let pacing = pacing(&args)?;
    let input = Spooled::open(&args.file)?;
    let file = input.path();
    let header = TraceReader::open(file, args.read.options())
        .map_err(|e| e.in_file(&shown))?
        .header()
        .clone();
    let mut config = storage_config(&args, &header.sm_config_json, &shown)?;
    let choice = match args.eviction_phase.as_str() {
        "auto" => PhaseChoice::Estimate,
        text => match text.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => PhaseChoice::Fixed(s),
            _ => {
                return Err(Error::usage(format!(
                    "--eviction-phase {text}: expected a non-negative number of seconds or auto"
                )))
            }
        },
    };
    let emulate_sessions = !args.no_session_emulation;
    let phase = settle(
        file,
        args.read.options(),
        &header.sm_config_json,
        &mut config,
        choice,
        emulate_sessions,
    )
    .map_err(|e| e.in_file(&shown))?;
    // The reports land there after the whole replay: find out now that they can.
    let target = Target::Dir(args.output_dir.clone());
    target.check()?;
    let mut jsonl = match &args.jsonl_out {
        Some(p) => Some(JsonlWriter::create(p)?),
        None => None,
    };
    let show_bar = !args.quiet && !args.verbose && std::io::stderr().is_terminal();
    let (bar, by_bytes) = if show_bar {
        progress_bar(file)
    } else {
        (ProgressBar::hidden(), false)
    };
    let mut sm = StorageManager::new(config)?;
    let options = ReplayOptions {
        pacing,
        keep_startup_gap: args.keep_startup_gap,
        read: args.read.options(),
        emulate_sessions,
        fail_fast: args.fail_fast,
        ..ReplayOptions::default()
    };
    let mut out = std::io::stdout().lock();
    let mut io_error = None;
    let mut jsonl_error = None;
    let mut report = replay(file, &mut sm, &options, |event| {
        if event.index % 4096 == 0 {
            bar.set_position(if by_bytes {
                event.record.offset
            } else {
                event.index
            });
        }
        let failed = !matches!(event.outcome, Outcome::Ok { .. });
        if args.verbose {
            let status = if failed { "FAIL" } else { "OK" };
            let line = format!(
                "  [{}]  {status:<4}  {:.3}ms  {}\n",
                event.index, event.latency_ms, event.record.qualname
            );
            if let Err(e) = out.write_all(line.as_bytes()) {
                io_error.get_or_insert(e);
            }
        }
        if let Some(w) = jsonl.as_mut() {
            let (kind, detail) = match event.outcome {
                Outcome::Ok { detail } => ("ok", detail),
                Outcome::Failed { reason } => ("failed", reason),
                Outcome::Skipped { reason } => ("skipped", reason),
            };
            let line = serde_json::json!({
                "qualname": event.record.qualname,
                "latency_ms": event.latency_ms,
                "failed": failed,
                "outcome": kind,
                "detail": detail,
            });
            if let Err(e) = w.write(&line) {
                jsonl_error.get_or_insert(e);
            }
        }
    })?;
    report.eviction_phase = phase;
    bar.finish_and_clear();
    drop(out);
    if let Some(e) = io_error {
        return Err(Error::io("cannot write per-record output", e));
    }
    if let Some(e) = jsonl_error {
        return Err(e);
    }
    if let Some(w) = jsonl {
        w.commit()?;
    }
    for w in &report.warnings {
        warn(&shown, w);
    }
    let formats: [(bool, &dyn Exporter, &str); 3] = [
        (!args.no_csv, &Csv, ""),
        (args.json, &Json, "trace_replay_summary.json"),
        (args.xlsx, &Xlsx, "trace_replay.xlsx"),
    ];
    for (_, exporter, name) in formats.iter().filter(|f| f.0) {
        report::write(&report, *exporter, &target, name)?;
    }
    if !args.quiet {
        print_stdout(&report.terminal())?;
    }
    if report.failed > 0 {
        // Said even with -q: the exit status alone does not tell a full disk from a miss.
        let reasons = report
            .failure_reasons
            .iter()
            .map(|(reason, n)| format!("{n} × {reason}"))
            .collect::<Vec<_>>()
            .join("; ");
        eprintln!(
            "kvtrace: {shown}: {} call(s) failed: {reasons}",
            report.failed
        );
    }
    if let Some(status) = kvtrace::interrupt::exit_status() {
        return Ok(status);
    }
    Ok(
        if report.failed > 0 || (args.expect_fidelity && !report.fidelity.exact()) {
            EXIT_DATA
        } else {
            EXIT_OK
        },
    )
}
