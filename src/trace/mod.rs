//! Operations on whole trace files, each streaming and none loading a file into memory:
//! [`inspect`] summarises one (`kvtrace info`), [`convert`] moves it between `.lct`,
//! `.lct.zst` and lossless `.jsonl` (and migrates later schemas to schema 1), and [`synth`]
//! writes a realistic synthetic one (`kvtrace generate`).

pub mod convert;
pub mod inspect;
pub mod synth;

/// Hears how far a whole-file operation has come: records done and the input's byte offset
/// (0 where there is no input file), every few thousand records.
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// How often, in records, a [`Progress`] hears.
pub const PROGRESS_EVERY: u64 = 4096;

/// A [`Progress`] that ignores everything.
pub const QUIET: Progress<'static> = &|_, _| {};
