//! Schema variants (format spec §8): `trace_schema_version` alone does not say which argument
//! shapes a file uses, so kvtrace looks at the records too, and can rewrite later shapes into
//! LMCache 0.5.6's schema 1 where nothing of meaning is lost — and says what was.

use std::fmt;

use super::args::CallArgs;
use super::calls::{FINISH_READ_PREFETCHED, RESERVE_WRITE, SUBMIT_PREFETCH_TASK};
use super::codec::{TAG_OBJECT_KEY, TAG_PREFETCH_SPEC};
use super::frame::{Header, HeaderSchema};
use super::value::Value;

/// Which argument shapes a trace uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaVariant {
    /// Header with `lmcache_version` and no schema number (the first recorder).
    Early { lmcache_version: String },
    /// Schema 1 as LMCache 0.5.6 writes it.
    V1,
    /// Schema 1 with pre-rename arguments (`extra_count`, `reserve_write(mode=…)`).
    V1Legacy,
    /// Schema 2 of LMCache 0.5.7: memory-tag filters in the prefetch spec, no `skip_l2`.
    V2MemoryTags,
    /// The other schema 2: `ObjectKey` carries `cache_salt`.
    V2CacheSalt,
    /// Schema 2, but no record shows which meaning.
    V2Undetermined,
    /// A version kvtrace does not know; read leniently.
    Unknown(i64),
}

impl fmt::Display for SchemaVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaVariant::Early { lmcache_version } => {
                write!(f, "early header (lmcache_version {lmcache_version})")
            }
            SchemaVariant::V1 => write!(f, "1 (LMCache 0.5.6)"),
            SchemaVariant::V1Legacy => {
                write!(f, "1 with pre-rename arguments (extra_count / mode)")
            }
            SchemaVariant::V2MemoryTags => write!(f, "2, memory-tag filters (LMCache 0.5.7)"),
            SchemaVariant::V2CacheSalt => write!(f, "2, cache_salt in object keys"),
            SchemaVariant::V2Undetermined => write!(f, "2 (no record shows which meaning)"),
            SchemaVariant::Unknown(v) => write!(f, "{v} (unknown to kvtrace)"),
        }
    }
}

/// What the records reveal about their shapes.
#[derive(Clone, Debug, Default)]
pub struct SchemaEvidence {
    pub memory_tag_specs: u64,
    pub prefetch_without_skip_l2: u64,
    pub salted_keys: u64,
    pub extra_count: u64,
    pub reserve_mode: u64,
}

impl SchemaEvidence {
    /// Adds the evidence of another run of records.
    pub fn merge(&mut self, other: &SchemaEvidence) {
        self.memory_tag_specs += other.memory_tag_specs;
        self.prefetch_without_skip_l2 += other.prefetch_without_skip_l2;
        self.salted_keys += other.salted_keys;
        self.extra_count += other.extra_count;
        self.reserve_mode += other.reserve_mode;
    }

    /// Notes the shapes of one record from its arguments.
    pub fn observe(&mut self, qualname: &str, args: &CallArgs<'_>) {
        if args.first_key_salted() {
            self.salted_keys += 1;
        }
        let extra_count = args.extra_count.is_present();
        match qualname {
            SUBMIT_PREFETCH_TASK => {
                if args.spec.is_present() && !args.skip_l2.is_present() {
                    self.prefetch_without_skip_l2 += 1;
                }
                if args.spec.valid().is_some_and(|s| s.memory_tags) {
                    self.memory_tag_specs += 1;
                }
                if extra_count {
                    self.extra_count += 1;
                }
            }
            FINISH_READ_PREFETCHED if extra_count => self.extra_count += 1,
            RESERVE_WRITE if args.mode => self.reserve_mode += 1,
            _ => {}
        }
    }

    /// The variant these observations and the header point to.
    pub fn variant(&self, header: &Header) -> SchemaVariant {
        match &header.schema {
            HeaderSchema::Early { lmcache_version } => SchemaVariant::Early {
                lmcache_version: lmcache_version.clone(),
            },
            HeaderSchema::Version(1) if self.extra_count + self.reserve_mode > 0 => {
                SchemaVariant::V1Legacy
            }
            HeaderSchema::Version(1) => SchemaVariant::V1,
            HeaderSchema::Version(2) => {
                if self.memory_tag_specs + self.prefetch_without_skip_l2 > 0 {
                    SchemaVariant::V2MemoryTags
                } else if self.salted_keys > 0 {
                    SchemaVariant::V2CacheSalt
                } else {
                    SchemaVariant::V2Undetermined
                }
            }
            HeaderSchema::Version(v) => SchemaVariant::Unknown(*v),
        }
    }
}

/// What a conversion to schema 1 changed or could not change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migration {
    /// `cache_salt` removed from keys where it was empty (no meaning lost).
    pub empty_salts_removed: u64,
    /// Non-empty salts removed: such keys may now collide with unsalted ones.
    pub salts_dropped: u64,
    /// Prefetch specs whose memory-tag filters were null ("all tiers").
    pub null_memory_filters_removed: u64,
    /// Prefetch specs that restricted tiers; the restriction is gone.
    pub memory_filters_dropped: u64,
    /// `skip_l2=false` added where 0.5.6 requires it.
    pub skip_l2_added: u64,
    /// `extra_count=N` rewritten as `read_locks=N+1`.
    pub extra_count_migrated: u64,
    /// `reserve_write(mode=…)` argument removed (0.5.6 has no such argument).
    pub reserve_mode_dropped: u64,
    /// Records in a shape schema 1 cannot express, left unchanged.
    pub left_unchanged: u64,
}

impl Migration {
    /// Adds the changes made to another run of records.
    pub fn merge(&mut self, other: &Migration) {
        self.empty_salts_removed += other.empty_salts_removed;
        self.salts_dropped += other.salts_dropped;
        self.null_memory_filters_removed += other.null_memory_filters_removed;
        self.memory_filters_dropped += other.memory_filters_dropped;
        self.skip_l2_added += other.skip_l2_added;
        self.extra_count_migrated += other.extra_count_migrated;
        self.reserve_mode_dropped += other.reserve_mode_dropped;
        self.left_unchanged += other.left_unchanged;
    }

    /// One line per kind of change, for the user.
    pub fn lines(&self) -> Vec<String> {
        let items = [
            (
                self.empty_salts_removed,
                "empty cache_salt fields removed from object keys",
            ),
            (
                self.salts_dropped,
                "NON-EMPTY cache_salt values dropped: salted keys may now collide",
            ),
            (
                self.null_memory_filters_removed,
                "null memory-tag filters removed from prefetch specs",
            ),
            (
                self.memory_filters_dropped,
                "memory-tag filters DROPPED: those prefetches now consider every tier",
            ),
            (
                self.skip_l2_added,
                "skip_l2=false added to submit_prefetch_task",
            ),
            (
                self.extra_count_migrated,
                "extra_count=N rewritten as read_locks=N+1",
            ),
            (
                self.reserve_mode_dropped,
                "reserve_write mode argument dropped",
            ),
            (
                self.left_unchanged,
                "records in a pre-spec shape left unchanged (not replayable by 0.5.6)",
            ),
        ];
        items
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} × {what}"))
            .collect()
    }

    /// Rewrites one record's arguments into schema-1 shape.
    pub fn migrate_args(&mut self, qualname: &str, args: &mut Value) {
        self.strip_salts(args);
        match qualname {
            SUBMIT_PREFETCH_TASK => {
                if args.get("spec").is_none() {
                    self.left_unchanged += 1;
                    return;
                }
                if let Some(spec) = args
                    .get_mut("spec")
                    .and_then(|s| s.tagged_payload_mut(TAG_PREFETCH_SPEC))
                {
                    for field in ["allowed_l1_memory_tags", "allowed_l2_memory_tags"] {
                        match spec.remove(field) {
                            Some(Value::Nil) => self.null_memory_filters_removed += 1,
                            Some(_) => self.memory_filters_dropped += 1,
                            None => {}
                        }
                    }
                }
                if args.get("skip_l2").is_none() {
                    if let Some(map) = args.as_map_mut() {
                        map.push((Value::str("skip_l2"), Value::Bool(false)));
                        self.skip_l2_added += 1;
                    }
                }
            }
            FINISH_READ_PREFETCHED => {
                if let Some(map) = args.as_map_mut() {
                    for (k, v) in map.iter_mut() {
                        if k.as_str() == Some("extra_count") {
                            let n = v.as_i64().unwrap_or(0);
                            *k = Value::str("read_locks");
                            *v = Value::int(n.saturating_add(1));
                            self.extra_count_migrated += 1;
                        }
                    }
                }
            }
            RESERVE_WRITE if args.remove("mode").is_some() => self.reserve_mode_dropped += 1,
            _ => {}
        }
    }

    fn strip_salts(&mut self, v: &mut Value) {
        if let Some(key) = v.tagged_payload_mut(TAG_OBJECT_KEY) {
            match key.remove("cache_salt") {
                Some(Value::Str(s, _)) if s.is_empty() => self.empty_salts_removed += 1,
                Some(_) => self.salts_dropped += 1,
                None => {}
            }
            return;
        }
        match v {
            Value::Array(items, _) => items.iter_mut().for_each(|i| self.strip_salts(i)),
            Value::Map(entries, _) => entries.iter_mut().for_each(|(_, i)| self.strip_salts(i)),
            _ => {}
        }
    }
}
