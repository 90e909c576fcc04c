//! A StorageManager with LMCache's semantics over a tier hierarchy: L1 (the memory pool every
//! object passes through) and any number of L2 tiers written through from it.
//!
//! It exists so that a recorded trace can be re-issued against another configuration and the
//! cache's behaviour — hits, misses, OUT_OF_MEMORY, evictions, bytes per tier — observed. It
//! is deterministic: time is the trace's time (set with [`StorageManager::advance_to`]), a
//! prefetch completes inside `submit_prefetch_task`, and every policy orders by logical
//! stamps. Driven through the [`Traced`] facade, every call is published on the event bus in
//! LMCache's argument shape, so a kvtrace-driven manager records LMCT like an LMCache server
//! does.

pub mod arena;
pub mod backend;
#[cfg(feature = "redis")]
pub mod cluster;
pub mod config;
mod cost_fit;
pub mod eviction;
pub mod file;
mod io_queue;
mod l1;
mod l2;
mod manager;
pub mod prefetch;
mod queue;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "s3")]
pub mod s3;
pub mod traced;
pub mod worker_pool;

use std::collections::HashMap;

use serde::Serialize;
use xxhash_rust::xxh3::{xxh3_128_with_seed, xxh3_64};

pub use cost_fit::{Cost, CostFit};
pub use io_queue::{IoDone, IoKind, IoRecord, Percentiles, QueueFigures};
use kvtrace_lmct::codec::{ObjectKey, ObjectKeyRef};
pub use l1::{Reservation, SampleScale, Unreadable};
pub use manager::{Departure, PrefetchGroup, PrefetchRequest, StorageManager};
pub use traced::Traced;

/// The identity of an object: a 128-bit hash of every `ObjectKey` field. Also what file names
/// and Redis keys are derived from, never the key's raw bytes.
///
/// Aligned to 8 bytes rather than `u128`'s 16, so that a map entry of an id and a size is 24
/// bytes rather than 32: the distinct-key maps of `info` and replay hold millions of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C, packed(8))]
pub struct KeyId(pub u128);

impl KeyId {
    pub fn of(key: &ObjectKey) -> KeyId {
        CONTEXT.with_borrow_mut(|context| {
            context.id(
                &key.chunk_hash,
                &key.model_name,
                &key.cache_salt,
                key.kv_rank,
                key.object_group_id,
            )
        })
    }

    /// The identities of a call's keys read straight out of a trace, without copying them,
    /// appended to `into`: [`KeyId::of`] of each, with the thread's context taken once for
    /// the call rather than once a key.
    pub fn of_refs(keys: &[ObjectKeyRef<'_>], into: &mut Vec<KeyId>) {
        into.reserve(keys.len());
        CONTEXT.with_borrow_mut(|context| {
            into.extend(keys.iter().map(|key| {
                context.id(
                    key.chunk_hash,
                    key.model_name,
                    key.cache_salt.unwrap_or(""),
                    key.kv_rank,
                    key.object_group_id,
                )
            }));
        });
    }

    /// 32 lowercase hex digits.
    pub fn hex(&self) -> String {
        let id = self.0;
        format!("{id:032x}")
    }
}

/// The fields of a key besides its chunk hash, and the seed they hash to.
#[derive(Default)]
struct KeyContext {
    model: String,
    salt: String,
    kv_rank: i64,
    group: i64,
    seed: u64,
    known: bool,
}

impl KeyContext {
    /// The chunk hash (already a digest) hashed with a seed that stands for the other fields.
    /// The keys of one call, and of a whole trace in practice, share their model, salt, rank
    /// and group, so the seed is kept per thread and recomputed only when those change: a key
    /// costs one short hash instead of one over all its fields.
    fn id(&mut self, hash: &[u8], model: &str, salt: &str, kv_rank: i64, group: i64) -> KeyId {
        KeyId(xxh3_128_with_seed(
            hash,
            self.seed(model, salt, kv_rank, group),
        ))
    }

    fn seed(&mut self, model: &str, salt: &str, kv_rank: i64, group: i64) -> u64 {
        let same = self.known
            && self.kv_rank == kv_rank
            && self.group == group
            && same_bytes(self.model.as_bytes(), model.as_bytes())
            && same_bytes(self.salt.as_bytes(), salt.as_bytes());
        if !same {
            // Length-prefixed, so that no two field lists give the same bytes.
            let mut fields = Vec::with_capacity(model.len() + salt.len() + 32);
            for part in [model.as_bytes(), salt.as_bytes()] {
                fields.extend_from_slice(&(part.len() as u64).to_le_bytes());
                fields.extend_from_slice(part);
            }
            fields.extend_from_slice(&kv_rank.to_le_bytes());
            fields.extend_from_slice(&group.to_le_bytes());
            model.clone_into(&mut self.model);
            salt.clone_into(&mut self.salt);
            (self.kv_rank, self.group) = (kv_rank, group);
            self.seed = xxh3_64(&fields);
            self.known = true;
        }
        self.seed
    }
}

/// Byte equality without a call to `memcmp`: the fields compared are a few dozen bytes read
/// from the trace a moment before, and on the development machine the library call (glibc's
/// AVX-512 variant, stalling on its masked load) took a third of `info`'s time, more than
/// hashing the key itself (docs/performance.md). Eight bytes at a time, then the tail: a
/// model name is a few words, and a byte at a time was two instructions a byte, a twentieth
/// of a replay.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (words_a, tail_a) = a.as_chunks::<8>();
    let (words_b, tail_b) = b.as_chunks::<8>();
    let words = words_a.iter().zip(words_b).fold(0u64, |diff, (x, y)| {
        diff | (u64::from_ne_bytes(*x) ^ u64::from_ne_bytes(*y))
    });
    let tail = tail_a
        .iter()
        .zip(tail_b)
        .fold(0u8, |diff, (x, y)| diff | (x ^ y));
    words == 0 && tail == 0
}

thread_local! {
    static CONTEXT: std::cell::RefCell<KeyContext> = std::cell::RefCell::default();
}

/// Hashes a [`KeyId`] (or any key that is itself a digest, such as a 64-bit block hash) by
/// folding its bits and one multiply: it is already uniform, so hashing it again (std's
/// SipHash) only costs time on every lookup, while the multiply spreads small or sequential
/// ids (tests, benchmarks) over the high bits the hash table's probing looks at.
#[derive(Default, Clone, Copy)]
pub struct KeyIdHasher(u64);

impl std::hash::Hasher for KeyIdHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = (n as u64) ^ ((n >> 64) as u64);
    }

    /// A `u64` key (the simulator's block hashes) in one step: the same value as
    /// [`std::hash::Hasher::write`] of its bytes, which the default took a loop over chunks
    /// to give.
    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(n.to_ne_bytes());
    }
}

/// One line, whatever a server or a client library said: a peer's reply, or an error's
/// chain of causes, can hold newlines.
#[cfg(any(feature = "redis", feature = "s3"))]
fn one_line(text: String) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A map keyed by object identity.
pub type KeyMap<V> = HashMap<KeyId, V, std::hash::BuildHasherDefault<KeyIdHasher>>;

/// A set of key ids (see [`KeyMap`]).
pub type KeySet = std::collections::HashSet<KeyId, std::hash::BuildHasherDefault<KeyIdHasher>>;

/// Counters of one tier.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TierStats {
    pub name: String,
    pub backend: String,
    pub capacity_bytes: Option<u64>,
    pub resident_bytes: u64,
    pub resident_objects: u64,
    pub peak_bytes: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub writes: u64,
    pub reads: u64,
    pub evictions: u64,
    pub bytes_evicted: u64,
    /// Stores, loads and deletes the backend refused (a full disk, a lost Redis after its
    /// retries): each is counted here, and a refused store holds nothing.
    pub write_errors: u64,
    pub read_errors: u64,
    pub delete_errors: u64,
    /// Loads of objects another process wrote: on a tier ranks share (`resp-cluster`), one
    /// rank's stores are another's hits.
    pub cross_rank_hits: u64,
}

/// Time a tier's backend spent storing and loading: measured live for real backends (so,
/// unlike the counters of [`TierStats`], it differs between runs), modelled and therefore
/// reproducible for `gpu` budget tiers.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TierIo {
    pub name: String,
    /// `synchronous`, `asynchronous` (L2 tiers) or `modelled` (a GPU-budget L1).
    pub mode: String,
    /// Calls that may wait in the tier's queues, and the workers serving them
    /// (asynchronous I/O).
    pub queue_depth: Option<u32>,
    pub workers: Option<u32>,
    /// The backend calls one by one: counts, bytes, queue wait, service, end to end.
    pub calls: QueueFigures,
    pub write_seconds: f64,
    pub read_seconds: f64,
    /// MiB/s over the time spent in stores and in loads.
    pub write_mib_per_s: f64,
    pub read_mib_per_s: f64,
    /// Mean time of one load from this tier (the L2 load latency), in milliseconds.
    pub mean_load_ms: f64,
}

impl TierIo {
    fn of(
        stats: &TierStats,
        write_seconds: f64,
        read_seconds: f64,
        mode: &str,
        queue: Option<(u32, u32)>,
    ) -> TierIo {
        let mib = |bytes: u64, secs: f64| {
            if secs > 0.0 {
                bytes as f64 / (1u64 << 20) as f64 / secs
            } else {
                0.0
            }
        };
        TierIo {
            name: stats.name.clone(),
            mode: mode.to_owned(),
            queue_depth: queue.map(|q| q.0),
            workers: queue.map(|q| q.1),
            calls: QueueFigures::default(),
            write_seconds,
            read_seconds,
            write_mib_per_s: mib(stats.bytes_written, write_seconds),
            read_mib_per_s: mib(stats.bytes_read, read_seconds),
            mean_load_ms: if stats.reads > 0 {
                read_seconds * 1e3 / stats.reads as f64
            } else {
                0.0
            },
        }
    }
}

/// Counters of the manager's calls.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CallStats {
    pub keys_reserved: u64,
    pub keys_not_writable: u64,
    /// `reserve_write` calls that failed with OUT_OF_MEMORY, and the keys they carried.
    pub out_of_memory_calls: u64,
    pub out_of_memory_keys: u64,
    pub keys_admitted: u64,
    /// `finish_write` keys that were not staged (never reserved, or expired).
    pub keys_not_staged: u64,
    pub prefetches: u64,
    /// `read_prefetched_results` entries that found a key missing or not read-locked.
    pub read_failures: u64,
    pub read_locks_expired: u64,
    pub write_reservations_expired: u64,
    /// L2 loads that could not get L1 room.
    pub l2_loads_out_of_memory: u64,
    /// Objects moved one tier down (waterfall placement).
    pub demotions: u64,
    /// Objects dropped from the last tier (waterfall placement).
    pub dropped_from_last_tier: u64,
    /// Demotions a tier's backend failed (the object is lost and counted here).
    pub demotion_errors: u64,
    /// Periodic eviction passes that found usage at or over the watermark.
    pub eviction_passes: u64,
}

/// What one prefetch found, per LMCache's `request` span attributes.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PrefetchOutcome {
    pub external_request_id: String,
    pub t: f64,
    pub requested_chunks: u64,
    pub hit_chunks: u64,
    /// The part of the hit prefix L1 alone serves, and the extension loaded from L2.
    pub l1_hit_chunks: u64,
    pub l2_hit_chunks: u64,
    /// Tokens per chunk (dimension 2 of the layout), when the layout is the standard one.
    pub chunk_tokens: Option<u64>,
    /// The keys the prefetch left read-locked for its reader (`num_kv_readers` locks each).
    #[serde(skip)]
    pub held: Vec<KeyId>,
    /// What the recorded server hit for this request, when the prefetch is a replay of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_hit_chunks: Option<u64>,
}

impl PrefetchOutcome {
    pub fn hit_rate(&self) -> f64 {
        if self.requested_chunks == 0 {
            0.0
        } else {
            self.hit_chunks as f64 / self.requested_chunks as f64
        }
    }
}

/// Why a call failed; replay counts these per call kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// Not every key of `read_prefetched_results` was resident and read-locked.
    NotReadable { missing: u64, unlocked: u64 },
    /// A backend refused an operation.
    Io(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotReadable { missing, unlocked } => write!(
                f,
                "failed to read prefetched objects: {missing} missing (KEY_NOT_EXIST), {unlocked} not read-locked (KEY_NOT_READABLE)"
            ),
            CallError::Io(e) => write!(f, "tier I/O failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests;
