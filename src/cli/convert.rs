//! `kvtrace convert`.

use std::path::PathBuf;

use kvtrace::error::{Error, EXIT_OK};
use kvtrace::trace::convert::{convert, ConvertOptions, Kind};

use super::progress::Progress;
use super::{warn, ReadArgs};

#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace convert trace.lct trace.jsonl  # lossless: converting back gives the same bytes",
        "kvtrace convert trace.jsonl trace.lct",
        "kvtrace convert trace.lct trace.lct.zst",
        "kvtrace convert new.lct old.lct --schema 1  # for LMCache 0.5.6; says what was dropped",
        "kvtrace convert trace.lct trace.parquet  # one row per record: pandas, polars, DuckDB",
        "kvtrace convert trace.lct keys.parquet --view keys --columns frame,call,chunk_hash",
    ]) + "\nThe output kind follows OUT's extension (.jsonl, .zst, .parquet, .arrow, anything else is .lct) \
unless --to is given; the input kind is detected from its content. - is standard input or output \
(not for .parquet or .arrow)."
)]
pub(super) struct Args {
    #[arg(value_name = "IN")]
    input: PathBuf,
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// Output kind
    #[arg(long, value_name = "KIND", value_parser = ["lct", "lct.zst", "jsonl", "parquet", "arrow"])]
    to: Option<String>,
    /// Rows of a .parquet or .arrow output: one per record, or one per key a call names
    #[arg(long, value_name = "VIEW", value_parser = ["records", "keys"], default_value = "records")]
    view: String,
    /// Columns of a .parquet or .arrow output, comma-separated (default: all but args)
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    columns: Option<Vec<String>>,
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
    super::guard_piped([args.input.as_path()], [args.output.as_path()])?;
    let columnar = match args.to.as_deref() {
        Some("parquet") => Some("parquet"),
        Some("arrow") => Some("arrow"),
        Some(_) => None,
        None => match args.output.extension().and_then(|e| e.to_str()) {
            Some("parquet") => Some("parquet"),
            Some("arrow" | "feather" | "ipc") => Some("arrow"),
            _ => None,
        },
    };
    match columnar {
        Some(format) => return columnar::run(&args, format),
        None if args.view != "records" || args.columns.is_some() => {
            return Err(Error::usage(
                "--view and --columns shape a .parquet or .arrow output",
            ))
        }
        None => {}
    }
    let to = match &args.to {
        Some(name) => Kind::parse(name).ok_or_else(|| {
            Error::usage(format!(
                "--to {name:?}: expected lct, lct.zst, jsonl, parquet or arrow"
            ))
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

/// `.parquet` and `.arrow` outputs.
#[cfg(feature = "parquet")]
mod columnar {
    use kvtrace::columnar::write::columns_of;
    use kvtrace::columnar::{write_trace, Format, TraceBatches, View};
    use kvtrace::error::{Error, EXIT_OK};

    use super::super::progress::Progress;
    use super::super::warn;
    use super::Args;

    pub(super) fn run(args: &Args, format: &str) -> Result<i32, Error> {
        if args.input.as_os_str() == "-" || args.output.as_os_str() == "-" {
            return Err(Error::usage(
                "a .parquet or .arrow conversion reads and writes files, not standard streams",
            ));
        }
        if args.schema.is_some() {
            return Err(Error::usage(
                "--schema rewrites LMCT; a columnar output keeps the trace as read",
            ));
        }
        let format = if format == "parquet" {
            Format::Parquet
        } else {
            Format::Arrow
        };
        let view = View::parse(&args.view).unwrap_or(View::Records);
        let columns = columns_of(view, args.columns.as_deref())?;
        let batches = TraceBatches::open(&args.input, view, &columns, args.read.options())?;
        let bar = Progress::records(true);
        let written = write_trace(batches, &args.output, format, &|rows| bar.set(rows, 0));
        bar.finish();
        let written = written?;
        let shown = args.input.display().to_string();
        if written.undecodable > 0 && view == View::Keys {
            warn(
                &shown,
                &format!("{} undecodable frames have no keys", written.undecodable),
            );
        }
        if let Some(bytes) = written.truncated_bytes {
            warn(
                &shown,
                &format!(
                    "truncated tail of {bytes} bytes (an incomplete last frame) not converted"
                ),
            );
        }
        if written.interrupted {
            eprintln!(
                "kvtrace: interrupted: {} holds the {} rows converted so far",
                args.output.display(),
                written.rows
            );
        }
        eprintln!(
            "kvtrace: wrote {} rows ({} view) from {} frames of {} to {}",
            written.rows,
            view.name(),
            written.records + written.undecodable,
            shown,
            args.output.display()
        );
        Ok(kvtrace::interrupt::exit_status().unwrap_or(EXIT_OK))
    }
}

/// Built without the `parquet` feature: columnar outputs are a one-line error.
#[cfg(not(feature = "parquet"))]
mod columnar {
    use kvtrace::error::Error;

    pub(super) fn run(_: &super::Args, format: &str) -> Result<i32, Error> {
        Err(Error::usage(format!(
            "a .{format} output needs kvtrace built with its default parquet feature"
        )))
    }
}
