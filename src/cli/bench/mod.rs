//! `kvtrace bench`: MLPerf Storage's KV-cache benchmark. [`args`] turns its flags into
//! [`kvtrace::bench::plan::Setup`]; the library plans, runs and reports; this file shows
//! progress and picks the exit status.

mod args;
mod mlperf;

use std::io::IsTerminal;

use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::bench::plan::{Plan, Setup};
use kvtrace::bench::report::BenchReport;
use kvtrace::bench::suite::{Suite, SCENARIOS};
use kvtrace::bench::tiers::TierCounters;
use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::rank::barrier::Barrier;
use kvtrace::storage::TierStats;

pub(super) use args::Args;

use super::otlp::{self, OtlpArgs};
use super::prometheus::{span_sink, PrometheusArgs};
use super::{print_stdout, say_recorded, warn_line};

fn progress_bar(quiet: bool, duration_s: f64) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(
        Some((duration_s * 10.0) as u64),
        ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {msg}") {
        bar.set_style(style);
    }
    bar
}

/// Fewer completed requests than this and the run's p99 is one of its slowest few requests:
/// the percentiles, and the pass/fail assessment built on them, say little.
const FEW_REQUESTS: usize = 100;

/// Plans and runs once; prints the summary unless quiet. With a barrier, the run starts
/// once every rank has set up its tiers.
/// One run, its requests exported as spans when `otlp` asks; the report, and the exit status
/// the export calls for (1 when it failed).
fn run_once(
    setup: &Setup,
    quiet: bool,
    barrier: Option<&Barrier>,
    observe: Option<(&OtlpArgs, &PrometheusArgs)>,
) -> Result<(BenchReport, Option<i32>), Error> {
    let mut plan = Plan::new(setup)?;
    for w in &plan.warnings {
        warn_line(w);
    }
    let export = match observe {
        Some((otlp, _)) => otlp.start(plan.span_resource())?,
        None => None,
    };
    let served = match observe {
        Some((_, prometheus)) => {
            let rank = setup.rank.as_ref();
            prometheus.start("bench", "", rank)?
        }
        None => None,
    };
    if let Some(sink) = span_sink(served.as_ref(), export.clone().map(|e| e as _)) {
        plan.export_spans(sink);
    }
    if let Some(b) = barrier {
        b.wait()?;
    }
    let duration = plan.duration_s();
    let bar = progress_bar(quiet, duration);
    let mut tiers_read = 0.0;
    let finished = plan.run(&mut |elapsed, done, cache| {
        bar.set_position((elapsed * 10.0) as u64);
        bar.set_message(format!("{elapsed:.0}/{duration:.0} s, {done} requests"));
        if let Some(served) = &served {
            served.live.progress(elapsed / duration);
            // Once a second: reading the counters takes the hierarchy's lock.
            if elapsed - tiers_read >= 1.0 {
                tiers_read = elapsed;
                let counters = cache.counters();
                let tiers = counters.iter().map(|(kind, c)| (kind.name(), c));
                served.live.storage(&tier_stats(tiers), &Default::default());
            }
        }
    })?;
    bar.finish_and_clear();
    let completed = finished.report.requests_completed;
    if completed < FEW_REQUESTS {
        warn_line(&format!(
            "only {completed} request(s) completed in {duration:.0} s: the p95/p99 latencies and the assessment rest on too few samples (a p99 needs {FEW_REQUESTS}); run longer or with more users"
        ));
    }
    let exported = otlp::finish(export, quiet);
    if let Some(served) = served {
        let tiers = finished.report.kvtrace.tiers.iter();
        let stats = tier_stats(tiers.map(|t| (t.tier, &t.counters)));
        served.live.storage(&stats, &Default::default());
        served.finish(quiet);
    }
    if !quiet {
        say_recorded(&finished.recordings);
        print_stdout(&format!(
            "{}  results: {}\n",
            finished.report.console(),
            finished.results.display()
        ))?;
    }
    Ok((finished.report, exported))
}

/// `given`: the ids of the flags the user set (an MLPerf run checks them against its
/// division).
pub(super) fn run(args: Args, given: &[String]) -> Result<i32, Error> {
    args.guard()?;
    if let Some(option) = &args.mlperf_option {
        return mlperf::run(&args, given, option);
    }
    let setup = args.setup()?;
    if args.suite {
        if args.otlp.asked() || args.prometheus.asked() {
            return Err(Error::usage(
                "--suite runs many scenarios: export spans or serve live figures from one bench run at a time",
            ));
        }
        if let Some(r) = &setup.rank {
            return Err(Error::usage(format!(
                "--suite runs its scenarios one after another; as rank {} of {} ({}) run one bench per rank",
                r.rank, r.world_size, r.source
            )));
        }
        return suite(&setup);
    }
    let barrier = match &setup.rank {
        Some(r) => {
            let dir = setup
                .output
                .as_deref()
                .and_then(Path::parent)
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            args.ranks.barrier(r, dir)?
        }
        None => None,
    };
    let (report, exported) = run_once(
        &setup,
        args.quiet,
        barrier.as_ref(),
        Some((&args.otlp, &args.prometheus)),
    )?;
    Ok(exit_status(&report).max(exported.unwrap_or(EXIT_OK)))
}

/// The bench's tiers as the live figures show a replay's: an entry moved down or deleted to
/// make room is an eviction, a failed move or refused queued write an error.
fn tier_stats<'a>(tiers: impl IntoIterator<Item = (&'a str, &'a TierCounters)>) -> Vec<TierStats> {
    tiers
        .into_iter()
        .map(|(name, c)| TierStats {
            name: name.to_owned(),
            resident_bytes: c.used_bytes,
            resident_objects: c.entries,
            peak_bytes: c.peak_bytes,
            bytes_written: c.bytes_written,
            bytes_read: c.bytes_read,
            writes: c.writes,
            reads: c.reads,
            evictions: c.demotions + c.deletions,
            write_errors: c.move_errors + c.queued_write_errors,
            cross_rank_hits: c.cross_rank_hits,
            ..TierStats::default()
        })
        .collect()
}

/// 128 + the signal after an interrupt; 1 when storage I/O failed (said on stderr even with
/// -q: the figures of such a run are not the storage's); else 0.
fn exit_status(report: &BenchReport) -> i32 {
    if let Some(status) = kvtrace::interrupt::exit_status() {
        return status;
    }
    match report.storage_failure() {
        Some(line) => {
            eprintln!("kvtrace: {line}");
            EXIT_DATA
        }
        None => EXIT_OK,
    }
}

/// `--suite`: every scenario in turn, one comparison table.
fn suite(setup: &Setup) -> Result<i32, Error> {
    let suite = Suite::create(setup)?;
    eprintln!("kvtrace: {}", suite.describe());
    let mut table = Suite::header().to_string();
    let mut status = EXIT_OK;
    for scenario in &SCENARIOS {
        eprintln!("kvtrace: {}: {}", scenario.name, scenario.what);
        let (report, _) = run_once(&suite.setup(scenario), true, None, None)?;
        table += &Suite::row(scenario.name, &report);
        status = status.max(exit_status(&report));
        if kvtrace::interrupt::requested().is_some() {
            break;
        }
    }
    print_stdout(&table)?;
    Ok(status)
}
