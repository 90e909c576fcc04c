//! `kvtrace aggregate`.

use std::path::PathBuf;

use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::report::{csv::Csv, json::Json, xlsx::Xlsx, Exporter, Report, Target};
use kvtrace::sweep::ranks::{merge, Slice};

use super::{print_stdout, OutputArg};

#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "mpirun -np 4 kvtrace replay trace.lct --json --output-dir run1 --l2-adapter '{\"type\":\"resp-cluster\",\"nodes\":[\"redis://10.0.0.5:7000\"]}'",
    "kvtrace aggregate run1/rank-* --json=run1/aggregate.json --xlsx=run1/aggregate.xlsx",
    "kvtrace aggregate bench.rank-*.json --csv=bench-aggregate",
    "kvtrace aggregate kvcache-results-20261125_101500",
    "mpirun -np 8 kvtrace sweep replay trace.lct --l1-size-gb 1,2,4,8 --eviction-policy LRU,ARC --json=sweep.json",
    "kvtrace aggregate sweep.rank-*.json --xlsx=sweep.xlsx --json=sweep.json",
]))]
pub(super) struct Args {
    /// Each rank's trace_replay_summary.json (or the rank directory holding it), or each
    /// rank's bench results JSON; or the results directory of `bench --mlperf-option`
    /// (option_<O>/trial_<T>/rank_<N>/), summarised as MLPerf Storage v3.0 does (sums over
    /// ranks within a trial, means over trials, the worst device P95) into
    /// kvcache_run_summary.json; or every rank's slice of a sweep (sweep.rank-*.json)
    #[arg(value_name = "RANK-OUTPUT", required = true, num_args = 1..)]
    inputs: Vec<PathBuf>,
    /// Write the merged report as JSON [default: aggregate.json]
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    json: Option<OutputArg>,
    /// Write aggregate_{summary,ops,ranks,tiers}.csv into DIR [default: the current directory]
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    csv: Option<OutputArg>,
    /// Write the merged report as a workbook (Summary, Ops, Ranks, Tiers) [default:
    /// aggregate.xlsx]
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    xlsx: Option<OutputArg>,
    /// No terminal summary
    #[arg(short, long)]
    quiet: bool,
}

pub(super) fn run(args: Args) -> Result<i32, Error> {
    if let [dir] = &args.inputs[..] {
        if kvtrace::aggregate::mlperf::is_run_dir(dir) {
            let dir = dir.clone();
            return mlperf_run(&dir, args);
        }
    }
    if let Some(first) = args.inputs.first().filter(|p| p.is_file()) {
        let (file, doc) = kvtrace::aggregate::read_report(first)?;
        if Slice::is_slice(&doc) {
            return sweep_run(args, Some((file, doc)));
        }
    }
    let files: Vec<PathBuf> = args
        .inputs
        .iter()
        .map(|p| {
            if p.is_dir() {
                p.join("trace_replay_summary.json")
            } else {
                p.clone()
            }
        })
        .collect();
    let outputs = outputs(&args, "aggregate", &files)?;
    let paths: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
    let run = match kvtrace::aggregate::aggregate(&paths) {
        Err(e) if kvtrace::interrupt::requested().is_some() => {
            eprintln!("kvtrace: {e}");
            return Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_DATA));
        }
        run => run?,
    };
    for (exporter, target) in &outputs {
        kvtrace::report::write(&run, *exporter, target, "")?;
    }
    if !args.quiet {
        print_stdout(&run.terminal())?;
    }
    Ok(if run.failed() { EXIT_DATA } else { EXIT_OK })
}

/// The results directory of `bench --mlperf-option`: MLPerf's run summary, always written
/// (to `--json=PATH` or `kvcache_run_summary.json` in the directory), its tables on request.
fn mlperf_run(dir: &std::path::Path, args: Args) -> Result<i32, Error> {
    let json = args
        .json
        .and_then(|o| o.given().map(PathBuf::from))
        .unwrap_or_else(|| dir.join("kvcache_run_summary.json"));
    let csv = args.csv.map(|o| o.path(|| ".".into()));
    let xlsx = args
        .xlsx
        .map(|o| o.path(|| "kvcache_run_summary.xlsx".into()));
    crate::cli::guard(
        std::iter::empty(),
        [Some(&json), csv.as_ref(), xlsx.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path),
    )?;
    let outputs = kvtrace::report::outputs([
        (&Json, Some(Target::File(json))),
        (&Csv, csv.map(Target::Dir)),
        (&Xlsx, xlsx.map(Target::File)),
    ])?;
    let summary = kvtrace::aggregate::mlperf::summarize(dir, &kvtrace::clock::local_stamp())?;
    for (exporter, target) in &outputs {
        kvtrace::report::write(&summary, *exporter, target, "")?;
    }
    if !args.quiet {
        print_stdout(&summary.terminal())?;
    }
    Ok(if summary.partial_failure {
        EXIT_DATA
    } else {
        EXIT_OK
    })
}

/// The merged report's outputs, `NAME.json` and `NAME.xlsx` by default, each checked now and
/// none of them one of `inputs`.
fn outputs(
    args: &Args,
    name: &str,
    inputs: &[PathBuf],
) -> Result<Vec<(&'static dyn Exporter, Target)>, Error> {
    let json = args
        .json
        .as_ref()
        .map(|o| o.path(|| format!("{name}.json").into()));
    let csv = args.csv.as_ref().map(|o| o.path(|| ".".into()));
    let xlsx = args
        .xlsx
        .as_ref()
        .map(|o| o.path(|| format!("{name}.xlsx").into()));
    crate::cli::guard(
        inputs.iter().map(PathBuf::as_path),
        [&json, &csv, &xlsx]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path),
    )?;
    kvtrace::report::outputs([
        (&Json, json.map(Target::File)),
        (&Csv, csv.map(Target::Dir)),
        (&Xlsx, xlsx.map(Target::File)),
    ])
}

/// The slices of a sweep spread over ranks (`kvtrace sweep replay` under a launcher), merged
/// into the one sweep: its JSON, tables and workbook. `first` is the first input, read.
fn sweep_run(args: Args, mut first: Option<(String, serde_json::Value)>) -> Result<i32, Error> {
    let outputs = outputs(&args, "sweep", &args.inputs)?;
    let mut slices = Vec::with_capacity(args.inputs.len());
    for path in &args.inputs {
        let (file, doc) = match first.take() {
            Some(read) => read,
            None => kvtrace::aggregate::read_report(path)?,
        };
        if !Slice::is_slice(&doc) {
            return Err(Error::usage(format!(
                "{file}: not a sweep slice, and the first input is one: give one run's slices"
            )));
        }
        let slice = Slice::read(doc, &file)?;
        slices.push((file, slice));
    }
    let sweep = merge(slices)?;
    for (exporter, target) in &outputs {
        kvtrace::report::write(&sweep, *exporter, target, "")?;
    }
    if !args.quiet {
        print_stdout(&sweep.terminal())?;
    }
    let failed = sweep.points.iter().any(|p| p.figures.failed > 0);
    Ok(if failed { EXIT_DATA } else { EXIT_OK })
}
