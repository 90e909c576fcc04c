//! The storage-config digest (format spec §4.3): Python's `json.dumps(obj, sort_keys=True)`
//! text, hashed with SHA-256. Reproducing Python's text byte for byte is what makes kvtrace's
//! digests comparable with LMCache's, so every detail of CPython's encoder is mirrored here.
//!
//! The *semantic* digest is kvtrace's extension: it masks values that differ per process
//! (the L1 shared-memory name, `<... object at 0x...>` reprs), so that two runs with the same
//! effective configuration match even though LMCache's own digest never does.

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of a config text, as stored in `sm_config_digest`.
pub fn config_digest(config_json: &str) -> String {
    hex::encode(Sha256::digest(config_json.as_bytes()))
}

/// `json.dumps(value, sort_keys=True)` with Python's default separators and `ensure_ascii`.
pub fn python_json(value: &Json) -> String {
    let mut out = String::new();
    write_json(value, None, 0, &mut out);
    out
}

/// `json.dumps(value, sort_keys=True, indent=indent)`: the layout of reports other tools'
/// scripts already parse and diff.
pub fn python_json_indented(value: &Json, indent: usize) -> String {
    let mut out = String::new();
    write_json(value, Some(indent), 0, &mut out);
    out
}

/// The separator before item `i` of a container at nesting `level`.
fn separate(i: usize, indent: Option<usize>, level: usize, out: &mut String) {
    match indent {
        None if i > 0 => out.push_str(", "),
        None => {}
        Some(n) => {
            if i > 0 {
                out.push(',');
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }
}

fn write_json(value: &Json, indent: Option<usize>, level: usize, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                out.push_str(&python_float_repr(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Json::String(s) => write_python_str(s, out),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separate(i, indent, level + 1, out);
                write_json(item, indent, level + 1, out);
            }
            if !items.is_empty() {
                separate(0, indent, level, out);
            }
            out.push(']');
        }
        Json::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                separate(i, indent, level + 1, out);
                write_python_str(k, out);
                out.push_str(": ");
                write_json(v, indent, level + 1, out);
            }
            if !entries.is_empty() {
                separate(0, indent, level, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string literal with `ensure_ascii=True`: everything outside printable ASCII is a
/// lowercase `\uXXXX` escape (UTF-16 surrogate pairs above the BMP).
fn write_python_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-trip digits, in positional notation when the
/// decimal exponent is in -4..16, else `d.ddde±XX`.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let point = exp + 1;
    let body = if (-3..=16).contains(&point) {
        if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// Replaces process-specific values: the L1 shared-memory name and object addresses.
pub fn mask_process_specific(value: &mut Json) {
    match value {
        Json::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "shm_name" && v.is_string() {
                    *v = Json::String("<per-process>".into());
                } else {
                    mask_process_specific(v);
                }
            }
        }
        Json::Array(items) => items.iter_mut().for_each(mask_process_specific),
        Json::String(s) => {
            if let Some(masked) = mask_object_address(s) {
                *s = masked;
            }
        }
        _ => {}
    }
}

/// `<pkg.Cls object at 0x7f5e...>` → `<pkg.Cls object at 0x?>`.
fn mask_object_address(s: &str) -> Option<String> {
    const MARK: &str = " object at 0x";
    let at = s.find(MARK)?;
    if !s.starts_with('<') {
        return None;
    }
    let tail = &s[at + MARK.len()..];
    let hex_len = tail.chars().take_while(|c| c.is_ascii_hexdigit()).count();
    if hex_len == 0 || !tail[hex_len..].starts_with('>') {
        return None;
    }
    Some(format!("{}{MARK}?{}", &s[..at], &tail[hex_len..]))
}

/// Digest of the masked config: equal for configs that differ only in process-specific
/// values. `None` when the text is not JSON that kvtrace can parse.
pub fn semantic_digest(config_json: &str) -> Option<String> {
    if config_json.is_empty() {
        return Some(config_digest(""));
    }
    let mut value: Json = serde_json::from_str(config_json).ok()?;
    mask_process_specific(&mut value);
    Some(config_digest(&python_json(&value)))
}

/// How a recorded config relates to another one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DigestMatch {
    /// Byte-identical config text.
    Exact,
    /// Equal once process-specific values are masked.
    Semantic,
    /// Different; the JSON paths whose values differ.
    Mismatch(Vec<String>),
}

/// Compares two config texts and names what differs.
pub fn compare_configs(recorded: &str, other: &str) -> DigestMatch {
    if config_digest(recorded) == config_digest(other) {
        return DigestMatch::Exact;
    }
    if semantic_digest(recorded).is_some() && semantic_digest(recorded) == semantic_digest(other) {
        return DigestMatch::Semantic;
    }
    let parse = |s: &str| serde_json::from_str::<Json>(s).unwrap_or(Json::String(s.into()));
    let mut paths = Vec::new();
    diff_paths(&parse(recorded), &parse(other), "$", &mut paths);
    DigestMatch::Mismatch(paths)
}

fn diff_paths(a: &Json, b: &Json, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => diff_paths(va, vb, &sub, out),
                    _ => out.push(sub),
                }
            }
        }
        (Json::Array(x), Json::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                diff_paths(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}
