//! Where a tier keeps its objects. `memory` holds real buffers (zero-filled, as LMCache's
//! replay leaves them) or only accounts for them; `gpu` is a capacity and bandwidth budget
//! for machines without a GPU; `null` keeps nothing and only counts.

use std::io;

use super::{KeyId, KeyMap};

/// The storage behind one tier.
pub trait Backend: Send {
    fn name(&self) -> &'static str;
    /// Stores an object of `size` bytes.
    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()>;
    /// Reads an object back; `false` if the backend does not hold it.
    fn get(&mut self, key: KeyId) -> io::Result<bool>;
    fn delete(&mut self, key: KeyId) -> io::Result<()>;
    /// Whether the backend holds an object this process stored (a `null` backend keeps
    /// nothing).
    fn contains(&self, key: KeyId) -> bool;
    /// Whether a stored object stays (everything but `null`): what makes it resident in
    /// the tier's accounting.
    fn keeps(&self) -> bool {
        true
    }
    /// A tier every rank of a run shares (a cluster): other processes add objects to it, so
    /// a lookup asks it ([`Backend::lookup`]) instead of trusting this process's records.
    fn shared(&self) -> bool {
        false
    }
    /// The length of each key's object where the backend holds it. Only a shared backend
    /// is asked; the default answers from this process's own records, lengths unknown (0).
    fn lookup(&mut self, keys: &[KeyId]) -> io::Result<Vec<Option<u64>>> {
        Ok(keys
            .iter()
            .map(|&k| self.contains(k).then_some(0))
            .collect())
    }
    /// Stores a batch of objects: one round trip per node where the backend is remote.
    fn put_many(&mut self, objects: &[(KeyId, u64)]) -> io::Result<()> {
        objects
            .iter()
            .try_for_each(|&(key, size)| self.put(key, size))
    }
    /// Seconds one transfer of `size` bytes takes on a modelled device; `None` for backends
    /// whose time is measured.
    fn modelled_seconds(&self, _size: u64) -> Option<f64> {
        None
    }
}

/// Objects in process memory.
pub struct Memory {
    /// Keep real zero-filled buffers (true) or only their sizes (for traces bigger than RAM).
    buffers: bool,
    objects: KeyMap<Vec<u8>>,
    sizes: KeyMap<u64>,
    /// Where reads land, so a read touches the bytes as a real copy would.
    scratch: Vec<u8>,
}

impl Memory {
    pub fn new(buffers: bool) -> Memory {
        Memory {
            buffers,
            objects: KeyMap::default(),
            sizes: KeyMap::default(),
            scratch: Vec::new(),
        }
    }
}

impl Backend for Memory {
    fn name(&self) -> &'static str {
        if self.buffers {
            "memory"
        } else {
            "memory (accounting only)"
        }
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        if self.buffers {
            let len = usize::try_from(size).map_err(io::Error::other)?;
            self.objects.insert(key, vec![0u8; len]);
        } else {
            self.sizes.insert(key, size);
        }
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        if !self.buffers {
            return Ok(self.sizes.contains_key(&key));
        }
        match self.objects.get(&key) {
            Some(data) => {
                self.scratch.clear();
                self.scratch.extend_from_slice(data);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        self.objects.remove(&key);
        self.sizes.remove(&key);
        Ok(())
    }

    fn contains(&self, key: KeyId) -> bool {
        self.objects.contains_key(&key) || self.sizes.contains_key(&key)
    }
}

/// Holds nothing: every store is counted and forgotten, every lookup misses.
pub struct Null;

impl Backend for Null {
    fn name(&self) -> &'static str {
        "null"
    }

    fn put(&mut self, _: KeyId, _: u64) -> io::Result<()> {
        Ok(())
    }

    fn get(&mut self, _: KeyId) -> io::Result<bool> {
        Ok(false)
    }

    fn delete(&mut self, _: KeyId) -> io::Result<()> {
        Ok(())
    }

    fn contains(&self, _: KeyId) -> bool {
        false
    }

    fn keeps(&self) -> bool {
        false
    }
}

/// A GPU's KV memory as a budget: it accounts for what it holds (the tier's capacity is the
/// budget) and charges every store and load `size / bandwidth`, so a hierarchy with a GPU
/// tier can be sized and replayed on a machine without one. Deterministic by construction.
pub struct GpuBudget {
    bytes_per_s: f64,
    sizes: KeyMap<u64>,
}

impl GpuBudget {
    /// `bandwidth_gbps` in GB/s (10^9 bytes), as PCIe and NVLink figures are quoted.
    pub fn new(bandwidth_gbps: f64) -> GpuBudget {
        GpuBudget {
            bytes_per_s: bandwidth_gbps * 1e9,
            sizes: KeyMap::default(),
        }
    }
}

impl Backend for GpuBudget {
    fn name(&self) -> &'static str {
        "gpu (budget)"
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        self.sizes.insert(key, size);
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        Ok(self.sizes.contains_key(&key))
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        self.sizes.remove(&key);
        Ok(())
    }

    fn contains(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }

    fn modelled_seconds(&self, size: u64) -> Option<f64> {
        Some(size as f64 / self.bytes_per_s)
    }
}
