//! The LMCT trace format: LMCache's storage-trace files, read in every variant LMCache has
//! written and written exactly as LMCache 0.5.6 does. `format-spec/LMCT.md` is the
//! normative description; this module follows it section by section.

#![warn(unreachable_pub)]

pub mod args;
pub mod blocks;
pub mod calls;
pub mod codec;
pub mod digest;
pub mod display;
pub mod frame;
pub mod json;
pub mod msgpack;
pub mod pyjson;
pub mod reader;
pub mod schema;
pub mod value;
pub mod writer;

pub use frame::{Header, HeaderSchema, Record, RecordRef};
pub use reader::{Frame, ReadOptions, ReadSummary, TraceReader, Truncation};
pub use value::{Form, Value};
pub use writer::{write_frame, TraceSink, TraceWriter};

/// Value of the header's `magic` field (a msgpack bin, not a file prefix).
pub const MAGIC: &[u8; 4] = b"LMCT";

/// The only framing version LMCache has written.
pub const FORMAT_VERSION: i64 = 1;

/// The schema kvtrace writes: LMCache 0.5.6's.
pub const WRITE_SCHEMA_VERSION: i64 = 1;
