//! msgpack encoding with msgspec's choices, and a validating zero-copy view for reading.
//!
//! Reading never trusts a length: [`RawValue::parse`] walks the whole item once, checking every
//! length against the bytes actually present, and allocates nothing. Accessors on a validated
//! view therefore cannot run off the end; they still return `Option` instead of panicking.

use rmp::Marker;

use super::value::{Form, Value};

/// Deepest nesting accepted. LMCache frames nest about 8 levels; this stops stack exhaustion
/// on hostile input.
pub const MAX_DEPTH: usize = 128;

/// Most items one validated value may hold (2^22). A decoded tree costs tens of bytes per
/// item, so this bounds what `dump`, `convert` and replay may allocate for one frame to a few
/// hundred MiB whatever the frame says; LMCache's largest calls (a key list of a 128k-token
/// prompt) hold about 10^5 items. A value over it is refused like any malformed one.
pub const MAX_ITEMS: u64 = 1 << 22;

/// Why a byte string is not exactly one well-formed msgpack item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsgpackError {
    /// Byte offset inside the item where decoding failed.
    pub at: usize,
    pub what: &'static str,
}

impl std::fmt::Display for MsgpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at body byte {}", self.what, self.at)
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding

pub fn put_nil(out: &mut Vec<u8>) {
    out.push(Marker::Null.to_u8());
}

pub fn put_bool(out: &mut Vec<u8>, v: bool) {
    out.push(if v { Marker::True } else { Marker::False }.to_u8());
}

pub fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.push(Marker::F64.to_u8());
    out.extend_from_slice(&v.to_be_bytes());
}

pub fn put_f32(out: &mut Vec<u8>, v: f32) {
    out.push(Marker::F32.to_u8());
    out.extend_from_slice(&v.to_be_bytes());
}

/// The form msgspec picks for an integer: unsigned families for non-negative values, signed
/// ones for negative values, always the smallest.
pub fn canonical_int_form(v: i128) -> Form {
    if v >= 0 {
        match v {
            0..=127 => Form::Fix,
            128..=0xff => Form::U8,
            0x100..=0xffff => Form::U16,
            0x1_0000..=0xffff_ffff => Form::U32,
            _ => Form::U64,
        }
    } else {
        match v {
            -32..=-1 => Form::Fix,
            -128..=-33 => Form::I8,
            -32768..=-129 => Form::I16,
            -2147483648..=-32769 => Form::I32,
            _ => Form::I64,
        }
    }
}

fn int_fits(v: i128, form: Form) -> bool {
    match form {
        Form::Fix => (-32..=127).contains(&v),
        Form::U8 => (0..=u8::MAX as i128).contains(&v),
        Form::U16 => (0..=u16::MAX as i128).contains(&v),
        Form::U32 => (0..=u32::MAX as i128).contains(&v),
        Form::U64 => (0..=u64::MAX as i128).contains(&v),
        Form::I8 => (i8::MIN as i128..=i8::MAX as i128).contains(&v),
        Form::I16 => (i16::MIN as i128..=i16::MAX as i128).contains(&v),
        Form::I32 => (i32::MIN as i128..=i32::MAX as i128).contains(&v),
        Form::I64 => (i64::MIN as i128..=i64::MAX as i128).contains(&v),
        Form::W8 | Form::W16 | Form::W32 => false,
    }
}

/// Writes an integer in `form` if it fits there, else in the canonical form. Values outside
/// both u64 and i64 are clamped to the nearest representable one.
pub fn put_int_form(out: &mut Vec<u8>, v: i128, form: Option<Form>) {
    let v = v.clamp(i64::MIN as i128, u64::MAX as i128);
    let form = match form {
        Some(f) if int_fits(v, f) => f,
        _ => canonical_int_form(v),
    };
    match form {
        Form::Fix => out.push(v as i8 as u8),
        Form::U8 => {
            out.push(Marker::U8.to_u8());
            out.push(v as u8);
        }
        Form::U16 => {
            out.push(Marker::U16.to_u8());
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        Form::U32 => {
            out.push(Marker::U32.to_u8());
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        Form::U64 => {
            out.push(Marker::U64.to_u8());
            out.extend_from_slice(&(v as u64).to_be_bytes());
        }
        Form::I8 => {
            out.push(Marker::I8.to_u8());
            out.push(v as i8 as u8);
        }
        Form::I16 => {
            out.push(Marker::I16.to_u8());
            out.extend_from_slice(&(v as i16).to_be_bytes());
        }
        Form::I32 => {
            out.push(Marker::I32.to_u8());
            out.extend_from_slice(&(v as i32).to_be_bytes());
        }
        Form::I64 | Form::W8 | Form::W16 | Form::W32 => {
            out.push(Marker::I64.to_u8());
            out.extend_from_slice(&(v as i64).to_be_bytes());
        }
    }
}

pub fn put_uint(out: &mut Vec<u8>, v: u64) {
    put_int_form(out, v as i128, None);
}

#[inline]
pub fn put_int(out: &mut Vec<u8>, v: i64) {
    match v {
        0..=127 => out.push(v as u8),
        0x1_0000..=0xffff_ffff => {
            out.push(Marker::U32.to_u8());
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => put_int_form(out, v as i128, None),
    }
}

/// The canonical length form of a str (fix up to 31), bin (no fix form), array or map
/// (fix up to 15).
fn canonical_len_form(len: usize, fix_max: usize, has_w8: bool) -> Form {
    if len <= fix_max {
        Form::Fix
    } else if has_w8 && len <= 0xff {
        Form::W8
    } else if len <= 0xffff {
        Form::W16
    } else {
        Form::W32
    }
}

fn len_form(len: usize, fix_max: usize, has_w8: bool, wanted: Option<Form>) -> Form {
    let fits = |f: Form| match f {
        Form::Fix => len <= fix_max,
        Form::W8 => has_w8 && len <= 0xff,
        Form::W16 => len <= 0xffff,
        Form::W32 => len <= u32::MAX as usize,
        _ => false,
    };
    match wanted {
        Some(f) if fits(f) => f,
        _ => canonical_len_form(len, fix_max, has_w8),
    }
}

fn put_len(out: &mut Vec<u8>, len: usize, form: Form, fix_base: u8, w8: u8, w16: u8, w32: u8) {
    match form {
        Form::Fix => out.push(fix_base | len as u8),
        Form::W8 => {
            out.push(w8);
            out.push(len as u8);
        }
        Form::W16 => {
            out.push(w16);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(w32);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
}

pub fn put_str_form(out: &mut Vec<u8>, s: &str, form: Option<Form>) {
    let f = len_form(s.len(), 31, true, form);
    put_len(out, s.len(), f, 0xa0, 0xd9, 0xda, 0xdb);
    out.extend_from_slice(s.as_bytes());
}

#[inline]
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    if s.len() <= 31 {
        out.push(0xa0 | s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    } else {
        put_str_form(out, s, None);
    }
}

pub fn put_bin_form(out: &mut Vec<u8>, b: &[u8], form: Option<Form>) {
    let f = len_form(b.len(), 0, true, form.filter(|f| *f != Form::Fix));
    let f = if f == Form::Fix { Form::W8 } else { f };
    put_len(out, b.len(), f, 0, 0xc4, 0xc5, 0xc6);
    out.extend_from_slice(b);
}

#[inline]
pub fn put_bin(out: &mut Vec<u8>, b: &[u8]) {
    if b.len() <= 0xff {
        out.push(0xc4);
        out.push(b.len() as u8);
        out.extend_from_slice(b);
    } else {
        put_bin_form(out, b, None);
    }
}

pub fn put_array_len_form(out: &mut Vec<u8>, len: usize, form: Option<Form>) {
    let f = len_form(len, 15, false, form);
    put_len(out, len, f, 0x90, 0, 0xdc, 0xdd);
}

#[inline]
pub fn put_array_len(out: &mut Vec<u8>, len: usize) {
    if len <= 15 {
        out.push(0x90 | len as u8);
    } else {
        put_array_len_form(out, len, None);
    }
}

pub fn put_map_len_form(out: &mut Vec<u8>, len: usize, form: Option<Form>) {
    let f = len_form(len, 15, false, form);
    put_len(out, len, f, 0x80, 0, 0xde, 0xdf);
}

#[inline]
pub fn put_map_len(out: &mut Vec<u8>, len: usize) {
    if len <= 15 {
        out.push(0x80 | len as u8);
    } else {
        put_map_len_form(out, len, None);
    }
}

fn put_ext(out: &mut Vec<u8>, ty: i8, data: &[u8], form: Option<Form>) {
    let fix = match data.len() {
        1 => Some(Marker::FixExt1),
        2 => Some(Marker::FixExt2),
        4 => Some(Marker::FixExt4),
        8 => Some(Marker::FixExt8),
        16 => Some(Marker::FixExt16),
        _ => None,
    };
    let wanted = form.filter(|f| *f != Form::Fix);
    match (fix, wanted) {
        (Some(m), None) => out.push(m.to_u8()),
        _ => {
            let f = len_form(data.len(), 0, true, wanted);
            let f = if f == Form::Fix { Form::W8 } else { f };
            put_len(out, data.len(), f, 0, 0xc7, 0xc8, 0xc9);
        }
    }
    out.push(ty as u8);
    out.extend_from_slice(data);
}

/// Appends the msgpack encoding of `v`: canonical forms, or the remembered ones where they fit.
pub fn encode(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Nil => put_nil(out),
        Value::Bool(b) => put_bool(out, *b),
        Value::Int(i, f) => put_int_form(out, *i, *f),
        Value::F32(x) => put_f32(out, *x),
        Value::F64(x) => put_f64(out, *x),
        Value::Str(s, f) => put_str_form(out, s, *f),
        Value::Bin(b, f) => put_bin_form(out, b, *f),
        Value::Array(items, f) => {
            put_array_len_form(out, items.len(), *f);
            for item in items {
                encode(item, out);
            }
        }
        Value::Map(entries, f) => {
            put_map_len_form(out, entries.len(), *f);
            for (k, val) in entries {
                encode(k, out);
                encode(val, out);
            }
        }
        Value::Ext(ty, data, f) => put_ext(out, *ty, data, *f),
    }
}

pub fn encode_to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(v, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Decoding

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
    Some(slice.iter().fold(0u64, |acc, b| (acc << 8) | *b as u64))
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
    if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
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

/// Validates `children` items starting at `pos`, nested `depth` levels deep, counting every
/// item against `budget`.
fn children(
    bytes: &[u8],
    children: u64,
    mut pos: usize,
    depth: usize,
    budget: &mut u64,
) -> Result<usize, MsgpackError> {
    if depth > MAX_DEPTH {
        return Err(MsgpackError {
            at: pos,
            what: "nesting deeper than 128 levels",
        });
    }
    for _ in 0..children {
        *budget = budget.checked_sub(1).ok_or(MsgpackError {
            at: pos,
            what: "more than 4194304 items in one value",
        })?;
        pos = match step(bytes, pos)? {
            Step::Done(end) => end,
            Step::Open { children: n, data } => self::children(bytes, n, data, depth + 1, budget)?,
        };
    }
    Ok(pos)
}

/// Validates one item starting at `at` and returns the offset just past it: one pass, no
/// allocation. Nesting deeper than [`MAX_DEPTH`] is refused so that the recursive consumers
/// (`to_value`, display, encode) can never exhaust the stack, more than [`MAX_ITEMS`] items
/// so that they never allocate without bound, and a count larger than the bytes present fails
/// as soon as the bytes run out.
pub(crate) fn validate(bytes: &[u8], at: usize) -> Result<usize, MsgpackError> {
    let mut budget = MAX_ITEMS;
    children(bytes, 1, at, 0, &mut budget)
}

/// Checks only the marker and length fields of the item at `at` and returns where its
/// payload starts. The returned head slice lets callers read a container's kind and count
/// before validating its elements one by one.
pub(crate) fn validate_head(bytes: &[u8], at: usize) -> Result<usize, MsgpackError> {
    let h = head(bytes, at)?;
    if h.data > bytes.len() {
        return Err(MsgpackError {
            at,
            what: "length runs past the end of the frame",
        });
    }
    Ok(h.data)
}

/// The end of an item inside an already validated one; `None` only on a broken invariant.
fn skip_trusted(bytes: &[u8], at: usize) -> Option<usize> {
    let mut pending: u64 = 1;
    let mut pos = at;
    while pending > 0 {
        pending -= 1;
        let b = *bytes.get(pos)?;
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

    /// Wraps a sub-slice of an already validated item without walking it again.
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
        std::str::from_utf8(self.payload(Kind::Str)?).ok()
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
        let mut entries = self.map()?;
        if self.len() != 2 {
            return None;
        }
        let (k1, tag) = entries.next()?;
        let (k2, payload) = entries.next()?;
        if k1.str_bytes()? == b"__t__" && k2.str_bytes()? == b"v" {
            Some((tag.as_str()?, payload))
        } else {
            None
        }
    }

    /// The payload of a value tagged `tag`.
    pub fn tagged(&self, tag: &str) -> Option<RawValue<'a>> {
        self.as_tagged()
            .filter(|(t, _)| *t == tag)
            .map(|(_, payload)| payload)
    }

    /// An owned copy that remembers every non-canonical form.
    pub fn to_value(&self) -> Value {
        let Some(h) = self.head() else {
            return Value::Nil;
        };
        let keep = |canonical: Form| (h.form != canonical).then_some(h.form);
        match h.kind {
            Kind::Nil => Value::Nil,
            Kind::Bool => Value::Bool(h.n == 1),
            Kind::Int => Value::Int(h.n, keep(canonical_int_form(h.n))),
            Kind::Float => match h.float {
                Some((v, true)) => Value::F32(v as f32),
                Some((v, false)) => Value::F64(v),
                None => Value::Nil,
            },
            Kind::Str => Value::Str(
                self.as_str().unwrap_or_default().to_owned(),
                keep(canonical_len_form(h.n as usize, 31, true)),
            ),
            Kind::Bin => {
                let canonical = match canonical_len_form(h.n as usize, 0, true) {
                    Form::Fix => Form::W8,
                    f => f,
                };
                Value::Bin(self.as_bin().unwrap_or_default().to_vec(), keep(canonical))
            }
            Kind::Ext => {
                let data = self
                    .bytes
                    .get(h.data..h.data + h.n as usize)
                    .unwrap_or_default();
                let canonical = match h.n {
                    1 | 2 | 4 | 8 | 16 => Form::Fix,
                    n => canonical_len_form(n as usize, 0, true),
                };
                Value::Ext(h.ext_type, data.to_vec(), keep(canonical))
            }
            Kind::Array => Value::Array(
                self.array()
                    .map(|items| items.map(|v| v.to_value()).collect())
                    .unwrap_or_default(),
                keep(canonical_len_form(h.n as usize, 15, false)),
            ),
            Kind::Map => Value::Map(
                self.map()
                    .map(|entries| entries.map(|(k, v)| (k.to_value(), v.to_value())).collect())
                    .unwrap_or_default(),
                keep(canonical_len_form(h.n as usize, 15, false)),
            ),
        }
    }
}

/// A forward reader over a validated item, for hot paths that consume fields in order
/// instead of looking them up: each byte is read once.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(value: RawValue<'a>) -> Self {
        Cursor {
            bytes: value.bytes,
            pos: 0,
        }
    }

    fn head(&mut self, kind: Kind) -> Option<Head> {
        let h = head(self.bytes, self.pos).ok()?;
        (h.kind == kind).then_some(h)
    }

    /// Entries of the map at the cursor; the cursor moves to its first key.
    pub fn map_len(&mut self) -> Option<usize> {
        let h = self.head(Kind::Map)?;
        self.pos = h.data;
        Some(h.n as usize)
    }

    /// Elements of the array at the cursor; the cursor moves to the first one.
    pub fn array_len(&mut self) -> Option<usize> {
        let h = self.head(Kind::Array)?;
        self.pos = h.data;
        Some(h.n as usize)
    }

    fn payload(&mut self, kind: Kind) -> Option<&'a [u8]> {
        let h = self.head(kind)?;
        let end = h.data.checked_add(h.n as usize)?;
        let out = self.bytes.get(h.data..end)?;
        self.pos = end;
        Some(out)
    }

    /// The raw bytes of the str at the cursor (UTF-8 was checked by validation).
    pub fn str_bytes(&mut self) -> Option<&'a [u8]> {
        self.payload(Kind::Str)
    }

    pub fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.payload(Kind::Str)?).ok()
    }

    pub fn bin(&mut self) -> Option<&'a [u8]> {
        self.payload(Kind::Bin)
    }

    pub fn int(&mut self) -> Option<i64> {
        let h = self.head(Kind::Int)?;
        self.pos = h.data;
        i64::try_from(h.n).ok()
    }

    /// Steps over one item of any kind.
    pub fn skip(&mut self) -> Option<()> {
        self.pos = skip_trusted(self.bytes, self.pos)?;
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
}

impl<'a> Iterator for Items<'a> {
    type Item = RawValue<'a>;

    fn next(&mut self) -> Option<RawValue<'a>> {
        if self.left == 0 {
            return None;
        }
        let end = skip_trusted(self.bytes, self.pos)?;
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
