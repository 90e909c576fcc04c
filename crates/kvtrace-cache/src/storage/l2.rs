//! One L2 tier: a backend (memory, file, Redis, S3, GPU budget, null) with an optional capacity
//! and its own eviction policy, written through from L1 or fed by a waterfall.
//!
//! The tier's accounting (which objects it holds, their sizes, its policy) is kept here on
//! the manager's thread. Its backend calls run inside the manager's call (synchronous I/O)
//! or on the tier's [`IoQueues`] (asynchronous I/O); either way the accounting decides what
//! hits, so both modes give the same cache figures.

use std::io;
use std::time::{Duration, Instant};

use super::backend::{Backend, GpuBudget, Memory, Null};
use super::config::{BackendConfig, L2Config, L2Io};
use super::io_queue::{IoDone, IoKind, IoQueues, IoRecord, QueueFigures};
use super::{file, KeyId, KeyMap, TierStats};

/// The time a transfer counts for: the device model's when the backend has one, else what
/// was measured.
pub(super) fn transfer_time(backend: &dyn Backend, size: u64, measured: Duration) -> Duration {
    backend.modelled_seconds(size).map_or(measured, |s| {
        Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
    })
}

fn build_backend(config: &BackendConfig) -> io::Result<Box<dyn Backend>> {
    Ok(match config {
        BackendConfig::Memory { buffers } => Box::new(Memory::new(*buffers)),
        BackendConfig::File { dir, direct, fsync } => {
            Box::new(file::FileTier::create(dir, *direct, *fsync)?)
        }
        #[cfg(feature = "redis")]
        BackendConfig::Redis { url, prefix } => {
            Box::new(super::redis::RedisTier::connect(url, prefix)?)
        }
        #[cfg(feature = "redis")]
        BackendConfig::RespCluster { nodes, prefix } => {
            Box::new(super::cluster::ClusterTier::connect(nodes, prefix)?)
        }
        #[cfg(not(feature = "redis"))]
        BackendConfig::Redis { url, .. } => {
            return Err(io::Error::other(format!(
                "the redis tier at {url} needs a kvtrace built with the `redis` feature"
            )))
        }
        #[cfg(not(feature = "redis"))]
        BackendConfig::RespCluster { nodes, .. } => {
            return Err(io::Error::other(format!(
                "the resp-cluster tier at {} needs a kvtrace built with the `redis` feature",
                nodes.join(",")
            )))
        }
        #[cfg(feature = "s3")]
        BackendConfig::S3(at) => Box::new(super::s3::S3Tier::connect(at)?),
        #[cfg(not(feature = "s3"))]
        BackendConfig::S3(at) => {
            return Err(io::Error::other(format!(
                "the s3 tier of bucket {} needs a kvtrace built with the `s3` feature",
                at.bucket
            )))
        }
        BackendConfig::Gpu { bandwidth_gbps } => Box::new(GpuBudget::new(*bandwidth_gbps)),
        BackendConfig::Null => Box::new(Null),
    })
}

pub(super) struct L2 {
    pub capacity: Option<u64>,
    pub used: u64,
    pub sizes: KeyMap<u64>,
    /// Objects a shared tier's lookup found that this process did not store, with their
    /// lengths: a load of one is a cross-rank hit.
    foreign: KeyMap<u64>,
    pub policy: Box<dyn super::eviction::EvictionPolicy>,
    /// Does the I/O when it is synchronous; with asynchronous I/O it only answers a shared
    /// tier's lookups (its workers have backends of their own).
    backend: Box<dyn Backend>,
    /// The workers, with asynchronous I/O.
    queues: Option<IoQueues>,
    /// The timing of synchronous calls.
    timing: IoRecord,
    pub stats: TierStats,
}

impl L2 {
    pub(super) fn new(index: usize, config: &L2Config, io: L2Io) -> io::Result<L2> {
        let backend = build_backend(&config.backend)?;
        let name = format!("L2[{index}]");
        let queues = match io {
            L2Io::Synchronous => None,
            L2Io::Asynchronous { depth, workers } => {
                let backends = (0..workers)
                    .map(|_| build_backend(&config.backend))
                    .collect::<io::Result<Vec<_>>>()?;
                Some(IoQueues::start(&name, backends, depth)?)
            }
        };
        Ok(L2 {
            capacity: config.capacity_bytes,
            used: 0,
            sizes: KeyMap::default(),
            foreign: KeyMap::default(),
            policy: config.policy.build(),
            stats: TierStats {
                name,
                backend: backend.name().into(),
                capacity_bytes: config.capacity_bytes,
                ..TierStats::default()
            },
            backend,
            queues,
            timing: IoRecord::default(),
        })
    }

    /// Times one synchronous backend call made by `call`.
    fn timed<T>(
        &mut self,
        kind: IoKind,
        bytes: u64,
        call: impl FnOnce(&mut dyn Backend) -> io::Result<T>,
        found: impl Fn(&T) -> bool,
    ) -> io::Result<T> {
        let started = Instant::now();
        let result = call(&mut *self.backend);
        let finished = Instant::now();
        let outcome = match &result {
            Ok(v) => Ok(found(v)),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        let done = IoDone {
            kind,
            bytes,
            issued: started,
            started,
            finished,
            service: transfer_time(&*self.backend, bytes, finished - started),
            due: None,
            outcome,
        };
        self.timing.add(done, &[]);
        result
    }

    /// Drops from the accounting what an asynchronous write failed to store, as a refused
    /// synchronous store leaves nothing resident.
    fn settle(&mut self) {
        let Some(queues) = &self.queues else {
            return;
        };
        for key in queues.take_failed_writes() {
            if let Some(size) = self.sizes.remove(&key) {
                self.used -= size;
                self.policy.on_removed(&[key]);
            }
        }
    }

    /// The trace time of the manager call now running (the due time of asynchronous calls
    /// in a paced replay).
    pub(super) fn set_now(&mut self, now: f64) {
        if let Some(q) = &mut self.queues {
            q.set_now(now);
        }
    }

    /// Maps the trace's clock to wall time for asynchronous calls' schedule lag.
    pub(super) fn pace(&mut self, epoch: Instant, base: f64, speedup: f64) {
        if let Some(q) = &mut self.queues {
            q.pace(epoch, base, speedup);
        }
    }

    /// Waits for every queued call to finish.
    pub(super) fn drain(&mut self) {
        if let Some(q) = &mut self.queues {
            q.drain();
        }
        self.settle();
    }

    /// The tier's backend calls: how many, how long, how late.
    pub(super) fn queue_figures(&self) -> QueueFigures {
        match &self.queues {
            Some(q) => q.with_record(|r| r.summary(q.paced())),
            None => self.timing.summary(false),
        }
    }

    /// Seconds spent writing and reading (modelled for a GPU budget).
    pub(super) fn io_seconds(&self) -> (f64, f64) {
        let of = |r: &IoRecord| (r.write_time.as_secs_f64(), r.read_time.as_secs_f64());
        match &self.queues {
            Some(q) => q.with_record(of),
            None => of(&self.timing),
        }
    }

    /// Whether the tier's calls run on its workers.
    fn asynchronous(&self) -> bool {
        self.queues.is_some()
    }

    pub(super) fn holds(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }

    /// Which of `keys` the tier holds: its own records, or — for a tier other processes
    /// share — the backend's answer, one batch for the call.
    /// With asynchronous I/O this process's own objects are answered from its records
    /// (their writes may still be queued) and only the others are asked for.
    pub(super) fn lookup(&mut self, keys: &[KeyId]) -> io::Result<Vec<bool>> {
        self.settle();
        if !self.backend.shared() {
            return Ok(keys.iter().map(|&k| self.holds(k)).collect());
        }
        let asked: Vec<KeyId> = if self.asynchronous() {
            keys.iter().copied().filter(|&k| !self.holds(k)).collect()
        } else {
            keys.to_vec()
        };
        let found = self
            .backend
            .lookup(&asked)
            .inspect_err(|_| self.stats.read_errors += 1)?;
        for (&key, length) in asked.iter().zip(&found) {
            if let (Some(n), false) = (length, self.holds(key)) {
                self.foreign.insert(key, *n);
            }
        }
        let mut answers = found.into_iter();
        Ok(keys
            .iter()
            .map(|&key| {
                if self.asynchronous() && self.holds(key) {
                    true
                } else {
                    answers.next().flatten().is_some()
                }
            })
            .collect())
    }

    /// Drops the tier's least valuable object by policy; its size, or `None` when nothing
    /// is left to drop.
    pub(super) fn drop_victim(&mut self) -> io::Result<Option<(KeyId, u64)>> {
        let Some(&victim) = self.policy.select(1, &mut |_| true).first() else {
            return Ok(None);
        };
        self.policy.on_removed(&[victim]);
        let freed = self.sizes.remove(&victim).unwrap_or(0);
        self.used -= freed;
        self.stats.evictions += 1;
        self.stats.bytes_evicted += freed;
        Ok(Some((victim, freed)))
    }

    /// Write-through of one object (the store controller's store task); an object the tier
    /// already holds is skipped, as LMCache's file adapter skips an existing file. Evicts by
    /// the tier's policy when it would not fit.
    pub(super) fn store(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        self.settle();
        if self.holds(key) {
            return Ok(());
        }
        if let Some(cap) = self.capacity {
            if size > cap {
                return Ok(());
            }
            while self.used.saturating_add(size) > cap {
                match self.drop_victim()? {
                    Some((victim, _)) => self.delete(victim)?,
                    None => return Ok(()),
                }
            }
        }
        self.admit(key, size)
    }

    /// Writes an object into this tier and accounts for it (a `null` backend keeps nothing,
    /// so nothing becomes resident).
    pub(super) fn admit(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        match &mut self.queues {
            Some(q) => q.write(key, size),
            None => {
                self.timed(IoKind::Write, size, |b| b.put(key, size), |_| true)
                    .inspect_err(|_| self.stats.write_errors += 1)?;
            }
        }
        self.account_write(key, size);
        Ok(())
    }

    /// Accounts for an object the backend took (or, with asynchronous I/O, was given):
    /// resident where the backend keeps objects, and counted as a write either way.
    fn account_write(&mut self, key: KeyId, size: u64) {
        if self.backend.keeps() {
            self.sizes.insert(key, size);
            self.policy.on_created(&[key]);
            self.used += size;
        }
        self.stats.writes += 1;
        self.stats.bytes_written += size;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.used);
    }

    /// Writes a batch through (a `finish_write`'s keys): one batch for a shared tier, whose
    /// capacity is the cluster's own, skipping what it is known to hold already (stored by
    /// this process or found there by a lookup); one object at a time otherwise. On a
    /// refusal every object of the batch counts as refused.
    pub(super) fn store_many(&mut self, objects: &[(KeyId, u64)]) -> io::Result<()> {
        self.settle();
        if !self.backend.shared() {
            let mut first_error = None;
            for &(key, size) in objects {
                if let Err(e) = self.store(key, size) {
                    first_error.get_or_insert(e);
                }
            }
            return first_error.map_or(Ok(()), Err);
        }
        let new: Vec<(KeyId, u64)> = objects
            .iter()
            .copied()
            .filter(|(key, _)| !self.holds(*key) && !self.foreign.contains_key(key))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        match &mut self.queues {
            Some(q) => q.write_many(&new),
            None => {
                let bytes = new.iter().map(|o| o.1).sum();
                if let Err(e) = self.timed(IoKind::Write, bytes, |b| b.put_many(&new), |_| true) {
                    self.stats.write_errors += new.len() as u64;
                    return Err(e);
                }
            }
        }
        for (key, size) in new {
            self.account_write(key, size);
        }
        Ok(())
    }

    /// Reads an object back for a load into L1; false when the backend no longer has it.
    /// On a shared tier an object this process did not store is a cross-rank hit.
    /// With asynchronous I/O the records decide (the read is queued; one that finds nothing
    /// is counted as lost).
    pub(super) fn load(&mut self, key: KeyId) -> io::Result<bool> {
        self.settle();
        let own = self.sizes.get(&key).copied();
        let theirs = self.foreign.get(&key).copied();
        let size = own.or(theirs).unwrap_or(0);
        let found = match &mut self.queues {
            Some(q) => {
                let known = own.is_some() || theirs.is_some();
                if known {
                    q.read(key, size);
                }
                known
            }
            None => self
                .timed(IoKind::Read, size, |b| b.get(key), |&found| found)
                .inspect_err(|_| self.stats.read_errors += 1)?,
        };
        if found {
            self.policy.on_touched(&[key]);
            self.stats.reads += 1;
            self.stats.bytes_read += size;
            if own.is_none() && self.backend.shared() {
                self.stats.cross_rank_hits += 1;
            }
        }
        Ok(found)
    }

    /// Removes an object (an explicit delete, or a demotion moving it down).
    pub(super) fn remove(&mut self, key: KeyId) -> io::Result<()> {
        if let Some(size) = self.sizes.remove(&key) {
            self.used -= size;
            self.policy.on_removed(&[key]);
            self.delete(key)?;
        }
        Ok(())
    }

    /// Deletes an object from the backend, counting a refusal.
    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        match &mut self.queues {
            Some(q) => {
                q.delete(key);
                Ok(())
            }
            None => self
                .timed(IoKind::Delete, 0, |b| b.delete(key), |_| true)
                .inspect_err(|_| self.stats.delete_errors += 1),
        }
    }

    /// Moves a victim out of the tier for a demotion: reads it back and deletes it.
    pub(super) fn move_out(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        self.stats.reads += 1;
        self.stats.bytes_read += size;
        match &mut self.queues {
            Some(q) => {
                q.read(key, size);
                q.delete(key);
                Ok(())
            }
            None => {
                self.timed(IoKind::Read, size, |b| b.get(key), |&found| found)?;
                self.delete(key)
            }
        }
    }

    /// The counters; with asynchronous I/O, the failures its workers met are added.
    pub(super) fn tier_stats(&self) -> TierStats {
        let mut s = self.stats.clone();
        s.resident_bytes = self.used;
        s.resident_objects = self.sizes.len() as u64;
        if let Some(q) = &self.queues {
            q.with_record(|r| {
                s.write_errors += r.write_errors;
                s.read_errors += r.read_errors;
                s.delete_errors += r.delete_errors;
            });
        }
        s
    }
}

#[cfg(all(test, any(not(feature = "redis"), not(feature = "s3"))))]
mod tests {
    use super::*;
    use crate::storage::eviction::PolicyKind;

    /// A tier of `backend` is refused in one line naming the missing `feature`.
    fn refused_without(backend: BackendConfig, feature: &str) {
        let config = L2Config {
            backend,
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        };
        let e = L2::new(0, &config, L2Io::Synchronous)
            .err()
            .expect("the feature is missing")
            .to_string();
        assert!(
            e.contains(&format!(
                "needs a kvtrace built with the `{feature}` feature"
            )) && !e.contains('\n'),
            "{e}"
        );
    }

    #[cfg(not(feature = "redis"))]
    #[test]
    fn a_redis_tier_without_the_feature_is_a_one_line_error() {
        let backend = BackendConfig::Redis {
            url: "redis://127.0.0.1:6379/0".into(),
            prefix: "p".into(),
        };
        refused_without(backend, "redis");
    }

    #[cfg(not(feature = "s3"))]
    #[test]
    fn an_s3_tier_without_the_feature_is_a_one_line_error() {
        let backend = BackendConfig::S3(crate::storage::config::S3Location {
            endpoint: Some("http://127.0.0.1:9000".into()),
            bucket: "kv-cache".into(),
            prefix: "p".into(),
            region: None,
        });
        refused_without(backend, "s3");
    }
}
