//! A call's arguments, read in one forward pass over its `args` map: every key is read where
//! it lies (nothing is copied and no value is walked twice), layouts stay their encoded bytes
//! for the caller to resolve once per distinct layout, and the shapes that tell the schema
//! variants apart are noted on the way. Replay's dispatcher and `info` both read calls
//! through [`CallArgs::read`]; on a gigabyte trace the keys are nearly all of the bytes, so
//! each extra walk over them costs as much as reading the file.

use super::codec::{
    read_object_keys, read_tag, ObjectKeyRef, TAG_GROUPED_KEYS, TAG_LOCK_MODE, TAG_PREFETCH_SPEC,
};
use super::msgpack::{Cursor, RawValue};
use super::RecordRef;

/// One argument as the record has it.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Arg<T> {
    #[default]
    Absent,
    /// Present, but not of the shape the call takes.
    Malformed,
    Valid(T),
}

impl<T> Arg<T> {
    pub fn is_present(&self) -> bool {
        !matches!(self, Arg::Absent)
    }

    pub fn valid(&self) -> Option<&T> {
        match self {
            Arg::Valid(v) => Some(v),
            _ => None,
        }
    }

    /// Reads the value at the cursor with `read`; when that fails the cursor steps over the
    /// whole value instead, so that the arguments after it are still read.
    fn read<'a>(c: &mut Cursor<'a>, read: impl FnOnce(&mut Cursor<'a>) -> Option<T>) -> Arg<T> {
        let start = c.clone();
        match read(c) {
            Some(v) => Arg::Valid(v),
            None => {
                *c = start;
                // The args map was validated with the record, so stepping over cannot fail.
                let _ = c.skip();
                Arg::Malformed
            }
        }
    }
}

/// Keys, and whether the first of them carries a `cache_salt` (one schema-2 variant).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Keys<'a> {
    pub keys: Vec<ObjectKeyRef<'a>>,
    pub first_salted: bool,
}

/// Reads an array of tagged keys at the cursor, noting whether the first is salted.
fn read_keys<'a>(c: &mut Cursor<'a>) -> Option<Keys<'a>> {
    let keys = read_object_keys(c)?;
    let first_salted = keys.first().is_some_and(|k| k.cache_salt.is_some());
    Some(Keys { keys, first_salted })
}

/// One `GroupedObjectKeys` of a prefetch spec: its keys and the layout of their objects.
#[derive(Clone, Debug)]
pub struct KeyGroup<'a> {
    pub keys: Keys<'a>,
    pub layout_desc: Option<RawValue<'a>>,
    /// `sliding_window_size`; -1 (full attention) when absent.
    pub window: i64,
}

impl<'a> KeyGroup<'a> {
    fn read(c: &mut Cursor<'a>) -> Option<Self> {
        read_tag(c, TAG_GROUPED_KEYS)?;
        let mut group = KeyGroup {
            keys: Keys::default(),
            layout_desc: None,
            window: -1,
        };
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"keys" => group.keys = read_keys(c)?,
                b"layout_desc" => group.layout_desc = Some(c.value()?),
                b"sliding_window_size" => group.window = c.int()?,
                _ => c.skip()?,
            }
        }
        Some(group)
    }
}

/// A `PrefetchTaskSpec`, with LMCache's defaults for the fields it leaves out.
#[derive(Clone, Debug)]
pub struct PrefetchSpec<'a> {
    pub groups: Vec<KeyGroup<'a>>,
    /// `fetching_policy` other than `full`: stop at the first miss.
    pub prefix_only: bool,
    pub readers: u64,
    pub lock: bool,
    /// Carries LMCache 0.5.7's `allowed_l1_memory_tags` filter.
    pub memory_tags: bool,
}

impl<'a> PrefetchSpec<'a> {
    fn read(c: &mut Cursor<'a>) -> Option<Self> {
        read_tag(c, TAG_PREFETCH_SPEC)?;
        let mut spec = PrefetchSpec {
            groups: Vec::new(),
            prefix_only: true,
            readers: 1,
            lock: true,
            memory_tags: false,
        };
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"key_groups" => {
                    for _ in 0..c.array_len()? {
                        spec.groups.push(KeyGroup::read(c)?);
                    }
                }
                b"num_kv_readers" => spec.readers = c.int()?.max(0) as u64,
                b"fetching_policy" => spec.prefix_only = c.str_bytes()? != b"full",
                b"lock_mode" => {
                    read_tag(c, TAG_LOCK_MODE)?;
                    spec.lock = c.str_bytes()? != b"NO_LOCK";
                }
                b"allowed_l1_memory_tags" => {
                    spec.memory_tags = true;
                    c.skip()?
                }
                _ => c.skip()?,
            }
        }
        Some(spec)
    }

    /// Whether the spec's first key carries a `cache_salt`.
    fn first_salted(&self) -> bool {
        self.groups.first().is_some_and(|g| g.keys.first_salted)
    }
}

/// Every argument a StorageManager call of any schema variant takes. A name repeated in the
/// map keeps its last value, as the Python dict LMCache decodes it into does.
#[derive(Clone, Debug, Default)]
pub struct CallArgs<'a> {
    pub keys: Arg<Keys<'a>>,
    pub layout_desc: Option<RawValue<'a>>,
    pub spec: Arg<PrefetchSpec<'a>>,
    pub request_id: Arg<&'a str>,
    pub skip_l2: Arg<bool>,
    pub read_locks: Arg<i64>,
    /// The pre-rename spelling of `read_locks - 1`.
    pub extra_count: Arg<i64>,
    /// The pre-rename `reserve_write(mode=…)`, which nothing reads.
    pub mode: bool,
}

impl<'a> CallArgs<'a> {
    /// Reads a record's `args` (validated with the record) in one pass; a value of the wrong
    /// shape is [`Arg::Malformed`] and the arguments after it are still read. `None` only
    /// when `args` is not a map with string keys.
    pub fn read(args: RawValue<'a>) -> Option<CallArgs<'a>> {
        CallArgs::read_at(Cursor::new(args))
    }

    /// [`CallArgs::read`] of a record's `args`, taking the keys its reader kept while
    /// validating the frame rather than reading them again.
    pub fn of(record: &RecordRef<'a>) -> Option<CallArgs<'a>> {
        CallArgs::read_at(Cursor::noting(record.args, record.seen))
    }

    fn read_at(mut c: Cursor<'a>) -> Option<CallArgs<'a>> {
        let mut out = CallArgs::default();
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"keys" => out.keys = Arg::read(&mut c, read_keys),
                b"layout_desc" => out.layout_desc = Some(c.value()?),
                b"spec" => out.spec = Arg::read(&mut c, PrefetchSpec::read),
                b"external_request_id" => out.request_id = Arg::read(&mut c, |c| c.str()),
                b"skip_l2" => out.skip_l2 = Arg::read(&mut c, |c| c.value()?.as_bool()),
                b"read_locks" => out.read_locks = Arg::read(&mut c, |c| c.int()),
                b"extra_count" => out.extra_count = Arg::read(&mut c, |c| c.int()),
                b"mode" => {
                    out.mode = true;
                    c.skip()?
                }
                _ => c.skip()?,
            }
        }
        Some(out)
    }

    /// Whether the call's first key — `keys[0]`, or the spec's first group's — carries a
    /// `cache_salt`.
    pub fn first_key_salted(&self) -> bool {
        match (&self.keys, &self.spec) {
            (Arg::Valid(keys), _) => keys.first_salted,
            (Arg::Absent, Arg::Valid(spec)) => spec.first_salted(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ObjectKey;
    use crate::msgpack::{put_int, put_str};

    fn key(hash: u8) -> ObjectKey {
        ObjectKey::single_rank(vec![hash; 32], "m")
    }

    fn keys_array(out: &mut Vec<u8>, keys: &[ObjectKey]) {
        out.push(0x90 | keys.len() as u8);
        for k in keys {
            k.encode(out);
        }
    }

    #[test]
    fn every_argument_is_read_in_one_pass_past_a_malformed_one() {
        let mut args = vec![0x84];
        put_str(&mut args, "keys");
        keys_array(&mut args, &[key(1), key(2)]);
        put_str(&mut args, "read_locks");
        put_str(&mut args, "two");
        put_str(&mut args, "extra_count");
        put_int(&mut args, 4);
        put_str(&mut args, "mode");
        put_int(&mut args, 0);
        let call = CallArgs::read(RawValue::parse(&args).unwrap()).unwrap();
        let keys = call.keys.valid().unwrap();
        assert_eq!(keys.keys.len(), 2);
        assert_eq!(keys.keys[1].chunk_hash, &[2u8; 32][..]);
        assert!(!keys.first_salted);
        assert_eq!(call.read_locks, Arg::Malformed);
        assert_eq!(call.extra_count, Arg::Valid(4));
        assert!(call.mode);
        assert!(matches!(call.spec, Arg::Absent));
        assert!(call.read_locks.is_present() && !call.spec.is_present());
    }

    #[test]
    fn a_list_with_one_non_key_is_malformed_as_a_whole() {
        let mut args = vec![0x81];
        put_str(&mut args, "keys");
        args.push(0x92);
        key(1).encode(&mut args);
        put_int(&mut args, 7);
        let call = CallArgs::read(RawValue::parse(&args).unwrap()).unwrap();
        assert_eq!(call.keys, Arg::Malformed);
    }

    /// A record's arguments read with the keys its validation kept are the arguments read
    /// afresh, for a prefetch spec (keys nested in groups) and a key list, whole, cut at
    /// every byte, or with any byte replaced; and keeping keys never changes whether the
    /// record decodes, or why not.
    #[test]
    fn arguments_read_with_the_kept_keys_are_the_arguments_read_afresh() {
        use crate::calls::StorageCall;
        use crate::codec::{LockMode, MemoryLayoutDesc, PrefetchTaskSpec};
        use crate::frame::{encode_record_head, variants, RecordSpans};
        let layout = MemoryLayoutDesc {
            shapes: vec![vec![2, 4, 16, 8]],
            dtypes: vec!["torch.bfloat16".into()],
        };
        let keys: Vec<ObjectKey> = (1..=17).map(key).collect();
        let spec = PrefetchTaskSpec::single_group(
            keys[..3].to_vec(),
            layout.clone(),
            "prefix",
            LockMode::Lock,
        );
        let calls = [
            StorageCall::SubmitPrefetchTask {
                spec: &spec,
                external_request_id: "req-1",
                skip_l2: false,
            },
            StorageCall::ReserveWrite {
                keys: &keys,
                layout_desc: &layout,
            },
        ];
        let mut checked = 0;
        for call in calls {
            let mut body = Vec::new();
            encode_record_head(&mut body, 1.0, 2.0, call.qualname());
            call.encode_args(&mut body);
            let replacements = [0x00, 0x80, 0x82, 0xa0, 0xc1, 0xc4, 0xcf, 0xdc, 0xff];
            for bytes in &variants(&body, &replacements) {
                let mut seen = Vec::new();
                let kept = RecordSpans::parse_noting(bytes, &mut seen);
                let plain = RecordSpans::parse(bytes);
                assert_eq!(kept.as_ref().err(), plain.as_ref().err());
                let (Ok(kept), Ok(plain)) = (kept, plain) else {
                    continue;
                };
                let record = RecordRef::from_spans(0, bytes, &kept).noting(&seen);
                let afresh = RecordRef::from_spans(0, bytes, &plain);
                assert_eq!(
                    format!("{:?}", CallArgs::of(&record)),
                    format!("{:?}", CallArgs::read(afresh.args)),
                );
                checked += 1;
            }
        }
        assert!(
            checked > 2,
            "the whole records and some changed ones decode"
        );
    }

    #[test]
    fn not_a_map_is_none() {
        let mut args = Vec::new();
        put_int(&mut args, 1);
        assert!(CallArgs::read(RawValue::parse(&args).unwrap()).is_none());
    }
}
