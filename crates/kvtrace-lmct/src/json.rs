//! The lossless JSON view of msgpack values (format spec §9), the one `convert` writes to
//! `.jsonl`: plain JSON wherever that is exact, and a one-key `$…` annotation object wherever
//! it is not (bin, non-canonical widths, float32, non-finite floats, maps JSON cannot hold,
//! ext). Converting back gives the same bytes. The display view `dump` prints is in
//! [`super::display`].

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Number, Value as Json};

use super::codec::TAG_OBJECT_KEY;
use super::display::{Hex, Names};
use super::msgpack::view::{key_parts, KeyParts, SeenKey};
use super::msgpack::{Kind, RawValue};
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
    from_lossless_at(j, "$")
}

fn from_lossless_at(j: &Json, path: &str) -> Result<Value, String> {
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
                .map(|(i, item)| from_lossless_at(item, &format!("{path}[{i}]")))
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
                            from_lossless_at(v, &format!("{path}.{k}"))?,
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
                                from_lossless_at(k, &format!("{path}.$map[{i}][0]"))?,
                                from_lossless_at(v, &format!("{path}.$map[{i}][1]"))?,
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
        }
    }
}
