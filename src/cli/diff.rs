//! `kvtrace diff`.

use std::path::{Path, PathBuf};

use kvtrace::error::{Error, EXIT_DATA, EXIT_OK};
use kvtrace::replay::diff::{diff, render};

use super::print_stdout;

/// Compare two replay summaries (trace_replay_summary.json) and fail when a watched metric —
/// hit rates, OUT_OF_MEMORY keys, failed calls and reads, per-call latency, duration — moved
/// the wrong way by more than the threshold
#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace replay t.lct --json --output-dir base",
        "kvtrace replay t.lct --json --output-dir new --l1-size-gb 4",
        "kvtrace diff base/trace_replay_summary.json new/trace_replay_summary.json --max-regression 2",
    ]) + "\nExit status: 0 no regression, 1 a regression (or an unreadable summary), 2 usage error."
)]
pub struct Args {
    #[arg(value_name = "BASE.json")]
    base: PathBuf,
    #[arg(value_name = "NEW.json")]
    new: PathBuf,
    /// Largest tolerated move in the wrong direction, in percent
    #[arg(long, value_name = "PCT", default_value_t = 5.0)]
    max_regression: f64,
    /// Print the rows as JSON
    #[arg(long)]
    json: bool,
}

fn load(path: &Path) -> Result<serde_json::Value, Error> {
    let shown = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io("cannot read", e).in_file(&shown))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::line(e.line() as u64, "json", e.to_string()).in_file(&shown))
}

pub fn run(args: Args) -> Result<i32, Error> {
    if !(args.max_regression.is_finite() && args.max_regression >= 0.0) {
        return Err(Error::usage(
            "--max-regression must be a non-negative percentage",
        ));
    }
    let rows = diff(&load(&args.base)?, &load(&args.new)?, args.max_regression);
    if rows.is_empty() {
        return Err(Error::data(
            0,
            "summary",
            "no watched metric in common: are these replay summaries?",
        )
        .in_file(args.base.display()));
    }
    let text = if args.json {
        serde_json::to_string_pretty(&rows)
            .map_err(|e| Error::io("cannot encode JSON", e.into()))?
            + "\n"
    } else {
        render(&rows)
    };
    print_stdout(&text)?;
    Ok(if rows.iter().any(|r| r.regressed) {
        EXIT_DATA
    } else {
        EXIT_OK
    })
}
