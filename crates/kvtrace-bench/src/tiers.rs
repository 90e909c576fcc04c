//! The benchmark's tier hierarchy (GPU → CPU → storage) with waterfall placement: a new
//! entry goes to the fastest tier that has room after evicting; an evicted entry moves one
//! tier down (making room there first) and leaves the last tier by deletion. Nothing is
//! promoted: a hit is read where the entry lives.
//!
//! Every placement decision — room, reservations, victims, moves — happens under one lock,
//! so usage is always the sum of the entries a tier holds: concurrent writers cannot leak
//! reservations and evict live entries. An entry being written or read is pinned and never
//! chosen as a victim; its bytes move outside the lock.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

#[cfg(feature = "redis")]
use super::cluster::ClusterStore;
use super::io::{read_entry, write_entry, FileMode, IoBuffer, IoTime};
use super::iolog::{IoLog, IoOp};
use super::metrics::OpTimes;
use super::storage_io::{StorageIoReport, StoragePath};
use kvtrace_cache::storage::config::L2Io;
use kvtrace_cache::storage::file::{object_path, remove_object};
use kvtrace_cache::storage::{KeyId, KeyMap};

/// A tier's place in the hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    Gpu,
    Cpu,
    Storage,
}

impl TierKind {
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Gpu => "gpu",
            TierKind::Cpu => "cpu",
            TierKind::Storage => "storage",
        }
    }
}

/// Where a tier's bytes go.
#[derive(Clone, Debug, PartialEq)]
pub enum TierStore {
    /// A capacity and bandwidth budget (a GPU on a machine without one): each transfer takes
    /// `bytes / bandwidth`, slept through by the worker.
    Modelled { gbps: f64 },
    /// One real file per entry under a directory.
    Files { dir: PathBuf, mode: FileMode },
    /// Keeps nothing and takes no time: for logging the I/O a run would do.
    Null,
    /// A Redis Cluster every rank of the run shares (the last tier only).
    #[cfg(feature = "redis")]
    Cluster(Arc<ClusterStore>),
    /// One object per entry in an S3-compatible bucket (the last tier only).
    #[cfg(feature = "s3")]
    Object(Arc<kvtrace_cache::storage::s3::S3Client>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TierSpec {
    pub kind: TierKind,
    /// Bytes it may hold; `None` is unbounded.
    pub capacity: Option<u64>,
    pub store: TierStore,
}

/// Counters of one tier.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TierCounters {
    pub entries: u64,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    /// Bytes written here: new entries and entries moved in from the tier above.
    pub bytes_written: u64,
    /// Bytes read here: hits and entries moved out to the tier below.
    pub bytes_read: u64,
    pub writes: u64,
    pub reads: u64,
    /// Entries moved down to the next tier.
    pub demotions: u64,
    /// Entries deleted to make room (last tier) or lost because no tier below had room.
    pub deletions: u64,
    /// Moves that failed on I/O (the entry is lost and counted here).
    pub move_errors: u64,
    /// Writes queued for asynchronous I/O that the storage refused (the entry is forgotten
    /// and counted here).
    pub queued_write_errors: u64,
    /// Moves cut short because the run reached its deadline (the entry is dropped; not a
    /// failure of the storage).
    pub move_cancels: u64,
    /// Reads of entries this process did not write: another rank's, found in a shared tier.
    pub cross_rank_hits: u64,
    /// Seconds spent writing and reading (moves included).
    pub write_s: f64,
    pub read_s: f64,
}

impl TierCounters {
    fn record_write(&mut self, size: u64, time: IoTime) {
        self.writes += 1;
        self.bytes_written += size;
        self.write_s += time.total_s();
    }

    fn record_read(&mut self, size: u64, time: IoTime) {
        self.reads += 1;
        self.bytes_read += size;
        self.read_s += time.total_s();
    }
}

/// Where a new entry went.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Allocation {
    /// Already cached: nothing written.
    Existing {
        tier: TierKind,
    },
    Written {
        tier: TierKind,
        time: IoTime,
    },
    /// No tier had room, even after evicting.
    NoRoom,
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Access {
    Hit {
        tier: TierKind,
        size: u64,
        time: IoTime,
    },
    Miss,
}

struct Entry {
    tier: usize,
    size: u64,
    ready: bool,
    pins: u32,
    tick: u64,
    stamp: u64,
}

struct Tier {
    spec: TierSpec,
    used: u64,
    /// Entries by last use, oldest first.
    lru: BTreeMap<u64, KeyId>,
    counters: TierCounters,
}

struct State {
    entries: KeyMap<Entry>,
    tiers: Vec<Tier>,
    tick: u64,
    log: Option<Arc<IoLog>>,
    /// The reads and writes of demotions, by `(tier, is_write)`: eviction-driven I/O that
    /// no request issued, timed apart from the requests' own.
    moves: BTreeMap<(TierKind, bool), OpTimes>,
    /// The last tier's I/O path (synchronous or queued), every call timed.
    storage: Option<Arc<StoragePath>>,
}

/// The shared cache; workers call it from many threads.
pub struct TierCache {
    state: Mutex<State>,
}

/// How deep a chain of demotions may go.
const MAX_DEPTH: usize = 10;
/// A tier above the last evicts down to this share of its capacity, so it does not evict
/// on every write; an entry larger than `TOO_LARGE` of it skips it.
const TARGET: f64 = 0.8;
const TOO_LARGE: f64 = 0.95;

/// Sleeps through a modelled transfer, in steps so a cancelled run stops it. A bandwidth
/// that is not positive (the caller's to refuse) moves the entry in no time.
fn sleep_modelled(gbps: f64, size: u64, buf: &IoBuffer) -> io::Result<f64> {
    let secs = size as f64 / (gbps * 1e9);
    let Ok(wait) = Duration::try_from_secs_f64(secs) else {
        return Ok(0.0);
    };
    // A century: far past any run, and no overflow of the clock.
    let until = Instant::now() + wait.min(Duration::from_secs(100 * 365 * 86_400));
    loop {
        buf.check()?;
        let now = Instant::now();
        if now >= until {
            return Ok(secs);
        }
        std::thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

pub(crate) fn store_write(
    spec: &TierSpec,
    key: KeyId,
    size: u64,
    stamp: u64,
    buf: &mut IoBuffer,
) -> io::Result<IoTime> {
    match &spec.store {
        TierStore::Modelled { gbps } => Ok(IoTime {
            host_s: 0.0,
            device_s: sleep_modelled(*gbps, size, buf)?,
        }),
        TierStore::Files { dir, mode } => {
            write_entry(&object_path(dir, key), size, stamp, *mode, buf)
        }
        TierStore::Null => Ok(IoTime::default()),
        #[cfg(feature = "redis")]
        TierStore::Cluster(cluster) => cluster.write(key, size, stamp, buf),
        #[cfg(feature = "s3")]
        TierStore::Object(bucket) => {
            let began = std::time::Instant::now();
            bucket.put(key, size, &mut |offset, len| {
                // The entry's stamped bytes, a buffer chunk at a time.
                let mut part = Vec::with_capacity(len);
                let mut at = offset;
                while part.len() < len {
                    let n = (len - part.len()).min(super::io::CHUNK);
                    part.extend_from_slice(buf.fill(n, stamp, at));
                    at += n as u64;
                }
                part.into()
            })?;
            Ok(IoTime {
                host_s: 0.0,
                device_s: began.elapsed().as_secs_f64(),
            })
        }
    }
}

/// Reads an entry; `NotFound` when a shared tier no longer holds it (its own eviction).
pub(crate) fn store_read(
    spec: &TierSpec,
    key: KeyId,
    size: u64,
    buf: &mut IoBuffer,
) -> io::Result<IoTime> {
    match &spec.store {
        TierStore::Modelled { gbps } => Ok(IoTime {
            host_s: 0.0,
            device_s: sleep_modelled(*gbps, size, buf)?,
        }),
        TierStore::Files { dir, mode } => read_entry(&object_path(dir, key), size, *mode, buf),
        TierStore::Null => Ok(IoTime::default()),
        #[cfg(feature = "redis")]
        TierStore::Cluster(cluster) => match cluster.read(key, buf)? {
            Some((_, time)) => Ok(time),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("resp-cluster {}: entry evicted", cluster.nodes()),
            )),
        },
        #[cfg(feature = "s3")]
        TierStore::Object(bucket) => {
            let began = std::time::Instant::now();
            match bucket.get(key)? {
                Some(len) if len == size => Ok(IoTime {
                    host_s: 0.0,
                    device_s: began.elapsed().as_secs_f64(),
                }),
                found => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{}: entry {} is {} bytes, not {size}",
                        bucket.shown(),
                        bucket.object_name(key),
                        found.map_or("gone".into(), |n| n.to_string())
                    ),
                )),
            }
        }
    }
}

/// Removes an entry of `size` bytes (a cluster removes its values one by one).
#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
pub(crate) fn store_delete(spec: &TierSpec, key: KeyId, size: u64) -> io::Result<()> {
    match &spec.store {
        TierStore::Files { dir, .. } => remove_object(&object_path(dir, key)),
        #[cfg(feature = "redis")]
        TierStore::Cluster(cluster) => cluster.delete(key, size),
        #[cfg(feature = "s3")]
        TierStore::Object(bucket) => bucket.delete(key),
        _ => Ok(()),
    }
}

impl State {
    /// The I/O path of `tier` when it is the last tier.
    fn path_of(&self, tier: usize) -> Option<Arc<StoragePath>> {
        (tier + 1 == self.tiers.len())
            .then(|| self.storage.clone())
            .flatten()
    }

    fn write_at(
        &self,
        tier: usize,
        key: KeyId,
        size: u64,
        stamp: u64,
        buf: &mut IoBuffer,
    ) -> io::Result<IoTime> {
        match self.path_of(tier) {
            Some(path) => path.write(key, size, stamp, buf),
            None => store_write(&self.tiers[tier].spec, key, size, stamp, buf),
        }
    }

    fn read_at(
        &self,
        tier: usize,
        key: KeyId,
        size: u64,
        buf: &mut IoBuffer,
    ) -> io::Result<IoTime> {
        match self.path_of(tier) {
            Some(path) => path.read(key, size, buf),
            None => store_read(&self.tiers[tier].spec, key, size, buf),
        }
    }

    fn delete_at(&self, tier: usize, key: KeyId, size: u64) -> io::Result<()> {
        match self.path_of(tier) {
            Some(path) => path.delete(key, size),
            None => store_delete(&self.tiers[tier].spec, key, size),
        }
    }

    /// Forgets the entries whose queued write the storage refused, as a refused synchronous
    /// write leaves nothing; each is counted on the last tier.
    fn settle(&mut self) {
        let Some(path) = self.storage.clone() else {
            return;
        };
        let last = self.tiers.len() - 1;
        for key in path.take_failed_writes() {
            let Some(e) = self.entries.get(&key).filter(|e| e.tier == last) else {
                continue;
            };
            let (size, tick) = (e.size, e.tick);
            self.entries.remove(&key);
            self.remove_from(last, size, tick);
            self.tiers[last].counters.queued_write_errors += 1;
        }
    }

    fn log(&self, op: IoOp, size: u64, tier: usize, key: KeyId) {
        if let Some(log) = &self.log {
            log.row(op, size, self.tiers[tier].spec.kind.name(), key);
        }
    }

    fn touch(&mut self, key: KeyId) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.entries.get_mut(&key) {
            let lru = &mut self.tiers[e.tier].lru;
            lru.remove(&e.tick);
            lru.insert(tick, key);
            e.tick = tick;
        }
    }

    fn add(&mut self, tier: usize, size: u64) {
        let t = &mut self.tiers[tier];
        t.used += size;
        t.counters.entries += 1;
        t.counters.peak_bytes = t.counters.peak_bytes.max(t.used);
    }

    fn remove_from(&mut self, tier: usize, size: u64, tick: u64) {
        let t = &mut self.tiers[tier];
        t.used -= size;
        t.counters.entries -= 1;
        t.lru.remove(&tick);
    }

    /// The last tier, when it is a cluster every rank shares.
    #[cfg(feature = "redis")]
    fn shared(&self) -> Option<(usize, TierKind, Arc<ClusterStore>)> {
        let last = self.tiers.len().checked_sub(1)?;
        match &self.tiers[last].spec.store {
            TierStore::Cluster(c) => Some((last, self.tiers[last].spec.kind, Arc::clone(c))),
            _ => None,
        }
    }

    /// The oldest entry of a tier that nobody is using.
    fn victim(&self, tier: usize) -> Option<KeyId> {
        self.tiers[tier]
            .lru
            .values()
            .copied()
            .find(|k| self.entries.get(k).is_some_and(|e| e.ready && e.pins == 0))
    }

    /// Makes room for `bytes` in `tier` by moving its oldest entries down, and reserves it.
    /// `false` when the tier cannot hold them.
    fn make_room(&mut self, tier: usize, bytes: u64, depth: usize, buf: &mut IoBuffer) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        let last = tier + 1 == self.tiers.len();
        let Some(capacity) = self.tiers[tier].spec.capacity else {
            return true;
        };
        let target = if last {
            capacity as f64
        } else {
            if bytes as f64 > TOO_LARGE * capacity as f64 {
                return false;
            }
            TARGET * capacity as f64
        };
        if bytes > capacity {
            return false;
        }
        while (self.tiers[tier].used + bytes) as f64 > target {
            let Some(victim) = self.victim(tier) else {
                return false;
            };
            self.evict(tier, victim, depth, buf);
        }
        true
    }

    /// Moves an entry one tier down, or deletes it from the last tier (or when nothing
    /// below has room).
    fn evict(&mut self, tier: usize, key: KeyId, depth: usize, buf: &mut IoBuffer) {
        let Some(e) = self.entries.get(&key) else {
            return;
        };
        let (size, tick, stamp) = (e.size, e.tick, e.stamp);
        let below = tier + 1;
        let moved = below < self.tiers.len() && self.make_room(below, size, depth + 1, buf);
        self.remove_from(tier, size, tick);
        self.log(IoOp::Evict, size, tier, key);
        if !moved {
            let _ = self.delete_at(tier, key, size);
            self.tiers[tier].counters.deletions += 1;
            self.entries.remove(&key);
            return;
        }
        let result = self
            .read_at(tier, key, size, buf)
            .and_then(|r| self.write_at(below, key, size, stamp, buf).map(|w| (r, w)));
        let _ = self.delete_at(tier, key, size);
        let (from, to) = (self.tiers[tier].spec.kind, self.tiers[below].spec.kind);
        let src = &mut self.tiers[tier].counters;
        src.demotions += 1;
        match result {
            Ok((r, w)) => {
                src.record_read(size, r);
                self.tiers[below].counters.record_write(size, w);
                self.moves.entry((from, false)).or_default().push(r);
                self.moves.entry((to, true)).or_default().push(w);
                self.log(IoOp::Write, size, below, key);
                self.add(below, size);
                self.tick += 1;
                let tick = self.tick;
                self.tiers[below].lru.insert(tick, key);
                if let Some(e) = self.entries.get_mut(&key) {
                    e.tier = below;
                    e.tick = tick;
                }
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::Interrupted {
                    src.move_cancels += 1;
                } else {
                    src.move_errors += 1;
                }
                self.entries.remove(&key);
            }
        }
    }
}

impl TierCache {
    /// Creates the tiers' directories (empty tiers are left out).
    pub fn new(specs: Vec<TierSpec>) -> io::Result<TierCache> {
        TierCache::with_storage_io(specs, L2Io::Synchronous)
    }

    /// As [`TierCache::new`], the last tier's calls made as `mode` says.
    pub fn with_storage_io(specs: Vec<TierSpec>, mode: L2Io) -> io::Result<TierCache> {
        let mut tiers = Vec::new();
        for spec in specs {
            if spec.capacity == Some(0) {
                continue;
            }
            if let TierStore::Files { dir, .. } = &spec.store {
                std::fs::create_dir_all(dir)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
            }
            tiers.push(Tier {
                spec,
                used: 0,
                lru: BTreeMap::new(),
                counters: TierCounters::default(),
            });
        }
        let storage = match tiers.last() {
            Some(t) => Some(Arc::new(StoragePath::start(t.spec.clone(), mode)?)),
            None => None,
        };
        Ok(TierCache {
            state: Mutex::new(State {
                entries: KeyMap::default(),
                tiers,
                tick: 0,
                log: None,
                moves: BTreeMap::new(),
                storage,
            }),
        })
    }

    /// Logs every write, read and eviction to `log` from now on.
    pub fn with_log(self, log: Arc<IoLog>) -> TierCache {
        self.lock().log = Some(log);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores a new entry of `size` bytes in the fastest tier with room. `on_ready` runs
    /// under the lock as the written entry becomes readable, so whatever it publishes comes
    /// before any reader's view of the entry.
    pub fn allocate(
        &self,
        key: KeyId,
        size: u64,
        stamp: u64,
        buf: &mut IoBuffer,
        on_ready: impl FnOnce(),
    ) -> io::Result<Allocation> {
        let (tier, spec, path) = {
            let mut s = self.lock();
            s.settle();
            if let Some(e) = s.entries.get(&key) {
                return Ok(Allocation::Existing {
                    tier: s.tiers[e.tier].spec.kind,
                });
            }
            let Some(tier) = (0..s.tiers.len()).find(|&t| s.make_room(t, size, 0, buf)) else {
                return Ok(Allocation::NoRoom);
            };
            s.add(tier, size);
            s.tick += 1;
            let tick = s.tick;
            s.tiers[tier].lru.insert(tick, key);
            s.entries.insert(
                key,
                Entry {
                    tier,
                    size,
                    ready: false,
                    pins: 0,
                    tick,
                    stamp,
                },
            );
            (tier, s.tiers[tier].spec.clone(), s.path_of(tier))
        };
        let written = match &path {
            Some(path) => path.write(key, size, stamp, buf),
            None => store_write(&spec, key, size, stamp, buf),
        };
        let mut s = self.lock();
        match written {
            Ok(time) => {
                on_ready();
                if let Some(e) = s.entries.get_mut(&key) {
                    e.ready = true;
                }
                s.tiers[tier].counters.record_write(size, time);
                s.log(IoOp::Write, size, tier, key);
                Ok(Allocation::Written {
                    tier: spec.kind,
                    time,
                })
            }
            Err(e) => {
                if let Some(entry) = s.entries.remove(&key) {
                    s.remove_from(tier, size, entry.tick);
                }
                let _ = match &path {
                    Some(path) => path.delete(key, size),
                    None => store_delete(&spec, key, size),
                };
                Err(e)
            }
        }
    }

    /// Reads a whole entry where it lives. One this process does not hold may be in a
    /// shared last tier, written by another rank: a cross-rank hit.
    pub fn access(&self, key: KeyId, buf: &mut IoBuffer) -> io::Result<Access> {
        let (tier, size, spec, path) = {
            let mut s = self.lock();
            s.settle();
            let Some(e) = s.entries.get_mut(&key).filter(|e| e.ready) else {
                #[cfg(feature = "redis")]
                if let Some(shared) = s.shared().filter(|_| !s.entries.contains_key(&key)) {
                    drop(s);
                    return self.access_shared(shared, key, buf);
                }
                return Ok(Access::Miss);
            };
            e.pins += 1;
            let (tier, size) = (e.tier, e.size);
            s.touch(key);
            (tier, size, s.tiers[tier].spec.clone(), s.path_of(tier))
        };
        let read = match &path {
            Some(path) => path.read(key, size, buf),
            None => store_read(&spec, key, size, buf),
        };
        let mut s = self.lock();
        if let Some(e) = s.entries.get_mut(&key) {
            e.pins -= 1;
        }
        if matches!(&read, Err(e) if e.kind() == io::ErrorKind::NotFound)
            && path.as_ref().is_some_and(|p| p.is_async())
        {
            // Its queued write failed before the read came: a miss, as in synchronous I/O
            // where the failed write never made an entry.
            s.settle();
            if !s.entries.contains_key(&key) {
                return Ok(Access::Miss);
            }
        }
        #[cfg(feature = "redis")]
        if matches!(&read, Err(e) if e.kind() == io::ErrorKind::NotFound)
            && s.shared().is_some_and(|(t, ..)| t == tier)
        {
            // The cluster's own eviction took it: a miss, as for any evicted entry.
            if let Some(e) = s.entries.remove(&key) {
                s.remove_from(tier, size, e.tick);
            }
            return Ok(Access::Miss);
        }
        let time = read?;
        s.tiers[tier].counters.record_read(size, time);
        s.log(IoOp::Read, size, tier, key);
        Ok(Access::Hit {
            tier: spec.kind,
            size,
            time,
        })
    }

    /// An entry another rank wrote to the shared last tier, read there.
    #[cfg(feature = "redis")]
    fn access_shared(
        &self,
        (tier, kind, cluster): (usize, TierKind, Arc<ClusterStore>),
        key: KeyId,
        buf: &mut IoBuffer,
    ) -> io::Result<Access> {
        let Some((size, time)) = cluster.read(key, buf)? else {
            return Ok(Access::Miss);
        };
        let mut s = self.lock();
        let counters = &mut s.tiers[tier].counters;
        counters.record_read(size, time);
        counters.cross_rank_hits += 1;
        s.log(IoOp::Read, size, tier, key);
        Ok(Access::Hit {
            tier: kind,
            size,
            time,
        })
    }

    /// Whether an entry is cached (written or being written).
    pub fn contains(&self, key: KeyId) -> bool {
        self.lock().entries.contains_key(&key)
    }

    /// Each tier's kind and counters, fastest first.
    pub fn counters(&self) -> Vec<(TierKind, TierCounters)> {
        self.lock()
            .tiers
            .iter()
            .map(|t| {
                let mut c = t.counters.clone();
                c.used_bytes = t.used;
                (t.spec.kind, c)
            })
            .collect()
    }

    /// Waits until the last tier's queued calls are done (asynchronous I/O), and forgets
    /// the entries whose write failed.
    pub fn drain_storage(&self) {
        let path = self.lock().storage.clone();
        if let Some(path) = path {
            path.drain();
        }
        self.lock().settle();
    }

    /// The last tier's calls: how they were made, counted and timed.
    pub fn storage_io(&self) -> Option<StorageIoReport> {
        self.lock().storage.as_ref().map(|p| p.report())
    }

    /// The times of every demotion's read (from the tier above) and write (into the tier
    /// below), by `(tier, is_write)`.
    pub fn demotion_times(&self) -> BTreeMap<(TierKind, bool), OpTimes> {
        self.lock().moves.clone()
    }

    /// How many entries each tier holds, counted entry by entry (a check on the counters).
    pub fn entries_per_tier(&self) -> Vec<(TierKind, u64)> {
        let s = self.lock();
        s.tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let n = s.entries.values().filter(|e| e.tier == i).count() as u64;
                (t.spec.kind, n)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &std::path::Path, name: &str) -> TierStore {
        TierStore::Files {
            dir: dir.join(name),
            mode: FileMode {
                direct: false,
                fsync: false,
                drop_cache_before_read: false,
            },
        }
    }

    fn count_files(dir: &std::path::Path) -> usize {
        walk(dir)
    }

    fn walk(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |d| {
            d.flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        walk(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
    }

    /// The concurrent-eviction scenario that loses entries in kv-cache.py: 40 entries of
    /// 500–3000 tokens that fit the CPU and storage tiers together, written by 1 to 40
    /// threads (at 1/16 of its sizes). Every entry must survive, readable, with usage equal
    /// to what the tiers hold.
    #[test]
    fn every_entry_that_fits_survives_concurrent_waterfall_eviction() {
        let per_token = 24_576 / 16;
        let sizes: Vec<u64> = (0..40u64)
            .map(|i| (500 + (i * 2503) % 2501) * per_token)
            .collect();
        for threads in [1usize, 4, 8, 20, 40] {
            let dir = tempfile::tempdir().expect("tmp");
            let cache = TierCache::new(vec![
                TierSpec {
                    kind: TierKind::Cpu,
                    capacity: Some((1 << 28) / 16),
                    store: files(dir.path(), "cpu"),
                },
                TierSpec {
                    kind: TierKind::Storage,
                    capacity: Some((2 << 30) / 16),
                    store: files(dir.path(), "nvme"),
                },
            ])
            .expect("tiers");
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let (cache, sizes) = (&cache, &sizes);
                    scope.spawn(move || {
                        let mut buf = IoBuffer::new();
                        for (i, &size) in sizes.iter().enumerate().skip(t).step_by(threads) {
                            let got = cache
                                .allocate(KeyId(i as u128), size, i as u64, &mut buf, || {})
                                .expect("write");
                            assert!(matches!(got, Allocation::Written { .. }), "{got:?}");
                        }
                    });
                }
            });
            let mut buf = IoBuffer::new();
            for (i, &size) in sizes.iter().enumerate() {
                match cache.access(KeyId(i as u128), &mut buf).expect("read") {
                    Access::Hit { size: s, .. } => assert_eq!(s, size),
                    Access::Miss => panic!("{threads} threads lost entry {i}"),
                }
            }
            let counters = cache.counters();
            let held: u64 = counters.iter().map(|(_, c)| c.used_bytes).sum();
            assert_eq!(
                held,
                sizes.iter().sum::<u64>(),
                "{threads} threads: usage = entries"
            );
            assert!(counters.iter().all(|(_, c)| c.deletions == 0));
            assert!(
                counters[0].1.demotions > 0,
                "the CPU tier overflowed into storage"
            );
            let entries: Vec<u64> = cache.entries_per_tier().iter().map(|e| e.1).collect();
            assert_eq!(
                entries,
                counters.iter().map(|(_, c)| c.entries).collect::<Vec<_>>()
            );
            assert_eq!(
                count_files(&dir.path().join("cpu")) + count_files(&dir.path().join("nvme")),
                40,
                "one file per entry, none orphaned"
            );
        }
    }

    #[test]
    fn the_last_tier_deletes_its_oldest_entries_and_reads_do_not_promote() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = TierCache::new(vec![
            TierSpec {
                kind: TierKind::Cpu,
                capacity: Some(100_000),
                store: files(dir.path(), "cpu"),
            },
            TierSpec {
                kind: TierKind::Storage,
                capacity: Some(200_000),
                store: files(dir.path(), "nvme"),
            },
        ])
        .expect("tiers");
        let mut buf = IoBuffer::new();
        for i in 0..6u128 {
            cache
                .allocate(KeyId(i), 60_000, i as u64, &mut buf, || {})
                .expect("write");
        }
        assert_eq!(
            cache.access(KeyId(0), &mut buf).expect("read"),
            Access::Miss,
            "oldest deleted"
        );
        match cache.access(KeyId(3), &mut buf).expect("read") {
            Access::Hit { tier, .. } => assert_eq!(tier, TierKind::Storage),
            Access::Miss => panic!("entry 3 is on storage"),
        }
        match cache.access(KeyId(3), &mut buf).expect("read") {
            Access::Hit { tier, .. } => assert_eq!(tier, TierKind::Storage, "not promoted"),
            Access::Miss => panic!("still there"),
        }
        let c = cache.counters();
        assert_eq!(
            c[1].1.bytes_written,
            5 * 60_000,
            "entries 0-4 moved down: demotions count as storage writes"
        );
        assert_eq!(c[1].1.deletions, 2, "entries 0 and 1 made room for 3 and 4");
        assert_eq!(c[0].1.bytes_read, 5 * 60_000, "and as CPU reads");
        // Each of the five moves timed apart from the requests: a read of the CPU tier, a
        // write of the storage tier.
        let moves = cache.demotion_times();
        let count = |kind, write| moves.get(&(kind, write)).map_or(0, |o| o.total_s.len());
        assert_eq!(count(TierKind::Cpu, false), 5);
        assert_eq!(count(TierKind::Storage, true), 5);
        assert_eq!(moves.len(), 2, "nothing else moved");
    }

    /// A CPU tier in front of a file storage tier whose calls go through `workers` queues.
    fn queued(dir: &std::path::Path, cpu: u64, depth: u32, workers: u32) -> TierCache {
        TierCache::with_storage_io(
            vec![
                TierSpec {
                    kind: TierKind::Cpu,
                    capacity: Some(cpu),
                    store: files(dir, "cpu"),
                },
                TierSpec {
                    kind: TierKind::Storage,
                    capacity: Some(10_000_000),
                    store: files(dir, "nvme"),
                },
            ],
            L2Io::asynchronous(depth, workers).expect("valid"),
        )
        .expect("tiers")
    }

    #[test]
    fn queued_storage_io_reads_back_every_entry_it_was_just_handed() {
        let dir = tempfile::tempdir().expect("tmp");
        // A small CPU tier: most entries are demoted into storage through the queues, and
        // each is read back at once, often while its write still waits.
        let cache = queued(dir.path(), 100_000, 2, 2);
        let mut buf = IoBuffer::new();
        for i in 0..30u128 {
            let size = 20_000 + 1_000 * i as u64;
            cache
                .allocate(KeyId(i), size, i as u64, &mut buf, || {})
                .expect("write");
            for j in 0..=i {
                match cache.access(KeyId(j), &mut buf).expect("read") {
                    Access::Hit { size: got, .. } => assert_eq!(got, 20_000 + 1_000 * j as u64),
                    Access::Miss => panic!("entry {j} lost after entry {i}"),
                }
            }
        }
        cache.drain_storage();
        let c = cache.counters();
        let io = cache.storage_io().expect("a storage tier");
        assert_eq!(
            (io.mode, io.workers, io.queue_depth),
            ("asynchronous", Some(2), Some(2))
        );
        assert_eq!(
            io.calls.writes, c[1].1.writes,
            "every storage write went through"
        );
        assert_eq!(io.calls.reads, c[1].1.reads);
        assert_eq!(
            (io.write_errors, io.read_errors, io.calls.lost_reads),
            (0, 0, 0)
        );
        assert_eq!(io.calls.bytes_written, c[1].1.bytes_written);
        assert!(c[1].1.writes > 20, "most entries went down: {:?}", c[1].1);
        assert_eq!(
            count_files(&dir.path().join("nvme")) as u64,
            c[1].1.entries,
            "one file per stored entry once drained"
        );
    }

    #[test]
    fn a_queued_write_the_disk_refuses_leaves_no_entry_and_is_counted() {
        let dir = tempfile::tempdir().expect("tmp");
        // No CPU room: every entry goes straight to storage.
        let cache = queued(dir.path(), 1, 4, 1);
        let nvme = dir.path().join("nvme");
        // Keys in three fan-out directories (a key's first byte names its directory).
        let key = |i: u128| KeyId(i << 120);
        let blocked = object_path(&nvme, key(7));
        // Its fan-out directory is a plain file: the write cannot land.
        std::fs::write(blocked.parent().expect("fan-out"), b"not a directory").expect("file");
        let mut buf = IoBuffer::new();
        for i in [6u128, 7, 8] {
            let got = cache
                .allocate(key(i), 5_000, 1, &mut buf, || {})
                .expect("queued");
            assert!(matches!(
                got,
                Allocation::Written {
                    tier: TierKind::Storage,
                    ..
                }
            ));
        }
        cache.drain_storage();
        assert_eq!(
            cache.access(key(7), &mut buf).expect("a miss"),
            Access::Miss
        );
        assert!(matches!(
            cache.access(key(8), &mut buf),
            Ok(Access::Hit { .. })
        ));
        let storage = &cache.counters()[1].1;
        assert_eq!((storage.entries, storage.queued_write_errors), (2, 1));
        let io = cache.storage_io().expect("a storage tier");
        assert_eq!((io.calls.writes, io.write_errors), (3, 1));
        assert!(io.calls.first_error.is_some());
    }

    #[test]
    fn synchronous_storage_calls_are_timed_with_no_queue_wait() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = TierCache::new(vec![TierSpec {
            kind: TierKind::Storage,
            capacity: Some(12_000),
            store: files(dir.path(), "nvme"),
        }])
        .expect("tiers");
        let mut buf = IoBuffer::new();
        for i in 0..3u128 {
            cache
                .allocate(KeyId(i), 5_000, 1, &mut buf, || {})
                .expect("write");
        }
        assert!(matches!(
            cache.access(KeyId(2), &mut buf),
            Ok(Access::Hit { .. })
        ));
        let io = cache.storage_io().expect("a storage tier");
        assert_eq!(io.mode, "synchronous");
        assert_eq!(
            (io.calls.writes, io.calls.reads, io.calls.deletes),
            (3, 1, 1),
            "the third entry deleted the first"
        );
        assert_eq!(io.calls.queue_wait_ms.max_ms, 0.0);
        assert!(io.calls.service_ms.max_ms > 0.0);
    }
}
