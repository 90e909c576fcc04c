//! The cache kvtrace replays, simulates and benchmarks against: LMCache's StorageManager on
//! key ids with its tiers and eviction policies ([`storage`]), the event bus that carries
//! every traced call to its subscribers with the LMCT recorder among them ([`bus`]), and the
//! clocks both stamp time with ([`clock`]). The storage manager publishes to the bus and the
//! recorder reads the storage configuration, so the two live in one crate.

#![warn(unreachable_pub)]

pub mod bus;
pub mod clock;
pub mod storage;
