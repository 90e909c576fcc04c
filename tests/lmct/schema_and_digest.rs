//! Schema variants and their migration to schema 1, the typed encoders against real records,
//! and the config digest (Python's json.dumps text, the semantic digest).

use crate::util::{sample, scratch};
use kvtrace::lmct::calls::{
    StorageCall, FINISH_READ_PREFETCHED, FINISH_WRITE, READ_PREFETCHED_ENTER, READ_PREFETCHED_EXIT,
    RESERVE_WRITE, SUBMIT_PREFETCH_TASK,
};
use kvtrace::lmct::codec::{
    object_keys, GroupedObjectKeys, LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec,
    PrefetchTaskSpecRef,
};
use kvtrace::lmct::digest::{compare_configs, python_float_repr, python_json, DigestMatch};
use kvtrace::lmct::schema::Migration;
use kvtrace::lmct::{Header, HeaderSchema, ReadOptions, Record, TraceReader, TraceWriter, Value};
use kvtrace::trace::convert::{convert, ConvertOptions, Kind};
use kvtrace::trace::inspect::inspect;
use kvtrace::trace::QUIET;

fn owned_keys(v: kvtrace::lmct::msgpack::RawValue<'_>) -> Vec<ObjectKey> {
    object_keys(v)
        .expect("keys")
        .iter()
        .map(|k| k.to_owned())
        .collect()
}

#[test]
fn typed_encoders_reproduce_every_real_record() {
    for name in ["basic_lru", "unknown_qualname"] {
        let mut reader = TraceReader::open(&sample(name), ReadOptions::default()).expect("open");
        let mut checked = 0;
        while let Some(r) = reader.next_record().expect("record") {
            let a = r.args;
            let keys = a.get("keys").map(owned_keys).unwrap_or_default();
            let layout = a.get("layout_desc").and_then(MemoryLayoutDesc::from_raw);
            let spec = a
                .get("spec")
                .and_then(PrefetchTaskSpecRef::from_raw)
                .map(|s| PrefetchTaskSpec {
                    key_groups: s
                        .groups()
                        .expect("groups")
                        .iter()
                        .map(|g| GroupedObjectKeys {
                            keys: owned_keys(g.keys),
                            object_group_id: g.object_group_id,
                            layout_desc: g.layout().expect("layout"),
                            sliding_window_size: g.sliding_window_size,
                        })
                        .collect(),
                    num_kv_readers: s.num_kv_readers,
                    fetching_policy: s.fetching_policy.to_string(),
                    lock_mode: s.lock_mode,
                });
            let request_id = a.get("external_request_id").and_then(|v| v.as_str());
            let call = match r.qualname {
                RESERVE_WRITE => StorageCall::ReserveWrite {
                    keys: &keys,
                    layout_desc: layout.as_ref().expect("layout"),
                },
                FINISH_WRITE => StorageCall::FinishWrite { keys: &keys },
                READ_PREFETCHED_ENTER => StorageCall::ReadPrefetchedEnter { keys: &keys },
                READ_PREFETCHED_EXIT => StorageCall::ReadPrefetchedExit { keys: &keys },
                FINISH_READ_PREFETCHED => StorageCall::FinishReadPrefetched {
                    keys: &keys,
                    read_locks: a.get("read_locks").and_then(|v| v.as_i64()).expect("locks"),
                },
                SUBMIT_PREFETCH_TASK => StorageCall::SubmitPrefetchTask {
                    spec: spec.as_ref().expect("spec"),
                    external_request_id: request_id.expect("id"),
                    skip_l2: a.get("skip_l2").and_then(|v| v.as_bool()).expect("skip_l2"),
                },
                _ => continue,
            };
            let mut args = Vec::new();
            call.encode_args(&mut args);
            assert_eq!(
                args,
                a.bytes(),
                "{name}: {} at byte {}",
                r.qualname,
                r.offset
            );
            checked += 1;
        }
        assert!(checked >= 2);
    }
}

fn key(salt: Option<&str>) -> Value {
    let mut fields = vec![
        ("chunk_hash", Value::bin(vec![7u8; 32])),
        ("model_name", Value::str("m")),
        ("kv_rank", Value::int(16_777_472)),
        ("object_group_id", Value::int(0)),
    ];
    if let Some(s) = salt {
        fields.push(("cache_salt", Value::str(s)));
    }
    Value::tagged("ObjectKey", Value::map(fields))
}

fn layout() -> Value {
    Value::tagged(
        "MemoryLayoutDesc",
        Value::map([
            (
                "shapes",
                Value::array(vec![Value::array(vec![
                    Value::int(2),
                    Value::int(4),
                    Value::int(64),
                    Value::int(128),
                ])]),
            ),
            ("dtypes", Value::array(vec![Value::str("torch.bfloat16")])),
        ]),
    )
}

fn spec(keys: Vec<Value>, memory_tags: bool) -> Value {
    let group = Value::tagged(
        "GroupedObjectKeys",
        Value::map([
            ("keys", Value::array(keys)),
            ("object_group_id", Value::int(0)),
            ("layout_desc", layout()),
            ("sliding_window_size", Value::int(-1)),
        ]),
    );
    let mut fields = vec![
        ("key_groups", Value::array(vec![group])),
        ("num_kv_readers", Value::int(1)),
        ("fetching_policy", Value::str("prefix")),
        (
            "lock_mode",
            Value::tagged("PrefetchLockMode", Value::str("LOCK")),
        ),
    ];
    if memory_tags {
        let tag = Value::tagged(
            "MemoryTags",
            Value::map([
                ("segment", Value::str("dram")),
                ("residency", Value::str("local")),
            ]),
        );
        fields.push(("allowed_l1_memory_tags", Value::Nil));
        fields.push(("allowed_l2_memory_tags", Value::array(vec![tag])));
    }
    Value::tagged("PrefetchTaskSpec", Value::map(fields))
}

fn write_trace(path: &std::path::Path, schema: HeaderSchema, records: Vec<(&str, Value)>) {
    let mut header = Header::storage(100.0, 1_790_000_000.0);
    header.schema = schema;
    let mut w = TraceWriter::new(std::fs::File::create(path).expect("create"), header);
    for (i, (q, args)) in records.into_iter().enumerate() {
        let r = Record {
            t_mono: i as f64,
            t_wall: 1_790_000_000.0 + i as f64,
            qualname: q.into(),
            args,
        };
        w.write_record(&r).expect("write");
    }
    w.finish().expect("finish");
}

fn to_schema_1(input: &std::path::Path, output: &std::path::Path) -> Migration {
    let options = ConvertOptions {
        to: Kind::Lct,
        to_schema_1: true,
        zstd_level: 3,
        read: ReadOptions::default(),
    };
    convert(input, output, options, QUIET)
        .expect("convert")
        .migration
        .expect("migration")
}

#[test]
fn lmcache_057_schema_2_is_detected_and_rewritten_for_056() {
    let dir = scratch();
    let (v2, v1) = (dir.path().join("v2.lct"), dir.path().join("v1.lct"));
    write_trace(
        &v2,
        HeaderSchema::Version(2),
        vec![(
            SUBMIT_PREFETCH_TASK,
            Value::map([
                ("spec", spec(vec![key(None)], true)),
                ("external_request_id", Value::str("r1")),
            ]),
        )],
    );
    let info = inspect(&v2, ReadOptions::default(), QUIET).expect("info");
    assert_eq!(info.schema_variant, "2, memory-tag filters (LMCache 0.5.7)");
    let m = to_schema_1(&v2, &v1);
    assert_eq!(
        (
            m.null_memory_filters_removed,
            m.memory_filters_dropped,
            m.skip_l2_added
        ),
        (1, 1, 1)
    );
    assert!(m.lines().iter().any(|l| l.contains("DROPPED")));
    let mut reader = TraceReader::open(&v1, ReadOptions::default()).expect("open");
    assert_eq!(reader.header().schema, HeaderSchema::Version(1));
    let r = reader.next_record().expect("ok").expect("record");
    // Now exactly what a 0.5.6 server records for the same call.
    let expected_spec = PrefetchTaskSpec {
        key_groups: vec![GroupedObjectKeys {
            keys: owned_keys(
                r.args
                    .get("spec")
                    .and_then(|s| s.tagged("PrefetchTaskSpec"))
                    .and_then(|s| s.get("key_groups"))
                    .and_then(|g| g.array())
                    .and_then(|mut g| g.next())
                    .and_then(|g| g.get("v"))
                    .and_then(|g| g.get("keys"))
                    .expect("keys"),
            ),
            object_group_id: 0,
            layout_desc: MemoryLayoutDesc {
                shapes: vec![vec![2, 4, 64, 128]],
                dtypes: vec!["torch.bfloat16".into()],
            },
            sliding_window_size: -1,
        }],
        num_kv_readers: 1,
        fetching_policy: "prefix".into(),
        lock_mode: LockMode::Lock,
    };
    let mut args = Vec::new();
    StorageCall::SubmitPrefetchTask {
        spec: &expected_spec,
        external_request_id: "r1",
        skip_l2: false,
    }
    .encode_args(&mut args);
    assert_eq!(r.args.bytes(), &args[..]);
    assert_eq!(
        inspect(&v1, ReadOptions::default(), QUIET)
            .expect("info")
            .schema_variant,
        "1 (LMCache 0.5.6)"
    );
}

#[test]
fn cache_salt_schema_2_is_detected_and_salts_are_reported() {
    let dir = scratch();
    let (v2, v1) = (dir.path().join("v2.lct"), dir.path().join("v1.lct"));
    write_trace(
        &v2,
        HeaderSchema::Version(2),
        vec![
            (
                RESERVE_WRITE,
                Value::map([
                    (
                        "keys",
                        Value::array(vec![key(Some("")), key(Some("tenant-a"))]),
                    ),
                    ("layout_desc", layout()),
                ]),
            ),
            (
                FINISH_WRITE,
                Value::map([("keys", Value::array(vec![key(Some(""))]))]),
            ),
            (
                SUBMIT_PREFETCH_TASK,
                Value::map([
                    ("spec", spec(vec![key(Some(""))], false)),
                    ("external_request_id", Value::str("r")),
                    ("skip_l2", Value::Bool(false)),
                ]),
            ),
        ],
    );
    assert_eq!(
        inspect(&v2, ReadOptions::default(), QUIET)
            .expect("info")
            .schema_variant,
        "2, cache_salt in object keys"
    );
    let m = to_schema_1(&v2, &v1);
    assert_eq!(
        (m.empty_salts_removed, m.salts_dropped, m.skip_l2_added),
        (3, 1, 0)
    );
    assert!(m.lines().iter().any(|l| l.contains("NON-EMPTY cache_salt")));
}

#[test]
fn early_and_pre_rename_shapes_are_migrated() {
    let dir = scratch();
    let (early, v1) = (dir.path().join("early.lct"), dir.path().join("v1.lct"));
    write_trace(
        &early,
        HeaderSchema::Early {
            lmcache_version: "0.3.9".into(),
        },
        vec![
            (
                RESERVE_WRITE,
                Value::map([
                    ("keys", Value::array(vec![key(None)])),
                    ("layout_desc", layout()),
                    ("mode", Value::str("new")),
                ]),
            ),
            (
                FINISH_READ_PREFETCHED,
                Value::map([
                    ("keys", Value::array(vec![key(None)])),
                    ("extra_count", Value::int(2)),
                ]),
            ),
        ],
    );
    let info = inspect(&early, ReadOptions::default(), QUIET).expect("info");
    assert_eq!(info.schema_variant, "early header (lmcache_version 0.3.9)");
    assert_eq!(info.lmcache_version.as_deref(), Some("0.3.9"));
    let m = to_schema_1(&early, &v1);
    assert_eq!((m.extra_count_migrated, m.reserve_mode_dropped), (1, 1));
    // The same trace as lossless JSON is rewritten alike, to the same bytes.
    let (jsonl, from_jsonl) = (dir.path().join("early.jsonl"), dir.path().join("j.lct"));
    let to_jsonl = ConvertOptions {
        to: Kind::Jsonl,
        to_schema_1: false,
        zstd_level: 3,
        read: ReadOptions::default(),
    };
    convert(&early, &jsonl, to_jsonl, QUIET).expect("to JSONL");
    let m = to_schema_1(&jsonl, &from_jsonl);
    assert_eq!((m.extra_count_migrated, m.reserve_mode_dropped), (1, 1));
    assert_eq!(
        std::fs::read(&from_jsonl).unwrap(),
        std::fs::read(&v1).unwrap()
    );
    let mut reader = TraceReader::open(&v1, ReadOptions::default()).expect("open");
    assert_eq!(reader.header().schema, HeaderSchema::Version(1));
    reader.next_record().expect("ok");
    let r = reader.next_record().expect("ok").expect("record");
    assert_eq!(r.args.get("read_locks").and_then(|v| v.as_i64()), Some(3));
    assert!(r.args.get("extra_count").is_none());
    let legacy = dir.path().join("legacy.lct");
    write_trace(
        &legacy,
        HeaderSchema::Version(1),
        vec![(
            FINISH_READ_PREFETCHED,
            Value::map([
                ("keys", Value::array(vec![])),
                ("extra_count", Value::int(0)),
            ]),
        )],
    );
    let info = inspect(&legacy, ReadOptions::default(), QUIET).expect("info");
    assert_eq!(
        info.schema_variant,
        "1 with pre-rename arguments (extra_count / mode)"
    );
}

#[test]
fn an_unknown_schema_version_is_read_with_a_warning() {
    let dir = scratch();
    let path = dir.path().join("v9.lct");
    write_trace(
        &path,
        HeaderSchema::Version(9),
        vec![("x.y", Value::map::<&str>([]))],
    );
    let info = inspect(&path, ReadOptions::default(), QUIET).expect("lenient");
    assert_eq!(info.total_records, 1);
    assert!(info.warnings[0].contains("unknown trace_schema_version 9"));
}

#[test]
fn python_float_repr_vectors() {
    let cases: [(f64, &str); 12] = [
        (0.2, "0.2"),
        (10.0, "10.0"),
        (0.8, "0.8"),
        (1e16, "1e+16"),
        (1234567890123456.0, "1234567890123456.0"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (-0.0, "-0.0"),
        (1.5e300, "1.5e+300"),
        (5e-324, "5e-324"),
        (123456789.123, "123456789.123"),
        (f64::INFINITY, "Infinity"),
    ];
    for (x, want) in cases {
        assert_eq!(python_float_repr(x), want, "{x:e}");
    }
}

#[test]
fn python_json_text_matches_json_dumps_sort_keys() {
    let v: serde_json::Value = serde_json::from_str(
        r#"{"b": [1, 2.5, null, true], "a": {"z": "é😀\n\"\\\u0001\u007f", "y": 10.0}, "A": -3}"#,
    )
    .expect("json");
    // python3 -c 'import json; print(json.dumps(<same>, sort_keys=True))'
    let want = r#"{"A": -3, "a": {"y": 10.0, "z": "\u00e9\ud83d\ude00\n\"\\\u0001\u007f"}, "b": [1, 2.5, null, true]}"#;
    assert_eq!(python_json(&v), want);
}

#[test]
fn semantic_digest_ignores_process_specific_values_only() {
    let base = r#"{"l1": {"shm_name": "", "size": 1}, "l2": ["<a.B object at 0x7f5efde7ee90>"]}"#;
    let pid = r#"{"l1": {"shm_name": "lmcache_l1_pool_4242", "size": 1}, "l2": ["<a.B object at 0x7f00000000aa>"]}"#;
    let real = r#"{"l1": {"shm_name": "", "size": 2}, "l2": ["<a.B object at 0x7f5efde7ee90>"]}"#;
    assert_eq!(compare_configs(base, base), DigestMatch::Exact);
    assert_eq!(compare_configs(base, pid), DigestMatch::Semantic);
    assert_eq!(
        compare_configs(base, real),
        DigestMatch::Mismatch(vec!["$.l1.size".into()])
    );
}

#[test]
fn every_codec_tag_has_a_typed_view() {
    use kvtrace::lmct::codec::{decode_tagged, Tagged};
    use kvtrace::lmct::msgpack::{encode_to_vec, RawValue};
    let cases = vec![
        Value::tagged("tuple", Value::array(vec![Value::int(1)])),
        Value::tagged("set", Value::array(vec![Value::int(7)])),
        key(Some("s")),
        layout(),
        spec(vec![key(None)], true),
        Value::tagged("PrefetchLockMode", Value::str("NO_LOCK")),
        Value::tagged(
            "torch.Size",
            Value::array(vec![Value::int(2), Value::int(4)]),
        ),
        Value::tagged("torch.dtype", Value::str("torch.float8_e4m3fn")),
        Value::tagged(
            "PrefetchHandle",
            Value::map([("prefetch_request_id", Value::int(1))]),
        ),
        Value::tagged(
            "AttnWindowDesc",
            Value::map([("world_size", Value::int(1))]),
        ),
        Value::tagged(
            "MemoryTags",
            Value::map([
                ("segment", Value::str("gds")),
                ("residency", Value::str("local")),
            ]),
        ),
        Value::tagged("FutureThing", Value::Nil),
    ];
    let mut names = Vec::new();
    for v in &cases {
        let bytes = encode_to_vec(v);
        let raw = RawValue::parse(&bytes).expect("valid");
        let name = match decode_tagged(raw).expect("decodes") {
            Tagged::Tuple(items) => format!("tuple{}", items.len()),
            Tagged::Set(items) => format!("set{}", items.len()),
            Tagged::ObjectKey(k) => format!("key:{}", k.cache_salt.unwrap_or("-")),
            Tagged::MemoryLayoutDesc(l) => format!("layout:{}", l.object_bytes().expect("bytes")),
            Tagged::GroupedObjectKeys(_) => "group".into(),
            Tagged::PrefetchTaskSpec(s) => {
                format!("spec:{}", s.allowed_l2_memory_tags.map_or(0, |t| t.len()))
            }
            Tagged::PrefetchLockMode(m) => m.name().into(),
            Tagged::TorchSize(dims) => format!("size{dims:?}"),
            Tagged::TorchDtype(d) => format!("dtype:{:?}", kvtrace::lmct::codec::dtype_size(d)),
            Tagged::PrefetchHandle(_) => "handle".into(),
            Tagged::AttnWindowDesc(_) => "window".into(),
            Tagged::MemoryTags { segment, residency } => format!("{segment}/{residency}"),
            Tagged::Unknown(tag, _) => format!("unknown:{tag}"),
        };
        names.push(name);
    }
    assert_eq!(
        names,
        [
            "tuple1",
            "set1",
            "key:s",
            "layout:131072",
            "spec:1",
            "NO_LOCK",
            "size[2, 4]",
            "dtype:Some(1)",
            "handle",
            "window",
            "gds/local",
            "unknown:FutureThing"
        ]
    );
    // A known tag with a malformed payload is not silently treated as unknown.
    let bad = encode_to_vec(&Value::tagged("ObjectKey", Value::int(3)));
    assert!(decode_tagged(RawValue::parse(&bad).expect("valid")).is_none());
}
