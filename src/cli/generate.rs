//! `kvtrace generate`.

use std::path::PathBuf;

use kvtrace::error::{Error, EXIT_OK};
use kvtrace::trace::synth::{write_file, SynthOptions};

use super::progress::Progress;

/// Write a realistic synthetic storage trace (multi-turn conversations over shared system
/// prompts, issued as an LMCache server issues StorageManager calls); same seed, same bytes
#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace generate big.lct --records 1000000",
        "kvtrace generate small.lct.zst --records 5000 --seed 7",
    ])
)]
pub struct Args {
    /// Output file; a name ending in .zst is zstd-compressed
    #[arg(value_name = "OUT")]
    out: PathBuf,
    /// Number of records to write
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Seed of the workload
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Tokens per chunk
    #[arg(long, default_value_t = 256)]
    chunk_tokens: i64,
    /// Conversations in flight at once
    #[arg(long, default_value_t = 64)]
    conversations: u64,
    /// zstd level for .zst output
    #[arg(long, default_value_t = 3)]
    zstd_level: i32,
}

pub fn run(args: Args) -> Result<i32, Error> {
    if args.chunk_tokens <= 0 || args.conversations == 0 {
        return Err(Error::usage(
            "--chunk-tokens and --conversations must be positive",
        ));
    }
    let options = SynthOptions {
        records: args.records,
        seed: args.seed,
        chunk_tokens: args.chunk_tokens,
        conversations: args.conversations,
        ..SynthOptions::default()
    };
    let zstd = args.out.to_string_lossy().ends_with(".zst");
    let bar = Progress::writing(args.records, true);
    let written = write_file(
        &options,
        &args.out,
        zstd.then_some(args.zstd_level),
        &|n, at| bar.set(n, at),
    );
    bar.finish();
    written?;
    if let Some(status) = kvtrace::interrupt::exit_status() {
        eprintln!(
            "kvtrace: interrupted: {} holds the records written so far",
            args.out.display()
        );
        return Ok(status);
    }
    eprintln!(
        "kvtrace: wrote {} records to {}",
        args.records,
        args.out.display()
    );
    Ok(EXIT_OK)
}
