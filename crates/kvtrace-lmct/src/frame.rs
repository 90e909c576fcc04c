//! Header and record frames: decoding with LMCache's tolerance rules and encoding with
//! LMCache 0.5.6's exact field order and forms (format spec §3–§5).

use super::msgpack::{self, Kind, RawValue, SeenKey};
use super::value::Value;
use super::{FORMAT_VERSION, MAGIC, WRITE_SCHEMA_VERSION};

/// Which version field the header carries.
#[derive(Clone, Debug, PartialEq)]
pub enum HeaderSchema {
    /// `trace_schema_version` (1 in LMCache 0.5.6, 2 in later builds).
    Version(i64),
    /// The early header that carried `lmcache_version` instead.
    Early { lmcache_version: String },
}

/// The first frame of every trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub format_version: i64,
    /// `storage` (StorageManager calls) or `events` (cache-event stream).
    pub level: String,
    pub schema: HeaderSchema,
    /// Monotonic clock (seconds) when the recorder was created; record `t_mono` is relative
    /// to it.
    pub t_mono_start: f64,
    /// Unix time (seconds) when the recorder was created.
    pub t_wall_start: f64,
    pub sm_config_json: String,
    pub sm_config_digest: String,
    /// Present only in events-level headers; omitted from the encoding when `None`.
    pub level_meta: Option<Value>,
}

impl Header {
    /// A schema-1 storage header as LMCache 0.5.6 writes it.
    pub fn storage(t_mono_start: f64, t_wall_start: f64) -> Header {
        Header {
            format_version: FORMAT_VERSION,
            level: "storage".into(),
            schema: HeaderSchema::Version(WRITE_SCHEMA_VERSION),
            t_mono_start,
            t_wall_start,
            sm_config_json: String::new(),
            sm_config_digest: String::new(),
            level_meta: None,
        }
    }

    /// The header says the file ends with kvtrace's trailer record (format spec §11.3).
    pub fn promises_trailer(&self) -> bool {
        self.level_meta
            .as_ref()
            .is_some_and(|m| m.get(super::calls::RECORDER_META).is_some())
    }

    /// The numeric schema version; the early header counts as 0.
    pub fn schema_version(&self) -> i64 {
        match self.schema {
            HeaderSchema::Version(v) => v,
            HeaderSchema::Early { .. } => 0,
        }
    }

    /// Decodes a header body. Errors name the field that is wrong.
    pub fn parse(body: &[u8]) -> Result<Header, (String, String)> {
        let fail = |field: &str, msg: String| (field.to_string(), msg);
        let frame = RawValue::parse(body).map_err(|e| fail("header", e.to_string()))?;
        if frame.kind() != Kind::Map {
            return Err(fail("header", "frame is not a msgpack map".into()));
        }
        if let Some(t) = frame.get("type") {
            if t.as_str() != Some("header") {
                return Err(fail("type", "expected \"header\"".into()));
            }
        }
        let magic = frame
            .get("magic")
            .ok_or_else(|| fail("magic", "missing".into()))?;
        match magic.as_bin() {
            Some(m) if m == MAGIC => {}
            Some(m) => return Err(fail("magic", format!("expected LMCT, found {m:02x?}"))),
            None => return Err(fail("magic", "must be msgpack bin \"LMCT\"".into())),
        }
        let int = |field: &str| {
            frame
                .get(field)
                .ok_or_else(|| fail(field, "missing".into()))?
                .as_i64()
                .ok_or_else(|| fail(field, "expected an integer".into()))
        };
        let string = |field: &str| {
            frame
                .get(field)
                .ok_or_else(|| fail(field, "missing".into()))?
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| fail(field, "expected a string".into()))
        };
        let float = |field: &str| {
            frame
                .get(field)
                .ok_or_else(|| fail(field, "missing".into()))?
                .as_f64()
                .ok_or_else(|| fail(field, "expected a number".into()))
        };
        let format_version = int("format_version")?;
        if format_version != FORMAT_VERSION {
            return Err(fail(
                "format_version",
                format!("unsupported format_version {format_version} (kvtrace reads 1)"),
            ));
        }
        let schema = match frame.get("trace_schema_version") {
            Some(_) => HeaderSchema::Version(int("trace_schema_version")?),
            None => match frame.get("lmcache_version") {
                Some(_) => HeaderSchema::Early {
                    lmcache_version: string("lmcache_version")?,
                },
                None => return Err(fail("trace_schema_version", "missing".into())),
            },
        };
        let level_meta = match frame.get("level_meta") {
            None => None,
            Some(m) if m.kind() == Kind::Map => Some(m.to_value()),
            Some(_) => return Err(fail("level_meta", "expected a map".into())),
        };
        Ok(Header {
            format_version,
            level: string("level")?,
            schema,
            t_mono_start: float("t_mono_start")?,
            t_wall_start: float("t_wall_start")?,
            sm_config_json: string("sm_config_json")?,
            sm_config_digest: string("sm_config_digest")?,
            level_meta,
        })
    }

    /// Appends the msgpack body exactly as LMCache 0.5.6 encodes it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        msgpack::put_map_len(out, 9 + usize::from(self.level_meta.is_some()));
        msgpack::put_str(out, "type");
        msgpack::put_str(out, "header");
        msgpack::put_str(out, "magic");
        msgpack::put_bin(out, MAGIC);
        msgpack::put_str(out, "format_version");
        msgpack::put_int(out, self.format_version);
        msgpack::put_str(out, "level");
        msgpack::put_str(out, &self.level);
        match &self.schema {
            HeaderSchema::Version(v) => {
                msgpack::put_str(out, "trace_schema_version");
                msgpack::put_int(out, *v);
            }
            HeaderSchema::Early { lmcache_version } => {
                msgpack::put_str(out, "lmcache_version");
                msgpack::put_str(out, lmcache_version);
            }
        }
        msgpack::put_str(out, "t_mono_start");
        msgpack::put_f64(out, self.t_mono_start);
        msgpack::put_str(out, "t_wall_start");
        msgpack::put_f64(out, self.t_wall_start);
        msgpack::put_str(out, "sm_config_json");
        msgpack::put_str(out, &self.sm_config_json);
        msgpack::put_str(out, "sm_config_digest");
        msgpack::put_str(out, &self.sm_config_digest);
        if let Some(meta) = &self.level_meta {
            msgpack::put_str(out, "level_meta");
            msgpack::encode(meta, out);
        }
    }
}

/// A decoded record that borrows from the reader's frame buffer: the fast path.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    /// Byte offset of the frame's length prefix (in the uncompressed stream).
    pub offset: u64,
    /// Seconds since the header's `t_mono_start`.
    pub t_mono: f64,
    /// Unix time in seconds.
    pub t_wall: f64,
    pub qualname: &'a str,
    /// Always a map with string keys.
    pub args: RawValue<'a>,
    /// The whole msgpack body of the frame.
    pub body: &'a [u8],
    /// The keys validating the frame read, for [`crate::args::CallArgs::of`] to take rather
    /// than read again; empty where the reader kept none.
    pub(crate) seen: &'a [SeenKey<'a>],
}

/// Where a record's fields sit inside its body: lets the reader check a frame and hand out a
/// borrowed [`RecordRef`] without walking it twice.
#[derive(Clone, Debug)]
pub(crate) struct RecordSpans {
    t_mono: f64,
    t_wall: f64,
    qualname: std::ops::Range<usize>,
    args: std::ops::Range<usize>,
}

/// Validates the `args` map at `at` — a map whose keys are all strings — in one pass, and
/// returns where it ends; the keys validation takes in LMCache's shape go to `seen`, when
/// given.
fn args_end<'a>(
    body: &'a [u8],
    at: usize,
    mut seen: Option<&mut Vec<SeenKey<'a>>>,
) -> Result<usize, String> {
    let (entries, mut pos) = msgpack::map_head(body, at)
        .map_err(|e| e.to_string())?
        .ok_or("args: expected a map")?;
    for _ in 0..entries {
        let key_end = msgpack::validate(body, pos).map_err(|e| format!("args: {e}"))?;
        if RawValue::trusted(&body[pos..key_end]).kind() != Kind::Str {
            return Err("args: keys must be strings".into());
        }
        pos = match seen.as_deref_mut() {
            Some(seen) => msgpack::validate_noting(body, key_end, seen),
            None => msgpack::validate(body, key_end),
        }
        .map_err(|e| format!("args: {e}"))?;
    }
    Ok(pos)
}

impl RecordSpans {
    /// Checks a record body the way LMCache's decoder does, in one pass over its bytes; the
    /// error names the field.
    pub(crate) fn parse(body: &[u8]) -> Result<RecordSpans, String> {
        RecordSpans::parse_into(body, None)
    }

    /// [`RecordSpans::parse`], keeping the keys validation read in LMCache's shape in `seen`
    /// (cleared first), for [`RecordRef::noting`].
    pub(crate) fn parse_noting<'a>(
        body: &'a [u8],
        seen: &mut Vec<SeenKey<'a>>,
    ) -> Result<RecordSpans, String> {
        seen.clear();
        RecordSpans::parse_into(body, Some(seen))
    }

    fn parse_into<'a>(
        body: &'a [u8],
        mut seen: Option<&mut Vec<SeenKey<'a>>>,
    ) -> Result<RecordSpans, String> {
        let (entries, mut pos) = match body.first() {
            Some(b @ 0x80..=0x8f) => ((b & 0x0f) as usize, 1),
            Some(0xde | 0xdf) => {
                let v = RawValue::parse(body).map_err(|e| e.to_string())?;
                let len = v.len();
                let header = if body[0] == 0xde { 3 } else { 5 };
                (len, header)
            }
            Some(_) => return Err("frame is not a msgpack map".into()),
            None => return Err("empty frame".into()),
        };
        let item = |pos: usize| -> Result<(RawValue<'_>, usize), String> {
            let end = msgpack::validate(body, pos).map_err(|e| e.to_string())?;
            Ok((RawValue::trusted(&body[pos..end]), end))
        };
        let (mut t_mono, mut t_wall, mut qualname, mut args) = (None, None, None, None);
        for _ in 0..entries {
            let (key, after_key) = item(pos)?;
            let key = key.str_bytes();
            if key == Some(b"args") && args.is_none() {
                pos = args_end(body, after_key, seen.take())?;
                args = Some(after_key..pos);
                continue;
            }
            let (value, end) = item(after_key)?;
            pos = end;
            match key {
                Some(b"type") if value.as_str() != Some("record") => {
                    return Err("type: expected \"record\"".into());
                }
                Some(b"t_mono") if t_mono.is_none() => {
                    t_mono = Some(value.as_f64().ok_or("t_mono: expected a number")?)
                }
                Some(b"t_wall") if t_wall.is_none() => {
                    t_wall = Some(value.as_f64().ok_or("t_wall: expected a number")?)
                }
                Some(b"qualname") if qualname.is_none() => {
                    let text = value.str_bytes().ok_or("qualname: expected a string")?;
                    qualname = Some(end - text.len()..end)
                }
                _ => {}
            }
        }
        if pos != body.len() {
            return Err(format!("trailing bytes after the map at body byte {pos}"));
        }
        Ok(RecordSpans {
            t_mono: t_mono.ok_or("t_mono: missing")?,
            t_wall: t_wall.ok_or("t_wall: missing")?,
            qualname: qualname.ok_or("qualname: missing")?,
            args: args.ok_or("args: missing")?,
        })
    }
}

impl<'a> RecordRef<'a> {
    /// Decodes a record body; the error names the offending field, as LMCache's decoder
    /// would reject it.
    pub fn parse(offset: u64, body: &'a [u8]) -> Result<RecordRef<'a>, String> {
        let spans = RecordSpans::parse(body)?;
        Ok(RecordRef::from_spans(offset, body, &spans))
    }

    pub(crate) fn from_spans(offset: u64, body: &'a [u8], spans: &RecordSpans) -> Self {
        let qualname = body
            .get(spans.qualname.clone())
            .and_then(msgpack::text)
            .unwrap_or_default();
        let args = RawValue::trusted(body.get(spans.args.clone()).unwrap_or(&[0x80]));
        RecordRef {
            offset,
            t_mono: spans.t_mono,
            t_wall: spans.t_wall,
            qualname,
            args,
            body,
            seen: &[],
        }
    }

    /// The record with the keys [`RecordSpans::parse_noting`] kept from its body.
    pub(crate) fn noting(self, seen: &'a [SeenKey<'a>]) -> Self {
        RecordRef { seen, ..self }
    }

    pub fn to_record(&self) -> Record {
        Record {
            t_mono: self.t_mono,
            t_wall: self.t_wall,
            qualname: self.qualname.to_owned(),
            args: self.args.to_value(),
        }
    }
}

/// An owned record, for building and editing traces.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub t_mono: f64,
    pub t_wall: f64,
    pub qualname: String,
    pub args: Value,
}

impl Record {
    /// Appends the msgpack body exactly as LMCache 0.5.6 encodes it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_record_head(out, self.t_mono, self.t_wall, &self.qualname);
        msgpack::encode(&self.args, out);
    }
}

/// Appends a record's map header and every field before `args`; the caller appends the
/// encoded args map. Lets the recorder splice pre-encoded arguments without a copy.
pub fn encode_record_head(out: &mut Vec<u8>, t_mono: f64, t_wall: f64, qualname: &str) {
    msgpack::put_map_len(out, 5);
    msgpack::put_str(out, "type");
    msgpack::put_str(out, "record");
    msgpack::put_str(out, "t_mono");
    msgpack::put_f64(out, t_mono);
    msgpack::put_str(out, "t_wall");
    msgpack::put_f64(out, t_wall);
    msgpack::put_str(out, "qualname");
    msgpack::put_str(out, qualname);
    msgpack::put_str(out, "args");
}

/// For the tests of readers that take the keys validation kept: the `i`-th of keys with the
/// int forms, name lengths and escapes the readers have branches for.
#[cfg(test)]
pub(crate) fn key_of_every_form(i: usize) -> crate::codec::ObjectKey {
    let long = "x".repeat(40);
    let names = [
        "meta-llama/Llama-3.1-8B",
        "",
        "m",
        &long,
        "modèle",
        "quote \" \\ \n \u{1}",
    ];
    let ints = [
        0,
        1,
        127,
        128,
        300,
        70_000,
        1 << 40,
        -1,
        -100,
        -40_000,
        -(1 << 40),
    ];
    let mut key =
        crate::codec::ObjectKey::single_rank(vec![i as u8; 32 - i % 32], names[i % names.len()]);
    key.kv_rank = ints[i % ints.len()];
    key.object_group_id = ints[ints.len() - 1 - i % ints.len()];
    key
}

/// For the tests of readers that take the keys validation kept: a record whose arguments
/// name keys of every int form, name length and escape, at the top, in a list and nested
/// in a tagged value, one of them in wider forms than needed (its name a str8, its rank a
/// u16); and the record's variants: itself, cut at every byte, and with each byte replaced
/// by values that start or break an item.
#[cfg(test)]
pub(crate) fn keyed_record() -> (Vec<u8>, Vec<Vec<u8>>) {
    use crate::codec::ObjectKey;
    use crate::msgpack::{encode_to_vec, put_str};
    let key = key_of_every_form;
    let mut wide = Vec::new();
    let mut narrow = ObjectKey::single_rank(vec![9; 32], "m");
    (narrow.kv_rank, narrow.object_group_id) = (5, 0);
    narrow.encode(&mut wide);
    // The name's head after the tag, the hash and the field's name; the rank after the name.
    let name = crate::codec::KEY_HEAD.len() + 2 + 32 + crate::codec::KEY_MODEL.len();
    wide.splice(name..name + 1, [0xd9, 0x01]);
    let rank = name + 3 + crate::codec::KEY_RANK.len();
    wide.splice(rank..rank + 1, [0xcd, 0x00, 0x05]);
    let mut body = Vec::new();
    encode_record_head(&mut body, 1.0, 2.0, "StorageManager.reserve_write");
    body.push(0x84);
    put_str(&mut body, "key");
    key(0).encode(&mut body);
    put_str(&mut body, "keys");
    body.push(0x9a);
    for i in 0..10 {
        key(i).encode(&mut body);
    }
    put_str(&mut body, "wide");
    body.extend_from_slice(&wide);
    put_str(&mut body, "group");
    let tagged = Value::Map(
        vec![
            (Value::str("__t__"), Value::str("GroupedObjectKeys")),
            (Value::str("v"), Value::Nil),
        ],
        None,
    );
    body.extend(encode_to_vec(&tagged));
    // The tagged value's payload: a list of one key in place of the nil.
    body.truncate(body.len() - 1);
    body.push(0x91);
    key(3).encode(&mut body);
    let variants = variants(
        &body,
        &[0x00, 0x80, 0x82, 0xa0, 0xc1, 0xc4, 0xcf, 0xd9, 0xff],
    );
    (body, variants)
}

/// For tests of readers: `body` itself, cut at every byte, and with each byte replaced by
/// each of `replacements`.
#[cfg(test)]
pub(crate) fn variants(body: &[u8], replacements: &[u8]) -> Vec<Vec<u8>> {
    let mut variants = vec![body.to_vec()];
    variants.extend((0..body.len()).map(|cut| body[..cut].to_vec()));
    for at in 0..body.len() {
        for &b in replacements {
            let mut bad = body.to_vec();
            bad[at] = b;
            variants.push(bad);
        }
    }
    variants
}
