//! The storage-config digest (format spec §4.3): Python's `json.dumps(obj, sort_keys=True)`
//! text, hashed with SHA-256. Reproducing Python's text byte for byte is what makes kvtrace's
//! digests comparable with LMCache's, so every detail of CPython's encoder is mirrored here.
//!
//! The *semantic* digest is kvtrace's extension: it masks values that differ per process
//! (the L1 shared-memory name, `<... object at 0x...>` reprs), so that two runs with the same
//! effective configuration match even though LMCache's own digest never does.

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

pub use super::pyjson::{python_float_repr, python_json, python_json_indented};

/// Lowercase hex SHA-256 of a config text, as stored in `sm_config_digest`.
pub fn config_digest(config_json: &str) -> String {
    hex::encode(Sha256::digest(config_json.as_bytes()))
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
