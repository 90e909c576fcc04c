//! Turns a recorded record into a StorageManager call, for every qualname of every schema
//! variant: migrations are applied here (`extra_count = N` → `read_locks = N + 1`, the early
//! `mode` argument ignored, a spec-less early prefetch given a spec), and
//! `read_prefetched_results` entries and exits are paired FIFO per key list.
//!
//! Keys are hashed straight out of the record — nothing is copied — and when the replay is
//! itself recorded, each call is published with the recorded argument bytes unchanged.

use std::collections::{HashMap, VecDeque};

use crate::lmct::calls::{
    FINISH_READ_PREFETCHED, FINISH_WRITE, READ_PREFETCHED_ENTER, READ_PREFETCHED_EXIT,
    RECORDER_SUMMARY, RESERVE_WRITE, SUBMIT_PREFETCH_TASK,
};
use crate::lmct::codec::{
    MemoryLayoutDesc, ObjectKeyRef, TAG_GROUPED_KEYS, TAG_LOCK_MODE, TAG_PREFETCH_SPEC,
};
use crate::lmct::msgpack::{Cursor, RawValue};
use crate::lmct::RecordRef;
use crate::storage::{KeyId, PrefetchGroup, PrefetchOutcome, PrefetchRequest, StorageManager};

/// What happened to one record.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The call ran; `detail` says what it did (e.g. `reserved 3, not writable 2`).
    Ok { detail: String },
    /// The call ran and failed.
    Failed { reason: String },
    /// No call was made: unknown qualname, undecodable arguments, unpaired exit, or
    /// kvtrace's own trailer.
    Skipped { reason: String },
}

/// Open `read_prefetched_results` contexts of one key list, oldest first: the entry's
/// argument bytes (to publish a closing exit) and whether the entry succeeded.
type OpenContexts = VecDeque<(Vec<u8>, bool)>;

/// A record's arguments, read in one pass.
#[derive(Default)]
struct Args<'a> {
    has_keys: bool,
    layout: Option<RawValue<'a>>,
    /// `(groups, prefix_only, read_locks)` of a spec.
    spec: Option<(Vec<PrefetchGroup>, bool, u64)>,
    request_id: Option<&'a str>,
    skip_l2: Option<bool>,
    read_locks: Option<i64>,
    extra_count: Option<i64>,
}

fn expect_tag(c: &mut Cursor<'_>, tag: &str) -> Option<()> {
    let ok = c.map_len()? == 2
        && c.str_bytes()? == b"__t__"
        && c.str_bytes()? == tag.as_bytes()
        && c.str_bytes()? == b"v";
    ok.then_some(())
}

/// Dispatches records in order onto a StorageManager.
#[derive(Default)]
pub struct Dispatcher {
    open: HashMap<Vec<KeyId>, OpenContexts>,
    /// Object bytes and chunk tokens of the layouts seen, by their encoded bytes.
    layouts: Vec<(Vec<u8>, u64, Option<u64>)>,
    keys: Vec<KeyId>,
    /// Every prefetch's outcome, in order.
    pub prefetches: Vec<PrefetchOutcome>,
}

/// Hashes every key of the array at the cursor into `out`.
fn read_key_ids(c: &mut Cursor<'_>, out: &mut Vec<KeyId>) -> Option<()> {
    out.clear();
    for _ in 0..c.array_len()? {
        out.push(KeyId::of_ref(&ObjectKeyRef::read(c)?));
    }
    Some(())
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
        let entry = (layout.object_bytes().unwrap_or(0), layout.chunk_tokens());
        self.layouts.push((v.bytes().to_vec(), entry.0, entry.1));
        Ok(entry)
    }

    /// One `GroupedObjectKeys` at the cursor.
    fn read_group(&mut self, c: &mut Cursor<'_>) -> Option<PrefetchGroup> {
        expect_tag(c, TAG_GROUPED_KEYS)?;
        let mut group = PrefetchGroup::default();
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"keys" => read_key_ids(c, &mut group.keys)?,
                b"layout_desc" => {
                    (group.object_bytes, group.chunk_tokens) = self.layout(Some(c.value()?)).ok()?
                }
                _ => c.skip()?,
            }
        }
        Some(group)
    }

    /// A `PrefetchTaskSpec` at the cursor: its groups, whether it keeps only the prefix, and
    /// the read locks it takes per kept key.
    fn read_spec(&mut self, c: &mut Cursor<'_>) -> Option<(Vec<PrefetchGroup>, bool, u64)> {
        expect_tag(c, TAG_PREFETCH_SPEC)?;
        let (mut groups, mut prefix_only, mut readers, mut lock) = (Vec::new(), true, 1i64, true);
        for _ in 0..c.map_len()? {
            match c.str_bytes()? {
                b"key_groups" => {
                    for _ in 0..c.array_len()? {
                        groups.push(self.read_group(c)?);
                    }
                }
                b"num_kv_readers" => readers = c.int()?,
                b"fetching_policy" => prefix_only = c.str_bytes()? != b"full",
                b"lock_mode" => {
                    expect_tag(c, TAG_LOCK_MODE)?;
                    lock = c.str_bytes()? != b"NO_LOCK";
                }
                _ => c.skip()?,
            }
        }
        let locks = if lock { readers.max(0) as u64 } else { 0 };
        Some((groups, prefix_only, locks))
    }

    /// Reads every argument in one pass; keys go to `self.keys`.
    fn parse_args<'a>(&mut self, args: RawValue<'a>) -> Result<Args<'a>, String> {
        let mut c = Cursor::new(args);
        let mut out = Args::default();
        let mut ids = std::mem::take(&mut self.keys);
        let n = c.map_len().ok_or("args: not a map")?;
        for _ in 0..n {
            let key = c.str_bytes().ok_or("args: keys must be strings")?;
            let bad = |name: &str| format!("{name}: unexpected value");
            match key {
                b"keys" => {
                    read_key_ids(&mut c, &mut ids).ok_or("keys: not a list of ObjectKey")?;
                    out.has_keys = true;
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
        self.keys = ids;
        Ok(out)
    }

    /// Issues the call a record describes.
    pub fn dispatch(&mut self, sm: &mut StorageManager, record: &RecordRef<'_>) -> Outcome {
        match self.try_dispatch(sm, record) {
            Ok(outcome) => outcome,
            Err(reason) => skipped(reason),
        }
    }

    fn try_dispatch(
        &mut self,
        sm: &mut StorageManager,
        record: &RecordRef<'_>,
    ) -> Result<Outcome, String> {
        let qualname: &'static str = match record.qualname {
            RECORDER_SUMMARY => return Ok(skipped("kvtrace recorder trailer")),
            RESERVE_WRITE => RESERVE_WRITE,
            FINISH_WRITE => FINISH_WRITE,
            SUBMIT_PREFETCH_TASK => SUBMIT_PREFETCH_TASK,
            READ_PREFETCHED_ENTER => READ_PREFETCHED_ENTER,
            READ_PREFETCHED_EXIT => READ_PREFETCHED_EXIT,
            FINISH_READ_PREFETCHED => FINISH_READ_PREFETCHED,
            other => return Ok(skipped(format!("no handler for qualname {other:?}"))),
        };
        let parsed = self.parse_args(record.args)?;
        let needs_keys = qualname != SUBMIT_PREFETCH_TASK || parsed.spec.is_none();
        if needs_keys && !parsed.has_keys {
            return Err("missing argument keys".into());
        }
        let args = record.args.bytes();
        let publish =
            |sm: &StorageManager| sm.publish_raw(qualname, |buf| buf.extend_from_slice(args));
        let ids = std::mem::take(&mut self.keys);
        let outcome = match qualname {
            RESERVE_WRITE => {
                let (size, _) = self.layout(parsed.layout)?;
                publish(sm);
                let r = sm.reserve_write_ids(&ids, size);
                let mut detail =
                    format!("reserved {}, not writable {}", r.reserved, r.not_writable);
                if r.out_of_memory {
                    let pending = ids.len() as u64 - r.not_writable;
                    detail.push_str(&format!(", OUT_OF_MEMORY for {pending} keys"));
                }
                Outcome::Ok { detail }
            }
            FINISH_WRITE => {
                publish(sm);
                match sm.finish_write_ids(&ids) {
                    Ok(n) => Outcome::Ok {
                        detail: format!("admitted {n}"),
                    },
                    Err(e) => Outcome::Failed {
                        reason: e.to_string(),
                    },
                }
            }
            SUBMIT_PREFETCH_TASK => {
                let (groups, prefix_only, read_locks) = match parsed.spec {
                    Some(spec) => spec,
                    // The early shape: keys and a layout instead of a spec.
                    None => {
                        let (object_bytes, chunk_tokens) = self.layout(parsed.layout)?;
                        let group = PrefetchGroup {
                            keys: ids.clone(),
                            object_bytes,
                            chunk_tokens,
                        };
                        let locks = read_locks(None, parsed.extra_count).max(0) as u64;
                        (vec![group], true, locks)
                    }
                };
                let request = PrefetchRequest {
                    groups: &groups,
                    prefix_only,
                    read_locks,
                    skip_l2: parsed.skip_l2.unwrap_or(false),
                };
                publish(sm);
                match sm.submit_prefetch_ids(&request, parsed.request_id.unwrap_or("")) {
                    Ok(o) => {
                        let detail = format!(
                            "hit {}/{} chunks (L1 {}, L2 {})",
                            o.hit_chunks, o.requested_chunks, o.l1_hit_chunks, o.l2_hit_chunks
                        );
                        self.prefetches.push(o);
                        Outcome::Ok { detail }
                    }
                    Err(e) => Outcome::Failed {
                        reason: e.to_string(),
                    },
                }
            }
            READ_PREFETCHED_ENTER => {
                publish(sm);
                let result = sm.read_prefetched_enter_ids(&ids);
                self.open
                    .entry(ids.clone())
                    .or_default()
                    .push_back((args.to_vec(), result.is_ok()));
                match result {
                    Ok(()) => Outcome::Ok {
                        detail: "read".into(),
                    },
                    Err(e) => Outcome::Failed {
                        reason: e.to_string(),
                    },
                }
            }
            READ_PREFETCHED_EXIT => match self.open.get_mut(&ids).and_then(VecDeque::pop_front) {
                Some((_, entered)) => {
                    publish(sm);
                    sm.read_prefetched_exit_ids(&ids, entered);
                    Outcome::Ok {
                        detail: "closed".into(),
                    }
                }
                None => skipped("read_prefetched_results exit without a matching entry"),
            },
            _ => {
                let n = read_locks(parsed.read_locks, parsed.extra_count);
                publish(sm);
                sm.finish_read_prefetched_ids(&ids, n);
                Outcome::Ok {
                    detail: format!("released {n} lock(s) per key"),
                }
            }
        };
        self.keys = ids;
        Ok(outcome)
    }

    /// Closes contexts whose exit was never recorded (in key order, deterministic); returns
    /// how many.
    pub fn close_open_contexts(&mut self, sm: &mut StorageManager) -> u64 {
        let mut left: Vec<(Vec<KeyId>, OpenContexts)> = self.open.drain().collect();
        left.sort_by(|a, b| a.0.cmp(&b.0));
        let mut n = 0;
        for (ids, queue) in left {
            for (args, entered) in queue {
                sm.publish_raw(READ_PREFETCHED_EXIT, |buf| buf.extend_from_slice(&args));
                sm.read_prefetched_exit_ids(&ids, entered);
                n += 1;
            }
        }
        n
    }
}
