//! Decode and encode throughput on a generated 1M-record trace of realistic records, and the
//! block reader that `info` uses on one core and on all of them (records/s and bytes/s).
//! Run: `cargo bench --bench lmct`. Figures are in README's Performance section.

use std::io::Cursor;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvtrace::lmct::blocks::fold_records;
use kvtrace::lmct::{ReadOptions, Record, TraceReader, TraceWriter};
use kvtrace::trace::synth::{self, SynthOptions};

const RECORDS: u64 = 1_000_000;

/// The trace lives for the whole run, so readers can borrow it without copying.
fn trace() -> &'static [u8] {
    let options = SynthOptions {
        records: RECORDS,
        ..SynthOptions::default()
    };
    let bytes =
        synth::write_to(&options, Vec::new(), kvtrace::trace::QUIET).expect("in-memory trace");
    Box::leak(bytes.into_boxed_slice())
}

fn decode(c: &mut Criterion) {
    let bytes = trace();
    let mut group = c.benchmark_group("lmct");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(RECORDS));
    group.bench_function("decode_1M_records", |b| {
        b.iter(|| {
            let mut reader = TraceReader::from_reader(Cursor::new(bytes), ReadOptions::default())
                .expect("header");
            let mut n = 0u64;
            while let Some(r) = reader.next_record().expect("record") {
                n += r.args.len() as u64;
            }
            n
        })
    });
    let records: Vec<Record> = {
        let mut reader =
            TraceReader::from_reader(Cursor::new(bytes), ReadOptions::default()).expect("header");
        let mut v = Vec::new();
        while let Some(r) = reader.next_record().expect("record") {
            v.push(r.to_record());
        }
        v
    };
    let header = TraceReader::from_reader(Cursor::new(bytes), ReadOptions::default())
        .expect("header")
        .header()
        .clone();
    // Owned records (editable value trees) encoded into frames; the sink discards the bytes
    // so the figure is the encoder's, not page faults of a growing output buffer.
    group.bench_function("encode_1M_records", |b| {
        b.iter(|| {
            let mut writer = TraceWriter::new(std::io::sink(), header.clone());
            for r in &records {
                writer.write_record(r).expect("encode");
            }
            writer.finish().expect("finish");
        })
    });
    group.finish();
}

/// Framing and validation alone (`fold_records` counting records), and the whole of `info`
/// (every figure, distinct keys included), from a file in the page cache, on 1 thread and on
/// one per core: the ratio is what the machine's cores buy.
fn read_on_cores(c: &mut Criterion) {
    let bytes = trace();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("synth.lct");
    std::fs::write(&path, bytes).expect("write trace");
    let all = ReadOptions::default().threads();
    let mut group = c.benchmark_group("reader");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::ElementsAndBytes {
        elements: RECORDS,
        bytes: bytes.len() as u64,
    });
    for threads in [1, all] {
        let options = ReadOptions {
            threads,
            ..ReadOptions::default()
        };
        group.bench_function(format!("frames_{threads}_threads"), |b| {
            b.iter(|| {
                let reader = TraceReader::open(&path, options).expect("header");
                let mut records = 0u64;
                fold_records(
                    reader,
                    threads,
                    4 << 20,
                    &|| 0u64,
                    &|n, _| *n += 1,
                    &mut |n| records += n,
                    kvtrace::trace::QUIET,
                )
                .expect("read");
                records
            })
        });
        group.bench_function(format!("info_{threads}_threads"), |b| {
            b.iter(|| {
                kvtrace::trace::inspect::inspect(&path, options, kvtrace::trace::QUIET)
                    .expect("info")
                    .distinct_keys
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decode, read_on_cores);
criterion_main!(benches);
