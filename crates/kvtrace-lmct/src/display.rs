//! The display JSON view of msgpack values (format spec §9), what `dump` prints for people
//! and `jq`: codec tags are decoded (`{"__t__": "ObjectKey", "chunk_hash": "ab12…", …}`) and
//! bin is shown as hex.
//!
//! [`to_display`] builds it as a JSON tree: the definition. [`Shown`] writes the same text
//! straight from the msgpack bytes, without the tree: building one map (and hashing its keys)
//! per key of every record was most of a dump's time. [`Shown::write_compact`] writes the
//! compact text without serde, in one walk.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Number, Value as Json};

use super::codec::{
    ObjectKeyRef, TAG_LOCK_MODE, TAG_OBJECT_KEY, TAG_SET, TAG_TORCH_DTYPE, TAG_TORCH_SIZE,
    TAG_TUPLE,
};
use super::msgpack::view::{seen_key_at, Cursor, SeenKey};
use super::msgpack::{Kind, RawValue};
use super::value::Value;
use super::RecordRef;

/// The display form of a value, for `dump`.
pub fn to_display(v: RawValue<'_>) -> Json {
    match v.kind() {
        Kind::Nil => Json::Null,
        Kind::Bool => Json::Bool(v.as_bool().unwrap_or_default()),
        Kind::Int => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => Json::from(u),
            (_, Some(i)) => Json::from(i),
            _ => Json::Null,
        },
        Kind::Float => {
            let x = v.as_f64().unwrap_or(f64::NAN);
            Number::from_f64(x)
                .map(Json::Number)
                .unwrap_or_else(|| Json::String(x.to_string()))
        }
        Kind::Str => Json::String(v.as_str().unwrap_or_default().to_owned()),
        Kind::Bin => Json::String(hex::encode(v.as_bin().unwrap_or_default())),
        Kind::Array => Json::Array(v.array().into_iter().flatten().map(to_display).collect()),
        Kind::Ext => {
            let value = v.to_value();
            let mut m = Map::new();
            if let Value::Ext(ty, data, _) = value {
                m.insert("ext_type".into(), Json::from(ty));
                m.insert("data".into(), Json::String(hex::encode(data)));
            }
            Json::Object(m)
        }
        Kind::Map => match v.as_tagged() {
            Some((tag, payload)) => display_tagged(tag, payload),
            None => {
                let mut m = Map::new();
                for (k, val) in v.map().into_iter().flatten() {
                    let key = match k.as_str() {
                        Some(s) => s.to_owned(),
                        None => to_display(k).to_string(),
                    };
                    m.insert(key, to_display(val));
                }
                Json::Object(m)
            }
        },
    }
}

fn display_tagged(tag: &str, payload: RawValue<'_>) -> Json {
    if unwrapped(tag) {
        return to_display(payload);
    }
    let mut m = Map::new();
    m.insert("__t__".into(), Json::String(tag.to_owned()));
    match to_display(payload) {
        Json::Object(fields) if payload.as_tagged().is_none() => m.extend(fields),
        other => {
            m.insert("v".into(), other);
        }
    }
    Json::Object(m)
}

/// Tags whose payload is shown in place of the tagged value.
fn unwrapped(tag: &str) -> bool {
    matches!(
        tag,
        TAG_TUPLE | TAG_SET | TAG_TORCH_SIZE | TAG_LOCK_MODE | TAG_TORCH_DTYPE
    )
}

/// A value serialized as its display JSON: with any serde_json serializer, compact or pretty,
/// exactly the text of serializing [`to_display`]'s tree. The shapes where the tree differs
/// from the bytes — a map whose keys are not distinct UTF-8 strings (the tree keeps the last
/// value of a repeated key, in the first one's place), and ext — are serialized through the
/// tree; nothing LMCache writes has them.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    value: RawValue<'a>,
    /// The keys validating the value's frame kept (empty: none), written from their fields.
    seen: &'a [SeenKey<'a>],
}

impl<'a> Shown<'a> {
    pub fn new(value: RawValue<'a>) -> Self {
        Shown { value, seen: &[] }
    }

    /// A record's arguments. Its keys that validation kept are written from the fields it
    /// read, without walking their bytes again: the keys are nearly all of a trace's bytes,
    /// and walking each (its tag, its fields' names, whether they are distinct) was most of
    /// a dump's time.
    pub fn args(record: &RecordRef<'a>) -> Self {
        Shown {
            value: record.args,
            seen: record.seen,
        }
    }

    fn inner(&self, value: RawValue<'a>) -> Self {
        Shown {
            value,
            seen: self.seen,
        }
    }
}

impl Serialize for Shown<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.value;
        if !self.seen.is_empty() && v.bytes().first() == Some(&0x82) {
            if let Some(key) = seen_key_at(self.seen, v) {
                return serialize_key(&key, s);
            }
        }
        match v.kind() {
            Kind::Nil => s.serialize_unit(),
            Kind::Bool => s.serialize_bool(v.as_bool().unwrap_or_default()),
            Kind::Int => match (v.as_u64(), v.as_i64()) {
                (Some(u), _) => s.serialize_u64(u),
                (_, Some(i)) => s.serialize_i64(i),
                _ => s.serialize_unit(),
            },
            Kind::Float => match v.as_f64().unwrap_or(f64::NAN) {
                x if x.is_finite() => s.serialize_f64(x),
                x => s.serialize_str(&x.to_string()),
            },
            Kind::Str => s.serialize_str(v.as_str().unwrap_or_default()),
            Kind::Bin => serialize_hex(v.as_bin().unwrap_or_default(), s),
            Kind::Array => {
                let mut seq = s.serialize_seq(Some(v.len()))?;
                for item in v.array().map(|i| i.noting(self.seen)).into_iter().flatten() {
                    seq.serialize_element(&self.inner(item))?;
                }
                seq.end()
            }
            Kind::Map => match v.as_tagged() {
                Some((tag, payload)) if unwrapped(tag) => self.inner(payload).serialize(s),
                Some((tag, payload)) => self.tagged(tag, payload, s),
                None if distinct_text_keys(v, None, self.seen) => {
                    let mut map = s.serialize_map(Some(v.len()))?;
                    self.entries(v, &mut map)?;
                    map.end()
                }
                None => to_display(v).serialize(s),
            },
            Kind::Ext => to_display(v).serialize(s),
        }
    }
}

impl<'a> Shown<'a> {
    /// A tagged value other than the unwrapped ones: the tag, then the payload's fields when
    /// it is a plain map, else the payload as `v`.
    fn tagged<S: Serializer>(
        &self,
        tag: &str,
        payload: RawValue<'a>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let fields = payload.kind() == Kind::Map && payload.as_tagged().is_none();
        if (fields && !distinct_text_keys(payload, Some("__t__"), self.seen))
            || payload.kind() == Kind::Ext
        {
            return to_display(self.value).serialize(s);
        }
        let len = if fields { 1 + payload.len() } else { 2 };
        let mut map = s.serialize_map(Some(len))?;
        map.serialize_entry("__t__", tag)?;
        if fields {
            self.entries(payload, &mut map)?;
        } else {
            map.serialize_entry("v", &self.inner(payload))?;
        }
        map.end()
    }

    fn entries<M: SerializeMap>(&self, v: RawValue<'a>, map: &mut M) -> Result<(), M::Error> {
        for (k, val) in v.map().map(|e| e.noting(self.seen)).into_iter().flatten() {
            map.serialize_entry(k.as_str().unwrap_or_default(), &self.inner(val))?;
        }
        Ok(())
    }
}

impl<'a> Shown<'a> {
    /// Appends the compact text, byte for byte what `serde_json::to_writer` writes for the
    /// value, without serde: its string writer scans every byte of every field name, hash
    /// and model name against an escape table, and that was a fifth of a dump. A key
    /// validation kept is written as constant text around its hash, name and ints; floats,
    /// ext and the shapes [`Shown`] hands to the tree go through serde_json as before.
    pub fn write_compact(&self, out: &mut Vec<u8>) {
        let mark = out.len();
        if write_next(&mut Cursor::noting(self.value, self.seen), out).is_none() {
            // Only on a broken invariant (the value was validated): serde's text then.
            out.truncate(mark);
            write_serde(out, self);
        }
    }
}

/// Writes the item at the cursor, compact, and moves past it. The value is walked once, in
/// the order of its bytes: each item's end is where writing it ended, where a walk that
/// looked items up (a map's entries to check that its keys are distinct, then to write them,
/// then each value) stepped over every layout and key list two more times. The kept keys are
/// taken where the cursor meets them.
fn write_next<'a>(c: &mut Cursor<'a>, out: &mut Vec<u8>) -> Option<()> {
    if let Some(key) = c.seen_key() {
        write_key(&key, out);
        return Some(());
    }
    let start = c.clone();
    if let Some(n) = c.array_len() {
        out.push(b'[');
        for i in 0..n {
            if i > 0 {
                out.push(b',');
            }
            write_next(c, out)?;
        }
        out.push(b']');
        return Some(());
    }
    let Some(n) = c.map_len() else {
        return write_scalar(c.value()?, out);
    };
    let mark = out.len();
    let written = match tagged(c, n) {
        Some(tag) if unwrapped(tag) => write_next(c, out).map(|()| true),
        Some(tag) => write_tagged(tag, c, out),
        None => {
            out.push(b'{');
            write_entries(c, n, None, out)
        }
    };
    match written {
        Some(true) => Some(()),
        // The shapes the text takes from the tree: written again from it.
        Some(false) => {
            out.truncate(mark);
            *c = start;
            write_serde(out, &to_display(c.value()?));
            Some(())
        }
        None => None,
    }
}

/// The tag of a codec-tagged map (`{"__t__": tag, "v": payload}`, as
/// [`RawValue::as_tagged`] reads one) of `n` entries whose first key is at the cursor; the
/// cursor moves to the payload. It does not move when the map is not one.
fn tagged<'a>(c: &mut Cursor<'a>, n: usize) -> Option<&'a str> {
    if n != 2 {
        return None;
    }
    let mut probe = c.clone();
    if probe.str_bytes()? != b"__t__" {
        return None;
    }
    let tag = probe.str()?;
    if probe.str_bytes()? != b"v" {
        return None;
    }
    *c = probe;
    Some(tag)
}

/// [`Shown::tagged`], compact, the cursor at the payload; `Some(false)` for a shape written
/// from the tree.
fn write_tagged<'a>(tag: &str, c: &mut Cursor<'a>, out: &mut Vec<u8>) -> Option<bool> {
    if c.kind()? == Kind::Ext {
        return Some(false);
    }
    out.extend_from_slice(b"{\"__t__\":");
    write_str(out, tag);
    let mut fields = c.clone();
    if let Some(n) = fields.map_len() {
        if tagged(&mut fields.clone(), n).is_none() {
            *c = fields;
            return write_entries(c, n, Some("__t__"), out);
        }
    }
    out.extend_from_slice(b",\"v\":");
    write_next(c, out)?;
    out.push(b'}');
    Some(true)
}

/// A map's `n` entries from the cursor, after the map's opening brace (and the tag, when
/// `taken` is the tag's name), then its closing brace; `Some(false)` when a key is not a
/// UTF-8 string, repeats, or is `taken`: the text is then the tree's.
fn write_entries<'a>(
    c: &mut Cursor<'a>,
    n: usize,
    taken: Option<&str>,
    out: &mut Vec<u8>,
) -> Option<bool> {
    let mut names = Names::default();
    for i in 0..n {
        let Some(name) = c.str() else {
            return Some(false);
        };
        if Some(name) == taken || !names.first_time(name) {
            return Some(false);
        }
        if i > 0 || taken.is_some() {
            out.push(b',');
        }
        write_str(out, name);
        out.push(b':');
        write_next(c, out)?;
    }
    out.push(b'}');
    Some(true)
}

/// An item that is neither a list nor a map.
fn write_scalar(v: RawValue<'_>, out: &mut Vec<u8>) -> Option<()> {
    match v.kind() {
        Kind::Nil => out.extend_from_slice(b"null"),
        Kind::Bool => match v.as_bool()? {
            true => out.extend_from_slice(b"true"),
            false => out.extend_from_slice(b"false"),
        },
        Kind::Int => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => write_int(out, u),
            (_, Some(i)) => write_int(out, i),
            _ => out.extend_from_slice(b"null"),
        },
        Kind::Str => write_str(out, v.as_str()?),
        Kind::Bin => write_hex(out, v.as_bin()?),
        Kind::Float | Kind::Ext | Kind::Array | Kind::Map => write_serde(out, &Shown::new(v)),
    }
    Some(())
}

/// [`serialize_key`], compact.
fn write_key(key: &ObjectKeyRef<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"__t__\":");
    write_str(out, TAG_OBJECT_KEY);
    out.extend_from_slice(b",\"chunk_hash\":");
    write_hex(out, key.chunk_hash);
    out.extend_from_slice(b",\"model_name\":");
    write_str(out, key.model_name);
    out.extend_from_slice(b",\"kv_rank\":");
    write_int(out, key.kv_rank);
    out.extend_from_slice(b",\"object_group_id\":");
    write_int(out, key.object_group_id);
    out.push(b'}');
}

/// Appends `compact`, JSON text as serde_json writes it compact (no space outside strings),
/// as `serde_json::to_writer_pretty` writes the same value: two spaces a level, `": "`
/// after a key, an empty list or object as `[]` or `{}`. A pretty dump writes each record
/// compact and then spaces it, at a fraction of serde's pretty serializer's cost.
pub fn write_pretty(compact: &[u8], out: &mut Vec<u8>) {
    out.reserve(compact.len() + compact.len() / 2);
    let mut depth = 0usize;
    let mut rest = compact;
    let newline = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.resize(out.len() + 2 * depth, b' ');
    };
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'"' => {
                // The string whole, to its closing quote: the byte after a backslash is
                // escaped, whatever it is.
                let mut end = 0;
                loop {
                    match memchr::memchr2(b'"', b'\\', &rest[end..]) {
                        Some(i) if rest[end + i] == b'"' => {
                            end += i + 1;
                            break;
                        }
                        Some(i) => end = (end + i + 2).min(rest.len()),
                        None => {
                            end = rest.len();
                            break;
                        }
                    }
                }
                out.push(b'"');
                out.extend_from_slice(&rest[..end]);
                rest = &rest[end..];
            }
            b'[' | b'{' => {
                let close = if b == b'[' { b']' } else { b'}' };
                out.push(b);
                if rest.first() == Some(&close) {
                    out.push(close);
                    rest = &rest[1..];
                } else {
                    depth += 1;
                    newline(out, depth);
                }
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                newline(out, depth);
                out.push(b);
            }
            b',' => {
                out.push(b',');
                newline(out, depth);
            }
            b':' => out.extend_from_slice(b": "),
            _ => {
                // A number or a literal, to the next structural byte.
                let end = rest
                    .iter()
                    .position(|c| matches!(c, b',' | b']' | b'}'))
                    .unwrap_or(rest.len());
                out.push(b);
                out.extend_from_slice(&rest[..end]);
                rest = &rest[end..];
            }
        }
    }
}

/// An integer as serde_json writes one (its digits are `itoa`'s).
pub fn write_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string. Text with nothing to escape (no control character, quote or backslash:
/// every name and hash a trace holds) is copied between quotes; other text is written by
/// serde_json, so that its escapes are serde_json's.
pub fn write_str(out: &mut Vec<u8>, text: &str) {
    if needs_escape(text.as_bytes()) {
        return write_serde(out, text);
    }
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// Whether any byte is below 0x20, `"` or `\`: eight bytes at a time, the bytes of a word
/// tested together with the usual borrow tricks (a byte's high bit marks a match; bytes of
/// 0x80 and above, UTF-8's, never match).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let (words, tail) = bytes.as_chunks::<8>();
    let hits = words.iter().fold(0u64, |hits, word| {
        let x = u64::from_ne_bytes(*word);
        hits | (x.wrapping_sub(ONES * 0x20) & !x & HIGH)
            | zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')))
    });
    hits != 0 || tail.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Bytes as a string of lowercase hex (see [`hex_into`]).
pub(crate) fn write_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    let at = out.len();
    out.resize(at + 2 * bytes.len(), 0);
    hex_into(bytes, &mut out[at..]);
    out.push(b'"');
}

/// Writes `bytes` as lowercase hex into `into`, as long as two digits a byte, from a table:
/// the `hex` crate's nibble at a time was a twelfth of a dump (a chunk hash is 32 bytes of
/// every key). Both writers, serde's and the compact one, take their hex from here.
fn hex_into(bytes: &[u8], into: &mut [u8]) {
    const PAIRS: [[u8; 2]; 256] = {
        let digits = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            pairs[i] = [digits[i >> 4], digits[i & 15]];
            i += 1;
        }
        pairs
    };
    for (pair, &b) in into.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(b)]);
    }
}

/// What serde_json writes for `value`: writing into a `Vec` cannot fail, as every map key
/// written is a string.
fn write_serde(out: &mut Vec<u8>, value: &(impl Serialize + ?Sized)) {
    let _ = serde_json::to_writer(out, value);
}

/// A key validation kept, as the general walk writes a key in that shape: the tag, then the
/// payload's four fields in the order the shape has them.
fn serialize_key<S: Serializer>(key: &ObjectKeyRef<'_>, s: S) -> Result<S::Ok, S::Error> {
    /// An int as the general walk writes it: unsigned where it is not negative.
    struct Int(i64);
    impl Serialize for Int {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match u64::try_from(self.0) {
                Ok(u) => s.serialize_u64(u),
                Err(_) => s.serialize_i64(self.0),
            }
        }
    }
    let mut map = s.serialize_map(Some(5))?;
    map.serialize_entry("__t__", TAG_OBJECT_KEY)?;
    map.serialize_entry("chunk_hash", &Hex(key.chunk_hash))?;
    map.serialize_entry("model_name", key.model_name)?;
    map.serialize_entry("kv_rank", &Int(key.kv_rank))?;
    map.serialize_entry("object_group_id", &Int(key.object_group_id))?;
    map.end()
}

/// Whether every key of a map is a UTF-8 string, no two are equal, and none is `taken`.
fn distinct_text_keys(v: RawValue<'_>, taken: Option<&str>, seen: &[SeenKey<'_>]) -> bool {
    let mut names = Names::default();
    for (k, _) in v.map().map(|e| e.noting(seen)).into_iter().flatten() {
        match k.as_str() {
            Some(key) if Some(key) != taken && names.first_time(key) => {}
            _ => return false,
        }
    }
    true
}

/// The names a map's keys have had so far, for whether they are distinct: compared one by
/// one while there are few (the maps of a trace have a handful of keys), hashed past that.
#[derive(Default)]
pub(crate) struct Names<'a> {
    few: [&'a str; Names::FEW],
    count: usize,
    many: std::collections::HashSet<&'a str>,
}

impl<'a> Names<'a> {
    const FEW: usize = 16;

    /// Notes `name`; whether no earlier key had it.
    pub(crate) fn first_time(&mut self, name: &'a str) -> bool {
        let i = self.count;
        self.count += 1;
        if i < Names::FEW {
            if self.few[..i].contains(&name) {
                return false;
            }
            self.few[i] = name;
            return true;
        }
        if i == Names::FEW {
            self.many.extend(self.few);
        }
        self.many.insert(name)
    }
}

/// Bytes as lowercase hex text.
pub(crate) struct Hex<'a>(pub(crate) &'a [u8]);

impl Serialize for Hex<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_hex(self.0, s)
    }
}

/// Bin as lowercase hex, formatted on the stack when short (a chunk hash is 32 bytes).
fn serialize_hex<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; 128];
    let mut long = Vec::new();
    let out = match buf.get_mut(..bytes.len() * 2) {
        Some(out) => out,
        None => {
            long.resize(bytes.len() * 2, 0);
            &mut long[..]
        }
    };
    hex_into(bytes, out);
    // Hex digits are ASCII: never the default.
    s.serialize_str(std::str::from_utf8(out).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::encode_to_vec;

    fn map(entries: Vec<(Value, Value)>) -> Value {
        Value::Map(entries, None)
    }

    fn keyed(keys: impl IntoIterator<Item = String>) -> Value {
        map(keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| (Value::str(k), Value::int(i as i64)))
            .collect())
    }

    fn tagged(tag: &str, payload: Value) -> Value {
        map(vec![
            (Value::str("__t__"), Value::str(tag)),
            (Value::str("v"), payload),
        ])
    }

    fn compact(shown: &Shown<'_>) -> String {
        let mut out = Vec::new();
        shown.write_compact(&mut out);
        String::from_utf8(out).expect("UTF-8")
    }

    /// Spacing serde_json's compact text gives its pretty text: nesting, empty lists and
    /// objects at every depth, and strings holding quotes, backslashes and the characters
    /// that are structure outside a string.
    #[test]
    fn compact_text_spaced_is_serde_jsons_pretty_text() {
        let values = [
            serde_json::json!(null),
            serde_json::json!([]),
            serde_json::json!({}),
            serde_json::json!([[], {}, [[]], {"a": {}}]),
            serde_json::json!({"a": [1, -2.5e-7, true, null], "b": {"c": {"d": []}}}),
            serde_json::json!(["\"", "\\", "\\\"", "{[,:]}", "a\"b,c:d{e}", "é\u{1}\n"]),
            serde_json::json!({"k\"{": "v\\", "": ""}),
        ];
        for value in values {
            let compact = serde_json::to_vec(&value).expect("text");
            let mut pretty = Vec::new();
            write_pretty(&compact, &mut pretty);
            let expected = serde_json::to_string_pretty(&value).expect("text");
            assert_eq!(String::from_utf8(pretty).expect("UTF-8"), expected);
        }
    }

    /// The word-at-a-time test agrees with the byte-at-a-time one for every byte value at
    /// every place of strings of every length up to three words and a tail, and the text of
    /// every such string is serde_json's.
    #[test]
    fn strings_are_escaped_where_serde_json_escapes_them() {
        let naive = |bytes: &[u8]| bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
        for len in 0..=27 {
            for at in 0..len {
                for byte in 0..=u8::MAX {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = byte;
                    assert_eq!(needs_escape(&bytes), naive(&bytes), "{bytes:?}");
                }
            }
        }
        for text in [
            "",
            "plain",
            "\u{7f}\u{80}é😀",
            "tab\there",
            "q\"",
            "b\\",
            "\u{1f}",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, text);
            assert_eq!(out, serde_json::to_vec(text).expect("text"), "{text:?}");
        }
    }

    /// A record's arguments written with the keys its validation kept are the text of the
    /// arguments walked afresh, compact and pretty, for every variant of the keyed record.
    #[test]
    fn kept_keys_are_written_as_the_walk_writes_them() {
        use crate::frame::{keyed_record, RecordSpans};
        let (body, variants) = keyed_record();
        let mut kept_any = 0;
        for bytes in &variants {
            let mut seen = Vec::new();
            let Ok(spans) = RecordSpans::parse_noting(bytes, &mut seen) else {
                continue;
            };
            kept_any += usize::from(!seen.is_empty());
            let record = RecordRef::from_spans(0, bytes, &spans).noting(&seen);
            let (kept, afresh) = (Shown::args(&record), Shown::new(record.args));
            let text = serde_json::to_string(&afresh).expect("text");
            assert_eq!(serde_json::to_string(&kept).expect("text"), text);
            assert_eq!(compact(&kept), text);
            assert_eq!(compact(&afresh), text);
            assert_eq!(
                serde_json::to_string_pretty(&kept).expect("text"),
                serde_json::to_string_pretty(&afresh).expect("text"),
            );
        }
        let mut seen = Vec::new();
        RecordSpans::parse_noting(&body, &mut seen).expect("the whole record decodes");
        assert_eq!(seen.len(), 13, "every key of the whole record is kept");
        assert!(
            kept_any > body.len(),
            "most changed records still keep keys"
        );
    }

    /// The shapes the streamed text takes its own way for, and those it hands to the tree:
    /// each gives the tree's text, compact and pretty.
    #[test]
    fn shown_is_the_text_of_the_tree() {
        let many: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let mut repeated_late = many.clone();
        repeated_late.push("k3".into());
        let cases = [
            Value::F64(f64::NAN),
            Value::F64(f64::NEG_INFINITY),
            Value::F32(0.1),
            Value::F64(1e-6),
            Value::int(i64::MIN),
            Value::int(u64::MAX),
            Value::str("quote \" slash \\ line \n \u{1} é 😀"),
            Value::bin(vec![0xab; 64]),
            Value::bin(vec![0xcd; 65]),
            Value::bin(Vec::new()),
            map(Vec::new()),
            Value::array(Vec::new()),
            keyed(["a", "b", "a"].map(String::from)),
            keyed(many.clone()),
            keyed(repeated_late),
            map(vec![
                (Value::int(1), Value::str("x")),
                (Value::Nil, Value::Nil),
            ]),
            // A repeated key after a nested value was written: the text is the tree's.
            map(vec![
                (
                    Value::str("a"),
                    Value::array(vec![Value::int(1), keyed(["x"].map(String::from))]),
                ),
                (
                    Value::str("b"),
                    tagged("ObjectKey", keyed(["y"].map(String::from))),
                ),
                (Value::str("a"), Value::Nil),
            ]),
            tagged("ObjectKey", keyed(["y", "y"].map(String::from))),
            tagged(
                "ObjectKey",
                keyed(["chunk_hash", "model_name"].map(String::from)),
            ),
            tagged("ObjectKey", keyed(["x", "__t__"].map(String::from))),
            tagged("ObjectKey", keyed(["x", "x"].map(String::from))),
            tagged("ObjectKey", Value::int(5)),
            tagged("ObjectKey", Value::Ext(3, vec![1, 2], None)),
            tagged("ObjectKey", tagged("tuple", keyed(many))),
            tagged(
                "tuple",
                Value::array(vec![Value::int(1), Value::bin(vec![7])]),
            ),
            tagged("torch.dtype", Value::str("float16")),
            Value::Ext(-1, vec![9; 3], None),
        ];
        for case in &cases {
            let bytes = encode_to_vec(case);
            let raw = RawValue::parse(&bytes).expect("own encoding");
            let tree = to_display(raw);
            let text = serde_json::to_string(&tree).expect("text");
            assert_eq!(
                serde_json::to_string(&Shown::new(raw)).expect("text"),
                text,
                "{case:?}"
            );
            assert_eq!(compact(&Shown::new(raw)), text, "{case:?}");
            assert_eq!(
                serde_json::to_string_pretty(&Shown::new(raw)).expect("text"),
                serde_json::to_string_pretty(&tree).expect("text"),
                "{case:?}"
            );
        }
    }
}
