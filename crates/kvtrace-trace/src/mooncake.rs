//! A Mooncake request trace turned into the storage trace an LMCache server would record for
//! it, in seconds and without a serving simulation (`kvtrace generate --from-mooncake`).
//!
//! Each request looks up its chunks (`submit_prefetch_task` of every key; one 512-token
//! chunk per `hash_id`), reads the prefix an LRU model of an L1 of `l1_chunks` chunks holds
//! (`read_prefetched_results` enter/exit and `finish_read_prefetched`, which make those chunks
//! the most recently used), then stores (`reserve_write` of every key, `finish_write` of the
//! ones that were not resident, left out when there are none). Chunk hashes are 32 bytes
//! derived from the loop and the hash id, so loops never share keys. Records are 1 µs apart.
//! The header records the configuration the model is: an LRU L1 of exactly `l1_chunks`
//! chunks that evicts immediately, one chunk at a time, so a replay without flags reproduces
//! every hit.

use std::collections::HashSet;

use lru::LruCache;
use std::path::Path;

use super::Progress;
use crate::error::{Error, Result};
use crate::lmct::calls::StorageCall;
use crate::lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};
use crate::lmct::Header;
use crate::rng::hash32;
use crate::simulate::mooncake::read_mooncake_hash_ids;
use crate::storage::config::{EvictionTiming, StorageConfig};
use crate::storage::eviction::PolicyKind;

/// Tokens per chunk: one Mooncake `hash_id` covers 512 tokens.
pub const CHUNK_TOKENS: i64 = 512;

/// Gap between consecutive records, in seconds.
const RECORD_GAP_S: f64 = 1e-6;

#[derive(Clone, Debug)]
pub struct MooncakeOptions {
    /// Passes over the request trace; each pass has its own keys.
    pub loops: u32,
    /// Chunks the modelled L1 holds.
    pub l1_chunks: u64,
    /// MiB per chunk.
    pub chunk_mib: u64,
    pub model_name: String,
}

impl Default for MooncakeOptions {
    fn default() -> Self {
        MooncakeOptions {
            loops: 1,
            l1_chunks: 2048,
            chunk_mib: 1,
            model_name: "meta-llama/Llama-3.1-8B".into(),
        }
    }
}

impl MooncakeOptions {
    pub fn validate(&self) -> Result<()> {
        if self.loops == 0 || self.l1_chunks == 0 || self.chunk_mib == 0 {
            return Err(Error::usage(
                "loops, L1 chunks and MiB per chunk must be at least 1",
            ));
        }
        if self.chunk_mib > 1 << 20 {
            return Err(Error::usage("a chunk is at most 1048576 MiB (1 TiB)"));
        }
        Ok(())
    }

    /// One chunk: K and V of 4 layers, 512 tokens, `128 × chunk_mib` wide, bfloat16 —
    /// exactly `chunk_mib` MiB.
    pub fn layout(&self) -> MemoryLayoutDesc {
        MemoryLayoutDesc {
            shapes: vec![vec![2, 4, CHUNK_TOKENS, 128 * self.chunk_mib as i64]],
            dtypes: vec!["torch.bfloat16".into()],
        }
    }

    /// The configuration the hits assume: an LRU L1 of `l1_chunks` chunks that evicts
    /// exactly as many chunks as a write needs, when it needs them.
    pub fn storage_config(&self) -> StorageConfig {
        let mut config = StorageConfig {
            l1_size_bytes: self.l1_chunks.saturating_mul(self.chunk_mib << 20),
            ..StorageConfig::default()
        };
        config.eviction.policy = PolicyKind::Lru;
        config.eviction.timing = EvictionTiming::Immediate;
        config
    }
}

/// A chunk: the loop it belongs to and its Mooncake hash id.
type Chunk = (u64, u64);

/// The L1 the generator models, as LMCache's LRU keeps it: least recently used first out,
/// `capacity` chunks; a batch (a read's hit prefix, a write's new chunks) is applied last
/// chunk first, so a prompt's tail is evicted before its prefix.
struct Lru {
    capacity: usize,
    chunks: LruCache<Chunk, ()>,
}

impl Lru {
    fn new(capacity: u64) -> Lru {
        Lru {
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
            chunks: LruCache::unbounded(),
        }
    }

    fn contains(&self, chunk: &Chunk) -> bool {
        self.chunks.contains(chunk)
    }

    /// A read of resident chunks.
    fn read(&mut self, chunks: &[Chunk]) {
        for c in chunks.iter().rev() {
            self.chunks.promote(c);
        }
    }

    /// A write of absent chunks: evicts the least recently used until they fit, then admits
    /// them. When they cannot fit at all, everything has gone by then and the all-or-nothing
    /// allocation answers OUT_OF_MEMORY: nothing is admitted and false says the write is
    /// never finished.
    fn write(&mut self, chunks: &[Chunk]) -> bool {
        while self.chunks.len() + chunks.len() > self.capacity {
            if self.chunks.pop_lru().is_none() {
                return false;
            }
        }
        for &c in chunks.iter().rev() {
            self.chunks.put(c, ());
        }
        true
    }
}

/// Calls `emit(t_mono, call)` for every record the requests (each its hash ids) give, in
/// order.
pub fn generate(
    options: &MooncakeOptions,
    requests: &[Vec<u64>],
    mut emit: impl FnMut(f64, StorageCall<'_>) -> Result<()>,
) -> Result<()> {
    let layout = options.layout();
    let mut lru = Lru::new(options.l1_chunks);
    let mut record = 0u64;
    let mut send = |call: StorageCall<'_>| -> Result<()> {
        let t = record as f64 * RECORD_GAP_S;
        record += 1;
        emit(t, call)
    };
    let mut request = 0u64;
    for pass in 0..u64::from(options.loops) {
        for hash_ids in requests {
            // A signal ends the trace early, at a request boundary (see `crate::interrupt`).
            if crate::interrupt::requested().is_some() {
                return Ok(());
            }
            request += 1;
            let chunks: Vec<Chunk> = hash_ids.iter().map(|&h| (pass, h)).collect();
            let keys: Vec<ObjectKey> = chunks
                .iter()
                .map(|&(pass, h)| {
                    ObjectKey::single_rank(hash32(&[2, pass, h]).to_vec(), &options.model_name)
                })
                .collect();
            let spec = PrefetchTaskSpec::single_group(
                keys.clone(),
                layout.clone(),
                "prefix",
                LockMode::Lock,
            );
            let request_id = format!("req-{request:08x}");
            send(StorageCall::SubmitPrefetchTask {
                spec: &spec,
                external_request_id: &request_id,
                skip_l2: false,
            })?;
            let hits = chunks.iter().take_while(|c| lru.contains(c)).count();
            if hits > 0 {
                for call in StorageCall::read_prefetched(&keys[..hits]) {
                    send(call)?;
                }
                lru.read(&chunks[..hits]);
            }
            send(StorageCall::ReserveWrite {
                keys: &keys,
                layout_desc: &layout,
            })?;
            let mut seen = HashSet::new();
            let (fresh, written): (Vec<Chunk>, Vec<ObjectKey>) = chunks
                .iter()
                .zip(&keys)
                .filter(|(c, _)| !lru.contains(c) && seen.insert(**c))
                .map(|(c, k)| (*c, k.clone()))
                .unzip();
            if !fresh.is_empty() && lru.write(&fresh) {
                send(StorageCall::FinishWrite { keys: &written })?;
            }
        }
    }
    Ok(())
}

/// The header a generated trace carries: fixed times, so the same input and options give
/// the same bytes.
fn header() -> Header {
    Header::storage(1000.0, 1_790_000_000.0)
}

/// Reads the Mooncake trace at `input` and writes its storage trace to `output`
/// (zstd-compressed when `zstd_level` is set), fsynced; returns the records written.
pub fn write_file(
    options: &MooncakeOptions,
    input: &Path,
    output: &Path,
    zstd_level: Option<i32>,
    progress: Progress<'_>,
) -> Result<u64> {
    options.validate()?;
    let shown = input.display().to_string();
    let file =
        std::fs::File::open(input).map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
    let requests =
        read_mooncake_hash_ids(std::io::BufReader::new(file)).map_err(|e| e.in_file(&shown))?;
    let config = options.storage_config();
    super::write_calls(output, zstd_level, header(), &config, progress, |emit| {
        generate(options, &requests, emit)
    })
}
