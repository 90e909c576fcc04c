//! `kvtrace simulate`: request traces through simulated serving engines. Workloads
//! ([`workload`]) arrive on a virtual clock ([`offline`]), a router ([`router`]) places them
//! on mock engines ([`engine`], with the KV pool of [`blocks`] and the timing of [`perf`]),
//! and the [`collector`] turns what happened into the report [`output`] prints.

pub mod args;
pub mod blocks;
pub mod collector;
pub mod engine;
pub mod offline;
pub mod output;
pub mod perf;
pub mod router;
pub mod sketch;
pub mod workload;

/// Hashes of prompt blocks are xxh3 outputs already: maps keyed by them use the value itself.
#[derive(Default, Clone, Copy)]
pub struct BlockHashHasher(u64);

impl std::hash::Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockHashBuild = std::hash::BuildHasherDefault<BlockHashHasher>;
/// A map keyed by block hash.
pub type BlockMap<V> = std::collections::HashMap<u64, V, BlockHashBuild>;
/// A set of block hashes.
pub type BlockSet = std::collections::HashSet<u64, BlockHashBuild>;
