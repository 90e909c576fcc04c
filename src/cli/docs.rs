//! `kvtrace completions` and `kvtrace man`: the shell completion script and the man pages,
//! all generated from the same command definitions as `--help`, so they never drift.

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;
use kvtrace::error::{Error, EXIT_OK};

use super::{print_stdout, Cli};

/// Print a shell completion script
#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "kvtrace completions bash > ~/.local/share/bash-completion/completions/kvtrace",
    "kvtrace completions zsh > ~/.zfunc/_kvtrace",
    "kvtrace completions fish > ~/.config/fish/completions/kvtrace.fish",
]))]
pub(super) struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    shell: Shell,
}

/// Write the man pages: kvtrace.1 and one kvtrace-COMMAND.1 per command
#[derive(clap::Args)]
#[command(after_help = super::examples(&[
    "kvtrace man ~/.local/share/man/man1 && man kvtrace-replay",
]))]
pub(super) struct ManArgs {
    /// Directory the pages go to (created when missing)
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

pub(super) fn completions(args: CompletionsArgs) -> Result<i32, Error> {
    let mut command = Cli::command();
    // Into memory first: clap_complete panics on a failed write, and `| head` closes stdout.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "kvtrace", &mut script);
    print_stdout(&String::from_utf8_lossy(&script))?;
    Ok(EXIT_OK)
}

pub(super) fn man(args: ManArgs) -> Result<i32, Error> {
    let shown = args.dir.display().to_string();
    kvtrace::output::create_dir(&args.dir)?;
    clap_mangen::generate_to(Cli::command(), &args.dir)
        .map_err(|e| Error::io("cannot write the man pages", e).in_file(&shown))?;
    eprintln!("kvtrace: wrote the man pages to {shown}");
    Ok(EXIT_OK)
}
