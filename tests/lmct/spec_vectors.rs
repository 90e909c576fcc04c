//! The hex test vectors of format-spec/LMCT.md are produced by kvtrace's encoders and read
//! back by its reader: the specification and the code cannot drift apart.

use std::collections::HashMap;
use std::io::Cursor;

use kvtrace::lmct::calls::StorageCall;
use kvtrace::lmct::codec::ObjectKey;
use kvtrace::lmct::digest::config_digest;
use kvtrace::lmct::json::to_lossless;
use kvtrace::lmct::msgpack::{encode_to_vec, RawValue};
use kvtrace::lmct::{write_frame, Header, ReadOptions, TraceReader, TraceWriter, Value};

/// `vector: NAME` followed by `hex: ...` (or `text: ...`) lines inside the spec.
fn spec_vectors() -> HashMap<String, String> {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/format-spec/LMCT.md"))
        .expect("format-spec/LMCT.md");
    let mut out = HashMap::new();
    let mut name = None;
    for line in spec.lines() {
        if let Some(n) = line.strip_prefix("vector: ") {
            name = Some(n.trim().to_string());
        } else if let (Some(n), Some(v)) = (
            &name,
            line.strip_prefix("hex: ").or(line.strip_prefix("text: ")),
        ) {
            out.entry(n.clone())
                .or_insert_with(String::new)
                .push_str(v.trim());
        }
    }
    out
}

fn key() -> ObjectKey {
    ObjectKey {
        chunk_hash: vec![0x01; 32],
        model_name: "m".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: String::new(),
    }
}

/// The vectors, computed.
fn computed() -> Vec<(&'static str, String)> {
    let mut header = Header::storage(480.5, 1_795_297_114.25);
    header.sm_config_json = "{}".into();
    header.sm_config_digest = config_digest("{}");
    let mut header_body = Vec::new();
    header.encode(&mut header_body);
    let mut header_frame = Vec::new();
    write_frame(&mut header_frame, &header_body).expect("frame");

    let keys = [key()];
    let mut args = Vec::new();
    StorageCall::FinishWrite { keys: &keys }.encode_args(&mut args);
    let mut w = TraceWriter::new(Vec::new(), Header::storage(0.0, 0.0));
    w.write_record_parts(
        0.5,
        1_795_297_114.75,
        StorageCall::FinishWrite { keys: &keys }.qualname(),
        &args,
    )
    .expect("record");
    let file = w.finish().expect("finish");
    let first = u32::from_be_bytes(file[..4].try_into().expect("4")) as usize;
    let record_frame = file[4 + first..].to_vec();

    let tuple = Value::tagged("tuple", Value::array(vec![Value::int(1), Value::int(-1)]));
    let record_json = to_lossless(
        &RawValue::parse(&record_frame[4..])
            .expect("valid")
            .to_value(),
    );
    vec![
        ("config-digest-empty-object", config_digest("{}")),
        ("header-frame", hex::encode(&header_frame)),
        ("record-frame-finish-write", hex::encode(&record_frame)),
        ("tuple-codec", hex::encode(encode_to_vec(&tuple))),
        (
            "record-frame-finish-write-jsonl",
            serde_json::to_string(&record_json).expect("json"),
        ),
    ]
}

#[test]
fn every_vector_in_the_spec_is_what_kvtrace_encodes() {
    let spec = spec_vectors();
    let wrong: Vec<String> = computed()
        .into_iter()
        .filter(|(name, value)| spec.get(*name) != Some(value))
        .map(|(name, value)| format!("vector: {name}\n{value}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "format-spec/LMCT.md disagrees; kvtrace encodes:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_vectors_form_a_readable_trace() {
    let spec = spec_vectors();
    let mut bytes = hex::decode(&spec["header-frame"]).expect("hex");
    bytes.extend(hex::decode(&spec["record-frame-finish-write"]).expect("hex"));
    let mut r =
        TraceReader::from_reader(Cursor::new(bytes), ReadOptions::default()).expect("header");
    assert_eq!(
        r.header().sm_config_digest,
        spec["config-digest-empty-object"]
    );
    let rec = r.next_record().expect("ok").expect("record");
    assert_eq!((rec.t_mono, rec.t_wall), (0.5, 1_795_297_114.75));
    assert!(r.next_record().expect("eof").is_none());
}
