//! The owned msgpack value tree used for `args` and whole frames.
//!
//! LMCache encodes with msgspec, which always picks the smallest msgpack form. Files from other
//! writers may not, so every value remembers the form it was read with whenever that form is not
//! the canonical one; re-encoding then reproduces the input byte for byte, while values built by
//! kvtrace itself are canonical, exactly as LMCache 0.5.6 writes them.

/// A msgpack format family. Kept on a [`Value`] only when it differs from the canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// positive or negative fixint, fixstr, fixarray, fixmap or fixext
    Fix,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    /// str8, bin8 or ext8
    W8,
    /// str16, bin16, array16, map16 or ext16
    W16,
    /// str32, bin32, array32, map32 or ext32
    W32,
}

/// A decoded msgpack value. Maps are ordered lists of pairs: LMCache's frames depend on key order.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Every msgpack integer fits: u64 and i64 both embed in i128.
    Int(i128, Option<Form>),
    F32(f32),
    F64(f64),
    Str(String, Option<Form>),
    Bin(Vec<u8>, Option<Form>),
    Array(Vec<Value>, Option<Form>),
    Map(Vec<(Value, Value)>, Option<Form>),
    Ext(i8, Vec<u8>, Option<Form>),
}

impl Value {
    pub fn int(v: impl Into<i128>) -> Value {
        Value::Int(v.into(), None)
    }

    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into(), None)
    }

    pub fn bin(b: impl Into<Vec<u8>>) -> Value {
        Value::Bin(b.into(), None)
    }

    pub fn array(items: Vec<Value>) -> Value {
        Value::Array(items, None)
    }

    /// A map with string keys, in the given order.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::str(k), v))
                .collect(),
            None,
        )
    }

    /// A codec-tagged value `{"__t__": tag, "v": payload}` (format spec §6).
    pub fn tagged(tag: &str, payload: Value) -> Value {
        Value::map([("__t__", Value::str(tag)), ("v", payload)])
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s, _) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(v, _) => i64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// Numbers as f64: LMCache's decoder accepts ints where floats are declared.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(v, _) => Some(*v as f64),
            Value::F32(v) => Some(*v as f64),
            Value::F64(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Map(m, _) => Some(m),
            _ => None,
        }
    }

    pub fn as_map_mut(&mut self) -> Option<&mut Vec<(Value, Value)>> {
        match self {
            Value::Map(m, _) => Some(m),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a, _) => Some(a),
            _ => None,
        }
    }

    /// The first value stored under string key `key` of a map.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.as_map_mut()?
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// Removes and returns the first entry under `key`, keeping the order of the others.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let map = self.as_map_mut()?;
        let index = map.iter().position(|(k, _)| k.as_str() == Some(key))?;
        Some(map.remove(index).1)
    }

    /// The tag and payload of a codec-tagged value.
    pub fn as_tagged(&self) -> Option<(&str, &Value)> {
        match self.as_map()? {
            [(k1, tag), (k2, payload)]
                if k1.as_str() == Some("__t__") && k2.as_str() == Some("v") =>
            {
                Some((tag.as_str()?, payload))
            }
            _ => None,
        }
    }

    /// Mutable payload of a codec-tagged value with tag `tag`.
    pub fn tagged_payload_mut(&mut self, tag: &str) -> Option<&mut Value> {
        if self.as_tagged()?.0 != tag {
            return None;
        }
        self.get_mut("v")
    }
}
