//! `kvtrace convert`.

use std::path::PathBuf;

use kvtrace::error::{Error, EXIT_OK};
use kvtrace::trace::convert::{convert, ConvertOptions, Kind};

use super::progress::Progress;
use super::{warn, ReadArgs};

/// Convert between .lct, .lct.zst and lossless .jsonl, optionally rewriting later schemas
/// into LMCache 0.5.6's schema 1
#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace convert trace.lct trace.jsonl  # lossless: converting back gives the same bytes",
        "kvtrace convert trace.jsonl trace.lct",
        "kvtrace convert trace.lct trace.lct.zst",
        "kvtrace convert new.lct old.lct --schema 1  # for LMCache 0.5.6; says what was dropped",
    ]) + "\nThe output kind follows OUT's extension (.jsonl, .zst, anything else is .lct) unless --to is given; \
the input kind is detected from its content. - is standard input or output."
)]
pub(super) struct Args {
    #[arg(value_name = "IN")]
    input: PathBuf,
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// Output kind
    #[arg(long, value_name = "KIND", value_parser = ["lct", "lct.zst", "jsonl"])]
    to: Option<String>,
    /// Rewrite argument shapes into this schema (only 1 is supported)
    #[arg(long, value_name = "VERSION")]
    schema: Option<u32>,
    /// zstd level for .zst output
    #[arg(long, default_value_t = 3)]
    zstd_level: i32,
    #[command(flatten)]
    read: ReadArgs,
}

pub(super) fn run(args: Args) -> Result<i32, Error> {
    super::guard([args.input.as_path()], [args.output.as_path()])?;
    let to = match &args.to {
        Some(name) => Kind::parse(name).ok_or_else(|| {
            Error::usage(format!("--to {name:?}: expected lct, lct.zst or jsonl"))
        })?,
        None if args.output.as_os_str() == "-" => {
            return Err(Error::usage(
                "writing to standard output needs --to lct|lct.zst|jsonl",
            ))
        }
        None => Kind::from_path(&args.output),
    };
    let to_schema_1 = match args.schema {
        None => false,
        Some(1) => true,
        Some(v) => {
            return Err(Error::usage(format!(
                "--schema {v}: kvtrace writes schema 1 only"
            )))
        }
    };
    let options = ConvertOptions {
        to,
        to_schema_1,
        zstd_level: args.zstd_level,
        read: args.read.options(),
    };
    let bar = Progress::records(true);
    let report = convert(&args.input, &args.output, options, &|n, at| bar.set(n, at));
    bar.finish();
    let report = report?;
    let shown = args.input.display().to_string();
    if report.interrupted {
        eprintln!(
            "kvtrace: interrupted: {} holds the {} frames converted so far",
            args.output.display(),
            report.frames
        );
    }
    if report.raw_frames > 0 {
        warn(
            &shown,
            &format!(
                "{} undecodable frames carried over as raw bytes",
                report.raw_frames
            ),
        );
    }
    if report.tail_bytes > 0 {
        warn(
            &shown,
            &format!("truncated tail of {} bytes carried over", report.tail_bytes),
        );
    }
    if let Some(m) = &report.migration {
        let lines = m.lines();
        if lines.is_empty() {
            eprintln!("kvtrace: schema 1: nothing needed rewriting");
        }
        for line in lines {
            eprintln!("kvtrace: schema 1: {line}");
        }
    }
    eprintln!(
        "kvtrace: converted {} frames from {} to {}",
        report.frames,
        shown,
        args.output.display()
    );
    Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
}
