//! `kvtrace plan`: the capacity planner over the replay engine.

use std::ffi::OsString;
use std::path::PathBuf;

use kvtrace::error::{short, Error, EXIT_OK};
use kvtrace::replay::events::fleet::{summarise, FleetStream, FleetSummary};
use kvtrace::replay::events::{replay_events, server_config};
use kvtrace::report::Report;
use kvtrace::simulate::mooncake::request_span_s;
use kvtrace::sweep::plan::{
    plan, PlanInput, PlanOptions, Question, SizePoint, SizeRun, SurfaceGrid,
};
use kvtrace::sweep::Point;
use kvtrace::trace::mooncake::{self, MooncakeOptions};

use super::progress::Progress;
use super::sweep::{jobs, parse_point, point_argv, Asked, Lists, OneReplay, PlanFlags};
use super::{print_stdout, replay, warn, OutputArg};

#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "kvtrace plan trace.lct --target-hit-rate 0.6",
    "kvtrace plan trace.lct --size-gb 2 --eviction-policy ARC --xlsx=plan.xlsx --plot plan.svg",
    "kvtrace plan trace.lct --target-hit-rate 0.5 --min-gb 0.5 --max-gb 64 --json=plan.json",
    "kvtrace plan trace.lct --size-gb 4 --l2-sizes-gb 0,16,64,256 --xlsx=plan.xlsx --plot plan.svg",
    "kvtrace plan conversation_trace.jsonl --target-hit-rate 0.3 --chunk-mib 64",
]) + "\nEvery replay is `kvtrace replay FILE` with the replay flags given and the L1 size the \
planner picks (its counters, with --l1-accounting-only unless --l1-buffers). The sizes searched \
span from the largest request to past the size beyond which nothing more hits, read off the \
trace's one-pass LRU curve, unless --min-gb and --max-gb say otherwise.")]
pub(super) struct Args {
    /// The LMCT storage trace, or a Mooncake JSONL request trace (planned as the storage
    /// trace `kvtrace generate --from-mooncake` writes for it)
    file: PathBuf,
    /// MiB per chunk of a Mooncake request trace (one chunk per hash_id, 512 tokens): the KV
    /// bytes of 512 tokens of the served model
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u64).range(1..=1 << 20),
          help_heading = "Plan")]
    chunk_mib: Option<u64>,
    /// The hit rate to reach (0 to 1): the answer is the smallest L1 that meets it
    #[arg(
        long,
        value_name = "SHARE",
        required_unless_present = "size_gb",
        conflicts_with = "size_gb",
        help_heading = "Plan"
    )]
    target_hit_rate: Option<f64>,
    /// The L1 size (GiB) to give the hit rate of
    #[arg(long, value_name = "GB", help_heading = "Plan")]
    size_gb: Option<f64>,
    /// The smallest size (GiB) to search
    #[arg(long, value_name = "GB", requires = "max_gb", help_heading = "Plan")]
    min_gb: Option<f64>,
    /// The largest size (GiB) to search
    #[arg(long, value_name = "GB", requires = "min_gb", help_heading = "Plan")]
    max_gb: Option<f64>,
    /// Sizes of the first, log-spaced grid
    #[arg(long, value_name = "N", default_value_t = 16, help_heading = "Plan")]
    grid: usize,
    /// The answer's precision, as a share of the size
    #[arg(
        long,
        value_name = "SHARE",
        default_value_t = 0.02,
        help_heading = "Plan"
    )]
    tolerance: f64,
    /// Replays run at once [default: the machine's cores]
    #[arg(long, value_name = "N", help_heading = "Plan")]
    jobs: Option<usize>,
    /// Replay a sample of the trace's prefix trees, each size scaled to the sample: a curve
    /// of a trace too large to replay whole, with the error docs/commands/plan.md measures
    #[arg(long, value_name = "SHARE", help_heading = "Plan")]
    sample: Option<f64>,
    /// The seed that picks the sampled trees
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        requires = "sample",
        help_heading = "Plan"
    )]
    sample_seed: u64,
    /// Give every replay its real L1 buffers (the counters are the same)
    #[arg(long, help_heading = "Plan")]
    l1_buffers: bool,
    /// L2 capacities (GiB) of an L1 × L2 surface: each is replayed with every L1 size of the
    /// surface's grid, as the --l2-adapter given (a memory or gpu tier; by default a memory
    /// tier of sizes only) with that capacity; 0 is L1 alone (--no-l2)
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        allow_negative_numbers = true,
        help_heading = "Surface"
    )]
    l2_sizes_gb: Vec<f64>,
    /// L1 sizes of the surface, log-spaced over the plan's range
    #[arg(
        long,
        value_name = "N",
        default_value_t = 8,
        requires = "l2_sizes_gb",
        help_heading = "Surface"
    )]
    surface_l1_sizes: usize,
    /// The plan as JSON [default: plan.json]
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse, help_heading = "Plan")]
    json: Option<OutputArg>,
    /// Workbook: the curve and its chart [default: plan.xlsx]
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse, help_heading = "Plan")]
    xlsx: Option<OutputArg>,
    /// The curve as plan_curve.csv into DIR [default: the current directory]
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse, help_heading = "Plan")]
    csv: Option<OutputArg>,
    /// The curve as plan_curve.parquet into DIR [default: the current directory]
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_parser = OutputArg::parse, help_heading = "Plan")]
    parquet: Option<OutputArg>,
    /// The curve as an SVG picture
    #[arg(long, value_name = "PATH.svg", help_heading = "Plan")]
    plot: Option<PathBuf>,
    /// No table and no progress bar
    #[arg(short, long, help_heading = "Plan")]
    quiet: bool,
    #[command(flatten)]
    flags: Lists<PlanFlags>,
}

/// The surface's L2 tier at `gib` (above 0): the user's `--l2-adapter` (one that keeps sizes
/// in this process, since the cells run at once) with that capacity, or a memory tier of sizes
/// only when none was given.
fn surface_tier(given: Option<&str>, gib: f64) -> Result<String, Error> {
    let mut tier = match given {
        None => serde_json::json!({"type": "memory", "buffers": false}),
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            _ => {
                return Err(Error::usage(format!(
                    "--l2-adapter {text}: expected one JSON object with --l2-sizes-gb"
                )))
            }
        },
    };
    match tier["type"].as_str() {
        Some("memory" | "mock" | "gpu") => {}
        other => {
            return Err(Error::usage(format!(
                "--l2-adapter type {}: a surface replays its cells at once, each with its own L2; give a memory or gpu tier",
                other.map_or("missing".into(), |t| format!("{t:?}"))
            )))
        }
    }
    tier["capacity_gb"] = gib.into();
    Ok(tier.to_string())
}

/// A Mooncake JSONL request trace (its first byte opens a JSON object; an LMCT file opens with
/// a binary length) as the storage trace `kvtrace generate --from-mooncake` writes for it, in
/// a temporary file that is removed when dropped; `None` for any other file.
fn request_trace(
    file: &std::path::Path,
    chunk_mib: Option<u64>,
) -> Result<Option<tempfile::NamedTempFile>, Error> {
    use std::io::Read;
    let shown = file.display().to_string();
    let mut first = [0u8; 1];
    let json = std::fs::File::open(file)
        .and_then(|mut f| f.read(&mut first))
        .map_err(|e| Error::io("cannot open", e).in_file(&shown))?
        == 1
        && first[0] == b'{';
    if !json {
        return match chunk_mib {
            Some(_) => Err(Error::usage(format!(
                "{shown}: --chunk-mib sizes the chunks of a Mooncake request trace, and this is a storage trace"
            ))),
            None => Ok(None),
        };
    }
    let options = MooncakeOptions {
        chunk_mib: chunk_mib.unwrap_or(MooncakeOptions::default().chunk_mib),
        ..MooncakeOptions::default()
    };
    let out = tempfile::Builder::new()
        .prefix("kvtrace-plan-")
        .suffix(".lct")
        .tempfile()
        .map_err(|e| Error::io("cannot create a temporary trace", e))?;
    mooncake::write_file(&options, file, out.path(), None, &|_, _| {})?;
    Ok(Some(out))
}

/// The sizes (GiB) an events fleet's plan searches when none are given: up to twice the bytes
/// the busiest server stored in its L1 (an L1 that large never evicts), down a thousandfold.
fn events_bracket(recorded: &FleetSummary) -> (f64, f64) {
    let stored = recorded
        .instances
        .iter()
        .map(|(_, totals)| totals.store_bytes_per_tier.get("l1").copied().unwrap_or(0))
        .max()
        .unwrap_or(0)
        .max(1 << 20);
    let hi = 2.0 * stored as f64 / (1u64 << 30) as f64;
    (hi / 1000.0, hi)
}

fn share(flag: &str, v: f64) -> Result<f64, Error> {
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(Error::usage(format!(
            "{flag} {}: expected a share above 0 and at most 1 (0.6 for 60 %)",
            short(v)
        )))
    }
}

fn gib(flag: &str, v: f64) -> Result<f64, Error> {
    if v.is_finite() && v > 0.0 && v <= 1e6 {
        Ok(v)
    } else {
        Err(Error::usage(format!(
            "{flag} {}: expected GiB above 0 and at most 1000000",
            short(v)
        )))
    }
}

pub(super) fn run(a: Args) -> Result<i32, Error> {
    super::refuse_stdin([a.file.as_path()])?;
    let question = match (a.target_hit_rate, a.size_gb) {
        (Some(t), _) => Question::HitRate(share("--target-hit-rate", t)?),
        (None, Some(s)) => Question::Size(gib("--size-gb", s)?),
        (None, None) => return Err(Error::usage("give --target-hit-rate or --size-gb")),
    };
    let range = match (a.min_gb, a.max_gb) {
        (Some(lo), Some(hi)) => {
            let (lo, hi) = (gib("--min-gb", lo)?, gib("--max-gb", hi)?);
            if lo >= hi {
                return Err(Error::usage(format!(
                    "--min-gb {lo} --max-gb {hi}: the smallest size must be below the largest"
                )));
            }
            Some((lo, hi))
        }
        _ => None,
    };
    if !(2..=256).contains(&a.grid) {
        return Err(Error::usage(format!(
            "--grid {}: expected 2 to 256 sizes",
            a.grid
        )));
    }
    if !(a.tolerance > 0.0 && a.tolerance < 1.0) {
        return Err(Error::usage(format!(
            "--tolerance {}: expected a share between 0 and 1 (0.02 for 2 %)",
            a.tolerance
        )));
    }
    let jobs = jobs(a.jobs)?;
    if let Some(axis) = a.flags.axes.iter().find(|x| x.values.len() > 1) {
        return Err(Error::usage(format!(
            "--{} takes one value in a plan (kvtrace sweep compares configurations)",
            axis.flag
        )));
    }
    let base = Point {
        name: "plan".into(),
        settings: a
            .flags
            .axes
            .iter()
            .map(|x| (x.flag.clone(), x.values[0].clone()))
            .collect(),
    };
    let surface = match a.l2_sizes_gb.is_empty() {
        true => None,
        false => {
            let mut l2_gib = Vec::with_capacity(a.l2_sizes_gb.len());
            for &v in &a.l2_sizes_gb {
                if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                    return Err(Error::usage(format!(
                        "--l2-sizes-gb {}: expected GiB from 0 (L1 alone) to 1000000",
                        short(v)
                    )));
                }
                // -0 is 0: L1 alone.
                l2_gib.push(v.abs());
            }
            l2_gib.sort_by(f64::total_cmp);
            l2_gib.dedup();
            if l2_gib.len() > 16 {
                return Err(Error::usage(format!(
                    "--l2-sizes-gb: {} sizes; a surface takes at most 16",
                    l2_gib.len()
                )));
            }
            if !(2..=64).contains(&a.surface_l1_sizes) {
                return Err(Error::usage(format!(
                    "--surface-l1-sizes {}: expected 2 to 64 sizes",
                    a.surface_l1_sizes
                )));
            }
            // Every tier the surface builds is checked now, before any replay.
            for &g in l2_gib.iter().filter(|g| **g > 0.0) {
                surface_tier(base.get("l2-adapter"), g)?;
            }
            Some(SurfaceGrid {
                l1_sizes: a.surface_l1_sizes,
                l2_gib,
            })
        }
    };
    // A request trace is planned as the storage trace it gives, written aside for the
    // replays and removed after them.
    let generated = request_trace(&a.file, a.chunk_mib)?;
    let trace = generated
        .as_ref()
        .map_or(a.file.clone(), |g| g.path().to_owned());
    let head: Vec<OsString> = vec!["kvtrace replay".into(), trace.clone().into()];
    let one = |gib: f64, l2_gib: Option<f64>| -> Result<OneReplay, Error> {
        let mut point = base.clone();
        if let Some(l2) = l2_gib {
            point
                .settings
                .retain(|(flag, _)| flag != "l2-adapter" && flag != "no-l2");
            point.settings.push(match l2 > 0.0 {
                true => (
                    "l2-adapter".into(),
                    surface_tier(base.get("l2-adapter"), l2)?,
                ),
                false => ("no-l2".into(), "true".into()),
            });
        }
        let mut argv = point_argv::<PlanFlags>(&head, &point)?;
        argv.push(format!("--l1-size-gb={gib}").into());
        if !a.l1_buffers && base.get("l1-accounting-only").is_none() {
            argv.push("--l1-accounting-only".into());
        }
        point.name = match l2_gib {
            Some(l2) => format!("{gib} GiB, L2 {l2} GiB"),
            None => format!("{gib} GiB"),
        };
        parse_point(argv, &point)
    };
    // The flags are checked once, before any replay.
    let first = one(range.map_or(1.0, |r| r.1), None)?;
    replay::check(&first.args)?;
    replay::guard(&first.args)?;
    let events = replay::is_events(&trace, &first.args);
    if events && surface.is_some() {
        return Err(Error::usage(
            "--l2-sizes-gb: an events replay counts no L2 bytes; plan a storage trace's surface",
        ));
    }
    let outputs = Asked {
        json: a.json.as_ref().map(|o| o.path(|| "plan.json".into())),
        xlsx: a.xlsx.as_ref().map(|o| o.path(|| "plan.xlsx".into())),
        csv: a.csv.as_ref().map(|o| o.path(|| ".".into())),
        parquet: a.parquet.as_ref().map(|o| o.path(|| ".".into())),
        plot: a.plot.clone(),
    }
    .outputs(&[a.file.as_path()])?;
    let read = replay::read_options(&first.args);
    let options = PlanOptions {
        question,
        range,
        grid: a.grid,
        tolerance: a.tolerance,
        jobs,
        sample: match a.sample {
            Some(rate) => Some((share("--sample", rate)?, a.sample_seed)),
            None => None,
        },
        surface,
    };
    let bar = Progress::points(a.grid as u64, !a.quiet);
    let result = if events {
        // The fleet is decoded once; every size replays it with its own configuration.
        let stream = FleetStream::load(&[trace.as_path()], read)?;
        let recorded = summarise(&stream);
        let at = |gib: f64, l2_gib, _, _| {
            let config = replay::events_config(&one(gib, l2_gib)?.args, &stream.sm_config_json)?;
            let report =
                replay_events(&stream, &recorded, &|server| server_config(&config, server))?;
            Ok(SizeRun::of_events(&report, recorded.duration_s))
        };
        let input = PlanInput::Events {
            bracket: events_bracket(&recorded),
        };
        plan(&trace, &options, input, &at, &|_| bar.inc())
    } else {
        let at = |gib: f64, l2_gib, loaded, phase_shift| {
            let mut plan = replay::plan(&one(gib, l2_gib)?.args, false, None, loaded)?;
            plan.shift_phase(phase_shift);
            SizeRun::run(plan)
        };
        plan(&trace, &options, PlanInput::Storage(read), &at, &|_| {
            bar.inc()
        })
    };
    bar.finish();
    let mut report = result?;
    for w in &report.warnings {
        warn(&a.file.display().to_string(), w);
    }
    // A sample's lookups name the shared prefix's keys a share as often as the whole trace's
    // do, while every other key keeps its count: LFU ranks them otherwise.
    let lfu = |p: &SizePoint| p.figures.eviction_policy.eq_ignore_ascii_case("LFU");
    if report.sampled.is_some() && report.points.iter().any(lfu) {
        warn(
            &a.file.display().to_string(),
            "--sample under LFU: a sample uses the shared prefix's keys less often than the whole trace, so LFU keeps other objects (8–9 pp mean error measured at 1 % on the Mooncake twin, docs/commands/plan.md); plan LFU without --sample",
        );
    }
    if let (Some(thin), Some(s)) = (report.thin_sample(), &report.sampled) {
        let shown = a.file.display().to_string();
        warn(
            &shown,
            &format!("--sample {}: {thin}: sample more", short(s.counts.rate)),
        );
    }
    if generated.is_some() {
        // The storage trace's records are a microsecond apart: the per-second figures take
        // the request trace's own time.
        let shown = a.file.display().to_string();
        let file = std::fs::File::open(&a.file)
            .map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
        report.span_s =
            request_span_s(std::io::BufReader::new(file)).map_err(|e| e.in_file(&shown))?;
        report.trace = format!("{shown} (Mooncake request trace)");
    }
    for (exporter, target) in &outputs {
        kvtrace::report::write(&report, *exporter, target, "")?;
    }
    if !a.quiet {
        print_stdout(&report.terminal())?;
    }
    Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
}
