//! Cost of a traced call with nothing recording and while recording, and the sustained
//! recording rate to a file. Run: `cargo bench --bench recorder`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvtrace::bus::recorder::{Recorder, RecorderOptions};
use kvtrace::bus::{BusOptions, EventBus, Subscriber, Tracer};
use kvtrace::lmct::calls::StorageCall;
use kvtrace::lmct::codec::ObjectKey;

/// A realistic traced call: `finish_write` of 5 chunk keys, a 788-byte record (the real
/// LMCache sample files average 728 bytes per record).
fn keys() -> Vec<ObjectKey> {
    (0..5u8)
        .map(|i| ObjectKey {
            chunk_hash: vec![i; 32],
            model_name: "meta-llama/Llama-3.1-8B".into(),
            kv_rank: 16_777_472,
            object_group_id: 0,
            cache_salt: String::new(),
        })
        .collect()
}

fn traced_call(tracer: &Tracer, keys: &[ObjectKey]) {
    let call = StorageCall::FinishWrite { keys };
    tracer.publish_call(call.qualname(), |buf| call.encode_args(buf));
}

fn recording_bus(dir: &tempfile::TempDir, capacity: usize) -> EventBus {
    let recorder = Recorder::create(&dir.path().join("bench.lct"), RecorderOptions::default())
        .expect("recorder");
    let subscribers: Vec<Box<dyn Subscriber>> = vec![Box::new(recorder)];
    let options = BusOptions {
        capacity,
        ..BusOptions::default()
    };
    EventBus::start(options, subscribers).expect("bus")
}

fn tracer_cost(c: &mut Criterion) {
    let keys = keys();
    let mut group = c.benchmark_group("recorder");
    let off = Tracer::disabled();
    group.bench_function("traced_call_not_recording", |b| {
        b.iter(|| traced_call(std::hint::black_box(&off), &keys))
    });
    // The loop and black_box alone, to subtract from the figure above.
    group.bench_function("baseline_loop_and_black_box", |b| {
        b.iter(|| std::hint::black_box(&off))
    });
    // The calling thread's own cost: a queue that never fills, so no call waits for the
    // drain thread; the recorder still writes every event to a file concurrently.
    group.bench_function("traced_call_recording_calling_thread", |b| {
        b.iter_custom(|iters| {
            let dir = tempfile::tempdir().expect("tempdir");
            let bus = recording_bus(&dir, iters as usize + 1);
            let tracer = bus.tracer();
            let start = Instant::now();
            for _ in 0..iters {
                traced_call(&tracer, &keys);
            }
            let elapsed = start.elapsed();
            let reports = bus.close().expect("close");
            assert_eq!(reports[0].events, iters);
            elapsed
        })
    });

    const RECORDS: u64 = 1_000_000;
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(30));
    group.throughput(Throughput::Elements(RECORDS));
    group.bench_function("record_1M_calls_to_file_lossless", |b| {
        b.iter_batched(
            || tempfile::tempdir().expect("tempdir"),
            |dir| {
                let start = Instant::now();
                let bus = recording_bus(&dir, BusOptions::default().capacity);
                let tracer = bus.tracer();
                for _ in 0..RECORDS {
                    traced_call(&tracer, &keys);
                }
                let reports = bus.close().expect("close");
                assert_eq!(reports[0].events, RECORDS);
                assert_eq!(tracer.dropped(), 0);
                (start.elapsed(), dir)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, tracer_cost);
criterion_main!(benches);
