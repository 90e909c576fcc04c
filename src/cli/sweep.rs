//! `kvtrace sweep replay|simulate`: every flag of `replay` (or `simulate`) takes a list, and
//! every combination runs. Each point's flags are parsed by the single command's own parser,
//! so a point is exactly the single run with those flags; the library runs them in parallel
//! and reports.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::builder::PossibleValue;
use clap::{Arg, ArgAction, ArgMatches, Command, FromArgMatches, Parser, Subcommand};
use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::rank::{Given, Rank};
use kvtrace::report::{csv::Csv, json::Json, svg::Svg, xlsx::Xlsx, Exporter, Report, Target};
use kvtrace::storage::config::BackendConfig;
use kvtrace::sweep::{self, Axis, Point};

use super::progress::Progress;
use super::{one_line, print_stdout, replay, simulate, warn, warn_line, OutputArg};

/// A sweep of `replay` or of `simulate`. Registered by name in the commands' list, its flags
/// built only when a run names it (as `super::Command`'s are); each variant's description is
/// therefore on the variant.
#[derive(Subcommand)]
#[command(defer = true)]
pub(super) enum Kind {
    /// Replay one storage trace under every combination of the listed replay flags
    Replay(ReplaySweep),
    /// Simulate serving one request trace under every combination of the listed simulate flags
    Simulate(SimulateSweep),
}

// What a sweep writes, and how it runs. (A plain comment: a doc comment here would become
// the about of both sweeps, which flatten it.)
#[derive(clap::Args)]
#[command(next_help_heading = "Sweep")]
struct SweepArgs {
    /// Named configurations from a TOML file ([[point]] tables of flag = value) instead of
    /// the cross product of the lists
    #[arg(long, value_name = "FILE")]
    grid: Option<PathBuf>,
    /// Run more points than the cap (a typo in a list can ask for millions)
    #[arg(long, value_name = "N", default_value_t = sweep::DEFAULT_MAX_POINTS)]
    max_points: u64,
    /// Points run at once [default: the machine's cores]
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Workbook: a Points sheet, a sheet per family of figures and native charts
    /// [default: sweep.xlsx]
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    xlsx: Option<OutputArg>,
    /// One CSV file per table into DIR [default: the current directory]
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    csv: Option<OutputArg>,
    /// One Parquet file per CSV table into DIR [default: the current directory]
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    parquet: Option<OutputArg>,
    /// The whole sweep as JSON, each point with its full report [default: sweep.json]
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse)]
    json: Option<OutputArg>,
    /// The main chart as an SVG picture
    #[arg(long, value_name = "PATH.svg")]
    plot: Option<PathBuf>,
    /// No table and no progress bar
    #[arg(short, long)]
    quiet: bool,
}

#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "kvtrace sweep replay trace.lct --l1-size-gb 0.5,1,2,4,8 --eviction-policy LRU,ARC,LFU,FIFO --xlsx=sweep.xlsx --plot curve.svg",
    "kvtrace sweep replay trace.lct --l1-size-gb 1 --l2-adapter 'none,{\"type\":\"memory\",\"capacity_gb\":8}'",
    "kvtrace sweep replay trace.lct --grid configs.toml --json=sweep.json",
]) + "\nEvery `kvtrace replay` flag but its outputs takes a list; a switch takes true,false; a \
repeatable flag takes none for not given. Points keep L1 sizes only (the counters are those of real \
buffers) unless --l1-buffers is given. Exit status 1 if any point's calls failed.")]
pub(super) struct ReplaySweep {
    /// Storage trace (.lct or .lct.zst; a file, as it is read once per point)
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Give every point real L1 buffers (memory for every point running at once)
    #[arg(long, help_heading = "Sweep")]
    l1_buffers: bool,
    /// This process's rank in a sweep spread over ranks (it replays every world-size-th point
    /// from its rank on and writes them as its slice of --json); without it, the launcher's
    /// (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, JOB_COMPLETION_INDEX)
    #[arg(long, value_name = "N", help_heading = "Sweep over ranks")]
    rank: Option<u32>,
    /// How many ranks share the sweep; without it, the launcher's
    #[arg(long, value_name = "N", help_heading = "Sweep over ranks")]
    world_size: Option<u32>,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    lists: Lists<ReplayFlags>,
}

#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "kvtrace sweep simulate trace.jsonl --num-workers 2,4,8 --router-mode round_robin,kv_router --sla ttft_p90_ms=500,itl_p90_ms=30 --xlsx=sweep.xlsx",
    "kvtrace sweep simulate --input-tokens 4000 --output-tokens 200 --request-count 200 --request-rate 5,10,20",
]) + "\nEvery `kvtrace simulate` flag but its outputs, --replay-mode and --record takes a list; \
points run offline (virtual time, deterministic).")]
pub(super) struct SimulateSweep {
    /// Mooncake-style JSONL request trace (or give the synthetic workload flags)
    trace: Option<PathBuf>,
    /// Which points meet a service-level target: metric=limit pairs, a latency (…_ms) at
    /// most its limit, a rate at least its limit (ttft_p90_ms=500,itl_p90_ms=30)
    #[arg(long, value_name = "LIST", help_heading = "Sweep")]
    sla: Option<String>,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    lists: Lists<SimulateFlags>,
}

/// The single command whose flags a sweep takes as lists.
pub(super) trait Single {
    /// Its flags.
    fn command() -> Command;
    /// Flags a sweep does not take (its own outputs replace them).
    const LEFT_OUT: &'static [&'static str];
    /// The help heading of the flags taken.
    const HEADING: &'static str = "Swept flags (each takes a comma-separated list)";
}

struct ReplayFlags;
struct SimulateFlags;

/// The flags of `replay` as `kvtrace plan` takes them: one value each, the L1 size left to
/// the planner.
pub(super) struct PlanFlags;

/// The replay flags no sweep or plan takes: their outputs replace them.
const REPLAY_LEFT_OUT: [&str; 17] = [
    "output-dir",
    "json",
    "no-csv",
    "xlsx",
    "parquet",
    "prometheus-port",
    "prometheus-host",
    "prometheus-hold",
    "jsonl-out",
    "verbose",
    "quiet",
    "shard",
    "rank",
    "world-size",
    "run-id",
    "barrier-timeout",
    "barrier-dir",
];

impl Single for PlanFlags {
    fn command() -> Command {
        <OneReplay as clap::CommandFactory>::command()
    }
    const LEFT_OUT: &'static [&'static str] = &{
        let mut out = [""; 18];
        let mut i = 0;
        while i < REPLAY_LEFT_OUT.len() {
            out[i] = REPLAY_LEFT_OUT[i];
            i += 1;
        }
        out[17] = "l1-size-gb";
        out
    };
    const HEADING: &'static str = "Replay flags (the configuration every replay runs)";
}

#[derive(Parser)]
#[command(name = "kvtrace replay")]
pub(super) struct OneReplay {
    #[command(flatten)]
    pub(super) args: replay::Args,
}

#[derive(Parser)]
#[command(name = "kvtrace simulate")]
struct OneSimulate {
    #[command(flatten)]
    args: simulate::Args,
}

impl Single for ReplayFlags {
    fn command() -> Command {
        <OneReplay as clap::CommandFactory>::command()
    }
    const LEFT_OUT: &'static [&'static str] = &REPLAY_LEFT_OUT;
}

impl Single for SimulateFlags {
    fn command() -> Command {
        <OneSimulate as clap::CommandFactory>::command()
    }
    const LEFT_OUT: &'static [&'static str] = &[
        "report-json",
        "report-jsonl",
        "report-csv",
        "report-xlsx",
        "quiet",
        "record",
        "replay-mode",
        "prometheus-port",
        "prometheus-host",
        "prometheus-hold",
    ];
}

/// The lists given for a single command's flags, in the order given.
pub(super) struct Lists<S> {
    pub(super) axes: Vec<Axis>,
    _single: std::marker::PhantomData<S>,
}

/// How a single command's flag is given on its command line.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// `--flag value`.
    Value,
    /// `--flag` alone: a sweep takes `true`/`false`.
    Switch,
    /// `--flag value`, repeatable: a sweep takes `none` for "not given".
    Repeatable,
}

/// The single command's flags a sweep mirrors: `(long name, shape)`.
fn mirrored<S: Single>() -> Vec<(Arg, String, Shape)> {
    S::command()
        .get_arguments()
        .filter(|a| !a.is_positional())
        .filter_map(|a| {
            let long = a.get_long()?.to_owned();
            let shape = match a.get_action() {
                ArgAction::SetTrue => Shape::Switch,
                ArgAction::Append => Shape::Repeatable,
                ArgAction::Set => Shape::Value,
                _ => return None,
            };
            (!S::LEFT_OUT.contains(&long.as_str())).then(|| (a.clone(), long, shape))
        })
        .collect()
}

impl<S: Single> clap::Args for Lists<S> {
    fn augment_args(cmd: Command) -> Command {
        let mut cmd = cmd.next_help_heading(S::HEADING);
        for (arg, long, shape) in mirrored::<S>() {
            let mut help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let mut list = Arg::new(format!("list-{long}"))
                .long(long)
                .value_name("LIST")
                .action(ArgAction::Set)
                .allow_hyphen_values(true);
            if shape == Shape::Switch {
                list = list
                    .num_args(0..=1)
                    .default_missing_value("true")
                    .value_name("true,false");
            }
            let values: Vec<PossibleValue> = arg.get_possible_values();
            if shape != Shape::Switch && !values.is_empty() {
                let names: Vec<&str> = values.iter().map(PossibleValue::get_name).collect();
                help = format!("{help} [{}]", names.join(", "));
            }
            cmd = cmd.arg(list.help(help));
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<S: Single> FromArgMatches for Lists<S> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for (_, long, shape) in mirrored::<S>() {
            let id = format!("list-{long}");
            let (Some(text), Some(at)) = (m.get_one::<String>(&id), m.index_of(&id)) else {
                continue;
            };
            let axis = Axis::parse(&long, text)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?;
            if shape == Shape::Switch {
                if let Some(v) = axis.values.iter().find(|v| *v != "true" && *v != "false") {
                    return Err(clap::Error::raw(
                        clap::error::ErrorKind::InvalidValue,
                        format!("--{long} {v}: a switch takes true or false"),
                    ));
                }
            }
            given.push((at, axis));
        }
        given.sort_by_key(|(at, _)| *at);
        Ok(Lists {
            axes: given.into_iter().map(|(_, a)| a).collect(),
            _single: std::marker::PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// The single command line of one point: `head` (the program and its positional), then each
/// setting as `--flag=value` (so a value may start with a dash), a switch only when true, a
/// repeatable flag not at all for `none`.
pub(super) fn point_argv<S: Single>(
    head: &[OsString],
    point: &Point,
) -> Result<Vec<OsString>, Error> {
    let shapes = mirrored::<S>();
    let mut argv = head.to_vec();
    for (flag, value) in &point.settings {
        let Some((_, _, shape)) = shapes.iter().find(|(_, long, _)| long == flag) else {
            return Err(Error::usage(format!(
                "point {:?}: --{flag}: not a flag a sweep takes",
                point.name
            )));
        };
        match (shape, value.as_str()) {
            (Shape::Switch, "true") => argv.push(format!("--{flag}").into()),
            (Shape::Switch, "false") | (Shape::Repeatable, "none") => {}
            (Shape::Switch, other) => {
                return Err(Error::usage(format!(
                    "point {:?}: --{flag} {other}: a switch takes true or false",
                    point.name
                )))
            }
            _ => argv.push(format!("--{flag}={value}").into()),
        }
    }
    Ok(argv)
}

/// Parses a point's command line with the single command's parser: its errors, one line.
pub(super) fn parse_point<P: Parser>(argv: Vec<OsString>, point: &Point) -> Result<P, Error> {
    P::try_parse_from(argv).map_err(|e| {
        let text = one_line(&e.to_string());
        let text = text.strip_prefix("error: ").unwrap_or(&text).to_owned();
        Error::usage(format!("point {:?}: {text}", point.name))
    })
}

/// The points: the grid's, each with the lists' values as defaults, or the cross product.
fn points(sweep: &SweepArgs, axes: &[Axis]) -> Result<Vec<Point>, Error> {
    let Some(grid) = &sweep.grid else {
        sweep::check_count(sweep::cross_count(axes), sweep.max_points)?;
        return Ok(sweep::cross(axes));
    };
    if let Some(a) = axes.iter().find(|a| a.values.len() > 1) {
        return Err(Error::usage(format!(
            "--{} takes one value with --grid (the grid names the configurations)",
            a.flag
        )));
    }
    let mut points = sweep::grid(grid, sweep.max_points)?;
    for p in &mut points {
        for a in axes {
            if p.get(&a.flag).is_none() {
                p.settings.insert(0, (a.flag.clone(), a.values[0].clone()));
            }
        }
    }
    Ok(points)
}

/// The outputs asked for, each checked before any point runs, none of them one of `inputs`.
fn outputs(
    sweep: &SweepArgs,
    inputs: &[&Path],
) -> Result<Vec<(&'static dyn Exporter, Target)>, Error> {
    let inputs: Vec<&Path> = inputs
        .iter()
        .copied()
        .chain(sweep.grid.as_deref())
        .collect();
    let asked = Asked {
        json: sweep.json.as_ref().map(|o| o.path(|| "sweep.json".into())),
        xlsx: sweep.xlsx.as_ref().map(|o| o.path(|| "sweep.xlsx".into())),
        csv: sweep.csv.as_ref().map(|o| o.path(|| ".".into())),
        parquet: sweep.parquet.as_ref().map(|o| o.path(|| ".".into())),
        plot: sweep.plot.clone(),
    };
    asked.outputs(&inputs)
}

/// The report files a many-replay command (`sweep`, `plan`) was asked for, defaults resolved.
pub(super) struct Asked {
    pub(super) json: Option<PathBuf>,
    pub(super) xlsx: Option<PathBuf>,
    /// The directories of the CSV and Parquet tables.
    pub(super) csv: Option<PathBuf>,
    pub(super) parquet: Option<PathBuf>,
    pub(super) plot: Option<PathBuf>,
}

impl Asked {
    /// The exporters and targets, each checked before any replay runs, none of them one of
    /// `inputs`; the picture must be SVG.
    pub(super) fn outputs(
        self,
        inputs: &[&Path],
    ) -> Result<Vec<(&'static dyn Exporter, Target)>, Error> {
        crate::cli::guard(
            inputs.iter().copied(),
            [&self.xlsx, &self.csv, &self.json, &self.parquet, &self.plot]
                .into_iter()
                .flatten()
                .map(PathBuf::as_path),
        )?;
        if let Some(p) = &self.plot {
            if p.extension().and_then(|e| e.to_str()) != Some("svg") {
                return Err(Error::usage(format!(
                    "--plot {}: kvtrace draws SVG; name the file .svg",
                    p.display()
                )));
            }
        }
        kvtrace::report::outputs([
            (&Xlsx, self.xlsx.map(Target::File)),
            (&Csv, self.csv.map(Target::Dir)),
            (&Json, self.json.map(Target::File)),
            (&Svg, self.plot.map(Target::File)),
            crate::cli::parquet_output(self.parquet)?,
        ])
    }
}

/// Writes the outputs and, unless quiet, prints the table.
fn finish(
    report: &dyn Report,
    outputs: &[(&'static dyn Exporter, Target)],
    quiet: bool,
) -> Result<(), Error> {
    for (exporter, target) in outputs {
        if matches!(target, Target::File(p) if p.extension().is_some_and(|e| e == "svg"))
            && report.charts().is_empty()
        {
            warn_line("--plot: no chart to draw (no flag with numeric values varies)");
            continue;
        }
        kvtrace::report::write(report, *exporter, target, "")?;
    }
    if !quiet {
        print_stdout(&report.terminal())?;
    }
    if kvtrace::interrupt::requested().is_some() {
        warn_line("interrupted: the outputs hold only the points that finished before the signal (the JSON says \"interrupted\": true)");
    }
    Ok(())
}

/// Replays at once: `--jobs`, or one per core.
pub(super) fn jobs(given: Option<usize>) -> Result<usize, Error> {
    match given {
        Some(0) => Err(Error::usage("--jobs must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

fn run_replay(a: ReplaySweep) -> Result<i32, Error> {
    let points = points(&a.sweep, &a.lists.axes)?;
    let head: Vec<OsString> = vec!["kvtrace replay".into(), a.file.clone().into()];
    let mut parsed = Vec::with_capacity(points.len());
    // Which points have a file, Redis or S3 tier, whose directory or keys points at once
    // would share.
    let mut externals = Vec::with_capacity(points.len());
    for p in &points {
        let mut argv = point_argv::<ReplayFlags>(&head, p)?;
        if !a.l1_buffers && p.get("l1-accounting-only").is_none() {
            argv.push("--l1-accounting-only".into());
        }
        let one: OneReplay = parse_point(argv, p)?;
        let config = replay::check(&one.args)
            .map_err(|e| Error::usage(format!("point {:?}: {e}", p.name)))?;
        externals.push(config.l2.iter().any(|t| {
            matches!(
                t.backend,
                BackendConfig::File { .. }
                    | BackendConfig::Redis { .. }
                    | BackendConfig::RespCluster { .. }
                    | BackendConfig::S3(_)
            )
        }));
        parsed.push(one.args);
    }
    let external = externals.contains(&true);
    let given = Given {
        rank: a.rank,
        world_size: a.world_size,
        rank_name: "--rank",
        world_size_name: "--world-size",
    };
    let rank = Rank::detect(&given, |name| std::env::var(name).ok())?;
    if let Some(rank) = rank.filter(|r| r.world_size > 1) {
        return run_replay_slice(&a, &points, parsed, &externals, &rank);
    }
    let mut jobs = jobs(a.sweep.jobs)?;
    if external && jobs > 1 {
        // Points at once would share the tier's directory or keys: one's eviction would
        // delete another's object.
        warn_line("points with a file, Redis or S3 tier run one at a time (--jobs 1)");
        jobs = 1;
    }
    let outputs = outputs(&a.sweep, &[a.file.as_path()])?;
    for point in &parsed {
        replay::guard(point)?;
    }
    let read = replay::read_options(&parsed[0]);
    if replay::is_events(&a.file, &parsed[0]) {
        let bar = Progress::points(points.len() as u64, !a.sweep.quiet);
        let config = |i: usize, recorded: &str| replay::events_config(&parsed[i], recorded);
        let result =
            sweep::replay::sweep_events(&a.file, &points, jobs, read, &config, &|_| bar.inc());
        bar.finish();
        let report = result?;
        for w in &report.warnings {
            warn(&a.file.display().to_string(), w);
        }
        finish(&report, &outputs, a.sweep.quiet)?;
        return Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK));
    }
    let sizes: std::collections::BTreeSet<&str> =
        points.iter().filter_map(|p| p.get("l1-size-gb")).collect();
    let bar = Progress::points(points.len() as u64, !a.sweep.quiet);
    let plan = |i: usize, loaded| replay::plan(&parsed[i], false, None, loaded);
    // The model curves: each line's flags (a point's, less the L1 size) at many L1 sizes.
    // Not with a file or Redis tier, whose objects one replay would leave for the next.
    let curve_plan = |first: usize, gib: f64, phase: Option<f64>, loaded| {
        let mut point = points[first].clone();
        point.name = format!("model curve at {gib} GiB");
        point.settings.retain(|(flag, _)| flag != "l1-size-gb");
        point.settings.push(("l1-size-gb".into(), format!("{gib}")));
        if let Some(phase) = phase.filter(|_| point.get("eviction-phase").is_none()) {
            point
                .settings
                .push(("eviction-phase".into(), format!("{phase}")));
        }
        let mut argv = point_argv::<ReplayFlags>(&head, &point)?;
        if !a.l1_buffers && point.get("l1-accounting-only").is_none() {
            argv.push("--l1-accounting-only".into());
        }
        let one: OneReplay = parse_point(argv, &point)?;
        replay::plan(&one.args, false, None, loaded)
    };
    let mut lines: Vec<sweep::replay::Line> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let others: Vec<String> = p
            .settings
            .iter()
            .filter(|(flag, _)| flag != "l1-size-gb")
            .map(|(flag, value)| format!("{flag}={value}"))
            .collect();
        let name = if others.is_empty() {
            "the points' flags".to_string()
        } else {
            others.join(", ")
        };
        match lines.iter_mut().find(|line| line.name == name) {
            Some(line) => line.points.push(i),
            None => lines.push(sweep::replay::Line {
                name,
                points: vec![i],
            }),
        }
    }
    let model = (sizes.len() > 1 && !external).then_some(sweep::replay::CurvePlan {
        lines,
        plan: &curve_plan,
    });
    let result = sweep::replay::sweep(
        &a.file,
        &points,
        jobs,
        sizes.len() > 1,
        model,
        read,
        &plan,
        &|_| bar.inc(),
    );
    bar.finish();
    let report = result?;
    for w in &report.warnings {
        warn(&a.file.display().to_string(), w);
    }
    finish(&report, &outputs, a.sweep.quiet)?;
    let failed: Vec<String> = report
        .points
        .iter()
        .filter(|p| p.figures.failed > 0)
        .map(|p| {
            let reasons: std::collections::BTreeMap<String, u64> =
                serde_json::from_value(p.summary["failure_reasons"].clone()).unwrap_or_default();
            format!(
                "{} ({})",
                p.point.name,
                kvtrace::report::reasons::failure_summary(&reasons)
            )
        })
        .collect();
    if !failed.is_empty() {
        eprintln!("kvtrace: calls failed in point(s): {}", failed.join("; "));
    }
    if let Some(status) = kvtrace::interrupt::exit_status() {
        return Ok(status);
    }
    Ok(if failed.is_empty() {
        EXIT_OK
    } else {
        EXIT_DATA
    })
}

/// Rank `rank`'s share of a replay sweep: its points, replayed as a sweep of its own without
/// curves, written as its slice of the JSON output (`sweep.json` becomes
/// `sweep.rank-00002.json`) for `kvtrace aggregate` to merge.
fn run_replay_slice(
    a: &ReplaySweep,
    points: &[Point],
    parsed: Vec<replay::Args>,
    externals: &[bool],
    rank: &Rank,
) -> Result<i32, Error> {
    let sw = &a.sweep;
    if sw.xlsx.is_some() || sw.csv.is_some() || sw.parquet.is_some() || sw.plot.is_some() {
        return Err(Error::usage(format!(
            "rank {} of {} ({}): a sweep over ranks writes each rank's slice as JSON (--json); kvtrace aggregate merges the slices into the workbook, tables and JSON",
            rank.rank, rank.world_size, rank.source
        )));
    }
    let json = rank.file_name(
        &sw.json
            .as_ref()
            .map_or_else(|| "sweep.json".into(), |o| o.path(|| "sweep.json".into())),
    );
    crate::cli::guard([a.file.as_path()], [json.as_path()])?;
    let outputs = kvtrace::report::outputs([(&Json as &dyn Exporter, Some(Target::File(json)))])?;
    let mine = sweep::ranks::points_of(rank.rank, rank.world_size, points.len());
    let my_points: Vec<Point> = mine.iter().map(|&i| points[i].clone()).collect();
    let mut parsed: Vec<Option<replay::Args>> = parsed.into_iter().map(Some).collect();
    let my_args: Vec<replay::Args> = mine.iter().filter_map(|&i| parsed[i].take()).collect();
    let jobs = match mine.iter().any(|&i| externals[i]) {
        true => 1,
        false => jobs(sw.jobs)?,
    };
    let read = replay::read_options(&my_args[0]);
    let bar = Progress::points(my_points.len() as u64, !sw.quiet);
    let plan = |i: usize, loaded| replay::plan(&my_args[i], false, None, loaded);
    let result = sweep::replay::sweep(&a.file, &my_points, jobs, false, None, read, &plan, &|_| {
        bar.inc()
    });
    bar.finish();
    let result = result?;
    for w in &result.warnings {
        warn(&a.file.display().to_string(), w);
    }
    let slice = sweep::ranks::Slice::of(&result, &mine, rank.rank, rank.world_size, points.len());
    finish(&slice, &outputs, sw.quiet)?;
    if let Some(status) = kvtrace::interrupt::exit_status() {
        return Ok(status);
    }
    let failed = slice.points.iter().any(|p| p.figures.failed > 0);
    Ok(if failed { EXIT_DATA } else { EXIT_OK })
}

fn run_simulate(a: SimulateSweep) -> Result<i32, Error> {
    let points = points(&a.sweep, &a.lists.axes)?;
    let mut head: Vec<OsString> = vec!["kvtrace simulate".into()];
    head.extend(a.trace.iter().map(|t| t.clone().into_os_string()));
    let mut options = Vec::with_capacity(points.len());
    for p in &points {
        let one: OneSimulate = parse_point(point_argv::<SimulateFlags>(&head, p)?, p)?;
        let mut o = one
            .args
            .options()
            .map_err(|e| Error::usage(format!("point {:?}: {e}", p.name)))?;
        o.write_reports = false;
        options.push(o);
    }
    let outputs = outputs(
        &a.sweep,
        &a.trace.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
    )?;
    let bar = Progress::points(points.len() as u64, !a.sweep.quiet);
    let plan = |i: usize| simulate::plan::plan(&options[i]);
    let shown = a.trace.as_deref().map_or_else(
        || "synthetic workload".to_string(),
        |t| t.display().to_string(),
    );
    let result = sweep::simulate::sweep(
        &shown,
        &points,
        jobs(a.sweep.jobs)?,
        a.sla.as_deref(),
        &plan,
        &|_| bar.inc(),
    );
    bar.finish();
    finish(&result?, &outputs, a.sweep.quiet)?;
    Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
}

pub(super) fn run(kind: Kind) -> Result<i32, Error> {
    match kind {
        Kind::Replay(a) => run_replay(a),
        Kind::Simulate(a) => run_simulate(a),
    }
}
