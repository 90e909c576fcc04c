//! kvtrace's integration tests, one binary (as ripgrep's are): a module per crate or concern,
//! each file a concern within it, every file sharing the fixtures of [`util`]. One binary
//! links once, where twenty linked twenty times.
//!
//! Tests that compare against `../shared` (real LMCache, Dynamo and MLPerf recordings) skip
//! with a message when it is absent; CI always has it.

mod util;

/// The trace format: spec vectors, damaged input, schema variants, LMCache's own files.
mod lmct {
    mod lmcache_samples;
    mod reader_robustness;
    mod schema_and_digest;
    mod spec_vectors;
}

/// The tiered StorageManager's tiers and the event bus's recorder.
mod cache {
    mod async_io;
    mod file_tier;
    mod recorder;
    mod redis_tier;
    mod s3_tier;
}

/// Replay: counts, fidelity against real servers, request spans.
mod replay {
    mod counts;
    pub(crate) mod fidelity;
    mod otel;
    mod prometheus;
}

/// The serving simulation, and parity with Dynamo's and AISimulate's own reports.
mod simulate {
    pub(crate) mod engines;
    mod live_metrics;
    mod offload_link;
    mod prediction;
    mod reference_reports;
    mod trace_formats;
    mod weka;
}

/// The storage benchmark: kv-cache.py's run and outputs, MLPerf Storage's Options.
mod bench {
    mod kv_cache_py;
    mod mlperf;
    mod storage_io;
}

mod plan;
mod scale_out;
mod sweep;

/// The export layer: golden outputs, the workbook read back.
mod report {
    mod golden;
    mod xlsx_export;
}

/// Columnar outputs: traces and report tables as Parquet and Arrow, read back.
#[cfg(feature = "parquet")]
mod columnar {
    mod parquet;
}

/// The binary as users meet it: commands, exit codes, hostile input, fuzzing.
mod cli {
    mod commands;
    mod fuzz;
    mod hostile;
    mod reliability;
}
