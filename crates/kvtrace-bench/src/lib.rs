//! `kvtrace bench`: a KV-cache storage benchmark in the manner of MLPerf Storage's, with
//! real I/O through kvtrace's tiers. [`models`] sizes entries by model; [`users`] generates
//! each simulated user's requests from the seed.

#![warn(unreachable_pub)]

pub mod autoscale;
pub mod burst;
pub mod calls;
#[cfg(feature = "redis")]
pub mod cluster;
pub mod io;
pub mod iolog;
pub mod metrics;
pub mod mlperf;
pub mod models;
pub mod plan;
pub mod rag;
pub mod report;
pub mod run;
pub mod sharegpt;
pub mod sheets;
pub mod spans;
pub mod storage_io;
pub mod suite;
pub mod tiers;
pub mod users;
