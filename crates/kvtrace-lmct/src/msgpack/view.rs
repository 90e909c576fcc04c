//! The validating zero-copy reader: [`RawValue`] over one item's bytes, and [`Cursor`] for
//! walking maps and arrays without building a tree.

use rmp::Marker;

use super::write::{canonical_int_form, canonical_len_form};
use super::{MsgpackError, MAX_DEPTH, MAX_ITEMS};
use crate::codec::{ObjectKeyRef, KEY_GROUP, KEY_HEAD, KEY_MODEL, KEY_RANK};
use crate::value::{Form, Value};

/// What kind of item a [`RawValue`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

/// The parsed head of one item: its kind, form, scalar value or length, and where its
/// payload starts.
#[derive(Clone, Copy, Debug)]
struct Head {
    kind: Kind,
    form: Form,
    /// For ints the value, for bool 0/1, for str/bin/ext the byte length, for array/map the
    /// element count.
    n: i128,
    /// For floats: the bits and whether it is f32.
    float: Option<(f64, bool)>,
    ext_type: i8,
    /// Offset of the first payload byte (after the marker and length fields).
    data: usize,
}

fn be(bytes: &[u8], at: usize, width: usize) -> Option<u64> {
    let slice = bytes.get(at..at.checked_add(width)?)?;
    // The widths msgpack has, each one load; the fold is the general case.
    Some(match width {
        1 => slice[0] as u64,
        2 => u16::from_be_bytes(slice.try_into().ok()?) as u64,
        4 => u32::from_be_bytes(slice.try_into().ok()?) as u64,
        8 => u64::from_be_bytes(slice.try_into().ok()?),
        _ => slice.iter().fold(0u64, |acc, b| (acc << 8) | *b as u64),
    })
}

fn head(bytes: &[u8], at: usize) -> Result<Head, MsgpackError> {
    let err = |what| MsgpackError { at, what };
    let b = *bytes.get(at).ok_or(err("unexpected end of data"))?;
    let p = at + 1;
    let mut h = Head {
        kind: Kind::Nil,
        form: Form::Fix,
        n: 0,
        float: None,
        ext_type: 0,
        data: p,
    };
    let num = |width: usize| be(bytes, p, width).ok_or(err("unexpected end of data"));
    let (kind, form, n, data) = match Marker::from_u8(b) {
        Marker::FixPos(v) => (Kind::Int, Form::Fix, v as i128, p),
        Marker::FixNeg(v) => (Kind::Int, Form::Fix, v as i128, p),
        Marker::Null => (Kind::Nil, Form::Fix, 0, p),
        Marker::True => (Kind::Bool, Form::Fix, 1, p),
        Marker::False => (Kind::Bool, Form::Fix, 0, p),
        Marker::U8 => (Kind::Int, Form::U8, num(1)? as i128, p + 1),
        Marker::U16 => (Kind::Int, Form::U16, num(2)? as i128, p + 2),
        Marker::U32 => (Kind::Int, Form::U32, num(4)? as i128, p + 4),
        Marker::U64 => (Kind::Int, Form::U64, num(8)? as i128, p + 8),
        Marker::I8 => (Kind::Int, Form::I8, num(1)? as u8 as i8 as i128, p + 1),
        Marker::I16 => (Kind::Int, Form::I16, num(2)? as u16 as i16 as i128, p + 2),
        Marker::I32 => (Kind::Int, Form::I32, num(4)? as u32 as i32 as i128, p + 4),
        Marker::I64 => (Kind::Int, Form::I64, num(8)? as i64 as i128, p + 8),
        Marker::F32 => {
            h.float = Some((f32::from_bits(num(4)? as u32) as f64, true));
            (Kind::Float, Form::Fix, 0, p + 4)
        }
        Marker::F64 => {
            h.float = Some((f64::from_bits(num(8)?), false));
            (Kind::Float, Form::Fix, 0, p + 8)
        }
        Marker::FixStr(n) => (Kind::Str, Form::Fix, n as i128, p),
        Marker::Str8 => (Kind::Str, Form::W8, num(1)? as i128, p + 1),
        Marker::Str16 => (Kind::Str, Form::W16, num(2)? as i128, p + 2),
        Marker::Str32 => (Kind::Str, Form::W32, num(4)? as i128, p + 4),
        Marker::Bin8 => (Kind::Bin, Form::W8, num(1)? as i128, p + 1),
        Marker::Bin16 => (Kind::Bin, Form::W16, num(2)? as i128, p + 2),
        Marker::Bin32 => (Kind::Bin, Form::W32, num(4)? as i128, p + 4),
        Marker::FixArray(n) => (Kind::Array, Form::Fix, n as i128, p),
        Marker::Array16 => (Kind::Array, Form::W16, num(2)? as i128, p + 2),
        Marker::Array32 => (Kind::Array, Form::W32, num(4)? as i128, p + 4),
        Marker::FixMap(n) => (Kind::Map, Form::Fix, n as i128, p),
        Marker::Map16 => (Kind::Map, Form::W16, num(2)? as i128, p + 2),
        Marker::Map32 => (Kind::Map, Form::W32, num(4)? as i128, p + 4),
        Marker::FixExt1 => (Kind::Ext, Form::Fix, 1, p),
        Marker::FixExt2 => (Kind::Ext, Form::Fix, 2, p),
        Marker::FixExt4 => (Kind::Ext, Form::Fix, 4, p),
        Marker::FixExt8 => (Kind::Ext, Form::Fix, 8, p),
        Marker::FixExt16 => (Kind::Ext, Form::Fix, 16, p),
        Marker::Ext8 => (Kind::Ext, Form::W8, num(1)? as i128, p + 1),
        Marker::Ext16 => (Kind::Ext, Form::W16, num(2)? as i128, p + 2),
        Marker::Ext32 => (Kind::Ext, Form::W32, num(4)? as i128, p + 4),
        Marker::Reserved => return Err(err("reserved marker 0xc1")),
    };
    h.kind = kind;
    h.form = form;
    h.n = n;
    h.data = data;
    if kind == Kind::Ext {
        h.ext_type = *bytes.get(data).ok_or(err("unexpected end of data"))? as i8;
        h.data = data + 1;
    }
    Ok(h)
}

fn check_str(bytes: &[u8], at: usize) -> Result<(), MsgpackError> {
    if text(bytes).is_some() {
        Ok(())
    } else {
        Err(MsgpackError {
            at,
            what: "str is not valid UTF-8",
        })
    }
}

/// One validated item head: a finished scalar, or a container with its child count.
enum Step {
    Done(usize),
    Open { children: u64, data: usize },
}

const SHORT: &str = "length runs past the end of the frame";

#[inline(always)]
fn step(bytes: &[u8], pos: usize) -> Result<Step, MsgpackError> {
    let short = MsgpackError {
        at: pos,
        what: SHORT,
    };
    let b = *bytes.get(pos).ok_or(short.clone())?;
    let fixed = |len: usize| {
        let end = pos + len;
        if end > bytes.len() {
            Err(MsgpackError {
                at: pos,
                what: SHORT,
            })
        } else {
            Ok(Step::Done(end))
        }
    };
    match b {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Ok(Step::Done(pos + 1)),
        0xa0..=0xbf => {
            let end = pos + 1 + (b & 0x1f) as usize;
            check_str(bytes.get(pos + 1..end).ok_or(short)?, pos)?;
            Ok(Step::Done(end))
        }
        0x80..=0x8f => Ok(Step::Open {
            children: 2 * (b & 0x0f) as u64,
            data: pos + 1,
        }),
        0x90..=0x9f => Ok(Step::Open {
            children: (b & 0x0f) as u64,
            data: pos + 1,
        }),
        0xcc | 0xd0 => fixed(2),
        0xcd | 0xd1 => fixed(3),
        0xce | 0xd2 | 0xca => fixed(5),
        0xcf | 0xd3 | 0xcb => fixed(9),
        0xc4 => {
            let len = *bytes.get(pos + 1).ok_or(short)? as usize;
            fixed(2 + len)
        }
        0xd9 => {
            let len = *bytes.get(pos + 1).ok_or(short.clone())? as usize;
            check_str(bytes.get(pos + 2..pos + 2 + len).ok_or(short)?, pos)?;
            Ok(Step::Done(pos + 2 + len))
        }
        _ => {
            let h = head(bytes, pos)?;
            match h.kind {
                Kind::Array => Ok(Step::Open {
                    children: h.n as u64,
                    data: h.data,
                }),
                Kind::Map => Ok(Step::Open {
                    children: 2 * h.n as u64,
                    data: h.data,
                }),
                Kind::Str | Kind::Bin | Kind::Ext => {
                    let end = h.data.checked_add(h.n as usize).ok_or(short.clone())?;
                    let payload = bytes.get(h.data..end).ok_or(short)?;
                    if h.kind == Kind::Str {
                        check_str(payload, pos)?;
                    }
                    Ok(Step::Done(end))
                }
                _ if h.data > bytes.len() => Err(short),
                _ => Ok(Step::Done(h.data)),
            }
        }
    }
}

/// Bytes as text when they are UTF-8. ASCII, which every qualname, field name and model name
/// LMCache writes is, is checked by the faster test (and is UTF-8).
pub fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).ok()
}

/// The items of one key in [`KEY_HEAD`]'s shape: the tag map, its four children, and the
/// payload map's eight.
const KEY_ITEMS: u64 = 13;

/// The end of the int at `at`, or `None` for anything else or a short one.
#[inline(always)]
fn int_end(bytes: &[u8], at: usize) -> Option<usize> {
    let end = at
        + match *bytes.get(at)? {
            0x00..=0x7f | 0xe0..=0xff => 1,
            0xcc | 0xd0 => 2,
            0xcd | 0xd1 => 3,
            0xce | 0xd2 => 5,
            0xcf | 0xd3 => 9,
            _ => return None,
        };
    (end <= bytes.len()).then_some(end)
}

/// `at` plus the length of `run` when the bytes there are exactly `run`. The length is a
/// constant, so the comparison is a few vector compares rather than a call to `memcmp`.
#[inline(always)]
fn eat<const N: usize>(bytes: &[u8], at: usize, run: &[u8; N]) -> Option<usize> {
    let here: &[u8; N] = bytes.get(at..at.checked_add(N)?)?.try_into().ok()?;
    (here == run).then_some(at + N)
}

/// A key in [`KEY_HEAD`]'s shape as [`canonical_key`] found it: its hash and model name, and
/// where its two ints start.
struct Canonical<'a> {
    hash: &'a [u8],
    name: &'a str,
    /// Where the model name's head starts.
    name_at: usize,
    rank: usize,
    group: usize,
    end: usize,
}

/// Validates a key in exactly the shape LMCache 0.5.6 writes it, the bulk of every trace: the
/// constant runs are compared whole and only the hash's length, the model name's UTF-8 and the
/// two ints are looked at. `None` for anything else, valid or not, which the general walk then
/// judges (and places any error exactly as it always has).
#[inline(always)]
fn canonical_key(bytes: &[u8], pos: usize) -> Option<Canonical<'_>> {
    let mut at = eat(bytes, pos, KEY_HEAD)?;
    if *bytes.get(at)? != 0xc4 {
        return None;
    }
    let hash_end = at + 2 + *bytes.get(at + 1)? as usize;
    let hash = bytes.get(at + 2..hash_end)?;
    at = eat(bytes, hash_end, KEY_MODEL)?;
    let name_at = at;
    let (start, len) = match *bytes.get(at)? {
        b @ 0xa0..=0xbf => (at + 1, (b & 0x1f) as usize),
        0xd9 => (at + 2, *bytes.get(at + 1)? as usize),
        _ => return None,
    };
    let name = text(bytes.get(start..start + len)?)?;
    let rank = eat(bytes, start + len, KEY_RANK)?;
    let group = eat(bytes, int_end(bytes, rank)?, KEY_GROUP)?;
    let end = int_end(bytes, group)?;
    Some(Canonical {
        hash,
        name,
        name_at,
        rank,
        group,
        end,
    })
}

/// A key the validator read in LMCache's exact shape, kept so that a reader of the same
/// frame takes it instead of reading it again: every key of a trace is otherwise walked
/// twice, once to validate it and once to read its fields, and on a gigabyte trace the keys
/// are nearly all of the bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeenKey<'a> {
    /// The address of the key's first byte: it names the key in its frame for a cursor over
    /// any item of that frame.
    at: usize,
    len: usize,
    key: ObjectKeyRef<'a>,
}

/// A key in LMCache's exact shape, in parts: its chunk hash, and its model name, rank and
/// group as items (each in whatever form it was written).
pub(crate) struct KeyParts<'a> {
    pub(crate) hash: &'a [u8],
    pub(crate) name: RawValue<'a>,
    pub(crate) rank: RawValue<'a>,
    pub(crate) group: RawValue<'a>,
}

/// `value` in parts when it is exactly one key in LMCache's shape (checked as validation
/// checks it); `None` for anything else.
pub(crate) fn key_parts(value: RawValue<'_>) -> Option<KeyParts<'_>> {
    let bytes = value.bytes;
    if bytes.first() != Some(&0x82) {
        return None;
    }
    let key = canonical_key(bytes, 0).filter(|k| k.end == bytes.len())?;
    Some(parts_of(bytes, &key))
}

/// The parts of a key [`canonical_key`] found in `bytes`.
fn parts_of<'a>(bytes: &'a [u8], key: &Canonical<'a>) -> KeyParts<'a> {
    let item = |range: std::ops::Range<usize>| RawValue {
        bytes: &bytes[range],
    };
    KeyParts {
        hash: key.hash,
        name: item(key.name_at..key.rank - KEY_RANK.len()),
        rank: item(key.rank..key.group - KEY_GROUP.len()),
        group: item(key.group..key.end),
    }
}

/// The key validation kept that starts at `value`'s first byte and spans all of it: what
/// reading `value` as a key would give. `seen` is in the order of the bytes.
pub(crate) fn seen_key_at<'a>(
    seen: &[SeenKey<'a>],
    value: RawValue<'_>,
) -> Option<ObjectKeyRef<'a>> {
    let here = value.bytes.as_ptr() as usize;
    let i = seen.binary_search_by_key(&here, |k| k.at).ok()?;
    let key = &seen[i];
    (key.len == value.bytes.len()).then_some(key.key)
}

/// The key validation kept whose first byte is at address `here`, with `seen` (in the order
/// of the bytes) moved past the keys before it.
fn kept_at<'s, 'a>(seen: &mut &'s [SeenKey<'a>], here: usize) -> Option<&'s SeenKey<'a>> {
    while let Some((first, rest)) = seen.split_first() {
        if first.at >= here {
            break;
        }
        *seen = rest;
    }
    seen.first().filter(|k| k.at == here)
}

/// What the validator does with each key it takes by [`canonical_key`].
trait KeySink<'a> {
    fn key(&mut self, bytes: &'a [u8], pos: usize, key: &Canonical<'a>);
}

/// Plain validation: keys are checked, not kept.
impl KeySink<'_> for () {
    #[inline(always)]
    fn key(&mut self, _: &[u8], _: usize, _: &Canonical<'_>) {}
}

impl<'a> KeySink<'a> for Vec<SeenKey<'a>> {
    #[inline(always)]
    fn key(&mut self, bytes: &'a [u8], pos: usize, key: &Canonical<'a>) {
        // The ints as the reader's cursor reads them: a key whose ints do not fit an i64 is
        // valid msgpack but not a key a reader takes, and is left to the reader.
        let int = |at| {
            Cursor {
                bytes,
                pos: at,
                seen: &[],
            }
            .int()
        };
        let (Some(kv_rank), Some(object_group_id)) = (int(key.rank), int(key.group)) else {
            return;
        };
        self.push(SeenKey {
            at: bytes.as_ptr() as usize + pos,
            len: key.end - pos,
            key: ObjectKeyRef {
                chunk_hash: key.hash,
                model_name: key.name,
                kv_rank,
                object_group_id,
                cache_salt: None,
            },
        });
    }
}

/// Validates `children` items starting at `pos`, nested `depth` levels deep, counting every
/// item against `budget`. `KEYS` takes LMCache's keys by [`canonical_key`] and hands them to
/// `sink`; the general walk alone (`false`) is what tests compare it with.
fn children<'a, const KEYS: bool, S: KeySink<'a>>(
    bytes: &'a [u8],
    children: u64,
    mut pos: usize,
    depth: usize,
    budget: &mut u64,
    sink: &mut S,
) -> Result<usize, MsgpackError> {
    if depth > MAX_DEPTH {
        return Err(MsgpackError {
            at: pos,
            what: "nesting deeper than 128 levels",
        });
    }
    for _ in 0..children {
        if KEYS && bytes.get(pos) == Some(&0x82) && *budget >= KEY_ITEMS && depth + 2 <= MAX_DEPTH {
            if let Some(key) = canonical_key(bytes, pos) {
                *budget -= KEY_ITEMS;
                sink.key(bytes, pos, &key);
                pos = key.end;
                continue;
            }
        }
        *budget = budget.checked_sub(1).ok_or(MsgpackError {
            at: pos,
            what: "more than 4194304 items in one value",
        })?;
        pos = match step(bytes, pos)? {
            Step::Done(end) => end,
            Step::Open { children: n, data } => {
                self::children::<KEYS, S>(bytes, n, data, depth + 1, budget, sink)?
            }
        };
    }
    Ok(pos)
}

/// Validates one item starting at `at` and returns the offset just past it: one pass, no
/// allocation. Nesting deeper than [`MAX_DEPTH`] is refused so that the recursive consumers
/// (`to_value`, display, encode) can never exhaust the stack, more than [`MAX_ITEMS`] items
/// so that they never allocate without bound, and a count larger than the bytes present fails
/// as soon as the bytes run out.
pub fn validate(bytes: &[u8], at: usize) -> Result<usize, MsgpackError> {
    let mut budget = MAX_ITEMS;
    children::<true, ()>(bytes, 1, at, 0, &mut budget, &mut ())
}

/// [`validate`], keeping every key it takes in LMCache's exact shape in `seen`, in the order
/// of the bytes, for [`Cursor::noting`].
pub(crate) fn validate_noting<'a>(
    bytes: &'a [u8],
    at: usize,
    seen: &mut Vec<SeenKey<'a>>,
) -> Result<usize, MsgpackError> {
    let mut budget = MAX_ITEMS;
    children::<true, _>(bytes, 1, at, 0, &mut budget, seen)
}

/// [`validate`] by the general walk alone, for tests of the keys' shortcut.
#[cfg(test)]
pub(crate) fn validate_general(bytes: &[u8], at: usize) -> Result<usize, MsgpackError> {
    let mut budget = MAX_ITEMS;
    children::<false, ()>(bytes, 1, at, 0, &mut budget, &mut ())
}

/// Checks only the marker and length fields of the item at `at`: `Some((entries, data))`
/// for a map, with the offset of its first key, so that callers can validate its entries one
/// by one; `None` for any other kind.
pub(crate) fn map_head(bytes: &[u8], at: usize) -> Result<Option<(usize, usize)>, MsgpackError> {
    let h = head(bytes, at)?;
    if h.data > bytes.len() {
        return Err(MsgpackError {
            at,
            what: "length runs past the end of the frame",
        });
    }
    Ok((h.kind == Kind::Map).then_some((h.n as usize, h.data)))
}

/// The end of an item inside an already validated one; `None` only on a broken invariant.
/// Each key in `seen` (what validating the frame kept, in the order of the bytes) is stepped
/// over whole rather than item by item, and `seen` moves past the keys before the end.
fn skip_trusted<'a>(bytes: &[u8], at: usize, seen: &mut &'a [SeenKey<'a>]) -> Option<usize> {
    let mut pending: u64 = 1;
    let mut pos = at;
    while pending > 0 {
        pending -= 1;
        let b = *bytes.get(pos)?;
        if b == 0x82 && !seen.is_empty() {
            if let Some(key) = kept_at(seen, bytes.as_ptr() as usize + pos) {
                pos += key.len;
                continue;
            }
        }
        pos = match b {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => pos + 1,
            0xa0..=0xbf => pos + 1 + (b & 0x1f) as usize,
            0xcc | 0xd0 => pos + 2,
            0xcd | 0xd1 => pos + 3,
            0xce | 0xd2 | 0xca => pos + 5,
            0xcf | 0xd3 | 0xcb => pos + 9,
            0xc4 | 0xd9 => pos + 2 + *bytes.get(pos + 1)? as usize,
            0x80..=0x8f => {
                pending += 2 * (b & 0x0f) as u64;
                pos + 1
            }
            0x90..=0x9f => {
                pending += (b & 0x0f) as u64;
                pos + 1
            }
            _ => {
                let h = head(bytes, pos).ok()?;
                match h.kind {
                    Kind::Array => {
                        pending += h.n as u64;
                        h.data
                    }
                    Kind::Map => {
                        pending += 2 * h.n as u64;
                        h.data
                    }
                    Kind::Str | Kind::Bin | Kind::Ext => h.data + h.n as usize,
                    _ => h.data,
                }
            }
        };
    }
    (pos <= bytes.len()).then_some(pos)
}

/// A view of exactly one validated msgpack item inside a frame body. Copying it is free; its
/// strings and bins borrow from the body.
#[derive(Clone, Copy, Debug)]
pub struct RawValue<'a> {
    bytes: &'a [u8],
}

impl<'a> RawValue<'a> {
    /// Validates that `bytes` holds exactly one msgpack item and nothing after it.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, MsgpackError> {
        let end = validate(bytes, 0)?;
        if end != bytes.len() {
            return Err(MsgpackError {
                at: end,
                what: "trailing bytes after the item",
            });
        }
        Ok(RawValue { bytes })
    }

    /// Wraps a sub-slice of an already validated item without walking it again. The slice
    /// must hold exactly one item: iteration takes a container's last element to end where
    /// the view ends.
    pub(crate) fn trusted(bytes: &'a [u8]) -> Self {
        RawValue { bytes }
    }

    /// The encoded bytes of this item.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    fn head(&self) -> Option<Head> {
        head(self.bytes, 0).ok()
    }

    pub fn kind(&self) -> Kind {
        self.head().map(|h| h.kind).unwrap_or(Kind::Nil)
    }

    pub fn as_bool(&self) -> Option<bool> {
        let h = self.head()?;
        (h.kind == Kind::Bool).then_some(h.n == 1)
    }

    pub fn as_int(&self) -> Option<i128> {
        let h = self.head()?;
        (h.kind == Kind::Int).then_some(h.n)
    }

    pub fn as_i64(&self) -> Option<i64> {
        i64::try_from(self.as_int()?).ok()
    }

    pub fn as_u64(&self) -> Option<u64> {
        u64::try_from(self.as_int()?).ok()
    }

    /// A float, or an int read as float (LMCache's decoder accepts both).
    pub fn as_f64(&self) -> Option<f64> {
        let h = self.head()?;
        match h.kind {
            Kind::Float => h.float.map(|(v, _)| v),
            Kind::Int => Some(h.n as f64),
            _ => None,
        }
    }

    fn payload(&self, kind: Kind) -> Option<&'a [u8]> {
        let h = self.head()?;
        if h.kind != kind {
            return None;
        }
        self.bytes.get(h.data..h.data.checked_add(h.n as usize)?)
    }

    /// The bytes of a str without re-checking UTF-8 (validation already did): for
    /// comparing keys on the hot path.
    pub fn str_bytes(&self) -> Option<&'a [u8]> {
        self.payload(Kind::Str)
    }

    pub fn as_str(&self) -> Option<&'a str> {
        text(self.payload(Kind::Str)?)
    }

    pub fn as_bin(&self) -> Option<&'a [u8]> {
        self.payload(Kind::Bin)
    }

    /// The elements of an array.
    pub fn array(&self) -> Option<Items<'a>> {
        let h = self.head()?;
        (h.kind == Kind::Array).then_some(Items {
            bytes: self.bytes,
            pos: h.data,
            left: h.n as usize,
            seen: &[],
        })
    }

    /// The key/value pairs of a map, in encoded order.
    pub fn map(&self) -> Option<Entries<'a>> {
        let h = self.head()?;
        (h.kind == Kind::Map).then_some(Entries {
            items: Items {
                bytes: self.bytes,
                pos: h.data,
                left: h.n as usize * 2,
                seen: &[],
            },
        })
    }

    /// Number of elements of an array or entries of a map.
    pub fn len(&self) -> usize {
        match self.head() {
            Some(h) if matches!(h.kind, Kind::Array | Kind::Map) => h.n as usize,
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first value under string key `key`, if this is a map.
    pub fn get(&self, key: &str) -> Option<RawValue<'a>> {
        self.map()?
            .find(|(k, _)| k.str_bytes() == Some(key.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Several fields of a map in one pass: `out[i]` is the first value under `names[i]`.
    /// Prefer this to repeated [`RawValue::get`] calls, each of which walks the map again.
    pub fn fields<const N: usize>(&self, names: [&str; N]) -> Option<[Option<RawValue<'a>>; N]> {
        let mut out = [None; N];
        for (k, v) in self.map()? {
            let Some(key) = k.str_bytes() else { continue };
            if let Some(i) = names.iter().position(|n| n.as_bytes() == key) {
                if out[i].is_none() {
                    out[i] = Some(v);
                }
            }
        }
        Some(out)
    }

    /// `(tag, payload)` when this is a codec-tagged value `{"__t__": tag, "v": payload}`.
    pub fn as_tagged(&self) -> Option<(&'a str, RawValue<'a>)> {
        let mut items = self.map()?.items;
        if items.left != 4 {
            return None;
        }
        // The first key before the walk past its value: a call's arguments are a map of two
        // entries too, whose first value is often a list of keys.
        if items.next()?.str_bytes()? != b"__t__" {
            return None;
        }
        let tag = items.next()?;
        if items.next()?.str_bytes()? != b"v" {
            return None;
        }
        Some((tag.as_str()?, items.next()?))
    }

    /// The payload of a value tagged `tag`.
    pub fn tagged(&self, tag: &str) -> Option<RawValue<'a>> {
        self.as_tagged()
            .filter(|(t, _)| *t == tag)
            .map(|(_, payload)| payload)
    }

    /// An owned copy that remembers every non-canonical form.
    pub fn to_value(&self) -> Value {
        let Some(shape) = self.shape() else {
            return Value::Nil;
        };
        let form = shape.form;
        match shape.kind {
            Kind::Nil => Value::Nil,
            Kind::Bool => Value::Bool(shape.n == 1),
            Kind::Int => Value::Int(shape.n, form),
            Kind::Float => match shape.float {
                Some((v, true)) => Value::F32(v as f32),
                Some((v, false)) => Value::F64(v),
                None => Value::Nil,
            },
            Kind::Str => Value::Str(self.as_str().unwrap_or_default().to_owned(), form),
            Kind::Bin => Value::Bin(self.as_bin().unwrap_or_default().to_vec(), form),
            Kind::Ext => Value::Ext(shape.ext_type, shape.ext_data.to_vec(), form),
            Kind::Array => Value::Array(
                self.array()
                    .map(|items| items.map(|v| v.to_value()).collect())
                    .unwrap_or_default(),
                form,
            ),
            Kind::Map => Value::Map(
                self.map()
                    .map(|entries| entries.map(|(k, v)| (k.to_value(), v.to_value())).collect())
                    .unwrap_or_default(),
                form,
            ),
        }
    }

    /// What [`RawValue::to_value`] keeps of the item besides its contents: its kind, its
    /// form where that is not the canonical one, its int, bool or length, its float, and an
    /// ext's type and data. `None` where the bytes hold no item.
    pub(crate) fn shape(&self) -> Option<Shape<'a>> {
        Some(shape_of(self.bytes, &self.head()?))
    }
}

/// [`RawValue::shape`] of the item whose head is `h`, in `bytes`.
#[inline(always)]
fn shape_of<'a>(bytes: &'a [u8], h: &Head) -> Shape<'a> {
    let keep = |canonical: Form| (h.form != canonical).then_some(h.form);
    let form = match h.kind {
        Kind::Nil | Kind::Bool | Kind::Float => None,
        Kind::Int => keep(canonical_int_form(h.n)),
        Kind::Str => keep(canonical_len_form(h.n as usize, 31, true)),
        Kind::Bin => keep(match canonical_len_form(h.n as usize, 0, true) {
            Form::Fix => Form::W8,
            f => f,
        }),
        // An ext of any other length, none included, has no fix form: its shortest is ext8.
        Kind::Ext => keep(match h.n {
            1 | 2 | 4 | 8 | 16 => Form::Fix,
            n => match canonical_len_form(n as usize, 0, true) {
                Form::Fix => Form::W8,
                f => f,
            },
        }),
        Kind::Array | Kind::Map => keep(canonical_len_form(h.n as usize, 15, false)),
    };
    let ext_data = match h.kind {
        Kind::Ext => bytes.get(h.data..h.data + h.n as usize).unwrap_or_default(),
        _ => &[],
    };
    Shape {
        kind: h.kind,
        form,
        n: h.n,
        float: h.float,
        ext_type: h.ext_type,
        ext_data,
    }
}

/// An item's kind and form as [`RawValue::shape`] reads them.
pub(crate) struct Shape<'a> {
    pub(crate) kind: Kind,
    /// The form, where it is not the canonical one.
    pub(crate) form: Option<Form>,
    /// For ints the value, for bool 0/1, for str/bin/ext the byte length, for array/map the
    /// element count.
    pub(crate) n: i128,
    /// For floats: the value and whether it is f32.
    pub(crate) float: Option<(f64, bool)>,
    pub(crate) ext_type: i8,
    pub(crate) ext_data: &'a [u8],
}

/// A forward reader over a validated item, for hot paths that consume fields in order
/// instead of looking them up: each byte is read once.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// The keys validation read in the frame, from the first not yet behind the cursor.
    seen: &'a [SeenKey<'a>],
}

impl<'a> Cursor<'a> {
    pub fn new(value: RawValue<'a>) -> Self {
        Cursor::noting(value, &[])
    }

    /// A cursor that takes the keys in `seen` (what validating the frame that holds `value`
    /// kept) where it meets them, instead of reading them again.
    pub(crate) fn noting(value: RawValue<'a>, seen: &'a [SeenKey<'a>]) -> Self {
        Cursor {
            bytes: value.bytes,
            pos: 0,
            seen,
        }
    }

    /// The key at the cursor, when validation kept it; the cursor moves past it. What
    /// [`ObjectKeyRef::read`] would read there: the validator took it by the same shape.
    pub(crate) fn seen_key(&mut self) -> Option<ObjectKeyRef<'a>> {
        self.seen_key_spanning().map(|(key, _)| key)
    }

    /// The bytes from the cursor on.
    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.bytes[self.pos.min(self.bytes.len())..]
    }

    /// [`Cursor::seen_key`], with the length of the key's bytes.
    pub(crate) fn seen_key_spanning(&mut self) -> Option<(ObjectKeyRef<'a>, usize)> {
        let key = kept_at(&mut self.seen, self.bytes.as_ptr() as usize + self.pos)?;
        let end = self.pos + key.len;
        (end <= self.bytes.len()).then(|| {
            self.pos = end;
            (key.key, key.len)
        })
    }

    /// The key at the cursor when the item there is exactly one in LMCache's shape
    /// ([`key_parts`] of that item); the cursor moves past it.
    pub(crate) fn key_parts(&mut self) -> Option<KeyParts<'a>> {
        if self.bytes.get(self.pos) != Some(&0x82) {
            return None;
        }
        let key = canonical_key(self.bytes, self.pos)?;
        self.pos = key.end;
        Some(parts_of(self.bytes, &key))
    }

    /// [`RawValue::shape`] of the item at the cursor, with the payload of a str, bin or ext
    /// (empty for any other kind); the cursor moves past a scalar, or to the first child of
    /// a list or map.
    #[inline]
    pub(crate) fn shape(&mut self) -> Option<(Shape<'a>, &'a [u8])> {
        let at = self.pos;
        let fix = |kind, n: u8| Head {
            kind,
            form: Form::Fix,
            n: n.into(),
            float: None,
            ext_type: 0,
            data: at + 1,
        };
        // The fix forms, which nearly every item of a trace has, built here: the general
        // parse returns its head through memory, and reading it back stalled the writer
        // (two fifths of `convert`'s walk).
        let h = match *self.bytes.get(at)? {
            b @ 0x00..=0x7f => fix(Kind::Int, b),
            b @ 0x80..=0x8f => fix(Kind::Map, b & 0x0f),
            b @ 0x90..=0x9f => fix(Kind::Array, b & 0x0f),
            b @ 0xa0..=0xbf => fix(Kind::Str, b & 0x1f),
            0xc0 => fix(Kind::Nil, 0),
            _ => head(self.bytes, at).ok()?,
        };
        let payload = match h.kind {
            Kind::Str | Kind::Bin | Kind::Ext => {
                let end = h.data.checked_add(usize::try_from(h.n).ok()?)?;
                let payload = self.bytes.get(h.data..end)?;
                self.pos = end;
                payload
            }
            _ => {
                self.pos = h.data;
                &[]
            }
        };
        Some((shape_of(self.bytes, &h), payload))
    }

    fn head(&mut self, kind: Kind) -> Option<Head> {
        let h = head(self.bytes, self.pos).ok()?;
        (h.kind == kind).then_some(h)
    }

    /// The kind of the item at the cursor, which does not move.
    pub(crate) fn kind(&self) -> Option<Kind> {
        head(self.bytes, self.pos).ok().map(|h| h.kind)
    }

    /// Entries of the map at the cursor; the cursor moves to its first key.
    pub fn map_len(&mut self) -> Option<usize> {
        // The fix forms first: every key, layout and spec LMCache writes is a small map, and
        // the general head parse costs several times more than this byte test.
        if let Some(&b @ 0x80..=0x8f) = self.bytes.get(self.pos) {
            self.pos += 1;
            return Some((b & 0x0f) as usize);
        }
        let h = self.head(Kind::Map)?;
        self.pos = h.data;
        Some(h.n as usize)
    }

    /// Elements of the array at the cursor; the cursor moves to the first one.
    pub fn array_len(&mut self) -> Option<usize> {
        if let Some(&b @ 0x90..=0x9f) = self.bytes.get(self.pos) {
            self.pos += 1;
            return Some((b & 0x0f) as usize);
        }
        let h = self.head(Kind::Array)?;
        self.pos = h.data;
        Some(h.n as usize)
    }

    fn payload(&mut self, kind: Kind) -> Option<&'a [u8]> {
        let (data, len) = match (kind, self.bytes.get(self.pos)) {
            (Kind::Str, Some(&b @ 0xa0..=0xbf)) => (self.pos + 1, (b & 0x1f) as usize),
            (Kind::Str, Some(0xd9)) | (Kind::Bin, Some(0xc4)) => {
                (self.pos + 2, *self.bytes.get(self.pos + 1)? as usize)
            }
            _ => {
                let h = self.head(kind)?;
                (h.data, h.n as usize)
            }
        };
        let end = data.checked_add(len)?;
        let out = self.bytes.get(data..end)?;
        self.pos = end;
        Some(out)
    }

    /// The raw bytes of the str at the cursor (UTF-8 was checked by validation).
    pub fn str_bytes(&mut self) -> Option<&'a [u8]> {
        self.payload(Kind::Str)
    }

    pub fn str(&mut self) -> Option<&'a str> {
        text(self.payload(Kind::Str)?)
    }

    pub fn bin(&mut self) -> Option<&'a [u8]> {
        self.payload(Kind::Bin)
    }

    pub fn int(&mut self) -> Option<i64> {
        // Fix ints and the unsigned forms up to 32 bits (LMCache's `kv_rank` is one) without
        // the general head parse.
        let width = match *self.bytes.get(self.pos)? {
            b @ (0x00..=0x7f | 0xe0..=0xff) => {
                self.pos += 1;
                return Some(b as i8 as i64);
            }
            0xcc => 1,
            0xcd => 2,
            0xce => 4,
            _ => 0,
        };
        if width > 0 {
            let v = be(self.bytes, self.pos + 1, width)?;
            self.pos += 1 + width;
            return Some(v as i64);
        }
        let h = self.head(Kind::Int)?;
        self.pos = h.data;
        i64::try_from(h.n).ok()
    }

    /// Steps over `items` when the bytes at the cursor are exactly those: a constant run of
    /// whole items (a tag and its field names) checked in one comparison. The cursor does
    /// not move otherwise.
    pub fn eat<const N: usize>(&mut self, items: &[u8; N]) -> bool {
        match eat(self.bytes, self.pos, items) {
            Some(end) => {
                self.pos = end;
                true
            }
            None => false,
        }
    }

    /// Steps over one item of any kind.
    pub fn skip(&mut self) -> Option<()> {
        self.pos = skip_trusted(self.bytes, self.pos, &mut &[][..])?;
        Some(())
    }

    /// The item at the cursor as a view; the cursor moves past it.
    pub fn value(&mut self) -> Option<RawValue<'a>> {
        let start = self.pos;
        self.skip()?;
        Some(RawValue::trusted(self.bytes.get(start..self.pos)?))
    }
}

/// Iterator over the elements of a validated array (or the flattened pairs of a map).
#[derive(Clone, Debug)]
pub struct Items<'a> {
    bytes: &'a [u8],
    pos: usize,
    left: usize,
    /// Keys validation kept, from the item at `pos` on: such an item ends where the key
    /// does, without a walk.
    seen: &'a [SeenKey<'a>],
}

impl<'a> Items<'a> {
    /// The items, taking the end of every key in `seen` (what validating the frame kept)
    /// from it rather than walking the key.
    pub(crate) fn noting(self, seen: &'a [SeenKey<'a>]) -> Self {
        Items { seen, ..self }
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = RawValue<'a>;

    fn next(&mut self) -> Option<RawValue<'a>> {
        if self.left == 0 {
            return None;
        }
        // The last element of the view's item ends where the view does: no walk needed,
        // which makes a tagged value's payload (the last entry of its map) free to reach.
        let end = if self.left == 1 {
            self.bytes.len()
        } else {
            skip_trusted(self.bytes, self.pos, &mut self.seen)?
        };
        let item = RawValue {
            bytes: self.bytes.get(self.pos..end)?,
        };
        self.pos = end;
        self.left -= 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Items<'_> {}

/// Iterator over the entries of a validated map.
#[derive(Clone, Debug)]
pub struct Entries<'a> {
    items: Items<'a>,
}

impl<'a> Entries<'a> {
    /// [`Items::noting`] for the keys and values.
    pub(crate) fn noting(self, seen: &'a [SeenKey<'a>]) -> Self {
        Entries {
            items: self.items.noting(seen),
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = (RawValue<'a>, RawValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        Some((self.items.next()?, self.items.next()?))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.items.left / 2;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Entries<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ObjectKey;

    /// An array of keys as LMCache writes them, with the int forms and name lengths the
    /// shortcut has branches for.
    fn keys() -> Vec<u8> {
        let mut out = vec![0x90 | 10];
        for i in 0..10 {
            let key = crate::frame::key_of_every_form(i);
            key.encode(&mut out);
        }
        out
    }

    #[test]
    fn the_keys_shortcut_judges_every_input_as_the_general_walk() {
        let good = keys();
        assert_eq!(validate(&good, 0), Ok(good.len()));
        assert_eq!(validate_general(&good, 0), Ok(good.len()));
        for cut in 0..good.len() {
            assert_eq!(
                validate(&good[..cut], 0),
                validate_general(&good[..cut], 0),
                "cut at {cut}"
            );
        }
        for at in 0..good.len() {
            for b in [0x00, 0x7f, 0x80, 0x82, 0xa0, 0xc1, 0xc4, 0xd9, 0xdc, 0xff] {
                let mut bad = good.clone();
                bad[at] = b;
                assert_eq!(
                    validate(&bad, 0),
                    validate_general(&bad, 0),
                    "{b:#x} at {at}"
                );
            }
        }
    }

    /// A cursor that takes the keys validation kept reads exactly what a cursor that reads
    /// every key itself does, and validation that keeps keys judges every input as plain
    /// validation: for the keys of every shape, every cut and every byte replaced.
    #[test]
    fn keys_kept_by_validation_read_as_keys_read_afresh() {
        let check = |bytes: &[u8]| -> usize {
            let mut seen = Vec::new();
            let judged = validate_noting(bytes, 0, &mut seen);
            assert_eq!(judged, validate(bytes, 0));
            if judged == Ok(bytes.len()) {
                let value = RawValue::trusted(bytes);
                let fresh = crate::codec::read_object_keys(&mut Cursor::new(value));
                let kept = crate::codec::read_object_keys(&mut Cursor::noting(value, &seen));
                assert_eq!(kept, fresh);
                // The items end where they do without the kept keys, within a list and
                // within a list that is itself stepped over.
                let ends = |v: RawValue<'_>, seen| -> Vec<(usize, usize)> {
                    let items = v.array().map(|i| i.noting(seen)).into_iter().flatten();
                    items
                        .map(|i| (i.bytes.as_ptr() as usize, i.bytes.len()))
                        .collect()
                };
                assert_eq!(ends(value, &seen), ends(value, &[]));
                let mut nested = vec![0x93, 0x01];
                nested.extend_from_slice(bytes);
                nested.push(0x02);
                let mut seen = Vec::new();
                assert_eq!(validate_noting(&nested, 0, &mut seen), Ok(nested.len()));
                let outer = RawValue::trusted(&nested);
                assert_eq!(ends(outer, &seen), ends(outer, &[]));
            }
            seen.len()
        };
        let good = keys();
        assert_eq!(check(&good), 10, "every key is kept");
        for cut in 0..good.len() {
            check(&good[..cut]);
        }
        for at in 0..good.len() {
            for b in [
                0x00, 0x7f, 0x80, 0x82, 0xa0, 0xc1, 0xc4, 0xcf, 0xd9, 0xdc, 0xff,
            ] {
                let mut bad = good.clone();
                bad[at] = b;
                check(&bad);
            }
        }
        // An unsigned int past i64's range is valid msgpack but no key's rank: not kept, and
        // read as the reader always has (not a key).
        let mut wide = vec![0x91];
        ObjectKey::single_rank(vec![1; 32], "m").encode(&mut wide);
        let rank = wide.len() - 1 - KEY_GROUP.len() - 5;
        wide.splice(rank..rank + 5, [0xcf, 0xff, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(check(&wide), 0);
    }

    #[test]
    fn the_keys_shortcut_keeps_the_item_budget_and_the_depth_limit() {
        let mut key = Vec::new();
        ObjectKey::single_rank(vec![7; 32], "m").encode(&mut key);
        // Exactly MAX_ITEMS items pass and one more fails, at the same byte on both paths.
        let per_key = KEY_ITEMS;
        let fits = (MAX_ITEMS - 1) / per_key;
        for n in [fits, fits + 1] {
            let mut array = vec![0xdd];
            array.extend_from_slice(&(n as u32).to_be_bytes());
            for _ in 0..n {
                array.extend_from_slice(&key);
            }
            assert_eq!(validate(&array, 0), validate_general(&array, 0), "{n} keys");
        }
        // A key nested at the depth limit is refused alike.
        for depth in [MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1] {
            let mut nested = vec![0x91; depth];
            nested.extend_from_slice(&key);
            assert_eq!(
                validate(&nested, 0),
                validate_general(&nested, 0),
                "{depth}"
            );
        }
    }
}
