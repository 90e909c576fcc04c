//! Command-line definitions and dispatch. Each subcommand lives in its own file and does no
//! work beyond calling the library and printing.

mod aggregate;
mod bench;
mod convert;
mod diff;
mod docs;
mod dump;
mod generate;
mod hints;
mod info;
mod otlp;
mod plan;
mod progress;
mod prometheus;
mod rank;
mod replay;
mod simulate;
mod sweep;
mod tiers;

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use kvtrace::error::{Error, EXIT_OK};
use kvtrace::lmct::reader::DEFAULT_MAX_FRAME_BYTES;
use kvtrace::lmct::ReadOptions;
use kvtrace::report::terminal::{escape_line, escape_text};
use kvtrace::report::Target;

const EXIT_CODES: &str =
    "Exit status: 0 success; 1 bad input data or an I/O failure; 2 usage error.";

#[derive(Parser)]
#[command(
    name = "kvtrace",
    version = env!("KVTRACE_LONG_VERSION"),
    about = "Record, inspect, convert and replay the KV-cache storage traffic of LLM serving",
    long_about = "kvtrace reads and writes LMCache's LMCT storage traces (.lct, .lct.zst) in every \
                  variant LMCache has written, and writes files LMCache 0.5.6 accepts byte for byte.",
    after_help = EXIT_CODES,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The commands. Their arguments are built only for the command a run names (`defer`): the
/// whole tree of every command's flags took 2.8 M instructions, 40 % of a small `simulate`.
/// Each command's description is therefore on its variant here, where the list of commands
/// reads it, and not on its `Args`, which is built only with its flags.
#[derive(Subcommand)]
#[command(defer = true)]
enum Command {
    /// Summarise traces: LMCache's `trace info` fields plus schema variant, start-up gap,
    /// distinct keys, implied payload bytes, completeness and the recorder trailer
    Info(info::Args),
    /// Print every frame as JSON: codec tags decoded, bin as hex; the header first
    Dump(dump::Args),
    /// Convert between .lct, .lct.zst and lossless .jsonl, optionally rewriting later schemas
    /// into LMCache 0.5.6's schema 1, or into a Parquet or Arrow table (a row per record or key)
    Convert(convert::Args),
    /// Write a storage trace as an LMCache server records it: a realistic synthetic one
    /// (multi-turn conversations over shared system prompts), or the one a Mooncake request
    /// trace gives through an LRU L1 (--from-mooncake); same input and options, same bytes
    Generate(generate::Args),
    /// Re-issue every recorded StorageManager call against a fresh StorageManager and report what
    /// the cache did: hits per request and tier, OUT_OF_MEMORY, evictions, bytes, call latencies
    Replay(Box<replay::Args>),
    /// Compare two replay summaries (trace_replay_summary.json), two simulate or two bench reports and fail
    /// when a watched figure moved the wrong way by more than the threshold: by default the
    /// deterministic ones (hits per tier, OUT_OF_MEMORY, evictions, failed calls and reads,
    /// fidelity; a simulate report's figures), a replay's latencies only with --latency
    Diff(diff::Args),
    /// Simulate serving a request trace (Mooncake JSONL) or a synthetic workload on mock engines
    /// and report latency and throughput — the flags and report of `python -m dynamo.replay`
    Simulate(Box<simulate::Args>),
    /// A KV-cache storage benchmark with MLPerf Storage kv-cache.py's flags and outputs:
    /// simulated users write and re-read whole KV entries through GPU, CPU and storage tiers
    /// with real I/O, and the run reports throughput, latency percentiles, hit rates and QoS
    Bench(Box<bench::Args>),
    /// Run one trace under many configurations: every flag of `replay` or `simulate` takes a
    /// comma-separated list, and every combination runs, in parallel
    #[command(subcommand)]
    Sweep(Box<sweep::Kind>),
    /// Find the L1 a trace needs for a hit rate, or the hit rate a size gives: full replays with
    /// LMCache's eviction controller and the recorded client's model, the curve around the
    /// answer, its knee, and what each extra GiB buys
    Plan(Box<plan::Args>),
    /// Merge the per-rank reports of one run (replay or bench in rank mode) into one: summed
    /// counts, throughput over the common window, percentiles from the ranks' merged
    /// histograms, the spread over ranks, each operation's worst rank P95, and for bench results
    /// MLPerf Storage v3.0's aggregate of a trial (§6.3.4: storage bandwidths and throughput
    /// summed over ranks, device P95s the worst rank's); or the slices of a sweep spread over
    /// ranks into the one sweep
    Aggregate(aggregate::Args),
    /// Print a shell completion script
    Completions(docs::CompletionsArgs),
    /// Write the man pages: kvtrace.1 and one kvtrace-COMMAND.1 per command
    Man(docs::ManArgs),
}

// Options every trace-reading command shares. (A plain comment: a doc comment here would
// become the about of every command that flattens these options.)
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
            stop: kvtrace::interrupt::stop_requested,
            ..ReadOptions::default()
        }
    }
}

/// A report output flag of the one shape every command shares, like `--color[=WHEN]`:
/// `--json` alone writes the command's default file (or directory, for `--csv`), `--json=PATH`
/// writes PATH. The `=` is required so that the word after the flag stays a command's input.
#[derive(Clone, Debug, PartialEq)]
enum OutputArg {
    Default,
    At(PathBuf),
}

impl OutputArg {
    fn parse(text: &str) -> Result<OutputArg, String> {
        Ok(match text {
            "" => OutputArg::Default,
            path => OutputArg::At(PathBuf::from(path)),
        })
    }

    /// Where the output goes: the path given, or `default`.
    fn path(&self, default: impl FnOnce() -> PathBuf) -> PathBuf {
        match self {
            OutputArg::Default => default(),
            OutputArg::At(path) => path.clone(),
        }
    }

    /// The path given with `=`, if one was.
    fn given(&self) -> Option<&Path> {
        match self {
            OutputArg::Default => None,
            OutputArg::At(path) => Some(path),
        }
    }
}

/// Says what each recording wrote.
fn say_recorded(reports: &[kvtrace::bus::SubscriberReport]) {
    for r in reports {
        eprintln!(
            "kvtrace: {}: {} records, {} bytes",
            r.name, r.events, r.bytes
        );
    }
}

/// Splits a command line on spaces outside quotes, so a line break never lands inside a
/// quoted argument (where a shell would keep the backslash).
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    for c in text.chars() {
        match (quote, c) {
            (None, ' ') => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                continue;
            }
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
        word.push(c);
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// The `Examples:` section of a command's help. Each command is broken into lines of at
/// most 76 columns with a trailing ` \`, so help never wraps one mid-word and every
/// example pastes into a shell as it stands.
fn examples(commands: &[&str]) -> String {
    const WIDTH: usize = 76;
    let mut out = String::from("Examples:\n");
    for command in commands {
        let (text, comment) = match command.split_once("  # ") {
            Some((t, c)) => (t, Some(c)),
            None => (*command, None),
        };
        if let Some(c) = comment {
            out += &format!("  # {c}\n");
        }
        let mut line = String::from("  ");
        for word in shell_words(text) {
            if line.len() > 2 && line.len() + 1 + word.len() + 2 > WIDTH {
                out += &line;
                out += " \\\n";
                line = String::from("      ");
            } else if line.len() > 2 && !line.ends_with(' ') {
                line.push(' ');
            }
            line += &word;
        }
        out += &line;
        out.push('\n');
    }
    out
}

/// Prints one error line (whatever of a trace it quotes escaped, with a hint where a JSON file
/// was given for a trace) and returns its exit code.
fn report(e: &Error) -> i32 {
    match hints::json_input(e) {
        Some(hint) => eprintln!("kvtrace: error: {}; {hint}", escape_line(&e.to_string())),
        None => eprintln!("kvtrace: error: {}", escape_line(&e.to_string())),
    }
    e.exit_code()
}

/// The shared check before any work (see [`kvtrace::output::guard_inputs`]), saying what
/// a dead run left that it removed. `-` is refused as an input: only `info`, `dump` and
/// `convert`, which read their input once from its start, take standard input
/// ([`guard_piped`]); another command would look for a file named `-`.
fn guard<'a>(
    inputs: impl IntoIterator<Item = &'a Path>,
    outputs: impl IntoIterator<Item = &'a Path>,
) -> Result<(), Error> {
    let inputs: Vec<&Path> = inputs.into_iter().collect();
    refuse_stdin(inputs.iter().copied())?;
    guard_piped(inputs, outputs)
}

/// Refuses `-` among a command's input files (see [`guard`]).
fn refuse_stdin<'a>(inputs: impl IntoIterator<Item = &'a Path>) -> Result<(), Error> {
    match inputs.into_iter().any(|p| p.as_os_str() == "-") {
        true => Err(Error::usage(
            "-: standard input is read by info, dump and convert only; give this command a file",
        )),
        false => Ok(()),
    }
}

/// [`guard`] for a command that reads `-` as standard input.
fn guard_piped<'a>(
    inputs: impl IntoIterator<Item = &'a Path>,
    outputs: impl IntoIterator<Item = &'a Path>,
) -> Result<(), Error> {
    for note in kvtrace::output::guard_inputs(inputs, outputs)? {
        warn_line(&note);
    }
    Ok(())
}

/// The `--parquet` slot of a command's outputs: the Parquet exporter writing into `dir`, or,
/// not asked, no target (and any exporter, which `report::outputs` then skips). Asked of a
/// build without the `parquet` feature, the one-line error.
fn parquet_output(
    dir: Option<PathBuf>,
) -> Result<(&'static dyn kvtrace::report::Exporter, Option<Target>), Error> {
    let Some(dir) = dir else {
        return Ok((&kvtrace::report::csv::Csv, None));
    };
    #[cfg(feature = "parquet")]
    return Ok((&kvtrace::columnar::Parquet, Some(Target::Dir(dir))));
    #[cfg(not(feature = "parquet"))]
    {
        let _ = dir;
        Err(Error::usage(
            "--parquet needs kvtrace built with its default parquet feature",
        ))
    }
}

fn warn(file: &str, message: &str) {
    eprintln!(
        "kvtrace: warning: {}",
        escape_line(&format!("{file}: {message}"))
    );
}

fn warn_line(message: &str) {
    eprintln!("kvtrace: warning: {}", escape_line(message));
}

/// A write to stdout failed: a closed pipe (`kvtrace dump | head`) is a normal end.
fn stdout_error(e: io::Error) -> Option<Error> {
    (e.kind() != io::ErrorKind::BrokenPipe).then(|| Error::io("cannot write to stdout", e))
}

/// How wide a table may be drawn: `COLUMNS` where the shell exports it (as rich, which
/// Dynamo's table comes from, reads it), else 100.
fn columns() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&c| c >= 40)
        .unwrap_or(100)
}

/// Whether stdout gets colour: on a terminal (or with `CLICOLOR_FORCE` set), never with
/// `NO_COLOR` set (<https://no-color.org>).
fn colour() -> bool {
    let set = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
    !set("NO_COLOR") && (set("CLICOLOR_FORCE") || io::stdout().is_terminal())
}

/// The verdicts of a report in colour: a regression or failure red, a pass green, a listed
/// divergence yellow. Added after escaping, so a trace's own text never chooses a colour.
fn paint(text: &str) -> String {
    const RED: &str = "\x1b[1;31m";
    const GREEN: &str = "\x1b[32m";
    const YELLOW: &str = "\x1b[33m";
    const RESET: &str = "\x1b[0m";
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        // A divergence line of the fidelity section: `  record N (byte B, t=…) …`.
        if body.starts_with("  record ") && body.contains(" (byte ") {
            out += &format!("{YELLOW}{body}{RESET}{end}");
            continue;
        }
        let mut words = body.split(' ').peekable();
        while let Some(word) = words.next() {
            match word {
                "REGRESSED" | "FAIL" => out += &format!("{RED}{word}{RESET}"),
                "PASS" => out += &format!("{GREEN}{word}{RESET}"),
                _ => out += word,
            }
            if words.peek().is_some() {
                out.push(' ');
            }
        }
        out += end;
    }
    out
}

/// Prints a report's text; a control character a trace slipped into it is shown escaped, and
/// verdicts are coloured where [`colour`] says so.
fn print_stdout(text: &str) -> Result<(), Error> {
    let text = escape_text(text);
    let text = if colour() {
        std::borrow::Cow::Owned(paint(&text))
    } else {
        text
    };
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

/// The ids of the arguments the user gave `subcommand` (on the command line or through an
/// environment variable), as opposed to those left at their defaults.
fn given(matches: &clap::ArgMatches, subcommand: &str) -> Vec<String> {
    let mut cli = Cli::command();
    let (Some(m), Some(command)) = (
        matches.subcommand_matches(subcommand),
        cli.find_subcommand_mut(subcommand),
    ) else {
        return Vec::new();
    };
    // A deferred command (see [`Command`]) has its arguments only once it is built.
    command.build();
    // Groups (one per flattened struct) have ids too; only arguments are asked about.
    let arguments: Vec<String> = command
        .get_arguments()
        .map(|a| a.get_id().as_str().to_owned())
        .collect();
    m.ids()
        .filter(|id| arguments.iter().any(|a| a == id.as_str()))
        .filter(|id| {
            matches!(
                m.value_source(id.as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|id| id.as_str().to_owned())
        .collect()
}

pub(crate) fn run() -> i32 {
    let (args, notes) = hints::old_spellings(std::env::args_os().collect());
    let parsed = Cli::command()
        .try_get_matches_from(args)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // Bare `kvtrace`: the whole help, commands listed, on stderr; a usage error.
            let _ = e.print();
            return e.exit_code();
        }
        Err(e) if e.use_stderr() => {
            match hints::foreign_flag(&e) {
                Some((flag, hint)) => {
                    eprintln!("kvtrace: error: unexpected argument '{flag}' found; {hint}")
                }
                None => eprintln!("kvtrace: {}", one_line(&e.to_string())),
            }
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
        Command::Bench(args) => bench::run(*args, &given(&matches, "bench")),
        Command::Sweep(kind) => sweep::run(*kind),
        Command::Plan(args) => plan::run(*args),
        Command::Aggregate(args) => aggregate::run(args),
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
    };
    match result {
        // The notes on old spellings come after the run, and only after one that did not
        // fail: a failure is one line, whatever spelling led to it.
        Ok(code) => {
            for note in notes {
                warn_line(&note);
            }
            code
        }
        // A run that a signal ended in an error (a barrier left waiting, a read cut short)
        // still exits 128 + the signal: the status says why it stopped.
        Err(e) => {
            let code = report(&e);
            kvtrace::interrupt::exit_status().unwrap_or(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{paint, Cli};

    /// The list of commands shows each command's description before its flags are built
    /// (`defer`); its own help, after. A doc comment on an `Args` struct, or on one that a
    /// command flattens, would replace the description there and not in the list: both must
    /// be the variant's.
    #[test]
    fn each_command_is_described_alike_in_the_list_and_its_own_help() {
        fn check(listed: &clap::Command, built: &clap::Command, path: &str) {
            for sub in listed.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
                assert!(!about.is_empty(), "{name} has no description in the list");
                let own = built
                    .find_subcommand(sub.get_name())
                    .unwrap_or_else(|| panic!("{name} is not in the built commands"));
                let shown = own.get_about().map(|a| a.to_string()).unwrap_or_default();
                assert_eq!(about, shown, "{name}: the list and its help differ");
                check(sub, own, &name);
            }
        }
        let mut built = Cli::command();
        built.build();
        let listed = Cli::command();
        assert!(listed.get_subcommands().count() >= 13);
        check(&listed, &built, "kvtrace");
        let sweep = built.find_subcommand("sweep").expect("sweep");
        assert_eq!(
            sweep.get_subcommands().count(),
            3,
            "replay, simulate and help"
        );
    }

    #[test]
    fn verdicts_are_painted_and_other_words_left_alone() {
        let text = "p99  1.0  2.0  +100.0%  REGRESSED\nassessment: FAIL (FAILS stays)\n  record 7 (byte 90, t=1.000s) store: x\nPASS";
        let painted = paint(text);
        assert!(
            painted.contains("\x1b[1;31mREGRESSED\x1b[0m\n"),
            "{painted:?}"
        );
        assert!(
            painted.contains("\x1b[1;31mFAIL\x1b[0m (FAILS stays)"),
            "{painted:?}"
        );
        assert!(
            painted.contains("\x1b[33m  record 7 (byte 90"),
            "{painted:?}"
        );
        assert!(painted.ends_with("\x1b[32mPASS\x1b[0m"), "{painted:?}");
        let plain = painted.replace("\x1b[1;31m", "").replace("\x1b[32m", "");
        assert_eq!(plain.replace("\x1b[33m", "").replace("\x1b[0m", ""), text);
    }
}
