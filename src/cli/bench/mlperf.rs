//! `kvtrace bench --mlperf-option`: MLPerf Storage v3.0's Options, each run its trials
//! (every rank starting each trial together at its own barrier), a pause between Options,
//! and the run summary written once every trial's results are in.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvtrace::bench::mlperf::{
    host_name, rank_dir, Division, MlperfTrial, Param, WorkloadOption, CLOSED_INTER_OPTION_DELAY,
    CLOSED_TRIALS, OPTIONS,
};
use kvtrace::clock::local_stamp;
use kvtrace::error::{short, Error, EXIT_OK};
use kvtrace::report::{json::Json, Target};

use super::{exit_status, print_stdout, run_once, Args};

/// What a CLOSED run lets its user choose: where the files go, how many ranks run.
const CLOSED_MAY_SET: [&str; 9] = [
    "mlperf_option",
    "results_dir",
    "cache_dir",
    "quiet",
    "rank",
    "world_size",
    "run_id",
    "barrier_timeout",
    "barrier_dir",
];

/// Outputs of a single run: an MLPerf run writes one results file per rank and trial.
const NOT_WITH_MLPERF: [&str; 4] = ["output", "xlsx_output", "csv", "suite"];

/// The flag that sets an Option's parameter.
fn flag_of(p: Param) -> &'static str {
    match p {
        Param::Model => "model",
        Param::Users => "num_users",
        Param::Duration => "duration",
        Param::GpuMemGb => "gpu_mem_gb",
        Param::CpuMemGb => "cpu_mem_gb",
        Param::MaxConcurrentAllocs => "max_concurrent_allocs",
        Param::Generation => "generation_mode",
        Param::Seed => "seed",
    }
}

fn shown(id: &str) -> String {
    format!("--{}", id.replace('_', "-"))
}

/// Refuses what the division does not allow, before any work.
fn check(args: &Args, given: &[String]) -> Result<Division, Error> {
    if let Some(id) = given
        .iter()
        .find(|id| NOT_WITH_MLPERF.contains(&id.as_str()))
    {
        return Err(Error::usage(format!(
            "{} with --mlperf-option: each trial's results go to --results-dir as option_<O>/trial_<T>/rank_<N>/kvcache_results_*.json",
            shown(id)
        )));
    }
    if args.otlp.asked() {
        return Err(Error::usage(
            "--mlperf-option runs many trials: export spans from one bench run at a time",
        ));
    }
    if args.prometheus.asked() {
        return Err(Error::usage(
            "--mlperf-option runs many trials: serve live figures from one bench run at a time",
        ));
    }
    if !args.open {
        if let Some(id) = given
            .iter()
            .find(|id| !CLOSED_MAY_SET.contains(&id.as_str()))
        {
            return Err(Error::usage(format!(
                "{}: MLPerf Storage v3.0's CLOSED division fixes it (only --cache-dir, --results-dir, -q and the rank flags may be given); add --open to run an OPEN variant",
                shown(id)
            )));
        }
        return Ok(Division::Closed);
    }
    if args.trials == 0 {
        return Err(Error::usage("--trials 0: expected 1 or more"));
    }
    if !(args.inter_option_delay.is_finite() && (0.0..=86_400.0).contains(&args.inter_option_delay))
    {
        return Err(Error::usage(format!(
            "--inter-option-delay {}: expected seconds from 0 to 86400",
            short(args.inter_option_delay)
        )));
    }
    Ok(Division::Open)
}

/// Sleeps `d` unless a signal asks to stop first; whether it slept through.
fn pause(d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if kvtrace::interrupt::requested().is_some() {
            return false;
        }
        std::thread::sleep(
            until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100)),
        );
    }
    true
}

pub(super) fn run(args: &Args, given: &[String], option: &str) -> Result<i32, Error> {
    let division = check(args, given)?;
    let base = args.setup()?;
    let (trials, delay) = match division {
        Division::Closed => (CLOSED_TRIALS, CLOSED_INTER_OPTION_DELAY),
        Division::Open => (
            args.trials,
            Duration::from_secs_f64(args.inter_option_delay),
        ),
    };
    let options: Vec<&WorkloadOption> = match option {
        "all" => OPTIONS.iter().collect(),
        n => n
            .parse()
            .ok()
            .and_then(WorkloadOption::get)
            .into_iter()
            .collect(),
    };
    let run_datetime = local_stamp();
    let results: PathBuf = match (&args.results_dir, &base.rank) {
        (Some(dir), _) => dir.clone(),
        (None, Some(r)) if r.world_size > 1 => {
            return Err(Error::usage(format!(
                "rank {} of {}: give --results-dir, a directory every rank sees, so the run's results meet there",
                r.rank, r.world_size
            )))
        }
        (None, _) => PathBuf::from(format!("kvcache-results-{run_datetime}")),
    };
    let summary_path = results.join("kvcache_run_summary.json");
    crate::cli::guard(std::iter::empty(), [summary_path.as_path()])?;
    let host = host_name();
    let keep = |p: Param| division == Division::Open && given.iter().any(|g| g == flag_of(p));
    let mut status = EXIT_OK;
    'options: for (i, o) in options.iter().enumerate() {
        if i > 0 {
            eprintln!(
                "kvtrace: {:.0} s before Option {} (MLPerf's pause between Options)",
                delay.as_secs_f64(),
                o.number
            );
            if !pause(delay) {
                break;
            }
        }
        let setup = o.apply(&base, keep);
        for trial in 1..=trials {
            let dir = rank_dir(&results, o.number, trial, base.rank.as_ref());
            kvtrace::output::create_dir(&dir)?;
            eprintln!(
                "kvtrace: MLPerf Storage v3.0 {} Option {} ({}), trial {trial} of {trials}: {} users of {} for {:.0} s",
                match division {
                    Division::Closed => "CLOSED",
                    Division::Open => "OPEN",
                },
                o.number,
                o.name,
                setup.users,
                setup.model.name,
                setup.duration.as_secs_f64()
            );
            let mut trial_setup = setup.clone();
            trial_setup.output = Some(dir.join(format!("kvcache_results_{}.json", local_stamp())));
            trial_setup.mlperf = Some(MlperfTrial {
                division,
                option: o.number,
                trial,
                host: host.clone(),
            });
            let barrier = match &base.rank {
                Some(r) => args.ranks.barrier_under(
                    r,
                    &results,
                    &Path::new(&format!("option_{}", o.number)).join(format!("trial_{trial}")),
                )?,
                None => None,
            };
            let (report, _) = run_once(&trial_setup, args.quiet, barrier.as_ref(), None)?;
            status = status.max(exit_status(&report));
            if kvtrace::interrupt::requested().is_some() {
                break 'options;
            }
        }
    }
    if kvtrace::interrupt::requested().is_some() {
        return Ok(status);
    }
    // Every rank's last results are written once every rank has passed this barrier.
    if let Some(r) = &base.rank {
        if let Some(done) = args.ranks.barrier_under(r, &results, Path::new("done"))? {
            done.wait()?;
        }
        if r.rank != 0 {
            return Ok(status);
        }
    }
    let summary = kvtrace::aggregate::mlperf::summarize(&results, &run_datetime)?;
    kvtrace::report::write(&summary, &Json, &Target::File(summary_path.clone()), "")?;
    if !args.quiet {
        print_stdout(&format!(
            "{}  summary: {}\n",
            kvtrace::report::Report::terminal(&summary),
            summary_path.display()
        ))?;
    }
    Ok(status)
}
