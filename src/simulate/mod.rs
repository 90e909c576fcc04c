//! `kvtrace simulate`: request traces through simulated serving engines. Workloads
//! ([`workload`]) arrive on a virtual clock ([`offline`]), a router ([`router`]) places them
//! on mock engines ([`engine`], with the KV pool of [`blocks`] and the timing of [`perf`]),
//! and the [`collector`] turns what happened into the report [`output`] prints.

pub mod args;
pub mod blocks;
pub mod collector;
pub mod engine;
pub mod offline;
pub mod output;
pub mod perf;
pub mod router;
pub mod sketch;
pub mod workload;
