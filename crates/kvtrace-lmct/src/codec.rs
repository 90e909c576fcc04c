//! Typed views of LMCache's codec-tagged argument values (format spec §6), and their
//! encoders in 0.5.6's exact shape.
//!
//! Views borrow from a frame and never fail loudly: a field of the wrong type makes the whole
//! view `None`, which callers report as an undecodable argument.

use super::msgpack::{self, Cursor, Items, Kind, RawValue};

pub const TAG_TUPLE: &str = "tuple";
pub const TAG_SET: &str = "set";
pub const TAG_OBJECT_KEY: &str = "ObjectKey";
pub const TAG_LAYOUT: &str = "MemoryLayoutDesc";
pub const TAG_GROUPED_KEYS: &str = "GroupedObjectKeys";
pub const TAG_PREFETCH_SPEC: &str = "PrefetchTaskSpec";
pub const TAG_LOCK_MODE: &str = "PrefetchLockMode";
pub const TAG_TORCH_SIZE: &str = "torch.Size";
pub const TAG_TORCH_DTYPE: &str = "torch.dtype";
pub const TAG_PREFETCH_HANDLE: &str = "PrefetchHandle";
pub const TAG_ATTN_WINDOW: &str = "AttnWindowDesc";
pub const TAG_MEMORY_TAGS: &str = "MemoryTags";

/// Every tag LMCache has registered; anything else is an unknown codec.
pub const KNOWN_TAGS: &[&str] = &[
    TAG_TUPLE,
    TAG_SET,
    TAG_OBJECT_KEY,
    TAG_LAYOUT,
    TAG_GROUPED_KEYS,
    TAG_PREFETCH_SPEC,
    TAG_LOCK_MODE,
    TAG_TORCH_SIZE,
    TAG_TORCH_DTYPE,
    TAG_PREFETCH_HANDLE,
    TAG_ATTN_WINDOW,
    TAG_MEMORY_TAGS,
];

/// The identity of one stored KV chunk.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub chunk_hash: Vec<u8>,
    pub model_name: String,
    /// `(world_size<<24)|(global_rank<<16)|(local_world_size<<8)|local_rank`.
    pub kv_rank: i64,
    pub object_group_id: i64,
    /// Empty unless the trace records salts (the cache-salt variant of schema 2).
    pub cache_salt: String,
}

impl ObjectKey {
    /// `kv_rank` of a server that is its own whole world (world size 1, rank 0).
    pub const SINGLE_RANK: i64 = 1 << 24 | 1 << 8;

    /// A key of a single-rank server, object group 0, no salt: what generated traces use.
    pub fn single_rank(chunk_hash: Vec<u8>, model_name: &str) -> ObjectKey {
        ObjectKey {
            chunk_hash,
            model_name: model_name.to_owned(),
            kv_rank: ObjectKey::SINGLE_RANK,
            object_group_id: 0,
            cache_salt: String::new(),
        }
    }

    /// Appends the tagged key as LMCache 0.5.6 writes it: without `cache_salt`. The constant
    /// parts are copied as whole byte strings: this runs on the traced call's thread.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(KEY_HEAD.len() + self.chunk_hash.len() + self.model_name.len() + 48);
        out.extend_from_slice(KEY_HEAD);
        msgpack::put_bin(out, &self.chunk_hash);
        out.extend_from_slice(KEY_MODEL);
        msgpack::put_str(out, &self.model_name);
        out.extend_from_slice(KEY_RANK);
        msgpack::put_int(out, self.kv_rank);
        out.extend_from_slice(KEY_GROUP);
        msgpack::put_int(out, self.object_group_id);
    }
}

/// How LMCache 0.5.6 writes every key, `{"__t__": "ObjectKey", "v": {"chunk_hash": <bin>,
/// "model_name": <str>, "kv_rank": <int>, "object_group_id": <int>}}`: the constant runs
/// before each field's value. Encoding copies them whole, and the validator and the key reader
/// compare them whole.
pub(crate) const KEY_HEAD: &[u8; 31] = b"\x82\xa5__t__\xa9ObjectKey\xa1v\x84\xaachunk_hash";
pub(crate) const KEY_MODEL: &[u8; 11] = b"\xaamodel_name";
pub(crate) const KEY_RANK: &[u8; 8] = b"\xa7kv_rank";
pub(crate) const KEY_GROUP: &[u8; 16] = b"\xafobject_group_id";

/// Borrowed view of a tagged `ObjectKey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKeyRef<'a> {
    pub chunk_hash: &'a [u8],
    pub model_name: &'a str,
    pub kv_rank: i64,
    pub object_group_id: i64,
    pub cache_salt: Option<&'a str>,
}

impl<'a> ObjectKeyRef<'a> {
    pub fn from_raw(v: RawValue<'a>) -> Option<Self> {
        ObjectKeyRef::read(&mut Cursor::new(v))
    }

    pub fn to_owned(&self) -> ObjectKey {
        ObjectKey {
            chunk_hash: self.chunk_hash.to_vec(),
            model_name: self.model_name.to_owned(),
            kv_rank: self.kv_rank,
            object_group_id: self.object_group_id,
            cache_salt: self.cache_salt.unwrap_or_default().to_owned(),
        }
    }
}

impl<'a> ObjectKeyRef<'a> {
    /// Reads a tagged key at the cursor in one pass and leaves the cursor after it; the hot
    /// path of replay and `info`, which see every key of every call.
    pub fn read(c: &mut Cursor<'a>) -> Option<Self> {
        if let Some(key) = c.seen_key() {
            return Some(key);
        }
        // LMCache 0.5.6 writes every key with the same field names in the same order: the
        // constant runs are compared whole, and anything else takes the general path.
        let fast = c.clone();
        if let Some(key) = Self::read_canonical(c) {
            return Some(key);
        }
        *c = fast;
        read_tag(c, TAG_OBJECT_KEY)?;
        let (mut hash, mut model, mut rank, mut group, mut salt) = (None, None, None, None, None);
        // A repeated field keeps its first value, as every other lookup in kvtrace does.
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"chunk_hash" if hash.is_none() => hash = Some(c.bin()?),
                b"model_name" if model.is_none() => model = Some(c.str()?),
                b"kv_rank" if rank.is_none() => rank = Some(c.int()?),
                b"object_group_id" if group.is_none() => group = Some(c.int()?),
                b"cache_salt" if salt.is_none() => salt = Some(c.str()?),
                _ => c.skip()?,
            }
        }
        Some(ObjectKeyRef {
            chunk_hash: hash?,
            model_name: model?,
            kv_rank: rank?,
            object_group_id: group?,
            cache_salt: salt,
        })
    }

    /// A key in exactly the shape [`ObjectKey::encode`] writes.
    fn read_canonical(c: &mut Cursor<'a>) -> Option<Self> {
        if !c.eat(KEY_HEAD) {
            return None;
        }
        let chunk_hash = c.bin()?;
        let model_name = c.eat(KEY_MODEL).then(|| c.str())??;
        let kv_rank = c.eat(KEY_RANK).then(|| c.int())??;
        let object_group_id = c.eat(KEY_GROUP).then(|| c.int())??;
        Some(ObjectKeyRef {
            chunk_hash,
            model_name,
            kv_rank,
            object_group_id,
            cache_salt: None,
        })
    }
}

/// Reads `{"__t__": tag, "v": ...}` at the cursor up to the payload.
pub(crate) fn read_tag(c: &mut Cursor<'_>, tag: &str) -> Option<()> {
    let ok = c.map_len()? == 2
        && c.str_bytes()? == b"__t__"
        && c.str_bytes()? == tag.as_bytes()
        && c.str_bytes()? == b"v";
    ok.then_some(())
}

/// Reads an array of tagged keys at the cursor; `None` if any element is not a key.
pub(crate) fn read_object_keys<'a>(c: &mut Cursor<'a>) -> Option<Vec<ObjectKeyRef<'a>>> {
    let n = c.array_len()?;
    // The count is the record's claim: bounded by the frame's bytes, not trusted for size.
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        out.push(ObjectKeyRef::read(c)?);
    }
    Some(out)
}

/// Decodes an array of tagged keys; `None` if any element is not a key.
pub fn object_keys(v: RawValue<'_>) -> Option<Vec<ObjectKeyRef<'_>>> {
    read_object_keys(&mut Cursor::new(v))
}

/// Bytes per element of a `str(torch.dtype)` name.
pub fn dtype_size(dtype: &str) -> Option<u64> {
    let name = dtype.strip_prefix("torch.").unwrap_or(dtype);
    Some(match name {
        "bool" | "uint8" | "int8" | "float8_e4m3fn" | "float8_e4m3fnuz" | "float8_e5m2"
        | "float8_e5m2fnuz" | "float8_e8m0fnu" => 1,
        "float16" | "half" | "bfloat16" | "int16" | "short" | "uint16" => 2,
        "float32" | "float" | "int32" | "int" | "uint32" | "complex32" => 4,
        "float64" | "double" | "int64" | "long" | "uint64" | "complex64" => 8,
        "complex128" => 16,
        _ => return None,
    })
}

/// Shapes and dtypes of one stored object (one KV chunk).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemoryLayoutDesc {
    pub shapes: Vec<Vec<i64>>,
    /// `str(torch.dtype)`, e.g. `torch.bfloat16`.
    pub dtypes: Vec<String>,
}

impl MemoryLayoutDesc {
    pub fn from_raw(v: RawValue<'_>) -> Option<Self> {
        let [shapes, dtypes] = v.tagged(TAG_LAYOUT)?.fields(["shapes", "dtypes"])?;
        let shapes = shapes?
            .array()?
            .map(|s| s.array()?.map(|d| d.as_i64()).collect::<Option<Vec<_>>>())
            .collect::<Option<Vec<_>>>()?;
        let dtypes = dtypes?
            .array()?
            .map(|d| d.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?;
        Some(MemoryLayoutDesc { shapes, dtypes })
    }

    /// Bytes of one object: Σ over tensors of ∏ shape × dtype size. `None` for an unknown
    /// dtype or a negative or overflowing size.
    pub fn object_bytes(&self) -> Option<u64> {
        let mut total: u64 = 0;
        for (i, shape) in self.shapes.iter().enumerate() {
            let dtype = self.dtypes.get(i).or(self.dtypes.last())?;
            let mut n = dtype_size(dtype)?;
            for d in shape {
                n = n.checked_mul(u64::try_from(*d).ok()?)?;
            }
            total = total.checked_add(n)?;
        }
        Some(total)
    }

    /// Tokens per chunk under the standard KV layout `[2, layers, chunk_tokens, hidden]`.
    pub fn chunk_tokens(&self) -> Option<u64> {
        self.shapes
            .first()
            .filter(|s| s.len() == 4)
            .and_then(|s| u64::try_from(s[2]).ok())
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        msgpack::put_map_len(out, 2);
        msgpack::put_str(out, "__t__");
        msgpack::put_str(out, TAG_LAYOUT);
        msgpack::put_str(out, "v");
        msgpack::put_map_len(out, 2);
        msgpack::put_str(out, "shapes");
        msgpack::put_array_len(out, self.shapes.len());
        for shape in &self.shapes {
            msgpack::put_array_len(out, shape.len());
            for d in shape {
                msgpack::put_int(out, *d);
            }
        }
        msgpack::put_str(out, "dtypes");
        msgpack::put_array_len(out, self.dtypes.len());
        for d in &self.dtypes {
            msgpack::put_str(out, d);
        }
    }
}

/// What a call's layout says of its objects: their bytes (`None` for an unknown dtype or a
/// negative or overflowing shape) and the chunk's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutFigures {
    pub object_bytes: Option<u64>,
    pub chunk_tokens: Option<u64>,
}

/// The figures of every layout seen, by its encoded bytes. Every reservation and prefetch
/// group names its layout, a trace names one or a few, and parsing one (nested arrays and a
/// string per tensor) was a fifteenth of `info`: the last one is compared first, then the
/// others by hash, so that a trace of many layouts costs no more per call than one of few.
#[derive(Default)]
pub struct LayoutCache {
    last: Option<(Vec<u8>, Option<LayoutFigures>)>,
    seen: std::collections::HashMap<Vec<u8>, Option<LayoutFigures>>,
}

impl LayoutCache {
    /// The figures of the layout `v`; `None` when it is not a `MemoryLayoutDesc`.
    pub fn figures(&mut self, v: RawValue<'_>) -> Option<LayoutFigures> {
        let bytes = v.bytes();
        if let Some((last, figures)) = &self.last {
            if last.as_slice() == bytes {
                return *figures;
            }
        }
        let figures = match self.seen.get(bytes) {
            Some(figures) => *figures,
            None => {
                let figures = MemoryLayoutDesc::from_raw(v).map(|layout| LayoutFigures {
                    object_bytes: layout.object_bytes(),
                    chunk_tokens: layout.chunk_tokens(),
                });
                self.seen.insert(bytes.to_vec(), figures);
                figures
            }
        };
        match &mut self.last {
            Some((last, was)) => {
                last.clear();
                last.extend_from_slice(bytes);
                *was = figures;
            }
            None => self.last = Some((bytes.to_vec(), figures)),
        }
        figures
    }
}

/// Whether a prefetch holds read locks on what it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Lock,
    NoLock,
}

impl LockMode {
    pub fn from_raw(v: RawValue<'_>) -> Option<Self> {
        match v.tagged(TAG_LOCK_MODE)?.as_str()? {
            "LOCK" => Some(LockMode::Lock),
            "NO_LOCK" => Some(LockMode::NoLock),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LockMode::Lock => "LOCK",
            LockMode::NoLock => "NO_LOCK",
        }
    }
}

/// Keys of one object group sharing a layout.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedObjectKeys {
    pub keys: Vec<ObjectKey>,
    pub object_group_id: i64,
    pub layout_desc: MemoryLayoutDesc,
    /// `-1` for full attention.
    pub sliding_window_size: i64,
}

impl GroupedObjectKeys {
    pub fn encode(&self, out: &mut Vec<u8>) {
        msgpack::put_map_len(out, 2);
        msgpack::put_str(out, "__t__");
        msgpack::put_str(out, TAG_GROUPED_KEYS);
        msgpack::put_str(out, "v");
        msgpack::put_map_len(out, 4);
        msgpack::put_str(out, "keys");
        msgpack::put_array_len(out, self.keys.len());
        for k in &self.keys {
            k.encode(out);
        }
        msgpack::put_str(out, "object_group_id");
        msgpack::put_int(out, self.object_group_id);
        msgpack::put_str(out, "layout_desc");
        self.layout_desc.encode(out);
        msgpack::put_str(out, "sliding_window_size");
        msgpack::put_int(out, self.sliding_window_size);
    }
}

/// Borrowed view of a tagged `GroupedObjectKeys`.
#[derive(Clone, Copy, Debug)]
pub struct GroupedObjectKeysRef<'a> {
    pub keys: RawValue<'a>,
    pub object_group_id: i64,
    pub layout_desc: RawValue<'a>,
    pub sliding_window_size: i64,
}

impl<'a> GroupedObjectKeysRef<'a> {
    pub fn from_raw(v: RawValue<'a>) -> Option<Self> {
        let [keys, group, layout, window] = v.tagged(TAG_GROUPED_KEYS)?.fields([
            "keys",
            "object_group_id",
            "layout_desc",
            "sliding_window_size",
        ])?;
        let keys = keys?;
        keys.array()?;
        Some(GroupedObjectKeysRef {
            keys,
            object_group_id: group?.as_i64()?,
            layout_desc: layout?,
            sliding_window_size: window?.as_i64()?,
        })
    }

    pub fn keys(&self) -> Option<Vec<ObjectKeyRef<'a>>> {
        object_keys(self.keys)
    }

    pub fn layout(&self) -> Option<MemoryLayoutDesc> {
        MemoryLayoutDesc::from_raw(self.layout_desc)
    }
}

/// What a prefetch asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefetchTaskSpec {
    pub key_groups: Vec<GroupedObjectKeys>,
    pub num_kv_readers: i64,
    /// `prefix` keeps only the hit prefix; `full` keeps every hit.
    pub fetching_policy: String,
    pub lock_mode: LockMode,
}

impl PrefetchTaskSpec {
    /// The common case: one key group (object group 0, full attention) and one reader.
    pub fn single_group(
        keys: Vec<ObjectKey>,
        layout_desc: MemoryLayoutDesc,
        fetching_policy: &str,
        lock_mode: LockMode,
    ) -> PrefetchTaskSpec {
        PrefetchTaskSpec {
            key_groups: vec![GroupedObjectKeys {
                keys,
                object_group_id: 0,
                layout_desc,
                sliding_window_size: -1,
            }],
            num_kv_readers: 1,
            fetching_policy: fetching_policy.into(),
            lock_mode,
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        msgpack::put_map_len(out, 2);
        msgpack::put_str(out, "__t__");
        msgpack::put_str(out, TAG_PREFETCH_SPEC);
        msgpack::put_str(out, "v");
        msgpack::put_map_len(out, 4);
        msgpack::put_str(out, "key_groups");
        msgpack::put_array_len(out, self.key_groups.len());
        for g in &self.key_groups {
            g.encode(out);
        }
        msgpack::put_str(out, "num_kv_readers");
        msgpack::put_int(out, self.num_kv_readers);
        msgpack::put_str(out, "fetching_policy");
        msgpack::put_str(out, &self.fetching_policy);
        msgpack::put_str(out, "lock_mode");
        msgpack::put_map_len(out, 2);
        msgpack::put_str(out, "__t__");
        msgpack::put_str(out, TAG_LOCK_MODE);
        msgpack::put_str(out, "v");
        msgpack::put_str(out, self.lock_mode.name());
    }
}

/// Borrowed view of a tagged `PrefetchTaskSpec`, any schema.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchTaskSpecRef<'a> {
    pub key_groups: RawValue<'a>,
    pub num_kv_readers: i64,
    pub fetching_policy: &'a str,
    pub lock_mode: LockMode,
    /// Schema-2 (0.5.7) memory-tag filters; `None` when absent, a nil value when "all".
    pub allowed_l1_memory_tags: Option<RawValue<'a>>,
    pub allowed_l2_memory_tags: Option<RawValue<'a>>,
}

impl<'a> PrefetchTaskSpecRef<'a> {
    pub fn from_raw(v: RawValue<'a>) -> Option<Self> {
        let [groups, readers, policy, lock, l1_tags, l2_tags] =
            v.tagged(TAG_PREFETCH_SPEC)?.fields([
                "key_groups",
                "num_kv_readers",
                "fetching_policy",
                "lock_mode",
                "allowed_l1_memory_tags",
                "allowed_l2_memory_tags",
            ])?;
        let key_groups = groups?;
        key_groups.array()?;
        Some(PrefetchTaskSpecRef {
            key_groups,
            num_kv_readers: readers?.as_i64()?,
            fetching_policy: policy?.as_str()?,
            lock_mode: LockMode::from_raw(lock?)?,
            allowed_l1_memory_tags: l1_tags,
            allowed_l2_memory_tags: l2_tags,
        })
    }

    pub fn groups(&self) -> Option<Vec<GroupedObjectKeysRef<'a>>> {
        self.key_groups
            .array()?
            .map(GroupedObjectKeysRef::from_raw)
            .collect()
    }
}

/// Any codec-tagged value, decoded by tag.
#[derive(Clone, Debug)]
pub enum Tagged<'a> {
    Tuple(Items<'a>),
    Set(Items<'a>),
    ObjectKey(ObjectKeyRef<'a>),
    MemoryLayoutDesc(MemoryLayoutDesc),
    GroupedObjectKeys(GroupedObjectKeysRef<'a>),
    PrefetchTaskSpec(PrefetchTaskSpecRef<'a>),
    PrefetchLockMode(LockMode),
    TorchSize(Vec<i64>),
    TorchDtype(&'a str),
    /// Registered but never an argument of a traced call; kept as its payload map.
    PrefetchHandle(RawValue<'a>),
    AttnWindowDesc(RawValue<'a>),
    MemoryTags {
        segment: &'a str,
        residency: &'a str,
    },
    /// A tag kvtrace does not know; LMCache's replay skips such records.
    Unknown(&'a str, RawValue<'a>),
}

/// Decodes a codec-tagged value; `None` if `v` is not tagged or its payload is malformed.
pub fn decode_tagged(v: RawValue<'_>) -> Option<Tagged<'_>> {
    let (tag, p) = v.as_tagged()?;
    Some(match tag {
        TAG_TUPLE => Tagged::Tuple(p.array()?),
        TAG_SET => Tagged::Set(p.array()?),
        TAG_OBJECT_KEY => Tagged::ObjectKey(ObjectKeyRef::from_raw(v)?),
        TAG_LAYOUT => Tagged::MemoryLayoutDesc(MemoryLayoutDesc::from_raw(v)?),
        TAG_GROUPED_KEYS => Tagged::GroupedObjectKeys(GroupedObjectKeysRef::from_raw(v)?),
        TAG_PREFETCH_SPEC => Tagged::PrefetchTaskSpec(PrefetchTaskSpecRef::from_raw(v)?),
        TAG_LOCK_MODE => Tagged::PrefetchLockMode(LockMode::from_raw(v)?),
        TAG_TORCH_SIZE => Tagged::TorchSize(p.array()?.map(|d| d.as_i64()).collect::<Option<_>>()?),
        TAG_TORCH_DTYPE => Tagged::TorchDtype(p.as_str()?),
        TAG_PREFETCH_HANDLE if p.kind() == Kind::Map => Tagged::PrefetchHandle(p),
        TAG_ATTN_WINDOW if p.kind() == Kind::Map => Tagged::AttnWindowDesc(p),
        TAG_MEMORY_TAGS => Tagged::MemoryTags {
            segment: p.get("segment")?.as_str()?,
            residency: p.get("residency")?.as_str()?,
        },
        _ if KNOWN_TAGS.contains(&tag) => return None,
        _ => Tagged::Unknown(tag, p),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever layouts come and in whatever order — repeated, alternating, not a layout, of
    /// an unknown dtype, hundreds of distinct ones — the cache gives what parsing each gives.
    #[test]
    fn cached_layout_figures_are_each_layouts_own() {
        let encoded = |layout: &MemoryLayoutDesc| {
            let mut out = Vec::new();
            layout.encode(&mut out);
            out
        };
        let layout = |tokens: i64, dtype: &str| MemoryLayoutDesc {
            shapes: vec![vec![2, 4, tokens, 8]],
            dtypes: vec![dtype.to_owned()],
        };
        let mut values: Vec<Vec<u8>> = [16, 16, 32, 16, 32, 32]
            .iter()
            .map(|&t| encoded(&layout(t, "torch.bfloat16")))
            .collect();
        values.push(encoded(&layout(16, "torch.unheard_of")));
        values.push(vec![0x81, 0xa1, b'a', 0x01]);
        values.extend((1..300).map(|t| encoded(&layout(t, "torch.float32"))));
        values.push(encoded(&layout(16, "torch.bfloat16")));
        let mut cache = LayoutCache::default();
        for bytes in values.iter().chain(values.iter().rev()) {
            let v = RawValue::parse(bytes).expect("msgpack");
            let parsed = MemoryLayoutDesc::from_raw(v).map(|l| LayoutFigures {
                object_bytes: l.object_bytes(),
                chunk_tokens: l.chunk_tokens(),
            });
            assert_eq!(cache.figures(v), parsed, "{bytes:?}");
        }
        // Two bfloat16 layouts, the unknown dtype, the map that is none, 299 float32 ones.
        assert_eq!(cache.seen.len(), 303);
    }
}
