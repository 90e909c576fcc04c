//! Operations on whole trace files, each streaming and none loading a file into memory:
//! [`inspect`] summarises one (`kvtrace info`), [`convert`] moves it between `.lct`,
//! `.lct.zst` and lossless `.jsonl` (and migrates later schemas to schema 1), [`synth`]
//! writes a realistic synthetic one (`kvtrace generate`) and [`mooncake`] the one a Mooncake
//! request trace gives (`kvtrace generate --from-mooncake`).

#![warn(unreachable_pub)]

pub mod convert;
pub mod dump;
pub mod inspect;
pub mod mooncake;
pub mod synth;

// The crates below, under the paths this code has always used.
use kvtrace_cache::storage;
use kvtrace_io::{error, interrupt, output, rng};
use kvtrace_lmct as lmct;
use kvtrace_replay as replay;
use kvtrace_report as report;
use kvtrace_simulate as simulate;

use std::path::Path;

use crate::error::{Error, Result};
use crate::lmct::calls::StorageCall;
use crate::lmct::{Header, TraceSink, TraceWriter};
use crate::storage::config::StorageConfig;

/// Hears how far a whole-file operation has come: records done and the input's byte offset
/// (0 where there is no input file), every few thousand records.
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// How often, in records, a [`Progress`] hears.
pub const PROGRESS_EVERY: u64 = 4096;

/// A [`Progress`] that ignores everything.
pub const QUIET: Progress<'static> = &|_, _| {};

/// What a generator emits through: each call with its `t_mono`.
pub type Emit<'a> = &'a mut dyn FnMut(f64, StorageCall<'_>) -> Result<()>;

/// Writes a generated trace to any sink: `header` with `config` as its storage
/// configuration (the one the generated hits assume, so a replay without flags reproduces
/// them), then every call `generate` emits. Returns the sink and the records written.
pub fn write_calls_to<W: std::io::Write>(
    out: W,
    header: Header,
    config: &StorageConfig,
    progress: Progress<'_>,
    generate: impl FnOnce(Emit<'_>) -> Result<()>,
) -> Result<(W, u64)> {
    let mut writer = TraceWriter::new(out, header);
    let io = |e| Error::io("cannot write the trace", e);
    writer
        .attach_storage_config_value(&config.to_lmcache_json())
        .map_err(io)?;
    let t_wall_start = writer.header().t_wall_start;
    let mut args = Vec::with_capacity(4096);
    let mut records = 0u64;
    generate(&mut |t, call| {
        records += 1;
        if records.is_multiple_of(PROGRESS_EVERY) {
            progress(records, 0);
        }
        args.clear();
        call.encode_args(&mut args);
        writer
            .write_record_parts(t, t_wall_start + t, call.qualname(), &args)
            .map_err(io)
    })?;
    Ok((writer.finish().map_err(io)?, records))
}

/// [`write_calls_to`] a file (zstd-compressed when `zstd_level` is set), fsynced.
pub fn write_calls(
    path: &Path,
    zstd_level: Option<i32>,
    header: Header,
    config: &StorageConfig,
    progress: Progress<'_>,
    generate: impl FnOnce(Emit<'_>) -> Result<()>,
) -> Result<u64> {
    let shown = path.display().to_string();
    let sink = TraceSink::create(path, zstd_level).map_err(|e| e.in_file(&shown))?;
    let (sink, records) =
        write_calls_to(sink, header, config, progress, generate).map_err(|e| e.in_file(&shown))?;
    sink.finish()
        .map_err(|e| Error::io("cannot flush and fsync", e).in_file(&shown))?;
    Ok(records)
}
