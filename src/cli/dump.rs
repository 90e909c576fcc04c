//! `kvtrace dump`.

use std::io::{self, BufWriter, IsTerminal};
use std::path::PathBuf;

use clap::ValueEnum;
use kvtrace::error::{Error, EXIT_OK};
use kvtrace::lmct::TraceReader;
use kvtrace::trace::dump::{self, DumpOptions, Ended, Filter};

use super::progress::Progress;
use super::{stdout_error, warn, ReadArgs};

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One JSON object per line
    Jsonl,
    /// One pretty-printed JSON array
    Json,
}

#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace dump trace.lct --limit 5",
        "kvtrace dump trace.lct --qualname '*finish_write' | jq -c '.args.keys | length'",
    ]) + "\nPATTERN is a glob (*, ?, [..]) matched against the whole qualname, or a plain substring when it has no wildcard."
)]
pub(super) struct Args {
    /// Trace file (.lct or .lct.zst); - reads standard input
    #[arg(value_name = "FILE")]
    file: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
    /// Print at most N records (the header is not counted)
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Only records whose qualname matches
    #[arg(long, value_name = "PATTERN")]
    qualname: Option<String>,
    /// Leave the header out
    #[arg(long)]
    no_header: bool,
    #[command(flatten)]
    read: ReadArgs,
}

pub(super) fn run(args: Args) -> Result<i32, Error> {
    let shown = args.file.display().to_string();
    let options = DumpOptions {
        format: match args.format {
            Format::Jsonl => dump::Format::Jsonl,
            Format::Json => dump::Format::Json,
        },
        limit: args.limit,
        filter: Filter::new(args.qualname.as_deref())
            .map_err(|e| Error::usage(format!("--qualname {}", e.message)))?,
        header: !args.no_header,
        threads: 0,
    };
    let reader = TraceReader::open_or_stdin(&args.file, args.read.options())
        .map_err(|e| e.in_file(&shown))?;
    let header_warnings = reader.header_warnings();
    // Drawn only when the frames go somewhere other than the terminal.
    let bar = Progress::reading(&args.file, !io::stdout().is_terminal());
    let mut out = BufWriter::new(io::stdout().lock());
    let ended = dump::dump(reader, &options, &mut out, &stdout_error, &|n, at| {
        bar.set(n, at)
    })
    .map_err(|e| e.in_file(&shown))?;
    bar.finish();
    if let Some(status) = kvtrace::interrupt::exit_status() {
        // The frames printed are a prefix of the trace; say so where a script will see it.
        drop(out);
        eprintln!("kvtrace: {shown}: interrupted: the frames printed are the trace's first, not all of it");
        return Ok(status);
    }
    if let Ended::Complete(summary) = ended {
        for w in header_warnings.iter().chain(&summary.warnings()) {
            warn(&shown, w);
        }
    }
    Ok(EXIT_OK)
}
