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
use crate::lmct::args::{Arg, CallArgs, Keys, PrefetchSpec};
use crate::lmct::calls::{
    FINISH_READ_PREFETCHED, FINISH_WRITE, READ_PREFETCHED_ENTER, READ_PREFETCHED_EXIT,
    RECORDER_SUMMARY, RESERVE_WRITE, SUBMIT_PREFETCH_TASK,
};
use crate::lmct::codec::LayoutCache;
use crate::lmct::msgpack::RawValue;
use crate::lmct::RecordRef;
use crate::storage::{
    CallError, KeyId, PrefetchGroup, PrefetchOutcome, PrefetchRequest, Reservation, StorageManager,
};

/// What happened to one record.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The call ran; `detail` says what it did (e.g. `reserved 3, not writable 2`).
    Ok { detail: Detail },
    /// The call raised (a tier's I/O failed): LMCache's "failed".
    Failed { reason: String },
    /// No call was made: unknown qualname, undecodable arguments, unpaired exit, or
    /// kvtrace's own trailer.
    Skipped { reason: String },
}

/// What a call that ran did. Kept as figures and written out only where a per-record line
/// asks for it: formatting a sentence for each of a trace's calls cost more than many of the
/// calls themselves.
#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    Reserved {
        reserved: usize,
        not_writable: u64,
        out_of_memory: bool,
    },
    Admitted(usize),
    Prefetched {
        hit: u64,
        requested: u64,
        l1: u64,
        l2: u64,
    },
    Closed,
    Read,
    /// A miss, as LMCache's "Failed to read prefetched object": the reader gets nothing, the
    /// call itself does not raise.
    Missed(CallError),
    Released(i64),
}

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Detail::Reserved {
                reserved,
                not_writable,
                out_of_memory,
            } => {
                write!(f, "reserved {reserved}, not writable {not_writable}")?;
                if *out_of_memory {
                    f.write_str(", OUT_OF_MEMORY")?;
                }
                Ok(())
            }
            Detail::Admitted(n) => write!(f, "admitted {n}"),
            Detail::Prefetched {
                hit,
                requested,
                l1,
                l2,
            } => write!(f, "hit {hit}/{requested} chunks (L1 {l1}, L2 {l2})"),
            Detail::Closed => f.write_str("closed"),
            Detail::Read => f.write_str("read"),
            Detail::Missed(e) => write!(f, "miss: {e}"),
            Detail::Released(n) => write!(f, "released {n} lock(s) per key"),
        }
    }
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

/// Turns records into calls. Separate from [`Dispatcher`] so that decoding can run ahead of
/// the calls on another thread: it depends on nothing the calls change.
#[derive(Default)]
pub struct Decoder {
    layouts: LayoutCache,
}

/// Applies decoded calls in order onto a StorageManager.
#[derive(Default)]
pub struct Dispatcher {
    open: HashMap<Vec<KeyId>, OpenContexts>,
}

/// The ids of a list of keys.
fn key_ids(keys: &Keys<'_>) -> Vec<KeyId> {
    let mut ids = Vec::new();
    KeyId::of_refs(&keys.keys, &mut ids);
    ids
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

impl Decoder {
    /// Object bytes and chunk tokens of a layout, parsed once per distinct layout.
    fn layout(&mut self, v: Option<RawValue<'_>>) -> Result<(u64, Option<u64>), String> {
        let v = v.ok_or("missing argument layout_desc")?;
        let figures = self
            .layouts
            .figures(v)
            .ok_or("layout_desc: not a MemoryLayoutDesc")?;
        let size = figures
            .object_bytes
            .filter(|&s| s > 0)
            .ok_or("layout_desc: no object size (unknown dtype, empty or overflowing shape)")?;
        Ok((size, figures.chunk_tokens))
    }

    /// A prefetch spec's groups with their layouts resolved; `None` when a layout is not one.
    fn groups(&mut self, spec: &PrefetchSpec<'_>) -> Option<Vec<PrefetchGroup>> {
        spec.groups
            .iter()
            .map(|g| {
                let (object_bytes, chunk_tokens) = match g.layout_desc {
                    Some(layout) => self.layout(Some(layout)).ok()?,
                    None => (0, None),
                };
                Some(PrefetchGroup {
                    keys: key_ids(&g.keys),
                    object_bytes,
                    chunk_tokens,
                    window: g.window,
                })
            })
            .collect()
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
        let args = CallArgs::of(record).ok_or_else(|| Some("args: not a map".to_string()))?;
        let bad = |name: &str| Some(format!("{name}: unexpected value"));
        let mut keys = match &args.keys {
            Arg::Valid(keys) => Some(key_ids(keys)),
            Arg::Malformed => return Err(Some("keys: not a list of ObjectKey".into())),
            Arg::Absent => None,
        };
        // Each call takes the list at most once.
        let mut keys = || {
            keys.take()
                .ok_or_else(|| Some("missing argument keys".to_string()))
        };
        let spec = match &args.spec {
            Arg::Valid(spec) => Some(spec),
            Arg::Malformed => return Err(Some("spec: not a PrefetchTaskSpec".into())),
            Arg::Absent => None,
        };
        for (name, malformed) in [
            ("external_request_id", args.request_id == Arg::Malformed),
            ("read_locks", args.read_locks == Arg::Malformed),
            ("extra_count", args.extra_count == Arg::Malformed),
        ] {
            if malformed {
                return Err(bad(name));
            }
        }
        let (locks, extra_count) = (args.read_locks.valid(), args.extra_count.valid());
        Ok(match record.qualname {
            RESERVE_WRITE => Call::ReserveWrite {
                object_bytes: self.layout(args.layout_desc).map_err(Some)?.0,
                keys: keys()?,
            },
            FINISH_WRITE => Call::FinishWrite { keys: keys()? },
            SUBMIT_PREFETCH_TASK => {
                let (groups, prefix_only, readers, lock) = match spec {
                    Some(spec) => (
                        self.groups(spec)
                            .ok_or_else(|| Some("spec: not a PrefetchTaskSpec".to_string()))?,
                        spec.prefix_only,
                        spec.readers,
                        spec.lock,
                    ),
                    // The early shape: keys and a layout instead of a spec.
                    None => {
                        let (object_bytes, chunk_tokens) =
                            self.layout(args.layout_desc).map_err(Some)?;
                        let group = PrefetchGroup {
                            keys: keys()?,
                            object_bytes,
                            chunk_tokens,
                            window: -1,
                        };
                        let readers = read_locks(None, extra_count.copied()).max(0) as u64;
                        (vec![group], true, readers, true)
                    }
                };
                Call::Prefetch {
                    groups,
                    prefix_only,
                    readers,
                    lock,
                    skip_l2: args.skip_l2.valid().copied().unwrap_or(false),
                    request_id: args.request_id.valid().copied().unwrap_or("").to_owned(),
                }
            }
            READ_PREFETCHED_ENTER => Call::ReadEnter { keys: keys()? },
            READ_PREFETCHED_EXIT => Call::ReadExit { keys: keys()? },
            _ => Call::FinishRead {
                keys: keys()?,
                read_locks: read_locks(locks.copied(), extra_count.copied()),
            },
        })
    }
}

impl Dispatcher {
    /// Issues a decoded call; `args` are the recorded argument bytes, republished as they are.
    pub fn apply(
        &mut self,
        sm: &mut StorageManager,
        tracer: &Tracer,
        call: &Call,
        args: &[u8],
    ) -> (Outcome, Effect) {
        let republish = || tracer.publish_call(call.qualname(), |buf| buf.extend_from_slice(args));
        let ok = |detail: Detail| Outcome::Ok { detail };
        if let Call::ReadExit { keys } = call {
            return match self.open.get_mut(keys).and_then(VecDeque::pop_front) {
                Some((_, entered)) => {
                    republish();
                    sm.read_prefetched_exit(keys, entered);
                    (ok(Detail::Closed), Effect::None)
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
                let detail = Detail::Reserved {
                    reserved: r.reserved.len(),
                    not_writable: r.not_writable,
                    out_of_memory: r.out_of_memory,
                };
                (ok(detail), Effect::Reserved(r))
            }
            Call::FinishWrite { keys } => match sm.finish_write(keys) {
                Ok(admitted) => (
                    ok(Detail::Admitted(admitted.len())),
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
                        ok(Detail::Prefetched {
                            hit: o.hit_chunks,
                            requested: o.requested_chunks,
                            l1: o.l1_hit_chunks,
                            l2: o.l2_hit_chunks,
                        }),
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
                let ok_read = result.is_ok();
                let detail = match result {
                    Ok(()) => Detail::Read,
                    Err(e) => Detail::Missed(e),
                };
                (ok(detail), Effect::Read { ok: ok_read })
            }
            Call::FinishRead { keys, read_locks } => {
                sm.finish_read_prefetched(keys, *read_locks);
                (ok(Detail::Released(*read_locks)), Effect::None)
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
