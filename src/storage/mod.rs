//! A StorageManager with LMCache's semantics over a tier hierarchy: L1 (the memory pool every
//! object passes through) and any number of L2 tiers written through from it.
//!
//! It exists so that a recorded trace can be re-issued against another configuration and the
//! cache's behaviour — hits, misses, OUT_OF_MEMORY, evictions, bytes per tier — observed. It
//! is deterministic: time is the trace's time (set with [`StorageManager::advance_to`]), a
//! prefetch completes inside `submit_prefetch_task`, and every policy orders by logical
//! stamps. Every traced call is published on the event bus in LMCache's argument shape, so
//! a kvtrace-driven manager records LMCT like an LMCache server does.

pub mod backend;
pub mod config;
pub mod eviction;
pub mod file;
pub mod redis;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::time::{Duration, Instant};

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_128;

use crate::bus::Tracer;
use crate::lmct::calls::StorageCall;
use crate::lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, ObjectKeyRef, PrefetchTaskSpec};
use backend::{Backend, GpuBudget, Memory, Null};
use config::{
    BackendConfig, EvictionTiming, L2Config, Placement, PrefetchPolicy, StorageConfig, StorePolicy,
};
use eviction::EvictionPolicy;

/// The identity of an object: a 128-bit hash of every `ObjectKey` field. Also what file names
/// and Redis keys are derived from, never the key's raw bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u128);

impl KeyId {
    pub fn of(key: &ObjectKey) -> KeyId {
        KeyId::from_parts(
            &key.chunk_hash,
            &key.model_name,
            &key.cache_salt,
            key.kv_rank,
            key.object_group_id,
        )
    }

    /// The same identity from a key read straight out of a trace, without copying it.
    pub fn of_ref(key: &ObjectKeyRef<'_>) -> KeyId {
        KeyId::from_parts(
            key.chunk_hash,
            key.model_name,
            key.cache_salt.unwrap_or(""),
            key.kv_rank,
            key.object_group_id,
        )
    }

    fn from_parts(hash: &[u8], model: &str, salt: &str, kv_rank: i64, group: i64) -> KeyId {
        // Length-prefixed fields in one buffer, hashed in one call: the one-shot xxh3 is
        // several times faster than its streaming state on inputs this short.
        let mut stack = [0u8; 256];
        let parts = [hash, model.as_bytes(), salt.as_bytes()];
        let len = parts.iter().map(|p| p.len() + 8).sum::<usize>() + 16;
        let mut heap = Vec::new();
        let buf: &mut [u8] = if len <= stack.len() {
            &mut stack[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        for part in parts {
            put(&(part.len() as u64).to_le_bytes());
            put(part);
        }
        put(&kv_rank.to_le_bytes());
        put(&group.to_le_bytes());
        KeyId(xxh3_128(buf))
    }

    /// 32 lowercase hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// Hashes a [`KeyId`] (or any key that is itself a digest, such as a 64-bit block hash) by
/// folding its bits: it is already uniform, so hashing it again (std's SipHash) only costs
/// time on every lookup.
#[derive(Default, Clone, Copy)]
pub struct KeyIdHasher(u64);

impl std::hash::Hasher for KeyIdHasher {
    fn finish(&self) -> u64 {
        self.0
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
}

/// A map keyed by object identity.
pub type KeyMap<V> = HashMap<KeyId, V, std::hash::BuildHasherDefault<KeyIdHasher>>;

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
}

/// Time a tier's backend spent storing and loading: measured live for real backends (so,
/// unlike the counters of [`TierStats`], it differs between runs), modelled and therefore
/// reproducible for `gpu` budget tiers.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TierIo {
    pub name: String,
    pub write_seconds: f64,
    pub read_seconds: f64,
    /// MiB/s over the time spent in stores and in loads.
    pub write_mib_per_s: f64,
    pub read_mib_per_s: f64,
    /// Mean time of one load from this tier (the L2 load latency), in milliseconds.
    pub mean_load_ms: f64,
}

impl TierIo {
    fn of(stats: &TierStats, write_seconds: f64, read_seconds: f64) -> TierIo {
        let mib = |bytes: u64, secs: f64| {
            if secs > 0.0 {
                bytes as f64 / (1u64 << 20) as f64 / secs
            } else {
                0.0
            }
        };
        TierIo {
            name: stats.name.clone(),
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

/// One key group of a prefetch, by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefetchGroup {
    pub keys: Vec<KeyId>,
    pub object_bytes: u64,
    pub chunk_tokens: Option<u64>,
}

/// A prefetch by key ids: what [`StorageManager::submit_prefetch_ids`] needs of a spec.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchRequest<'a> {
    pub groups: &'a [PrefetchGroup],
    /// `fetching_policy` `prefix` (true) or `full`.
    pub prefix_only: bool,
    /// Read locks taken per kept key: `num_kv_readers` under `LOCK`, 0 under `NO_LOCK`.
    pub read_locks: u64,
    pub skip_l2: bool,
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

/// What `reserve_write` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservation {
    pub reserved: u64,
    pub not_writable: u64,
    /// The pending batch did not fit: nothing was reserved.
    pub out_of_memory: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Reserved, invisible to readers until `finish_write`; freed at its deadline.
    Staging,
    Resident,
}

#[derive(Clone, Debug)]
struct Object {
    size: u64,
    state: State,
    read_locks: u64,
    /// When the read locks expire (resident) or the reservation lapses (staging);
    /// infinite when nothing is pending.
    deadline: f64,
    /// Loaded by a prefetch from L2 (dropped after use unless the prefetch policy retains).
    from_l2: bool,
}

/// Pending deadlines in the order they fall due. Every deadline is the trace time plus a
/// fixed TTL and trace time never goes back, so appending keeps each queue sorted: O(1) per
/// lock, where an ordered set cost cache misses on every prefetched key. An entry is live
/// only while the object still carries that deadline; stale ones are skipped when popped
/// and compacted away when they pile up.
#[derive(Default)]
struct Deadlines {
    /// Read-lock deadlines (read TTL) and write-reservation deadlines (write TTL).
    queues: [VecDeque<(f64, KeyId)>; 2],
}

const READ_LOCKS: usize = 0;
const WRITE_RESERVATIONS: usize = 1;

/// The L1 pool.
struct L1 {
    capacity: u64,
    used: u64,
    objects: KeyMap<Object>,
    deadlines: Deadlines,
    policy: Box<dyn EvictionPolicy>,
    backend: Box<dyn Backend>,
    stats: TierStats,
    /// Modelled transfer seconds (write, read) when L1 is a GPU budget.
    modelled: [f64; 2],
}

impl L1 {
    /// Writes an object's bytes, as an admission or a load from L2 does.
    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        self.backend.put(key, size)?;
        self.modelled[0] += self.backend.modelled_seconds(size).unwrap_or(0.0);
        self.stats.writes += 1;
        self.stats.bytes_written += size;
        Ok(())
    }

    /// Reads an object's bytes, as a load into the engine or a demotion does.
    fn read(&mut self, key: KeyId, size: u64) {
        let _ = self.backend.get(key);
        self.modelled[1] += self.backend.modelled_seconds(size).unwrap_or(0.0);
        self.stats.reads += 1;
        self.stats.bytes_read += size;
    }
}

/// The time a transfer counts for: the device model's when the backend has one, else what
/// was measured.
fn transfer_time(backend: &dyn Backend, size: u64, measured: Duration) -> Duration {
    backend
        .modelled_seconds(size)
        .map_or(measured, Duration::from_secs_f64)
}

/// One L2 tier.
struct L2 {
    capacity: Option<u64>,
    used: u64,
    sizes: KeyMap<u64>,
    policy: Box<dyn EvictionPolicy>,
    backend: Box<dyn Backend>,
    stats: TierStats,
    write_time: Duration,
    read_time: Duration,
}

fn build_backend(config: &BackendConfig) -> io::Result<Box<dyn Backend>> {
    Ok(match config {
        BackendConfig::Memory { buffers } => Box::new(Memory::new(*buffers)),
        BackendConfig::File { dir, direct, fsync } => {
            Box::new(file::FileTier::create(dir, *direct, *fsync)?)
        }
        BackendConfig::Redis { url, prefix } => Box::new(redis::RedisTier::connect(url, prefix)?),
        BackendConfig::Gpu { bandwidth_gbps } => Box::new(GpuBudget::new(*bandwidth_gbps)),
        BackendConfig::Null => Box::new(Null),
    })
}

impl L2 {
    fn new(index: usize, config: &L2Config) -> io::Result<L2> {
        let backend = build_backend(&config.backend)?;
        Ok(L2 {
            capacity: config.capacity_bytes,
            used: 0,
            sizes: KeyMap::default(),
            policy: config.policy.build(),
            stats: TierStats {
                name: format!("L2[{index}]"),
                backend: backend.name().into(),
                capacity_bytes: config.capacity_bytes,
                ..TierStats::default()
            },
            backend,
            write_time: Default::default(),
            read_time: Default::default(),
        })
    }

    /// Write-through of one object; evicts by the tier's policy when it would not fit.
    fn store(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        if self.sizes.contains_key(&key) {
            return Ok(());
        }
        if let Some(cap) = self.capacity {
            if size > cap {
                return Ok(());
            }
            while self.used.saturating_add(size) > cap {
                let Some(victim) = self.policy.pick(&mut |_| true) else {
                    return Ok(());
                };
                let freed = self.sizes.remove(&victim).unwrap_or(0);
                self.backend.delete(victim)?;
                self.used -= freed;
                self.stats.evictions += 1;
                self.stats.bytes_evicted += freed;
            }
        }
        self.admit(key, size)
    }

    /// Writes an object into this tier and accounts for it (a `null` backend keeps nothing,
    /// so nothing becomes resident).
    fn admit(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        let began = Instant::now();
        self.backend.put(key, size)?;
        self.write_time += transfer_time(&*self.backend, size, began.elapsed());
        if self.backend.contains(key) {
            self.sizes.insert(key, size);
            self.policy.insert(key);
            self.used += size;
        }
        self.stats.writes += 1;
        self.stats.bytes_written += size;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.used);
        Ok(())
    }
}

/// The manager. Single-threaded by design: calls apply in trace order, so replays are
/// reproducible.
pub struct StorageManager {
    config: StorageConfig,
    l1: L1,
    l2: Vec<L2>,
    now: f64,
    next_eviction_tick: f64,
    calls: CallStats,
    tracer: Tracer,
}

/// Releases `n` read locks of an object and reports whether it is now unlocked.
fn release(obj: &mut Object, n: u64) -> bool {
    obj.read_locks = obj.read_locks.saturating_sub(n);
    obj.read_locks == 0
}

impl StorageManager {
    /// Builds the tiers; fails when one cannot be set up (e.g. an unwritable directory).
    pub fn new(config: StorageConfig, tracer: Tracer) -> crate::Result<StorageManager> {
        let l1_backend: Box<dyn Backend> = match config.l1_gpu_bandwidth_gbps {
            Some(bw) => Box::new(GpuBudget::new(bw)),
            None => Box::new(Memory::new(config.l1_buffers)),
        };
        let l1 = L1 {
            capacity: config.l1_size_bytes,
            used: 0,
            objects: KeyMap::default(),
            deadlines: Deadlines::default(),
            policy: config.eviction.policy.build(),
            stats: TierStats {
                name: "L1".into(),
                backend: l1_backend.name().into(),
                capacity_bytes: Some(config.l1_size_bytes),
                ..TierStats::default()
            },
            backend: l1_backend,
            modelled: [0.0; 2],
        };
        let l2 = config
            .l2
            .iter()
            .enumerate()
            .map(|(i, c)| L2::new(i, c).map_err(|e| crate::Error::io(format!("L2[{i}] tier"), e)))
            .collect::<crate::Result<_>>()?;
        let next_eviction_tick = match config.eviction.timing {
            EvictionTiming::Periodic { interval_s } => interval_s,
            EvictionTiming::Immediate => f64::INFINITY,
        };
        Ok(StorageManager {
            config,
            l1,
            l2,
            now: 0.0,
            next_eviction_tick,
            calls: CallStats::default(),
            tracer,
        })
    }

    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// Moves the manager's clock to `t` (seconds of trace time), running the eviction ticks
    /// and lock expiries that fall due on the way.
    pub fn advance_to(&mut self, t: f64) {
        if t < self.now {
            return;
        }
        if let EvictionTiming::Periodic { interval_s } = self.config.eviction.timing {
            while self.next_eviction_tick <= t {
                self.now = self.next_eviction_tick;
                self.expire_locks();
                self.evict_if_over_watermark();
                self.next_eviction_tick += interval_s.max(1e-3);
            }
        }
        self.now = t;
        self.expire_locks();
    }

    /// Sets an object's single pending deadline; `kind` is [`READ_LOCKS`] or
    /// [`WRITE_RESERVATIONS`], and an infinite deadline clears it.
    fn set_deadline(&mut self, key: KeyId, deadline: f64, kind: usize) {
        let Some(obj) = self.l1.objects.get_mut(&key) else {
            return;
        };
        obj.deadline = deadline;
        if deadline.is_finite() {
            let queue = &mut self.l1.deadlines.queues[kind];
            queue.push_back((deadline, key));
            if queue.len() > 2 * self.l1.objects.len() + 4096 {
                let objects = &self.l1.objects;
                queue.retain(|(d, k)| objects.get(k).is_some_and(|o| o.deadline == *d));
            }
        }
    }

    /// Releases read locks and frees write reservations whose TTL has passed.
    fn expire_locks(&mut self) {
        for kind in [READ_LOCKS, WRITE_RESERVATIONS] {
            while let Some(&(due, key)) = self.l1.deadlines.queues[kind].front() {
                if due > self.now {
                    break;
                }
                self.l1.deadlines.queues[kind].pop_front();
                let Some(obj) = self.l1.objects.get_mut(&key) else {
                    continue;
                };
                if obj.deadline != due {
                    continue;
                }
                obj.deadline = f64::INFINITY;
                match obj.state {
                    State::Staging => {
                        self.calls.write_reservations_expired += 1;
                        self.drop_from_l1(key);
                    }
                    State::Resident if obj.read_locks > 0 => {
                        obj.read_locks = 0;
                        self.calls.read_locks_expired += 1;
                    }
                    State::Resident => {}
                }
            }
        }
    }

    fn drop_from_l1(&mut self, key: KeyId) {
        if let Some(obj) = self.l1.objects.remove(&key) {
            self.l1.used -= obj.size;
            if obj.state == State::Resident {
                self.l1.policy.remove(key);
            }
            let _ = self.l1.backend.delete(key);
        }
    }

    /// Evicts unlocked resident objects, by policy, until `bytes` are free or none is left.
    fn evict_l1(&mut self, bytes: u64) -> u64 {
        let mut freed = 0;
        while freed < bytes {
            let objects = &self.l1.objects;
            let victim = self.l1.policy.pick(&mut |k| {
                objects
                    .get(&k)
                    .is_some_and(|o| o.read_locks == 0 && o.state == State::Resident)
            });
            let Some(victim) = victim else { break };
            if let Some(obj) = self.l1.objects.remove(&victim) {
                self.l1.used -= obj.size;
                freed += obj.size;
                self.l1.stats.evictions += 1;
                self.l1.stats.bytes_evicted += obj.size;
                if self.config.placement == Placement::Waterfall {
                    self.l1.read(victim, obj.size);
                    self.demote(0, victim, obj.size);
                }
                let _ = self.l1.backend.delete(victim);
            }
        }
        freed
    }

    /// Waterfall: places an object evicted from the tier above into L2 tier `index`, making
    /// room by moving that tier's least recently used objects further down; past the last
    /// tier the object is dropped. Single-threaded, so no object is ever lost to a race.
    fn demote(&mut self, index: usize, key: KeyId, size: u64) {
        let last = self.l2.len().saturating_sub(1);
        let Some(tier) = self.l2.get(index) else {
            self.calls.dropped_from_last_tier += 1;
            return;
        };
        if tier.sizes.contains_key(&key) {
            return;
        }
        let cap = tier.capacity.unwrap_or(u64::MAX);
        if index < last && size as f64 > 0.95 * cap as f64 {
            return self.demote(index + 1, key, size);
        }
        let target = if index < last {
            (0.8 * cap as f64) as u64
        } else {
            cap
        };
        loop {
            let tier = &mut self.l2[index];
            if tier.used.saturating_add(size) <= target {
                break;
            }
            let Some(victim) = tier.policy.pick(&mut |_| true) else {
                break;
            };
            let victim_size = tier.sizes.remove(&victim).unwrap_or(0);
            tier.used -= victim_size;
            tier.stats.evictions += 1;
            tier.stats.bytes_evicted += victim_size;
            let began = Instant::now();
            let moved = tier.backend.get(victim);
            tier.read_time += transfer_time(&*tier.backend, victim_size, began.elapsed());
            tier.stats.reads += 1;
            tier.stats.bytes_read += victim_size;
            match moved.and_then(|_| tier.backend.delete(victim)) {
                Ok(()) => self.demote(index + 1, victim, victim_size),
                Err(_) => self.calls.demotion_errors += 1,
            }
        }
        let tier = &mut self.l2[index];
        if tier.used.saturating_add(size) > cap {
            self.calls.dropped_from_last_tier += u64::from(index == last);
            return;
        }
        match tier.admit(key, size) {
            Ok(()) => self.calls.demotions += 1,
            Err(_) => self.calls.demotion_errors += 1,
        }
    }

    fn evict_if_over_watermark(&mut self) {
        let e = &self.config.eviction;
        let cap = self.l1.capacity as f64;
        if cap > 0.0 && self.l1.used as f64 >= e.trigger_watermark * cap {
            let target = (e.eviction_ratio * cap).ceil() as u64;
            self.evict_l1(target);
        }
    }

    /// Makes room for `need` more bytes in L1 if the timing allows; true if they fit.
    fn room_for(&mut self, need: u64) -> bool {
        if self.l1.used.saturating_add(need) <= self.l1.capacity {
            return true;
        }
        if self.config.eviction.timing == EvictionTiming::Immediate {
            let short = self.l1.used.saturating_add(need) - self.l1.capacity;
            self.evict_l1(short);
        }
        self.l1.used.saturating_add(need) <= self.l1.capacity
    }

    fn allocate(&mut self, key: KeyId, size: u64, state: State, from_l2: bool) {
        self.l1.objects.insert(
            key,
            Object {
                size,
                state,
                read_locks: 0,
                deadline: f64::INFINITY,
                from_l2,
            },
        );
        self.l1.used += size;
        self.l1.stats.peak_bytes = self.l1.stats.peak_bytes.max(self.l1.used);
    }

    fn publish(&self, call: StorageCall<'_>) {
        self.tracer
            .publish_call(call.qualname(), |buf| call.encode_args(buf));
    }

    /// Reserves L1 staging space for the keys that are neither resident nor staged. If the
    /// pending batch does not fit, nothing is reserved (OUT_OF_MEMORY).
    pub fn reserve_write(&mut self, keys: &[ObjectKey], layout: &MemoryLayoutDesc) -> Reservation {
        self.publish(StorageCall::ReserveWrite {
            keys,
            layout_desc: layout,
        });
        let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
        self.reserve_write_ids(&ids, layout.object_bytes().unwrap_or(0))
    }

    /// [`StorageManager::reserve_write`] on key ids, untraced: for callers that publish the
    /// call themselves (replay re-publishes the recorded arguments).
    pub fn reserve_write_ids(&mut self, keys: &[KeyId], object_bytes: u64) -> Reservation {
        let mut pending: Vec<KeyId> = Vec::with_capacity(keys.len());
        let mut out = Reservation::default();
        for &key in keys {
            if self.l1.objects.contains_key(&key) || pending.contains(&key) {
                out.not_writable += 1;
            } else {
                pending.push(key);
            }
        }
        self.calls.keys_not_writable += out.not_writable;
        if pending.is_empty() {
            return out;
        }
        if !self.room_for(object_bytes.saturating_mul(pending.len() as u64)) {
            out.out_of_memory = true;
            self.calls.out_of_memory_calls += 1;
            self.calls.out_of_memory_keys += pending.len() as u64;
            return out;
        }
        let deadline = self.now + self.config.write_ttl_s;
        for key in pending {
            self.allocate(key, object_bytes, State::Staging, false);
            self.set_deadline(key, deadline, WRITE_RESERVATIONS);
            out.reserved += 1;
        }
        self.calls.keys_reserved += out.reserved;
        out
    }

    /// Admits staged objects as resident and writes them through to every L2 tier.
    pub fn finish_write(&mut self, keys: &[ObjectKey]) -> Result<u64, CallError> {
        self.publish(StorageCall::FinishWrite { keys });
        let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
        self.finish_write_ids(&ids)
    }

    /// [`StorageManager::finish_write`] on key ids, untraced.
    pub fn finish_write_ids(&mut self, keys: &[KeyId]) -> Result<u64, CallError> {
        let mut admitted = 0;
        for &key in keys {
            let Some(obj) = self.l1.objects.get_mut(&key) else {
                self.calls.keys_not_staged += 1;
                continue;
            };
            if obj.state == State::Resident {
                self.calls.keys_not_staged += 1;
                continue;
            }
            obj.state = State::Resident;
            let size = obj.size;
            self.set_deadline(key, f64::INFINITY, WRITE_RESERVATIONS);
            self.l1.policy.insert(key);
            self.l1
                .put(key, size)
                .map_err(|e| CallError::Io(e.to_string()))?;
            admitted += 1;
            if self.config.placement == Placement::WriteThrough {
                for tier in &mut self.l2 {
                    tier.store(key, size)
                        .map_err(|e| CallError::Io(e.to_string()))?;
                }
            }
            if self.config.store_policy == StorePolicy::SkipL1 && !self.l2.is_empty() {
                self.drop_from_l1(key);
            }
        }
        self.calls.keys_admitted += admitted;
        if self.config.eviction.timing == EvictionTiming::Immediate {
            self.evict_if_over_watermark();
        }
        Ok(admitted)
    }

    /// Looks every key group up, L1 first and then L2 (loading into L1), keeps the hit
    /// prefix (`prefix`) or every hit (`full`), and takes `num_kv_readers` read locks on what
    /// it keeps when the lock mode is `LOCK`. Completes before returning.
    pub fn submit_prefetch_task(
        &mut self,
        spec: &PrefetchTaskSpec,
        external_request_id: &str,
        skip_l2: bool,
    ) -> Result<PrefetchOutcome, CallError> {
        self.publish(StorageCall::SubmitPrefetchTask {
            spec,
            external_request_id,
            skip_l2,
        });
        let groups: Vec<PrefetchGroup> = spec
            .key_groups
            .iter()
            .map(|g| PrefetchGroup {
                keys: g.keys.iter().map(KeyId::of).collect(),
                object_bytes: g.layout_desc.object_bytes().unwrap_or(0),
                chunk_tokens: g.layout_desc.chunk_tokens(),
            })
            .collect();
        let request = PrefetchRequest {
            groups: &groups,
            prefix_only: spec.fetching_policy != "full",
            read_locks: match spec.lock_mode {
                LockMode::Lock => spec.num_kv_readers.max(0) as u64,
                LockMode::NoLock => 0,
            },
            skip_l2,
        };
        self.submit_prefetch_ids(&request, external_request_id)
    }

    /// [`StorageManager::submit_prefetch_task`] on key ids, untraced.
    pub fn submit_prefetch_ids(
        &mut self,
        request: &PrefetchRequest<'_>,
        external_request_id: &str,
    ) -> Result<PrefetchOutcome, CallError> {
        self.calls.prefetches += 1;
        let mut outcome = PrefetchOutcome {
            external_request_id: external_request_id.to_owned(),
            t: self.now,
            ..PrefetchOutcome::default()
        };
        let mut kept = Vec::new();
        for (g, group) in request.groups.iter().enumerate() {
            let (mut l1_hits, mut l2_hits, mut in_prefix) = (0u64, 0u64, true);
            kept.clear();
            for &key in &group.keys {
                let in_l1 = self.l1.objects.get(&key).map(|o| o.state);
                let hit = match in_l1 {
                    Some(State::Resident) => {
                        if in_prefix && l2_hits == 0 {
                            l1_hits += 1;
                        } else {
                            l2_hits += 1;
                        }
                        true
                    }
                    // Staged by a writer: not readable yet, and not loadable over it.
                    Some(State::Staging) => false,
                    None if !request.skip_l2 && self.load_from_l2(key, group.object_bytes)? => {
                        l2_hits += 1;
                        true
                    }
                    None => false,
                };
                if hit {
                    kept.push(key);
                } else {
                    in_prefix = false;
                    if request.prefix_only {
                        break;
                    }
                }
            }
            let deadline = self.now + self.config.read_ttl_s;
            for &key in &kept {
                self.l1.policy.touch(key);
                if request.read_locks == 0 {
                    continue;
                }
                if let Some(obj) = self.l1.objects.get_mut(&key) {
                    obj.read_locks += request.read_locks;
                }
                self.set_deadline(key, deadline, READ_LOCKS);
            }
            if g == 0 {
                outcome.requested_chunks = group.keys.len() as u64;
                outcome.hit_chunks = kept.len() as u64;
                outcome.l1_hit_chunks = l1_hits;
                outcome.l2_hit_chunks = kept.len() as u64 - l1_hits;
                outcome.chunk_tokens = group.chunk_tokens;
            }
        }
        Ok(outcome)
    }

    /// Loads an object from the first L2 tier that holds it into L1.
    fn load_from_l2(&mut self, key: KeyId, size: u64) -> Result<bool, CallError> {
        let Some(index) = self.l2.iter().position(|t| t.sizes.contains_key(&key)) else {
            return Ok(false);
        };
        if !self.room_for(size) {
            self.calls.l2_loads_out_of_memory += 1;
            return Ok(false);
        }
        let tier = &mut self.l2[index];
        let began = Instant::now();
        let found = tier
            .backend
            .get(key)
            .map_err(|e| CallError::Io(e.to_string()))?;
        tier.read_time += transfer_time(&*tier.backend, size, began.elapsed());
        if !found {
            return Ok(false);
        }
        tier.policy.touch(key);
        tier.stats.reads += 1;
        tier.stats.bytes_read += size;
        self.allocate(key, size, State::Resident, true);
        self.l1.policy.insert(key);
        self.l1
            .put(key, size)
            .map_err(|e| CallError::Io(e.to_string()))?;
        Ok(true)
    }

    /// The context entry of `read_prefetched_results`: succeeds only if every key is resident
    /// and read-locked (by a prefetch). Takes no locks.
    pub fn read_prefetched_enter(&mut self, keys: &[ObjectKey]) -> Result<(), CallError> {
        self.publish(StorageCall::ReadPrefetchedEnter { keys });
        let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
        self.read_prefetched_enter_ids(&ids)
    }

    /// [`StorageManager::read_prefetched_enter`] on key ids, untraced.
    pub fn read_prefetched_enter_ids(&mut self, keys: &[KeyId]) -> Result<(), CallError> {
        let (mut missing, mut unlocked) = (0, 0);
        for &key in keys {
            match self.l1.objects.get(&key) {
                Some(o) if o.state == State::Resident && o.read_locks > 0 => {
                    let size = o.size;
                    self.l1.read(key, size);
                    self.l1.policy.touch(key);
                }
                Some(o) if o.state == State::Resident => unlocked += 1,
                _ => missing += 1,
            }
        }
        if missing + unlocked == 0 {
            Ok(())
        } else {
            self.calls.read_failures += 1;
            Err(CallError::NotReadable { missing, unlocked })
        }
    }

    /// The context exit: after a failed entry, releases one read lock of each readable key;
    /// after a successful one, nothing (the caller calls `finish_read_prefetched`).
    pub fn read_prefetched_exit(&mut self, keys: &[ObjectKey], entered: bool) {
        self.publish(StorageCall::ReadPrefetchedExit { keys });
        let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
        self.read_prefetched_exit_ids(&ids, entered);
    }

    /// [`StorageManager::read_prefetched_exit`] on key ids, untraced.
    pub fn read_prefetched_exit_ids(&mut self, keys: &[KeyId], entered: bool) {
        if entered {
            return;
        }
        for key in keys {
            if let Some(obj) = self.l1.objects.get_mut(key) {
                if obj.read_locks > 0 {
                    release(obj, 1);
                }
            }
        }
    }

    /// Releases `read_locks` read locks per key. Objects a prefetch loaded from L2 leave L1
    /// once unlocked, unless the prefetch policy retains them.
    pub fn finish_read_prefetched(&mut self, keys: &[ObjectKey], read_locks: i64) {
        self.publish(StorageCall::FinishReadPrefetched { keys, read_locks });
        let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
        self.finish_read_prefetched_ids(&ids, read_locks);
    }

    /// [`StorageManager::finish_read_prefetched`] on key ids, untraced.
    pub fn finish_read_prefetched_ids(&mut self, keys: &[KeyId], read_locks: i64) {
        let n = read_locks.max(0) as u64;
        let retain = self.config.prefetch_policy == PrefetchPolicy::Retain;
        let mut dropped = Vec::new();
        for &key in keys {
            if let Some(obj) = self.l1.objects.get_mut(&key) {
                if release(obj, n) && obj.from_l2 && !retain {
                    dropped.push(key);
                }
            }
        }
        for key in dropped {
            self.drop_from_l1(key);
        }
    }

    /// Publishes a call on the event bus with arguments its caller encodes (replay hands on
    /// the recorded bytes), for the `*_ids` entry points.
    pub fn publish_raw(&self, qualname: &'static str, encode_args: impl FnOnce(&mut Vec<u8>)) {
        self.tracer.publish_call(qualname, encode_args);
    }

    /// Removes objects from every tier (untraced, as in LMCache).
    pub fn delete(&mut self, keys: &[ObjectKey]) -> Result<(), CallError> {
        for key in keys.iter().map(KeyId::of) {
            self.drop_from_l1(key);
            for tier in &mut self.l2 {
                if let Some(size) = tier.sizes.remove(&key) {
                    tier.used -= size;
                    tier.policy.remove(key);
                    tier.backend
                        .delete(key)
                        .map_err(|e| CallError::Io(e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    /// Empties L1 (untraced). L2 tiers keep their objects, as LMCache's `clear` does.
    pub fn clear(&mut self) {
        let mut keys: Vec<KeyId> = self.l1.objects.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            self.drop_from_l1(key);
        }
    }

    /// Whether an object is resident in L1 (for tests and engines).
    pub fn is_resident(&self, key: &ObjectKey) -> bool {
        self.l1
            .objects
            .get(&KeyId::of(key))
            .is_some_and(|o| o.state == State::Resident)
    }

    pub fn call_stats(&self) -> &CallStats {
        &self.calls
    }

    /// Time each L2 tier spent in its backend, preceded by L1's modelled transfer time when
    /// L1 is a GPU budget (host memory copies are not timed).
    pub fn tier_io(&self) -> Vec<TierIo> {
        let l1 = self.config.l1_gpu_bandwidth_gbps.map(|_| {
            let [w, r] = self.l1.modelled;
            TierIo::of(&self.l1.stats, w, r)
        });
        let l2 = self.l2.iter().map(|t| {
            TierIo::of(
                &t.stats,
                t.write_time.as_secs_f64(),
                t.read_time.as_secs_f64(),
            )
        });
        l1.into_iter().chain(l2).collect()
    }

    /// Counters of every tier, L1 first.
    pub fn tier_stats(&self) -> Vec<TierStats> {
        let mut l1 = self.l1.stats.clone();
        l1.resident_bytes = self.l1.used;
        l1.resident_objects = self.l1.objects.len() as u64;
        let mut out = vec![l1];
        for tier in &self.l2 {
            let mut s = tier.stats.clone();
            s.resident_bytes = tier.used;
            s.resident_objects = tier.sizes.len() as u64;
            out.push(s);
        }
        out
    }
}

#[cfg(test)]
mod tests;
