//! Where a user arriving from LMCache, Dynamo or MLPerf Storage's `kv-cache.py` goes wrong on
//! the first try — a flag of the old tool, a request trace given where a storage trace goes —
//! the error says which way to go instead of only what failed.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue};
use kvtrace::error::Error;
use kvtrace::lmct::reader::{JSON_LINES_TRACE, JSON_TEXT};

/// Flags of the tools kvtrace replaces, and what to type instead.
const FOREIGN_FLAGS: &[(&[&str], &str)] = &[
    (
        &["--trace-file", "--trace", "--trace-path"],
        "kvtrace takes the trace as its first argument: kvtrace replay FILE.lct",
    ),
    (
        &[
            "--l1-manager",
            "--l1-use-lazy",
            "--l1-init-size-gb",
            "--l1-align-bytes",
            "--l1-use-hugepages",
            "--l1-devdax-path",
        ],
        "LMCache's L1 allocator settings change no hit or miss; kvtrace sizes L1 with --l1-size-gb (a GPU budget is `device = \"gpu\"` in --config)",
    ),
    (
        &["--coordinator-url", "--heartbeat-interval"],
        "kvtrace replays events traces against tiers itself, with no coordinator: kvtrace replay A.lct B.lct --l1-size-gb N",
    ),
    (
        &["--speed"],
        "kvtrace replay paces with --pace realtime --speedup N (as fast as possible by default)",
    ),
    (
        &[
            "--block-size",
            "--num-gpu-blocks",
            "--max-num-seqs",
            "--max-num-batched-tokens",
            "--engine-type",
        ],
        "engine settings are Dynamo's MockEngineArgs fields in JSON: kvtrace simulate --extra-engine-args '{\"block_size\": 512, \"num_gpu_blocks\": 16384}'",
    ),
    (
        &["--trace-shared-prefix-ratio", "--trace-num-prefix-groups"],
        "Dynamo 1.4.2 applies these to applied_compute_agentic traces only, a format kvtrace simulate does not read (see docs/commands/simulate.md)",
    ),
    (
        &["--max-sim-time-seconds"],
        "kvtrace simulate runs every request to completion; bound the input instead (a shorter trace, or --request-count for a synthetic workload)",
    ),
    (
        &[
            "--precondition",
            "--precondition-size-gb",
            "--precondition-threads",
            "--prefill-only",
            "--decode-only",
        ],
        "kv-cache.py's preconditioning and prefill-only/decode-only phases are not in kvtrace bench (see docs/commands/bench.md)",
    ),
    (
        &["--config"],
        "kvtrace bench takes kv-cache.py's settings as flags, not its YAML file; --config is replay's TOML tier configuration (see docs/commands/bench.md)",
    ),
];

/// The report flags whose path followed them as a separate word before they took the shape
/// `--json[=PATH]` (see `OutputArg`), and the commands where they did.
const SPACED_OUTPUTS: [&str; 3] = ["--json", "--csv", "--xlsx"];
const SPACED_COMMANDS: [&str; 2] = ["sweep", "aggregate"];

/// The command line with the old spelling of `sweep`'s and `aggregate`'s report flags
/// (`--json PATH`) rewritten to the new one (`--json=PATH`), so scripts written for it keep
/// working, and a deprecation note for each. Other commands had no such spelling: there the
/// word after `--json` is an input and stays one.
pub(super) fn old_spellings(mut args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let command = args
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'));
    if !command.is_some_and(|c| SPACED_COMMANDS.iter().any(|s| c == *s)) {
        return (args, Vec::new());
    }
    let mut notes = Vec::new();
    let mut i = 1;
    while i + 1 < args.len() {
        let flag = args[i].to_string_lossy().into_owned();
        if flag == "--" {
            break;
        }
        let value = args[i + 1].to_string_lossy();
        if SPACED_OUTPUTS.contains(&flag.as_str()) && !value.starts_with('-') {
            let mut joined = OsString::from(format!("{flag}="));
            joined.push(&args[i + 1]);
            notes.push(format!(
                "`{flag} PATH` is deprecated: write `{flag}=PATH` (`{flag}` alone writes the default file)"
            ));
            args[i] = joined;
            args.remove(i + 1);
        }
        i += 1;
    }
    (args, notes)
}

/// What to type instead of the unknown flag a clap error names, when it is a known one of
/// another tool.
pub(super) fn foreign_flag(e: &clap::Error) -> Option<(String, &'static str)> {
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split('=').next().unwrap_or(arg);
    FOREIGN_FLAGS
        .iter()
        .find(|(flags, _)| flags.contains(&flag))
        .map(|(_, hint)| (flag.to_owned(), *hint))
}

/// What to do with a JSON file given where an LMCT trace goes.
pub(super) fn json_input(e: &Error) -> Option<&'static str> {
    match e.message.as_str() {
        m if m == JSON_LINES_TRACE => Some(
            "convert it back first: kvtrace convert FILE.jsonl FILE.lct",
        ),
        m if m == JSON_TEXT => Some(
            "a request trace (Mooncake JSONL) is the input of kvtrace simulate, or of kvtrace generate OUT.lct --from-mooncake FILE for a storage trace",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[arg(long)]
        l1_size_gb: Option<f64>,
    }

    #[test]
    fn a_foreign_flag_gets_its_hint_and_ours_do_not() {
        for (args, hint) in [
            (vec!["x", "--block-size", "16"], Some("--block-size")),
            (vec!["x", "--trace-file=t.lct"], Some("--trace-file")),
            (
                vec!["x", "--trace-num-prefix-groups", "4"],
                Some("--trace-num-prefix-groups"),
            ),
            (vec!["x", "--config", "bench.yaml"], Some("--config")),
            (vec!["x", "--no-such-flag"], None),
        ] {
            let e = Cli::command().try_get_matches_from(args).unwrap_err();
            assert_eq!(foreign_flag(&e).map(|(flag, _)| flag).as_deref(), hint);
        }
    }
}
