//! Decode and encode throughput on a generated 1M-record trace of realistic records.
//! Run: `cargo bench --bench lmct`. Figures are in README's Performance section.

use std::io::Cursor;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

criterion_group!(benches, decode);
criterion_main!(benches);
