//! One L2 tier: a backend (memory, file, Redis, S3, GPU budget, null) with an optional capacity
//! and its own eviction policy, written through from L1 or fed by a waterfall.

use std::io;
use std::time::{Duration, Instant};

use super::backend::{Backend, GpuBudget, Memory, Null};
use super::config::{BackendConfig, L2Config};
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
    pub backend: Box<dyn Backend>,
    pub stats: TierStats,
    pub write_time: Duration,
    pub read_time: Duration,
}

impl L2 {
    pub(super) fn new(index: usize, config: &L2Config) -> io::Result<L2> {
        let backend = build_backend(&config.backend)?;
        Ok(L2 {
            capacity: config.capacity_bytes,
            used: 0,
            sizes: KeyMap::default(),
            foreign: KeyMap::default(),
            policy: config.policy.build(),
            stats: TierStats {
                name: format!("L2[{index}]"),
                backend: backend.name().into(),
                capacity_bytes: config.capacity_bytes,
                ..TierStats::default()
            },
            backend,
            write_time: Duration::ZERO,
            read_time: Duration::ZERO,
        })
    }

    pub(super) fn holds(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }

    /// Which of `keys` the tier holds: its own records, or — for a tier other processes
    /// share — the backend's answer, one batch for the call.
    pub(super) fn lookup(&mut self, keys: &[KeyId]) -> io::Result<Vec<bool>> {
        if !self.backend.shared() {
            return Ok(keys.iter().map(|&k| self.holds(k)).collect());
        }
        let found = self
            .backend
            .lookup(keys)
            .inspect_err(|_| self.stats.read_errors += 1)?;
        Ok(keys
            .iter()
            .zip(found)
            .map(|(&key, length)| match length {
                Some(n) => {
                    if !self.holds(key) {
                        self.foreign.insert(key, n);
                    }
                    true
                }
                None => false,
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
        let began = Instant::now();
        if let Err(e) = self.backend.put(key, size) {
            self.stats.write_errors += 1;
            return Err(e);
        }
        self.write_time += transfer_time(&*self.backend, size, began.elapsed());
        self.account_write(key, size);
        Ok(())
    }

    /// Accounts for an object the backend took: resident where the backend keeps it, and
    /// counted as a write either way.
    fn account_write(&mut self, key: KeyId, size: u64) {
        if self.backend.contains(key) {
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
        let began = Instant::now();
        if let Err(e) = self.backend.put_many(&new) {
            self.stats.write_errors += new.len() as u64;
            return Err(e);
        }
        self.write_time += began.elapsed();
        for (key, size) in new {
            self.account_write(key, size);
        }
        Ok(())
    }

    /// Reads an object back for a load into L1; false when the backend no longer has it.
    /// On a shared tier an object this process did not store is a cross-rank hit.
    pub(super) fn load(&mut self, key: KeyId) -> io::Result<bool> {
        let own = self.sizes.get(&key).copied();
        let size = own.or_else(|| self.foreign.get(&key).copied()).unwrap_or(0);
        let began = Instant::now();
        let found = self
            .backend
            .get(key)
            .inspect_err(|_| self.stats.read_errors += 1)?;
        self.read_time += transfer_time(&*self.backend, size, began.elapsed());
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
        self.backend
            .delete(key)
            .inspect_err(|_| self.stats.delete_errors += 1)
    }

    pub(super) fn tier_stats(&self) -> TierStats {
        let mut s = self.stats.clone();
        s.resident_bytes = self.used;
        s.resident_objects = self.sizes.len() as u64;
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
        let e = L2::new(0, &config)
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
