//! `kvtrace diff`.

use std::path::{Path, PathBuf};

use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::replay::diff::{
    diff, render, DiffOptions, Kind, DURATION_NOISE_FLOOR_S, LATENCY_NOISE_FLOOR_MS,
};

use super::print_stdout;

#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace replay t.lct --json --output-dir base",
        "kvtrace replay t.lct --json --output-dir new --l1-size-gb 4",
        "kvtrace diff base/trace_replay_summary.json new/trace_replay_summary.json --max-regression 2",
    ]) + "\nExit status: 0 no regression, 1 a regression (or an unreadable summary), 2 usage error."
)]
pub(super) struct Args {
    #[arg(value_name = "BASE.json")]
    base: PathBuf,
    #[arg(value_name = "NEW.json")]
    new: PathBuf,
    /// Largest tolerated move in the wrong direction, in percent
    #[arg(long, value_name = "PCT", default_value_t = 5.0)]
    max_regression: f64,
    /// Also watch a replay's per-call latencies and duration: live measurements, so a move
    /// under the noise floor (0.1 ms a call, 0.1 s in all) never regresses
    #[arg(long)]
    latency: bool,
    /// Print the rows as JSON
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: Args) -> Result<i32, Error> {
    super::refuse_stdin([args.base.as_path(), args.new.as_path()])?;
    if !(args.max_regression.is_finite() && args.max_regression >= 0.0) {
        return Err(Error::usage(
            "--max-regression must be a non-negative percentage",
        ));
    }
    let load = |path| kvtrace::limits::read_json(path, kvtrace::limits::MAX_REPORT_BYTES);
    let (base, new) = (load(&args.base)?, load(&args.new)?);
    let kind_of = |report: &serde_json::Value, path: &Path| {
        Kind::of(report).ok_or_else(|| {
            Error::data(
                0,
                "summary",
                "not a replay summary (trace_replay_summary.json), a simulate report or a bench report",
            )
            .in_file(path.display())
        })
    };
    let kind = kind_of(&base, &args.base)?;
    if kind_of(&new, &args.new)? != kind {
        return Err(Error::usage(format!(
            "{} is a {} and {} is not: diff compares two reports of one kind",
            args.base.display(),
            kind.name(),
            args.new.display()
        )));
    }
    let options = DiffOptions {
        max_regression_pct: args.max_regression,
        latency: args.latency,
    };
    let rows = diff(kind, &base, &new, options);
    if rows.is_empty() {
        return Err(
            Error::data(0, "summary", "no watched figure in common").in_file(args.base.display())
        );
    }
    let text = if args.json {
        serde_json::to_string_pretty(&rows)
            .map_err(|e| Error::io("cannot encode JSON", e.into()))?
            + "\n"
    } else {
        let mut text = render(&rows);
        if args.latency && kind == Kind::Replay {
            text.push_str(&format!(
                "latencies are live measurements: a move under {LATENCY_NOISE_FLOOR_MS} ms a call or {DURATION_NOISE_FLOOR_S} s in all is noise, never a regression\n"
            ));
        }
        text
    };
    print_stdout(&text)?;
    Ok(if rows.iter().any(|r| r.regressed) {
        EXIT_DATA
    } else {
        EXIT_OK
    })
}
