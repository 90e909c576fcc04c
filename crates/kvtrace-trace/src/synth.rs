//! A generator of realistic storage traces, for tests, benchmarks and users who want a large
//! trace without a server: multi-turn conversations over shared system prompts, issued the
//! way an LMCache server issues StorageManager calls (lookup → `submit_prefetch_task`; a hit
//! prefix → `read_prefetched_results` enter/exit and `finish_read_prefetched`; the new chunks
//! → `reserve_write` and `finish_write`). Same options and seed, same bytes.

use std::collections::HashSet;
use std::path::Path;

use serde::Serialize;

use super::Progress;
use crate::error::Result;
use crate::lmct::calls::StorageCall;
use crate::lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};
use crate::lmct::Header;
use crate::rng::{hash32, SplitMix64};
use crate::storage::config::{EvictionTiming, StorageConfig};

#[derive(Clone, Debug, Serialize)]
pub struct SynthOptions {
    pub records: u64,
    pub seed: u64,
    pub model_name: String,
    /// Tokens per chunk (dimension 2 of the layout).
    pub chunk_tokens: i64,
    pub num_layers: i64,
    /// KV hidden size per token and layer (heads × head_dim).
    pub hidden: i64,
    /// Conversations in flight at once.
    pub conversations: u64,
    /// Distinct system prompts shared across conversations.
    pub system_prompts: u64,
    /// Chunks in each system prompt.
    pub system_prompt_chunks: u64,
    /// New chunks a turn adds, at most.
    pub max_turn_chunks: u64,
    /// A conversation ends once its prompt reaches this many chunks.
    pub max_prompt_chunks: u64,
    /// Mean gap between requests, in seconds.
    pub mean_gap_s: f64,
    /// Recorded time before the first call (server start-up).
    pub startup_gap_s: f64,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            records: 100_000,
            seed: 1,
            model_name: "meta-llama/Llama-3.1-8B".into(),
            chunk_tokens: 256,
            num_layers: 32,
            hidden: 1024,
            conversations: 64,
            system_prompts: 8,
            system_prompt_chunks: 2,
            max_turn_chunks: 3,
            max_prompt_chunks: 12,
            mean_gap_s: 0.002,
            startup_gap_s: 3.0,
        }
    }
}

impl SynthOptions {
    /// Every chunk's layout: K and V, every layer, `chunk_tokens` × `hidden`, bfloat16.
    pub fn layout(&self) -> MemoryLayoutDesc {
        MemoryLayoutDesc {
            shapes: vec![vec![2, self.num_layers, self.chunk_tokens, self.hidden]],
            dtypes: vec!["torch.bfloat16".into()],
        }
    }

    /// The storage configuration whose hits the generator writes: an L1 that never evicts
    /// (every chunk written stays resident), as large as every chunk the trace could write,
    /// and so kept as accounting only — no machine holds it in memory. It is what the
    /// trace's header records, so `kvtrace replay` of a generated trace reproduces its hits.
    pub fn storage_config(&self) -> StorageConfig {
        let per_request = self.system_prompt_chunks + self.max_prompt_chunks + self.max_turn_chunks;
        let align = StorageConfig::default().l1_align_bytes;
        let object = self.layout().object_bytes().unwrap_or(0);
        let object = object.div_ceil(align).saturating_mul(align);
        let mut config = StorageConfig {
            l1_size_bytes: self
                .records
                .saturating_mul(per_request)
                .saturating_mul(object)
                .max(object),
            l1_buffers: false,
            ..StorageConfig::default()
        };
        config.eviction.timing = EvictionTiming::Immediate;
        config
    }
}

struct Conversation {
    id: u64,
    system: u64,
    chunks: u64,
}

/// Calls `emit(t_mono, call)` for exactly `options.records` calls.
pub fn generate(
    options: &SynthOptions,
    mut emit: impl FnMut(f64, StorageCall<'_>) -> Result<()>,
) -> Result<()> {
    let mut rng = SplitMix64::new(options.seed);
    let layout = options.layout();
    let key = |parts: &[u64]| ObjectKey::single_rank(hash32(parts).to_vec(), &options.model_name);
    let mut resident: HashSet<Vec<u8>> = HashSet::new();
    let mut next_id = 0u64;
    let mut new_conversation = |rng: &mut SplitMix64| {
        next_id += 1;
        Conversation {
            id: next_id,
            system: rng.range(0, options.system_prompts.max(1) - 1),
            chunks: 0,
        }
    };
    let mut live: Vec<Conversation> = (0..options.conversations.max(1))
        .map(|_| new_conversation(&mut rng))
        .collect();
    let mut t = options.startup_gap_s;
    let mut left = options.records;
    let mut request = 0u64;
    // A signal ends the trace early, at a record boundary (see `crate::interrupt`).
    let mut send = |t: f64, call: StorageCall<'_>, left: &mut u64| -> Result<bool> {
        if crate::interrupt::requested().is_some() {
            *left = 0;
        }
        if *left == 0 {
            return Ok(false);
        }
        emit(t, call)?;
        *left -= 1;
        Ok(*left > 0)
    };
    while left > 0 {
        let slot = rng.range(0, live.len() as u64 - 1) as usize;
        let conv = &mut live[slot];
        conv.chunks += rng.range(1, options.max_turn_chunks.max(1));
        let total = options.system_prompt_chunks + conv.chunks;
        let keys: Vec<ObjectKey> = (0..total)
            .map(|i| {
                if i < options.system_prompt_chunks {
                    key(&[0, conv.system, i])
                } else {
                    key(&[1, conv.id, i])
                }
            })
            .collect();
        if conv.chunks + options.system_prompt_chunks >= options.max_prompt_chunks {
            *conv = new_conversation(&mut rng);
        }
        request += 1;
        let spec =
            PrefetchTaskSpec::single_group(keys.clone(), layout.clone(), "prefix", LockMode::Lock);
        let request_id = format!("req-{request:08x}");
        t += rng.exp(options.mean_gap_s);
        let lookup = StorageCall::SubmitPrefetchTask {
            spec: &spec,
            external_request_id: &request_id,
            skip_l2: false,
        };
        if !send(t, lookup, &mut left)? {
            break;
        }
        let hits = keys
            .iter()
            .take_while(|k| resident.contains(&k.chunk_hash))
            .count();
        let (hit, miss) = keys.split_at(hits);
        if !hit.is_empty() {
            for call in StorageCall::read_prefetched(hit) {
                t += rng.exp(options.mean_gap_s / 20.0);
                if !send(t, call, &mut left)? {
                    return Ok(());
                }
            }
        }
        if !miss.is_empty() {
            t += rng.exp(options.mean_gap_s / 4.0);
            let reserve = StorageCall::ReserveWrite {
                keys: miss,
                layout_desc: &layout,
            };
            if !send(t, reserve, &mut left)? {
                break;
            }
            t += rng.exp(options.mean_gap_s / 4.0);
            if !send(t, StorageCall::FinishWrite { keys: miss }, &mut left)? {
                break;
            }
            resident.extend(miss.iter().map(|k| k.chunk_hash.clone()));
        }
    }
    Ok(())
}

/// The header a synthetic trace carries: times fixed by the options, so the file is
/// reproducible byte for byte.
pub fn header(options: &SynthOptions) -> Header {
    Header::storage(1000.0, 1_790_000_000.0 + options.seed as f64)
}

/// Writes a synthetic trace to any sink; returns the sink.
pub fn write_to<W: std::io::Write>(
    options: &SynthOptions,
    out: W,
    progress: Progress<'_>,
) -> Result<W> {
    let config = options.storage_config();
    let (out, _) = super::write_calls_to(out, header(options), &config, progress, |emit| {
        generate(options, emit)
    })?;
    Ok(out)
}

/// Writes a synthetic trace file (zstd-compressed when `zstd_level` is set) and fsyncs it.
pub fn write_file(
    options: &SynthOptions,
    path: &Path,
    zstd_level: Option<i32>,
    progress: Progress<'_>,
) -> Result<()> {
    let config = options.storage_config();
    super::write_calls(
        path,
        zstd_level,
        header(options),
        &config,
        progress,
        |emit| generate(options, emit),
    )
    .map(|_| ())
}
