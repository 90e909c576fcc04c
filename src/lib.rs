//! kvtrace: record, inspect, convert and replay the KV-cache storage traffic of LLM serving.
//!
//! The library does the work, in crates of one job each; this crate gathers them under one
//! name, and the `kvtrace` binary beside it only turns flags into their objects. [`lmct`] is
//! the trace format (crate `kvtrace-lmct`); [`error`], [`output`], [`interrupt`] and
//! [`limits`] are the file and process plumbing (`kvtrace-io`); [`bus`] is the event bus and
//! recorder and [`storage`] the tiered StorageManager (`kvtrace-cache`); [`report`] is the one
//! export layer every command writes through (`kvtrace-report`); [`trace`] holds the
//! whole-file operations (`kvtrace-trace`); [`replay`], [`simulate`] and
//! [`bench`](mod@crate::bench) are the three engines (`kvtrace-replay`, `kvtrace-simulate`,
//! `kvtrace-bench`), [`sweep`] runs them over many configurations (`kvtrace-sweep`), and
//! [`rank`] with [`aggregate`] runs them as many processes (`kvtrace-rank`).
//!
//! Writing a trace LMCache 0.5.6 reads, and streaming it back:
//!
//! ```
//! use kvtrace::lmct::calls::StorageCall;
//! use kvtrace::lmct::codec::ObjectKey;
//! use kvtrace::lmct::{Header, ReadOptions, TraceReader, TraceWriter};
//!
//! let key = ObjectKey {
//!     chunk_hash: vec![7; 32],
//!     model_name: "demo/model".into(),
//!     kv_rank: 16_777_472,
//!     object_group_id: 0,
//!     cache_salt: String::new(),
//! };
//! let call = StorageCall::FinishWrite { keys: &[key] };
//! let mut args = Vec::new();
//! call.encode_args(&mut args);
//!
//! let mut writer = TraceWriter::new(Vec::new(), Header::storage(100.0, 1.7e9));
//! writer.attach_storage_config("{}")?;
//! writer.write_record_parts(0.25, 1.7e9 + 0.25, call.qualname(), &args)?;
//! let bytes = writer.finish()?;
//!
//! let mut reader = TraceReader::from_reader(std::io::Cursor::new(bytes), ReadOptions::default())?;
//! assert_eq!(reader.header().sm_config_digest.len(), 64);
//! let record = reader.next_record()?.expect("one record");
//! assert_eq!(record.qualname, call.qualname());
//! assert_eq!(record.args.bytes(), &args[..]);
//! assert!(reader.next_record()?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(unreachable_pub)]

// The crates, under the paths the library has always had.
pub use kvtrace_bench as bench;
pub use kvtrace_cache::{bus, clock, storage};
#[cfg(feature = "parquet")]
pub use kvtrace_columnar as columnar;
pub use kvtrace_io::{error, interrupt, limits, machine, output, rng};
pub use kvtrace_lmct as lmct;
pub use kvtrace_metrics as metrics;
pub use kvtrace_otel as otel;
pub use kvtrace_rank as rank;
pub use kvtrace_rank::aggregate;
pub use kvtrace_replay as replay;
pub use kvtrace_report as report;
pub use kvtrace_simulate as simulate;
pub use kvtrace_sweep as sweep;
pub use kvtrace_trace as trace;

pub use error::{Error, Result};

/// The README's code blocks, compiled and run as doc-tests so its examples stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The library page's code blocks, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/library.md")]
pub struct LibraryDoctests;
