//! Command-line definitions and dispatch. Each subcommand lives in its own file and does no
//! work beyond calling the library and printing.

mod bench;
mod convert;
mod diff;
mod dump;
mod generate;
mod info;
mod replay;
mod simulate;
mod tiers;

use std::io::{self, Write};

use clap::{Parser, Subcommand};
use kvtrace::error::{Error, EXIT_OK};
use kvtrace::lmct::reader::DEFAULT_MAX_FRAME_BYTES;
use kvtrace::lmct::ReadOptions;

const EXIT_CODES: &str =
    "Exit status: 0 success; 1 bad input data or an I/O failure; 2 usage error.";

#[derive(Parser)]
#[command(
    name = "kvtrace",
    version,
    about = "Record, inspect, convert and replay the KV-cache storage traffic of LLM serving",
    long_about = "kvtrace reads and writes LMCache's LMCT storage traces (.lct, .lct.zst) in every \
                  variant LMCache has written, and writes files LMCache 0.5.6 accepts byte for byte.",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Info(info::Args),
    Dump(dump::Args),
    Convert(convert::Args),
    Generate(generate::Args),
    Replay(Box<replay::Args>),
    Diff(diff::Args),
    Simulate(Box<simulate::Args>),
    Bench(Box<bench::Args>),
}

/// Options every trace-reading command shares.
#[derive(clap::Args, Clone, Copy)]
struct ReadArgs {
    /// Refuse frames longer than this many bytes (protects against corrupt length prefixes)
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME_BYTES)]
    max_frame_bytes: u32,
}

impl ReadArgs {
    fn options(self) -> ReadOptions {
        ReadOptions {
            max_frame_bytes: self.max_frame_bytes,
        }
    }
}

/// Writes a whole output file through a temporary name (see [`kvtrace::output`]); an error
/// names it.
fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), Error> {
    kvtrace::output::write_atomic(path, bytes)
}

/// Starts recording to an LMCT file (a name ending in .zst is compressed) whose header
/// carries `config`. With `virtual_clock`, records are stamped with the time the caller
/// sets on the tracer ([`kvtrace::bus::Tracer::set_virtual_time`]) instead of the machine's.
fn start_recording(
    path: &std::path::Path,
    config: &kvtrace::storage::config::StorageConfig,
    virtual_clock: bool,
) -> Result<kvtrace::bus::EventBus, Error> {
    use kvtrace::bus::recorder::{Recorder, RecorderOptions};
    use kvtrace::bus::{BusOptions, EventBus};
    let zstd = path.to_string_lossy().ends_with(".zst");
    let options = RecorderOptions {
        zstd_level: zstd.then_some(3),
        ..RecorderOptions::default()
    };
    let mut recorder = Recorder::create(path, options)?;
    recorder.attach_storage_config_value(&config.to_lmcache_json())?;
    let bus_options = BusOptions {
        virtual_origin: virtual_clock.then(|| recorder.origin()),
        ..BusOptions::default()
    };
    EventBus::start(bus_options, vec![Box::new(recorder)])
}

/// Closes a recording and, unless quiet, says what it wrote.
fn finish_recording(bus: kvtrace::bus::EventBus, quiet: bool) -> Result<(), Error> {
    for r in bus.close()? {
        if !quiet {
            eprintln!(
                "kvtrace: {}: {} records, {} bytes",
                r.name, r.events, r.bytes
            );
        }
    }
    Ok(())
}

/// Prints one error line and returns its exit code.
fn report(e: &Error) -> i32 {
    eprintln!("kvtrace: error: {e}");
    e.exit_code()
}

fn warn(file: &str, message: &str) {
    eprintln!("kvtrace: warning: {file}: {message}");
}

/// A write to stdout failed: a closed pipe (`kvtrace dump | head`) is a normal end.
fn stdout_error(e: io::Error) -> Option<Error> {
    (e.kind() != io::ErrorKind::BrokenPipe).then(|| Error::io("cannot write to stdout", e))
}

fn print_stdout(text: &str) -> Result<(), Error> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) => stdout_error(e).map_or(Ok(()), Err),
    }
}

/// A clap message folded into one line: the error and its details, without the usage and
/// the pointer to `--help`.
fn one_line(message: &str) -> String {
    message
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn run() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("kvtrace: {}", one_line(&e.to_string()));
            return e.exit_code();
        }
        Err(e) => {
            let _ = e.print();
            return EXIT_OK;
        }
    };
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Dump(args) => dump::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Replay(args) => replay::run(*args),
        Command::Diff(args) => diff::run(args),
        Command::Simulate(args) => simulate::run(*args),
        Command::Bench(args) => bench::run(*args),
    };
    result.unwrap_or_else(|e| report(&e))
}
