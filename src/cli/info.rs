//! `kvtrace info`.

use std::path::PathBuf;

use kvtrace::error::{Error, EXIT_OK};
use kvtrace::lmct::ReadOptions;
use kvtrace::replay::events::fleet::{summarise, FleetStream};
use kvtrace::trace::inspect::inspect;

use super::progress::Progress;
use super::{print_stdout, report, warn, ReadArgs};

#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace info trace.lct",
        "kvtrace info --json a.lct b.lct.zst | jq '.[].ops'",
        "zstd -dc trace.lct.zst | kvtrace info -",
    ])
)]
pub(super) struct Args {
    /// Trace files (.lct or .lct.zst; - reads standard input)
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print a JSON array with one object per file
    #[arg(long)]
    json: bool,
    /// Also summarise a single events trace as a fleet (two or more events traces always
    /// are): merged by wall clock, per server and together, occupancy over time, access hit
    /// ratio, store bytes per tier
    #[arg(long)]
    fleet: bool,
    /// Threads that decode the records (0: one per core; at most 1024); the figures do not
    /// depend on it
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(0..=kvtrace::lmct::reader::MAX_THREADS as u64))]
    threads: usize,
    #[command(flatten)]
    read: ReadArgs,
}

/// A fleet is merged by a second read of its traces, which standard input cannot give.
const STDIN_FLEET: &str =
    "-: an events trace read from standard input cannot be summarised as a fleet (the fleet reads its traces again): give its file";

pub(super) fn run(args: Args) -> Result<i32, Error> {
    let mut code = EXIT_OK;
    let mut infos = Vec::new();
    let mut events: Vec<&std::path::Path> = Vec::new();
    for (i, file) in args.files.iter().enumerate() {
        let bar = Progress::reading(file, true);
        let options = ReadOptions {
            threads: args.threads,
            ..args.read.options()
        };
        let inspected = inspect(file, options, &|n, at| bar.set(n, at));
        bar.finish();
        match inspected {
            Ok(info) => {
                for w in &info.warnings {
                    warn(&info.file, w);
                }
                if !args.json {
                    let sep = if i > 0 { "\n" } else { "" };
                    print_stdout(&format!("{sep}{}", info.render()))?;
                }
                if info.level == "events" {
                    events.push(file);
                }
                infos.push(info);
            }
            Err(e) => code = code.max(report(&e)),
        }
        if kvtrace::interrupt::requested().is_some() {
            break;
        }
    }
    if let Some(status) = kvtrace::interrupt::exit_status() {
        // What was printed says which counts are partial; the rest is not summarised.
        if args.json {
            print_json(
                &infos
                    .iter()
                    .map(serde_json::to_value)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Error::io("cannot encode JSON", e.into()))?,
            )?;
        }
        eprintln!(
            "kvtrace: interrupted: {} of {} files summarised, the last one partly",
            infos.len(),
            args.files.len()
        );
        return Ok(status);
    }
    let fleet = if events.len() >= 2 || (args.fleet && !events.is_empty()) {
        let loaded = if events.iter().any(|f| f.as_os_str() == "-") {
            Err(Error::usage(STDIN_FLEET))
        } else {
            FleetStream::load(&events, args.read.options())
        };
        match loaded {
            Ok(stream) => Some(summarise(&stream)),
            Err(e) => {
                code = code.max(report(&e));
                None
            }
        }
    } else {
        None
    };
    if args.json {
        // The fleet, when there is one, is the array's last element: `{"fleet": {...}}`.
        let entries: Vec<serde_json::Value> = infos
            .iter()
            .map(serde_json::to_value)
            .chain(
                fleet
                    .iter()
                    .map(|f| serde_json::to_value(f).map(|f| serde_json::json!({ "fleet": f }))),
            )
            .collect::<Result<_, _>>()
            .map_err(|e| Error::io("cannot encode JSON", e.into()))?;
        print_json(&entries)?;
    } else if let Some(fleet) = &fleet {
        print_stdout(&format!("\n{}", fleet.render()))?;
    }
    Ok(code)
}

fn print_json(entries: &[serde_json::Value]) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(entries)
        .map_err(|e| Error::io("cannot encode JSON", e.into()))?;
    print_stdout(&format!("{text}\n"))
}
