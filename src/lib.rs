//! kvtrace: record, inspect, convert and replay the KV-cache storage traffic of LLM serving.
//!
//! The library does the work; the `kvtrace` binary only wires these modules to a command
//! line. [`lmct`] is the trace format, [`bus`] the event bus and recorder, [`inspect`] the
//! trace summary behind `kvtrace info`, [`convert`] the format conversions, and [`synth`] a
//! generator of realistic storage traces for tests and benchmarks.

pub mod bus;
pub mod clock;
pub mod convert;
pub mod error;
pub mod inspect;
pub mod lmct;
pub mod rng;
pub mod synth;

pub use error::{Error, Result};
