//! As-fast-as-possible replay of a generated trace on an accounting-only L1 (the bookkeeping
//! cost of the StorageManager, without payload copies): calls/s per eviction policy and
//! timing under pressure, and without eviction. Run: `cargo bench --bench replay`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvtrace::replay::{replay, ReplayOptions};
use kvtrace::storage::config::{EvictionConfig, EvictionTiming, StorageConfig};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::StorageManager;
use kvtrace::trace::synth::{self, SynthOptions};

const RECORDS: u64 = 200_000;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("replay.lct");
    let options = SynthOptions {
        records: RECORDS,
        ..SynthOptions::default()
    };
    synth::write_file(&options, &path, None, kvtrace::trace::QUIET).expect("trace");
    let mut group = c.benchmark_group("replay");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(RECORDS));
    // Unbounded (no eviction), then every policy under pressure with both timings.
    let mut configs = vec![("lru_unbounded".to_string(), PolicyKind::Lru, 64u64, None)];
    for policy in [
        PolicyKind::Lru,
        PolicyKind::Arc,
        PolicyKind::Lfu,
        PolicyKind::Fifo,
    ] {
        for (timing, name) in [
            (EvictionConfig::default().timing, "periodic"),
            (EvictionTiming::Immediate, "immediate"),
        ] {
            let label = format!("{policy:?}_2gb_{name}").to_lowercase();
            configs.push((label, policy, 2, Some(timing)));
        }
    }
    for (name, policy, size_gb, timing) in configs {
        let mut config = StorageConfig {
            l1_size_bytes: size_gb << 30,
            l1_buffers: false,
            ..StorageConfig::default()
        };
        config.eviction.policy = policy;
        if let Some(timing) = timing {
            config.eviction.timing = timing;
        }
        group.bench_function(format!("afap_200k_records_{name}"), |b| {
            b.iter(|| {
                let mut sm = StorageManager::new(config.clone()).expect("manager");
                let report =
                    replay(&path, &mut sm, &ReplayOptions::default(), |_| {}).expect("replay");
                assert_eq!(report.records, RECORDS);
                report.hits.hit_chunks
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
