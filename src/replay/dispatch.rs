//! Turns a recorded record into a StorageManager call, for every qualname of every schema
//! variant: migrations are applied here (`extra_count = N` → `read_locks = N + 1`, the early
//! `mode` argument ignored, a spec-less early prefetch given a spec), and
//! `read_prefetched_results` entries and exits are paired FIFO per key list.

use std::collections::{HashMap, VecDeque};

use crate::lmct::calls::{
    FINISH_READ_PREFETCHED, FINISH_WRITE, READ_PREFETCHED_ENTER, READ_PREFETCHED_EXIT,
    RECORDER_SUMMARY, RESERVE_WRITE, SUBMIT_PREFETCH_TASK,
};
use crate::lmct::codec::{
    object_keys, GroupedObjectKeys, LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec,
    PrefetchTaskSpecRef,
};
use crate::lmct::msgpack::RawValue;
use crate::lmct::RecordRef;
use crate::storage::{KeyId, PrefetchOutcome, StorageManager};

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

/// A call decoded from a record, with owned arguments.
enum Call {
    ReserveWrite(Vec<ObjectKey>, MemoryLayoutDesc),
    FinishWrite(Vec<ObjectKey>),
    Prefetch(PrefetchTaskSpec, String, bool),
    Enter(Vec<ObjectKey>),
    Exit(Vec<ObjectKey>),
    FinishRead(Vec<ObjectKey>, i64),
}

fn keys_of(v: Option<RawValue<'_>>) -> Result<Vec<ObjectKey>, String> {
    let v = v.ok_or("missing argument keys")?;
    let keys = object_keys(v).ok_or("keys: not a list of ObjectKey")?;
    Ok(keys.iter().map(|k| k.to_owned()).collect())
}

fn owned_spec(spec: PrefetchTaskSpecRef<'_>) -> Result<PrefetchTaskSpec, String> {
    let groups = spec
        .groups()
        .ok_or("spec.key_groups: not a list of GroupedObjectKeys")?;
    let mut key_groups = Vec::with_capacity(groups.len());
    for g in groups {
        key_groups.push(GroupedObjectKeys {
            keys: keys_of(Some(g.keys))?,
            object_group_id: g.object_group_id,
            layout_desc: g.layout().ok_or("layout_desc: not a MemoryLayoutDesc")?,
            sliding_window_size: g.sliding_window_size,
        });
    }
    Ok(PrefetchTaskSpec {
        key_groups,
        num_kv_readers: spec.num_kv_readers,
        fetching_policy: spec.fetching_policy.to_owned(),
        lock_mode: spec.lock_mode,
    })
}

/// `read_locks`, or the pre-rename `extra_count = N` meaning `N + 1`; default 1.
fn read_locks(locks: Option<RawValue<'_>>, extra: Option<RawValue<'_>>) -> Result<i64, String> {
    match (locks, extra) {
        (Some(v), _) => v
            .as_i64()
            .ok_or_else(|| "read_locks: not an integer".into()),
        (None, Some(v)) => v
            .as_i64()
            .map(|n| n.saturating_add(1))
            .ok_or_else(|| "extra_count: not an integer".into()),
        (None, None) => Ok(1),
    }
}

fn decode(record: &RecordRef<'_>) -> Result<Option<Call>, String> {
    let [keys, layout, spec, request_id, skip_l2, locks, extra] = record
        .args
        .fields([
            "keys",
            "layout_desc",
            "spec",
            "external_request_id",
            "skip_l2",
            "read_locks",
            "extra_count",
        ])
        .ok_or("args: not a map")?;
    let layout_of = |v: Option<RawValue<'_>>| {
        MemoryLayoutDesc::from_raw(v.ok_or("missing argument layout_desc")?)
            .ok_or_else(|| "layout_desc: not a MemoryLayoutDesc".to_string())
    };
    Ok(Some(match record.qualname {
        RESERVE_WRITE => Call::ReserveWrite(keys_of(keys)?, layout_of(layout)?),
        FINISH_WRITE => Call::FinishWrite(keys_of(keys)?),
        SUBMIT_PREFETCH_TASK => {
            let request_id = request_id.and_then(|v| v.as_str()).unwrap_or("").to_owned();
            let skip_l2 = skip_l2.and_then(|v| v.as_bool()).unwrap_or(false);
            let spec = match spec {
                Some(s) => owned_spec(
                    PrefetchTaskSpecRef::from_raw(s).ok_or("spec: not a PrefetchTaskSpec")?,
                )?,
                // The early shape: keys and a layout instead of a spec.
                None => PrefetchTaskSpec {
                    key_groups: vec![GroupedObjectKeys {
                        keys: keys_of(keys)?,
                        object_group_id: 0,
                        layout_desc: layout_of(layout)?,
                        sliding_window_size: -1,
                    }],
                    num_kv_readers: read_locks(None, extra)?,
                    fetching_policy: "prefix".into(),
                    lock_mode: LockMode::Lock,
                },
            };
            Call::Prefetch(spec, request_id, skip_l2)
        }
        READ_PREFETCHED_ENTER => Call::Enter(keys_of(keys)?),
        READ_PREFETCHED_EXIT => Call::Exit(keys_of(keys)?),
        FINISH_READ_PREFETCHED => Call::FinishRead(keys_of(keys)?, read_locks(locks, extra)?),
        _ => return Ok(None),
    }))
}

/// Open `read_prefetched_results` contexts of one key list, oldest first, with whether each
/// entry succeeded.
type OpenContexts = VecDeque<(Vec<ObjectKey>, bool)>;

/// Dispatches records in order onto a StorageManager.
#[derive(Default)]
pub struct Dispatcher {
    open: HashMap<Vec<KeyId>, OpenContexts>,
    /// Every prefetch's outcome, in order.
    pub prefetches: Vec<PrefetchOutcome>,
}

impl Dispatcher {
    /// Issues the call a record describes.
    pub fn dispatch(&mut self, sm: &mut StorageManager, record: &RecordRef<'_>) -> Outcome {
        if record.qualname == RECORDER_SUMMARY {
            return Outcome::Skipped {
                reason: "kvtrace recorder trailer".into(),
            };
        }
        let call = match decode(record) {
            Ok(Some(call)) => call,
            Ok(None) => {
                return Outcome::Skipped {
                    reason: format!("no handler for qualname {:?}", record.qualname),
                }
            }
            Err(reason) => return Outcome::Skipped { reason },
        };
        match call {
            Call::ReserveWrite(keys, layout) => {
                let r = sm.reserve_write(&keys, &layout);
                let detail = format!("reserved {}, not writable {}", r.reserved, r.not_writable);
                if r.out_of_memory {
                    Outcome::Ok {
                        detail: format!(
                            "{detail}, OUT_OF_MEMORY for {} keys",
                            keys.len() as u64 - r.not_writable
                        ),
                    }
                } else {
                    Outcome::Ok { detail }
                }
            }
            Call::FinishWrite(keys) => match sm.finish_write(&keys) {
                Ok(n) => Outcome::Ok {
                    detail: format!("admitted {n}"),
                },
                Err(e) => Outcome::Failed {
                    reason: e.to_string(),
                },
            },
            Call::Prefetch(spec, request_id, skip_l2) => {
                match sm.submit_prefetch_task(&spec, &request_id, skip_l2) {
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
            Call::Enter(keys) => {
                let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
                let result = sm.read_prefetched_enter(&keys);
                self.open
                    .entry(ids)
                    .or_default()
                    .push_back((keys, result.is_ok()));
                match result {
                    Ok(()) => Outcome::Ok {
                        detail: "read".into(),
                    },
                    Err(e) => Outcome::Failed {
                        reason: e.to_string(),
                    },
                }
            }
            Call::Exit(keys) => {
                let ids: Vec<KeyId> = keys.iter().map(KeyId::of).collect();
                match self.open.get_mut(&ids).and_then(VecDeque::pop_front) {
                    Some((keys, entered)) => {
                        sm.read_prefetched_exit(&keys, entered);
                        Outcome::Ok {
                            detail: "closed".into(),
                        }
                    }
                    None => Outcome::Skipped {
                        reason: "read_prefetched_results exit without a matching entry".into(),
                    },
                }
            }
            Call::FinishRead(keys, locks) => {
                sm.finish_read_prefetched(&keys, locks);
                Outcome::Ok {
                    detail: format!("released {locks} lock(s) per key"),
                }
            }
        }
    }

    /// Closes contexts whose exit was never recorded (oldest first, deterministic order);
    /// returns how many.
    pub fn close_open_contexts(&mut self, sm: &mut StorageManager) -> u64 {
        let mut left: Vec<(Vec<KeyId>, OpenContexts)> = self.open.drain().collect();
        left.sort_by(|a, b| a.0.cmp(&b.0));
        let mut n = 0;
        for (_, queue) in left {
            for (keys, entered) in queue {
                sm.read_prefetched_exit(&keys, entered);
                n += 1;
            }
        }
        n
    }
}
