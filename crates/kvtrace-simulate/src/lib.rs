//! `kvtrace simulate`: request traces through simulated serving engines. Workloads
//! ([`workload`]: synthetic ones, Mooncake traces read by [`mooncake`], agentic request
//! graphs by [`agentic`], Weka agent traces by [`weka`], Dynamo's request traces by
//! [`dynamo_trace`]) arrive on a virtual
//! clock ([`event_loop`]), a router ([`router`]) places them on mock engines ([`engine`]: vLLM
//! and TRT-LLM in [`vllm`] with the KV pool of [`blocks`], SGLang in [`sglang`] with the radix
//! cache of [`radix`], both timed by [`perf`]), disaggregated serving hands requests from
//! prefill to decode workers ([`handoff`]), and the [`collector`] turns what happened into the
//! [`summary`] and the [`report`]. With [`offload`], the engines share a StorageManager whose
//! calls can be recorded as LMCT, its L2 tier timed as a shared link ([`tier_link`]).

#![warn(unreachable_pub)]

pub mod agentic;
pub mod agentic_identity;
pub mod args;
pub mod blocks;
pub mod collector;
pub mod dynamo_trace;
pub mod engine;
pub mod event_loop;
pub mod handoff;
pub mod lifecycle;
pub mod live;
pub mod mooncake;
pub mod offload;
pub mod perf;
pub mod plan;
pub mod radix;
pub mod report;
pub mod router;
pub mod sglang;
pub mod sketch;
pub mod spans;
pub mod summary;
pub mod tier_link;
pub mod vllm;
pub mod weka;
pub mod workload;

// The crates below, under the paths this code has always used.
use error::{Error, Result};
use kvtrace_cache::{bus, storage};
use kvtrace_io::{error, interrupt, limits, rng};
use kvtrace_lmct as lmct;
use kvtrace_otel as otel;

/// Block hashes are xxh3 digests already: maps keyed by them fold the value itself.
type BlockHashBuild = std::hash::BuildHasherDefault<crate::storage::KeyIdHasher>;
/// A map keyed by block hash.
pub type BlockMap<V> = std::collections::HashMap<u64, V, BlockHashBuild>;
/// A set of block hashes.
pub type BlockSet = std::collections::HashSet<u64, BlockHashBuild>;
