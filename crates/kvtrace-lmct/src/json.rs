//! The lossless JSON view of msgpack values (format spec §9), the one `convert` writes to
//! `.jsonl`: plain JSON wherever that is exact, and a one-key `$…` annotation object wherever
//! it is not (bin, non-canonical widths, float32, non-finite floats, maps JSON cannot hold,
//! ext). Converting back gives the same bytes. The display view `dump` prints is in
//! [`super::display`].

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Number, Value as Json};

use super::codec::{ObjectKeyRef, KEY_GROUP, KEY_HEAD, KEY_MODEL, KEY_RANK, TAG_OBJECT_KEY};
use super::display::{write_hex, write_int, write_str, Hex, Names};
use super::msgpack::view::{key_parts, text, KeyParts, SeenKey};
use super::msgpack::{
    canonical_int_form, put_array_len_form, put_bin_head, put_bool, put_f64, put_int_form,
    put_map_len_form, put_nil, put_str_form, Cursor, Kind, RawValue,
};
use super::value::{Form, Value};
use super::RecordRef;

fn form_name(kind: &str, form: Form) -> String {
    let int = |n: &str| n.to_string();
    match (kind, form) {
        (_, Form::U8) => int("u8"),
        (_, Form::U16) => int("u16"),
        (_, Form::U32) => int("u32"),
        (_, Form::U64) => int("u64"),
        (_, Form::I8) => int("i8"),
        (_, Form::I16) => int("i16"),
        (_, Form::I32) => int("i32"),
        (_, Form::I64) => int("i64"),
        (k, Form::Fix) => format!("fix{k}"),
        (k, Form::W8) => format!("{k}8"),
        (k, Form::W16) => format!("{k}16"),
        (k, Form::W32) => format!("{k}32"),
    }
}

fn parse_form(name: &str) -> Option<(&'static str, Form)> {
    let ints = [
        ("u8", Form::U8),
        ("u16", Form::U16),
        ("u32", Form::U32),
        ("u64", Form::U64),
        ("i8", Form::I8),
        ("i16", Form::I16),
        ("i32", Form::I32),
        ("i64", Form::I64),
    ];
    if let Some((_, f)) = ints.iter().find(|(n, _)| *n == name) {
        return Some(("int", *f));
    }
    for kind in ["str", "bin", "array", "map", "ext"] {
        if let Some(rest) = name.strip_prefix(kind) {
            let form = match rest {
                "8" => Form::W8,
                "16" => Form::W16,
                "32" => Form::W32,
                _ => continue,
            };
            return Some((kind, form));
        }
    }
    if let Some(kind) = name.strip_prefix("fix") {
        for k in ["str", "array", "map", "ext"] {
            if kind == k {
                return Some((k, Form::Fix));
            }
        }
    }
    None
}

fn annotated(key: &str, v: Json) -> Json {
    let mut m = Map::new();
    m.insert(key.into(), v);
    Json::Object(m)
}

fn with_form(kind: &str, form: Option<Form>, v: Json) -> Json {
    match form {
        None => v,
        Some(f) => {
            let mut m = Map::new();
            m.insert("$enc".into(), Json::String(form_name(kind, f)));
            m.insert("v".into(), v);
            Json::Object(m)
        }
    }
}

fn float_json(key: &str, x: f64) -> Json {
    match Number::from_f64(x) {
        Some(n) if key == "$f64" => Json::Number(n),
        Some(n) => annotated(key, Json::Number(n)),
        None => annotated(key, Json::String(float_name(x).into())),
    }
}

/// True when a map can be written as a plain JSON object and read back identically.
fn plain_object_ok(entries: &[(Value, Value)]) -> bool {
    let mut seen = std::collections::HashSet::new();
    for (i, (k, _)) in entries.iter().enumerate() {
        match k {
            Value::Str(s, None) => {
                if (i == 0 && s.starts_with('$')) || !seen.insert(s.as_str()) {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

/// The lossless JSON form of a value.
pub fn to_lossless(v: &Value) -> Json {
    match v {
        Value::Nil => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i, form) => {
            let n = if *i >= 0 {
                Number::from(*i as u64)
            } else {
                Number::from(*i as i64)
            };
            with_form("int", *form, Json::Number(n))
        }
        Value::F64(x) => float_json("$f64", *x),
        Value::F32(x) => float_json("$f32", *x as f64),
        Value::Str(s, form) => with_form("str", *form, Json::String(s.clone())),
        Value::Bin(b, form) => with_form(
            "bin",
            *form,
            annotated("$bin_hex", Json::String(hex::encode(b))),
        ),
        Value::Array(items, form) => with_form(
            "array",
            *form,
            Json::Array(items.iter().map(to_lossless).collect()),
        ),
        Value::Map(entries, form) => {
            let body = if plain_object_ok(entries) {
                let mut m = Map::new();
                for (k, val) in entries {
                    m.insert(k.as_str().unwrap_or_default().to_owned(), to_lossless(val));
                }
                Json::Object(m)
            } else {
                let pairs = entries
                    .iter()
                    .map(|(k, val)| Json::Array(vec![to_lossless(k), to_lossless(val)]))
                    .collect();
                annotated("$map", Json::Array(pairs))
            };
            with_form("map", *form, body)
        }
        Value::Ext(ty, data, form) => with_form(
            "ext",
            *form,
            annotated(
                "$ext",
                Json::Array(vec![Json::from(*ty), Json::String(hex::encode(data))]),
            ),
        ),
    }
}

/// A value serialized as its lossless JSON: exactly the text of serializing [`to_lossless`]'s
/// tree, written without building the tree (a map and a string per key of every record
/// were most of a conversion's time).
pub struct Lossless<'a>(pub &'a Value);

impl Serialize for Lossless<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Nil => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i, form) => Formed("int", *form, &Int(*i)).serialize(s),
            Value::F64(x) if x.is_finite() => s.serialize_f64(*x),
            Value::F64(x) => Annotated("$f64", &float_name(*x)).serialize(s),
            Value::F32(x) if x.is_finite() => Annotated("$f32", &(*x as f64)).serialize(s),
            Value::F32(x) => Annotated("$f32", &float_name(*x as f64)).serialize(s),
            Value::Str(text, form) => Formed("str", *form, text).serialize(s),
            Value::Bin(b, form) => {
                Formed("bin", *form, &Annotated("$bin_hex", &hex::encode(b))).serialize(s)
            }
            Value::Array(items, form) => Formed("array", *form, &Items(items)).serialize(s),
            Value::Map(entries, form) if plain_object_ok(entries) => {
                Formed("map", *form, &Fields(entries)).serialize(s)
            }
            Value::Map(entries, form) => {
                Formed("map", *form, &Annotated("$map", &Pairs(entries))).serialize(s)
            }
            Value::Ext(ty, data, form) => {
                let payload = (*ty, hex::encode(data));
                Formed("ext", *form, &Annotated("$ext", &payload)).serialize(s)
            }
        }
    }
}

/// A value serialized as its lossless JSON straight from its msgpack bytes: exactly the text
/// of [`Lossless`] of [`RawValue::to_value`], without building the value (its strings, byte
/// vectors and lists were allocated and freed for every key of every record, most of a
/// conversion's time).
#[derive(Clone, Copy)]
pub struct RawLossless<'a> {
    value: RawValue<'a>,
    /// The keys validating the value's frame kept (empty: none): lists and maps step over
    /// them without a walk.
    seen: &'a [SeenKey<'a>],
}

impl<'a> RawLossless<'a> {
    pub fn new(value: RawValue<'a>) -> Self {
        RawLossless { value, seen: &[] }
    }

    /// A record's whole frame body, stepping over the keys its validation kept.
    pub fn record(record: &RecordRef<'a>) -> Option<Self> {
        Some(RawLossless {
            value: RawValue::parse(record.body).ok()?,
            seen: record.seen,
        })
    }

    /// Appends the compact text, byte for byte what `serde_json::to_writer` writes for the
    /// value, without serde and in one walk: the serde path looks each map's entries up
    /// twice (to judge whether it is a plain object, then to write it) and scans every
    /// field name, hash and model name against its escape table, 3.5 times the CPU of
    /// `dump`'s text for the same records. Floats and text that needs escapes still go
    /// through serde_json, so that their text is its text.
    pub fn write_compact(&self, out: &mut Vec<u8>) {
        let mark = out.len();
        if write_next(&mut Cursor::noting(self.value, self.seen), out).is_none() {
            // Only on a broken invariant (the value was validated): serde's text then.
            out.truncate(mark);
            let _ = serde_json::to_writer(&mut *out, self);
        }
    }

    fn inner(&self, value: RawValue<'a>) -> Self {
        RawLossless {
            value,
            seen: self.seen,
        }
    }

    fn items(&self) -> impl Iterator<Item = RawLossless<'a>> + '_ {
        let items = self.value.array().map(|i| i.noting(self.seen));
        items.into_iter().flatten().map(|v| self.inner(v))
    }

    fn entries(&self) -> impl Iterator<Item = (RawValue<'a>, RawLossless<'a>)> + '_ {
        let entries = self.value.map().map(|e| e.noting(self.seen));
        entries
            .into_iter()
            .flatten()
            .map(|(k, v)| (k, self.inner(v)))
    }
}

impl Serialize for RawLossless<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.value;
        if let Some(key) = key_parts(v) {
            return serialize_key(&key, s);
        }
        let Some(shape) = v.shape() else {
            return s.serialize_unit();
        };
        let form = shape.form;
        match shape.kind {
            Kind::Nil => s.serialize_unit(),
            Kind::Bool => s.serialize_bool(shape.n == 1),
            Kind::Int => Formed("int", form, &Int(shape.n)).serialize(s),
            Kind::Float => match shape.float {
                Some((x, false)) if x.is_finite() => s.serialize_f64(x),
                Some((x, false)) => Annotated("$f64", &float_name(x)).serialize(s),
                // An f32 as the value holds it: narrowed, then widened to be written.
                Some((x, true)) => match x as f32 as f64 {
                    y if y.is_finite() => Annotated("$f32", &y).serialize(s),
                    y => Annotated("$f32", &float_name(y)).serialize(s),
                },
                None => s.serialize_unit(),
            },
            Kind::Str => Formed("str", form, v.as_str().unwrap_or_default()).serialize(s),
            Kind::Bin => {
                let hex = Hex(v.as_bin().unwrap_or_default());
                Formed("bin", form, &Annotated("$bin_hex", &hex)).serialize(s)
            }
            Kind::Array => Formed("array", form, &RawItems(self)).serialize(s),
            Kind::Map if plain_object_raw(self) => {
                Formed("map", form, &RawFields(self)).serialize(s)
            }
            Kind::Map => Formed("map", form, &Annotated("$map", &RawPairs(self))).serialize(s),
            Kind::Ext => {
                let payload = (shape.ext_type, Hex(shape.ext_data));
                Formed("ext", form, &Annotated("$ext", &payload)).serialize(s)
            }
        }
    }
}

/// A key in LMCache's exact shape, as the general walk writes it: the tag, then the payload
/// of four plain fields, the hash as hex (a bin8 is the canonical form of any hash it can
/// hold) and the name and ints as themselves, each with its form.
fn serialize_key<S: Serializer>(key: &KeyParts<'_>, s: S) -> Result<S::Ok, S::Error> {
    struct Payload<'a>(&'a KeyParts<'a>);
    impl Serialize for Payload<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let key = self.0;
            let mut map = s.serialize_map(Some(4))?;
            map.serialize_entry("chunk_hash", &Annotated("$bin_hex", &Hex(key.hash)))?;
            map.serialize_entry("model_name", &RawLossless::new(key.name))?;
            map.serialize_entry("kv_rank", &RawLossless::new(key.rank))?;
            map.serialize_entry("object_group_id", &RawLossless::new(key.group))?;
            map.end()
        }
    }
    let mut map = s.serialize_map(Some(2))?;
    map.serialize_entry("__t__", TAG_OBJECT_KEY)?;
    map.serialize_entry("v", &Payload(key))?;
    map.end()
}

/// Writes the item at the cursor as [`RawLossless`] serializes it, compact, and moves past
/// it; `None` where the bytes break an invariant validation holds.
fn write_next<'a>(c: &mut Cursor<'a>, out: &mut Vec<u8>) -> Option<()> {
    let at = c.clone();
    if let Some((key, len)) = c.seen_key_spanning() {
        // A key validation kept, written from its fields when they are in their canonical
        // forms; any other form needs its `$enc`, which the general walk writes.
        if at
            .rest()
            .get(..len)
            .is_some_and(|bytes| canonical_key(&key, bytes))
        {
            return write_key(out, key.chunk_hash, |i, out| {
                match i {
                    0 => write_str(out, key.model_name),
                    1 => write_int(out, key.kv_rank),
                    _ => write_int(out, key.object_group_id),
                }
                Some(())
            });
        }
        *c = at;
    }
    if let Some(key) = c.key_parts() {
        let fields = [key.name, key.rank, key.group];
        return write_key(out, key.hash, |i, out| {
            write_next(&mut Cursor::new(fields[i]), out)
        });
    }
    let (shape, payload) = c.shape()?;
    if let Some(form) = shape.form {
        out.extend_from_slice(b"{\"$enc\":");
        write_str(out, &form_name(kind_name(shape.kind), form));
        out.extend_from_slice(b",\"v\":");
    }
    match shape.kind {
        Kind::Nil => out.extend_from_slice(b"null"),
        Kind::Bool if shape.n == 1 => out.extend_from_slice(b"true"),
        Kind::Bool => out.extend_from_slice(b"false"),
        Kind::Int => match (u64::try_from(shape.n), i64::try_from(shape.n)) {
            (Ok(u), _) => write_int(out, u),
            (_, Ok(i)) => write_int(out, i),
            _ => return None,
        },
        Kind::Float => {
            let (annotation, x) = match shape.float? {
                (x, false) if x.is_finite() => return write_float(out, x),
                (x, false) => ("{\"$f64\":", x),
                (x, true) => ("{\"$f32\":", x as f32 as f64),
            };
            out.extend_from_slice(annotation.as_bytes());
            if x.is_finite() {
                write_float(out, x)?;
            } else {
                write_str(out, float_name(x));
            }
            out.push(b'}');
        }
        Kind::Str => write_str(out, text(payload)?),
        Kind::Bin => {
            out.extend_from_slice(b"{\"$bin_hex\":");
            write_hex(out, payload);
            out.push(b'}');
        }
        Kind::Ext => {
            out.extend_from_slice(b"{\"$ext\":[");
            write_int(out, shape.ext_type);
            out.push(b',');
            write_hex(out, shape.ext_data);
            out.extend_from_slice(b"]}");
        }
        Kind::Array => {
            out.push(b'[');
            for i in 0..shape.n {
                if i > 0 {
                    out.push(b',');
                }
                write_next(c, out)?;
            }
            out.push(b']');
        }
        Kind::Map => write_map(c, shape.n, out)?,
    }
    if shape.form.is_some() {
        out.push(b'}');
    }
    Some(())
}

/// A key in LMCache's shape as [`serialize_key`] writes it: its tag, its hash, and its name,
/// rank and group as `field` writes each (0, 1, 2).
fn write_key(
    out: &mut Vec<u8>,
    hash: &[u8],
    mut field: impl FnMut(usize, &mut Vec<u8>) -> Option<()>,
) -> Option<()> {
    out.extend_from_slice(b"{\"__t__\":");
    write_str(out, TAG_OBJECT_KEY);
    out.extend_from_slice(b",\"v\":{\"chunk_hash\":{\"$bin_hex\":");
    write_hex(out, hash);
    let names: [&[u8]; 3] = [
        b"},\"model_name\":",
        b",\"kv_rank\":",
        b",\"object_group_id\":",
    ];
    for (i, name) in names.into_iter().enumerate() {
        out.extend_from_slice(name);
        field(i, out)?;
    }
    out.extend_from_slice(b"}}");
    Some(())
}

/// The `n` entries of the map whose first key is at the cursor: a plain object while every
/// key is a plain string, the first not starting with `$`, none repeated; at the first key
/// that is not, the text is cut back and the map written again as `$map` pairs.
fn write_map<'a>(c: &mut Cursor<'a>, n: i128, out: &mut Vec<u8>) -> Option<()> {
    let (start, mark) = (c.clone(), out.len());
    let mut names = Names::default();
    out.push(b'{');
    for i in 0..n {
        let mut probe = c.clone();
        let name = match probe.shape() {
            Some((shape, payload)) if shape.kind == Kind::Str && shape.form.is_none() => {
                text(payload)
            }
            _ => None,
        };
        match name {
            Some(name) if !(i == 0 && name.starts_with('$')) && names.first_time(name) => {
                *c = probe;
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, name);
                out.push(b':');
                write_next(c, out)?;
            }
            _ => {
                out.truncate(mark);
                *c = start;
                out.extend_from_slice(b"{\"$map\":[");
                for i in 0..n {
                    out.extend_from_slice(if i > 0 { b",[" } else { b"[" });
                    write_next(c, out)?;
                    out.push(b',');
                    write_next(c, out)?;
                    out.push(b']');
                }
                out.extend_from_slice(b"]}");
                return Some(());
            }
        }
    }
    out.push(b'}');
    Some(())
}

/// Whether `bytes`, a key validation kept, hold its name and ints in their canonical forms.
/// Every other form of a field is longer than the canonical one, or as long and signed where
/// the value is not negative (an i16, i32 or i64 of a value that a u16, u32 or u64 holds), so
/// the length and the markers of the two ints tell.
fn canonical_key(key: &ObjectKeyRef<'_>, bytes: &[u8]) -> bool {
    let len = |n: i64| match canonical_int_form(n.into()) {
        Form::Fix => 1,
        Form::U8 | Form::I8 => 2,
        Form::U16 | Form::I16 => 3,
        Form::U32 | Form::I32 => 5,
        _ => 9,
    };
    let unsigned = |at: usize, n: i64| n < 0 || !matches!(bytes.get(at), Some(0xd0..=0xd3));
    let name = key.model_name.len();
    let rank = KEY_HEAD.len()
        + 2
        + key.chunk_hash.len()
        + KEY_MODEL.len()
        + if name < 32 { 1 } else { 2 }
        + name
        + KEY_RANK.len();
    let group = rank + len(key.kv_rank) + KEY_GROUP.len();
    group + len(key.object_group_id) == bytes.len()
        && unsigned(rank, key.kv_rank)
        && unsigned(group, key.object_group_id)
}

/// A finite float as serde_json writes it.
fn write_float(out: &mut Vec<u8>, x: f64) -> Option<()> {
    serde_json::to_writer(out, &x).ok()
}

/// The kind's name in a form annotation.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Int => "int",
        Kind::Str => "str",
        Kind::Bin => "bin",
        Kind::Array => "array",
        Kind::Map => "map",
        _ => "ext",
    }
}

/// [`plain_object_ok`] of the map's bytes: every key a string of the canonical form, the
/// first not starting with `$`, no two equal.
fn plain_object_raw(v: &RawLossless<'_>) -> bool {
    let mut names = Names::default();
    for (i, (k, _)) in v.entries().enumerate() {
        let (Some(key), Some(shape)) = (k.as_str(), k.shape()) else {
            return false;
        };
        if shape.form.is_some() || (i == 0 && key.starts_with('$')) || !names.first_time(key) {
            return false;
        }
    }
    true
}

struct RawItems<'a, 'b>(&'b RawLossless<'a>);

impl Serialize for RawItems<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.items())
    }
}

struct RawFields<'a, 'b>(&'b RawLossless<'a>);

impl Serialize for RawFields<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(
            self.0
                .entries()
                .map(|(k, v)| (k.as_str().unwrap_or_default(), v)),
        )
    }
}

struct RawPairs<'a, 'b>(&'b RawLossless<'a>);

impl Serialize for RawPairs<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pairs = self.0.entries().map(|(k, v)| (self.0.inner(k), v));
        s.collect_seq(pairs)
    }
}

/// How a non-finite float is named in an annotation.
fn float_name(x: f64) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// An integer as the JSON number the tree holds: unsigned when not negative.
struct Int(i128);

impl Serialize for Int {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (u64::try_from(self.0), i64::try_from(self.0)) {
            (Ok(u), _) => s.serialize_u64(u),
            (_, Ok(i)) => s.serialize_i64(i),
            // No msgpack integer is outside both.
            _ => s.serialize_unit(),
        }
    }
}

/// `{"$enc": form, "v": value}` for a non-canonical width, else the value itself.
struct Formed<'a, T: ?Sized>(&'static str, Option<Form>, &'a T);

impl<T: Serialize + ?Sized> Serialize for Formed<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Formed(kind, form, value) = *self;
        match form {
            None => value.serialize(s),
            Some(f) => {
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry("$enc", &form_name(kind, f))?;
                map.serialize_entry("v", value)?;
                map.end()
            }
        }
    }
}

/// A one-key annotation object.
struct Annotated<'a, T: ?Sized>(&'static str, &'a T);

impl<T: Serialize + ?Sized> Serialize for Annotated<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(self.0, self.1)?;
        map.end()
    }
}

struct Items<'a>(&'a [Value]);

impl Serialize for Items<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Lossless))
    }
}

/// A map whose keys are distinct plain strings, as a JSON object.
struct Fields<'a>(&'a [(Value, Value)]);

impl Serialize for Fields<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(
            self.0
                .iter()
                .map(|(k, v)| (k.as_str().unwrap_or_default(), Lossless(v))),
        )
    }
}

/// Any other map, as `[key, value]` pairs.
struct Pairs<'a>(&'a [(Value, Value)]);

impl Serialize for Pairs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(k, v)| (Lossless(k), Lossless(v))))
    }
}

fn float_from(j: &Json) -> Result<f64, String> {
    match j {
        Json::Number(n) => n.as_f64().ok_or_else(|| "not a number".into()),
        Json::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            _ => Err(format!("unknown float name {s:?}")),
        },
        _ => Err("expected a number".into()),
    }
}

fn hex_from(j: &Json, what: &str) -> Result<Vec<u8>, String> {
    let s = j
        .as_str()
        .ok_or_else(|| format!("{what}: expected a hex string"))?;
    hex::decode(s).map_err(|e| format!("{what}: {e}"))
}

/// Reads the lossless JSON form back. The error says what is wrong and where (a JSON path).
pub fn from_lossless(j: &Json) -> Result<Value, String> {
    from_lossless_at(j, &Path::Root)
}

/// Where a value sits in a line, written out only for an error: a path string built for
/// every item was a fifth of reading lossless JSON back.
enum Path<'a> {
    Root,
    Index(&'a Path<'a>, usize),
    Field(&'a Path<'a>, &'a str),
    Pair(&'a Path<'a>, usize, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => write!(f, "$"),
            Path::Index(up, i) => write!(f, "{up}[{i}]"),
            Path::Field(up, name) => write!(f, "{up}.{name}"),
            Path::Pair(up, i, side) => write!(f, "{up}.$map[{i}][{side}]"),
        }
    }
}

fn from_lossless_at(j: &Json, path: &Path<'_>) -> Result<Value, String> {
    let at = |msg: String| format!("{path}: {msg}");
    Ok(match j {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::Int(u as i128, None)
            } else if let Some(i) = n.as_i64() {
                Value::Int(i as i128, None)
            } else {
                Value::F64(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::str(s.clone()),
        Json::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| from_lossless_at(item, &Path::Index(path, i)))
                .collect::<Result<_, _>>()?,
            None,
        ),
        Json::Object(m) => {
            let first = m.keys().next().map(String::as_str).unwrap_or("");
            if !first.starts_with('$') {
                let entries = m
                    .iter()
                    .map(|(k, v)| {
                        Ok((
                            Value::str(k.clone()),
                            from_lossless_at(v, &Path::Field(path, k))?,
                        ))
                    })
                    .collect::<Result<_, String>>()?;
                return Ok(Value::Map(entries, None));
            }
            let payload = &m[first];
            match first {
                "$bin_hex" => Value::bin(hex_from(payload, "$bin_hex").map_err(at)?),
                "$f64" => Value::F64(float_from(payload).map_err(at)?),
                "$f32" => Value::F32(float_from(payload).map_err(at)? as f32),
                "$map" => {
                    let pairs = payload
                        .as_array()
                        .ok_or_else(|| at("$map: expected pairs".into()))?;
                    let mut entries = Vec::with_capacity(pairs.len());
                    for (i, pair) in pairs.iter().enumerate() {
                        match pair.as_array().map(Vec::as_slice) {
                            Some([k, v]) => entries.push((
                                from_lossless_at(k, &Path::Pair(path, i, 0))?,
                                from_lossless_at(v, &Path::Pair(path, i, 1))?,
                            )),
                            _ => return Err(at(format!("$map[{i}]: expected [key, value]"))),
                        }
                    }
                    Value::Map(entries, None)
                }
                "$ext" => match payload.as_array().map(Vec::as_slice) {
                    Some([ty, data]) => {
                        let ty = ty
                            .as_i64()
                            .and_then(|t| i8::try_from(t).ok())
                            .ok_or_else(|| at("$ext: type must be -128..127".into()))?;
                        Value::Ext(ty, hex_from(data, "$ext").map_err(at)?, None)
                    }
                    _ => return Err(at("$ext: expected [type, hex]".into())),
                },
                "$enc" => {
                    let name = payload.as_str().unwrap_or_default();
                    let (kind, form) =
                        parse_form(name).ok_or_else(|| at(format!("unknown $enc {name:?}")))?;
                    let inner = m.get("v").ok_or_else(|| at("$enc without \"v\"".into()))?;
                    let mut v = from_lossless_at(inner, path)?;
                    let slot = match (&mut v, kind) {
                        (Value::Int(_, f), "int")
                        | (Value::Str(_, f), "str")
                        | (Value::Bin(_, f), "bin")
                        | (Value::Array(_, f), "array")
                        | (Value::Map(_, f), "map")
                        | (Value::Ext(_, _, f), "ext") => f,
                        _ => return Err(at(format!("$enc {name:?} does not fit the value"))),
                    };
                    *slot = Some(form);
                    v
                }
                other => return Err(at(format!("unknown annotation {other:?}"))),
            }
        }
    })
}

/// Encodes one line of lossless JSON straight into msgpack: the bytes [`encode`] of
/// [`from_lossless`] of its tree would be, without either tree, for the plain objects, lists,
/// strings, numbers and `$bin_hex` annotations LMCache's frames are made of. `None`, with
/// nothing appended, for anything else (another annotation, an object with a repeated key,
/// a key with escapes, lists and objects nested deeper than `max_depth`, text that is not
/// JSON): the caller then takes the trees, which read every line and word each error.
/// Reading a `.jsonl` back, the trees' allocations were a third of the time.
///
/// [`encode`]: crate::msgpack::encode
pub fn encode_lossless(text: &str, max_depth: usize, out: &mut Vec<u8>) -> Option<()> {
    use serde::de::DeserializeSeed;
    let mark = out.len();
    let mut parser = serde_json::Deserializer::from_str(text);
    parser.disable_recursion_limit();
    let emit = Emit {
        out,
        depth_left: max_depth,
    };
    let encoded = emit.deserialize(&mut parser).is_ok() && parser.end().is_ok();
    if !encoded {
        out.truncate(mark);
        return None;
    }
    Some(())
}

/// The serde visitor of [`encode_lossless`]: each value it is handed, appended as msgpack.
/// Any error is only a way out: the caller's trees read the line again.
struct Emit<'o> {
    out: &'o mut Vec<u8>,
    /// Lists and objects that may still open inside this value: the parser recurses only
    /// as deep as the visitor asks it to, so this bounds the stack.
    depth_left: usize,
}

impl Emit<'_> {
    /// Reserves a list's or object's one-byte head and returns where it is; `None` past the
    /// depth limit.
    fn open(&mut self) -> Option<usize> {
        (self.depth_left > 0).then(|| {
            self.out.push(0);
            self.out.len() - 1
        })
    }

    /// The visitor of a list's or object's items.
    fn inner(&mut self) -> Emit<'_> {
        Emit {
            out: self.out,
            depth_left: self.depth_left - 1,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Emit<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Emit<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lossless JSON")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        put_nil(self.out);
        Ok(())
    }

    fn visit_bool<E>(self, b: bool) -> Result<(), E> {
        put_bool(self.out, b);
        Ok(())
    }

    fn visit_u64<E>(self, n: u64) -> Result<(), E> {
        put_int_form(self.out, n.into(), None);
        Ok(())
    }

    fn visit_i64<E>(self, n: i64) -> Result<(), E> {
        put_int_form(self.out, n.into(), None);
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<(), E> {
        // The tree holds no number for a non-finite float: its rules, not these.
        if !x.is_finite() {
            return Err(E::custom("not finite"));
        }
        put_f64(self.out, x);
        Ok(())
    }

    fn visit_str<E>(self, text: &str) -> Result<(), E> {
        put_str_form(self.out, text, None);
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut items: A) -> Result<(), A::Error> {
        use serde::de::Error;
        let start = self.open().ok_or_else(|| A::Error::custom("too deep"))?;
        let mut n = 0;
        while items.next_element_seed(self.inner())?.is_some() {
            n += 1;
        }
        put_head(self.out, start, n, 0x90, put_array_len_form);
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut entries: A) -> Result<(), A::Error> {
        use serde::de::Error;
        let start = self.open().ok_or_else(|| A::Error::custom("too deep"))?;
        let mut names = Names::default();
        let mut n = 0;
        while let Some(name) = entries.next_key::<&'de str>()? {
            if n == 0 && name.starts_with('$') {
                self.out.truncate(start);
                return bin_hex(name, entries, self.out);
            }
            if !names.first_time(name) {
                return Err(A::Error::custom("a repeated key"));
            }
            put_str_form(self.out, name, None);
            entries.next_value_seed(self.inner())?;
            n += 1;
        }
        put_head(self.out, start, n, 0x80, put_map_len_form);
        Ok(())
    }
}

/// The one-byte head reserved at `start` for `n` items: in place when the fix form (`fix`
/// and the count) holds them, else widened.
fn put_head(
    out: &mut Vec<u8>,
    start: usize,
    n: usize,
    fix: u8,
    put: fn(&mut Vec<u8>, usize, Option<Form>),
) {
    if n < 16 {
        out[start] = fix | n as u8;
        return;
    }
    let mut head = Vec::with_capacity(5);
    put(&mut head, n, None);
    out.splice(start..start + 1, head);
}

/// `{"$bin_hex": HEX}` alone, the annotation the lines of LMCache's frames hold (a chunk hash
/// in every key), as its bin; the name already taken is `name`.
fn bin_hex<'de, A: serde::de::MapAccess<'de>>(
    name: &str,
    mut entries: A,
    out: &mut Vec<u8>,
) -> Result<(), A::Error> {
    use serde::de::Error;
    if name != "$bin_hex" {
        return Err(A::Error::custom("another annotation"));
    }
    let hex: &'de str = entries.next_value()?;
    if entries.next_key::<&'de str>()?.is_some() || hex.len() % 2 == 1 {
        return Err(A::Error::custom("not the annotation alone"));
    }
    let len = hex.len() / 2;
    if u32::try_from(len).is_err() {
        return Err(A::Error::custom("too long"));
    }
    put_bin_head(out, len, None);
    let at = out.len();
    out.resize(at + len, 0);
    unhex_into(hex.as_bytes(), &mut out[at..]).ok_or_else(|| A::Error::custom("not hex"))
}

/// Decodes hex digits of either case into `into`, half as long, from a table of every
/// byte's value; `None` where a byte is not a digit. The `hex` crate's decoding, a byte's
/// digits checked one by one, was a sixth of reading a `.jsonl` back.
fn unhex_into(hex: &[u8], into: &mut [u8]) -> Option<()> {
    const VALUES: [u8; 256] = {
        let mut values = [0xff; 256];
        let mut i = 0;
        while i < 16 {
            values[b"0123456789abcdef"[i] as usize] = i as u8;
            values[b"0123456789ABCDEF"[i] as usize] = i as u8;
            i += 1;
        }
        values
    };
    let mut bad = 0;
    for (byte, pair) in into.iter_mut().zip(hex.chunks_exact(2)) {
        let (high, low) = (VALUES[usize::from(pair[0])], VALUES[usize::from(pair[1])]);
        // A digit's value is below 16; a non-digit's sets the high bit.
        bad |= high | low;
        *byte = high << 4 | low;
    }
    (bad < 16).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's frame written from its bytes, stepping over the keys its validation kept,
    /// is the text of its value tree, for every variant of the keyed record (a key in wider
    /// forms than needed among them).
    #[test]
    fn records_from_their_bytes_are_the_text_of_their_tree() {
        use crate::frame::{keyed_record, RecordSpans};
        let (body, variants) = keyed_record();
        let mut written = 0;
        for bytes in &variants {
            let mut seen = Vec::new();
            let Ok(spans) = RecordSpans::parse_noting(bytes, &mut seen) else {
                continue;
            };
            let record = RecordRef::from_spans(0, bytes, &spans).noting(&seen);
            let Some(raw) = RawLossless::record(&record) else {
                continue;
            };
            let tree = to_lossless(&RawValue::parse(bytes).expect("a record").to_value());
            assert_eq!(
                serde_json::to_string(&raw).expect("text"),
                serde_json::to_string(&tree).expect("text"),
            );
            assert_eq!(
                serde_json::to_string_pretty(&raw).expect("text"),
                serde_json::to_string_pretty(&tree).expect("text"),
            );
            assert_eq!(compact(&raw), serde_json::to_string(&tree).expect("text"));
            written += 1;
        }
        assert!(written > body.len(), "most changed records still decode");
        let text = serde_json::to_string(&RawLossless::new(RawValue::parse(&body).unwrap()));
        let text = text.unwrap();
        assert!(
            text.contains(r#""model_name":{"$enc":"str8","v":"m"},"kv_rank":{"$enc":"u16","v":5}"#),
            "{text}"
        );
    }

    /// Every annotation the tree can hold, each width form and the maps JSON cannot hold:
    /// the streamed text is the tree's.
    #[test]
    fn lossless_is_the_text_of_the_tree() {
        let s = |t: &str| Value::str(t);
        let cases = [
            Value::Int(5, Some(Form::U32)),
            Value::Int(-5, Some(Form::I64)),
            Value::Int(i64::MIN as i128, None),
            Value::Int(u64::MAX as i128, None),
            Value::F64(f64::NAN),
            Value::F64(f64::INFINITY),
            Value::F32(f32::NEG_INFINITY),
            Value::F32(0.1),
            Value::F64(-0.0),
            Value::Str("é \"\\\n".into(), Some(Form::W16)),
            Value::Bin(vec![1, 2, 0xff], Some(Form::W32)),
            Value::Bin(Vec::new(), None),
            Value::Array(vec![Value::Nil, Value::Bool(true)], Some(Form::W16)),
            Value::Array(Vec::new(), None),
            Value::Map(
                vec![(s("a"), s("x")), (s("b"), Value::Nil)],
                Some(Form::W32),
            ),
            Value::Map(vec![(s("a"), s("x")), (s("a"), s("y"))], None),
            Value::Map(vec![(s("$a"), s("x"))], None),
            Value::Map(vec![(s("a"), s("x")), (s("$b"), s("y"))], None),
            Value::Map(vec![(Value::int(1), s("x"))], None),
            Value::Map(vec![(Value::Str("k".into(), Some(Form::W8)), s("x"))], None),
            Value::Map(Vec::new(), None),
            Value::Ext(-3, vec![9, 8], Some(Form::W8)),
            Value::Ext(7, Vec::new(), None),
        ];
        for case in &cases {
            let tree = serde_json::to_string(&to_lossless(case)).expect("text");
            assert_eq!(
                serde_json::to_string(&Lossless(case)).expect("text"),
                tree,
                "{case:?}"
            );
            let bytes = crate::msgpack::encode_to_vec(case);
            let raw = RawValue::parse(&bytes).expect("own encoding");
            assert_eq!(
                serde_json::to_string(&RawLossless::new(raw)).expect("text"),
                serde_json::to_string(&to_lossless(&raw.to_value())).expect("text"),
                "{case:?} from its bytes"
            );
            assert_eq!(compact(&RawLossless::new(raw)), tree, "{case:?}, compact");
        }
    }

    /// What reading a line back through the trees gives: its frame's bytes, or `None` where
    /// the line is not lossless JSON of one.
    fn through_trees(line: &str) -> Option<Vec<u8>> {
        let json: Json = serde_json::from_str(line).ok()?;
        Some(crate::msgpack::encode_to_vec(&from_lossless(&json).ok()?))
    }

    /// The direct encoder gives the trees' bytes for every line it takes, and takes the
    /// shapes LMCache's frames are made of; the rest it leaves to the trees.
    #[test]
    fn lines_encode_straight_to_the_trees_bytes() {
        use crate::frame::{encode_record_head, key_of_every_form, variants};
        let direct = |line: &str| {
            let mut out = vec![7];
            let taken = encode_lossless(line, 64, &mut out).map(|()| out[1..].to_vec());
            if taken.is_none() {
                assert_eq!(out, [7], "{line}: nothing appended when it is left");
            }
            taken
        };
        let taken = [
            r#"{"a":[1,-1,0,-0,1.5,-2.25e-7,18446744073709551615,18446744073709551616],"b":null}"#,
            r#"[true,false,"x","é \" \\ \n \u0001",{"$bin_hex":""},{"$bin_hex":"00FFab"}]"#,
            r#"{"k":{"b":1,"a":2,"$c":3},"l":[],"m":{}}"#,
            " { \"spaced\" : [ 1 , 2 ] } ",
        ];
        let left = [
            r#"{"a":1,"a":2}"#,
            r#"{"\u0061":1}"#,
            r#"{"$bin_hex":"abc"}"#,
            r#"{"$bin_hex":"zz"}"#,
            r#"{"$bin_hex":"00","v":1}"#,
            r#"{"$enc":"u8","v":5}"#,
            r#"{"$f64":"NaN"}"#,
            r#"{"$map":[[1,2]]}"#,
            r#"{"a":1} x"#,
            r#"{"a":1e400}"#,
            r#"{"a":"#,
        ];
        for line in taken {
            assert_eq!(direct(line), through_trees(line), "{line}");
            assert!(direct(line).is_some(), "{line} taken");
        }
        for line in left {
            assert_eq!(direct(line), None, "{line} left to the trees");
        }
        // Long lists and maps take the wider heads.
        let long = format!(
            "[{}]",
            (0..70_000)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let wide = format!(
            "{{{}}}",
            (0..20)
                .map(|i| format!("\"k{i}\":{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert!(direct(&deep(64)).is_some());
        assert_eq!(
            direct(&deep(65)),
            None,
            "deeper than the limit: left to the trees"
        );
        let sixteen = format!("[{}]", ["0"; 16].join(","));
        for line in [long, wide, sixteen] {
            assert_eq!(direct(&line), through_trees(&line));
        }
        // A record of keys in every canonical form, and every variant of it, written as
        // `convert` writes them and read back.
        let mut body = Vec::new();
        encode_record_head(&mut body, 1.0, 2.0, "StorageManager.reserve_write");
        body.extend_from_slice(&[0x81, 0xa4]);
        body.extend_from_slice(b"keys");
        body.push(0x9c);
        for i in 0..12 {
            key_of_every_form(i).encode(&mut body);
        }
        let variants = variants(&body, &[0x00, 0x80, 0xa0, 0xc4, 0xcf, 0xff]);
        let mut taken = 0;
        for bytes in &variants {
            let Ok(raw) = RawValue::parse(bytes) else {
                continue;
            };
            let line = serde_json::to_string(&RawLossless::new(raw)).expect("text");
            assert_eq!(
                through_trees(&line).as_deref(),
                Some(&bytes[..raw.bytes().len()])
            );
            if let Some(direct) = direct(&line) {
                assert_eq!(Some(direct), through_trees(&line));
                taken += 1;
            }
        }
        assert!(taken > 1000, "{taken} of {} variants taken", variants.len());
        let line = serde_json::to_string(&RawLossless::new(RawValue::parse(&body).unwrap()));
        assert!(
            direct(&line.unwrap()).is_some(),
            "the record itself is taken"
        );
    }

    fn compact(v: &RawLossless<'_>) -> String {
        let mut out = Vec::new();
        v.write_compact(&mut out);
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// Keys in LMCache's shape whose name, rank or group takes each wider form than it
    /// needs, one field at a time, among keys in the canonical forms: a key validation kept
    /// is written from its fields only where its bytes are canonical, and every other key
    /// keeps each field's `$enc`.
    #[test]
    fn compact_keys_keep_every_form() {
        use crate::codec::{KEY_GROUP, KEY_HEAD, KEY_MODEL, KEY_RANK};
        use crate::frame::{encode_record_head, RecordSpans};
        let long = [&[0xd9, 40][..], &[b'x'; 40]].concat();
        let names = [b"\xa1m".to_vec(), b"\xd9\x01m".to_vec(), long];
        let ints: [&[u8]; 15] = [
            &[0x05],
            &[0xcc, 5],
            &[0xcd, 0, 5],
            &[0xce, 0, 0, 0, 5],
            &[0xcf, 0, 0, 0, 0, 0, 0, 0, 5],
            &[0xce, 1, 0, 1, 0],
            // As long as the canonical u16, u32 and u64, and signed.
            &[0xd1, 0x01, 0x2c],
            &[0xd2, 0, 1, 0x11, 0x70],
            &[0xd3, 0, 0, 1, 0, 0, 0, 0, 0],
            &[0xd0, 0x9c],
            &[0xd1, 0xff, 0x9c],
            &[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x9c],
            &[0xff],
            &[0xd0, 0xff],
            &[0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0],
        ];
        let key = |name: &[u8], rank: &[u8], group: &[u8]| {
            [KEY_HEAD, &[0xc4, 32][..], &[7; 32], KEY_MODEL, name]
                .into_iter()
                .chain([KEY_RANK, rank, KEY_GROUP, group])
                .collect::<Vec<&[u8]>>()
                .concat()
        };
        let mut keys: Vec<Vec<u8>> = names
            .iter()
            .flat_map(|name| ints.iter().map(|rank| key(name, rank, &[0])))
            .collect();
        keys.extend(ints.iter().map(|group| key(b"\xa1m", &[1], group)));
        let mut body = Vec::new();
        encode_record_head(&mut body, 1.0, 2.0, "StorageManager.reserve_write");
        body.extend_from_slice(&[0x81, 0xa4]);
        body.extend_from_slice(b"keys");
        body.extend_from_slice(&[0xdc, 0, keys.len() as u8]);
        body.extend(keys.concat());
        let mut seen = Vec::new();
        let spans = RecordSpans::parse_noting(&body, &mut seen).expect("a record");
        assert!(
            seen.len() > names.len(),
            "validation keeps the keys it can read"
        );
        let record = RecordRef::from_spans(0, &body, &spans).noting(&seen);
        let text = compact(&RawLossless::record(&record).expect("a record"));
        let tree = to_lossless(&RawValue::parse(&body).expect("a record").to_value());
        assert_eq!(text, serde_json::to_string(&tree).expect("text"));
        for wide in [
            r#""model_name":{"$enc":"str8","v":"m"},"kv_rank":5,"#,
            r#""kv_rank":{"$enc":"u64","v":5},"#,
            r#""kv_rank":{"$enc":"i16","v":-100},"#,
            r#""object_group_id":{"$enc":"i8","v":-1}}"#,
            r#""kv_rank":16777472,"#,
            r#""kv_rank":{"$enc":"i16","v":300},"#,
            r#""kv_rank":{"$enc":"i32","v":70000},"#,
            r#""kv_rank":{"$enc":"i64","v":1099511627776},"#,
            r#""object_group_id":9223372036854775808}"#,
        ] {
            assert!(text.contains(wide), "{wide} in {text}");
        }
    }
}
