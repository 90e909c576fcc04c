//! The msgpack encoder. Canonical writes — what LMCache's msgspec encoder picks: the smallest
//! form, unsigned families for non-negative integers, `str8`, no `fixbin` — are rmp's; the
//! form-preserving writes the lossless JSON round trip needs (a value written back in the
//! width it was read in, which rmp has no call for) are kvtrace's own.

use rmp::encode as rmp_encode;
use rmp::Marker;

use crate::value::{Form, Value};

/// rmp's writers return an error type for any `io::Write`; appending to a `Vec` cannot fail.
#[inline(always)]
fn appended<T, E>(result: Result<T, E>) {
    debug_assert!(result.is_ok(), "appending to a Vec cannot fail");
}

pub fn put_nil(out: &mut Vec<u8>) {
    appended(rmp_encode::write_nil(out));
}

pub fn put_bool(out: &mut Vec<u8>, v: bool) {
    appended(rmp_encode::write_bool(out, v));
}

pub fn put_f64(out: &mut Vec<u8>, v: f64) {
    appended(rmp_encode::write_f64(out, v));
}

pub fn put_f32(out: &mut Vec<u8>, v: f32) {
    appended(rmp_encode::write_f32(out, v));
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
    appended(rmp_encode::write_uint(out, v));
}

/// Non-negative values take the unsigned forms, as msgspec writes them.
#[inline]
pub fn put_int(out: &mut Vec<u8>, v: i64) {
    appended(rmp_encode::write_sint(out, v));
}

/// The canonical length form of a str (fix up to 31), bin (no fix form), array or map
/// (fix up to 15).
pub(super) fn canonical_len_form(len: usize, fix_max: usize, has_w8: bool) -> Form {
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
    appended(rmp_encode::write_str(out, s));
}

pub fn put_bin_form(out: &mut Vec<u8>, b: &[u8], form: Option<Form>) {
    put_bin_head(out, b.len(), form);
    out.extend_from_slice(b);
}

/// The head of a bin of `len` bytes, in `form` where it fits (bin has no fix form: its
/// shortest is bin8), for a writer that puts the bytes after it itself.
pub fn put_bin_head(out: &mut Vec<u8>, len: usize, form: Option<Form>) {
    let f = len_form(len, 0, true, form.filter(|f| *f != Form::Fix));
    let f = if f == Form::Fix { Form::W8 } else { f };
    put_len(out, len, f, 0, 0xc4, 0xc5, 0xc6);
}

#[inline]
pub fn put_bin(out: &mut Vec<u8>, b: &[u8]) {
    appended(rmp_encode::write_bin(out, b));
}

pub fn put_array_len_form(out: &mut Vec<u8>, len: usize, form: Option<Form>) {
    let f = len_form(len, 15, false, form);
    put_len(out, len, f, 0x90, 0, 0xdc, 0xdd);
}

/// msgpack lengths are 32-bit; a longer collection cannot be encoded.
#[inline]
pub fn put_array_len(out: &mut Vec<u8>, len: usize) {
    appended(rmp_encode::write_array_len(out, len as u32));
}

pub fn put_map_len_form(out: &mut Vec<u8>, len: usize, form: Option<Form>) {
    let f = len_form(len, 15, false, form);
    put_len(out, len, f, 0x80, 0, 0xde, 0xdf);
}

#[inline]
pub fn put_map_len(out: &mut Vec<u8>, len: usize) {
    appended(rmp_encode::write_map_len(out, len as u32));
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
