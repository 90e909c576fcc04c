//! KV offload for simulated engines: one StorageManager shared by every engine, as LMCache's
//! multiprocess server serves several vLLM instances. Admission looks the prompt's chunks up
//! (`submit_prefetch_task`), loads the part the GPU cache lacks (`read_prefetched_results`,
//! then `finish_read_prefetched` releases the pins), and a computed prompt stores the chunks
//! the store lacks (`reserve_write`, `finish_write`). Every call goes through the manager's
//! tracer, so `--record` turns a request trace into an LMCT storage trace.

use std::collections::HashMap;

use serde::Serialize;

use super::engine::{KvConnector, RequestId};
use super::summary::OffloadSummary;
use super::tier_link::{Link, LinkConfig};
use super::workload::Prompt;
use crate::lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};
use crate::rng::hash32;
use crate::storage::{KeyId, TierIo, TierStats, Traced};

/// LMCache's default chunk: 256 tokens.
pub const DEFAULT_CHUNK_TOKENS: u32 = 256;
/// Llama-3.1-8B in bf16: 32 layers × (K, V) × 8 KV heads × 128 × 2 bytes.
pub const DEFAULT_KV_BYTES_PER_TOKEN: u64 = 131_072;
const DEFAULT_LAYERS: u64 = 32;

/// How chunks are cut, sized and moved.
#[derive(Clone, Debug)]
pub struct OffloadConfig {
    pub chunk_tokens: u32,
    pub kv_bytes_per_token: u64,
    /// GB/s of a load from the store's L1 (host memory) into the GPU.
    pub l1_load_gbps: f64,
    /// GB/s of a load that had to come from an L2 tier, when `l2_link` is not given: each
    /// chunk adds its bytes over this to the pass, stores cost nothing and nothing queues.
    pub l2_load_gbps: f64,
    /// The L2 tier as a measured, shared link: loads and stores take the tier's fitted cost
    /// and wait for one of its lanes.
    pub l2_link: Option<LinkConfig>,
    /// `model_name` of every key.
    pub model_name: String,
}

impl OffloadConfig {
    /// The layout of one chunk: `[2, layers, chunk_tokens, hidden]` in bf16 when the bytes
    /// per token split that way over 32 layers, else one byte row per token.
    pub fn layout(&self) -> MemoryLayoutDesc {
        let per_layer_pair = 2 * DEFAULT_LAYERS * 2;
        let chunk = i64::from(self.chunk_tokens);
        let (shape, dtype) = if self.kv_bytes_per_token.is_multiple_of(per_layer_pair) {
            let hidden = (self.kv_bytes_per_token / per_layer_pair) as i64;
            (
                vec![2, DEFAULT_LAYERS as i64, chunk, hidden],
                "torch.bfloat16",
            )
        } else {
            (
                vec![1, 1, chunk, self.kv_bytes_per_token as i64],
                "torch.uint8",
            )
        };
        MemoryLayoutDesc {
            shapes: vec![shape],
            dtypes: vec![dtype.into()],
        }
    }

    fn chunk_bytes(&self) -> u64 {
        u64::from(self.chunk_tokens) * self.kv_bytes_per_token
    }
}

/// What the store did for the engines.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OffloadStats {
    pub lookups: u64,
    pub lookup_chunks: u64,
    pub hit_chunks: u64,
    pub l1_hit_chunks: u64,
    pub l2_hit_chunks: u64,
    /// Prompt tokens the engines took from the store instead of computing them.
    pub loaded_tokens: u64,
    pub loaded_bytes: u64,
    /// Milliseconds of load time added to passes.
    pub load_ms: f64,
    pub stored_chunks: u64,
    /// Stores refused because L1 had no room (OUT_OF_MEMORY).
    pub store_out_of_memory: u64,
}

struct Pending {
    keys: Vec<ObjectKey>,
    hit: usize,
    l1_hit: usize,
}

/// The connector every engine of a simulation shares.
pub struct Offload {
    sm: Traced,
    config: OffloadConfig,
    layout: MemoryLayoutDesc,
    requests: HashMap<RequestId, Pending>,
    stats: OffloadStats,
    /// The simulation's clock, in milliseconds, at the last [`Offload::advance_to`].
    now_ms: f64,
    link: Option<Link>,
    /// L2 objects and bytes written when the link last charged them.
    l2_charged: (u64, u64),
}

impl Offload {
    /// Recorded calls carry virtual time: the tracer's clock follows the simulation's.
    pub fn new(sm: Traced, config: OffloadConfig) -> Offload {
        Offload {
            layout: config.layout(),
            link: config.l2_link.clone().map(Link::new),
            l2_charged: sm.manager().l2_written(),
            sm,
            config,
            requests: HashMap::new(),
            stats: OffloadStats::default(),
            now_ms: 0.0,
        }
    }

    /// Puts the L2 writes the manager made since the last charge (stores, write-through
    /// copies, demotions by an eviction pass) on the link, now; they hold its lanes.
    fn charge_writes(&mut self) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let (n, bytes) = self.sm.manager().l2_written();
        let (n0, bytes0) = std::mem::replace(&mut self.l2_charged, (n, bytes));
        let (count, total) = (n - n0, bytes - bytes0);
        for i in 0..count {
            // The bytes spread over the objects, the remainder on the first ones.
            let each = total / count + u64::from(i < total % count);
            link.write(self.now_ms, each);
        }
    }

    /// Moves the store's clock (TTLs, eviction ticks, recorded times) to `ms` of virtual time.
    pub fn advance_to(&mut self, ms: f64) {
        let secs = ms / 1e3;
        self.now_ms = ms;
        self.sm.tracer().set_virtual_time(secs);
        self.sm.manager_mut().advance_to(secs);
        self.charge_writes();
    }

    /// Cuts a request's prompt into chunk keys (full chunks only).
    pub fn register(&mut self, id: RequestId, prompt: &Prompt) {
        let keys = prompt
            .block_hashes(self.config.chunk_tokens)
            .into_iter()
            .map(|h| ObjectKey {
                chunk_hash: hash32(&[h]).to_vec(),
                model_name: self.config.model_name.clone(),
                kv_rank: 0,
                object_group_id: 0,
                cache_salt: String::new(),
            })
            .collect();
        self.requests.insert(
            id,
            Pending {
                keys,
                hit: 0,
                l1_hit: 0,
            },
        );
    }

    /// Forgets a finished request.
    pub fn forget(&mut self, id: RequestId) {
        self.requests.remove(&id);
    }

    pub fn stats(&self) -> &OffloadStats {
        &self.stats
    }

    pub fn tier_stats(&self) -> Vec<TierStats> {
        self.sm.manager().tier_stats()
    }

    pub fn tier_io(&self) -> Vec<TierIo> {
        self.sm.manager().tier_io()
    }

    /// The report's offload figures: the counters, hit rates and the tier table.
    pub fn summary(&self) -> OffloadSummary {
        let s = &self.stats;
        let rate = |n: u64| {
            if s.lookup_chunks == 0 {
                0.0
            } else {
                n as f64 / s.lookup_chunks as f64
            }
        };
        OffloadSummary {
            chunk_tokens: self.config.chunk_tokens,
            lookups: s.lookups,
            lookup_chunks: s.lookup_chunks,
            hit_chunks: s.hit_chunks,
            l1_hit_chunks: s.l1_hit_chunks,
            l2_hit_chunks: s.l2_hit_chunks,
            hit_rate: rate(s.hit_chunks),
            l1_hit_rate: rate(s.l1_hit_chunks),
            l2_hit_rate: rate(s.l2_hit_chunks),
            loaded_tokens: s.loaded_tokens,
            loaded_bytes: s.loaded_bytes,
            load_ms: s.load_ms,
            stored_chunks: s.stored_chunks,
            store_out_of_memory: s.store_out_of_memory,
            tiers: self.sm.manager().tier_stats(),
            l2_link: self.link.as_ref().map(Link::summary),
        }
    }

    /// Who the requests are, as the store sees them.
    fn request_name(id: RequestId) -> String {
        format!("req-{id}")
    }
}

impl KvConnector for Offload {
    fn lookup(&mut self, id: RequestId) -> u32 {
        let Some(p) = self.requests.get_mut(&id) else {
            return 0;
        };
        if p.keys.is_empty() {
            return 0;
        }
        let spec = PrefetchTaskSpec::single_group(
            p.keys.clone(),
            self.layout.clone(),
            "prefix",
            LockMode::Lock,
        );
        let outcome = self
            .sm
            .submit_prefetch_task(&spec, &Self::request_name(id), false);
        let (hit, l1_hit) = match outcome {
            Ok(o) => (o.hit_chunks as usize, o.l1_hit_chunks as usize),
            Err(_) => (0, 0),
        };
        p.hit = hit;
        p.l1_hit = l1_hit;
        let s = &mut self.stats;
        s.lookups += 1;
        s.lookup_chunks += p.keys.len() as u64;
        s.hit_chunks += hit as u64;
        s.l1_hit_chunks += l1_hit as u64;
        s.l2_hit_chunks += (hit - l1_hit) as u64;
        hit as u32 * self.config.chunk_tokens
    }

    fn load(&mut self, id: RequestId, from: u32, tokens: u32) -> f64 {
        let Some(p) = self.requests.get_mut(&id) else {
            return 0.0;
        };
        let hit = std::mem::take(&mut p.hit);
        if hit == 0 {
            return 0.0;
        }
        let pinned = &p.keys[..hit];
        let mut ms = 0.0;
        if tokens > 0 {
            let chunk = self.config.chunk_tokens;
            let (first, last) = (from / chunk, (from + tokens).div_ceil(chunk));
            let range = first as usize..(last as usize).min(hit);
            let read = &pinned[range.clone()];
            let entered = self.sm.read_prefetched_enter(read).is_ok();
            self.sm.read_prefetched_exit(read, entered);
            if entered {
                let bytes = self.config.chunk_bytes();
                let l1 = range.clone().filter(|&c| c < p.l1_hit).count() as u64;
                let l2 = range.len() as u64 - l1;
                ms = (l1 * bytes) as f64 / (self.config.l1_load_gbps * 1e6);
                ms += match self.link.as_mut() {
                    // The L2 chunks go out at once, over the lanes; the pass waits for the last.
                    Some(link) => (0..l2)
                        .map(|_| link.read(self.now_ms, bytes) - self.now_ms)
                        .fold(0.0, f64::max),
                    None => (l2 * bytes) as f64 / (self.config.l2_load_gbps * 1e6),
                };
                self.stats.loaded_tokens += u64::from(tokens);
                self.stats.loaded_bytes += range.len() as u64 * bytes;
                self.stats.load_ms += ms;
            }
        }
        self.sm.finish_read_prefetched(pinned, 1);
        ms
    }

    fn store(&mut self, id: RequestId) {
        let Some(p) = self.requests.get(&id) else {
            return;
        };
        let fresh: Vec<ObjectKey> = p
            .keys
            .iter()
            .filter(|k| !self.sm.manager().is_resident(KeyId::of(k)))
            .cloned()
            .collect();
        if fresh.is_empty() {
            return;
        }
        let reservation = self.sm.reserve_write(&fresh, &self.layout);
        if reservation.out_of_memory {
            self.stats.store_out_of_memory += 1;
            // A reservation's evictions may have demoted objects to L2 all the same.
            self.charge_writes();
            return;
        }
        if let Ok(n) = self.sm.finish_write(&fresh) {
            self.stats.stored_chunks += n.len() as u64;
        }
        self.charge_writes();
    }
}
