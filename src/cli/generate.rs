//! `kvtrace generate`.

use std::path::PathBuf;

use kvtrace::error::{Error, EXIT_OK};
use kvtrace::trace::mooncake::{self, MooncakeOptions};
use kvtrace::trace::synth::{write_file, SynthOptions};

use super::progress::Progress;

#[derive(clap::Args)]
#[command(
    after_help = super::examples(&[
        "kvtrace generate big.lct --records 1000000",
        "kvtrace generate small.lct.zst --records 5000 --seed 7",
        "kvtrace generate mc.lct --from-mooncake conversation_trace.jsonl --loops 10",
    ])
)]
pub(super) struct Args {
    /// Output file; a name ending in .zst is zstd-compressed
    #[arg(value_name = "OUT")]
    out: PathBuf,
    /// Number of records to write
    #[arg(long, default_value_t = 100_000, conflicts_with = "from_mooncake")]
    records: u64,
    /// Seed of the workload
    #[arg(long, default_value_t = 1, conflicts_with = "from_mooncake")]
    seed: u64,
    /// Tokens per chunk
    #[arg(long, default_value_t = 256, conflicts_with = "from_mooncake")]
    chunk_tokens: i64,
    /// Conversations in flight at once (at most 1,000,000: each is held from the start)
    #[arg(long, default_value_t = 64, conflicts_with = "from_mooncake",
          value_parser = clap::value_parser!(u64).range(..=1_000_000))]
    conversations: u64,
    /// A Mooncake JSONL request trace: per request a lookup of its chunks (one 512-token
    /// chunk per hash_id), a read of the prefix the L1 holds, a write of the rest; records
    /// 1 µs apart
    #[arg(long, value_name = "TRACE", help_heading = "From a request trace")]
    from_mooncake: Option<PathBuf>,
    /// Passes over the request trace, each with its own keys
    #[arg(
        long,
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..),
        requires = "from_mooncake",
        help_heading = "From a request trace"
    )]
    loops: u32,
    /// Chunks the modelled LRU L1 holds (the header records it, so a replay reproduces the hits)
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2048,
        value_parser = clap::value_parser!(u64).range(1..),
        requires = "from_mooncake",
        help_heading = "From a request trace"
    )]
    l1_chunks: u64,
    /// MiB per chunk
    #[arg(
        long,
        value_name = "M",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..=1 << 20),
        requires = "from_mooncake",
        help_heading = "From a request trace"
    )]
    chunk_mib: u64,
    /// zstd level for .zst output
    #[arg(long, default_value_t = 3)]
    zstd_level: i32,
}

pub(super) fn run(args: Args) -> Result<i32, Error> {
    let zstd = args.out.to_string_lossy().ends_with(".zst");
    crate::cli::guard(args.from_mooncake.as_deref(), [args.out.as_path()])?;
    if let Some(input) = &args.from_mooncake {
        let options = MooncakeOptions {
            loops: args.loops,
            l1_chunks: args.l1_chunks,
            chunk_mib: args.chunk_mib,
            ..MooncakeOptions::default()
        };
        let bar = Progress::records(true);
        let written = mooncake::write_file(
            &options,
            input,
            &args.out,
            zstd.then_some(args.zstd_level),
            &|n, at| bar.set(n, at),
        );
        bar.finish();
        return finished(&args, written?);
    }
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
    let bar = Progress::writing(args.records, true);
    let written = write_file(
        &options,
        &args.out,
        zstd.then_some(args.zstd_level),
        &|n, at| bar.set(n, at),
    );
    bar.finish();
    written?;
    finished(&args, args.records)
}

/// Says what was written, or that a signal cut it short.
fn finished(args: &Args, records: u64) -> Result<i32, Error> {
    if let Some(status) = kvtrace::interrupt::exit_status() {
        eprintln!(
            "kvtrace: interrupted: {} holds the records written so far",
            args.out.display()
        );
        return Ok(status);
    }
    eprintln!("kvtrace: wrote {records} records to {}", args.out.display());
    Ok(EXIT_OK)
}
