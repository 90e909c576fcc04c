//! The `events:` summary of an events-level trace (`lmcache server --trace-level events`):
//! the cache's own event stream — `events.batch` records (stores, accesses, deletes of one
//! tier and backend, each with its entries) and `events.lifecycle` records (a server
//! incarnation's start and stop). LMCache's `trace info` prints the same figures; kvtrace
//! adds the store bytes per tier.
//!
//! Values are read as LMCache reads them — as Python's `str()` of whatever the field holds,
//! a missing one as `?` — so a file from a newer server still summarises. The summary is a
//! sum of per-record parts, so blocks of records tallied on their own threads merge exactly.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::lmct::msgpack::{Kind, RawValue};

/// A batch's kind: event type, tier, backend (empty when none) and whether the tier is
/// shared.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct BatchKind {
    pub event_type: String,
    pub tier: String,
    pub backend: String,
    pub shared: bool,
}

/// What an events-level trace holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EventsSummary {
    /// Each server instance and the incarnations (start times) it ran as.
    pub incarnations: BTreeMap<String, BTreeSet<i64>>,
    /// Batches of each kind.
    #[serde(serialize_with = "batches_as_list")]
    pub batches: BTreeMap<BatchKind, u64>,
    /// Entries per event type.
    pub entries: BTreeMap<String, u64>,
    /// Bytes of the entries of store batches.
    pub store_bytes: u64,
    /// Store entries that carry token ids.
    pub entries_with_tokens: u64,
    /// Lifecycle records per phase (`start`, `stop`).
    pub lifecycle: BTreeMap<String, u64>,
    /// kvtrace: store bytes per tier.
    pub store_bytes_per_tier: BTreeMap<String, u64>,
}

fn batches_as_list<S: serde::Serializer>(
    batches: &BTreeMap<BatchKind, u64>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(batches.len()))?;
    for (kind, n) in batches {
        seq.serialize_element(&(kind, n))?;
    }
    seq.end()
}

/// Python's `str()` of a field, `default` when the field is missing.
pub(super) fn py_str(v: Option<RawValue<'_>>, default: &str) -> String {
    let Some(v) = v else {
        return default.to_owned();
    };
    match v.kind() {
        Kind::Nil => "None".into(),
        Kind::Bool => if v.as_bool() == Some(true) {
            "True"
        } else {
            "False"
        }
        .into(),
        Kind::Str => v.as_str().unwrap_or_default().to_owned(),
        _ => match (v.as_i64(), v.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => format!("{f:?}"),
            _ => crate::lmct::display::to_display(v).to_string(),
        },
    }
}

/// Python's truth of a field: what `bool(x)` says of it.
pub(super) fn py_truth(v: Option<RawValue<'_>>) -> bool {
    let Some(v) = v else {
        return false;
    };
    match v.kind() {
        Kind::Nil => false,
        Kind::Bool => v.as_bool() == Some(true),
        Kind::Str => !v.as_str().unwrap_or_default().is_empty(),
        Kind::Array | Kind::Map => !v.is_empty(),
        _ => v.as_f64().is_some_and(|f| f != 0.0),
    }
}

impl EventsSummary {
    /// Folds one record in; records of other kinds are not events.
    pub fn add(&mut self, qualname: &str, args: RawValue<'_>) {
        match qualname {
            "events.lifecycle" => {
                *self
                    .lifecycle
                    .entry(py_str(args.get("phase"), "?"))
                    .or_default() += 1;
            }
            "events.batch" => self.add_batch(args),
            _ => {}
        }
    }

    fn add_batch(&mut self, args: RawValue<'_>) {
        let instance = py_str(args.get("instance_id"), "?");
        let incarnation = args
            .get("incarnation")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        self.incarnations
            .entry(instance)
            .or_default()
            .insert(incarnation);
        let event_type = py_str(args.get("event_type"), "?");
        let tier = py_str(args.get("tier"), "?");
        let kind = BatchKind {
            event_type: event_type.clone(),
            tier: tier.clone(),
            backend: py_str(args.get("backend"), ""),
            shared: py_truth(args.get("shared")),
        };
        *self.batches.entry(kind).or_default() += 1;
        let entries = args.get("entries").filter(|e| py_truth(Some(*e)));
        *self.entries.entry(event_type.clone()).or_default() +=
            entries.map_or(0, |e| e.len() as u64);
        let Some(entries) = entries
            .and_then(|e| e.array())
            .filter(|_| event_type == "store")
        else {
            return;
        };
        let mut bytes = 0u64;
        for e in entries {
            bytes += e.get("size_bytes").and_then(|s| s.as_u64()).unwrap_or(0);
            if py_truth(e.get("token_ids")) {
                self.entries_with_tokens += 1;
            }
        }
        self.store_bytes += bytes;
        *self.store_bytes_per_tier.entry(tier).or_default() += bytes;
    }

    /// Adds the summary of other records.
    pub fn merge(&mut self, other: EventsSummary) {
        for (instance, incs) in other.incarnations {
            self.incarnations.entry(instance).or_default().extend(incs);
        }
        for (kind, n) in other.batches {
            *self.batches.entry(kind).or_default() += n;
        }
        for (t, n) in other.entries {
            *self.entries.entry(t).or_default() += n;
        }
        self.store_bytes += other.store_bytes;
        self.entries_with_tokens += other.entries_with_tokens;
        for (p, n) in other.lifecycle {
            *self.lifecycle.entry(p).or_default() += n;
        }
        for (t, n) in other.store_bytes_per_tier {
            *self.store_bytes_per_tier.entry(t).or_default() += n;
        }
    }

    /// LMCache's `events:` block, line for line, with `line` laying out a `label: value`
    /// row at an indent.
    pub fn render(
        &self,
        line: &dyn Fn(&mut String, usize, &str, &dyn std::fmt::Display),
    ) -> String {
        let mut s = String::from("  events:\n");
        line(&mut s, 4, "instances", &self.incarnations.len());
        for (instance, incs) in &self.incarnations {
            let list: Vec<String> = incs.iter().map(i64::to_string).collect();
            s.push_str(&format!(
                "      {instance}: incarnations=[{}] restarts={}\n",
                list.join(", "),
                incs.len().saturating_sub(1)
            ));
        }
        s.push_str("    batches (type/tier/backend/shared):\n");
        for (k, n) in &self.batches {
            let scope = if k.shared { "shared" } else { "local" };
            let backend = if k.backend.is_empty() {
                "-"
            } else {
                &k.backend
            };
            s.push_str(&format!(
                "      {}/{}/{backend}/{scope}: {n}\n",
                k.event_type, k.tier
            ));
        }
        s.push_str("    entries:\n");
        for (t, n) in &self.entries {
            s.push_str(&format!("      {t}: {n}\n"));
        }
        line(&mut s, 4, "store_bytes", &self.store_bytes);
        line(&mut s, 4, "entries_with_tokens", &self.entries_with_tokens);
        if !self.lifecycle.is_empty() {
            let marks: Vec<String> = self
                .lifecycle
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            line(&mut s, 4, "lifecycle", &marks.join(", "));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lmct::msgpack::encode_to_vec;
    use crate::lmct::value::Value;

    fn s(text: &str) -> Value {
        Value::Str(text.into(), None)
    }

    fn map(pairs: Vec<(&str, Value)>) -> Value {
        Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect(), None)
    }

    fn int(n: i128) -> Value {
        Value::Int(n, None)
    }

    fn entry(size: i128, tokens: usize) -> Value {
        map(vec![
            ("size_bytes", int(size)),
            (
                "token_ids",
                Value::Array((0..tokens as i128).map(int).collect(), None),
            ),
        ])
    }

    fn batch(kind: &str, incarnation: i128, shared: Value, entries: Vec<Value>) -> Vec<u8> {
        encode_to_vec(&map(vec![
            ("instance_id", s("a")),
            ("incarnation", int(incarnation)),
            ("event_type", s(kind)),
            ("tier", s("l2")),
            ("backend", s("")),
            ("shared", shared),
            ("entries", Value::Array(entries, None)),
        ]))
    }

    fn add(summary: &mut EventsSummary, qualname: &str, bytes: &[u8]) {
        summary.add(qualname, RawValue::parse(bytes).expect("msgpack"));
    }

    /// Fields are read as Python's `str()`/`bool()` read them; a summary of blocks merged
    /// equals the summary of all records in one pass.
    #[test]
    fn batches_fold_as_lmcache_reads_them_and_merge_exactly() {
        let records = [
            (
                "events.batch",
                batch(
                    "store",
                    1,
                    Value::Bool(false),
                    vec![entry(100, 2), entry(50, 0)],
                ),
            ),
            ("events.batch", batch("store", 2, int(1), vec![entry(7, 0)])),
            (
                "events.batch",
                batch("access", 2, Value::Nil, vec![entry(0, 0)]),
            ),
            (
                "events.lifecycle",
                encode_to_vec(&map(vec![("phase", s("start"))])),
            ),
            ("events.lifecycle", encode_to_vec(&map(vec![]))),
            ("events.batch", encode_to_vec(&map(vec![]))),
        ];
        let mut whole = EventsSummary::default();
        let (mut first, mut second) = (EventsSummary::default(), EventsSummary::default());
        for (i, (q, bytes)) in records.iter().enumerate() {
            add(&mut whole, q, bytes);
            add(if i < 3 { &mut first } else { &mut second }, q, bytes);
        }
        first.merge(second);
        assert_eq!(first, whole);
        assert_eq!(
            whole.incarnations["a"].iter().copied().collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(
            whole.incarnations["?"].len(),
            1,
            "a batch without instance_id"
        );
        assert_eq!(whole.store_bytes, 157);
        assert_eq!(whole.entries_with_tokens, 1);
        assert_eq!(whole.lifecycle["start"], 1);
        assert_eq!(whole.lifecycle["?"], 1);
        let text = whole.render(&|out, indent, key, value| {
            out.push_str(&format!("{:indent$}{key}: {value}\n", ""));
        });
        assert!(text.contains("      store/l2/-/local: 1\n"), "{text}");
        assert!(text.contains("      store/l2/-/shared: 1\n"), "1 is true");
        assert!(
            text.contains("      access/l2/-/local: 1\n"),
            "None is false"
        );
        assert!(text.contains("      ?/?/-/local: 1\n"), "{text}");
        assert!(
            text.contains("      a: incarnations=[1, 2] restarts=1\n"),
            "{text}"
        );
    }
}
