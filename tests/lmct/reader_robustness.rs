//! Hostile and damaged input: the reader reports, skips or stops — it never panics and never
//! allocates what a corrupt length asks for.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::util::sample;
use kvtrace::error::ErrorKind;
use kvtrace::lmct::msgpack::{self, encode_to_vec, RawValue};
use kvtrace::lmct::{Frame, Header, ReadOptions, TraceReader, Value};
use proptest::prelude::*;

/// Records the largest single allocation, to prove corrupt lengths are never allocated.
struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only sizes are noted.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: ptr came from System with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

fn reader(bytes: Vec<u8>) -> kvtrace::Result<TraceReader> {
    TraceReader::from_reader(Cursor::new(bytes), ReadOptions::default())
}

fn basic() -> Vec<u8> {
    std::fs::read(sample("basic_lru")).expect("sample")
}

/// Offset of the n-th frame (0 = header).
fn frame_offset(bytes: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4")) as usize;
        at += 4 + len;
    }
    at
}

fn drain(r: &mut TraceReader) -> kvtrace::Result<u64> {
    let mut n = 0;
    while r.next_record()?.is_some() {
        n += 1;
    }
    Ok(n)
}

#[test]
fn a_length_above_the_limit_is_an_error_naming_the_offset() {
    let mut bytes = basic();
    let at = frame_offset(&bytes, 3);
    bytes[at..at + 4].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
    let mut r = reader(bytes).expect("header");
    let before = LARGEST.load(Ordering::Relaxed);
    let err = drain(&mut r).expect_err("corrupt length");
    assert_eq!(err.kind, ErrorKind::Data);
    let text = err.to_string();
    assert!(text.contains(&format!("byte {at}")), "{text}");
    assert!(text.contains("frame length"), "{text}");
    assert_eq!(
        r.summary().records,
        2,
        "records before the corrupt frame are kept"
    );
    assert!(LARGEST.load(Ordering::Relaxed).max(before) < 8 << 20);
}

#[test]
fn a_large_length_within_the_limit_on_a_short_file_allocates_only_what_is_there() {
    let mut bytes = basic();
    let at = frame_offset(&bytes, 2);
    bytes.truncate(at + 100);
    bytes[at..at + 4].copy_from_slice(&(60u32 << 20).to_be_bytes());
    LARGEST.store(0, Ordering::Relaxed);
    let mut r = reader(bytes).expect("header");
    assert_eq!(drain(&mut r).expect("truncation is not an error"), 1);
    let t = r.summary().truncation.clone().expect("truncated");
    assert_eq!((t.declared, t.available), (Some(60 << 20), 96));
    assert!(
        LARGEST.load(Ordering::Relaxed) <= 4 << 20,
        "allocated {} bytes for a 96-byte body",
        LARGEST.load(Ordering::Relaxed)
    );
}

#[test]
fn garbage_empty_and_cut_headers_are_one_line_errors() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "empty file"),
        (vec![0, 0], "length prefix"),
        (
            b"this is not a trace at all, just text\n".to_vec(),
            "exceeds the frame limit",
        ),
        (vec![0, 0, 0, 3, 0xc1, 0xc1, 0xc1], "reserved marker"),
        (vec![0, 0, 0, 9, 1, 2, 3], "header frame truncated"),
    ];
    for (bytes, needle) in cases {
        let err = reader(bytes).err().expect("must fail");
        let text = err.to_string();
        assert!(text.contains(needle), "{text:?} should mention {needle:?}");
        assert!(!text.contains('\n'));
    }
}

#[test]
fn a_header_with_the_wrong_magic_or_version_is_refused() {
    let mut h = Header::storage(1.0, 2.0);
    h.format_version = 2;
    let mut body = Vec::new();
    h.encode(&mut body);
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend(&body);
    let text = reader(bytes).err().expect("version").to_string();
    assert!(text.contains("format_version"), "{text}");

    // magic as str instead of bin: LMCache refuses it too.
    let frame = Value::map([
        ("type", Value::str("header")),
        ("magic", Value::str("LMCT")),
    ]);
    let body = encode_to_vec(&frame);
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend(&body);
    let text = reader(bytes).err().expect("magic").to_string();
    assert!(text.contains("magic"), "{text}");
}

#[test]
fn undecodable_records_are_skipped_counted_and_reading_goes_on() {
    let bytes = basic();
    let at = frame_offset(&bytes, 2);
    let mut damaged = bytes.clone();
    // Turn the record map marker into a reserved byte, and make another record an array.
    damaged[at + 4] = 0xc1;
    let at5 = frame_offset(&bytes, 5);
    damaged[at5 + 4] = 0x95;
    let mut r = reader(damaged).expect("header");
    let mut undecodable = Vec::new();
    let mut records = 0;
    while let Some(frame) = r.next_frame().expect("frame") {
        match frame {
            Frame::Record(_) => records += 1,
            Frame::Undecodable { offset, reason, .. } => undecodable.push((offset, reason)),
        }
    }
    assert_eq!(records, 39);
    assert_eq!(undecodable.len(), 2);
    assert_eq!(undecodable[0].0, at as u64);
    assert!(undecodable[1].1.contains("not a msgpack map"));
    assert_eq!(r.summary().warnings().len(), 2);
}

/// A read cut where its consumer stopped counts the undecodable frames before that record
/// and no truncation: exactly while the read listed them all, and all of them past that.
/// The expectation is counted frame by frame from a reader of the same bytes.
#[test]
fn a_read_stopped_at_a_record_counts_the_frames_before_it() {
    let bytes = basic();
    let mut damaged = bytes.clone();
    // Frames 2, 4, …, 40 (20 of the 40 records) become undecodable; the tail is cut.
    for n in (2..=40).step_by(2) {
        damaged[frame_offset(&bytes, n) + 4] = 0xc1;
    }
    damaged.truncate(damaged.len() - 3);
    let mut r = reader(damaged).expect("header");
    let mut frames = Vec::new();
    while let Some(frame) = r.next_frame().expect("frame") {
        frames.push(match frame {
            Frame::Record(record) => (record.offset, true),
            Frame::Undecodable { offset, .. } => (offset, false),
        });
    }
    let whole = r.summary();
    assert_eq!(whole.undecodable, 20);
    assert_eq!(whole.undecodable_examples.len(), 16);
    assert!(whole.truncation.is_some());
    let listed_last = whole.undecodable_examples[15].0;
    let mut checked = (0, 0);
    for (i, &(offset, decodable)) in frames.iter().enumerate() {
        if !decodable {
            continue;
        }
        let before = &frames[..i];
        let records = before.iter().filter(|f| f.1).count() as u64 + 1;
        let undecodable = before.iter().filter(|f| !f.1).count() as u64;
        let cut = whole.stopped_at(offset, records);
        assert_eq!(cut.records, records);
        assert!(cut.truncation.is_none());
        assert!(cut.undecodable_examples.iter().all(|(at, _)| *at < offset));
        if offset < listed_last {
            assert_eq!(cut.undecodable, undecodable, "record at byte {offset}");
            assert_eq!(cut.undecodable_examples.len() as u64, undecodable);
            checked.0 += 1;
        } else {
            assert_eq!(cut.undecodable, 20, "record at byte {offset}");
            checked.1 += 1;
        }
    }
    assert!(checked.0 >= 15 && checked.1 >= 3, "{checked:?}");
}

#[test]
fn records_missing_fields_or_with_wrong_types_name_the_field() {
    let cases = [
        (Value::map([("t_mono", Value::F64(1.0))]), "t_wall: missing"),
        (
            Value::map([
                ("t_mono", Value::str("x")),
                ("t_wall", Value::F64(1.0)),
                ("qualname", Value::str("q")),
                ("args", Value::map::<&str>([])),
            ]),
            "t_mono: expected a number",
        ),
        (
            Value::map([
                ("t_mono", Value::F64(1.0)),
                ("t_wall", Value::F64(1.0)),
                ("qualname", Value::str("q")),
                ("args", Value::Map(vec![(Value::int(1), Value::Nil)], None)),
            ]),
            "args: keys must be strings",
        ),
        (
            Value::map([
                ("type", Value::str("header")),
                ("t_mono", Value::F64(1.0)),
                ("t_wall", Value::F64(1.0)),
                ("qualname", Value::str("q")),
                ("args", Value::map::<&str>([])),
            ]),
            "type: expected \"record\"",
        ),
    ];
    for (frame, reason) in cases {
        let body = encode_to_vec(&frame);
        let err = kvtrace::lmct::RecordRef::parse(0, &body).expect_err("invalid");
        assert!(err.contains(reason), "{err:?} vs {reason:?}");
    }
}

#[test]
fn keys_in_any_order_and_unknown_keys_are_accepted() {
    let frame = Value::map([
        ("extra", Value::array(vec![Value::Nil])),
        ("args", Value::map([("keys", Value::array(vec![]))])),
        ("qualname", Value::str("q")),
        ("t_wall", Value::int(7)),
        ("t_mono", Value::F32(0.5)),
    ]);
    let body = encode_to_vec(&frame);
    let r = kvtrace::lmct::RecordRef::parse(0, &body).expect("lenient");
    assert_eq!((r.t_mono, r.t_wall, r.qualname), (0.5, 7.0, "q"));
}

#[test]
fn deep_nesting_is_refused_not_overflowing_the_stack() {
    let mut body = vec![0x91u8; 100_000];
    body.push(0xc0);
    let err = RawValue::parse(&body).expect_err("too deep");
    assert!(err.what.contains("nesting"));
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::int),
        any::<u64>().prop_map(Value::int),
        any::<f64>().prop_map(Value::F64),
        any::<f32>().prop_map(Value::F32),
        ".{0,40}".prop_map(Value::str),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::bin),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(t, d)| Value::Ext(t, d, None)),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..20).prop_map(Value::array),
            proptest::collection::vec((inner.clone(), inner), 0..18)
                .prop_map(|m| Value::Map(m, None)),
        ]
    })
}

/// NaN != NaN: compare through the encoding instead.
fn same(a: &Value, b: &Value) -> bool {
    encode_to_vec(a) == encode_to_vec(b)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(mut r) = reader(bytes.clone()) {
            while let Ok(Some(_)) = r.next_frame() {}
        }
        let _ = RawValue::parse(&bytes).map(|v| v.to_value());
    }

    #[test]
    fn arbitrary_frames_after_a_valid_header_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..4096)
    ) {
        let mut bytes = basic();
        bytes.truncate(frame_offset(&bytes, 1));
        bytes.extend(&tail);
        let mut r = reader(bytes).expect("valid header");
        loop {
            match r.next_frame() {
                Ok(Some(Frame::Record(rec))) => {
                    let _ = kvtrace::lmct::display::to_display(rec.args);
                    let _ = rec.to_record();
                }
                Ok(Some(Frame::Undecodable { .. })) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn values_round_trip_through_msgpack_and_lossless_json(v in arb_value()) {
        let bytes = encode_to_vec(&v);
        let raw = RawValue::parse(&bytes).expect("own encoding is valid");
        let back = raw.to_value();
        prop_assert!(same(&v, &back));
        let json = kvtrace::lmct::json::to_lossless(&back);
        let text = serde_json::to_string(&json).expect("json text");
        let streamed = serde_json::to_string(&kvtrace::lmct::json::Lossless(&back));
        prop_assert_eq!(streamed.expect("json text"), text.clone());
        let from_bytes = serde_json::to_string(&kvtrace::lmct::json::RawLossless::new(raw));
        prop_assert_eq!(from_bytes.expect("json text"), text.clone());
        let mut compact = Vec::new();
        kvtrace::lmct::json::RawLossless::new(raw).write_compact(&mut compact);
        prop_assert_eq!(String::from_utf8(compact).expect("UTF-8"), text.clone());
        let reparsed: serde_json::Value = serde_json::from_str(&text).expect("parse");
        let from_json = kvtrace::lmct::json::from_lossless(&reparsed).expect("lossless");
        prop_assert_eq!(encode_to_vec(&from_json), bytes.clone());
        let mut direct = Vec::new();
        if kvtrace::lmct::json::encode_lossless(&text, 1000, &mut direct).is_some() {
            prop_assert_eq!(direct, bytes);
        }
    }

    /// `dump`'s streamed display JSON is the text of the display tree, compact and pretty,
    /// for any value and for it under each kind of tag: unwrapped, decoded into fields, and
    /// tagged fields that name `__t__` again.
    #[test]
    fn shown_values_are_the_text_of_their_display_tree(
        v in arb_value(),
        tag in prop_oneof![
            Just("tuple".to_string()),
            Just("ObjectKey".to_string()),
            Just("PrefetchLockMode".to_string()),
            ".{0,6}",
        ],
        again in any::<bool>(),
    ) {
        let payload = match (&v, again) {
            (Value::Map(entries, form), true) => {
                let mut entries = entries.clone();
                entries.push((Value::str("__t__"), Value::Nil));
                Value::Map(entries, *form)
            }
            _ => v.clone(),
        };
        let tagged = Value::Map(
            vec![(Value::str("__t__"), Value::str(tag.clone())), (Value::str("v"), payload)],
            None,
        );
        for value in [&v, &tagged] {
            let bytes = encode_to_vec(value);
            let raw = RawValue::parse(&bytes).expect("own encoding is valid");
            let tree = kvtrace::lmct::display::to_display(raw);
            let shown = kvtrace::lmct::display::Shown::new(raw);
            let text = serde_json::to_string(&tree).expect("text");
            prop_assert_eq!(serde_json::to_string(&shown).expect("text"), text.clone());
            let mut compact = Vec::new();
            shown.write_compact(&mut compact);
            let mut pretty = Vec::new();
            kvtrace::lmct::display::write_pretty(&compact, &mut pretty);
            prop_assert_eq!(String::from_utf8(compact).expect("UTF-8"), text);
            let tree_pretty = serde_json::to_string_pretty(&tree).expect("text");
            prop_assert_eq!(serde_json::to_string_pretty(&shown).expect("text"), tree_pretty.clone());
            prop_assert_eq!(String::from_utf8(pretty).expect("UTF-8"), tree_pretty);
        }
    }

    #[test]
    fn non_canonical_widths_survive_a_round_trip(v in any::<u8>(), s in "[a-z]{0,10}") {
        // Foreign writers may use wider forms than needed; kvtrace keeps them.
        let mut bytes = vec![0x93, 0xcf];
        bytes.extend((v as u64).to_be_bytes());
        bytes.push(0xda);
        bytes.extend((s.len() as u16).to_be_bytes());
        bytes.extend(s.as_bytes());
        bytes.extend([0xca]);
        bytes.extend(1.5f32.to_be_bytes());
        let value = RawValue::parse(&bytes).expect("valid").to_value();
        prop_assert_eq!(encode_to_vec(&value), bytes.clone());
        let json = kvtrace::lmct::json::to_lossless(&value);
        prop_assert_eq!(
            serde_json::to_string(&kvtrace::lmct::json::Lossless(&value)).expect("text"),
            serde_json::to_string(&json).expect("text")
        );
        let raw = RawValue::parse(&bytes).expect("valid");
        prop_assert_eq!(
            serde_json::to_string(&kvtrace::lmct::json::RawLossless::new(raw)).expect("text"),
            serde_json::to_string(&json).expect("text")
        );
        let mut compact = Vec::new();
        kvtrace::lmct::json::RawLossless::new(raw).write_compact(&mut compact);
        prop_assert_eq!(
            String::from_utf8(compact).expect("UTF-8"),
            serde_json::to_string(&json).expect("text")
        );
        let back = kvtrace::lmct::json::from_lossless(&json).expect("lossless");
        prop_assert_eq!(encode_to_vec(&back), bytes);
    }
}

#[test]
fn canonical_integer_forms_match_msgspec() {
    let cases: [(i64, &[u8]); 8] = [
        (0, &[0x00]),
        (127, &[0x7f]),
        (128, &[0xcc, 0x80]),
        (65535, &[0xcd, 0xff, 0xff]),
        (16_777_472, &[0xce, 0x01, 0x00, 0x01, 0x00]),
        (-1, &[0xff]),
        (-33, &[0xd0, 0xdf]),
        (-129, &[0xd1, 0xff, 0x7f]),
    ];
    for (v, want) in cases {
        let mut out = Vec::new();
        msgpack::put_int(&mut out, v);
        assert_eq!(out, want, "{v}");
    }
}

/// A source that hands out at most a few hundred bytes per read, so almost every frame
/// straddles the reader's buffer and is copied out, where a whole file in memory lets most
/// frames be read in place: both give the same frames, bodies and summary.
#[test]
fn frames_read_in_place_or_copied_out_are_the_same() {
    struct Trickle(Cursor<Vec<u8>>);
    impl std::io::Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(333);
            self.0.read(&mut buf[..n])
        }
    }
    let options = kvtrace::trace::synth::SynthOptions {
        records: 2000,
        ..Default::default()
    };
    let mut bytes = kvtrace::trace::synth::write_to(&options, Vec::new(), kvtrace::trace::QUIET)
        .expect("trace");
    bytes.truncate(bytes.len() - 3);
    let frames = |mut r: TraceReader| {
        let mut out = Vec::new();
        while let Some(frame) = r.next_frame().expect("read") {
            let offset = frame.offset();
            let body = match frame {
                Frame::Record(rec) => rec.body.to_vec(),
                Frame::Undecodable { body, .. } => body.to_vec(),
            };
            out.push((offset, body));
        }
        (out, format!("{:?}", r.into_summary()))
    };
    let whole = TraceReader::from_reader(Cursor::new(bytes.clone()), ReadOptions::default())
        .expect("header");
    let trickle = TraceReader::from_reader(Trickle(Cursor::new(bytes)), ReadOptions::default())
        .expect("header");
    let (a, b) = (frames(whole), frames(trickle));
    assert_eq!(a.0.len(), 1999);
    assert_eq!(a, b);
}
