//! `kvtrace dump`.

use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::PathBuf;

use clap::ValueEnum;
use kvtrace::error::{Error, EXIT_OK};
use kvtrace::lmct::json::to_display;
use kvtrace::lmct::msgpack::RawValue;
use kvtrace::lmct::{Frame, TraceReader};
use serde_json::{json, Map, Value as Json};

use super::progress::{Progress, EVERY};
use super::{stdout_error, warn, ReadArgs};

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One JSON object per line
    Jsonl,
    /// One pretty-printed JSON array
    Json,
}

/// Print every frame as JSON: codec tags decoded, bin as hex; the header first
#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace dump trace.lct --limit 5",
        "kvtrace dump trace.lct --qualname '*finish_write' | jq -c '.args.keys | length'",
    ]) + "\nPATTERN is a glob (*, ?, [..]) matched against the whole qualname, or a plain substring when it has no wildcard."
)]
pub struct Args {
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

/// Matches qualnames against a glob or a substring.
enum Filter {
    All,
    Glob(glob::Pattern),
    Substring(String),
}

impl Filter {
    fn new(pattern: Option<&str>) -> Result<Filter, Error> {
        Ok(match pattern {
            None => Filter::All,
            Some(p) if p.contains(['*', '?', '[']) => Filter::Glob(
                glob::Pattern::new(p)
                    .map_err(|e| Error::usage(format!("--qualname {p:?}: {e}")))?,
            ),
            Some(p) => Filter::Substring(p.to_owned()),
        })
    }

    fn matches(&self, qualname: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Glob(g) => g.matches(qualname),
            Filter::Substring(s) => qualname.contains(s.as_str()),
        }
    }
}

fn frame_object(index: u64, offset: u64, len: usize, body: Json) -> Json {
    let mut m = Map::new();
    m.insert("frame".into(), json!(index));
    m.insert("offset".into(), json!(offset));
    m.insert("len".into(), json!(len));
    if let Json::Object(fields) = body {
        m.extend(fields);
    }
    Json::Object(m)
}

/// Writes objects as JSON lines or as one array.
struct Printer<W: Write> {
    out: W,
    format: Format,
    count: u64,
}

impl<W: Write> Printer<W> {
    fn print(&mut self, value: &Json) -> io::Result<()> {
        match self.format {
            Format::Jsonl => {
                serde_json::to_writer(&mut self.out, value)?;
                self.out.write_all(b"\n")?;
            }
            Format::Json => {
                self.out
                    .write_all(if self.count == 0 { b"[\n" } else { b",\n" })?;
                serde_json::to_writer_pretty(&mut self.out, value)?;
            }
        }
        self.count += 1;
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        if let Format::Json = self.format {
            self.out
                .write_all(if self.count == 0 { b"[]\n" } else { b"\n]\n" })?;
        }
        self.out.flush()
    }
}

fn dump(args: &Args, printer: &mut Printer<impl Write>) -> Result<(), Error> {
    let shown = args.file.display().to_string();
    let filter = Filter::new(args.qualname.as_deref())?;
    let mut reader = if args.file.as_os_str() == "-" {
        TraceReader::from_reader(io::stdin(), args.read.options())
    } else {
        TraceReader::open(&args.file, args.read.options())
    }
    .map_err(|e| e.in_file(&shown))?;
    // A closed pipe (`kvtrace dump | head`) ends the dump quietly.
    let emit = |printer: &mut Printer<_>, object: &Json| -> Result<bool, Error> {
        match printer.print(object) {
            Ok(()) => Ok(true),
            Err(e) => stdout_error(e).map_or(Ok(false), Err),
        }
    };
    if !args.no_header {
        let header = RawValue::parse(reader.header_body())
            .map(to_display)
            .unwrap_or(Json::Null);
        let len = reader.header_body().len();
        if !emit(printer, &frame_object(0, 0, len, header))? {
            return Ok(());
        }
    }
    // Drawn only when the frames go somewhere other than the terminal.
    let bar = Progress::reading(&args.file, !io::stdout().is_terminal());
    let mut index = 0u64;
    let mut printed = 0u64;
    while args.limit.is_none_or(|limit| printed < limit) {
        let Some(frame) = reader.next_frame().map_err(|e| e.in_file(&shown))? else {
            break;
        };
        index += 1;
        if index.is_multiple_of(EVERY) {
            bar.set(index, frame.offset());
        }
        let object = match frame {
            Frame::Record(r) if filter.matches(r.qualname) => {
                let mut m = Map::new();
                m.insert("type".into(), json!("record"));
                m.insert("t_mono".into(), json!(r.t_mono));
                m.insert("t_wall".into(), json!(r.t_wall));
                m.insert("qualname".into(), json!(r.qualname));
                m.insert("args".into(), to_display(r.args));
                frame_object(index, r.offset, r.body.len(), Json::Object(m))
            }
            Frame::Record(_) => continue,
            Frame::Undecodable {
                offset,
                body,
                reason,
            } => frame_object(index, offset, body.len(), json!({ "undecodable": reason })),
        };
        if !emit(printer, &object)? {
            return Ok(());
        }
        printed += 1;
    }
    bar.finish();
    for w in reader
        .header_warnings()
        .iter()
        .chain(&reader.summary().warnings())
    {
        warn(&shown, w);
    }
    Ok(())
}

pub fn run(args: Args) -> Result<i32, Error> {
    let mut printer = Printer {
        out: BufWriter::new(io::stdout().lock()),
        format: args.format,
        count: 0,
    };
    dump(&args, &mut printer)?;
    match printer.finish() {
        Err(e) => stdout_error(e).map_or(Ok(EXIT_OK), Err),
        Ok(()) => Ok(EXIT_OK),
    }
}
