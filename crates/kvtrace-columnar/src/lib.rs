//! kvtrace's columnar layer. A trace becomes Arrow record batches ([`trace::TraceBatches`]:
//! one row per record, or one per key, streamed in bounded memory on every core) and a
//! report's tables become one batch each ([`table::to_batch`]); [`write`](mod@write) puts
//! batches into Parquet or Arrow IPC files, and [`table::Parquet`] is the report layer's
//! Parquet exporter.
//! The Python module and every `--parquet` output go through here.

#![warn(unreachable_pub)]

pub mod table;
pub mod trace;
pub mod write;

pub use arrow_array::{RecordBatch, RecordBatchReader};
pub use table::Parquet;
pub use trace::{Column, TraceBatches, View};
pub use write::{write_trace, BatchWriter, Format, TraceWritten};
