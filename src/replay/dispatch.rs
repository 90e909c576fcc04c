//! Turns a recorded record into a StorageManager call, for every qualname of every schema
//! variant: migrations are applied here (`extra_count = N` → `read_locks = N + 1`, the early
//! `mode` argument ignored, a spec-less early prefetch given a spec), and
//! `read_prefetched_results` entries and exits are paired FIFO per key list.
//!
//! Decoding and applying are two steps, so that the client-session model can act between
//! them (the end of the previous session lands before the next call). Keys are hashed
//! straight out of the record — nothing is copied — and when the replay is itself recorded,
//! each call is published with the recorded argument bytes unchanged.

use std::collections::{HashMap, VecDeque};

use crate::bus::Tracer;
use crate::lmct::calls::{
    FINISH_READ_PREFETCHED, FINISH_WRITE, READ_PREFETCHED_ENTER, READ_PREFETCHED_EXIT,
    RECORDER_SUMMARY, RESERVE_WRITE, SUBMIT_PREFETCH_TASK,
};
use crate::lmct::codec::{
    MemoryLayoutDesc, ObjectKeyRef, TAG_GROUPED_KEYS, TAG_LOCK_MODE, TAG_PREFETCH_SPEC,
};
use crate::lmct::msgpack::{Cursor, RawValue};
use crate::lmct::RecordRef;
use crate::storage::{
    KeyId, PrefetchGroup, PrefetchOutcome, PrefetchRequest, Reservation, StorageManager,
};

/// What happened to one record.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The call ran; `detail` says what it did (e.g. `reserved 3, not writable 2`).
    Ok { detail: String },
    /// The call raised (a tier's I/O failed): LMCache's "failed".
    Failed { reason: String },
    /// No call was made: unknown qualname, undecodable arguments, unpaired exit, or
    /// kvtrace's own trailer.
    Skipped { reason: String },
}

/// A record's StorageManager call, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    ReserveWrite {
        keys: Vec<KeyId>,
        object_bytes: u64,
    },
    FinishWrite {
        keys: Vec<KeyId>,
    },
    Prefetch {
        groups: Vec<PrefetchGroup>,
        prefix_only: bool,
        readers: u64,
        lock: bool,
        skip_l2: bool,
        request_id: String,
    },
    ReadEnter {
        keys: Vec<KeyId>,
    },
    ReadExit {
        keys: Vec<KeyId>,
    },
    FinishRead {
        keys: Vec<KeyId>,
        read_locks: i64,
    },
}

impl Call {
    pub fn qualname(&self) -> &'static str {
        match self {
            Call::ReserveWrite { .. } => RESERVE_WRITE,
            Call::FinishWrite { .. } => FINISH_WRITE,
            Call::Prefetch { .. } => SUBMIT_PREFETCH_TASK,
            Call::ReadEnter { .. } => READ_PREFETCHED_ENTER,
            Call::ReadExit { .. } => READ_PREFETCHED_EXIT,
            Call::FinishRead { .. } => FINISH_READ_PREFETCHED,
        }
    }

    /// The keys the call names (a prefetch's: every group's, row by row).
    pub fn keys(&self) -> impl Iterator<Item = KeyId> + '_ {
        let (flat, groups): (&[KeyId], &[PrefetchGroup]) = match self {
            Call::Prefetch { groups, .. } => (&[], groups),
            Call::ReserveWrite { keys, .. }
            | Call::FinishWrite { keys }
            | Call::ReadEnter { keys }
            | Call::ReadExit { keys }
            | Call::FinishRead { keys, .. } => (keys, &[]),
        };
        flat.iter()
            .chain(groups.iter().flat_map(|g| g.keys.iter()))
            .copied()
    }
}

/// What an applied call did, for the session model and the fidelity check.
#[derive(Clone, Debug)]
pub enum Effect {
    Reserved(Reservation),
    Admitted(Vec<KeyId>),
    Prefetched(PrefetchOutcome),
    Read { ok: bool },
    None,
}

/// Open `read_prefetched_results` contexts of one key list, oldest first: the entry's
/// argument bytes (to publish a closing exit) and whether the entry succeeded.
type OpenContexts = VecDeque<(Vec<u8>, bool)>;

/// A record's arguments, read in one pass.
#[derive(Default)]
struct Args<'a> {
    keys: Option<Vec<KeyId>>,
    layout: Option<RawValue<'a>>,
    spec: Option<Spec>,
    request_id: Option<&'a str>,
    skip_l2: Option<bool>,
    read_locks: Option<i64>,
    extra_count: Option<i64>,
}

struct Spec {
    groups: Vec<PrefetchGroup>,
    prefix_only: bool,
    readers: u64,
    lock: bool,
}

fn expect_tag(c: &mut Cursor<'_>, tag: &str) -> Option<()> {
    let ok = c.map_len()? == 2
        && c.str_bytes()? == b"__t__"
        && c.str_bytes()? == tag.as_bytes()
        && c.str_bytes()? == b"v";
    ok.then_some(())
}

/// Decodes records and applies them in order onto a StorageManager.
#[derive(Default)]
pub struct Dispatcher {
    open: HashMap<Vec<KeyId>, OpenContexts>,
    /// Object bytes and chunk tokens of the layouts seen, by their encoded bytes.
    layouts: Vec<(Vec<u8>, u64, Option<u64>)>,
}

/// Hashes every key of the array at the cursor.
fn read_key_ids(c: &mut Cursor<'_>) -> Option<Vec<KeyId>> {
    let n = c.array_len()?;
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        out.push(KeyId::of_ref(&ObjectKeyRef::read(c)?));
    }
    Some(out)
}

/// `read_locks`, or the pre-rename `extra_count = N` meaning `N + 1`; default 1.
fn read_locks(locks: Option<i64>, extra: Option<i64>) -> i64 {
    match (locks, extra) {
        (Some(n), _) => n,
        (None, Some(n)) => n.saturating_add(1),
        (None, None) => 1,
    }
}

fn skipped(reason: impl Into<String>) -> Outcome {
    Outcome::Skipped {
        reason: reason.into(),
    }
}

impl Dispatcher {
    /// Object bytes and chunk tokens of a layout, parsed once per distinct layout.
    fn layout(&mut self, v: Option<RawValue<'_>>) -> Result<(u64, Option<u64>), String> {
        let v = v.ok_or("missing argument layout_desc")?;
        if let Some((_, size, tokens)) = self.layouts.iter().find(|(b, _, _)| b == v.bytes()) {
            return Ok((*size, *tokens));
        }
        let layout = MemoryLayoutDesc::from_raw(v).ok_or("layout_desc: not a MemoryLayoutDesc")?;
        let size = layout
            .object_bytes()
            .filter(|&s| s > 0)
            .ok_or("layout_desc: no object size (unknown dtype, empty or overflowing shape)")?;
        let entry = (size, layout.chunk_tokens());
        self.layouts.push((v.bytes().to_vec(), entry.0, entry.1));
        Ok(entry)
    }

    /// One `GroupedObjectKeys` at the cursor.
    fn read_group(&mut self, c: &mut Cursor<'_>) -> Option<PrefetchGroup> {
        expect_tag(c, TAG_GROUPED_KEYS)?;
        let mut group = PrefetchGroup {
            window: -1,
            ..PrefetchGroup::default()
        };
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"keys" => group.keys = read_key_ids(c)?,
                b"layout_desc" => {
                    (group.object_bytes, group.chunk_tokens) = self.layout(Some(c.value()?)).ok()?
                }
                b"sliding_window_size" => group.window = c.int()?,
                _ => c.skip()?,
            }
        }
        Some(group)
    }

    /// A `PrefetchTaskSpec` at the cursor.
    fn read_spec(&mut self, c: &mut Cursor<'_>) -> Option<Spec> {
        expect_tag(c, TAG_PREFETCH_SPEC)?;
        let mut spec = Spec {
            groups: Vec::new(),
            prefix_only: true,
            readers: 1,
            lock: true,
        };
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"key_groups" => {
                    for _ in 0..c.array_len()? {
                        spec.groups.push(self.read_group(c)?);
                    }
                }
                b"num_kv_readers" => spec.readers = c.int()?.max(0) as u64,
                b"fetching_policy" => spec.prefix_only = c.str_bytes()? != b"full",
                b"lock_mode" => {
                    expect_tag(c, TAG_LOCK_MODE)?;
                    spec.lock = c.str_bytes()? != b"NO_LOCK";
                }
                _ => c.skip()?,
            }
        }
        Some(spec)
    }

    /// Reads every argument in one pass.
    fn parse_args<'a>(&mut self, args: RawValue<'a>) -> Result<Args<'a>, String> {
        let mut c = Cursor::new(args);
        let mut out = Args::default();
        let n = c.map_len().ok_or("args: not a map")?;
        for _ in 0..n {
            let key = c.str_bytes().ok_or("args: keys must be strings")?;
            let bad = |name: &str| format!("{name}: unexpected value");
            match key {
                b"keys" => {
                    out.keys = Some(read_key_ids(&mut c).ok_or("keys: not a list of ObjectKey")?)
                }
                b"layout_desc" => out.layout = Some(c.value().ok_or_else(|| bad("layout_desc"))?),
                b"spec" => {
                    out.spec = Some(
                        self.read_spec(&mut c)
                            .ok_or("spec: not a PrefetchTaskSpec")?,
                    )
                }
                b"external_request_id" => {
                    out.request_id = Some(c.str().ok_or_else(|| bad("external_request_id"))?)
                }
                b"skip_l2" => out.skip_l2 = c.value().and_then(|v| v.as_bool()),
                b"read_locks" => out.read_locks = Some(c.int().ok_or_else(|| bad("read_locks"))?),
                b"extra_count" => {
                    out.extra_count = Some(c.int().ok_or_else(|| bad("extra_count"))?)
                }
                _ => c.skip().ok_or("args: malformed")?,
            }
        }
        Ok(out)
    }

    /// Decodes the call a record describes; `Err` is the outcome of a record that makes no
    /// call (skipped).
    pub fn decode(&mut self, record: &RecordRef<'_>) -> Result<Call, Outcome> {
        self.try_decode(record).map_err(|reason| match reason {
            Some(r) => skipped(r),
            None => skipped(format!("no handler for qualname {:?}", record.qualname)),
        })
    }

    fn try_decode(&mut self, record: &RecordRef<'_>) -> Result<Call, Option<String>> {
        match record.qualname {
            RECORDER_SUMMARY => return Err(Some("kvtrace recorder trailer".into())),
            RESERVE_WRITE
            | FINISH_WRITE
            | SUBMIT_PREFETCH_TASK
            | READ_PREFETCHED_ENTER
            | READ_PREFETCHED_EXIT
            | FINISH_READ_PREFETCHED => {}
            _ => return Err(None),
        }
        let parsed = self.parse_args(record.args).map_err(Some)?;
        let keys = || {
            parsed
                .keys
                .clone()
                .ok_or(Some("missing argument keys".to_string()))
        };
        Ok(match record.qualname {
            RESERVE_WRITE => Call::ReserveWrite {
                object_bytes: self.layout(parsed.layout).map_err(Some)?.0,
                keys: keys()?,
            },
            FINISH_WRITE => Call::FinishWrite { keys: keys()? },
            SUBMIT_PREFETCH_TASK => {
                let spec = match parsed.spec {
                    Some(spec) => spec,
                    // The early shape: keys and a layout instead of a spec.
                    None => {
                        let (object_bytes, chunk_tokens) =
                            self.layout(parsed.layout).map_err(Some)?;
                        Spec {
                            groups: vec![PrefetchGroup {
                                keys: keys()?,
                                object_bytes,
                                chunk_tokens,
                                window: -1,
                            }],
                            prefix_only: true,
                            readers: read_locks(None, parsed.extra_count).max(0) as u64,
                            lock: true,
                        }
                    }
                };
                Call::Prefetch {
                    groups: spec.groups,
                    prefix_only: spec.prefix_only,
                    readers: spec.readers,
                    lock: spec.lock,
                    skip_l2: parsed.skip_l2.unwrap_or(false),
                    request_id: parsed.request_id.unwrap_or("").to_owned(),
                }
            }
            READ_PREFETCHED_ENTER => Call::ReadEnter { keys: keys()? },
            READ_PREFETCHED_EXIT => Call::ReadExit { keys: keys()? },
            _ => Call::FinishRead {
                keys: keys()?,
                read_locks: read_locks(parsed.read_locks, parsed.extra_count),
            },
        })
    }

    /// Issues a decoded call; `args` are the recorded argument bytes, republished as they are.
    pub fn apply(
        &mut self,
        sm: &mut StorageManager,
        tracer: &Tracer,
        call: &Call,
        args: &[u8],
    ) -> (Outcome, Effect) {
        let republish = || tracer.publish_call(call.qualname(), |buf| buf.extend_from_slice(args));
        let ok = |detail: String| Outcome::Ok { detail };
        if let Call::ReadExit { keys } = call {
            return match self.open.get_mut(keys).and_then(VecDeque::pop_front) {
                Some((_, entered)) => {
                    republish();
                    sm.read_prefetched_exit(keys, entered);
                    (ok("closed".into()), Effect::None)
                }
                None => (
                    skipped("read_prefetched_results exit without a matching entry"),
                    Effect::None,
                ),
            };
        }
        republish();
        match call {
            Call::ReserveWrite { keys, object_bytes } => {
                let r = sm.reserve_write(keys, *object_bytes);
                let mut detail = format!(
                    "reserved {}, not writable {}",
                    r.reserved.len(),
                    r.not_writable
                );
                if r.out_of_memory {
                    detail.push_str(", OUT_OF_MEMORY");
                }
                (ok(detail), Effect::Reserved(r))
            }
            Call::FinishWrite { keys } => match sm.finish_write(keys) {
                Ok(admitted) => (
                    ok(format!("admitted {}", admitted.len())),
                    Effect::Admitted(admitted),
                ),
                Err(e) => (
                    Outcome::Failed {
                        reason: e.to_string(),
                    },
                    Effect::None,
                ),
            },
            Call::Prefetch {
                groups,
                prefix_only,
                readers,
                lock,
                skip_l2,
                request_id,
            } => {
                let request = PrefetchRequest {
                    groups,
                    prefix_only: *prefix_only,
                    readers: *readers,
                    lock: *lock,
                    skip_l2: *skip_l2,
                };
                match sm.submit_prefetch(&request, request_id) {
                    Ok(o) => (
                        ok(format!(
                            "hit {}/{} chunks (L1 {}, L2 {})",
                            o.hit_chunks, o.requested_chunks, o.l1_hit_chunks, o.l2_hit_chunks
                        )),
                        Effect::Prefetched(o),
                    ),
                    Err(e) => (
                        Outcome::Failed {
                            reason: e.to_string(),
                        },
                        Effect::None,
                    ),
                }
            }
            Call::ReadEnter { keys } => {
                let result = sm.read_prefetched_enter(keys);
                self.open
                    .entry(keys.clone())
                    .or_default()
                    .push_back((args.to_vec(), result.is_ok()));
                let detail = match &result {
                    Ok(()) => "read".to_string(),
                    // A miss, as LMCache's "Failed to read prefetched object": the reader
                    // gets nothing, the call itself does not raise.
                    Err(e) => format!("miss: {e}"),
                };
                (ok(detail), Effect::Read { ok: result.is_ok() })
            }
            Call::FinishRead { keys, read_locks } => {
                sm.finish_read_prefetched(keys, *read_locks);
                (
                    ok(format!("released {read_locks} lock(s) per key")),
                    Effect::None,
                )
            }
            Call::ReadExit { .. } => unreachable!("handled above"),
        }
    }

    /// Closes contexts whose exit was never recorded (in key order, deterministic); returns
    /// how many.
    pub fn close_open_contexts(&mut self, sm: &mut StorageManager, tracer: &Tracer) -> u64 {
        let mut left: Vec<(Vec<KeyId>, OpenContexts)> = self.open.drain().collect();
        left.sort_by(|a, b| a.0.cmp(&b.0));
        let mut n = 0;
        for (ids, queue) in left {
            for (args, entered) in queue {
                tracer.publish_call(READ_PREFETCHED_EXIT, |buf| buf.extend_from_slice(&args));
                sm.read_prefetched_exit(&ids, entered);
                n += 1;
            }
        }
        n
    }
}
