//! Python's `json.dumps` text, byte for byte: `sort_keys=True`, the default separators,
//! `ensure_ascii`, and `repr(float)` digits. The config digest hashes this text (format spec
//! §4.3) and `simulate` writes its report in it, so both diff cleanly against what Python
//! tools write.

use serde_json::Value as Json;

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
