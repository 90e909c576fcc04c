//! The cost of one eviction, per policy and timing, at two L1 populations a hundred times
//! apart: with O(1) (LFU: O(log n)) eviction the per-object time stays flat as L1 grows.
//! Run: `cargo bench --bench eviction`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvtrace::storage::config::{EvictionTiming, StorageConfig};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::{KeyId, StorageManager};

const OBJECT: u64 = 4096;

/// An accounting-only L1 holding exactly `resident` objects, all admitted.
fn full(policy: PolicyKind, timing: EvictionTiming, resident: u64) -> StorageManager {
    let mut config = StorageConfig {
        l1_size_bytes: resident * OBJECT,
        l1_buffers: false,
        ..StorageConfig::default()
    };
    config.eviction.policy = policy;
    config.eviction.timing = timing;
    let mut sm = StorageManager::new(config).expect("manager");
    for n in 0..resident {
        let key = [KeyId(u128::from(n))];
        sm.reserve_write(&key, OBJECT);
        sm.finish_write(&key).expect("admit");
        if n % 3 == 0 {
            sm.touch_keys(&key);
        }
    }
    sm
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("eviction");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for resident in [1_000u64, 100_000] {
        for policy in [
            PolicyKind::Lru,
            PolicyKind::Arc,
            PolicyKind::Fifo,
            PolicyKind::Lfu,
        ] {
            // Immediate: every new object evicts exactly one.
            let mut sm = full(policy, EvictionTiming::Immediate, resident);
            let mut next = resident;
            group.throughput(Throughput::Elements(1));
            group.bench_function(format!("immediate_{policy}_{resident}"), |b| {
                b.iter(|| {
                    let key = [KeyId(u128::from(next))];
                    next += 1;
                    sm.reserve_write(&key, OBJECT);
                    sm.finish_write(&key).expect("admit")
                })
            });
            // Periodic: one pass over a full L1 evicts a fifth of it.
            let periodic = EvictionTiming::Periodic {
                interval_s: 1.0,
                phase_s: 0.0,
            };
            group.throughput(Throughput::Elements(resident / 5));
            group.bench_function(format!("periodic_pass_{policy}_{resident}"), |b| {
                b.iter_batched(
                    || full(policy, periodic, resident),
                    |mut sm| {
                        sm.advance_to(1.5);
                        sm
                    },
                    BatchSize::LargeInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
